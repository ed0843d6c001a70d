"""The preflight's one table of checks (``tuneproof.preflight.checks.CHECKS``): the order the recipe runs,
the rows a study's settings add, the ones an early stop lists as skipped, and the functions each row names."""

from __future__ import annotations

import pytest

from tuneproof.preflight import bench
from tuneproof.preflight.checks import BY_NAME, CHECKS, PREFLIGHT_NAMES, model_stage, planned, skippable
from tuneproof.study import Study

TEXT_DEFAULT = [
    "environment",
    "backend",
    "training data",
    "target modules",
    "trainable parameters",
    "embedding size",
    "update check",
    "step memory",
    "eval memory",
    "gradient accumulation",
    "precision",
    "activation checkpointing",
    "eval batch size",
    "configured combination",
    "smoke pass",
    "throughput",
]


def study(**training) -> Study:
    method = training.pop("method", "lora")
    return Study.model_validate(
        {
            "name": "s",
            "hypothesis": {"behaviour": "b", "task": "classification", "success": {"metric": "macro_f1"}},
            "data": {"sources": [{"path": "d.csv", "format": "csv"}]},
            "model": {"base": "m"},
            "method": {"kind": method},
            "training": training,
        }
    )


def test_default_text_order_is_the_report_order_of_a_passing_preflight():
    assert planned(study(), "text") == TEXT_DEFAULT
    assert len({c.name for c in CHECKS}) == len(CHECKS)  # one row per check


def test_bf16_base_weights_runs_accumulation_and_precision_on_the_fp32_weights_first():
    names = planned(study(bf16_base_weights=True), "text")
    i = names.index("bf16 base weights")
    assert names[i - 2 : i + 2] == ["gradient accumulation", "precision", "bf16 base weights", "update check"]
    assert names.count("gradient accumulation") == names.count("precision") == 1
    # an early stop lists them in the table's order
    rest = skippable(study(bf16_base_weights=True))
    assert rest.index("bf16 base weights") < rest.index("update check") < rest.index("gradient accumulation")


def test_settings_add_their_rows_where_they_belong():
    names = planned(study(method="qlora", packing=True, chunked_loss=True, compile=True), "text")
    u = names.index("update check")
    assert names[u + 1 : u + 3] == ["qlora storage", "qlora step"]
    e = names.index("eval batch size")
    assert names[e + 1 : e + 3] == ["packing", "chunked loss"]
    assert names[-4:] == ["compile", "configured combination", "smoke pass", "throughput"]
    assert "max micro-batch" not in names
    with_option = planned(study(), "text", frozenset({"--find-max-micro-batch"}))
    assert with_option[with_option.index("eval memory") + 1] == "max micro-batch"


def test_an_early_stop_lists_what_a_written_study_runs_but_not_what_an_option_or_auto_adds():
    rest = skippable(study(speedups="auto"))
    assert "compile" not in skippable(study(compile=True))
    assert rest[0] == "training data" and rest[-3:] == ["configured combination", "smoke pass", "throughput"]
    assert not {"speedups auto", "compile", "max micro-batch", "environment", "backend"} & set(rest)


def test_image_skips_embedding_size_after_its_steps_and_runs_no_token_checks():
    names = planned(study(packing=True), "image", frozenset({"--find-max-micro-batch"}))
    assert names[names.index("eval batch size") + 1] == "embedding size"
    assert not {"packing", "chunked loss", "max micro-batch"} & set(names)
    assert BY_NAME["embedding size"].skipped_for["image"] == "an image classifier has no token embeddings"


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.name)
def test_every_row_names_functions_that_exist(check):
    for modality, name in check.run.items():
        assert callable(getattr(bench, name, None)), (check.name, modality, name)
    assert check.stage in ("start", "model", "end")
    assert check.before is None or BY_NAME[check.before].stage == "model"


def test_model_stage_runs_each_row_once():
    rows = [c.name for c in model_stage(study(bf16_base_weights=True, activation_checkpointing=True), "text")]
    assert len(rows) == len(set(rows))


def test_the_dossier_names_every_summary_number_once():
    """The summary keys of the preflight run (recipes/preflight.py's _write) have a plain name and unit."""
    keys = {k for c in CHECKS for k in c.numbers}
    assert sum(len(c.numbers) for c in CHECKS) == len(keys)  # no key claimed by two checks
    assert PREFLIGHT_NAMES["s_per_step"] == ("time per optimizer step", "s")
    assert PREFLIGHT_NAMES["budget_gib"] == ("memory budget", "GiB")
    assert PREFLIGHT_NAMES["preflight_seconds"] == ("preflight duration", "s")
    assert len(PREFLIGHT_NAMES) == 26
