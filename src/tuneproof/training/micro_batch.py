"""What the model is given for one micro-batch: the one function the training loop
(:func:`tuneproof.training.loop.backward_window`), the packing check (:mod:`tuneproof.training.packing`) and the
chunked-loss check (:func:`tuneproof.training.loss.check_chunked_loss`) all call, looked up at call time, so the mask
and position ids a check proves are those training passes (tests/training/test_length_grouping_packing.py plants a
changed mask here and the packing check fails).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any


def model_inputs(batch: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of the model's forward for ``batch`` (a collated micro-batch; ``labels`` never
    go in: the loop computes its own loss).

    - packed rows (``position_ids``, :func:`tuneproof.data.preprocess.collate_packed`): ``input_ids`` and
      ``position_ids`` ``[R, W]``, no attention mask and no cache, so the model's own mask builder starts a new
      sequence wherever a position id restarts (transformers ``masking_utils.find_packed_sequence_indices``);
    - padded rows: ``input_ids`` and ``attention_mask`` ``[B, T]`` (or ``pixel_values`` ``[B, C, H, W]``).
    """
    if "position_ids" in batch:
        return {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"], "use_cache": False}
    return {k: v for k, v in batch.items() if k != "labels"}


def logits(model, batch: dict[str, Any], autocast: Callable = contextlib.nullcontext):
    """``model(**model_inputs(batch)).logits`` under ``autocast``: ``[B, T, V]`` (token labels) or ``[B, C]``."""
    with autocast():
        return model(**model_inputs(batch)).logits
