"""A refused speed-up's hint says how to turn it off as the study wrote it on: listed in
``training.speedups``, ``training.KEY: false`` changes nothing (the list sets the key), so the hint
says to remove it from the list; it said ``set training.length_grouping: false`` for a study with
``speedups: [length_grouping]``."""

from __future__ import annotations

import contextlib

import pytest
import torch

from test_speedups_auto import _dataset, _lora
from tiny_study import LoopRun
from tuneproof.errors import CheckFailed
from tuneproof.study import Training, turn_off
from tuneproof.training.loop import train


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


def test_a_failing_listed_length_grouping_check_names_the_list(tmp_path):
    model, data = _lora(), _dataset()
    base = model.get_base_model()
    original = base.forward

    def batch_mean(*a, **k):  # logits that depend on the other rows of the micro-batch
        out = original(*a, **k)
        out.logits = out.logits + out.logits.mean(dim=0, keepdim=True)
        return out

    base.forward = batch_mean
    cfg = Training(speedups=["length_grouping"], micro_batch_size=4, max_steps=1, max_length=32)
    with pytest.raises(CheckFailed) as err:
        train(
            model,
            data,
            cfg,
            pad_id=2,
            device=torch.device("cpu"),
            autocast=contextlib.nullcontext,
            run=LoopRun(tmp_path),
        )
    assert str(err.value).startswith("training.length_grouping: an example's loss depends on its batch mates")
    assert err.value.hint == "remove length_grouping from training.speedups (training.speedups: off)"
