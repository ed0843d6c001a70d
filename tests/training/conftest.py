"""Fixtures of the training tests: the tiny local base model (built once per session)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread in these tests: the tiny models run 3x faster on a busy machine, and
    every process of the resume tests (this one and the `tuneproof` subprocesses, which get
    OMP_NUM_THREADS=1) computes with the same thread count, so floats compare bit for bit.
    Restored after each module (other tests compare against processes with the default count)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory):
    from tiny_study import build_base

    return build_base(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def interrupted_proc(tiny_base, tmp_path_factory):
    """``(study, completed process)``: a study whose 8-step run was stopped by SIGTERM after step 5
    in its own ``tuneproof train`` process (checkpoints step-000004/ and step-000005/, safetensors +
    JSON). Tests work on copies."""
    from tiny_study import make_study, train_with_signal

    study = make_study(tmp_path_factory.mktemp("interrupted") / "s", tiny_base)
    proc = train_with_signal(study, 5, "SIGTERM")
    assert proc.returncode == 143, proc.stdout + proc.stderr  # SIGTERM: 128 + 15
    return study, proc


@pytest.fixture(scope="session")
def interrupted(interrupted_proc):
    """The study of :func:`interrupted_proc`."""
    return interrupted_proc[0]
