"""The evaluation must fit too (docs/PROTOCOL.md step 5): one evaluation batch at eval.batch_size, generation with
the KV cache up to eval.max_new_tokens (or the classification forward), measured like the step."""

from __future__ import annotations

import contextlib

import pytest
import torch

from tinymodels import CORPUS, make_llama, make_tokenizer
from tuneproof.modalities.text import CAUSAL_LM, SEQUENCE_CLASSIFIER
from tuneproof.preflight.eval_memory import eval_memory_check, kv_cache_bytes, measure_eval_batch_peak


@pytest.fixture(scope="module")
def lm():
    tok = make_tokenizer()
    return make_llama(len(tok)).eval(), tok


def test_generation_batch_peak_is_measured_at_the_full_new_token_budget(lm):
    model, tok = lm
    model.train()  # the preflight's model is in training mode: restored afterwards
    prompts = CORPUS[:5]
    m = measure_eval_batch_peak(model, tok, head=CAUSAL_LM, texts=prompts, batch_size=8, max_new_tokens=12)
    assert model.training is True
    assert m["peak_bytes"] > 0 and m["device"] == "cpu" and m["batch_size"] == 8 and m["repeated"] == 3
    assert m["kind"] == "causal-lm" and m["generative"] is True
    longest = max(len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts)
    assert (
        m["prompt_tokens"] == longest and m["new_tokens"] == 12
    )  # min_new_tokens: an early EOS cannot shorten the cache
    # Llama, 2 layers, 2 kv heads x head_dim 8, fp32: 2 * 2 * 8 * (longest + 12) * 2 * 8 * 4 bytes
    assert (
        m["kv_cache_estimate_bytes"]
        == 2 * 2 * 8 * (longest + 12) * 2 * 8 * 4
        == kv_cache_bytes(model.config, 8, longest + 12, 4)
    )
    ok = eval_memory_check(m, 64 * 2**30, "--memory-budget")
    assert ok["passed"] is True and ok["numbers"]["peak_gib"] > 0 and "eval.batch_size 8" in ok["message"]


def test_tiny_budget_fails_naming_eval_batch_size(lm):
    model, tok = lm
    m = measure_eval_batch_peak(model, tok, head=CAUSAL_LM, texts=CORPUS, batch_size=4, max_new_tokens=4)
    bad = eval_memory_check(m, 2**20, "--memory-budget")
    assert bad["passed"] is False and bad["name"] == "eval memory"
    assert (
        bad["message"].startswith("eval.batch_size 4: measured peak ")
        and "exceeds the budget 1.0 MiB (--memory-budget)" in bad["message"]
    )
    assert "lower eval.batch_size" in bad["message"]
    oom = eval_memory_check(
        None, 2**20, "--memory-budget", error=torch.OutOfMemoryError("CUDA out of memory"), batch_size=64
    )
    assert (
        oom["passed"] is False
        and "eval.batch_size 64: out of memory in one evaluation batch (OutOfMemoryError)" in oom["message"]
    )


def test_classification_forward_batch():
    from transformers import BertConfig, BertForSequenceClassification

    tok = make_tokenizer()
    torch.manual_seed(0)
    model = BertForSequenceClassification(
        BertConfig(
            vocab_size=len(tok),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=64,
            num_labels=3,
            pad_token_id=2,
        )
    )
    m = measure_eval_batch_peak(model, tok, head=SEQUENCE_CLASSIFIER, texts=CORPUS, batch_size=16, max_length=8)
    assert (
        m["peak_bytes"] > 0
        and m["prompt_tokens"] == 8
        and m["new_tokens"] == 0
        and m["kv_cache_estimate_bytes"] is None
    )
    assert m["repeated"] == 16 - len(CORPUS)
    assert m["kind"] == "sequence-classification" and m["generative"] is False


def test_eval_batch_is_capped_at_the_examples_evaluated(lm):
    """eval.max_examples 6 at eval.batch_size 16: evaluation never forms a batch of 16, so the check measures 6."""
    from types import SimpleNamespace as NS  # noqa: PLC0415

    from tuneproof.preflight.eval_memory import check_eval_memory, evaluated_batch_size  # noqa: PLC0415

    assert (evaluated_batch_size(16, 6), evaluated_batch_size(4, 6), evaluated_batch_size(8, 0)) == (6, 4, 1)
    model, tok = lm
    examples = CORPUS[:6]
    ctx = NS(
        study=NS(eval=NS(batch_size=16, max_new_tokens=3), training=NS(max_length=64)),
        eval_examples=lambda: list(examples),
        modality=NS(eval_inputs=lambda _ctx, ex: list(ex)),
        torch_setup=lambda: ("cpu", None, None),
        tokenizer=tok,
        head=CAUSAL_LM,
    )
    check = check_eval_memory(model, ctx, 64 * 2**30, "--memory-budget", contextlib.nullcontext)
    assert check["passed"] is True
    assert check["numbers"]["batch_size"] == 6 and check["details"]["measured"]["repeated"] == 0
    assert check["message"].startswith("eval batch 6 (eval.batch_size 16, 6 examples evaluated): measured peak ")
