"""Activation checkpointing changes memory and time, not gradients (docs/PROTOCOL.md step 5, docs/CASES.md C7)."""

import json

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from tuneproof.preflight.activation_checkpointing import check_activation_checkpointing


def tiny_llama(seed=0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
    )
    return LlamaForCausalLM(cfg)


def lora_factory(remedy):
    def build(checkpointing):
        base = tiny_llama()
        model = get_peft_model(
            base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.1, init_lora_weights="gaussian")
        )
        if checkpointing:
            base.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True})
            base.disable_input_require_grads()  # transformers >= 5 adds the hook itself
            if remedy:
                model.enable_input_require_grads()
        return model

    return build


def batch():
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 128, (2, 12), generator=g)
    labels = ids.clone()
    labels[:, :5] = -100
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def test_c7_lora_reentrant_with_remedy_has_the_same_gradients():
    r = check_activation_checkpointing(lora_factory(remedy=True), batch())
    assert r["passed"], r["message"]
    json.dumps(r)
    assert r["weights_identical"] and r["missing_with_checkpointing"] == [] and r["grad_mismatches"] == []
    assert r["grad_tensors"] == 8 and r["grad_max_abs_diff"] <= 1e-6
    assert r["loss_with"] == r["loss_without"]
    assert r["with"]["seconds"] > 0 and r["without"]["seconds"] > 0 and r["time_ratio"] > 0
    # the memory saved: the step's tensors at their peak (CPU allocator), without minus with checkpointing, exact
    assert r["with"]["step_peak_bytes"] is not None and r["approximate"] is False
    assert (
        r["memory_saved_bytes"]
        == r["without"]["allocated_step_peak_bytes"] - r["with"]["allocated_step_peak_bytes"]
        > 0
    )
    assert r["diagnosis"]["use_reentrant"] is True and r["diagnosis"]["input_require_grads_hook"] is True


def test_c7_lora_reentrant_without_input_grads_fails():
    r = check_activation_checkpointing(lora_factory(remedy=False), batch(), measure_memory=False)
    assert r["passed"] is False and len(r["missing_with_checkpointing"]) == 8
    assert "get no gradient" in r["message"] and "enable_input_require_grads()" in r["message"]


def test_full_fine_tuning_non_reentrant_same_gradients():
    def build(checkpointing):
        m = tiny_llama()
        if checkpointing:
            m.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        return m

    r = check_activation_checkpointing(build, batch(), measure_memory=False)
    assert r["passed"], r["message"]
    assert r["grad_tensors"] == len(list(tiny_llama().parameters())) and r["diagnosis"]["use_reentrant"] is False
    assert r["memory_saved_bytes"] is None


def test_factory_that_does_not_switch_or_reseed_fails():
    seeds = iter([0, 1])
    r = check_activation_checkpointing(lambda flag: tiny_llama(next(seeds)), batch(), measure_memory=False)
    assert r["passed"] is False and r["weights_identical"] is False
    assert "without activation checkpointing enabled" in r["message"] and "different weights" in r["message"]
