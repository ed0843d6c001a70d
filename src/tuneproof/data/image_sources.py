"""Image sources: a folder per class (optionally under split folders) or a CSV/JSONL of
``path,label``, read into :class:`~tuneproof.data.examples.Example` items.

Layouts (``data.sources[].format``):

- ``imagefolder``: ``root/<class>/<image>`` or ``root/<split>/<class>/<image>`` (split folders
  named ``train``, ``validation``/``val``/``dev``, ``test``); files ending ``.png``, ``.jpg``,
  ``.jpeg``, ``.bmp``, ``.gif``, ``.webp``, ``.tif(f)``.
- ``image-csv`` / ``image-jsonl``: one row per image, ``data.fields.image`` (default ``path``)
  and ``data.fields.label`` (default ``label``); relative image paths are resolved from the
  file's folder.

Every image is decoded once here (Pillow, EXIF orientation applied): an unreadable or truncated
file is *named and counted*, not fatal — it is left out and listed in the returned notes (the data
check shows them). An example's ``text`` is the image path relative to the source root (what
the screen and ``outputs.jsonl`` show); ``meta`` holds the absolute path, the sha256 of the file
bytes (part of the data fingerprint), its size, PIL mode and format.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any

from PIL import Image, ImageOps, UnidentifiedImageError

from tuneproof.data.examples import Example
from tuneproof.data.rows import BadRows
from tuneproof.errors import TuneproofError
from tuneproof.io import read_text
from tuneproof.study import ImageTransforms

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
SPLIT_FOLDERS = {"train": "train", "validation": "validation", "val": "validation", "dev": "validation", "test": "test"}
IMAGE_FORMATS = ("imagefolder", "image-csv", "image-jsonl")


def open_image(path: str | Path, max_pixels: int | None = None) -> Image.Image:
    """Decode ``path`` fully, apply its EXIF orientation (``ImageOps.exif_transpose``), return it.

    ``max_pixels``: the largest ``width * height`` decoded (``data.image.max_pixels``); the size is read
    from the file's header first (Pillow opens lazily), so a larger image costs no decoding.

    Raises:
        TuneproofError: missing file, not an image, a truncated / damaged file, or an image above
            ``max_pixels`` (names it, with its size).
    """
    path = Path(path)
    try:
        with Image.open(path) as im:
            if max_pixels is not None and im.width * im.height > max_pixels:
                raise TuneproofError(
                    f"{path}: too large ({im.width} x {im.height} = {im.width * im.height:,} pixels, above "
                    f"data.image.max_pixels {max_pixels:,}): not decoded",
                    hint="resize the image, or raise data.image.max_pixels",
                )
            im.load()  # decode now: a truncated file fails here, not inside the training loop
            out = ImageOps.exif_transpose(im)
            out.load()
            out.format = im.format  # exif_transpose returns a copy without the format
            return out
    except FileNotFoundError:
        raise TuneproofError(f"{path}: image not found") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise TuneproofError(f"{path}: not a readable image ({type(err).__name__}: {str(err)[:160]})") from None


def inside(path: Path, folder: Path) -> bool:
    """Whether ``path``, symlinks resolved, lies inside ``folder`` (symlinks resolved too)."""
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(folder))


def _describe(path: Path, root: Path, max_pixels: int | None) -> dict[str, Any]:
    im = open_image(path, max_pixels)
    data = path.read_bytes()
    return {
        "image": str(path.resolve()),
        "image_sha256": hashlib.sha256(data).hexdigest(),
        "width": im.width,
        "height": im.height,
        "mode": im.mode,
        "format": im.format or path.suffix.lstrip(".").upper(),
        "bytes": len(data),
        "relpath": str(path.relative_to(root)) if path.is_relative_to(root) else str(path),
    }


def _example(path: Path, root: Path, label: str, split: str | None, where: str, max_pixels: int | None) -> Example:
    meta = _describe(path, root, max_pixels)
    return Example(
        id=meta["relpath"], text=meta["relpath"], label=label, target=label, source=where, split=split, meta=meta
    )


def _class_folders(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def _skipped(err: TuneproofError, where: str = "") -> str:
    """The data check's note for an image left out (``skipped ...``: counted and named, not fatal)."""
    what = "too large image" if "data.image.max_pixels" in err.message else "unreadable image"
    return f"skipped {what} {err.message}" + (f" ({where})" if where else "")


def _outside_hint(folder: Path) -> str:
    return (
        f"move the image into {folder} (the data folder), or allow it explicitly: "
        "data.image.allow_outside_paths: true in tuneproof.yaml"
    )


def _limits(image) -> tuple[int, bool]:
    """``(max_pixels, allow_outside_paths)`` of the study's ``data.image`` (the schema's defaults when None)."""
    if image is None:
        image = ImageTransforms()
    return image.max_pixels, image.allow_outside_paths


def load_imagefolder(root: Path, split: str | None, image=None) -> tuple[list[Example], list[str]]:
    """Examples of ``root/[<split>/]<class>/<image>``; returns ``(examples, notes)``.

    ``image``: the study's ``data.image`` (``max_pixels``, ``allow_outside_paths``; defaults when None).

    Raises:
        TuneproofError: root missing, no class folder, a class folder without images, or image files that
            are symlinks resolving outside ``root`` (all named; unless ``data.image.allow_outside_paths``).
    """
    max_pixels, allow_outside = _limits(image)
    if not root.is_dir():
        raise TuneproofError(
            f"{root}: image folder not found", hint="check data.sources[].path (a folder with one sub-folder per class)"
        )
    subdirs = _class_folders(root)
    if not subdirs:
        raise TuneproofError(f"{root}: no class sub-folders (expected {root}/<class>/<image>.png)")
    if split is None and all(d.name.lower() in SPLIT_FOLDERS for d in subdirs):
        groups = [(SPLIT_FOLDERS[d.name.lower()], d) for d in subdirs]  # root/<split>/<class>/...
    else:
        groups = [(split, root)]
    examples: list[Example] = []
    notes: list[str] = []
    outside = BadRows(root)
    outside_rows: list[str] = []
    for split_name, folder in groups:
        classes = _class_folders(folder)
        if not classes:
            raise TuneproofError(f"{folder}: no class sub-folders (expected {folder}/<class>/<image>.png)")
        for cls in classes:
            files = sorted(p for p in cls.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
            if not files:
                raise TuneproofError(
                    f"{cls}: class folder has no images ({', '.join(IMAGE_EXTENSIONS)})",
                    hint="add its images or remove the folder",
                )
            for f in files:
                if allow_outside and not inside(f, root):
                    outside_rows.append(str(f))
                elif not inside(f, root):
                    outside.add(
                        str(f),
                        TuneproofError(
                            f"{f}: a symlink resolving outside the data folder ({os.path.realpath(f)})",
                            hint=_outside_hint(root),
                        ),
                    )
                    continue
                try:
                    examples.append(_example(f, root, cls.name, split_name, str(f), max_pixels))
                except TuneproofError as err:
                    notes.append(_skipped(err))
    outside.check()
    if outside_rows:
        notes.append(_allowed_note(outside_rows, root))
    return examples, notes


def load_image_table(
    path: Path, fmt: str, image_key: str, label_key: str, split: str | None, image=None
) -> tuple[list[Example], list[str]]:
    """Examples of a CSV (header row) or JSONL file naming one image and its label per row.

    Relative image paths are resolved from the file's folder; a path that resolves outside that folder
    (``../``, an absolute path, a symlink) is refused unless ``data.image.allow_outside_paths``.
    ``image``: the study's ``data.image`` (defaults when None).

    Raises:
        TuneproofError: missing file, a missing column/key, or rows with an empty cell, a line that
            is not a JSON object, an image file that does not exist, an image outside the file's folder:
            all of them in one error (:class:`~tuneproof.data.rows.BadRows`: the count, the first 20 with
            ``file:line``, then a file listing all).
    """
    max_pixels, allow_outside = _limits(image)
    text, _ = read_text(path)
    rows: list[tuple[int, dict]] = []
    if fmt == "image-csv":
        reader = csv.DictReader(io.StringIO(text))
        if not reader.fieldnames or image_key not in reader.fieldnames or label_key not in reader.fieldnames:
            raise TuneproofError(
                f"{path}:1: the header must name the columns '{image_key}' and '{label_key}' (got {reader.fieldnames})",
                hint="set data.fields.image / data.fields.label to the column names",
            )
        rows = [(reader.line_num, row) for row in reader]
    else:
        for i, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                row = TuneproofError(f"{path}:{i}: not JSON ({err.msg}, column {err.colno})")
            if not isinstance(row, (dict, TuneproofError)):
                row = TuneproofError(f"{path}:{i}: expected a JSON object per line")
            rows.append((i, row))
    if not rows:
        raise TuneproofError(f"{path}: no rows", hint="the file is empty or holds only a header")
    examples: list[Example] = []
    notes: list[str] = []
    bad = BadRows(path)  # every refused row named in one error (count, first 20, then a file listing all)
    outside_rows: list[str] = []
    for line, row in rows:
        if isinstance(row, TuneproofError):
            bad.add(f"{path}:{line}", row)
            continue
        image_name, label = str(row.get(image_key) or "").strip(), row.get(label_key)
        label = "" if label is None else str(label).strip()
        if not image_name or not label:
            bad.add(f"{path}:{line}", TuneproofError(f"{path}:{line}: empty '{image_key}' or '{label_key}'"))
            continue
        image_path = Path(image_name) if Path(image_name).is_absolute() else path.parent / image_name
        if allow_outside and not inside(image_path, path.parent):
            outside_rows.append(f"{path}:{line}")
        elif not inside(image_path, path.parent):
            real = os.path.realpath(image_path)
            bad.add(
                f"{path}:{line}",
                TuneproofError(
                    f"{path}:{line}: image {image_name!r} is outside the data folder {path.parent}"
                    + (f" (a symlink to {real})" if os.path.islink(image_path) else ""),
                    hint=_outside_hint(path.parent),
                ),
            )
            continue
        if not image_path.is_file():
            bad.add(
                f"{path}:{line}",
                TuneproofError(f"{path}:{line}: image not found: {image_path}", hint="fix the path or remove the row"),
            )
            continue
        try:
            examples.append(_example(image_path, path.parent, label, split, f"{path}:{line}", max_pixels))
        except TuneproofError as err:
            notes.append(_skipped(err, f"{path}:{line}"))
    bad.check()
    if outside_rows:  # allowed, and counted: the data check says which rows read outside the data
        notes.append(_allowed_note(outside_rows, path.parent))
    return examples, notes


def _allowed_note(where: list[str], folder: Path) -> str:
    shown = ", ".join(where[:5]) + (f" and {len(where) - 5} more" if len(where) > 5 else "")
    return (
        f"allowed {len(where)} image(s) outside the data folder {folder} "
        f"(data.image.allow_outside_paths: true): {shown}"
    )


def load_image_source(src, fields, path: Path, image=None) -> tuple[list[Example], list[str]]:
    """Dispatch on ``src.format`` (one of :data:`IMAGE_FORMATS`); ``path`` is already resolved;
    ``image``: the study's ``data.image`` (``max_pixels``, ``allow_outside_paths``)."""
    if src.format == "imagefolder":
        return load_imagefolder(path, src.split, image)
    image_key = getattr(fields, "image", None) or "path"
    label_key = fields.label or "label"
    if not path.is_file():
        raise TuneproofError(f"{path}: file not found", hint="check data.sources[].path")
    return load_image_table(path, src.format, image_key, label_key, src.split, image)
