"""docs/CASES.md C11: FSDP units that hold frozen base weights and LoRA weights together are named
before launch, and the remedy is required."""

from __future__ import annotations

from peft import LoraConfig, get_peft_model

from tinymodels import make_llama
from tuneproof.preflight.fsdp import mixed_units


def test_c11_lora_blocks_are_mixed_units_and_need_the_remedy():
    model = get_peft_model(make_llama(64), LoraConfig(r=2, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    rep = mixed_units(model, ["LlamaDecoderLayer"])
    assert not rep["passed"]
    assert [m["unit"] for m in rep["mixed"]] == ["base_model.model.model.layers.0", "base_model.model.model.layers.1"]
    # each block: q_proj and v_proj LoRA A (2x32) + B (32x2 for q, 16x2 for v with 2 kv heads of 8)
    assert rep["mixed"][0]["trainable"] == 2 * 32 + 32 * 2 + 2 * 32 + 16 * 2
    assert "use_orig_params=True" in rep["message"]
    assert mixed_units(model, ["LlamaDecoderLayer"], use_orig_params=True)["passed"]
    assert mixed_units(model, ["LlamaDecoderLayer"], fsdp_version=2)["passed"]


def test_full_fine_tuning_has_no_mixed_unit():
    rep = mixed_units(make_llama(64), ["LlamaDecoderLayer"])
    assert rep["passed"] and rep["mixed"] == [] and rep["units"] == 3
