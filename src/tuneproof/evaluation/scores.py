"""Per-example logit scores of a model on the study's examples: what a reloaded model must reproduce
(the preflight's smoke pass and the save-and-verify of distributed training compare them)."""

from __future__ import annotations

import torch

from tuneproof.context import StudyContext
from tuneproof.data.image_pipeline import collate_images


def logit_scores(ctx: StudyContext, model, examples: list) -> list[list]:
    """Per example: the 5 highest next-token logits after the prompt (``[[token id, logit], ...]``), or
    every class logit (``[[class index, logit], ...]``) for sequence and image classification, under
    the study's device and autocast (``ctx.torch_setup()``); logits as fp32 floats, the model left in eval mode."""
    device, _, autocast = ctx.torch_setup()
    model.eval()
    out = []
    with torch.inference_mode():
        for ex in examples:
            if ctx.is_image:
                pixels = collate_images([ctx.pipeline.encode(ex)])["pixel_values"].to(device)
                with autocast():
                    logits = model(pixel_values=pixels).logits[0].float()
                out.append([[i, float(v)] for i, v in enumerate(logits.cpu())])
                continue
            if ctx.model_kind == "sequence-classification":
                enc = ctx.tokenizer(
                    ex.text, truncation=True, max_length=ctx.study.training.max_length, return_tensors="pt"
                )
                with autocast():
                    logits = model(**{k: v.to(device) for k, v in enc.items()}).logits[0].float()
                out.append([[i, float(v)] for i, v in enumerate(logits.cpu())])
                continue
            prompt = ctx.tokenizer(ctx.pipeline.prompt_text(ex.text), add_special_tokens=False)["input_ids"]
            ids = torch.tensor([prompt], device=device)
            with autocast():
                last = model(input_ids=ids).logits[0, -1].float().cpu()
            top = torch.topk(last, min(5, last.numel()))
            out.append([[int(i), float(v)] for i, v in zip(top.indices, top.values)])
    return out
