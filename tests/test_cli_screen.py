"""What the user reads on the screen: commands in protocol order, where the step budget is set,
`runs --json` for scripts."""

from __future__ import annotations

import json
import re
from pathlib import Path

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


STEP_MEMORY = {
    "name": "step memory",
    "passed": True,
    "numbers": {
        "micro_batch": 4,
        "budget_gib": 80.0,
        "L512_peak_gib": 31.25,
        "L512_measured_over_estimate": 1.209,
        "L2048_peak_gib": 61.5,
        "L2048_measured_over_estimate": 1.0912,
    },
    "message": "micro-batch 4: length 512: the step's tensors 12.1 GiB vs 10.0 GiB estimated (measured / estimated "
    "1.209), whole step: estimate 30.0 GiB, measured peak 31.25 GiB (the step adds 14.0 GiB), 1.91 s; " + "x" * 500,
    "details": {
        "budget_bytes": 80 * 2**30,
        "budget_source": "the GPU's memory",
        "rows": [
            {
                "length": L,
                "estimate": {
                    "micro_batch": 4,
                    "weights_bytes": 15 * 2**30,
                    "autocast_weight_copies_bytes": 0,
                    "gradients_bytes": 2**28,
                    "optimizer_states_count": 2,
                    "optimizer_states_bytes": 2**29,
                    "optimizer_step_temporary_bytes": 2**28,
                    "activations_bytes": k * 2**30,
                    "logits_bytes": k * 2**29,
                },
                "estimate_in_step_bytes": k * 3 * 2**29,
                "measured_over_estimate": ratio,
                "measured": {"allocated_step_peak_bytes": int(ratio * k * 3 * 2**29), "peak_bytes": peak * 2**30},
            }
            for L, k, ratio, peak in ((512, 6, 1.209, 31.25), (2048, 24, 1.0912, 61.5))
        ],
    },
}


def test_preflight_prints_each_check_once_as_a_row_with_the_number_that_matters(monkeypatch, capsys):
    """One row per check, printed as it ends: the verdict, the name and one number (the peak against
    the budget), never the whole message; a failed check's message once, below; at 100 columns."""
    from tuneproof.preflight.report import PreflightReport, check_result, headline
    from tuneproof.recipes.preflight import _print_end
    from tuneproof.ui import console

    monkeypatch.setattr(console, "_width", 100)
    rep = PreflightReport()
    rep.add(dict(STEP_MEMORY))
    rep.add(
        check_result(
            "gradient accumulation",
            True,
            "accumulating 2 micro-batches (72 supervised tokens) equals the concatenated batch: loss 5.72052 "
            "(mean of means would be 5.72162), max grad diff 1.12e-08; every window of an epoch is full",
            {"micro_batches": 2, "grad_max_abs_diff": 1.12e-08},
        )
    )
    rep.add(check_result("target modules", False, "q_proj matched nothing; " + "y" * 300))
    _print_end(rep, "r0003", 103.0)
    lines = capsys.readouterr().out.splitlines()
    assert [line.rstrip() for line in lines[:3]] == [
        "pass step memory               peak 61.50 GiB of 80.00 GiB at micro-batch 4, length 2048; measured /",
        "                               estimated 1.09",
        "pass gradient accumulation     2 micro-batches equal their concatenation (max gradient difference",
    ]
    assert lines[4].rstrip() == "FAIL target modules            q_proj matched nothing"
    out = "\n".join(lines)
    assert "xxxx" not in out and out.count("y" * 300) == 1  # the message of a failed check, once
    assert headline({"name": "n", "passed": True, "message": "w " * 100}) == "w " * 44 + "w ..."
    assert lines[-1] == "preflight r0003 (103 s, 3 checks) failed: target modules"


def test_the_step_memory_reads_in_plain_words_with_each_ratio_labelled():
    from tuneproof.preflight.step_memory import memory_plain_rows

    cols, rows = memory_plain_rows(STEP_MEMORY)
    assert cols == ["step memory, micro-batch 4", "length 512", "length 2048"]
    assert rows == [
        ["model weights", "15.000 GiB", "15.000 GiB"],
        ["gradients of the trained weights", "256.0 MiB", "256.0 MiB"],
        ["optimizer state (2 values per trained weight) and its step", "768.0 MiB", "768.0 MiB"],
        ["activations kept for the backward pass", "6.000 GiB", "24.000 GiB"],
        ["logits for the loss (tokens x vocabulary)", "3.000 GiB", "12.000 GiB"],
        ["estimated: the step's own tensors at their peak", "9.000 GiB", "36.000 GiB"],
        ["measured: the step's own tensors at their peak", "10.881 GiB", "39.283 GiB"],
        ["ratio measured / estimated (1.00 = exact)", "1.21", "1.09"],
        ["measured: the whole process at its peak", "31.250 GiB", "61.500 GiB"],
        ["budget (the GPU's memory)", "80.000 GiB", "80.000 GiB"],
    ]
    assert memory_plain_rows({"name": "step memory", "details": {"peak": 1}}) == ([], [])  # an image classifier's


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


def test_init_says_the_next_command_and_flags_read_as_flags(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    code, out = _main(["init", str(tmp_path / "s"), "--task", "classification"], capsys)
    assert code == 0 and out.splitlines()[-1] == f"next: tuneproof data check --study {tmp_path / 's'}"
    code, out = _main(["export", "--help"], capsys)
    merge = next(line for line in out.splitlines() if "--merge" in line)
    assert "<bool>" not in out and merge.split()[:4] == ["│", "--merge", "also", "write"]
    assert any("--device" in line and "<str>" in line for line in out.splitlines())  # options with a value keep it


def test_a_model_in_the_cache_is_named_by_its_folder_not_the_home_path(tmp_path):
    from tuneproof.models.base_model import MODEL_CACHE, BaseModelRef

    def ref(name):
        return BaseModelRef(name, Path(name), "r", "image-classification", "local")

    assert ref(str(MODEL_CACHE / "vit-digits-init-s0")).display_name == "vit-digits-init-s0 (tuneproof model cache)"
    assert ref(str(Path.home() / "models" / "bert")).display_name == "~/models/bert"
    assert ref("smollm2-135m-instruct").display_name == "smollm2-135m-instruct"  # an alias, as written
    assert ref("/opt/models/x").display_name == "/opt/models/x"


def test_the_quickstart_header_is_whole_at_80_columns(monkeypatch, capsys):
    from tuneproof.recipes.quickstart import header
    from tuneproof.ui import console

    monkeypatch.setattr(console, "_width", 80)
    text = "tuneproof quickstart in /tmp/qs (data: /work/shared/data/snips/a-long-folder-name/and-more)"
    header(text)
    out = capsys.readouterr().out
    assert " ".join(out.split()).startswith(text) and "..." not in out
