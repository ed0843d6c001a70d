"""The fault-injection suite (docs/CASES.md, faults of the machine and of the input). Each test carries
``@pytest.mark.fault("kind: what")``; ``python -m tests.faults.run_all`` runs every such test in tests/ and prints tried
/ survived per kind. Tests marked ``fault_full`` (real tmpfs disk-full / read-only mounts, kill -9 at many
moments) run only with ``TUNEPROOF_FAULTS_FULL=1`` (``run_all --full`` sets it)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))  # tiny_study
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "images"))  # image_tiny


def pytest_collection_modifyitems(config, items):
    if os.environ.get("TUNEPROOF_FAULTS_FULL") == "1":
        return
    skip = pytest.mark.skip(reason="full fault set: run `python -m tests.faults.run_all --full`")
    for item in items:
        if item.get_closest_marker("fault_full"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory):
    """The tiny local Llama + tokenizer of tests/training (built once)."""
    from tiny_study import build_base

    return build_base(tmp_path_factory.mktemp("tiny-llama-faults"))


@pytest.fixture(scope="session")
def tiny_vit(tmp_path_factory):
    """The tiny random ViT + image processor of tests/images (built once)."""
    from image_tiny import build_vit

    return build_vit(tmp_path_factory.mktemp("tiny-vit-faults"))


@pytest.fixture()
def one_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def evaluated(tiny_base, tmp_path_factory) -> dict:
    """The tiny extraction study after data check, baseline, train and eval (copy it to change it)."""
    from tiny_study import make_study
    from tuneproof.context import StudyContext
    from tuneproof.recipes.evaluate import run_eval
    from tuneproof.recipes.train import run_train

    study = make_study(tmp_path_factory.mktemp("evidence") / "s", tiny_base, max_steps=4)
    ctx = StudyContext.open(study)
    try:
        train = run_train(ctx)
        ev = run_eval(ctx, train)
    finally:
        ctx.registry.close()
    return {"dir": study, "train": train, "eval": ev}
