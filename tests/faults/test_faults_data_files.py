"""Data files stay inside the data (docs/CASES.md, faults of the input): an image row whose path leads out of
the source's folder (``../``, an absolute path, a symlink) is refused naming the row, unless
``data.image.allow_outside_paths``; an image above ``data.image.max_pixels`` is skipped and named from its
header, never decoded."""

from __future__ import annotations

import json
import os
import struct
import zlib

import pytest
import yaml
from PIL import Image, ImageFile

from image_tiny import make_image_study
from tuneproof.cli import main
from tuneproof.errors import TuneproofError
from tuneproof.registry import Registry

pytestmark = pytest.mark.filterwarnings("ignore")


def cli(args, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(args)
    out = capsys.readouterr()
    return exit_.value.code, out.out + out.err


def _edit(study, edit):
    raw = yaml.safe_load((study / "tuneproof.yaml").read_text())
    edit(raw)
    (study / "tuneproof.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))


def _table_study(tmp_path, tiny_vit, fmt, extra_rows):
    """The digits study read from one image-csv / image-jsonl file: its 36 train images + ``extra_rows``."""
    study = make_image_study(tmp_path / "s", tiny_vit)
    rows = [
        (p.relative_to(study).as_posix(), p.parent.name) for p in sorted((study / "images" / "train").rglob("*.png"))
    ]
    rows += extra_rows
    if fmt == "image-csv":
        (study / "train.csv").write_text("path,label\n" + "".join(f"{p},{c}\n" for p, c in rows))
        name = "train.csv"
    else:
        (study / "train.jsonl").write_text("".join(json.dumps({"path": p, "label": c}) + "\n" for p, c in rows))
        name = "train.jsonl"
    _edit(
        study,
        lambda raw: raw["data"].update(
            sources=[
                {"path": name, "format": fmt, "split": "train"},
                {"path": "images/validation", "format": "imagefolder", "split": "validation"},
                {"path": "images/test", "format": "imagefolder", "split": "test"},
            ]
        ),
    )
    return study, study / name


def _ctx(study):
    from tuneproof.context import StudyContext

    return StudyContext.open(study)


@pytest.mark.fault("input: a data row naming a file outside the data")
@pytest.mark.parametrize("fmt", ["image-csv", "image-jsonl"])
def test_image_rows_leading_out_of_the_data_folder_are_refused_naming_each_row(tmp_path, tiny_vit, capsys, fmt):
    outside = tmp_path / "outside.png"
    Image.new("L", (8, 8), 255).save(outside)
    passwd = os.path.relpath("/etc/passwd", tmp_path / "s")  # ../../../../etc/passwd
    study, table = _table_study(
        tmp_path,
        tiny_vit,
        fmt,
        [("../outside.png", "0"), (str(outside), "1"), ("images/link.png", "7"), (passwd, "0")],
    )
    (study / "images" / "link.png").symlink_to(outside)
    opened = []
    real_open = Image.open
    Image.open = lambda fp, *a, **k: opened.append(str(fp)) or real_open(fp, *a, **k)
    try:
        with pytest.raises(TuneproofError) as err:
            _ctx(study).all_splits
    finally:
        Image.open = real_open
    assert not [p for p in opened if "outside" in p or "passwd" in p]  # refused before any is opened
    msg = str(err.value.message)
    first = 38 if fmt == "image-csv" else 37  # the row after the 36 images (and the csv header)
    assert msg.startswith(f"{table}: 4 rows refused: ")
    assert f"{table}:{first}: image '../outside.png' is outside the data folder {study}" in msg
    assert f"{table}:{first + 1}: image '{outside}' is outside the data folder {study}" in msg
    assert (
        f"{table}:{first + 2}: image 'images/link.png' is outside the data folder {study} (a symlink to {outside})"
        in msg
    )
    assert f"{table}:{first + 3}: image '{passwd}' is outside the data folder {study}" in msg
    assert "data.image.allow_outside_paths: true" in err.value.hint

    code, out = cli(["data", "check", "--study", str(study)], capsys)
    assert code == 2 and f"error: {table}: 4 rows refused" in out and "Traceback" not in out, out
    assert not (study / "runs").exists() or Registry(study).list() == []

    # allowed explicitly: the three images outside are read (36 + 3), the text file is named unreadable
    _edit(study, lambda raw: raw["data"]["image"].update(allow_outside_paths=True))
    ctx = _ctx(study)
    assert len(ctx.split("train")) == 39
    skipped = [r for r in ctx.repairs if r.startswith("skipped unreadable image")]
    assert len(skipped) == 1 and "passwd" in skipped[0] and f"({table}:{first + 3})" in skipped[0]
    rows = ", ".join(f"{table}:{first + k}" for k in range(4))
    allowed = f"allowed 4 image(s) outside the data folder {study} (data.image.allow_outside_paths: true): {rows}"
    assert allowed in ctx.repairs
    code, out = cli(["data", "check", "--study", str(study)], capsys)  # the data check says them
    assert code == 0 and allowed in " ".join(out.split()), out


@pytest.mark.fault("input: a data row naming a file outside the data")
def test_an_image_folder_with_a_symlink_out_of_the_folder_is_refused_naming_it(tmp_path, tiny_vit, capsys):
    study = make_image_study(tmp_path / "s", tiny_vit)
    outside = tmp_path / "elsewhere" / "x.png"
    outside.parent.mkdir()
    Image.new("L", (8, 8), 0).save(outside)
    link = study / "images" / "train" / "0" / "zz-link.png"
    link.symlink_to(outside)
    inner = study / "images" / "train" / "1" / "zz-inner.png"  # a symlink inside the folder stays accepted
    inner.symlink_to(study / "images" / "train" / "1" / "000.png")
    code, out = cli(["data", "check", "--study", str(study)], capsys)
    assert code == 2, out
    assert f"error: {link}: a symlink resolving outside the data folder ({outside})" in out
    assert "data.image.allow_outside_paths: true" in out and "Traceback" not in out
    link.unlink()
    assert len(_ctx(study).split("train")) == 37


def _huge_png(path, width: int, height: int) -> None:
    """A grey PNG of ``width x height`` written chunk by chunk: ~100 KB on disk for 100 megapixels."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    raw = zlib.compress(b"\0" * ((width + 1) * height), 9)  # filter byte + 8-bit grey per row
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", raw) + chunk(b"IEND", b""))


@pytest.mark.fault("input: an image too large to decode")
def test_a_100_megapixel_png_is_skipped_from_its_header_and_named(tmp_path, tiny_vit, capsys, monkeypatch):
    study = make_image_study(tmp_path / "s", tiny_vit)
    big = study / "images" / "train" / "0" / "zz-big.png"
    _huge_png(big, 10_000, 10_000)
    assert big.stat().st_size < 200_000
    decoded = []
    real_load = ImageFile.ImageFile.load
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda im: decoded.append(im.size) or real_load(im))
    ctx = _ctx(study)
    assert len(ctx.split("train")) == 36 and (10_000, 10_000) not in decoded
    assert ctx.repairs == [
        f"skipped too large image {big}: too large (10000 x 10000 = 100,000,000 pixels, above "
        "data.image.max_pixels 50,000,000): not decoded"
    ]
    monkeypatch.undo()
    # the limit is the study's; the data check names the file and goes on
    study = make_image_study(tmp_path / "s2", tiny_vit)
    _edit(study, lambda raw: raw["data"]["image"].update(max_pixels=64))  # the digits are 8 x 8
    nine = study / "images" / "train" / "7" / "zz-9x9.png"
    Image.new("L", (9, 9), 0).save(nine)
    code, out = cli(["data", "check", "--study", str(study)], capsys)
    assert code == 0, out
    assert (
        f"skipped too large image {nine}: too large (9 x 9 = 81 pixels, above data.image.max_pixels 64): not decoded"
        in " ".join(out.split())
    )
    assert Registry(study).latest("data-check").summary["sizes"]["train"] == 36


@pytest.mark.fault("input: a data row naming a file outside the data")
def test_a_bundle_example_naming_an_image_outside_the_bundle_is_not_read(tmp_path):
    from tuneproof.modalities.image import bundle_image

    bundle = tmp_path / "bundle"
    (bundle / "verify" / "images").mkdir(parents=True)
    Image.new("L", (8, 8), 0).save(bundle / "verify" / "images" / "000-a.png")
    (tmp_path / "outside.png").write_bytes(b"x")
    (bundle / "verify" / "images" / "001-link.png").symlink_to(tmp_path / "outside.png")
    assert bundle_image(bundle, "verify/images/000-a.png") == bundle / "verify" / "images" / "000-a.png"
    for name in ("../outside.png", str(tmp_path / "outside.png"), "verify/images/001-link.png"):
        with pytest.raises(TuneproofError) as err:
            bundle_image(bundle, name)
        assert err.value.message == (
            f"{bundle / 'verify' / 'examples.jsonl'}: image {name!r} is outside the bundle {bundle}; not read"
        )
