"""Shared fixtures: tiny tokenizers and models built in the test itself (no downloads), and the
paths of the real data and real models."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = (
    Path(os.environ["TUNEPROOF_DATA"]) if os.environ.get("TUNEPROOF_DATA") else REPO.parent / "shared" / "data"
)

from tinymodels import CHATML, CORPUS, make_llama, make_tokenizer  # noqa: E402,F401


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return make_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer):
    """A local model folder (tiny random Llama + tokenizer) usable as ``model.base``."""
    d = tmp_path_factory.mktemp("tiny-llama")
    make_llama(len(tiny_tokenizer)).save_pretrained(d, safe_serialization=True)
    tiny_tokenizer.save_pretrained(d)
    return d


@pytest.fixture()
def shared_data() -> Path:
    if not (SHARED_DATA / "snips").is_dir():
        pytest.skip(f"real data not found at {SHARED_DATA}")
    return SHARED_DATA
