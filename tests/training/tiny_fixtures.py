"""The fixtures every suite that runs the tiny study shares (tests/training, tests/distributed,
tests/storage import them into their conftest.py): one intra-op thread per module and the tiny
local base model of :mod:`tiny_study`, built once per session and folder."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread in these tests: the tiny models run 3x faster on a busy machine, and
    every process (this one and the `tuneproof` subprocesses and torchrun ranks, which get
    OMP_NUM_THREADS=1) computes with the same thread count, so floats compare bit for bit.
    Restored after each module (other tests compare against processes with the default count)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory):
    """The tiny local Llama + word-level tokenizer folder of :func:`tiny_study.build_base`."""
    from tiny_study import build_base

    return build_base(tmp_path_factory.mktemp("tiny-llama"))
