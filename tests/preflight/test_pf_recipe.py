"""The preflight recipe on a tiny local study (docs/PROTOCOL.md steps 4-6; docs/CASES.md C1, C5, C7, C8, C9):
every check stored with its numbers, bad input failing with a recorded reason (exit 3), and the
gate of ``train`` (exit 3 without a matching preflight, naming the changed keys; an override recorded)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from tuneproof.cli import main
from tuneproof.context import StudyContext
from tuneproof.errors import CheckFailed, TuneproofError
from tuneproof.preflight.checks import planned
from tuneproof.preflight.environment import parse_memory
from tuneproof.recipes.preflight import PREFLIGHT_FILE, matching_preflight, require_preflight, run_preflight
from tuneproof.registry import Registry

WORDS = (
    "add the piano bar to my playlist book a table for two in Paris tonight weather Rome tomorrow rate this book"
).split()
INTENTS = ["PlayMusic", "BookRestaurant", "GetWeather"]


def _rows(n: int, offset: int) -> list[dict]:
    rows = []
    for i in range(n):
        k = i + offset
        words = [
            WORDS[(k * 5 + j * 3) % len(WORDS)] for j in range(2 + k % 5)
        ]  # lengths differ: docs/CASES.md C1 needs unequal windows
        slots = {"artist": words[0]} if k % 2 else {}
        rows.append({"text": " ".join(words), "target": json.dumps({"intent": INTENTS[k % 3], "slots": slots})})
    return rows


def make_study(folder: Path, base: Path, **changes) -> Path:
    """A study folder: tuneproof.yaml + data/{train,validation,test}.jsonl (format jsonl, fields text/target)."""
    (folder / "data").mkdir(parents=True, exist_ok=True)
    for name, n, off in (("train", 16, 0), ("validation", 4, 100), ("test", 4, 200)):
        (folder / "data" / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(n, off)))
    cfg = {
        "schema_version": 1,
        "name": "tiny-preflight",
        "hypothesis": {
            "behaviour": "answer in JSON",
            "task": "extraction",
            "success": {"metric": "field_f1", "min_gain": 0.0},
            "guards": [{"metric": "json_valid_rate", "max_drop": 0.0}],
            "required_fields": ["intent", "slots"],
        },
        "data": {
            "sources": [
                {"path": f"data/{s}.jsonl", "format": "jsonl", "split": s} for s in ("train", "validation", "test")
            ],
            "fields": {"text": "text", "target": "target"},
        },
        "model": {"base": str(base)},
        "method": {"kind": "lora", "r": 4, "alpha": 8, "dropout": 0.1, "target_modules": ["q_proj", "v_proj"]},
        "training": {
            "seed": 1,
            "max_steps": 3,
            "micro_batch_size": 4,
            "gradient_accumulation_steps": 2,
            "learning_rate": 0.01,
            "warmup_steps": 1,
            "precision": "fp32",
            "max_length": 128,
            "checkpoint_every": 2,
        },
        "eval": {
            "split": "validation",
            "max_new_tokens": 6,
            "batch_size": 4,
            "bootstrap_iterations": 100,
            "prompt": {"system": None, "template": "Extract JSON: {text}"},
        },
    }
    for dotted, value in changes.items():
        node = cfg
        *path, last = dotted.split("__")
        for p in path:
            node = node[p]
        node[last] = value
    (folder / "tuneproof.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return folder


def checks_of(study: Path, run_id: str) -> dict[str, dict]:
    data = json.loads((study / "runs" / run_id / PREFLIGHT_FILE).read_text())
    return {c["name"]: c for c in data["checks"]}


def cli(*args: str) -> int:
    with pytest.raises(SystemExit) as exit_:
        main(list(args))
    return exit_.value.code


@pytest.fixture(scope="module")
def passed(tmp_path_factory, tiny_model_dir):
    """A study with one passed preflight (shared by the tests that only read it)."""
    study = make_study(tmp_path_factory.mktemp("pf") / "study", tiny_model_dir)
    run_id = run_preflight(StudyContext.open(study))
    return study, run_id


def test_parse_memory_units():
    assert parse_memory("80GiB") == 80 * 2**30
    assert parse_memory("512 MiB") == 512 * 2**20
    assert parse_memory("16GB") == 16 * 10**9
    assert parse_memory("1.5g") == int(1.5 * 2**30)
    with pytest.raises(TuneproofError, match="not a memory size"):
        parse_memory("80 parsecs")


def test_preflight_passes_and_stores_every_check_with_numbers(passed):
    study, run_id = passed
    rec = Registry(study).get(run_id)
    assert rec.kind == "preflight" and rec.status == "completed"
    checks = checks_of(study, run_id)
    assert list(checks) == planned(StudyContext.open(study).study, "text")  # the order of CHECKS
    assert list(checks)[:3] == ["environment", "backend", "training data"] and list(checks)[-1] == "throughput"
    assert all(c["passed"] is True and c["numbers"] and c["message"] for c in checks.values()), [
        (n, c["passed"], c["message"]) for n, c in checks.items() if c["passed"] is not True
    ]
    # docs/CASES.md C9: the dtype and its reason
    assert checks["backend"]["numbers"]["dtype"] == "fp32" and checks["backend"]["numbers"]["device"] == "cpu"
    # docs/CASES.md C5: matches per pattern on the 2-layer Llama; LoRA r=4: q_proj 32->32 and v_proj 32->16 (2 kv heads
    # x 8)
    assert checks["target modules"]["numbers"]["q_proj"] == 2 and checks["target modules"]["numbers"]["v_proj"] == 2
    tp = checks["trainable parameters"]["numbers"]
    assert tp["trainable"] == 2 * (4 * 32 + 32 * 4 + 4 * 32 + 16 * 4) and tp["trainable_tensors"] == 8
    # docs/CASES.md C7: every LoRA tensor changed (lora_A needs a second step: B starts at 0), every frozen one bitwise
    # unchanged
    up = checks["update check"]["numbers"]
    assert up["trainable_changed"] == up["trainable_tensors"] == 8
    assert up["frozen_unchanged"] == up["frozen_tensors"] > 0 and up["steps"] == 2
    # docs/CASES.md C8: estimate next to the measured peak at p95 and at max_length, configured micro-batch
    mem = checks["step memory"]
    p95 = checks["training data"]["numbers"]["p95"]
    assert (
        p95 < 128 and mem["numbers"]["micro_batch"] == 4 and [r["length"] for r in mem["details"]["rows"]] == [p95, 128]
    )
    for row in mem["details"]["rows"]:
        est = row["estimate"]
        assert (
            est["weights_bytes"] == 4 * est["parameters"]
            and est["optimizer_states_bytes"] == 2 * 4 * est["trainable_parameters"]
        )
        assert row["measured"]["peak_bytes"] > 0 and row["side_by_side"]["rows"][0][0] == "weights"
        # docs/CASES.md C8: the step's tensors (CPU allocator count) next to the estimate of the step's part, with their
        # ratio
        assert (
            row["measured"]["allocated_step_peak_bytes"] > 0
            and mem["numbers"][f"L{row['length']}_measured_over_estimate"] == row["measured_over_estimate"]
        )
        assert 0.85 <= row["measured_over_estimate"] <= 1.15, row["measured_over_estimate"]
    bd = mem["details"]["breakdown"]  # the estimate itemised per length (MiB), then the measured step
    assert bd["lengths"] == [p95, 128] and bd["micro_batch"] == 4
    names = [r[0] for r in bd["rows"]]
    assert names[:2] == ["weights", "gradients"] and "activations: MLP gate, silu, up (3i per block)" in names
    assert "measured: the step's tensors at the peak" in names and rec.summary["memory_breakdown"]["rows"] == bd["rows"]
    # the evaluation fits too: eval.batch_size 4, 6 new tokens generated with the KV cache after the longest prompt
    em = checks["eval memory"]["numbers"]
    assert em["batch_size"] == 4 and em["new_tokens"] == 6 and em["peak_gib"] > 0 and em["prompt_tokens"] > 0
    # docs/CASES.md C1: two real micro-batches; the per-token loss over the window equals the concatenated batch, not
    # the mean of means
    acc = checks["gradient accumulation"]["numbers"]
    assert acc["micro_batches"] == 2 and acc["configured_accumulation"] == 2
    assert acc["loss_accumulated"] == pytest.approx(acc["loss_concatenated"], rel=1e-5)
    assert len(set(acc["tokens_per_micro_batch"])) == 2 and acc["loss_mean_of_means"] != pytest.approx(
        acc["loss_accumulated"], rel=1e-6
    )
    assert "per-token mean over the accumulation window" in checks["gradient accumulation"]["normalisation"]
    ck = checks["activation checkpointing"]["numbers"]
    assert ck["grad_max_abs_diff"] <= 1e-6 and ck["seconds_with"] > 0 and ck["configured"] is False
    # docs/CASES.md C22: the 4 validation examples one at a time and as one batch of eval.batch_size 4: identical
    # outputs
    assert checks["eval batch size"]["numbers"] == {"sample": 4, "batch_size": 4, "differing": 0}
    combo = checks["configured combination"]["numbers"]
    assert combo["steps"] == 2 and combo["accumulation"] == 2 and combo["trainable_changed"] == 8
    assert combo["frozen_unchanged"] == combo["frozen_tensors"]
    # smoke pass: saved adapter, reloaded in a fresh process, identical predictions and logits
    sm = checks["smoke pass"]["numbers"]
    assert sm["eval_examples"] == 2 and sm["identical_after_reload"] == 2 and sm["max_abs_logit_diff"] <= 1e-4
    assert (
        sm["adapter_effect_max_abs_logit"] > sm["max_abs_logit_diff"]
    )  # the reload comparison can tell the adapter apart
    assert (study / "runs" / run_id / "smoke" / "adapter" / "adapter_model.safetensors").exists()
    th = checks["throughput"]["numbers"]
    assert th["s_per_step"] > 0 and th["tokens_per_s"] > 0 and th["total_steps"] == 3
    assert th["budget_seconds"] == pytest.approx(3 * th["s_per_step"], rel=1e-3, abs=0.1)
    assert th["eval_examples"] == 4 and th["eval_seconds_estimate"] == pytest.approx(
        4 * th["eval_s_per_example"], abs=0.1
    )
    # the summary carries what `tuneproof plan` and the dossier read
    s = rec.summary
    assert (
        s["passed"] is True
        and s["s_per_step"] == th["s_per_step"]
        and s["eval_s_per_example"] == th["eval_s_per_example"]
    )
    assert (
        s["budget_seconds"] == th["budget_seconds"]
        and s["tokens_per_s"] == th["tokens_per_s"]
        and s["reload_seconds"] > 0
    )
    # tuneproof plan reads the evaluation rate of one batch at eval.batch_size (the task kind's procedure)
    assert (
        s["eval_batch_size"] == 4
        and s["eval_batch_procedure"] == "generation of 6 new tokens"
        and s["eval_batch_s_per_example"] > 0
    )
    assert th["eval_s_per_example"] == pytest.approx(s["eval_batch_s_per_example"], abs=1e-4)
    assert len(s["checks"]) == 16 and s["platform_key"].startswith("cpu |")


def test_unmatched_target_pattern_fails_naming_it_exit_3(tmp_path, tiny_model_dir):
    study = make_study(tmp_path / "s", tiny_model_dir, method__target_modules=["q_proj", "ff.0"])
    assert cli("preflight", "--study", str(study)) == 3
    rec = Registry(study).latest("preflight", status="failed")
    assert rec is not None and "ff.0" in rec.reason and "target modules" in rec.reason
    checks = checks_of(study, rec.id)
    t = checks["target modules"]
    assert (
        t["passed"] is False
        and t["numbers"]["q_proj"] == 2
        and t["numbers"]["ff.0"] == 0
        and t["numbers"]["unmatched"] == ["ff.0"]
    )
    assert checks["update check"]["passed"] is None and "skipped" in checks["update check"]["message"]
    assert rec.summary["failed"] == ["target modules"]


def test_memory_budget_too_small_fails_with_the_numbers(tmp_path, tiny_model_dir):
    study = make_study(tmp_path / "s", tiny_model_dir)
    with pytest.raises(CheckFailed, match="step memory") as err:
        run_preflight(StudyContext.open(study), memory_budget=parse_memory("1MiB"))
    assert "exceed the budget 1.0 MiB" in str(err.value) and "measured peak" in str(err.value)
    rec = Registry(study).latest("preflight", status="failed")
    mem = checks_of(study, rec.id)["step memory"]
    assert mem["passed"] is False and mem["numbers"]["budget_gib"] == pytest.approx(2**20 / 2**30, abs=1e-4)
    key = [k for k in mem["numbers"] if k.endswith("_estimate_gib")][0]
    assert mem["numbers"][key] * 2**30 > 2**20  # the estimate exceeds 1 MiB and is stated
    em = checks_of(study, rec.id)["eval memory"]  # one evaluation batch does not fit either: named by its key
    assert (
        em["passed"] is False
        and em["numbers"]["peak_gib"] > 0
        and em["message"].startswith("eval.batch_size 4: measured peak")
    )
    assert "exceeds the budget 1.0 MiB (--memory-budget)" in em["message"]
    assert rec.summary["failed"] == ["step memory", "eval memory"] and "step memory" in rec.reason


def test_precision_the_device_cannot_do_fails_before_any_model_work(tmp_path, tiny_model_dir):
    study = make_study(tmp_path / "s", tiny_model_dir, training__precision="fp16")
    assert cli("preflight", "--study", str(study)) == 3
    rec = Registry(study).latest("preflight", status="failed")
    checks = checks_of(study, rec.id)
    assert checks["backend"]["passed"] is False and "fp16 is not supported on CPU" in checks["backend"]["message"]
    assert checks["backend"]["details"]["dtype"]["dtype"] is None
    assert all(c["passed"] is None for n, c in checks.items() if n not in ("environment", "backend"))
    assert (study / "runs" / rec.id / "config.json").exists() and rec.config_hash


def test_train_runs_a_missing_preflight_inline_then_reuses_it_and_records_an_override(
    tmp_path, tiny_model_dir, passed, capsys
):
    fresh = make_study(tmp_path / "fresh", tiny_model_dir)
    assert cli("baseline", "--study", str(fresh)) == 0  # runs the data check inline first (docs/PROTOCOL.md steps 3, 2)
    assert matching_preflight(StudyContext.open(fresh))[:2] == (None, "no preflight has passed in this study")
    capsys.readouterr()
    assert cli("train", "--study", str(fresh)) == 0  # like the data check, the missing preflight runs inline
    out = " ".join(capsys.readouterr().out.split())
    pf = Registry(fresh).latest("preflight")
    train = Registry(fresh).latest("train")
    assert pf.status == "completed" and train.status == "completed" and pf.seq < train.seq
    assert train.summary["preflight_run"] == pf.id
    assert (
        "no preflight for this configuration (no preflight has passed in this study): running "
        f"`tuneproof preflight --study {fresh}` now, its time is not known yet (no earlier preflight in this study)"
    ) in out
    assert re.search(rf"preflight {pf.id} passed in \d+ (s|min \d\d s); training goes on", out)
    # the study with a passed preflight: accepted for the same config; a changed config names the keys
    study, run_id = passed
    assert require_preflight(StudyContext.open(study), None) == run_id
    cfg = StudyContext.open(study).config
    changed = StudyContext.open(
        study,
        config={**cfg, "method": {**cfg["method"], "r": 8}, "training": {**cfg["training"], "learning_rate": 0.02}},
    )
    assert matching_preflight(changed)[:2] == (
        None,
        f"the latest passed preflight {run_id} was for another configuration: "
        "config method.r: 4 -> 8, training.learning_rate: 0.01 -> 0.02 changed",
    )
    # keys that cannot change what the preflight measured keep it valid
    same = StudyContext.open(
        study,
        config={
            **cfg,
            "name": "renamed",
            "training": {**cfg["training"], "max_steps": 50, "checkpoint_every": 7},
            "eval": {**cfg["eval"], "bootstrap_iterations": 2000, "max_examples": 3},
        },
    )
    assert require_preflight(same, None) == run_id
    # an eval key the smoke pass uses invalidates it
    batch = StudyContext.open(study, config={**cfg, "eval": {**cfg["eval"], "batch_size": 2}})
    assert matching_preflight(batch)[1].endswith("config eval.batch_size: 4 -> 2 changed")
    # an explicit override trains and is recorded in the run
    assert cli("train", "--study", str(fresh), "--skip-preflight", "tiny smoke study") == 0
    rec = Registry(fresh).latest("train")
    assert rec.status == "completed" and rec.summary["preflight_override"] == "tiny smoke study"


def test_find_max_micro_batch_is_bounded_by_the_train_split_and_by_the_budget(tmp_path, tiny_model_dir):
    import contextlib

    from tuneproof.preflight.step_memory import check_max_micro_batch

    ctx = StudyContext.open(make_study(tmp_path / "s", tiny_model_dir))
    model, _ = ctx.build_model()
    encoded = ctx.pipeline.encode_all(ctx.split("train"))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    big = check_max_micro_batch(model, ctx, encoded, 96, "fp32", parse_memory("20GiB"), contextlib.nullcontext)
    assert (
        big["passed"] is True and big["numbers"]["max_micro_batch"] == 16 == big["numbers"]["limit"]
    )  # 16 train examples
    assert [t["micro_batch"] for t in big["details"]["tries"]] == [1, 2, 4, 8, 16]
    assert all(torch_equal(before[n], p) for n, p in model.named_parameters())  # the probe steps were undone
    small = check_max_micro_batch(model, ctx, encoded, 96, "fp32", parse_memory("1MiB"), contextlib.nullcontext)
    assert small["passed"] is False and small["numbers"]["max_micro_batch"] == 0
    assert "micro-batch 1 does not fit in 0.001 GiB" in small["message"]


def torch_equal(a, b) -> bool:
    import torch

    return torch.equal(a, b.detach())


def test_env_json_prints_the_recorded_snapshot(capsys):
    assert cli("env", "--json") == 0
    snap = json.loads(capsys.readouterr().out)
    import torch

    assert snap["torch"] == torch.__version__ and snap["backend"] == "cpu" and snap["platform_key"].startswith("cpu |")
    assert snap["libraries"]["peft"] and snap["cpu"]["logical_cores"] >= 1


def test_packing_check_runs_only_with_training_packing_and_passes_on_the_tiny_llama(tmp_path, tiny_model_dir, passed):
    study, run_id = passed
    assert "packing" not in checks_of(study, run_id)  # off by default: not listed
    study = make_study(tmp_path / "s", tiny_model_dir, training__packing=True)
    rid = run_preflight(StudyContext.open(study))
    names = list(checks_of(study, rid))
    assert names.index("packing") == names.index("eval batch size") + 1  # docs/CASES.md C23 after docs/CASES.md C22
    chk = checks_of(study, rid)["packing"]
    assert chk["passed"] is True and chk["numbers"]["examples"] == 4 and chk["numbers"]["max_abs_diff"] <= 1e-4
    assert chk["numbers"]["control_max_abs_diff"] > 1e-4  # the neighbour-visible rows differ


def test_bf16_base_weights_checked_before_the_update_check_and_the_estimate_counts_2_bytes(
    tmp_path, tiny_model_dir, monkeypatch
):
    """training.bf16_base_weights (docs/PROTOCOL.md step 5): the check runs after the accumulation and precision checks
    (which compute in fp32 without autocast, on the fp32 weights) and before the update check; the step memory estimate
    counts frozen elements at 2 bytes; every later check, the smoke steps and the fresh-process reload see the base in
    bf16."""
    import tuneproof.models.device as device
    from tuneproof.training.speedups import BF16_BASE_GRAD_COSINE, BF16_BASE_GRAD_REL_L2, BF16_BASE_LOSS_RTOL

    monkeypatch.setattr(
        device, "_cpu_bf16_native", lambda: True
    )  # as on an AVX512-BF16 CPU; the fresh-process reload takes this choice from its parent (preflight/reload.py)
    study = make_study(tmp_path / "s", tiny_model_dir, training__precision="bf16", training__bf16_base_weights=True)
    rid = run_preflight(StudyContext.open(study))  # every check passes (a failed one raises CheckFailed)
    checks = checks_of(study, rid)
    names = list(checks)
    # accumulation and precision compute in fp32 without autocast: on the fp32 weights, just before the cast
    assert names.index("gradient accumulation") < names.index("precision") < names.index("bf16 base weights")
    assert names.index("bf16 base weights") == names.index("update check") - 1
    assert all(c["passed"] for c in checks.values()), [n for n, c in checks.items() if not c["passed"]]
    chk = checks["bf16 base weights"]
    assert chk["passed"] is True, chk["message"]
    n = chk["numbers"]
    assert n["loss_rel_diff"] <= BF16_BASE_LOSS_RTOL and n["grad_rel_l2"] <= BF16_BASE_GRAD_REL_L2
    assert n["grad_cosine"] >= BF16_BASE_GRAD_COSINE and n["tensors"] == 8
    for name in ("update check", "step memory", "configured combination", "smoke pass", "activation checkpointing"):
        assert checks[name]["passed"] is True, (name, checks[name]["message"])
    est = checks["step memory"]["details"]["rows"][0]["estimate"]
    frozen = est["parameters"] - est["trainable_parameters"]
    assert est["weights_bytes"] == 2 * frozen + 4 * est["trainable_parameters"]
    assert est["autocast_weight_copies_bytes"] == 0 and "2 bytes per frozen element" in est["weights_note"]
    assert checks["smoke pass"]["numbers"]["identical_after_reload"] == checks["smoke pass"]["numbers"]["eval_examples"]


def test_chunked_loss_check_listed_after_packing_and_passes_on_the_tiny_llama(tmp_path, tiny_model_dir):
    """training.chunked_loss has its own preflight row (it only failed inside 'configured combination'
    as 'error: CheckFailed: ...' before): listed after the packing check, the loop's own check."""
    from tuneproof.training.loss import CHUNKED_GRAD_RTOL, CHUNKED_LOSS_RTOL

    study = make_study(tmp_path / "s", tiny_model_dir, training__packing=True, training__chunked_loss=True)
    rid = run_preflight(StudyContext.open(study))
    checks = checks_of(study, rid)
    names = list(checks)
    assert names.index("chunked loss") == names.index("packing") + 1 == names.index("eval batch size") + 2
    chk = checks["chunked loss"]
    trainable = checks["update check"]["numbers"]["trainable_tensors"]
    assert chk["passed"] is True and chk["numbers"]["tensors"] == trainable > 0
    assert (
        chk["numbers"]["loss_rel_diff"] <= CHUNKED_LOSS_RTOL
        and chk["numbers"]["grad_max_rel_diff"] <= CHUNKED_GRAD_RTOL
    )


def test_chunked_loss_check_fails_on_a_classification_head_naming_the_key():
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from tuneproof.data.preprocess import Encoded
    from tuneproof.preflight.chunked_loss import check_study_chunked_loss
    from tuneproof.study import Training

    torch.manual_seed(0)
    model = BertForSequenceClassification(
        BertConfig(
            vocab_size=40,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=32,
            num_labels=3,
        )
    )
    examples = [
        Encoded(
            id=f"ex{i}",
            category=None,
            input_ids=[1, 5 + i, 7, 2],
            labels=[],
            prompt_tokens=4,
            answer_tokens=0,
            full_length=4,
            n_supervised=0,
            truncated=False,
            text="",
            boundary_char=0,
            class_index=i % 3,
        )
        for i in range(4)
    ]
    chk = check_study_chunked_loss(model, examples, Training(micro_batch_size=4, max_length=16, chunked_loss=True), 0)
    assert chk["name"] == "chunked loss" and chk["passed"] is False
    assert chk["message"] == (
        "training.chunked_loss: the chunked loss applies to causal LMs (token labels), not to a classification head; "
        "set it to false"
    )


def test_speedups_auto_runs_the_checks_of_what_it_turns_on_and_its_list_keeps_the_preflight(tmp_path, tiny_model_dir):
    """training.speedups: auto on the CPU: the chunked loss checked and used (its row in the table), length
    grouping, packing, bf16 frozen weights and compile off with their reasons; the list it resolved to is the
    same configuration for the gate of train, another list is not."""
    study = make_study(tmp_path / "s", tiny_model_dir, training__speedups="auto")
    rid = run_preflight(StudyContext.open(study))
    checks = checks_of(study, rid)
    auto = Registry(study).get(rid).summary["speedups_auto"]
    assert auto["used"] == ["chunked_loss"]
    assert checks["speedups auto"]["passed"] is True and "packing off: pays only" in checks["speedups auto"]["message"]
    assert "length_grouping off: would lower the padding" in checks["speedups auto"]["message"]
    assert checks["chunked loss"]["passed"] is True  # the check of what auto turned on ran like an explicit key's
    assert "compile" not in checks and "packing" not in checks
    assert json.loads((study / "runs" / rid / "config.json").read_text())["training"]["speedups"] == "auto"
    cfg = StudyContext.open(study).config
    assert require_preflight(StudyContext.open(study), None) == rid  # auto again: the same resolution
    listed = {**cfg["training"], "speedups": ["chunked_loss"], "chunked_loss": True}
    assert require_preflight(StudyContext.open(study, config={**cfg, "training": listed}), None) == rid
    other = {**listed, "speedups": ["chunked_loss", "length_grouping"], "length_grouping": True}
    assert (
        "training.length_grouping: false -> true"
        in matching_preflight(StudyContext.open(study, config={**cfg, "training": other}))[1]
    )
