from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(scope="session")
def tiny_vit(tmp_path_factory):
    from image_tiny import build_vit

    return build_vit(tmp_path_factory.mktemp("tiny-vit"))
