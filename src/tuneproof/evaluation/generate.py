"""Predictions for an evaluation split, by the same procedure for baseline and candidates.

Generative models: batched greedy (or sampled) generation with left padding, the KV cache and
``torch.inference_mode``; prompts are sorted by length so a batch wastes little padding, and the
outputs are put back in the original order (:func:`length_sorted_batches`; the outputs
equal those of the unsorted batches and of one example at a time, checked in
``tests/evaluation/test_eval_sorted_batches.py`` and by the preflight's check of docs/CASES.md C22). Encoders:
argmax of the classification head, batches sorted the same way. This is the ``transformers``
generation backend; ``evaluation/backends.py`` puts it and vLLM behind one interface.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from tuneproof.data.examples import Example


def length_sorted_batches(lengths: list[int], batch_size: int, sort: bool = True) -> list[list[int]]:
    """Batches of example positions: ``batch_size`` consecutive positions of the order sorted by
    length (stable: ties keep the input order), or of the input order with ``sort=False``."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i]) if sort else list(range(len(lengths)))
    return [order[s : s + batch_size] for s in range(0, len(order), batch_size)]


def padded_positions(lengths: list[int], batches: list[list[int]]) -> int:
    """Padding positions when each batch is padded to its longest member."""
    return sum(len(b) * max(lengths[i] for i in b) - sum(lengths[i] for i in b) for b in batches if b)


def generate(
    model,
    tokenizer,
    pipeline,
    examples: list[Example],
    eval_cfg,
    *,
    device,
    autocast,
    progress: Callable[[int], None] | None = None,
    sort_by_length: bool = True,
) -> list[str]:
    """Generated answers (special tokens removed, surrounding whitespace stripped), one per example.

    Args:
        pipeline: the study's :class:`~tuneproof.data.preprocess.TextPipeline` (its prompt is the inference prompt).
        eval_cfg: the study's ``eval`` section (batch_size, max_new_tokens, do_sample, temperature).
        progress: called with the number of examples finished after each batch.
        sort_by_length: batch the prompts in length order (less padding; the outputs are returned
            in the order of ``examples`` either way).
    """
    return generate_prompts(
        model,
        tokenizer,
        [pipeline.prompt_text(ex.text) for ex in examples],
        eval_cfg,
        device=device,
        autocast=autocast,
        progress=progress,
        sort_by_length=sort_by_length,
    )


@torch.inference_mode()
def generate_prompts(
    model,
    tokenizer,
    prompts: list[str],
    eval_cfg,
    *,
    device,
    autocast,
    progress: Callable[[int], None] | None = None,
    sort_by_length: bool = True,
) -> list[str]:
    """:func:`generate` on prompt texts already rendered (``pipeline.prompt_text``): each prompt is
    tokenized without added special tokens (the chat template holds them), batches of
    ``eval_cfg.batch_size`` are left-padded; returns one decoded answer per prompt, in their order."""
    model.eval()
    enc = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    out: list[str] = [""] * len(prompts)
    pad = tokenizer.pad_token_id
    for idx in length_sorted_batches([len(e) for e in enc], eval_cfg.batch_size, sort_by_length):
        width = max(len(enc[i]) for i in idx)
        ids = torch.full((len(idx), width), pad, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for r, i in enumerate(idx):  # left padding: the generated tokens follow every prompt directly
            ids[r, width - len(enc[i]) :] = torch.tensor(enc[i])
            mask[r, width - len(enc[i]) :] = 1
        kwargs = dict(
            max_new_tokens=eval_cfg.max_new_tokens,
            do_sample=eval_cfg.do_sample,
            pad_token_id=pad,
            eos_token_id=tokenizer.eos_token_id,
            use_cache=True,
        )
        if eval_cfg.do_sample:
            kwargs["temperature"] = eval_cfg.temperature
        else:
            kwargs.update(temperature=None, top_p=None, top_k=None)
        with autocast():
            gen = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), **kwargs)
        for r, i in enumerate(idx):
            out[i] = tokenizer.decode(gen[r, width:], skip_special_tokens=True).strip()
        if progress:
            progress(len(idx))
    return out


@torch.inference_mode()
def classify(
    model,
    tokenizer,
    examples: list[Example],
    labels: list[str],
    *,
    max_length: int,
    batch_size: int,
    device,
    autocast,
    progress: Callable[[int], None] | None = None,
    sort_by_length: bool = True,
) -> list[str]:
    """Predicted label names from a sequence-classification head (argmax of the logits), in the
    order of ``examples``; batched in length order unless ``sort_by_length`` is False."""
    model.eval()
    lengths = [
        len(ids) for ids in tokenizer([e.text for e in examples], truncation=True, max_length=max_length)["input_ids"]
    ]
    out: list[str] = [""] * len(examples)
    for idx in length_sorted_batches(lengths, batch_size, sort_by_length):
        enc = tokenizer(
            [examples[i].text for i in idx], padding=True, truncation=True, max_length=max_length, return_tensors="pt"
        )
        with autocast():
            logits = model(**{k: v.to(device) for k, v in enc.items()}).logits
        for i, k in zip(idx, logits.argmax(-1).tolist()):
            out[i] = labels[k]
        if progress:
            progress(len(idx))
    return out


@torch.inference_mode()
def classify_images(
    model,
    pipeline,
    examples: list[Example],
    labels: list[str],
    *,
    batch_size: int,
    device,
    autocast,
    progress: Callable[[int], None] | None = None,
) -> list[str]:
    """Predicted label names of an image classifier (argmax of the logits), on the pipeline's
    evaluation tensors (no train-time flip): ``pixel_values [B, C, H, W]`` per batch."""
    from tuneproof.data.image_pipeline import collate_images  # noqa: PLC0415

    model.eval()
    out: list[str] = []
    for s in range(0, len(examples), batch_size):
        chunk = examples[s : s + batch_size]
        batch = collate_images([pipeline.encode(e) for e in chunk])
        with autocast():
            logits = model(pixel_values=batch["pixel_values"].to(device)).logits
        out += [labels[i] for i in logits.argmax(-1).tolist()]
        if progress:
            progress(len(chunk))
    return out
