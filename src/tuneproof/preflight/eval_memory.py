"""Size one evaluation batch (docs/PROTOCOL.md step 5; tests/preflight/test_pf_eval_memory.py): the evaluation must fit
too.

A run that trained for hours can die at its first evaluation: generation holds a KV cache that
grows with every new token, and ``eval.batch_size`` is usually larger than the training
micro-batch. This module measures the peak memory of one evaluation batch, at
``eval.batch_size``, by the evaluation procedure of :mod:`tuneproof.modalities.text`, in its
worst case:

* causal LM: the ``eval.batch_size`` longest prompts of the evaluation split (by tokens),
  left-padded as ``generate`` pads them, generated with the KV cache (``use_cache=True``) for
  exactly ``eval.max_new_tokens`` new tokens (``min_new_tokens`` = ``max_new_tokens``: an early
  end-of-sequence cannot make the measured cache smaller than the largest one evaluation makes);
* sequence classification: the ``eval.batch_size`` longest texts, truncated at
  ``training.max_length`` as ``classify`` truncates them, one forward pass.

Both under ``torch.inference_mode`` and the study's autocast. The peak is measured by
:func:`tuneproof.training.memory.measure_step_peak`, the method the training step uses (CUDA:
``max_memory_allocated`` after ``reset_peak_memory_stats``; CPU: the process's VmHWM after
resetting it). The batch is ``min(eval.batch_size, examples evaluated)`` (:func:`evaluated_batch_size`:
``eval.max_examples`` 6 at ``eval.batch_size`` 16 never forms a batch of 16); a caller asking for more than the
split holds gets the longest ones repeated (stated in ``repeated``). Sizes are bytes; ``*_gib`` are GiB (2**30).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from tuneproof.context import StudyContext
from tuneproof.modalities import modality_for
from tuneproof.models.heads import Head
from tuneproof.preflight.memory import GIB
from tuneproof.preflight.report import is_out_of_memory
from tuneproof.training.memory import measure_step_peak

NAME = "eval memory"


def evaluated_batch_size(batch_size: int, n_examples: int) -> int:
    """The largest batch evaluation ever forms: ``min(eval.batch_size, examples evaluated)`` (at least 1).

    Evaluation batches the examples it evaluates (``eval.max_examples`` caps them), so with 6 examples and
    ``eval.batch_size`` 16 no batch holds more than 6; the eval memory and eval batch size checks measure that one.
    """
    return max(1, min(int(batch_size), int(n_examples)))


def _batch_words(mb: int, configured: int | None) -> str:
    """``eval.batch_size 16``, or ``eval batch 6 (eval.batch_size 16, 6 examples evaluated)`` when capped."""
    if configured is None or configured == mb:
        return f"eval.batch_size {mb}"
    return f"eval batch {mb} (eval.batch_size {configured}, {mb} examples evaluated)"


def _fill(items: list, size: int) -> tuple[list, int]:
    """The first ``size`` of ``items``, cycled when there are fewer; returns ``(batch, repeated)``."""
    out = [items[i % len(items)] for i in range(size)]
    return out, max(0, size - len(items))


def kv_cache_bytes(config: Any, batch: int, tokens: int, bytes_per_element: int) -> int | None:
    """Keys and values of every layer for ``batch`` sequences of ``tokens`` positions:
    ``2 * layers * batch * tokens * kv_heads * head_dim * bytes`` (the standard decoder cache of
    ``transformers``' ``DynamicCache``); None when the config does not name these sizes."""
    cfg = getattr(config, "text_config", None) or config
    layers = getattr(cfg, "num_hidden_layers", None)
    heads = getattr(cfg, "num_attention_heads", None)
    hidden = getattr(cfg, "hidden_size", None)
    if not (layers and heads and hidden):
        return None
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or hidden // heads
    return int(2 * layers * batch * tokens * kv * head_dim * bytes_per_element)


def generation_batch(tokenizer, prompts: list[str], batch_size: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The left-padded batch of the ``batch_size`` longest prompts (as ``modalities.text.generate`` pads)."""
    enc = sorted((tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts), key=len, reverse=True)
    chosen, repeated = _fill(enc, batch_size)
    width = max(len(e) for e in chosen)
    pad = tokenizer.pad_token_id
    ids = torch.full((batch_size, width), pad, dtype=torch.long)
    mask = torch.zeros((batch_size, width), dtype=torch.long)
    for r, e in enumerate(chosen):
        ids[r, width - len(e) :] = torch.tensor(e, dtype=torch.long)
        mask[r, width - len(e) :] = 1
    return {"input_ids": ids, "attention_mask": mask}, {"prompt_tokens": width, "repeated": repeated}


def classification_batch(
    tokenizer, texts: list[str], batch_size: int, max_length: int
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The ``batch_size`` longest texts, padded and truncated as ``modalities.text.classify`` does."""
    longest = sorted(
        texts, key=lambda t: len(tokenizer(t, truncation=True, max_length=max_length)["input_ids"]), reverse=True
    )
    chosen, repeated = _fill(longest, batch_size)
    enc = tokenizer(chosen, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    return dict(enc), {"prompt_tokens": int(enc["input_ids"].shape[1]), "repeated": repeated}


def measure_eval_batch_peak(
    model,
    tokenizer,
    *,
    head: Head,
    texts: list[str],
    batch_size: int,
    max_new_tokens: int = 0,
    max_length: int = 512,
    device: Any = "cpu",
    autocast: Callable[[], Any] | None = None,
) -> dict[str, Any]:
    """Measure the peak memory of one evaluation batch (see the module docstring).

    Args:
        head: the model kind's :class:`~tuneproof.models.heads.Head`: generative (``texts`` are the
            prompts as the model sees them) or a classification head (``texts`` are the inputs).
        batch_size: ``eval.batch_size``; max_new_tokens: ``eval.max_new_tokens`` (causal LM);
            max_length: ``training.max_length`` (classification truncation).
        autocast: the study's autocast context factory (default: none).

    Returns:
        :func:`~tuneproof.training.memory.measure_step_peak`'s dict plus ``kind``, ``generative``, ``batch_size``,
        ``prompt_tokens`` (padded width), ``new_tokens`` (generated per sequence; 0 for
        classification), ``repeated`` and ``kv_cache_estimate_bytes`` (causal LM, else None).
        The model's train/eval mode is restored.

    Raises:
        Whatever the forward pass raises (e.g. ``torch.OutOfMemoryError``); ValueError for no texts.
    """
    if not texts:
        raise ValueError("no evaluation example to size the batch with")
    dev = next(model.parameters()).device
    generative = head.generative
    if generative:
        batch, info = generation_batch(tokenizer, texts, batch_size)
        new_tokens = max_new_tokens
    else:
        batch, info = classification_batch(tokenizer, texts, batch_size, max_length)
        new_tokens = 0
    batch = {k: v.to(dev) for k, v in batch.items()}
    was_training = model.training
    model.eval()
    out: dict[str, Any] = {}

    def run_batch() -> None:
        with torch.inference_mode(), autocast() if autocast is not None else contextlib.nullcontext():
            if not generative:
                out["shape"] = list(model(**batch).logits.shape)
            else:
                pad = tokenizer.pad_token_id
                gen = model.generate(
                    **batch,
                    max_new_tokens=max_new_tokens,
                    min_new_tokens=max_new_tokens,
                    do_sample=False,
                    temperature=None,
                    top_p=None,
                    top_k=None,
                    pad_token_id=pad,
                    eos_token_id=tokenizer.eos_token_id,
                    use_cache=True,
                )
                out["shape"] = list(gen.shape)

    try:
        measured = measure_step_peak(run_batch, device)
    finally:
        model.train(was_training)
    if generative:
        generated = out["shape"][1] - info["prompt_tokens"]
        element = next(model.parameters()).element_size()
        kv = kv_cache_bytes(model.config, batch_size, info["prompt_tokens"] + generated, element)
    else:
        generated, kv = 0, None
    return {
        **measured,
        "kind": head.kind,
        "generative": generative,
        "batch_size": batch_size,
        "prompt_tokens": info["prompt_tokens"],
        "new_tokens": generated,
        "max_new_tokens": new_tokens,
        "repeated": info["repeated"],
        "kv_cache_estimate_bytes": kv,
    }


def _generative(measured: dict[str, Any]) -> bool:
    """Whether a measurement of :func:`measure_eval_batch_peak` was of generation; records written
    before it held ``generative``: the head of their ``kind`` says."""
    if "generative" in measured:
        return bool(measured["generative"])
    return modality_for(measured["kind"]).head(measured["kind"]).generative


def _size(n: int | float | None) -> str:
    if n is None:
        return "n/a"
    return f"{n / GIB:.2f} GiB" if n >= GIB / 4 else f"{n / 2**20:.1f} MiB"


def eval_memory_check(
    measured: dict[str, Any] | None,
    budget: int,
    budget_source: str,
    *,
    error: BaseException | None = None,
    batch_size: int | None = None,
    configured: int | None = None,
) -> dict[str, Any]:
    """The preflight check ``eval memory`` from a measurement (or the out-of-memory ``error``):
    fails when the measured peak exceeds ``budget`` bytes, naming ``eval.batch_size``. ``configured``:
    ``eval.batch_size`` when the batch measured is smaller (:func:`evaluated_batch_size`), said in the message.

    Returns:
        ``{"name": "eval memory", "passed", "message", "numbers", "details"}`` (the preflight's check shape).
    """
    fix = "lower eval.batch_size (or eval.max_new_tokens), or raise --memory-budget"
    if measured is None:
        return {
            "name": NAME,
            "passed": False,
            "numbers": {"batch_size": batch_size, "budget_gib": round(budget / GIB, 4)},
            "message": f"{_batch_words(batch_size, configured)}: out of memory in one "
            f"evaluation batch ({type(error).__name__}); {fix}",
            "details": {"error": str(error)[:500]},
        }
    mb = measured["batch_size"]
    what = (
        f"generation of {measured['new_tokens']} new tokens (eval.max_new_tokens) with the KV cache after prompts of "
        f"{measured['prompt_tokens']} tokens"
        if _generative(measured)
        else f"the classification forward pass at {measured['prompt_tokens']} tokens"
    )
    numbers = {
        "batch_size": mb,
        "prompt_tokens": measured["prompt_tokens"],
        "new_tokens": measured["new_tokens"],
        "peak_gib": round(measured["peak_bytes"] / GIB, 4) if measured.get("peak_bytes") is not None else None,
        "batch_peak_gib": round(measured["step_peak_bytes"] / GIB, 4)
        if measured.get("step_peak_bytes") is not None
        else None,
        "kv_cache_estimate_gib": round(measured["kv_cache_estimate_bytes"] / GIB, 6)
        if measured.get("kv_cache_estimate_bytes")
        else None,
        "seconds": round(measured["seconds"], 3),
        "budget_gib": round(budget / GIB, 4),
        "budget_source": budget_source,
    }
    where = "process resident set (CPU)" if measured["device"] == "cpu" else "peak allocated (CUDA)"
    peak = measured.get("peak_bytes")
    body = (
        f"{_batch_words(mb, configured)}: measured peak {_size(peak)} (the batch adds "
        f"{_size(measured.get('step_peak_bytes'))}; {where}) "
        f"for {what}"
        + (
            f"; {measured['repeated']} of the {mb} examples repeated (the split is smaller)"
            if measured["repeated"]
            else ""
        )
    )
    if peak is not None and peak > budget:
        return {
            "name": NAME,
            "passed": False,
            "numbers": numbers,
            "details": {"measured": measured},
            "message": f"{body} exceeds the budget {_size(budget)} ({budget_source}); {fix}",
        }
    return {
        "name": NAME,
        "passed": True,
        "numbers": numbers,
        "details": {"measured": measured},
        "message": f"{body}; fits {_size(budget)} ({budget_source})",
    }


def check_eval_memory(model, ctx: StudyContext, budget: int, budget_source: str, autocast: Callable) -> dict[str, Any]:
    """The preflight's ``eval memory`` check on the study: one evaluation batch at ``eval.batch_size``
    (capped at the examples evaluated, :func:`evaluated_batch_size`)
    (generation with the KV cache up to ``eval.max_new_tokens``, or the classification forward) fits
    ``budget`` bytes (:func:`measure_eval_batch_peak`, :func:`eval_memory_check`); an out-of-memory error fails it."""
    device, _, _ = ctx.torch_setup()
    ev, examples = ctx.study.eval, ctx.eval_examples()
    texts = ctx.modality.eval_inputs(ctx, examples)
    size = evaluated_batch_size(ev.batch_size, len(texts))  # no evaluation batch is larger
    try:
        measured = measure_eval_batch_peak(
            model,
            ctx.tokenizer,
            head=ctx.head,
            texts=texts,
            batch_size=size,
            max_new_tokens=ev.max_new_tokens,
            max_length=ctx.study.training.max_length,
            device=device,
            autocast=autocast,
        )
    except Exception as err:  # noqa: BLE001
        if not is_out_of_memory(err):
            raise
        return eval_memory_check(None, budget, budget_source, error=err, batch_size=size, configured=ev.batch_size)
    return eval_memory_check(measured, budget, budget_source, configured=ev.batch_size)


def eval_batch_rate(check: dict[str, Any] | None) -> dict[str, Any]:
    """Seconds per example of the one evaluation batch the ``eval memory`` ``check`` timed at
    ``eval.batch_size`` (the task kind's own procedure: a classifier's forward pass, or generation up
    to ``eval.max_new_tokens``), for ``tuneproof plan``; {} when it was not measured."""
    c = check or {}
    m = (c.get("details") or {}).get("measured") if isinstance(c.get("details"), dict) else None
    if not m or not m.get("seconds") or not m.get("batch_size"):
        return {}
    what = f"generation of {m['new_tokens']} new tokens" if _generative(m) else "classifier forward pass"
    return {
        "eval_batch_s_per_example": round(m["seconds"] / m["batch_size"], 5),
        "eval_batch_size": m["batch_size"],
        "eval_batch_procedure": what,
    }


__all__ = [
    "NAME",
    "check_eval_memory",
    "evaluated_batch_size",
    "classification_batch",
    "eval_batch_rate",
    "eval_memory_check",
    "generation_batch",
    "kv_cache_bytes",
    "measure_eval_batch_peak",
]
