"""Variants (``train --from RUN --set/--grid``), their recorded diff and groups, the multi-change
rule, inherited settings, the sweep helper, a diverged variant marked invalid by the health check, and ``runs``/``runs
--tree`` showing all of it."""

from __future__ import annotations

import json

import pytest

from tiny_study import make_study
from tuneproof.cli import main
from tuneproof.context import StudyContext
from tuneproof.io import read_json
from tuneproof.recipes.train import run_train
from tuneproof.recipes.variants import config_diff, group_of, split_values
from tuneproof.registry import Registry


@pytest.fixture(scope="module")
def parent(tiny_base, tmp_path_factory):
    study = make_study(
        tmp_path_factory.mktemp("variants") / "s", tiny_base, max_steps=4, warmup_steps=0, checkpoint_every=4
    )
    rid = run_train(StudyContext.open(study))
    return study, rid


@pytest.fixture(autouse=True)
def wide_console():
    """Tables and trees on one line per row (the console is 80 columns when not a terminal)."""
    from tuneproof.ui import console

    old = console._width
    console.width = 250
    yield
    console._width = old


def cli(capsys, study, *args) -> tuple[int, str]:
    if args[0] == "train":
        args = (*args, "--skip-preflight", "tiny test study")
    with pytest.raises(SystemExit) as exit_:
        main([*args, "--study", str(study)])
    return exit_.value.code, " ".join(capsys.readouterr().out.split())


def test_groups_and_diff():
    assert [
        group_of(k)
        for k in (
            "method.r",
            "training.learning_rate",
            "training.seed",
            "training.max_steps",
            "training.epochs",
            "training.max_length",
            "eval.prompt.system",
            "eval.max_new_tokens",
            "data.cleaning",
            "model.base",
            "training.checkpoint_every",
            "training.micro_batch_size",
            "hypothesis.guards",
        )
    ] == [
        "method",
        "optimisation",
        "seed",
        "budget",
        "budget",
        "data",
        "data",
        "eval",
        "data",
        "model",
        "bookkeeping",
        "optimisation",
        "hypothesis",
    ]
    assert config_diff({"a": {"b": 1, "c": [1, 2]}}, {"a": {"b": 2, "c": [1, 2], "d": 3}}) == [
        {"key": "a.b", "group": "other", "from": 1, "to": 2},
        {"key": "a.d", "group": "other", "from": None, "to": 3},
    ]
    assert split_values("8,16, 32") == ["8", "16", "32"]
    assert split_values("[q_proj,v_proj],[q_proj]") == ["[q_proj,v_proj]", "[q_proj]"]


def test_variant_records_the_exact_diff(parent, capsys):
    study, pid = parent
    code, out = cli(capsys, study, "train", "--from", pid, "--set", "method.r=8", "--name", "lora-r8")
    assert code == 0, out
    reg = Registry(study)
    rec = reg.list()[-1]
    assert (rec.name, rec.parent, rec.status) == ("lora-r8", pid, "completed") and rec.id == f"r{rec.seq:04d}-lora-r8"
    assert f"{rec.id}: adapter runs/{rec.id}/adapter; checkpoints runs/{rec.id}/checkpoints; " in out
    v = read_json(reg.runs_dir / rec.id / "variant.json")
    assert v["parent"] == pid and v["set"] == ["method.r=8"] and v["multi_change"] is False
    assert v["changes"] == [{"key": "method.r", "group": "method", "from": 4, "to": 8}]
    assert v["inherited"]["seed"] == 3 and v["inherited"]["budget"] == {"max_steps": 4, "epochs": None}
    assert v["inherited"]["data_fingerprint"] == reg.get(pid).data_fingerprint == rec.data_fingerprint
    assert v["statements"] == []
    assert (
        config_diff(read_json(reg.runs_dir / pid / "config.json"), read_json(reg.runs_dir / rec.id / "config.json"))
        == v["changes"]
    )
    assert rec.summary["variant"]["change"] == "method.r: 4 -> 8" and rec.summary["multi_change"] is False
    assert (
        read_json(reg.runs_dir / rec.id / "method.json")["trainable"]
        == 2 * read_json(reg.runs_dir / pid / "method.json")["trainable"]
    )


def test_bad_variants_stop_before_any_run(parent, capsys):
    study, pid = parent
    n = len(Registry(study).list())
    cases = [
        (["--set", "method.rr=8"], "--set method.rr=8: unknown key 'method.rr'"),
        (["--set", "trainingg.seed=1"], "unknown key 'trainingg'"),
        (["--set", "method.r=abc"], "--set method.r=abc: method.r: Input should be a valid integer"),
        (["--set", "method.r"], "expected KEY=VALUE"),
        (["--set", "method.r=4"], "the variant equals its parent"),
        (["--set", "hypothesis.behaviour=other"], "'hypothesis.behaviour' is fixed for the whole study"),
        (
            ["--set", "method.r=8", "--set", "training.learning_rate=0.02"],
            "the variant changes 2 groups (method: method.r; optimisation: training.learning_rate)",
        ),
        ([], "say what changes with --set"),
        (["--grid", "method.r=4"], "every value equals the parent's"),
        (["--grid", "method.r=8,x"], "--set method.r=x: method.r: Input should be a valid integer"),
    ]
    for args, message in cases:
        code, out = cli(capsys, study, "train", "--from", pid, *args)
        assert code == 2 and message in out, (args, out)
    code, out = cli(capsys, study, "train", "--set", "method.r=8")
    assert code == 2 and "they need --from RUN" in out
    code, out = cli(capsys, study, "train", "--from", "r0099", "--set", "method.r=8")
    assert code == 2 and "run 'r0099' does not exist" in out
    assert len(Registry(study).list()) == n


def test_a_variant_runs_its_missing_preflight_inline_and_a_failed_one_refuses_it(parent, capsys):
    """README's ``train --from r0004 --set method.r=16`` was refused for a missing preflight: a variant is a
    new config, its preflight runs inline (saying so and how long), and a failed one refuses the variant."""
    study, pid = parent
    n_train = len(Registry(study).list(kind="train"))
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--from", pid, "--set", "method.target_modules=[no_such_module]", "--study", str(study)])
    out = " ".join(capsys.readouterr().out.split())
    assert exit_.value.code == 3, out
    failed = Registry(study).latest("preflight", status="failed")
    assert "no preflight for this configuration (no preflight has passed in this study): running" in out
    assert f"train refused: the preflight run now failed: preflight {failed.id}: " in out
    assert len(Registry(study).list(kind="train")) == n_train  # no variant trained
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--from", pid, "--set", "method.r=16", "--study", str(study)])
    out = " ".join(capsys.readouterr().out.split())
    assert exit_.value.code == 0, out
    pf = Registry(study).latest("preflight")
    variant = Registry(study).latest("train")
    assert pf.status == "completed" and variant.summary["preflight_run"] == pf.id
    assert variant.summary["variant"]["change"] == "method.r: 4 -> 16" and "preflight_override" not in variant.summary
    assert f"preflight {pf.id} passed in " in out and "training goes on" in out


def test_multi_change_and_inherited_changes_are_stated(parent, capsys):
    study, pid = parent
    code, out = cli(
        capsys, study, "train", "--from", pid, "--set", "method.r=8", "--set", "training.seed=5", "--allow-multi-change"
    )
    assert code == 0, out
    reg = Registry(study)
    rec = reg.list()[-1]
    v = read_json(reg.runs_dir / rec.id / "variant.json")
    assert v["multi_change"] is True and v["groups"] == ["method", "seed"]
    assert v["statements"] == [
        f"seed not inherited from {pid}: training.seed 3 -> 5",
        "multi-change variant: 2 groups changed (method, seed); its effect cannot be attributed to one change",
    ]
    assert rec.summary["multi_change"] is True
    code, out = cli(capsys, study, "runs")
    assert code == 0 and "multi-change variant" in out


def test_grid_makes_one_single_change_variant_per_value_and_a_diverged_one_is_invalid(parent, capsys):
    study, pid = parent
    n = len(Registry(study).list())
    code, out = cli(capsys, study, "train", "--from", pid, "--grid", "training.learning_rate=1e6,0.01,0.02")
    assert code == 0, out
    assert f"training.learning_rate=0.01 is the value of {pid}: no variant" in out
    reg = Registry(study)
    new = reg.list()[n:]
    assert [r.name for r in new] == ["learning_rate1e6", "learning_rate0.02"]
    assert [r.parent for r in new] == [pid, pid]
    bad, good = new
    # lr 1e6, no warmup: AdamW moves each LoRA B element by ~1e6 on step 1, past the 1e4 limit, on any CPU
    # (a NaN loss, if it comes at all, comes later and depends on the CPU's kernels)
    assert bad.status == "invalid" and bad.reason.startswith(
        "step 1: exploded_tensor: max |value| 1e+06 > limit 1e+04"
    )  # the sweep went on
    assert bad.summary["health"]["rule"] == "exploded_tensor" and bad.summary["health"]["step"] == 1
    assert good.status == "completed"
    for r, value in ((bad, 1e6), (good, 0.02)):
        v = read_json(reg.runs_dir / r.id / "variant.json")
        assert v["changes"] == [{"key": "training.learning_rate", "group": "optimisation", "from": 0.01, "to": value}]
        assert v["grid"]["key"] == "training.learning_rate" and v["multi_change"] is False
    last = json.loads((reg.runs_dir / bad.id / "metrics.jsonl").read_text().splitlines()[-1])
    assert (last["step"], last["health"]) == (1, "exploded_tensor") and last["max_abs"] > 1e5

    code, out = cli(capsys, study, "runs")
    assert code == 0 and "step 1: exploded_tensor" in out and "invalid" in out
    code, out = cli(capsys, study, "runs", "--tree")
    assert code == 0
    lora = next(r.id for r in reg.list() if r.name == "lora-r8")
    assert f"{lora} train completed method.r: 4 -> 8" in out
    assert "training.learning_rate: 0.01 -> 1000000.0" in out and "(step 1: exploded_tensor" in out
    assert "multi-change" in out and "not evaluated" in out


def test_runs_at_80_columns_without_a_terminal_cuts_no_run_id_or_override(parent, capsys, monkeypatch):
    """`tuneproof runs | less` (stdout not a terminal, COLUMNS=80): every run id and every variant
    override is whole on one line; the columns left out to make room are named."""
    from tuneproof.ui import console

    study, pid = parent
    code, out = cli(capsys, study, "train", "--from", pid, "--grid", "training.learning_rate=0.00012345,0.00054321")
    assert code == 0, out
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(console, "_width", 80)
    assert not console.is_terminal
    with pytest.raises(SystemExit) as exit_:
        main(["runs", "--study", str(study)])
    out = capsys.readouterr().out
    assert exit_.value.code == 0
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80
    reg = Registry(study)
    variants = reg.list()[-2:]
    assert [r.id for r in variants] == [
        f"r{variants[0].seq:04d}-learning_rate0.00012345",
        f"r{variants[1].seq:04d}-learning_rate0.00054321",
    ]
    assert [r.summary["variant"]["overrides"] for r in variants] == [
        ["training.learning_rate=0.00012345"],
        ["training.learning_rate=0.00054321"],
    ]
    for rec in reg.list():  # each id whole on one line (29 characters for the variants), its override on the next
        assert any(rec.id in line for line in lines), (rec.id, out)
    for override in ("training.learning_rate=0.00012345", "training.learning_rate=0.00054321"):
        assert any(override in line for line in lines), (override, out)
        assert override in "".join(out.split())
    at = next(i for i, line in enumerate(lines) if variants[0].id in line)
    assert "training.learning_rate=0.00012345" in lines[at + 1]
    assert "not shown at 80 columns: created, metrics" in " ".join(out.split())


def test_groups_follow_each_keys_role():
    """The variant groups come from the roles in tuneproof.study: tracking and bookkeeping are no change, the
    scoring and serving keys are the evaluation procedure, the prompt is training input."""
    assert group_of("tracking.mlflow.uri") == group_of("report_to") == "bookkeeping"
    assert group_of("distributed.timeout_s") == group_of("training.checkpoint_every") == "bookkeeping"
    assert group_of("eval.grammar") == group_of("eval.backend") == group_of("eval.max_examples") == "eval"
    assert group_of("eval.prompt.template") == "data" and group_of("training.max_steps") == "budget"
    assert group_of("hypothesis.success.metric") == "hypothesis" and group_of("name") == "study"
    assert group_of("no_such_key") == "other"
