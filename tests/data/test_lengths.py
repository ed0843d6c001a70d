"""Token-length statistics and the max_length suggestion."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tuneproof.data.lengths import length_stats, suggest_max_length
from tuneproof.errors import TuneproofError


def test_length_stats_percentiles_truncation_and_suggestion():
    r = length_stats({"train": list(range(1, 101)), "validation": [10, 20, 200]}, max_length=64)
    train = r["splits"]["train"]
    # numpy linear percentiles of 1..100: p50 50.5, p95 95.05, p99 99.01
    assert train == {
        "n": 100,
        "p50": pytest.approx(50.5),
        "p95": pytest.approx(95.05),
        "p99": pytest.approx(99.01),
        "max": 100,
        "truncated": 36,
        "truncated_share": pytest.approx(0.36),
    }
    assert r["splits"]["validation"]["truncated"] == 1
    assert r["splits"]["validation"]["max"] == 200
    assert r["suggest_max_length"] == 104  # ceil(99.01 / 8) * 8
    assert r["percentile_method"] == "linear" and r["max_length"] == 64
    assert r["warnings"] == [
        "train: 36 of 100 examples (36.0%) are longer than max_length 64 "
        "tokens and will be truncated (longest: 100 tokens)",
        "validation: 1 of 3 examples (33.3%) are longer than max_length 64 "
        "tokens and will be truncated (longest: 200 tokens)",
    ]
    assert r["hard_faults"] == []
    json.dumps(r)


def test_suggest_max_length_rule():
    assert suggest_max_length([16] * 10) == 16  # already a multiple of 8
    assert suggest_max_length([17] * 10) == 24
    assert suggest_max_length([1, 2, 3]) == 8  # at least 8
    assert suggest_max_length(np.arange(1000, dtype=np.int32)) == 992  # p99 = 989.01 -> 992
    assert (
        suggest_max_length([30] * 99 + [500]) == 40
    )  # p99 = 30 + 0.01 * 470 = 34.7: one outlier in 100 barely moves it


def test_empty_and_missing_train_split():
    r = length_stats({"validation": [], "test": [3]}, max_length=8)
    assert r["splits"]["validation"] == {
        "n": 0,
        "p50": None,
        "p95": None,
        "p99": None,
        "max": None,
        "truncated": 0,
        "truncated_share": 0.0,
    }
    assert r["suggest_max_length"] is None and r["warnings"] == []


@pytest.mark.parametrize(
    "lengths, max_length, message",
    [
        ({"train": [1, -2]}, 8, r"split 'train': item 1 is -2, not a non-negative integer"),
        ({"train": [1, 2.5]}, 8, r"item 1 is 2.5"),
        ({"train": [True]}, 8, r"item 0 is True"),
        ({"train": "12"}, 8, r"must be a list of integers, got str"),
        ({"train": [1]}, 0, r"max_length must be a positive integer \(tokens\), got 0"),
        ([1, 2], 8, r"lengths_by_split must be a dict"),
    ],
)
def test_bad_input_is_a_user_error(lengths, max_length, message):
    with pytest.raises(TuneproofError, match=message):
        length_stats(lengths, max_length)
    with pytest.raises(TuneproofError, match="no token lengths"):
        suggest_max_length([])
