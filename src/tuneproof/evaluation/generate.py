"""Predictions for an evaluation split, by the same procedure for baseline and candidates.

Generative models: batched greedy (or sampled) generation with left padding, the KV cache and
``torch.inference_mode``; prompts are sorted by length so a batch wastes little padding, and the
outputs are put back in the original order. Encoders: argmax of the classification head.
"""

from __future__ import annotations

from typing import Callable

import torch

from tuneproof.data.examples import Example


@torch.inference_mode()
def generate(model, tokenizer, pipeline, examples: list[Example], eval_cfg, *, device, autocast,
             progress: Callable[[int], None] | None = None) -> list[str]:
    """Generated answers (special tokens removed, surrounding whitespace stripped), one per example.

    Args:
        pipeline: the study's :class:`~tuneproof.data.preprocess.TextPipeline` (its prompt is the inference prompt).
        eval_cfg: the study's ``eval`` section (batch_size, max_new_tokens, do_sample, temperature).
        progress: called with the number of examples finished after each batch.
    """
    model.eval()
    prompts = [pipeline.prompt_text(ex.text) for ex in examples]
    enc = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    order = sorted(range(len(examples)), key=lambda i: len(enc[i]))
    out: list[str] = [""] * len(examples)
    pad = tokenizer.pad_token_id
    for s in range(0, len(order), eval_cfg.batch_size):
        idx = order[s : s + eval_cfg.batch_size]
        width = max(len(enc[i]) for i in idx)
        ids = torch.full((len(idx), width), pad, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for r, i in enumerate(idx):  # left padding: the generated tokens follow every prompt directly
            ids[r, width - len(enc[i]):] = torch.tensor(enc[i])
            mask[r, width - len(enc[i]):] = 1
        kwargs = dict(max_new_tokens=eval_cfg.max_new_tokens, do_sample=eval_cfg.do_sample, pad_token_id=pad,
                      eos_token_id=tokenizer.eos_token_id, use_cache=True)
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
def classify(model, tokenizer, examples: list[Example], labels: list[str], *, max_length: int, batch_size: int, device,
             autocast, progress: Callable[[int], None] | None = None) -> list[str]:
    """Predicted label names from a sequence-classification head (argmax of the logits)."""
    model.eval()
    out: list[str] = []
    for s in range(0, len(examples), batch_size):
        chunk = examples[s : s + batch_size]
        enc = tokenizer([e.text for e in chunk], padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        with autocast():
            logits = model(**{k: v.to(device) for k, v in enc.items()}).logits
        out += [labels[i] for i in logits.argmax(-1).tolist()]
        if progress:
            progress(len(chunk))
    return out


@torch.inference_mode()
def classify_images(model, pipeline, examples: list[Example], labels: list[str], *, batch_size: int, device, autocast,
                    progress: Callable[[int], None] | None = None) -> list[str]:
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
