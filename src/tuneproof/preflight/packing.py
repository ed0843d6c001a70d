"""The preflight's "packing" check (``training.packing``, docs/CASES.md C23): the packed rows of the study's
training examples give each example the per-token losses it has alone (:mod:`tuneproof.training.packing`).
"""

from __future__ import annotations

from typing import Any

from tuneproof.training.packing import check_packing, packing_sample
from tuneproof.training.speedups import packing_capacity


def check_study_packing(model, encoded: list, cfg, pad_id: int) -> dict[str, Any]:
    """The preflight's "packing" check (listed only when ``training.packing`` is on): :func:`check_packing`
    on :func:`packing_sample` of the study's training examples at ``training.max_length``."""
    if not encoded or encoded[0].class_index is not None or not encoded[0].labels:
        return {
            "name": "packing",
            "passed": False,
            "numbers": {},
            "details": None,
            "message": "training.packing applies to causal LMs (token labels), not to "
            "sequence classification; set it to false",
        }
    sample = packing_sample(encoded, cfg.micro_batch_size)
    rep = check_packing(model, sample, pad_id, packing_capacity(cfg))
    numbers = {k: rep[k] for k in ("max_abs_diff", "control_max_abs_diff", "tokens", "rows", "examples", "atol")}
    return {"name": "packing", "passed": rep["passed"], "numbers": numbers, "message": rep["message"], "details": None}
