"""``training.speedups: auto`` (docs/speedups.md): each applicable speed-up tried with its own check on
real micro-batches, used when the check passes, left off with a one-line reason otherwise; the list it
resolved to keeps a preflight valid; ``training.compile`` checked like the others."""

from __future__ import annotations

import contextlib

import pytest
import torch

from tiny_study import LoopRun
from tuneproof.data.preprocess import Encoded
from tuneproof.preflight.scope import preflight_changes
from tuneproof.study import Study, Training
from tuneproof.training.loop import _micro_loss
from tuneproof.training.speedups import check_length_grouping, resolve_auto, static_rules


def _dataset(n: int = 24, vocab: int = 64) -> list[Encoded]:
    """Examples of 4 to 16 tokens, the second half of each supervised."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        length = 4 + (i * 7) % 13
        ids = torch.randint(3, vocab, (length,), generator=g).tolist()
        half = length // 2
        out.append(
            Encoded(
                id=f"ex{i}",
                category=None,
                input_ids=ids,
                labels=[-100] * half + ids[half:],
                prompt_tokens=half,
                answer_tokens=length - half,
                full_length=length,
                n_supervised=length - half,
                truncated=False,
                text="",
                boundary_char=0,
            )
        )
    return out


def _lora(seed: int = 0, layers: int = 2):
    from peft import LoraConfig, get_peft_model

    from tinymodels import make_llama

    return get_peft_model(
        make_llama(64, seed=seed, layers=layers),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0),
    )


def _loss(m, b):
    return _micro_loss(m, b, contextlib.nullcontext)


# ---------------------------------------------------------------- the study keys
def test_speedups_list_sets_the_keys_and_contradictions_are_refused():
    t = Training(speedups=["chunked_loss", "length_grouping"])
    assert (t.chunked_loss, t.length_grouping, t.packing, t.compile) == (True, True, False, False)
    assert Training(**t.model_dump()).speedups == ["chunked_loss", "length_grouping"]  # a resolved config reads back
    with pytest.raises(ValueError, match=r"training.packing: true and training.speedups: auto"):
        Training(speedups="auto", packing=True)
    with pytest.raises(ValueError, match=r"training.compile: true and training.speedups"):
        Training(speedups=["chunked_loss"], compile=True)
    with pytest.raises(ValueError, match="speedups"):
        Training(speedups=["flash"])
    assert Training(speedups="auto", packing_length=256, max_length=128).packing is False  # applies if auto packs


def test_auto_to_its_resolved_list_keeps_the_preflight_and_another_list_does_not():
    base = {"hypothesis": {"task": "extraction", "primary": {"metric": "field_f1"}}, "data": {"source": "x.jsonl"}}

    def config(speedups):
        raw = {**base, "model": {"base": "m"}, "training": {"speedups": speedups}}
        try:
            return Study.model_validate(raw).model_dump(mode="json")
        except Exception:  # noqa: BLE001 - the study's required sections differ: build the section alone
            return {"training": Training(speedups=speedups).model_dump(mode="json")}

    auto, same = config("auto"), config(["length_grouping", "chunked_loss"])
    used = ["chunked_loss", "length_grouping"]
    assert preflight_changes(auto, same, used) == []
    other = preflight_changes(auto, config(["chunked_loss"]), used)
    assert {c["key"] for c in other} == {"training.speedups", "training.length_grouping"}
    assert preflight_changes(auto, same, None) != []  # a preflight that recorded no resolution stands for none
    assert {c["key"] for c in preflight_changes(same, auto, used)} >= {"training.speedups"}  # list -> auto: invalid


# ---------------------------------------------------------------- the checks auto runs
def test_length_grouping_check_passes_and_a_leaking_mask_fails_it():
    model, data = _lora(), _dataset()
    batch = [data[i] for i in (0, 1, 2, 3)]  # 4, 11, 5, 12 tokens: 32 of 48 positions are tokens
    rep = check_length_grouping(model, batch, 2, "cpu", _loss)
    assert rep["passed"] is True and rep["padding"] == pytest.approx(1 - 32 / 48, abs=1e-6)
    assert rep["loss_rel_diff"] < 1e-5 and rep["grad_max_rel_diff"] < 1e-4 and rep["tensors"] == 8
    assert all(p.grad is None for p in model.parameters())

    def leaking(m, b):  # left padding left unmasked: the examples attend to their padding
        mask = b["attention_mask"]
        shift = [int((row == 0).sum()) for row in mask]
        rolled = {k: torch.stack([r.roll(n) for r, n in zip(b[k], shift)]) for k in ("input_ids", "labels")}
        return _micro_loss(m, {**rolled, "attention_mask": torch.ones_like(mask)}, contextlib.nullcontext)

    bad = check_length_grouping(model, batch, 2, "cpu", leaking)
    assert bad["passed"] is False and bad["loss_rel_diff"] > 1e-3
    assert "leave training.length_grouping off" in bad["message"]


def test_auto_on_cpu_uses_the_chunked_loss_and_says_why_the_rest_stay_off():
    """Length grouping is not turned on by auto: it changes which examples share a step (the quickstart's field F1
    moved 0.355 -> 0.271 with it, README); its reason says what padding it would save."""
    rules = static_rules(
        device_type="cpu",
        bf16_base=(False, "bf16 is not native here"),
        attention="sdpa",
        method_kind="lora",
        token_labels=True,
    )
    cfg = Training(speedups="auto", micro_batch_size=4, max_length=32)
    resolved, rec = resolve_auto(
        _lora(), _dataset(), cfg, pad_id=2, device="cpu", loss_fn=_loss, fp32_loss_fn=_loss, rules=rules
    )
    assert rec["used"] == ["chunked_loss"]
    assert (resolved.length_grouping, resolved.chunked_loss, resolved.packing, resolved.compile) == (
        False,
        True,
        False,
        False,
    )
    assert resolved.speedups == ["chunked_loss"] and cfg.chunked_loss is False  # cfg untouched
    d = rec["decisions"]
    assert "varlen (flash) attention on a GPU" in d["packing"]["reason"]
    assert "together with the chunked loss" in d["bf16_base_weights"]["reason"]  # a causal LM keeps the chunked loss
    assert "not tried on a CPU" in d["compile"]["reason"]
    assert d["length_grouping"]["used"] is False
    assert d["length_grouping"]["reason"].startswith("would lower the padding 26.9% -> 7.1% but changes which examples")
    assert "check passed" in d["chunked_loss"]["reason"]


def test_listed_length_grouping_is_checked_in_the_loop_and_a_failing_check_stops_the_run(tmp_path):
    from tuneproof.errors import CheckFailed
    from tuneproof.training.loop import train

    model, data = _lora(), _dataset()
    cfg = Training(speedups=["length_grouping"], micro_batch_size=4, max_steps=1, max_length=32)

    run = LoopRun(tmp_path)
    train(model, data, cfg, pad_id=2, device=torch.device("cpu"), autocast=contextlib.nullcontext, run=run)
    proof = run.summary["speedups"]["length_grouping"]
    assert proof["loss_rel_diff"] < 1e-5 and proof["grad_max_rel_diff"] < 1e-4 and proof["tensors"] == 8
    assert proof["padding_after"] < proof["padding_before"]

    base = model.get_base_model()
    original = base.forward

    def batch_mean(*a, **k):  # a model whose logits depend on the other rows of the micro-batch
        out = original(*a, **k)
        out.logits = out.logits + out.logits.mean(dim=0, keepdim=True)
        return out

    base.forward = batch_mean
    with pytest.raises(
        CheckFailed, match=r"^training.length_grouping: an example's loss depends on its batch mates"
    ) as err:
        train(model, data, cfg, pad_id=2, device=torch.device("cpu"), autocast=contextlib.nullcontext, run=run)
    # listed, the key is set by the list: the hint says to remove it there (tests/training/test_speedup_hints.py)
    assert err.value.hint == "remove length_grouping from training.speedups (training.speedups: off)"


def test_auto_leaves_a_failing_speed_up_off_with_its_reason_and_the_run_trains(tmp_path):
    from tuneproof.training.loop import train

    model, data = _lora(), _dataset()
    base = model.get_base_model()
    original = base.forward

    def scaled(*a, **k):  # a model that post-processes its logits: the chunked loss is not the same loss
        out = original(*a, **k)
        out.logits = out.logits * 0.5
        return out

    base.forward = scaled

    run = LoopRun(tmp_path)
    cfg = Training(speedups="auto", micro_batch_size=4, max_steps=2, max_length=32)
    out = train(model, data, cfg, pad_id=2, device=torch.device("cpu"), autocast=contextlib.nullcontext, run=run)
    assert out["steps"] == 2
    auto = run.summary["speedups_auto"]
    assert auto["used"] == []
    assert auto["decisions"]["chunked_loss"]["used"] is False
    assert auto["decisions"]["chunked_loss"]["reason"].startswith("check failed: chunked loss differs")
    assert "speedups" not in run.summary  # nothing used, so no proof recorded
    assert any("chunked_loss off: check failed" in n for n in run.notes)


def test_explicit_lists_and_off_keep_working():
    off, _ = Training(speedups="off"), None
    assert not any(getattr(off, k) for k in ("packing", "length_grouping", "chunked_loss", "bf16_base_weights"))
    rules = static_rules(
        device_type="cuda",
        bf16_base=(True, "native bf16"),
        attention="flash_attention_2",
        method_kind="lora",
        token_labels=True,
        world_size=2,
    )
    assert all(not tried for tried, _ in rules.values())  # none of them is checked under DDP/FSDP yet
    gpu = static_rules(
        device_type="cuda",
        bf16_base=(True, "native bf16"),
        attention="flash_attention_2",
        method_kind="lora",
        token_labels=True,
    )
    assert gpu["packing"][0] and gpu["compile"][0]
    assert not gpu["bf16_base_weights"][0] and "together with the chunked loss" in gpu["bf16_base_weights"][1]
    classifier = static_rules(
        device_type="cuda", bf16_base=(True, "native bf16"), attention="sdpa", method_kind="lora", token_labels=False
    )
    assert classifier["bf16_base_weights"] == (True, "native bf16") and not classifier["packing"][0]
    cpu = static_rules(
        device_type="cpu",
        bf16_base=(False, "bf16 is not native here; set x"),
        attention="sdpa",
        method_kind="lora",
        token_labels=False,
    )
    assert cpu["bf16_base_weights"] == (False, "bf16 is not native here")
    sdpa = static_rules(
        device_type="cuda", bf16_base=(True, "x"), attention="sdpa", method_kind="full", token_labels=True
    )
    assert not sdpa["packing"][0] and not sdpa["bf16_base_weights"][0]


# ---------------------------------------------------------------- training.compile
class _TinyLM(torch.nn.Module):
    """An embedding and a head (the LoRA-free minimum a loss needs): dynamo traces it in well under a second,
    where a Llama takes tens of seconds on a shared 2-core CPU. ``wrong_when_compiled``: a graph that computes
    something else (what the check must catch)."""

    def __init__(self, wrong_when_compiled: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.head = torch.nn.Embedding(64, 16), torch.nn.Linear(16, 64)
        self.embed.weight.requires_grad_(False)  # frozen, as under LoRA
        self.wrong = wrong_when_compiled

    def forward(self, input_ids, attention_mask=None):
        from types import SimpleNamespace

        hidden = self.embed(input_ids)
        if self.wrong and torch.compiler.is_compiling():
            hidden = hidden * 1.01
        return SimpleNamespace(logits=self.head(torch.tanh(hidden)))


def test_compile_check_matches_eager_measures_its_cost_and_catches_a_wrong_graph():
    from tuneproof.data.preprocess import collate
    from tuneproof.training.compiled import prove_compile

    batch = collate(_dataset()[:4], 2)
    model = _TinyLM()
    # eager backend: dynamo's graph run without generating kernels (inductor's C++ build takes minutes on a
    # shared 2-core CPU; benchmarks/compile_step.py measures it)
    rep = prove_compile(model, batch, _loss, low_precision=False, planned_micro_batches=10, backend="eager")
    assert rep["passed"] is True and rep["target"] == "_TinyLM" and rep["tensors"] == 2
    assert rep["loss_rel_diff"] <= 1e-5 and rep["grad_rel_l2"] <= 1e-4
    assert rep["compile_seconds"] > 0 and rep["eager_s_per_micro_batch"] > 0
    assert rep["planned_micro_batches"] == 10 and isinstance(rep["pays"], bool)
    assert model._compiled_call_impl is not None  # kept compiled for the loop
    assert all(p.grad is None for p in model.parameters())

    wrong = _TinyLM(wrong_when_compiled=True)
    bad = prove_compile(wrong, batch, _loss, low_precision=False, planned_micro_batches=10, backend="eager")
    assert bad["passed"] is False and bad["loss_rel_diff"] > 1e-5
    assert "leave training.compile off" in bad["message"]
    assert wrong._compiled_call_impl is None  # back in eager mode


def test_the_quickstart_writes_auto_by_default_and_off_on_request(tmp_path):
    import yaml

    from tuneproof.recipes.quickstart import write_quickstart_study
    from tuneproof.study import validate_study

    auto = yaml.safe_load(write_quickstart_study(tmp_path / "a", fast=False).read_text())
    off = yaml.safe_load(write_quickstart_study(tmp_path / "b", fast=False, speedups="off").read_text())
    fast = yaml.safe_load(write_quickstart_study(tmp_path / "c", fast=True).read_text())
    assert auto["training"]["speedups"] == "auto" and fast["training"]["speedups"] == "auto"
    assert off["training"]["speedups"] == "off" and off["training"]["max_steps"] == auto["training"]["max_steps"]
    assert validate_study(off).training.speedups == "off" and fast["training"]["max_steps"] == 3
