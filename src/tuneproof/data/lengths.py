"""Token-length statistics per split and the truncation they imply (docs/PROTOCOL.md step 3:
the tokenizer, the separators, where truncation cuts).

Pure functions on integers: the token lengths (tokens per example after the exact
preprocessing, before truncation) are computed by the caller with the study's tokenizer.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from tuneproof.errors import TuneproofError

PERCENTILE_METHOD = "linear"  # numpy's default (Hyndman & Fan 1996, definition 7)
SUGGEST_PERCENTILE = 99.0
SUGGEST_MULTIPLE = 8


def suggest_max_length(train_lengths: list[int]) -> int:
    """The 99th percentile of the train token lengths (numpy ``method="linear"``), rounded up to
    the next multiple of 8 tokens (at least 8).

    Why 8: sequence dimensions that are multiples of 8 let fp16/bf16 matrix multiplies use
    tensor cores (NVIDIA, *Deep Learning Performance Guide*, "Tensor Core requirements").
    Why p99: about 1 train example in 100 is truncated; the share is reported per split by
    :func:`length_stats` so the choice can be checked.

    Raises:
        TuneproofError: empty list or a length that is not a non-negative integer.
    """
    arr = _as_lengths("train", train_lengths)
    if arr.size == 0:
        raise TuneproofError("suggest_max_length: the train split has no token lengths")
    p = float(np.percentile(arr, SUGGEST_PERCENTILE, method=PERCENTILE_METHOD))
    return max(SUGGEST_MULTIPLE, math.ceil(p / SUGGEST_MULTIPLE) * SUGGEST_MULTIPLE)


def _as_lengths(split: str, values: Any) -> np.ndarray:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise TuneproofError(
            f"token lengths of split '{split}' must be a list of integers, got {type(values).__name__}"
        )
    values = list(values)
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0:
            raise TuneproofError(f"token lengths of split '{split}': item {i} is {v!r}, not a non-negative integer")
    return np.asarray(values, dtype=np.int64)


def round_up(tokens: int) -> int:
    """``tokens`` rounded up to a multiple of 8 (at least 8)."""
    return max(SUGGEST_MULTIPLE, math.ceil(tokens / SUGGEST_MULTIPLE) * SUGGEST_MULTIPLE)


def length_stats(
    lengths_by_split: dict[str, list[int]], max_length: int, keep_whole: dict[str, list[int]] | None = None
) -> dict[str, Any]:
    """Per-split token-length percentiles and the share truncated at ``max_length``.

    Args:
        lengths_by_split: split name -> token count of each example (tokens, before truncation).
        max_length: ``training.max_length``, tokens per example after truncation.

    Returns a dict with keys:

    - ``max_length``: the value given (tokens).
    - ``percentile_method``: ``"linear"`` (numpy's default, Hyndman & Fan definition 7).
    - ``splits``: ``{split: {"n", "p50", "p95", "p99", "max", "truncated", "truncated_share"}}``;
      percentiles are floats in tokens, ``max`` an int, ``truncated`` the number of examples
      longer than ``max_length`` and ``truncated_share`` that number / ``n`` (0.0 for an empty
      split, whose percentiles and max are ``None``).
    - ``suggest_max_length``: :func:`suggest_max_length` of the ``train`` lengths (p99 rounded up
      to a multiple of 8), ``None`` when there is no train split; never below ``whole_answers``.
    - ``whole_answers``: with ``keep_whole`` (split -> tokens each example needs so that its
      answer, end token included, is not cut: for a causal LM its full length), the largest of
      them rounded up to a multiple of 8, else ``None``: the suggestion is raised to it, since a
      cut answer loses its end token (a hard fault, see ``data.preprocess``).
    - ``suggest_rule``: that rule in words.
    - ``hard_faults``: always empty here (truncation that removes every supervised token is
      checked where the loss positions are known); ``warnings``: one line per split where some
      examples are truncated.

    Raises:
        TuneproofError: ``max_length`` not a positive integer, or a length that is not a
            non-negative integer (names the split and the item).
    """
    if isinstance(max_length, bool) or not isinstance(max_length, numbers.Integral) or max_length < 1:
        raise TuneproofError(f"length_stats: max_length must be a positive integer (tokens), got {max_length!r}")
    if not isinstance(lengths_by_split, dict):
        raise TuneproofError("length_stats: lengths_by_split must be a dict {split name: [token count, ...]}")
    splits: dict[str, dict[str, Any]] = {}
    warnings: list[str] = []
    for split, values in lengths_by_split.items():
        arr = _as_lengths(split, values)
        if arr.size == 0:
            splits[split] = {
                "n": 0,
                "p50": None,
                "p95": None,
                "p99": None,
                "max": None,
                "truncated": 0,
                "truncated_share": 0.0,
            }
            continue
        p50, p95, p99 = (float(v) for v in np.percentile(arr, [50, 95, 99], method=PERCENTILE_METHOD))
        truncated = int((arr > max_length).sum())
        splits[split] = {
            "n": int(arr.size),
            "p50": p50,
            "p95": p95,
            "p99": p99,
            "max": int(arr.max()),
            "truncated": truncated,
            "truncated_share": truncated / arr.size,
        }
        if truncated:
            warnings.append(
                f"{split}: {truncated} of {arr.size} examples ({truncated / arr.size:.1%}) are longer than "
                f"max_length {max_length} tokens and will be truncated (longest: {int(arr.max())} tokens)"
            )
    suggestion = None
    train = lengths_by_split.get("train")
    if train is not None and splits["train"]["n"]:
        suggestion = suggest_max_length(train)
    whole = None
    if keep_whole:
        needed = [int(v) for name, vals in keep_whole.items() for v in _as_lengths(name, vals)]
        if needed:
            whole = round_up(max(needed))
            suggestion = whole if suggestion is None else max(suggestion, whole)
    rule = "p99 of train token lengths (numpy linear), rounded up to a multiple of 8, at least 8"
    if whole is not None:
        rule += f"; raised to {whole} tokens so that every answer stays whole (longest example, rounded up)"
    return {
        "max_length": int(max_length),
        "percentile_method": PERCENTILE_METHOD,
        "splits": splits,
        "suggest_max_length": suggestion,
        "suggest_rule": rule,
        "whole_answers": whole,
        "hard_faults": [],
        "warnings": warnings,
    }
