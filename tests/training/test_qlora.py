"""QLoRA (docs/PROTOCOL.md step 4): ``method.kind: qlora`` loads the base in 4-bit NF4 through transformers'
``BitsAndBytesConfig`` and trains LoRA on it; the preflight checks a float quant storage when
sharding and that the loss and LoRA gradient norm of one real step are finite and non-zero.

The rules are pure functions tested on measured values (always run). The tests on a real 4-bit
model run where bitsandbytes' 4-bit layers work: on CUDA, and on the CPU with bitsandbytes 0.50.2
(its default torch kernels; checked by :func:`_bnb_4bit_works`); elsewhere they skip with the reason.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import yaml

from tiny_study import make_study, prepare_study
from tuneproof.context import parse_study
from tuneproof.errors import TuneproofError
from tuneproof.modalities.text import CAUSAL_LM
from tuneproof.models import quant
from tuneproof.preflight.qlora import check_quant_storage, check_step_values, measure_step


def _bnb_4bit_works() -> str | None:
    """None when a bitsandbytes Linear4bit (NF4) runs forward and backward here, else why not."""
    if not quant.bitsandbytes_installed():
        return "bitsandbytes is not installed (pip install 'tuneproof[qlora]')"
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    err = quant._probe_4bit(dev)
    return None if err is None else f"bitsandbytes 4-bit does not run on {dev}: {err}"


NO_4BIT = _bnb_4bit_works()
needs_4bit = pytest.mark.skipif(NO_4BIT is not None, reason=NO_4BIT or "")


@pytest.fixture(scope="module")
def qbase(tiny_base, tmp_path_factory):
    """The tiny Llama (same tokenizer) at hidden 64: layer sizes multiples of bitsandbytes' 4-bit block, as in
    real models (bitsandbytes 0.50.2's CPU inference repacking, which tuneproof turns off, even fails on
    in_features 32: "shape '[32, 0]' is invalid")."""
    from tiny_study import build_wide_base

    return build_wide_base(tmp_path_factory.mktemp("qlora-llama"), tiny_base)


# --------------------------------------------------------------------------- pure rules (always run)
def test_step_values_loss_zero_and_nan_grad_fail_naming_both():
    c = check_step_values(0.0, float("nan"))
    assert c["passed"] is False
    assert c["numbers"]["loss"] == 0.0 and math.isnan(c["numbers"]["grad_norm"])
    assert "loss 0.0 is zero" in c["message"]
    assert "LoRA gradient norm nan is not finite" in c["message"]


def test_step_values_each_fault_alone():
    c = check_step_values(float("inf"), 0.8)
    assert (
        not c["passed"]
        and "loss inf is not finite" in c["message"]
        and "gradient norm" not in c["message"].split("(")[0]
    )
    c = check_step_values(2.5, 0.0)
    assert not c["passed"] and "LoRA gradient norm 0.0 is zero" in c["message"] and "loss 2.5" not in c["message"]


def test_step_values_finite_non_zero_pass():
    c = check_step_values(5.7038, 0.0123)
    assert c["passed"] is True
    assert c["numbers"] == {"loss": 5.7038, "grad_norm": 0.0123}
    assert "loss 5.7038, LoRA gradient norm 0.0123" in c["message"]


def test_quant_storage_int8_under_fsdp_fails_naming_the_key():
    c = check_quant_storage("int8", "bf16", sharded=True)
    assert c["passed"] is False
    assert c["message"].startswith("method.bnb_4bit_quant_storage is int8: FSDP shards only float tensors")
    assert "set method.bnb_4bit_quant_storage: bfloat16" in c["message"]
    assert check_quant_storage("uint8", "bfloat16", sharded=True)["passed"] is False


def test_quant_storage_float_matching_compute_passes_and_a_mismatch_fails():
    assert check_quant_storage("bfloat16", "bf16", sharded=True)["passed"] is True
    assert check_quant_storage("bf16", "bfloat16", sharded=True)["numbers"] == {
        "quant_storage": "bfloat16",
        "compute_dtype": "bfloat16",
        "sharded": True,
    }
    c = check_quant_storage("float16", "bf16", sharded=True)
    assert c["passed"] is False and "is float16 but the compute dtype is bfloat16" in c["message"]
    # not sharded: any storage is fine (uint8 is bitsandbytes' default)
    assert check_quant_storage("uint8", "fp32", sharded=False)["passed"] is True


def test_measure_step_on_a_plain_model_reads_loss_and_grad_norm():
    """measure_step's numbers are the loss and the L2 norm of the trainable gradients, and it leaves no gradient."""
    from tinymodels import make_llama

    model = make_llama(50, seed=1)
    for n, p in model.named_parameters():
        p.requires_grad_(n == "lm_head.weight")
    ids = torch.tensor([[3, 7, 9, 11, 4, 2]])
    labels = torch.tensor([[-100, -100, 9, 11, 4, 2]])
    m = measure_step(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels})
    logits = model(input_ids=ids).logits[0, 1:5]
    want = torch.nn.functional.cross_entropy(logits, labels[0, 2:6])
    model.lm_head.weight.grad = None
    want.backward()
    assert m["loss"] == pytest.approx(float(want), rel=1e-6)
    assert m["grad_norm"] == pytest.approx(float(model.lm_head.weight.grad.norm()), rel=1e-5)
    assert (m["trainable_tensors"], m["tensors_with_grad"]) == (1, 1)


# --------------------------------------------------------------------------- the study file
def _raw(base, **method):
    from tiny_study import study_config

    raw = study_config(base)
    raw["method"] = {**raw["method"], **method}
    return raw


def test_qlora_keys_default_and_record(tiny_base, monkeypatch):
    monkeypatch.setattr(
        quant, "bitsandbytes_installed", lambda: True
    )  # the study file rules, whether or not it is installed here
    study = parse_study(_raw(tiny_base, kind="qlora"), "s/tuneproof.yaml")
    m = study.method
    assert (m.bnb_4bit_quant_type, m.bnb_4bit_use_double_quant, m.bnb_4bit_quant_storage) == ("nf4", True, "uint8")
    rec = quant.quantization_record(m, "bf16")
    assert {
        k: rec[k]
        for k in (
            "load_in_4bit",
            "bnb_4bit_quant_type",
            "bnb_4bit_use_double_quant",
            "bnb_4bit_compute_dtype",
            "bnb_4bit_quant_storage",
        )
    } == {
        "load_in_4bit": True,
        "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_use_double_quant": True,
        "bnb_4bit_compute_dtype": "bfloat16",
        "bnb_4bit_quant_storage": "uint8",
    }
    assert quant.quantization_record(m, "fp32")["bnb_4bit_compute_dtype"] == "float32"
    assert rec["llm_int8_skip_modules"] is None  # transformers' default: the output embedding stays unquantized
    head = m.model_copy(update={"modules_to_save": ["classifier"]})
    assert quant.quantization_record(head, "bf16")["llm_int8_skip_modules"] == ["classifier", "lm_head"]


def test_quant_key_without_qlora_is_refused(tiny_base):
    with pytest.raises(TuneproofError) as err:
        parse_study(_raw(tiny_base, kind="lora", bnb_4bit_quant_storage="bfloat16"), "s/tuneproof.yaml")
    assert str(err.value).splitlines()[0] == (
        "s/tuneproof.yaml: method: method.bnb_4bit_quant_storage applies to method.kind: qlora "
        "only (kind is 'lora'); remove it or set method.kind: qlora"
    )


def test_qlora_with_the_vllm_backend_is_refused(tiny_base, monkeypatch):
    monkeypatch.setattr(quant, "bitsandbytes_installed", lambda: True)
    raw = _raw(tiny_base, kind="qlora")
    raw["eval"]["backend"] = "vllm"
    with pytest.raises(TuneproofError) as err:
        parse_study(raw, "s/tuneproof.yaml")
    assert str(err.value).splitlines()[0] == (
        "s/tuneproof.yaml: <root>: eval.backend vllm with method.kind qlora: vLLM would serve "
        "the adapter on the unquantized base, not the 4-bit base it was trained on (not checked "
        "yet); set eval.backend: transformers"
    )


def test_qlora_without_bitsandbytes_is_a_two_line_error(tiny_base, monkeypatch):
    monkeypatch.setattr(quant, "bitsandbytes_installed", lambda: False)
    with pytest.raises(TuneproofError) as err:
        parse_study(_raw(tiny_base, kind="qlora"), "s/tuneproof.yaml")
    lines = str(err.value).splitlines()
    assert len(lines) == 2
    assert (
        lines[0]
        == "s/tuneproof.yaml: method.kind: qlora loads the base in 4-bit with bitsandbytes, which is not installed"
    )
    assert (
        lines[1] == "  -> python -m pip install -e '.[qlora]' in the tuneproof clone (tuneproof is not on PyPI): "
        "installs bitsandbytes==0.50.2"
    )


def test_qlora_without_bitsandbytes_cli_exit_2(tiny_base, tmp_path, monkeypatch, capsys):
    from tuneproof.cli import main

    study = make_study(tmp_path / "s", tiny_base, prepare=False)
    raw = yaml.safe_load((study / "tuneproof.yaml").read_text())
    raw["method"]["kind"] = "qlora"
    (study / "tuneproof.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.setattr(quant, "bitsandbytes_installed", lambda: False)
    with pytest.raises(SystemExit) as code:
        main(["data", "check", "--study", str(study)])
    assert code.value.code == 2
    out = capsys.readouterr()
    err = out.out + out.err
    assert "method.kind: qlora loads the base in 4-bit with bitsandbytes, which is not installed" in err
    assert "pip install -e '.[qlora]'" in err
    assert "Traceback" not in err
    assert not (study / "runs").exists() or not any((study / "runs").iterdir())


def test_a_device_where_4bit_does_not_run_is_a_two_line_error(tiny_base, monkeypatch):
    """Where bitsandbytes' 4-bit layers do not run (no CUDA and no working CPU kernels), loading refuses
    before transformers does, naming method.kind: qlora and the CUDA device it needs."""
    from tuneproof.models.base import BaseModelRef, load_model

    monkeypatch.setattr(quant, "bitsandbytes_installed", lambda: True)
    monkeypatch.setattr(quant, "bitsandbytes_version", lambda: "0.50.2")
    monkeypatch.setattr(
        quant, "_probe_4bit", lambda device: "RuntimeError: no kernel for bitsandbytes::quantize_4bit on cpu"
    )
    rec = {
        "quant_method": "bitsandbytes",
        "load_in_4bit": True,
        "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_use_double_quant": True,
        "bnb_4bit_compute_dtype": "float32",
        "bnb_4bit_quant_storage": "uint8",
        "llm_int8_skip_modules": None,
    }
    with pytest.raises(TuneproofError) as err:
        load_model(BaseModelRef("tiny", tiny_base, "local", "causal-lm", "local"), CAUSAL_LM, quantization=rec)
    lines = str(err.value).splitlines()
    assert len(lines) == 2
    assert lines[0] == (
        "method.kind: qlora: bitsandbytes 0.50.2 cannot run 4-bit layers on "
        + ("cuda" if torch.cuda.is_available() else "cpu")
        + " (RuntimeError: no kernel for bitsandbytes::quantize_4bit on cpu)"
    )
    assert lines[1].startswith("  -> QLoRA needs a CUDA device here")


# --------------------------------------------------------------------------- a real 4-bit base
def _qlora_model(tiny_base, compute="fp32"):
    from types import SimpleNamespace

    from tuneproof.models.base import BaseModelRef, load_model
    from tuneproof.models.method import apply_method

    method = SimpleNamespace(
        kind="qlora",
        r=4,
        alpha=8,
        dropout=0.0,
        target_modules=["q_proj", "v_proj"],
        modules_to_save=[],
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_quant_storage="uint8",
    )
    ref = BaseModelRef("tiny", tiny_base, "local", "causal-lm", "local")
    rec = quant.quantization_record(method, compute)
    model = load_model(ref, CAUSAL_LM, quantization=rec)
    return apply_method(model, method, CAUSAL_LM, quantization=rec)


def _batch(tiny_base):
    from tuneproof.models.base import BaseModelRef, load_tokenizer

    tok = load_tokenizer(BaseModelRef("tiny", tiny_base, "local", "causal-lm", "local"))
    ids = torch.tensor([tok("alpha beta gamma sun moon <|end|>")["input_ids"]])
    labels = ids.clone()
    labels[0, :3] = -100
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


@needs_4bit
def test_qlora_loads_4bit_nf4_and_trains_only_lora(qbase):
    model, report = _qlora_model(qbase)
    q = report["quantized"]
    # 2 decoder layers x 7 linear layers (q, k, v, o, gate, up, down) in 4-bit; lm_head stays unquantized
    assert q["linear4bit"] == 14
    assert q["quant_types"] == ["nf4"] and q["storage_dtypes"] == ["uint8"]
    # LoRA r=4 on q_proj (64 -> 64: 4*64 + 64*4) and v_proj (64 -> 64) in 2 layers
    assert report["trainable"] == 2 * 2 * (4 * 64 + 64 * 4) == 2048
    assert report["quantization"]["bnb_4bit_compute_dtype"] == "float32"
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)


@needs_4bit
def test_qlora_one_step_is_finite_non_zero_and_differs_from_full_precision(qbase):
    from tuneproof.models.base import BaseModelRef, load_model
    from tuneproof.preflight.update_check import batch_loss

    model, _ = _qlora_model(qbase)
    batch = _batch(qbase)
    m = measure_step(model, batch)
    verdict = check_step_values(m["loss"], m["grad_norm"])
    assert verdict["passed"], verdict["message"]
    vocab = model.config.vocab_size
    assert abs(m["loss"] - math.log(vocab)) < 0.1  # a random base predicts near-uniformly: ln V nats
    assert m["grad_norm"] > 0 and m["tensors_with_grad"] == 8  # 2 layers x 2 targets x (A, B)
    full = load_model(BaseModelRef("tiny", qbase, "local", "causal-lm", "local"), CAUSAL_LM)
    with torch.no_grad():
        plain = float(batch_loss(full, batch))
    assert 0 < abs(m["loss"] - plain) < 0.05  # 4-bit weights: close to, not equal to, the fp32 base
    assert all(p.grad is None for p in model.parameters())  # measured without leaving gradients


@needs_4bit
def test_an_evaluation_does_not_change_the_next_training_step(qbase):
    """bitsandbytes 0.50.2 on an AVX512-BF16 CPU repacks a 4-bit layer in place at its first eval-mode,
    no-grad forward and then runs it through a kernel without autograd: the next training step got no
    gradient through the 4-bit layers (0 of 8 LoRA tensors changed in 2 steps of the training loop) and
    another loss. tuneproof loads with that repacking off (quant.keep_training_kernels): the step after a
    generation is bit for bit the step before it. (On a CPU without AVX512-BF16 the repacking never
    happens and this holds either way.)"""
    model, report = _qlora_model(qbase)
    assert report["quantized"]["cpu_inference_repacking"] is False
    batch = _batch(qbase)
    before = measure_step(model, batch)
    model.eval()
    with torch.no_grad():
        model.generate(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=3, do_sample=False
        )
    model.train()
    after = measure_step(model, batch)
    assert after["loss"] == before["loss"] and after["grad_norm"] == before["grad_norm"]
    assert after["tensors_with_grad"] == 8 and after["grad_norm"] > 0


@needs_4bit
def test_qlora_run_records_quantization_trains_and_reloads(qbase, tmp_path):
    """A qlora study end to end on the tiny Llama: train records the quant config (summary, base.json,
    method.json), eval reloads base (4-bit) + adapter, export binds the adapter to the unquantized base
    + the config and refuses --merge."""
    from tuneproof.context import StudyContext
    from tuneproof.recipes.evaluate import run_eval
    from tuneproof.recipes.export import run_export
    from tuneproof.recipes.train import TrainOptions, run_train

    study = make_study(tmp_path / "s", qbase, prepare=False, max_steps=3, checkpoint_every=3)
    raw = yaml.safe_load((study / "tuneproof.yaml").read_text())
    raw["method"].update(kind="qlora", dropout=0.0)
    (study / "tuneproof.yaml").write_text(yaml.safe_dump(raw))
    prepare_study(study)
    ctx = StudyContext.open(study)
    try:
        rid = run_train(ctx, TrainOptions(preflight_override="test: qlora without preflight"))
        rec = ctx.registry.get(rid)
        assert rec.status == "completed"
        q = rec.summary["quantization"]
        assert (q["load_in_4bit"], q["bnb_4bit_quant_type"], q["bnb_4bit_compute_dtype"]) == (True, "nf4", "float32")
        assert rec.summary["base"]["quantization"] == q
        run_dir = study / "runs" / rid
        base = json.loads((run_dir / "base.json").read_text())
        assert base["quantization"] == q and base["weights_sha256"]  # the unquantized files' hash + the 4-bit config
        method = json.loads((run_dir / "method.json").read_text())
        assert method["quantized"]["linear4bit"] == 14 and method["quantization"] == q
        losses = [
            r["loss"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "loss" in r
        ]
        assert len(losses) == 3 and all(math.isfinite(x) and x > 0 for x in losses)
        eid = run_eval(ctx, rid)
        assert ctx.registry.get(eid).status == "completed"
        # export: the adapter bound to the unquantized base + the recorded 4-bit config, verified in a fresh process
        with pytest.raises(TuneproofError, match="--merge: run .* is QLoRA"):
            run_export(ctx, rid, merge=True)
        assert not (study / "exports").exists()
        xid = run_export(ctx, rid)
        assert ctx.registry.get(xid).summary["verified"] is True
        bundle = study / "exports" / rid
        man = json.loads((bundle / "manifest.json").read_text())
        assert man["quantization"] == q
        assert man["base_model"]["weights_sha256"] == base["weights_sha256"]  # the unquantized files
        card = (bundle / "README.md").read_text()
        assert "quantization_config=bnb" in card and 'bnb_4bit_quant_type="nf4"' in card
        assert "The hashes above are those of the unquantized files" in card
    finally:
        ctx.registry.close()


def _qlora_study(tmp_path, tiny_base, monkeypatch, **method):
    monkeypatch.setattr(quant, "bitsandbytes_installed", lambda: True)  # the launch rule needs no 4-bit layer
    monkeypatch.setattr("tuneproof.recipes.torchrun.devices_present", lambda: ("cpu", 8))  # 2 processes fit anywhere
    study = make_study(tmp_path / "s", tiny_base, prepare=False)
    raw = yaml.safe_load((study / "tuneproof.yaml").read_text())
    raw["method"].update(kind="qlora", **method)
    raw["distributed"] = {"strategy": "fsdp"}
    (study / "tuneproof.yaml").write_text(yaml.safe_dump(raw))
    return study


def test_fsdp_launch_refuses_uint8_quant_storage(tiny_base, tmp_path, monkeypatch):
    from tuneproof.context import StudyContext
    from tuneproof.recipes.torchrun import check_launch

    ctx = StudyContext.open(_qlora_study(tmp_path, tiny_base, monkeypatch))
    try:
        with pytest.raises(TuneproofError) as err:
            check_launch(ctx, 2)
        first = str(err.value).splitlines()[0]
        assert first.endswith(
            "tuneproof.yaml: method.bnb_4bit_quant_storage is uint8: FSDP shards only float tensors, so the 4-bit "
            "base cannot be sharded; set method.bnb_4bit_quant_storage: float32 (the compute dtype)"
        )
    finally:
        ctx.registry.close()


def test_fsdp_launch_accepts_a_float_storage_equal_to_the_compute_dtype(tiny_base, tmp_path, monkeypatch):
    from tuneproof.context import StudyContext
    from tuneproof.recipes.torchrun import check_launch

    ctx = StudyContext.open(
        _qlora_study(tmp_path, tiny_base, monkeypatch, bnb_4bit_quant_storage="float32")
    )  # precision fp32
    try:
        layout = check_launch(ctx, 2)
        assert (layout["world_size"], layout["strategy"], layout["fsdp_units"]) == (2, "fsdp", ["LlamaDecoderLayer"])
    finally:
        ctx.registry.close()


@needs_4bit
def test_preflight_of_a_qlora_study_runs_the_qlora_checks(qbase, tmp_path):
    from tuneproof.context import StudyContext
    from tuneproof.recipes.preflight import PREFLIGHT_FILE, run_preflight

    study = make_study(tmp_path / "s", qbase, prepare=False, max_steps=3)
    raw = yaml.safe_load((study / "tuneproof.yaml").read_text())
    raw["method"].update(kind="qlora", dropout=0.0)
    (study / "tuneproof.yaml").write_text(yaml.safe_dump(raw))
    ctx = StudyContext.open(study)
    try:
        pid = run_preflight(ctx)
        report = json.loads((study / "runs" / pid / PREFLIGHT_FILE).read_text())
    finally:
        ctx.registry.close()
    checks = {c["name"]: c for c in report["checks"]}
    assert report["passed"] is True, [(c["name"], c["message"]) for c in report["checks"] if c["passed"] is False]
    st = checks["qlora storage"]
    assert st["passed"] is True and st["numbers"] == {
        "quant_storage": "uint8",
        "compute_dtype": "float32",
        "sharded": False,
    }
    assert "distributed.strategy fsdp" not in (st.get("warning") or "")
    step = checks["qlora step"]
    assert step["passed"] is True and step["numbers"]["tensors_with_grad"] == 8
    assert math.isfinite(step["numbers"]["loss"]) and step["numbers"]["loss"] > 0 and step["numbers"]["grad_norm"] > 0
    assert checks["update check"]["passed"] is True and checks["smoke pass"]["passed"] is True


def test_preflight_backend_fails_where_4bit_does_not_run(tiny_base, tmp_path, monkeypatch):
    from tuneproof.context import StudyContext
    from tuneproof.preflight.backend import check_backend

    study = _qlora_study(tmp_path, tiny_base, monkeypatch)
    monkeypatch.setattr(
        "tuneproof.preflight.backend.inspect_extension",
        lambda name: {"name": name, "installed": True, "version": "0.50.2", "built_for": [], "evidence": []},
    )
    monkeypatch.setattr("tuneproof.preflight.backend._try_import", lambda module: None)
    monkeypatch.setattr(quant, "_probe_4bit", lambda device: "RuntimeError: no 4-bit kernel")
    ctx = StudyContext.open(study)
    try:
        check, _ = check_backend(ctx)
    finally:
        ctx.registry.close()
    assert check["passed"] is False
    assert check["numbers"]["extensions"] == ["bitsandbytes"]
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    assert (
        f"cannot run 4-bit layers on {dev} (RuntimeError: no 4-bit kernel) -> QLoRA needs a CUDA device here"
        in check["message"]
    )


@needs_4bit
def test_step_memory_estimate_counts_the_4bit_base_as_stored(qbase):
    """The preflight's estimate counts a 4-bit linear weight at half a byte (uint8 storage holds two
    values), not at 4 bytes per stored element: SmolLM2-135M's 4-bit base read 312.4 MiB estimated
    for about 160 MiB held (81.9 M stored elements x 4 bytes)."""
    import bitsandbytes as bnb

    from tuneproof.preflight.memory import estimate_step_memory
    from tuneproof.preflight.step_memory import step_memory_estimate

    model, _ = _qlora_model(qbase)
    linears = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(linears) == 14
    four_bit_values = sum(m.in_features * m.out_features for m in linears)
    est = estimate_step_memory(model, 1, 16, "fp32", "adamw", trainable_dtype="fp32")
    assert est["packed_bytes"] == four_bit_values // 2  # two 4-bit values per uint8 byte
    assert est["packed_parameters"] == four_bit_values // 2
    others = sum(p.numel() for p in model.parameters() if not p.requires_grad) - est["packed_parameters"]
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert est["weights_bytes"] == others * 4 + four_bit_values // 2 + trainable * 4
    assert est["autocast_weight_copies_bytes"] == 0
    # the preflight's wrapper (frozen weights stored in fp32 under bf16 autocast) adds 2 bytes to the
    # float frozen elements only: the packed base is not stored in fp32
    mixed = step_memory_estimate(model, 1, 16, "bf16", False, None)
    assert mixed["weights_bytes"] == others * 4 + four_bit_values // 2 + trainable * 4


@needs_4bit
def test_trainable_summary_counts_the_4bit_weights_not_their_storage(qbase):
    """'trainable N of TOTAL parameters' counts a 4-bit weight's values, as for the full-precision model
    (SmolLM2-135M + QLoRA read 'of 81,891,648' for 134,975,808: two values per uint8 element)."""
    from tuneproof.models.base import BaseModelRef, load_model
    from tuneproof.models.targets import trainable_summary

    model, report = _qlora_model(qbase)
    full = load_model(BaseModelRef("tiny", qbase, "local", "causal-lm", "local"), CAUSAL_LM)
    base_total = sum(p.numel() for p in full.parameters())
    s = trainable_summary(model)
    assert s["trainable"] == report["trainable"] == 2048
    assert s["total"] == base_total + 2048  # the base's own elements + LoRA's
    assert report["total"] == base_total + 2048


def test_quant_key_at_its_default_in_a_lora_study_file_is_refused(tiny_base, tmp_path):
    """``bnb_4bit_use_double_quant: true`` (the default) under ``method.kind: lora`` passed silently: the
    study file's own keys are checked; a LoRA run's resolved config (every key recorded) still parses."""
    from tuneproof.context import load_study
    from tuneproof.study import resolved_config

    raw = _raw(tiny_base, kind="lora", bnb_4bit_use_double_quant=True)
    (tmp_path / "tuneproof.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(TuneproofError) as err:
        load_study(tmp_path)
    assert str(err.value).splitlines()[0] == (
        f"{tmp_path / 'tuneproof.yaml'}: method: method.bnb_4bit_use_double_quant applies to "
        "method.kind: qlora only (kind is 'lora'); remove it or set method.kind: qlora"
    )
    del raw["method"]["bnb_4bit_use_double_quant"]
    (tmp_path / "tuneproof.yaml").write_text(yaml.safe_dump(raw))
    recorded = resolved_config(load_study(tmp_path))
    assert recorded["method"]["bnb_4bit_use_double_quant"] is True  # recorded with every default
    assert parse_study(recorded, "runs/r0004/config.json").method.kind == "lora"
