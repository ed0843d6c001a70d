"""Runs sent to a real MLflow (SQLite tracking store in the test folder) while they run: start time,
per-step metrics, end time and status, nested under the study run; params of the run's kind,
conventional metric names, a comparison's deltas and verdict; a tracker that is down never fails a
run and is said once per command; a folder store is refused when the study is read."""

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


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One SQLite store for the module (MLflow creates its tables once), one experiment per test."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


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
    """tuneproof run id -> MLflow run (the study run, which has none, left out)."""
    client = _client(uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id])
    return {r.data.tags["tuneproof.run_id"]: r for r in runs if "tuneproof.run_id" in r.data.tags}


def _fake_train(ctx, losses, fail: str | None = None, name: str | None = None, during=None):
    """A run written through the real registry API, as recipes write them (config, metrics, summary);
    ``during(run)`` is called before the run ends."""
    with ctx.registry.run("train", name=name) as run:
        run.write_json("config.json", ctx.config)
        for step, loss in enumerate(losses, start=1):
            run.metric(step=step, loss=loss, lr=0.01, grad_norm=1.5 * step)
        run.update_summary(final_loss=losses[-1], steps=len(losses), note="text is not sent as a metric")
        (run.dir / "outputs.jsonl").write_text('{"id": "ex1", "output": "{}"}\n')
        if during is not None:
            during(run)
        if fail:
            raise RuntimeError(fail)
        return run.id


def test_a_run_is_sent_while_it_runs_then_completed_under_the_study_run(tmp_path, base, store, capfd, monkeypatch):
    from tuneproof.context import StudyContext

    monkeypatch.setattr("tuneproof.tracking.FLUSH_S", 0.0)  # every step sent at once

    uri = store
    study = _study(tmp_path, base, {"tracking": {"mlflow": {"uri": uri, "experiment": "tiny-exp"}}})
    ctx = StudyContext.open(study)
    live = {}

    def during(run):  # before the run ends: MLflow already has it running, with its steps
        mirrored = _runs(uri, "tiny-exp")[run.id]
        live["status"] = mirrored.info.status
        live["loss"] = [(m.step, m.value) for m in _client(uri).get_metric_history(mirrored.info.run_id, "train/loss")]
        live["params"] = dict(mirrored.data.params)

    run_id = _fake_train(ctx, [2.0, 1.5, 1.25], during=during)
    assert live["status"] == "RUNNING" and live["loss"] == [(1, 2.0), (2, 1.5), (3, 1.25)]
    assert live["params"]["training.learning_rate"] == "0.01"
    client = _client(uri)
    mirrored = _runs(uri, "tiny-exp")[run_id]
    record = ctx.registry.get(run_id)
    assert mirrored.info.run_name == run_id and mirrored.info.status == "FINISHED"
    # the run's own start and end times (ms), not those of a copy made at its end
    assert mirrored.info.start_time == int(record.created * 1000)
    assert mirrored.info.end_time == int(record.ended * 1000)
    assert mirrored.data.tags["tuneproof.status"] == "completed" and mirrored.data.tags["tuneproof.kind"] == "train"
    # nested under the study run, which the UI shows as the tree's root
    parent = client.get_run(mirrored.data.tags["mlflow.parentRunId"])
    assert parent.info.run_name == "tiny" and parent.data.tags["tuneproof.kind"] == "study"
    # a train run's params: model, method, training (not the data check's keys)
    params = mirrored.data.params
    assert params["method.target_modules"] == '["q_proj", "v_proj"]' and params["model.base"] == str(base)
    assert not [k for k in params if k.startswith(("data.", "eval.", "tracking", "report_to"))]
    history = client.get_metric_history(mirrored.info.run_id, "train/loss")
    assert [(m.step, m.value) for m in history] == [(1, 2.0), (2, 1.5), (3, 1.25)]  # sent once
    assert [m.value for m in client.get_metric_history(mirrored.info.run_id, "train/learning_rate")] == [0.01] * 3
    metrics = mirrored.data.metrics
    assert metrics["train/final_loss"] == 1.25 and metrics["train/steps"] == 3.0
    assert not [k for k in metrics if k.startswith("summary.") or "note" in k]
    names = {a.path for a in client.list_artifacts(mirrored.info.run_id)}
    assert {"config.json", "metrics.jsonl", "summary.json", "outputs.jsonl"} <= names
    assert "Creating initial MLflow database tables" not in capfd.readouterr().err  # MLflow's INFO lines are quiet


def test_a_comparison_carries_its_deltas_intervals_and_verdict(tmp_path, base, store):
    from tuneproof.context import StudyContext

    uri = store
    study = _study(tmp_path, base, {"tracking": {"mlflow": {"uri": uri, "experiment": "compare"}}})
    ctx = StudyContext.open(study)
    with ctx.registry.run("data-check") as run:
        run.write_json("config.json", ctx.config)
        run.update_summary(passed=True, sizes={"train": 24, "validation": 6}, hard_faults=0)
    metric = {"base": 0.25, "cand": 0.75, "delta": 0.5, "ci": [0.125, 0.875]}
    with ctx.registry.run("compare", parent="r0009") as run:
        run.write_json("config.json", ctx.config)
        run.write_json(
            "compare.json",
            {
                "baseline": "r0009",
                "candidates": {"r0010": {"metrics": {"field_f1": metric}}},
                "verdict": "pass",
                "detail": "success criterion met, no guard failed",
            },
        )
        run.update_summary(baseline="r0009", candidates=["r0010"], verdict="pass")
    runs = _runs(uri, "compare")
    compared = runs["r0002"].data
    assert compared.metrics["field_f1/delta"] == 0.5 and compared.metrics["field_f1/candidate"] == 0.75
    assert (compared.metrics["field_f1/ci_low"], compared.metrics["field_f1/ci_high"]) == (0.125, 0.875)
    assert compared.tags["tuneproof.verdict"] == "pass" and compared.tags["tuneproof.baseline"] == "r0009"
    assert set(compared.params) == {
        "hypothesis.behaviour",
        "hypothesis.task",
        "hypothesis.success.metric",
        "hypothesis.success.min_gain",
        "hypothesis.success.against",
        "hypothesis.guards",
        "hypothesis.required_fields",
    }
    checked = runs["r0001"].data
    assert checked.metrics["data/train_examples"] == 24.0 and checked.tags["tuneproof.passed"] == "true"
    assert checked.params["data.sources"].startswith('[{"path": "data/train.jsonl"')
    assert not [k for k in checked.params if k.startswith(("training.", "method."))]


def test_failed_and_later_invalidated_runs_carry_status_and_reason(tmp_path, base, store):
    from tuneproof.context import StudyContext

    uri = store
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
    # sent as it ran, at its end, then when invalidated: the steps are not sent twice
    assert len(_client(uri).get_metric_history(invalid.info.run_id, "train/loss")) == 2


@pytest.mark.fault("machine: a tracker that is down")
def test_a_tracker_that_is_down_is_said_once_per_command_and_retried(tmp_path, base, store, capsys):
    from tuneproof.cli import main
    from tuneproof.context import StudyContext
    from tuneproof.io import read_json

    down = {"tracking": {"mlflow": {"uri": "http://127.0.0.1:9", "experiment": "down"}}}  # port 9: nothing listens
    study = _study(tmp_path, base, down)
    ctx = StudyContext.open(study)  # one command that records three runs
    ids = [_fake_train(ctx, [2.0, 1.0]) for _ in range(3)]
    assert [ctx.registry.get(i).status for i in ids] == ["completed"] * 3
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1, err  # not one per run, nor one per step
    assert warnings[0] == (  # said at the first fault
        "warning: mlflow at http://127.0.0.1:9 did not take the runs (connection refused); "
        "1 run(s) wait for `tuneproof track sync`: r0001"
    )
    for run_id in ids:
        state = read_json(study / "runs" / run_id / "tracking.json")
        assert state["pending"] is True and "mlflow" in state["errors"]

    uri = store
    cfg = yaml.safe_load((study / "tuneproof.yaml").read_text())
    cfg["tracking"]["mlflow"]["uri"] = uri
    (study / "tuneproof.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    with pytest.raises(SystemExit) as exit_:
        main(["track", "sync", "--study", str(study)])
    assert exit_.value.code == 0
    assert "mirrored 3 run(s) to mlflow" in capsys.readouterr().out
    assert sorted(_runs(uri, "down")) == ids
    assert read_json(study / "runs" / ids[0] / "tracking.json")["pending"] is False


@pytest.mark.fault("machine: a tracker answering HTTP 500")
def test_a_server_that_answers_http_500_is_said_with_its_status_not_as_no_answer(tmp_path, base, capsys):
    """Issue 33 item 17: an MLflow server answering 500 was reported as "(no answer)"."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from tuneproof.context import StudyContext

    class Fails(BaseHTTPRequestHandler):
        def _answer(self):
            self.send_response(500)
            self.send_header("Content-Length", "4")
            self.end_headers()
            self.wfile.write(b"boom")

        do_GET = do_POST = _answer

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Fails)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        uri = f"http://127.0.0.1:{server.server_port}"
        study = _study(tmp_path, base, {"tracking": {"mlflow": {"uri": uri}}})
        run_id = _fake_train(StudyContext.open(study), [1.0])
    finally:
        server.shutdown()
    (warning,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert warning == (
        f"warning: mlflow at {uri} did not take the runs (the server answered HTTP 500 (Internal Server Error)); "
        f"1 run(s) wait for `tuneproof track sync`: {run_id}"
    )


def test_tracker_errors_name_the_http_status_each_library_reports():
    from tuneproof.tracking import _error

    assert _error(RuntimeError("API request to /x failed with error code 403 != 200. Response body: ''")) == (
        "the server answered HTTP 403 (Forbidden)"
    )
    assert _error(RuntimeError("503 Server Error: Service Unavailable for url: http://h/x")) == (
        "the server answered HTTP 503 (Service Unavailable)"
    )
    assert _error(RuntimeError("Max retries exceeded with url: /x (Caused by NewConnectionError)")) == "no answer"


@pytest.mark.fault("machine: a tracker that is down")
def test_a_second_command_against_a_down_tracker_counts_every_waiting_run(tmp_path, base, capsys):
    from tuneproof.context import StudyContext

    down = {"tracking": {"mlflow": {"uri": "http://127.0.0.1:9"}}}
    study = _study(tmp_path, base, down)
    _fake_train(StudyContext.open(study), [1.0])
    capsys.readouterr()
    _fake_train(StudyContext.open(study), [1.0])  # the next command: the first run still waits
    (warning,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert warning.endswith("2 run(s) wait for `tuneproof track sync`: r0001, r0002")


@pytest.mark.fault("input: an MLflow folder store")
def test_a_folder_store_is_refused_when_the_study_is_read(tmp_path, base, monkeypatch):
    from tuneproof.context import StudyContext, load_study
    from tuneproof.errors import TuneproofError

    folder = {"tracking": {"mlflow": {"uri": f"file://{tmp_path}/mlruns"}}}
    study = _study(tmp_path, base, folder)
    with pytest.raises(TuneproofError) as refused:
        load_study(study)
    text = str(refused.value)
    assert "tracking.mlflow.uri" in text and "sqlite:///mlflow.db" in text and "http://127.0.0.1:5000" in text
    # the same store named by the environment: one warning, the command goes on without the tracker
    cfg = yaml.safe_load((study / "tuneproof.yaml").read_text())
    cfg["tracking"] = {}
    cfg["report_to"] = ["mlflow"]
    (study / "tuneproof.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", str(tmp_path / "mlruns"))
    lines = []
    from tuneproof.tracking import attach

    ctx = StudyContext.open(study)
    assert attach(ctx.registry, ctx.study, ctx.study_dir, warn=lines.append) is None
    assert len(lines) == 1 and "$MLFLOW_TRACKING_URI" in lines[0] and "sqlite:///" in lines[0]


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


def test_the_dossier_goes_to_the_study_run(tmp_path, base, store):
    from tuneproof.context import load_study
    from tuneproof.tracking import publish_dossier

    uri = store
    study = _study(tmp_path, base, {"tracking": {"mlflow": {"uri": uri, "experiment": "dossier"}}})
    page = study / "dossier.md"
    for text in ("# first", "# second"):
        page.write_text(text)
        assert publish_dossier(load_study(study), study, [page]) == ["mlflow"]
    client = _client(uri)
    exp = client.get_experiment_by_name("dossier")
    (run,) = client.search_runs([exp.experiment_id])  # published twice, one run: the study run
    assert run.info.run_name == "tiny" and run.data.tags["tuneproof.kind"] == "study"
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


def test_steps_of_another_process_and_a_resume_go_to_the_same_mlflow_run(tmp_path, base, store, monkeypatch):
    """A torchrun worker logs the steps of a run its launcher opened; a resumed run reopens its MLflow run."""
    from tuneproof.context import StudyContext
    from tuneproof.registry import Registry, Run
    from tuneproof.tracking import attach

    monkeypatch.setattr("tuneproof.tracking.FLUSH_S", 0.0)

    study = _study(tmp_path, base, {"tracking": {"mlflow": {"uri": store, "experiment": "worker"}}})
    ctx = StudyContext.open(study)
    seen = {}
    with pytest.raises(RuntimeError), ctx.registry.run("train") as run:
        worker = Registry(study)  # the worker's own registry, as recipes/torchrun.py opens it
        attach(worker, ctx.study, study, ctx.config)
        rank0 = Run(worker, worker.get(run.id))
        rank0.metric(step=1, loss=2.0)
        rank0.metric(step=2, loss=1.0)
        mirrored = _runs(store, "worker")[run.id]
        seen["live"] = [m.value for m in _client(store).get_metric_history(mirrored.info.run_id, "train/loss")]
        raise RuntimeError("node lost")
    assert seen["live"] == [2.0, 1.0]
    assert _runs(store, "worker")[run.id].info.status == "FAILED"
    with ctx.registry.reopen(run.id) as resumed:
        seen["status"] = _runs(store, "worker")[run.id].info.status
        resumed.metric(event="resume", from_step=2)  # not a step: not a metric
        resumed.metric(step=3, loss=0.5)
    assert seen["status"] == "RUNNING"
    (mirrored,) = _runs(store, "worker").values()  # one MLflow run for the run, resumed or not
    assert mirrored.info.status == "FINISHED"
    history = _client(store).get_metric_history(mirrored.info.run_id, "train/loss")
    assert [(m.step, m.value) for m in history] == [(1, 2.0), (2, 1.0), (3, 0.5)]
    assert "train/from_step" not in mirrored.data.metrics


def test_steps_are_sent_at_most_every_flush_interval_and_the_rest_at_the_end(tmp_path, base, store, monkeypatch):
    """The first step goes at once, the next ones wait for the interval (one MLflow write costs tens
    of ms); whatever waits is sent when the run ends, each row once."""
    from tuneproof.context import StudyContext

    monkeypatch.setattr("tuneproof.tracking.FLUSH_S", 3600.0)
    study = _study(tmp_path, base, {"tracking": {"mlflow": {"uri": store, "experiment": "flush"}}})
    live = {}

    def during(run):
        mirrored = _runs(store, "flush")[run.id]
        live["loss"] = [m.step for m in _client(store).get_metric_history(mirrored.info.run_id, "train/loss")]

    run_id = _fake_train(StudyContext.open(study), [2.0, 1.5, 1.25, 1.0], during=during)
    assert live["loss"] == [1]
    mirrored = _runs(store, "flush")[run_id]
    history = _client(store).get_metric_history(mirrored.info.run_id, "train/loss")
    assert [(m.step, m.value) for m in history] == [(1, 2.0), (2, 1.5), (3, 1.25), (4, 1.0)]


def test_a_tracker_added_before_a_resume_gets_the_whole_run(tmp_path, base, store):
    """``report_to`` added to the study file after an interruption: resume accepts the change (a tracker
    changes where copies go, not the run) and MLflow gets the steps before the checkpoint, then the rest."""
    from tuneproof.context import StudyContext
    from tuneproof.recipes.resume import run_resume
    from tuneproof.recipes.train import TrainOptions, run_train

    study = make_study(tmp_path / "s", base, max_steps=4, checkpoint_every=2)
    ctx = StudyContext.open(study)
    with pytest.raises(KeyboardInterrupt):
        run_train(ctx, TrainOptions(stop_after=2))
    (rec,) = ctx.registry.list(kind="train")
    ctx.registry.close()
    cfg = yaml.safe_load((study / "tuneproof.yaml").read_text())
    cfg["tracking"] = {"mlflow": {"uri": store, "experiment": "resumed"}}
    (study / "tuneproof.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    run_resume(study, None, rec.id)
    runs = _runs(store, "resumed")
    assert sorted(runs) == ["r0001", "r0002", rec.id]  # the data check and baseline follow at the run's end
    mirrored = runs[rec.id]
    assert mirrored.info.run_name == rec.id and mirrored.info.status == "FINISHED"
    history = _client(store).get_metric_history(mirrored.info.run_id, "train/loss")
    assert [m.step for m in history] == [1, 2, 3, 4]  # each step once


def test_invalidate_from_the_command_line_reaches_the_tracker(tmp_path, base, store, capsys):
    from tuneproof.cli import main
    from tuneproof.context import StudyContext

    study = _study(tmp_path, base, {"tracking": {"mlflow": {"uri": store, "experiment": "cli-invalidate"}}})
    run_id = _fake_train(StudyContext.open(study), [2.0, 1.0])
    assert _runs(store, "cli-invalidate")[run_id].info.status == "FINISHED"
    with pytest.raises(SystemExit) as exit_:
        main(["invalidate", run_id, "--why", "label leak found", "--study", str(study)])
    assert exit_.value.code == 0, capsys.readouterr()
    mirrored = _runs(store, "cli-invalidate")[run_id]
    assert mirrored.info.status == "FAILED" and mirrored.data.tags["tuneproof.status"] == "invalid"
    assert mirrored.data.tags["tuneproof.reason"].startswith("label leak found")


def test_an_interrupted_run_is_not_sent_as_the_command_exits_and_the_next_run_sends_it(tmp_path, base, store):
    """Ctrl-C exits at once: the interrupted run is left pending (no tracker round trip on the way out) and
    the next run's end sends it, KILLED, with its steps."""
    import json

    from tuneproof.context import StudyContext

    study = _study(tmp_path, base, {"tracking": {"mlflow": {"uri": store, "experiment": "ctrl-c"}}})
    ctx = StudyContext.open(study)

    def ctrl_c(run):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _fake_train(ctx, [3.0, 2.5], during=ctrl_c)
    (rec,) = ctx.registry.list(kind="train")
    assert rec.status == "interrupted"
    state = json.loads((ctx.registry.runs_dir / rec.id / "tracking.json").read_text())
    assert state["pending"] is True
    assert _runs(store, "ctrl-c")[rec.id].info.status == "RUNNING"  # opened as it started, not ended on the way out
    _fake_train(ctx, [2.0, 1.0], name="next")
    sent = _runs(store, "ctrl-c")[rec.id]
    assert sent.info.status == "KILLED" and sent.data.tags["tuneproof.status"] == "interrupted"
    assert [m.value for m in _client(store).get_metric_history(sent.info.run_id, "train/loss")] == [3.0, 2.5]
    assert json.loads((ctx.registry.runs_dir / rec.id / "tracking.json").read_text())["pending"] is False
