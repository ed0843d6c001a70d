"""Fixtures of the training tests: the tiny local base model (built once per session)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import tiny_fixtures  # noqa: E402  (on sys.path: tests/training)

# the fixtures shared with tests/training, tests/distributed and tests/storage
one_thread, tiny_base = tiny_fixtures.one_thread, tiny_fixtures.tiny_base


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
