"""A check that refuses on one rank (CheckFailed, exit 3: listed length grouping whose check fails on
that rank's first micro-batch) stays a refused check after the launch, with the rank's hint: the
launcher turned it into RankFailed (exit 1) and dropped the hint. No processes started."""

from __future__ import annotations

import json

import pytest

from tuneproof.errors import CheckFailed
from tuneproof.recipes.torchrun import rank_failure, rank_hint, write_error

pytestmark = pytest.mark.slow  # torchrun on 2 gloo processes: left out of the inner loop (`pytest -m "not slow"`)

HINT = "remove length_grouping from training.speedups (training.speedups: off)"


def test_a_check_refused_on_one_rank_is_a_check_with_that_ranks_hint(tmp_path):
    try:
        raise CheckFailed("training.length_grouping: an example's loss depends on its batch mates", hint=HINT)
    except CheckFailed as err:
        write_error(tmp_path, 1, err)
    rank1 = json.loads((tmp_path / "rank-1.error.json").read_text())
    assert (rank1["exit_code"], rank1["hint"]) == (3, HINT)
    (tmp_path / "rank-0.error.json").write_text(
        json.dumps(
            {"rank": 0, "type": "RuntimeError", "message": "Connection closed by peer", "time": rank1["time"] + 2}
        )
    )
    kind, message = rank_failure(tmp_path, 2, 600)
    assert kind == "check"
    assert message == (
        "rank 1 refused: training.length_grouping: an example's loss depends on its batch mates "
        f"(log: {tmp_path / 'rank-1.log'})"
    )
    assert rank_hint(tmp_path, message) == HINT


def test_any_other_error_stays_a_failure_without_a_hint(tmp_path):
    try:
        raise ValueError("bad row 17")
    except ValueError as err:
        write_error(tmp_path, 1, err)
    kind, message = rank_failure(tmp_path, 2, 600)
    assert kind == "failed" and message.startswith("rank 1 failed: ValueError: bad row 17")
    assert rank_hint(tmp_path, message) is None
    assert rank_hint(tmp_path, "torchrun failed before any rank reported an error") is None


@pytest.mark.parametrize("older", [{}, {"exit_code": None}])
def test_an_error_file_of_an_older_version_is_a_failure(tmp_path, older):
    (tmp_path / "rank-0.error.json").write_text(
        json.dumps({"rank": 0, "type": "CheckFailed", "message": "x", "time": 1.0, **older})
    )
    (tmp_path / "rank-1.error.json").write_text(
        json.dumps({"rank": 1, "type": "KeyboardInterrupt", "message": "", "time": 2.0})
    )
    assert rank_failure(tmp_path, 2, 600)[0] == "failed"
