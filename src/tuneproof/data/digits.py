"""A small real image data set that installs from the package registries: the 8x8 handwritten
digits that ship inside scikit-learn (``sklearn.datasets.load_digits``: 1,797 images, 10 classes,
a copy of the test part of the UCI "Optical Recognition of Handwritten Digits" set, Alpaydin &
Kaynak 1998, CC BY 4.0), written as a folder-per-class PNG layout for the image quickstart.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

ATTRIBUTION = (
    "UCI Optical Recognition of Handwritten Digits (E. Alpaydin, C. Kaynak, 1998; CC BY 4.0), "
    "the copy bundled with scikit-learn (sklearn.datasets.load_digits)"
)


def write_digits_folder(root: Path, *, scale: int = 2) -> dict[str, int]:
    """Write ``root/<digit>/<index>.png`` (grayscale, ``8 * scale`` pixels square, values 0-255).

    Returns images per class. Idempotent: files are rewritten with the same bytes.
    """
    from PIL import Image  # noqa: PLC0415 - PIL loads only when write_digits_folder() runs
    from sklearn.datasets import load_digits  # noqa: PLC0415 - sklearn.datasets loads only when write_digits_folder() runs

    digits = load_digits()
    counts: dict[str, int] = {}
    for i, (img, label) in enumerate(zip(digits.images, digits.target)):
        d = Path(root) / str(int(label))
        d.mkdir(parents=True, exist_ok=True)
        pixels = (img * (255 / 16)).round().astype(np.uint8)
        Image.fromarray(pixels, mode="L").resize((8 * scale, 8 * scale), Image.NEAREST).save(d / f"{i:04d}.png")
        counts[str(int(label))] = counts.get(str(int(label)), 0) + 1
    (Path(root) / "SOURCE.md").write_text(f"# Source\n\n{ATTRIBUTION}\n", encoding="utf-8")
    return counts
