"""`tuneproof quickstart --task image-classification --fast`: real digits from scikit-learn, the
seeded ViT from a config, every protocol step including the preflight and the verified export."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_image_quickstart_fast_runs_every_step(tmp_path):
    from tuneproof.recipes.quickstart import run_quickstart
    from tuneproof.registry import Registry

    out = run_quickstart(tmp_path / "qs", task="image-classification", fast=True)
    assert list(out["runs"]) == ["data-check", "baseline", "preflight", "train", "eval", "compare", "export", "report"]
    reg = Registry(tmp_path / "qs")
    assert all(
        reg.get(out["runs"][k]).status == "completed" for k in ("data-check", "baseline", "preflight", "train", "eval")
    )
    counts = {p.name: len(list(p.glob("*.png"))) for p in (tmp_path / "qs" / "images").iterdir() if p.is_dir()}
    assert sum(counts.values()) == 1797 and sorted(counts) == [str(d) for d in range(10)]
    assert reg.get(out["runs"]["train"]).summary["budget"]["total_steps"] == 20
    man = json.loads((tmp_path / "qs" / "exports" / out["runs"]["train"] / "manifest.json").read_text())
    assert man["procedure"]["model_kind"] == "image-classification" and man["labels"] == [str(d) for d in range(10)]
    assert (tmp_path / "qs" / "dossier.md").is_file()
