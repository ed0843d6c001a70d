"""Fixtures of the distributed tests: the tiny local base model of tests/training (built once per
session) and the helpers that run ``tuneproof`` (and torchrun under it) in a new process."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import tiny_fixtures  # noqa: E402  (on sys.path: tests/training)

# the fixtures shared with tests/training, tests/distributed and tests/storage
one_thread, tiny_base = tiny_fixtures.one_thread, tiny_fixtures.tiny_base
