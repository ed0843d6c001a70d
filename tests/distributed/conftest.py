"""Fixtures of the distributed tests: the tiny local base model of tests/training (built once per
session) and the helpers that run ``tuneproof`` (and torchrun under it) in a new process."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread, like the ranks (OMP_NUM_THREADS=1), so single-process references compare closely."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory):
    from tiny_study import build_base

    return build_base(tmp_path_factory.mktemp("tiny-llama"))
