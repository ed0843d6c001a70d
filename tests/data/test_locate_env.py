"""A data root the user names ($TUNEPROOF_DATA, like --data) must hold the data: never a silent
fall-back to another root."""

from __future__ import annotations

import pytest


def test_a_wrong_tuneproof_data_is_an_error_not_ignored(tmp_path, monkeypatch):
    from tuneproof.data.locate import find_data_root
    from tuneproof.errors import TuneproofError

    monkeypatch.setenv("TUNEPROOF_DATA", str(tmp_path))
    with pytest.raises(TuneproofError, match=r"\$TUNEPROOF_DATA .*: missing snips/") as err:
        find_data_root(None, "snips")
    assert "point $TUNEPROOF_DATA at the folder holding banking77/ and snips/" in err.value.hint


def test_an_explicit_data_root_wins_over_the_environment(tmp_path, monkeypatch, shared_data):
    from tuneproof.data.locate import find_data_root

    monkeypatch.setenv("TUNEPROOF_DATA", str(tmp_path))  # wrong, but --data is given and complete
    assert find_data_root(shared_data, "snips") == shared_data
