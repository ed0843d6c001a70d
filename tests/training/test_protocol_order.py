"""Protocol order is enforced (docs/PROTOCOL.md steps 2 and 3): ``baseline`` and ``train`` refuse after a failed data
check (running it inline when there is none), ``train`` refuses without a baseline for the current
evaluation fingerprint; each refusal names what is missing and the command (exit 3); overrides
take a reason and are recorded and shown in ``runs``, ``runs --tree`` and the dossier."""

from __future__ import annotations

import json

import pytest

from tiny_study import make_study
from tuneproof.cli import main
from tuneproof.registry import Registry


@pytest.fixture(autouse=True)
def wide_console():
    from tuneproof.ui import console

    old = console._width
    console.width = 250
    yield
    console._width = old


def cli(capsys, study, *args) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_:
        main([*args, "--study", str(study)])
    return exit_.value.code, " ".join(capsys.readouterr().out.split())


def _break_one_target(study) -> None:
    path = study / "data" / "train.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    rows[2]["target"] = "{intent: Weather"  # not strict JSON: a hard fault of the data check
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_failed_data_check_stops_baseline_and_train(tiny_base, tmp_path, capsys):
    study = make_study(tmp_path / "s", tiny_base, prepare=False)
    _break_one_target(study)
    code, out = cli(capsys, study, "data", "check")
    assert code == 3
    dc = Registry(study).latest("data-check", status="failed")
    assert dc.id == "r0001" and dc.summary["passed"] is False and dc.summary["hard_faults"] == 1

    code, out = cli(capsys, study, "baseline")
    assert code == 3, out
    assert (
        "baseline refused: the data check r0001 of this data" in out
        and "failed with 1 hard fault, first: 1 of 34 targets are not strict JSON" in out
    )
    assert "tuneproof data check" in out and "--skip-data-check" in out
    code, out = cli(capsys, study, "train", "--skip-preflight", "tiny study")
    assert code == 3 and "train refused: the data check r0001 of this data" in out
    reg = Registry(study)
    assert [r.kind for r in reg.list()] == ["data-check"]  # neither a baseline nor a train run was started

    # the data fixed: a new fingerprint, no data check for it yet -> run inline, then the baseline
    path = study / "data" / "train.jsonl"
    path.write_text(
        path.read_text().replace('"{intent: Weather"', json.dumps(json.dumps({"intent": "Weather", "slots": {}})))
    )
    code, out = cli(capsys, study, "baseline")
    assert code == 0, out
    assert "running `tuneproof data check` first" in out
    runs = Registry(study).list()
    assert [(r.kind, r.status) for r in runs] == [
        ("data-check", "failed"),
        ("data-check", "completed"),
        ("baseline", "completed"),
    ]
    assert runs[2].summary["data_check_run"] == runs[1].id and runs[1].data_fingerprint == runs[2].data_fingerprint


def test_fresh_study_train_with_skip_preflight_still_needs_the_data_check_and_the_baseline(tiny_base, tmp_path, capsys):
    study = make_study(tmp_path / "s", tiny_base, prepare=False)
    code, out = cli(capsys, study, "train", "--skip-preflight", "tiny study")
    assert code == 3, out
    assert "train refused: no completed baseline in this study" in out
    assert "run `tuneproof baseline" in out and "--skip-baseline" in out
    reg = Registry(study)
    assert [(r.kind, r.status) for r in reg.list()] == [("data-check", "completed")]  # the data check ran inline
    assert reg.list()[0].summary["passed"] is True

    code, out = cli(capsys, study, "baseline")
    assert code == 0, out
    assert "data check r0001 passed for this data" in out  # not run again
    code, out = cli(capsys, study, "train", "--skip-preflight", "tiny study")
    assert code == 0, out
    rec = Registry(study).latest("train")
    assert rec.summary["data_check_run"] == "r0001" and rec.summary["baseline_run"] == "r0002"
    # the README's promise: at the end the run id and where its adapter, checkpoints and metrics are
    assert out.endswith(
        "train run r0003 completed; next: tuneproof eval r0003 r0003: adapter runs/r0003/adapter; "
        "checkpoints runs/r0003/checkpoints; metrics runs/r0003/metrics.jsonl"
    ), out
    assert "data_check_override" not in rec.summary and "baseline_override" not in rec.summary


def test_a_baseline_of_another_evaluation_procedure_does_not_count(tiny_base, tmp_path, capsys):
    study = make_study(tmp_path / "s", tiny_base)  # data check r0001, baseline r0002 (max_new_tokens 8)
    cfg = study / "tuneproof.yaml"
    cfg.write_text(cfg.read_text().replace("max_new_tokens: 8", "max_new_tokens: 12"))
    code, out = cli(capsys, study, "train", "--skip-preflight", "tiny study")
    assert code == 3, out
    assert (
        "train refused: the latest baseline r0002 does not match: the evaluation fingerprint (decoding differ)" in out
    )
    cfg.write_text(cfg.read_text().replace("template: Extract JSON {text}", "template: 'Extract: {text}'"))
    code, out = cli(capsys, study, "train", "--skip-preflight", "tiny study")
    assert code == 3 and "the evaluation fingerprint (prompt, decoding differ)" in out
    assert Registry(study).list(kind="train") == []


def test_overrides_need_a_reason_and_are_recorded_and_shown(tiny_base, tmp_path, capsys):
    study = make_study(tmp_path / "s", tiny_base, prepare=False)
    _break_one_target(study)
    code, out = cli(capsys, study, "baseline", "--skip-data-check", "  ")
    assert code == 2 and "--skip-data-check needs a reason" in out
    assert Registry(study).list() == []
    code, out = cli(capsys, study, "train", "--skip-preflight", "p", "--skip-data-check", "x", "--skip-baseline", "")
    assert code == 2 and "--skip-baseline needs a reason" in out

    code, out = cli(capsys, study, "baseline", "--skip-data-check", "the broken row is not in the eval split")
    assert code == 0, out
    base = Registry(study).latest("baseline")
    assert base.summary["data_check_override"] == "the broken row is not in the eval split"
    assert base.summary["data_check_run"] is None
    code, out = cli(
        capsys,
        study,
        "train",
        "--skip-preflight",
        "tiny study",
        "--skip-data-check",
        "known bad row 2",
        "--skip-baseline",
        "baseline of the base model is not needed for a wiring test",
    )
    assert code == 0, out
    rec = Registry(study).latest("train")
    assert rec.summary["data_check_override"] == "known bad row 2"
    assert rec.summary["baseline_override"] == "baseline of the base model is not needed for a wiring test"
    assert rec.summary["preflight_override"] == "tiny study"

    code, out = cli(capsys, study, "runs")
    assert code == 0
    assert "data check overridden: known bad row 2" in out and "baseline overridden: baseline of the base model" in out
    assert "data check overridden: the broken row is not in the eval split" in out
    code, out = cli(capsys, study, "runs", "--tree")
    assert code == 0
    assert (
        f"{rec.id} train completed preflight overridden: tiny study data check "
        "overridden: known bad row 2 baseline overridden:" in out
    )
    code, out = cli(capsys, study, "report")
    assert code == 0
    md = (study / "dossier.md").read_text()
    assert (
        "preflight overridden: tiny study; data check overridden: known bad row 2; "
        "baseline overridden: baseline of the base model is not needed for a wiring test"
    ) in md


def test_train_header_lines_stay_one_line_each_off_a_terminal(tiny_base, tmp_path, capsys, monkeypatch):
    """Off a terminal the console is 80 columns: the run's header was cut before 'fp32' and the
    budget line before 'examples', so a log split what grep should find on one line."""
    from tuneproof.ui import console

    study = make_study(tmp_path / "s", tiny_base, max_steps=2)
    monkeypatch.setattr(console, "_width", 80)
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--skip-preflight", "header test", "--study", str(study)])
    lines = capsys.readouterr().out.splitlines()
    assert exit_.value.code == 0
    head = next(line for line in lines if line.startswith("r0003 lora on 24 examples; trainable "))
    assert "; device cpu, dtype fp32 (" in head and head.endswith(")") and len(head) > 80
    assert "budget: 2 optimizer steps from training.max_steps: 2; 3 steps per epoch of 24 examples" in lines
