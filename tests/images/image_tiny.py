"""A tiny image-classification study built in the test: a random ViT (hidden size 32) with its
image processor saved to a local folder, and a folder-per-class dataset of real 8x8 handwritten
digits (scikit-learn's copy of the UCI set) written as PNG files. Nothing is downloaded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml
from PIL import Image


def build_vit(folder: Path, image_size: int = 16, num_labels: int = 3) -> Path:
    import torch
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    cfg = ViTConfig(
        image_size=image_size,
        patch_size=4,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        num_labels=num_labels,
    )
    ViTForImageClassification(cfg).save_pretrained(folder, safe_serialization=True)
    ViTImageProcessor(
        size={"height": image_size, "width": image_size}, image_mean=[0.5] * 3, image_std=[0.5] * 3
    ).save_pretrained(folder)
    return folder


def write_digits(
    root: Path, classes=(0, 1, 7), per_class: int = 12, splits=("train", "validation", "test"), counts=None
) -> Path:
    """``root/<split>/<digit>/<n>.png`` from scikit-learn's digits (grayscale, 8x8, scaled to 0-255)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    counts = counts or {"train": per_class, "validation": 4, "test": 4}
    used = {c: 0 for c in classes}
    for split in splits:
        for c in classes:
            idx = np.flatnonzero(digits.target == c)
            d = root / split / str(c)
            d.mkdir(parents=True, exist_ok=True)
            for _ in range(counts[split]):
                img = (digits.images[idx[used[c]]] * (255 / 16)).astype(np.uint8)
                Image.fromarray(img, mode="L").save(d / f"{used[c]:03d}.png")
                used[c] += 1
    return root


def study_config(base: Path, **training) -> dict:
    t = {
        "seed": 0,
        "max_steps": 6,
        "micro_batch_size": 6,
        "gradient_accumulation_steps": 1,
        "learning_rate": 0.01,
        "lr_scheduler": "constant",
        "warmup_steps": 0,
        "precision": "fp32",
        "checkpoint_every": 3,
    }
    t.update(training)
    return {
        "schema_version": 1,
        "name": "digits",
        "hypothesis": {
            "behaviour": "tell digits apart",
            "task": "image-classification",
            "success": {"metric": "macro_f1", "min_gain": 0.0},
            "guards": [],
        },
        "data": {"sources": [{"path": "images", "format": "imagefolder"}], "image": {"mode": "RGB"}},
        "model": {"base": str(base)},
        "method": {
            "kind": "lora",
            "r": 4,
            "alpha": 8,
            "dropout": 0.0,
            "target_modules": ["q_proj", "v_proj"],
            "modules_to_save": ["classifier"],
        },
        "training": t,
        "eval": {"split": "validation", "batch_size": 4, "bootstrap_iterations": 100},
    }


def make_image_study(folder: Path, base: Path, **training) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    write_digits(folder / "images")
    (folder / "tuneproof.yaml").write_text(yaml.safe_dump(study_config(base, **training), sort_keys=False))
    return folder
