"""A refused speed-up's hint says how to turn it off as the study wrote it on: listed in
``training.speedups``, ``training.KEY: false`` changes nothing (the list sets the key), so the hint
says to remove it from the list; it said ``set training.length_grouping: false`` for a study with
``speedups: [length_grouping]``. The loop's refusal carries it: tests/training/test_speedups_auto.py."""

from __future__ import annotations

from tuneproof.study import Training, turn_off


def test_the_hint_follows_how_the_key_was_turned_on():
    assert turn_off(Training(speedups=["length_grouping"]), "length_grouping") == (
        "remove length_grouping from training.speedups (training.speedups: off)"
    )
    assert turn_off(Training(speedups=["length_grouping", "chunked_loss"]), "length_grouping") == (
        "remove length_grouping from training.speedups (training.speedups: [chunked_loss])"
    )
    assert turn_off(Training(length_grouping=True), "length_grouping") == "set training.length_grouping: false"
    # what the old hint asked for does not turn a listed speed-up off
    assert Training(speedups=["length_grouping"], length_grouping=False).length_grouping is True
