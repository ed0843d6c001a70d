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
    assert [(r["id"], r["kind"], r["status"]) for r in rows] == [
        ("r0001", "eval", "completed"),
        ("r0002-lr-big", "train", "failed"),
    ]
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


def _render(t, width=80):
    import io

    from rich.console import Console

    buf = io.StringIO()
    Console(file=buf, width=width, force_terminal=False, color_system=None).print(t)
    return buf.getvalue()


def test_tables_at_80_columns_keep_the_cells_that_identify_a_row_whole():
    """The kind of the `runs` fault in the other tables printed without a terminal (the data check's
    classes, `show`): a class name or example id is never cut, however long (before: folded at 14)."""
    from tuneproof.ui import table

    label = "card_payment_wrong_exchange_rate"  # a BANKING77 intent, 32 characters in one word
    rows = [
        ["train", label, 112, "8x8", "L 112", "pixel_values float32 [3, 16, 16]"],
        ["validation", "Refund_not_showing_up", 24, "8x8", "L 24", "pixel_values float32 [3, 16, 16]"],
    ]
    out = _render(
        table(
            "images per class (median size, PIL modes, model input)",
            ["split", "class", "n", "size", "modes", "model input"],
            rows,
            keep=("split", "class"),
            width=80,
        )
    )
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert any(label in line for line in lines) and any("Refund_not_showing_up" in line for line in lines), out
    assert any("validation" in line for line in lines) and "pixel_values" in out and "not shown" not in out

    ex_id = "SearchCreativeWork/validation/0012"  # a SNIPS id, 34 characters
    text = "I want to see the television show called The Last Kingdom of the north"
    ref = (
        '{"intent": "SearchCreativeWork", "slots": {"object_type": '
        '"television show", "object_name": "The Last Kingdom"}}'
    )
    out = _render(
        table(
            "r0007: 1 examples",
            ["id", "category", "input", "reference", "baseline", "candidate"],
            [[ex_id, "SearchCreativeWork", text, ref, "```json", ref]],
            keep=("id",),
            drop=("category",),
            more="`tuneproof show --json` has every field",
            width=80,
        )
    )
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert any(ex_id in line for line in lines), out
    assert "not shown at 80 columns: category (`tuneproof show --json` has every field)" in " ".join(out.split())


def test_a_table_that_cannot_fit_leaves_out_the_least_important_columns_and_says_so():
    from tuneproof.ui import table

    ids = ["r0012-learning_rate0.00012345", "r0013-learning_rate0.00054321"]
    rows = [
        [
            f"{i}\ntraining.learning_rate={v}",
            "train",
            "completed",
            "",
            "r0004-lora",
            "12-01 11:52",
            "accuracy=0.43 macro_f1=0.35",
        ]
        for i, v in zip(ids, ("0.00012345", "0.00054321"))
    ]
    t = table(
        "runs",
        ["id", "kind", "status", "reason", "parent", "created", "metrics"],
        rows,
        keep=("id", "parent", "metrics"),
        drop=("created", "metrics", "parent"),
        more="`tuneproof runs --json` has every field",
        width=80,
    )
    out = _render(t)
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert all(any(i in line for line in lines) for i in ids)
    assert any("training.learning_rate=0.00054321" in line for line in lines)
    assert any("r0004-lora" in line for line in lines)  # the parent is kept: dropping created and metrics was enough
    assert "12-01" not in out and "accuracy" not in out
    assert "not shown at 80 columns: created, metrics (`tuneproof runs --json` has every field)" in " ".join(
        out.split()
    )
    wide = _render(
        table(
            "runs",
            ["id", "kind", "status", "reason", "parent", "created", "metrics"],
            rows,
            keep=("id", "parent", "metrics"),
            drop=("created", "metrics", "parent"),
            width=200,
        ),
        width=200,
    )
    assert "not shown" not in wide and "12-01 11:52" in wide and "accuracy=0.43 macro_f1=0.35" in wide


def test_preflight_table_never_cuts_a_number(monkeypatch, capsys):
    """At 80 columns (a log, CI) the numbers column is left out (its key=value tokens folded read as
    other numbers: "trainable_tensors=24" / "0"); from 120 columns each one is whole."""
    from tuneproof.recipes.preflight import _print_table
    from tuneproof.ui import console

    class Rep:
        checks = [
            {
                "name": "update check",
                "passed": True,
                "numbers": {
                    "trainable_changed": 240,
                    "trainable_tensors": 240,
                    "frozen_unchanged": 272,
                    "frozen_tensors": 272,
                },
                "message": "240 of 240 trainable tensors got a non-zero gradient and changed in 2 step(s)",
            },
            {
                "name": "embedding size",
                "passed": True,
                "numbers": {"tokenizer_length": 49152, "input_embedding_rows": 49152},
                "message": "embedding rows 49152 >= tokenizer length 49152",
            },
        ]
        failed: list = []

    monkeypatch.setattr(console, "_width", 80)
    _print_table(Rep(), "r0003", 103.0)
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "trainable_tensors" not in out and "each check's numbers: runs/r0003/preflight.json" in " ".join(out.split())
    assert any("update check" in line for line in out.splitlines())
    monkeypatch.setattr(console, "_width", 160)
    _print_table(Rep(), "r0003", 103.0)
    lines = capsys.readouterr().out.splitlines()
    for token in (
        "trainable_tensors=240;",
        "frozen_unchanged=272;",
        "tokenizer_length=49152;",
        "input_embedding_rows=49152",
    ):
        assert any(token in line for line in lines), token


def test_the_bitsandbytes_import_warning_is_not_shown(tmp_path):
    """Once bitsandbytes is installed PEFT imports it for every LoRA run; on an AVX512-BF16 CPU it warns
    that it could not fetch a kernel from the hub (`pip install kernels`): not shown by the CLI."""
    import subprocess
    import sys

    pytest.importorskip("bitsandbytes")
    script = (
        "import sys\nfrom tuneproof.cli import app, main\n"
        "@app.command('probe-import')\ndef probe() -> None:\n    import "
        "peft.tuners.lora  # noqa: F401\n    import bitsandbytes  # noqa: F401\n"
        "main(['probe-import'])\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "gemm_4bit_forward" not in proc.stderr + proc.stdout and "pip install kernels" not in proc.stderr


def test_runs_at_80_columns_cuts_no_metric_and_wraps_no_short_cell(tmp_path, capsys, monkeypatch):
    """The quickstart study's `runs | cat` printed "json_valid_rat" / "e=0.00" and "12-01" / "12:34":
    a metric is whole on its line (or its column left out), a cell of up to 14 characters is not wrapped."""
    from tuneproof.registry import Registry
    from tuneproof.ui import console

    reg = Registry(tmp_path)
    for kind in ("data-check", "baseline", "preflight", "train", "eval"):
        with reg.run(kind) as run:
            if kind in ("baseline", "eval"):
                run.update_summary(metrics={"json_valid_rate": 0.0, "required_fields_rate": 0.0})
    reg.close()
    monkeypatch.setattr(console, "_width", 80)
    code, out = _main(["runs", "--study", str(tmp_path)], capsys)
    lines = out.splitlines()
    assert code == 0 and max(len(line) for line in lines) <= 80
    assert (
        sum("json_valid_rate=0.00" in line for line in lines) == 2
        and sum("required_fields_rate=0.00" in line for line in lines) == 2
    )
    assert "json_valid_rat " not in out and "completed" in out and "data-check" in out
    assert all(
        time for time in re.findall(r"\b\d\d-\d\d\b( \d\d:\d\d)?", out)
    )  # a creation time is never split from its date


def test_compare_screen_caps_a_77_class_list_and_names_each_criterion_once(monkeypatch, capsys):
    """A guard that cannot judge 77 classes (support 2, 3 needed) names 10 of them on the compare
    screen, then how many more (the whole list is in compare.json); each verdict line reads
    "pass  success: ...", not "success pass success: ..."."""
    from tuneproof.evaluation.compare import judge, overall_verdict
    from tuneproof.recipes.compare import _print
    from tuneproof.study import Hypothesis
    from tuneproof.ui import console

    names = [f"card_payment_not_recognised_{i:02d}" for i in range(77)]
    r = {
        "task": "classification",
        "n": 154,
        "counts": {"fixed": 40, "broken": 9, "unchanged_right": 60, "unchanged_wrong": 45},
        "mcnemar": {"p_value": 1e-5},
        "metrics": {"accuracy": {"base": 0.4, "cand": 0.6, "delta": 0.2, "ci": [0.1, 0.3]}},
        "per_class": {
            n: {"recall": {"base": 0.5, "cand": 0.5, "delta": 0.0, "ci": [0.0, 0.0], "support": 2}} for n in names
        },
        "per_field": {},
    }
    hyp = Hypothesis(
        behaviour="b",
        task="classification",
        success={"metric": "accuracy", "min_gain": 0.05},
        guards=[{"metric": "per_class_recall", "max_drop": 0.1, "min_support": 3}],
    )
    r["verdicts"] = judge(hyp, r)
    r["overall"] = overall_verdict(r["verdicts"])
    monkeypatch.setattr(console, "_width", 100)
    _print("r0004", "r0002", r, "runs/r0005/compare.json")
    out = capsys.readouterr().out
    lines = out.splitlines()
    success = next(line for line in lines if "success: accuracy gain >= 0.05" in line)
    assert success.split()[:7] == ["pass", "success:", "accuracy", "gain", ">=", "0.05:", "delta"]
    guard = next(line for line in lines if "guard: per_class_recall" in line)
    assert guard.startswith("  not measurable ") and guard.endswith(
        "card_payment_not_recognised_09 (support 2) and 67 more (in compare.json)"
    )
    assert "card_payment_not_recognised_10" not in out and max(len(line) for line in lines) < 800
    assert len(r["verdicts"][1]["items"]) == 77  # the whole list stays in compare.json
