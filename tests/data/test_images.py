"""Image audit on sklearn's digits rendered to PNG; class 7 saved as larger RGB must be flagged."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from sklearn.datasets import load_digits

from tuneproof.data.images import audit_images, load_image_csv, load_image_folder
from tuneproof.errors import TuneproofError

PER_CLASS = 5


@pytest.fixture(scope="module")
def digits_root(tmp_path_factory) -> Path:
    """root/<digit>/<i>.png: 16x16 grayscale (L) PNGs, except class 7: 32x32 RGB."""
    root = tmp_path_factory.mktemp("digits")
    digits = load_digits()
    seen: dict[int, int] = {}
    for img, y in zip(digits.images, digits.target):
        y = int(y)
        if seen.get(y, 0) >= PER_CLASS:
            continue
        seen[y] = seen.get(y, 0) + 1
        pil = Image.fromarray((img * 255 / 16).astype(np.uint8), mode="L").resize((16, 16), Image.NEAREST)
        if y == 7:
            pil = pil.convert("RGB").resize((32, 32), Image.NEAREST)
        (root / str(y)).mkdir(exist_ok=True)
        pil.save(root / str(y) / f"{seen[y]:02d}.png")
    return root


def to_chw(img: Image.Image) -> np.ndarray:
    """A typical hand-written transform: float32 in [0, 1], CHW, no resize."""
    arr = np.asarray(img, dtype=np.float32) / 255.0
    return arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)


def test_load_image_folder_lists_every_class(digits_root):
    items = load_image_folder(digits_root)
    assert len(items) == 10 * PER_CLASS
    assert [label for _, label in items[::PER_CLASS]] == [str(d) for d in range(10)]
    assert items[0][0].endswith("0/01.png")


def test_raw_audit_flags_the_rgb_larger_class(digits_root):
    r = audit_images(load_image_folder(digits_root))
    assert r["n"] == 50
    seven, three = r["categories"]["7"], r["categories"]["3"]
    assert seven["modes"] == {"RGB": 5} and seven["channels"] == {"3": 5} and seven["formats"] == {"PNG": 5}
    assert seven["width"] == {"min": 32.0, "median": 32.0, "max": 32.0}
    assert three["modes"] == {"L": 5} and three["channels"] == {"1": 5}
    assert three["height"]["median"] == 16.0 and three["aspect_ratio"]["median"] == 1.0
    assert three["after_transform"] is None
    assert [(f["category"], f["kind"], f["severity"]) for f in r["flags"]] == [
        ("7", "mode", "warning"),
        ("7", "width", "warning"),
        ("7", "height", "warning"),
    ]
    assert r["warnings"][0] == "category '7': modes {'RGB': 5} vs the other categories {'L': 45} (distance 1.00)"
    assert r["warnings"][1] == "category '7': median width 32 px vs 16 px in the other categories (2.00x)"
    assert r["hard_faults"] == []
    json.dumps(r)


def test_transform_output_that_differs_by_category_is_a_hard_fault(digits_root):
    r = audit_images(load_image_folder(digits_root), transform=to_chw)
    assert r["categories"]["7"]["after_transform"] == {
        "outputs": {"array float32 3x32x32": 5},
        "max_abs_value": {"median": 1.0, "max": 1.0},
    }
    assert r["categories"]["0"]["after_transform"]["outputs"] == {"array float32 1x16x16": 5}
    hard = [(f["category"], f["kind"]) for f in r["flags"] if f["severity"] == "hard"]
    assert hard == [("7", "transform_output")]
    assert r["hard_faults"] == [
        "category '7': transform gives 'array float32 3x32x32' vs 'array float32 1x16x16' in the other categories"
    ]


def test_transform_that_normalises_form_clears_the_output_flag(digits_root):
    r = audit_images(load_image_folder(digits_root), transform=lambda im: to_chw(im.convert("L").resize((16, 16))))
    assert r["hard_faults"] == []
    assert {c["after_transform"]["outputs"]["array float32 1x16x16"] for c in r["categories"].values()} == {PER_CLASS}
    assert len(r["warnings"]) == 3  # the raw form of class 7 is still reported


def test_value_scale_difference_after_transform_is_a_hard_fault(digits_root):
    def buggy(im: Image.Image) -> np.ndarray:  # forgets to scale the RGB branch to [0, 1]
        if im.mode == "RGB":
            return np.asarray(im.convert("L").resize((16, 16)), dtype=np.float32)[None]
        return to_chw(im)

    r = audit_images(load_image_folder(digits_root), transform=buggy)
    assert [(f["category"], f["kind"]) for f in r["flags"] if f["severity"] == "hard"] == [("7", "value_scale")]
    assert r["categories"]["7"]["after_transform"]["max_abs_value"] == {"median": 255.0, "max": 255.0}
    assert r["hard_faults"] == [
        "category '7': median largest |value| after the transform 255 vs 1 in the other categories"
    ]


def test_pil_output_signature(digits_root):
    r = audit_images(load_image_folder(digits_root), transform=lambda im: im.convert("RGB"))
    assert r["categories"]["1"]["after_transform"]["outputs"] == {"PIL RGB 16x16": 5}
    assert [(f["category"], f["kind"]) for f in r["flags"] if f["severity"] == "hard"] == [("7", "transform_output")]


def test_csv_items_and_errors(digits_root, tmp_path):
    csv_path = tmp_path / "items.csv"
    csv_path.write_text(f"path,label\n{digits_root / '7' / '01.png'},seven\n", encoding="utf-8")
    items = load_image_csv(csv_path)
    assert items == [(str(digits_root / "7" / "01.png"), "seven")]
    bad = tmp_path / "bad.csv"
    bad.write_text(f"path,label\n{digits_root / '7' / '01.png'},seven\nmissing.png,x\n", encoding="utf-8")
    with pytest.raises(TuneproofError, match=r"bad.csv:3: image not found: .*missing.png"):
        load_image_csv(bad)
    nohead = tmp_path / "nohead.csv"
    nohead.write_text("file,class\na.png,x\n", encoding="utf-8")
    with pytest.raises(TuneproofError, match=r"nohead.csv:1: the header must name the columns 'path' and 'label'"):
        load_image_csv(nohead)
    # relative paths resolve from the CSV's folder
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.png").write_bytes((digits_root / "3" / "01.png").read_bytes())
    relcsv = tmp_path / "rel.csv"
    relcsv.write_text("path,label\nsub/a.png,three\n", encoding="utf-8")
    assert load_image_csv(relcsv) == [(str(tmp_path / "sub" / "a.png"), "three")]


def test_folder_errors_name_the_file(tmp_path):
    with pytest.raises(TuneproofError, match="image folder not found"):
        load_image_folder(tmp_path / "nope")
    with pytest.raises(TuneproofError, match="no class sub-folders"):
        load_image_folder(tmp_path)
    (tmp_path / "cat").mkdir()
    with pytest.raises(
        TuneproofError, match=r"cat: class folder has no .png/.jpg/.jpeg/.bmp/.gif/.webp/.tif/.tiff images"
    ):
        load_image_folder(tmp_path)
    Image.new("L", (4, 4)).save(tmp_path / "cat" / "ok.png")
    (tmp_path / "cat" / "broken.png").write_bytes(b"not a png at all")
    with pytest.raises(TuneproofError, match=r"broken.png: not a readable image"):
        load_image_folder(tmp_path)


def test_truncated_image_and_failing_transform_name_the_file(tmp_path):
    good = tmp_path / "good.png"
    Image.fromarray(np.arange(64 * 64, dtype=np.uint32).reshape(64, 64).astype(np.uint8)).save(good)
    cut = tmp_path / "cut.png"
    cut.write_bytes(good.read_bytes()[:-40])  # header intact, data truncated
    with pytest.raises(TuneproofError, match=r"cut.png: not a readable image"):
        audit_images([(good, "a"), (cut, "b")])
    with pytest.raises(TuneproofError, match=r"good.png: the transform failed \(ZeroDivisionError"):
        audit_images([(good, "a")], transform=lambda im: 1 / 0)
    with pytest.raises(
        TuneproofError, match=r"good.png: transform output of type str is neither a PIL image nor an array"
    ):
        audit_images([(good, "a")], transform=lambda im: "x")
    with pytest.raises(TuneproofError, match="no images"):
        audit_images([])
