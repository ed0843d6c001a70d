"""What the user reads on the screen: commands in protocol order, where the step budget is set,
`runs --json` for scripts."""

from __future__ import annotations

import json
import re

import pytest


def _main(args, capsys):
    from tuneproof.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(args)
    return exit_.value.code, capsys.readouterr().out


def test_help_lists_commands_in_protocol_order(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    code, out = _main(["--help"], capsys)
    assert code == 0
    listed = re.findall(r"^│ ([a-z]+) ", out, flags=re.M)
    assert listed[:8] == ["init", "data", "baseline", "env", "preflight", "train", "resume", "eval"]
    assert listed.index("compare") < listed.index("test") < listed.index("export") < listed.index("report")


def test_train_help_says_where_the_step_budget_is_set(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    code, out = _main(["train", "--help"], capsys)
    assert code == 0
    assert "training.max_steps or training.epochs" in " ".join(out.split())


def test_runs_json_lists_every_run_with_status_and_reason(tmp_path, capsys):
    from tuneproof.registry import Registry

    reg = Registry(tmp_path)
    with reg.run("eval") as run:
        run.update_summary(metrics={"accuracy": 0.5})
    with pytest.raises(RuntimeError):
        with reg.run("train", name="lr-big"):
            raise RuntimeError("loss exploded")
    reg.close()
    code, out = _main(["runs", "--json", "--study", str(tmp_path)], capsys)
    assert code == 0
    rows = json.loads(out)
    assert [(r["id"], r["kind"], r["status"]) for r in rows] == [("r0001", "eval", "completed"), ("r0002-lr-big", "train", "failed")]
    assert rows[1]["reason"] == "RuntimeError: loss exploded"
    assert rows[0]["summary"]["metrics"] == {"accuracy": 0.5}


def test_runs_table_at_80_columns_breaks_no_word(tmp_path, capsys, monkeypatch):
    from tuneproof.registry import Registry

    reg = Registry(tmp_path)
    for kind in ("data-check", "baseline", "preflight"):
        with reg.run(kind) as run:
            run.update_summary(metrics={"accuracy": 0.5, "macro_f1": 0.25})
    with pytest.raises(RuntimeError):
        with reg.run("train", name="lora-r16"):
            raise RuntimeError("a long reason that has to wrap over several lines of the table")
    reg.close()
    monkeypatch.setenv("COLUMNS", "80")
    from tuneproof.ui import console

    monkeypatch.setattr(console, "_width", 80)
    code, out = _main(["runs", "--study", str(tmp_path)], capsys)
    assert code == 0
    assert max(len(line) for line in out.splitlines()) <= 80
    for word in ("completed", "data-check", "baseline", "preflight", "r0004-lora-r16"):
        assert word in out, word
