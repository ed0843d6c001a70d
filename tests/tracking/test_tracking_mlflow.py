"""Runs mirrored to a real MLflow (SQLite tracking store in the test folder): params, per-step
metrics, summary, status and reason tags, artifacts; a tracker that is down never fails a run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

mlflow = pytest.importorskip("mlflow")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))

from tiny_study import build_base, make_study  # noqa: E402


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return build_base(tmp_path_factory.mktemp("tiny-llama"))


def _study(tmp_path: Path, base: Path, tracking: dict) -> Path:
    study = make_study(tmp_path / "s", base, prepare=False)  # the runs here are written by hand
    cfg = yaml.safe_load((study / "tuneproof.yaml").read_text())
    cfg.update(tracking)
    (study / "tuneproof.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return study


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _runs(uri: str, experiment: str) -> dict[str, object]:
    client = _client(uri)
    exp = client.get_experiment_by_name(experiment)
    return {r.data.tags["tuneproof.run_id"]: r for r in client.search_runs([exp.experiment_id])}


def _fake_train(ctx, losses, fail: str | None = None, name: str | None = None):
    """A run written through the real registry API, as recipes write them (config, metrics, summary)."""
    with ctx.registry.run("train", name=name) as run:
        run.write_json("config.json", ctx.config)
        for step, loss in enumerate(losses, start=1):
            run.metric(step=step, loss=loss, lr=0.01, grad_norm=1.5 * step)
        run.update_summary(final_loss=losses[-1], steps=len(losses), note="text is not sent as a metric")
        (run.dir / "outputs.jsonl").write_text('{"id": "ex1", "output": "{}"}\n')
        if fail:
            raise RuntimeError(fail)
        return run.id


def test_completed_run_is_mirrored_with_params_steps_summary_tags_and_artifacts(tmp_path, base):
    from tuneproof.context import StudyContext

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    study = _study(tmp_path, base, {"tracking": {"mlflow": {"uri": uri, "experiment": "tiny-exp"}}})
    ctx = StudyContext.open(study)
    run_id = _fake_train(ctx, [2.0, 1.5, 1.25])
    (mirrored,) = _runs(uri, "tiny-exp").values()
    assert mirrored.info.run_name == run_id and mirrored.info.status == "FINISHED"
    assert mirrored.data.tags["tuneproof.status"] == "completed" and mirrored.data.tags["tuneproof.kind"] == "train"
    assert mirrored.data.params["training.learning_rate"] == "0.01"
    assert mirrored.data.params["method.target_modules"] == '["q_proj", "v_proj"]'
    history = _client(uri).get_metric_history(mirrored.info.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(1, 2.0), (2, 1.5), (3, 1.25)]
    assert mirrored.data.metrics["summary.final_loss"] == 1.25 and "summary.note" not in mirrored.data.metrics
    names = {a.path for a in _client(uri).list_artifacts(mirrored.info.run_id)}
    assert {"config.json", "metrics.jsonl", "summary.json", "outputs.jsonl"} <= names


def test_failed_and_later_invalidated_runs_carry_status_and_reason(tmp_path, base):
    from tuneproof.context import StudyContext

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    study = _study(tmp_path, base, {"report_to": ["mlflow"]})
    import os

    os.environ["MLFLOW_TRACKING_URI"] = uri
    try:
        ctx = StudyContext.open(study)
        with pytest.raises(RuntimeError):
            _fake_train(ctx, [3.0], fail="disk on fire")
        ok = _fake_train(ctx, [2.0, 1.0], name="second")
        ctx.registry.invalidate(ok, "wrong split used")
    finally:
        del os.environ["MLFLOW_TRACKING_URI"]
    runs = _runs(uri, "tiny")  # report_to: experiment defaults to the study name
    failed, invalid = runs["r0001"], runs["r0002-second"]
    assert failed.info.status == "FAILED" and failed.data.tags["tuneproof.status"] == "failed"
    assert failed.data.tags["tuneproof.reason"] == "RuntimeError: disk on fire"
    assert invalid.info.status == "FAILED" and invalid.data.tags["tuneproof.status"] == "invalid"
    assert invalid.data.tags["tuneproof.reason"].startswith("wrong split used")
    # mirrored twice (at its end, then when invalidated): the steps are not sent twice
    assert len(_client(uri).get_metric_history(invalid.info.run_id, "loss")) == 2


def test_a_tracker_that_is_down_never_fails_the_run_and_is_retried(tmp_path, base, capsys):
    from tuneproof.cli import main
    from tuneproof.context import StudyContext
    from tuneproof.io import read_json

    down = {"tracking": {"mlflow": {"uri": "http://127.0.0.1:9", "experiment": "tiny-exp"}}}  # port 9: nothing listens
    study = _study(tmp_path, base, down)
    ctx = StudyContext.open(study)
    run_id = _fake_train(ctx, [2.0, 1.0])
    assert ctx.registry.get(run_id).status == "completed"
    assert f"warning: run {run_id} not mirrored to mlflow" in capsys.readouterr().err
    state = read_json(study / "runs" / run_id / "tracking.json")
    assert state["pending"] is True and "mlflow" in state["errors"]

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = yaml.safe_load((study / "tuneproof.yaml").read_text())
    cfg["tracking"]["mlflow"]["uri"] = uri
    (study / "tuneproof.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    with pytest.raises(SystemExit) as exit_:
        main(["track", "sync", "--study", str(study)])
    assert exit_.value.code == 0
    assert "mirrored 1 run(s) to mlflow" in capsys.readouterr().out
    assert list(_runs(uri, "tiny-exp")) == [run_id]
    assert read_json(study / "runs" / run_id / "tracking.json")["pending"] is False


def test_track_sync_without_a_tracker_is_a_usage_error(tmp_path, base, capsys):
    from tuneproof.cli import main

    study = make_study(tmp_path / "s", base)
    with pytest.raises(SystemExit) as exit_:
        main(["track", "sync", "--study", str(study)])
    assert exit_.value.code == 2
    assert "no tracker set" in capsys.readouterr().out


@pytest.mark.parametrize("package", ["wandb", "trackio"])
def test_other_trackers_use_the_same_hook_when_installed(tmp_path, base, package, monkeypatch):
    pytest.importorskip(package)
    from tuneproof.context import StudyContext

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    study = _study(tmp_path, base, {"report_to": [package]})
    ctx = StudyContext.open(study)
    run_id = _fake_train(ctx, [2.0, 1.0])
    from tuneproof.io import read_json

    state = read_json(study / "runs" / run_id / "tracking.json")
    assert state["pending"] is False and state[package]["steps_sent"] == 2


def test_the_dossier_goes_to_one_study_level_run(tmp_path, base):
    from tuneproof.context import load_study
    from tuneproof.tracking import publish_dossier

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    study = _study(tmp_path, base, {"tracking": {"mlflow": {"uri": uri}}})
    page = study / "dossier.md"
    for text in ("# first", "# second"):
        page.write_text(text)
        assert publish_dossier(load_study(study), study, [page]) == ["mlflow"]
    client = _client(uri)
    exp = client.get_experiment_by_name("tiny")
    (run,) = client.search_runs([exp.experiment_id])  # published twice, one run
    assert run.info.run_name == "dossier" and run.data.tags["tuneproof.kind"] == "report"
    local = client.download_artifacts(run.info.run_id, "dossier.md", str(tmp_path))
    assert Path(local).read_text() == "# second"


def test_without_a_uri_runs_and_artifacts_stay_in_the_study_folder(tmp_path, base, monkeypatch):
    """No tracking.mlflow.uri and no $MLFLOW_TRACKING_URI: sqlite:///<study>/mlflow.db, artifacts
    beside it; nothing is written into the current folder (MLflow's default ./mlruns)."""
    from tuneproof.context import StudyContext

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    study = _study(tmp_path, base, {"report_to": ["mlflow"]})
    _fake_train(StudyContext.open(study), [2.0, 1.0])
    assert (study / "mlflow.db").is_file() and not (tmp_path / "mlruns").exists()
    assert any((study / "mlflow-artifacts").rglob("outputs.jsonl"))
