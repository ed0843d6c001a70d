"""Size one complete training step (PROTOCOL.md step 5, CASES C8)."""

import json

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from tuneproof.errors import TuneproofError
from tuneproof.preflight.memory import (
    estimate_step_memory,
    find_max_micro_batch,
    measure_step_peak,
    memory_between_steps,
    side_by_side,
)
from tuneproof.training.loss import token_loss_sum


def llama(hidden=32, inter=128, layers=2, heads=4, vocab=128, attn="eager", dtype=torch.float32):
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=heads, vocab_size=vocab, attn_implementation=attn)
    return LlamaForCausalLM(cfg).to(dtype)


def test_c8_memory_between_steps_is_4_bytes_per_fp32_parameter():
    m = llama()
    r = memory_between_steps(m)
    n = sum(p.numel() for p in m.parameters())
    assert r["parameters"] == n and r["parameter_bytes"] == 4 * n and r["bytes_per_parameter"] == 4.0
    assert r["gradient_bytes"] == 0 and r["optimizer_state_bytes"] == 0
    assert memory_between_steps(llama(dtype=torch.bfloat16))["bytes_per_parameter"] == 2.0


def test_c8_estimate_breakdown_full_fine_tuning_fp32():
    m = llama()  # intermediate = 4h, eager attention: Korthikanti's 34sbh + 5as^2b per layer
    n = sum(p.numel() for p in m.parameters())
    b, s, h, a, L, V = 2, 16, 32, 4, 2, 128
    r = estimate_step_memory(m, micro_batch=b, seq_len=s, precision="fp32")
    assert r["weights_bytes"] == 4 * n and r["gradients_bytes"] == 4 * n
    assert r["optimizer_states_count"] == 2 and r["optimizer_states_bytes"] == 2 * 4 * n
    assert r["optimizer_step_temporary_bytes"] == 4 * n
    assert r["activations_bytes"] == int(2 * L * s * b * h * (34 + 5 * a * s / h))  # fp32: twice the 16-bit formula
    assert r["logits_bytes"] == s * b * V * (4 + 4 + 4)
    parts = r["weights_bytes"] + r["gradients_bytes"] + r["optimizer_states_bytes"] + r["activations_bytes"]
    assert r["total_bytes"] >= parts
    assert r["total_bytes"] == parts + r["optimizer_step_temporary_bytes"] + r["logits_bytes"]
    assert "Korthikanti" in r["source"]


def test_estimate_lora_bf16_checkpointing_and_budget():
    m = get_peft_model(llama(attn="sdpa"), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    n = sum(p.numel() for p in m.parameters())
    t = sum(p.numel() for p in m.parameters() if p.requires_grad)
    r = estimate_step_memory(m, 4, 32, "bf16", trainable_dtype="fp32", activation_checkpointing=True, budget_bytes=1)
    assert r["trainable_parameters"] == t
    assert r["weights_bytes"] == 2 * (n - t) + 4 * t and r["gradients_bytes"] == 4 * t and r["optimizer_states_bytes"] == 8 * t
    assert r["attention_scores_stored"] is False
    s, b, h, L = 32, 4, 32, 2
    one_layer = s * b * h * (15 + 19 * 128 / (4 * h))
    assert r["activations_bytes"] == int(1.0 * (L * 2 * s * b * h + one_layer))
    assert r["logits_bytes"] == s * b * 128 * (2 + 4 + 4 + 4)
    assert r["passed"] is False and "exceeds the budget" in r["message"]
    mixed = estimate_step_memory(m, 4, 32, "bf16", weights_dtype="fp32")  # autocast: fp32 weights, bf16 compute
    assert mixed["weights_bytes"] == 4 * n and mixed["gradients_bytes"] == 4 * t and mixed["bytes_per_weight"] == 4
    assert mixed["autocast_weight_copies_bytes"] == 2 * n and r["autocast_weight_copies_bytes"] == 0
    assert mixed["activations_bytes"] == int(L * one_layer)  # bf16 activations, no checkpointing
    with pytest.raises(TuneproofError, match="resolve 'auto'"):
        estimate_step_memory(m, 1, 8, "auto")


def test_c8_measured_peak_of_a_whole_step_is_shown_next_to_the_estimate():
    m = llama(hidden=256, inter=512, layers=2, heads=4, vocab=1024)
    n = sum(p.numel() for p in m.parameters())
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    ids = torch.randint(0, 1024, (2, 32))

    def step():
        loss = token_loss_sum(m(input_ids=ids).logits, ids) / (2 * 31)
        loss.backward()
        opt.step()

    measured = measure_step_peak(step, "cpu")
    assert measured["device"] == "cpu" and measured["seconds"] > 0
    # step 1 creates the gradients (4 B) and both AdamW states (8 B) of every parameter
    assert measured["step_peak_bytes"] >= 0.9 * 12 * n
    between = memory_between_steps(m, opt)
    assert between["gradient_bytes"] == 4 * n and between["optimizer_state_bytes"] >= 8 * n
    est = estimate_step_memory(m, 2, 32, "fp32")
    view = side_by_side(est, measured)
    json.dumps([measured, between, est, view])
    assert [row[0] for row in view["rows"]] == ["weights", "autocast_weight_copies", "gradients", "optimizer_states", "optimizer_step_temporary",
                                                 "activations", "logits"]
    assert view["estimate_total_bytes"] == est["total_bytes"] and view["measured_step_peak_bytes"] == measured["step_peak_bytes"]


def test_find_max_micro_batch_doubles_then_bisects():
    r = find_max_micro_batch(lambda mb: 100 + 30 * mb, budget_bytes=1000)
    assert r["passed"] and r["max_micro_batch"] == 30 and r["peak_bytes"] == 1000
    assert [t["micro_batch"] for t in r["tries"]][:6] == [1, 2, 4, 8, 16, 32]
    assert r["tries"][5]["fits"] is False


def test_find_max_micro_batch_treats_oom_as_a_miss_and_respects_limit():
    def try_fn(mb):
        if mb > 37:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return {"peak_bytes": mb}

    r = find_max_micro_batch(try_fn, budget_bytes=10**9)
    assert r["max_micro_batch"] == 37 and any(t["oom"] for t in r["tries"])
    assert find_max_micro_batch(lambda mb: 1, 10, limit=24)["max_micro_batch"] == 24
    none = find_max_micro_batch(lambda mb: 2000, 1000)
    assert none["passed"] is False and none["max_micro_batch"] == 0 and "does not fit" in none["message"]
    with pytest.raises(ValueError):
        find_max_micro_batch(lambda mb: (_ for _ in ()).throw(ValueError("bug")), 10)
