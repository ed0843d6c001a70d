"""Preflight check ``chunked loss`` (only with ``training.chunked_loss: true``): the check the train
loop runs before it uses the chunked loss, run here before the hours are spent."""

from __future__ import annotations

from typing import Any

from tuneproof.preflight.report import check_result
from tuneproof.training.speedups import check_chunked_on_batch, packing_capacity


def check_study_chunked_loss(model, encoded: list, cfg, pad_id: int) -> dict[str, Any]:
    """The preflight's "chunked loss" check (listed only with ``training.chunked_loss``): the check the
    train loop runs before it uses the chunked loss (:func:`tuneproof.training.loss.check_chunked_loss`
    on the first micro-batch of train examples, packed into rows when ``training.packing`` is on):
    summed loss and every trainable gradient equal to the full-logits loss. A classification head
    (no token labels) fails it, naming the key. ``cfg``: the study's ``training`` section."""
    device = next(model.parameters()).device
    capacity = packing_capacity(cfg) if cfg.packing else None
    res = check_chunked_on_batch(model, encoded[: cfg.micro_batch_size], pad_id, device, capacity)
    numbers = {k: res[k] for k in ("loss_rel_diff", "grad_max_rel_diff", "tensors") if k in res}
    message = res["message"] if res["passed"] else f"training.chunked_loss: {res['message']}; set it to false"
    return check_result("chunked loss", res["passed"], message, numbers)
