"""Image-classification audit (docs/PROTOCOL.md step 3: image sizes and the transforms each
category goes through).

A category whose images differ in form from the others (another colour mode, file format or
size) lets a classifier learn the form instead of the content: the "shortcut learning" of
Geirhos et al. (2020), *Shortcut learning in deep neural networks*, Nature Machine
Intelligence 2, 665-673. The audit measures each category before and after the study's
transform and flags such differences with the rules stated in :func:`audit_images`.
"""

from __future__ import annotations

import csv
import io
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from tuneproof.data.image_sources import IMAGE_EXTENSIONS
from tuneproof.data.rows import BadRows
from tuneproof.errors import TuneproofError
from tuneproof.io import read_text

SIZE_RATIO_FLAG = 1.5  # median width/height/aspect ratio of a category vs the other categories
DISTRIBUTION_DISTANCE_FLAG = 0.25  # total variation distance of mode / format distributions
VALUE_SCALE_FLAG = 10.0  # median per-image largest |value| after the transform, category vs the others


# --------------------------------------------------------------------------- loading
def load_image_folder(root: str | Path) -> list[tuple[str, str]]:
    """``(path, label)`` items of a folder-per-class dataset ``root/<class>/<image>`` (the files
    ending in one of :data:`tuneproof.data.image_sources.IMAGE_EXTENSIONS`, the one list of them).

    Labels are the sub-folder names; items are sorted by label, then file name. Files with
    other extensions are ignored. Each image's header is read (``PIL.Image.open``) so a file
    that is not an image fails here, naming it.

    Raises:
        TuneproofError: ``root`` missing or not a folder, no class sub-folder, a class folder
            without images, or a file that PIL cannot identify as an image.
    """
    root = Path(root)
    if not root.exists():
        raise TuneproofError(f"{root}: image folder not found", hint="check data.sources[].path in the study file")
    if not root.is_dir():
        raise TuneproofError(f"{root}: not a folder (expected root/<class>/<image>.png|jpg)")
    class_dirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not class_dirs:
        raise TuneproofError(f"{root}: no class sub-folders (expected root/<class>/<image>.png|jpg)")
    items: list[tuple[str, str]] = []
    for d in class_dirs:
        files = sorted(p for p in d.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
        if not files:
            raise TuneproofError(
                f"{d}: class folder has no {'/'.join(IMAGE_EXTENSIONS)} images", hint="remove it or add its images"
            )
        for f in files:
            _check_header(f)
            items.append((str(f), d.name))
    return items


def load_image_csv(path: str | Path) -> list[tuple[str, str]]:
    """``(path, label)`` items from a CSV with header columns ``path`` and ``label``.

    Relative image paths are resolved from the CSV's folder. Each image's header is read.

    Raises:
        TuneproofError: CSV missing or not UTF-8, no ``path``/``label`` column, rows with an empty
            cell or a missing image (all of them, count and first 5 lines), an unreadable image
            (names the CSV line and the image).
    """
    path = Path(path)
    text, _ = read_text(path)
    reader = csv.DictReader(io.StringIO(text))
    if not reader.fieldnames or "path" not in reader.fieldnames or "label" not in reader.fieldnames:
        raise TuneproofError(f"{path}:1: the header must name the columns 'path' and 'label' (got {reader.fieldnames})")
    items = []
    bad = BadRows(path)  # every refused row named in one error
    for row in reader:
        line = reader.line_num
        image, label = (row.get("path") or "").strip(), (row.get("label") or "").strip()
        if not image or not label:
            bad.add(f"{path}:{line}", TuneproofError(f"{path}:{line}: empty 'path' or 'label'"))
            continue
        image_path = Path(image) if Path(image).is_absolute() else path.parent / image
        if not image_path.is_file():
            bad.add(f"{path}:{line}", TuneproofError(f"{path}:{line}: image not found: {image_path}"))
            continue
        _check_header(image_path)
        items.append((str(image_path), label))
    bad.check()
    if not items:
        raise TuneproofError(f"{path}: no rows")
    return items


def _check_header(path: Path) -> None:
    try:
        with Image.open(path):
            pass
    except (UnidentifiedImageError, OSError) as err:
        raise TuneproofError(f"{path}: not a readable image ({err.__class__.__name__}: {err})") from None


# --------------------------------------------------------------------------- audit
def _open(path: str | Path) -> Image.Image:
    try:
        im = Image.open(path)
        im.load()  # decode now: a truncated file fails here, not inside the training loop
        return im
    except FileNotFoundError:
        raise TuneproofError(f"{path}: image not found") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as err:
        raise TuneproofError(f"{path}: not a readable image ({err.__class__.__name__}: {err})") from None


def _describe_output(out: Any, path: str) -> tuple[str, float | None]:
    """(signature, largest |value|) of a transform output: a PIL image or a CHW array-like."""
    if isinstance(out, Image.Image):
        return f"PIL {out.mode} {out.width}x{out.height}", None
    try:
        arr = np.asarray(out)
    except Exception as err:  # noqa: BLE001 - any failure to convert is the user's transform
        raise TuneproofError(
            f"{path}: transform output of type {type(out).__name__} is neither a PIL image nor an array ({err})"
        ) from None
    if arr.dtype == object or arr.ndim == 0:
        raise TuneproofError(
            f"{path}: transform output of type {type(out).__name__} is neither a PIL image nor an array"
        )
    scale = float(np.abs(arr).max()) if arr.size and np.issubdtype(arr.dtype, np.number) else None
    return f"array {arr.dtype} {'x'.join(str(d) for d in arr.shape)}", scale


def _summary(values: list[float]) -> dict[str, float]:
    a = np.asarray(values, dtype=np.float64)
    return {"min": float(a.min()), "median": float(np.median(a)), "max": float(a.max())}


def _tv_distance(p: Counter, q: Counter) -> float:
    np_, nq = sum(p.values()), sum(q.values())
    return 0.5 * sum(abs(p[k] / np_ - q[k] / nq) for k in set(p) | set(q))


def _dominant(c: Counter) -> str:
    return sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]


def _ratio(a: float, b: float) -> float:
    if a <= 0 or b <= 0:
        return float("inf") if a != b else 1.0
    return max(a / b, b / a)


def audit_images(
    items: Iterable[tuple[str | Path, str]], transform: Callable[[Image.Image], Any] | None = None
) -> dict[str, Any]:
    """Per-category form of the images, before and after ``transform``, with flags.

    Args:
        items: ``(path, label)`` pairs (from :func:`load_image_folder` or :func:`load_image_csv`).
        transform: optional callable mapping a decoded PIL image to a PIL image or a CHW
            array-like (numpy array, CPU torch tensor); it is applied to every image.

    Returns a dict with keys:

    - ``n``: images audited; ``categories``: ``{label: {"n", "width", "height", "aspect_ratio",
      "modes", "channels", "formats", "after_transform"}}``: width/height in pixels and
      aspect ratio (width / height) as ``{"min", "median", "max"}``; modes (PIL mode), channels
      (band count, keys as strings) and formats (PNG, JPEG) as ``{value: count}``;
      ``after_transform`` is ``None`` without a transform, else ``{"outputs": {signature:
      count}, "max_abs_value": {"median", "max"} | None}`` where a signature is ``"PIL <mode>
      <W>x<H>"`` or ``"array <dtype> <C>x<H>x<W>"`` and ``max_abs_value`` summarises each array
      output's largest absolute value (``None`` for PIL outputs).
    - ``flags``: ``[{"category", "kind", "severity", "detail"}]``, kind one of ``mode``,
      ``format``, ``width``, ``height``, ``aspect_ratio``, ``transform_output``, ``value_scale``.
    - ``hard_faults`` / ``warnings``: the flags as one-line strings, by severity.
    - ``rules``: the rules below, in words.

    Rules (tuneproof's own thresholds; each category is compared with all images of the other
    categories pooled; nothing is compared when there is one category):

    - warning ``mode`` / ``format``: the total variation distance between the category's
      distribution of PIL modes (file formats) and the others' is above 0.25 (e.g. a category
      all RGB among grayscale ones: distance 1.0).
    - warning ``width`` / ``height`` / ``aspect_ratio``: the category's median differs from the
      others' median by more than 1.5x either way.
    - hard fault ``transform_output``: the category's most common output signature differs from
      the others' (the model would see that class in another shape, mode or dtype).
    - hard fault ``value_scale``: the median over images of the largest absolute output value
      differs from the others' by more than 10x (e.g. [0, 255] against [0, 1]).
    - warning ``transform_output``: outputs have several signatures, but none by category.

    Decodes every image (a truncated file fails here, not in training).

    Raises:
        TuneproofError: no items, a missing or unreadable image, a transform that raises or
            returns something that is neither a PIL image nor an array (each names the file).
    """
    items = [(str(p), str(label)) for p, label in items]
    if not items:
        raise TuneproofError("audit_images: no images to audit")
    raw: dict[str, dict[str, list]] = {}
    for path, label in items:
        im = _open(path)
        rec = raw.setdefault(
            label, {"w": [], "h": [], "mode": [], "channels": [], "format": [], "sig": [], "scale": []}
        )
        rec["w"].append(im.width)
        rec["h"].append(im.height)
        rec["mode"].append(im.mode)
        rec["channels"].append(str(len(im.getbands())))
        rec["format"].append(im.format or "unknown")
        if transform is not None:
            try:
                out = transform(im)
            except TuneproofError:
                raise
            except Exception as err:  # noqa: BLE001 - report the user's transform failure with the file
                raise TuneproofError(f"{path}: the transform failed ({err.__class__.__name__}: {err})") from None
            sig, scale = _describe_output(out, path)
            rec["sig"].append(sig)
            if scale is not None:
                rec["scale"].append(scale)
        im.close()

    labels = sorted(raw)
    categories: dict[str, dict[str, Any]] = {}
    for label in labels:
        r = raw[label]
        after = None
        if transform is not None:
            after = {
                "outputs": dict(Counter(r["sig"]).most_common()),
                "max_abs_value": (
                    {"median": float(np.median(r["scale"])), "max": max(r["scale"])} if r["scale"] else None
                ),
            }
        categories[label] = {
            "n": len(r["w"]),
            "width": _summary(r["w"]),
            "height": _summary(r["h"]),
            "aspect_ratio": _summary([w / h for w, h in zip(r["w"], r["h"])]),
            "modes": dict(Counter(r["mode"]).most_common()),
            "channels": dict(Counter(r["channels"]).most_common()),
            "formats": dict(Counter(r["format"]).most_common()),
            "after_transform": after,
        }

    flags: list[dict[str, str]] = []

    def flag(label: str, kind: str, severity: str, detail: str) -> None:
        flags.append({"category": label, "kind": kind, "severity": severity, "detail": detail})

    for label in labels if len(labels) > 1 else []:
        mine = raw[label]
        others = {k: [v for o in labels if o != label for v in raw[o][k]] for k in mine}
        for key, kind in (("mode", "mode"), ("format", "format")):
            p, q = Counter(mine[key]), Counter(others[key])
            d = _tv_distance(p, q)
            if d > DISTRIBUTION_DISTANCE_FLAG:
                flag(
                    label,
                    kind,
                    "warning",
                    f"{kind}s {dict(p.most_common())} vs the other categories "
                    f"{dict(q.most_common())} (distance {d:.2f})",
                )
        mine_ar = [w / h for w, h in zip(mine["w"], mine["h"])]
        other_ar = [w / h for w, h in zip(others["w"], others["h"])]
        for kind, a, b, unit in (
            ("width", mine["w"], others["w"], " px"),
            ("height", mine["h"], others["h"], " px"),
            ("aspect_ratio", mine_ar, other_ar, ""),
        ):
            ma, mb = float(np.median(a)), float(np.median(b))
            if _ratio(ma, mb) > SIZE_RATIO_FLAG:
                flag(
                    label,
                    kind,
                    "warning",
                    f"median {kind} {ma:g}{unit} vs {mb:g}{unit} in the other categories ({_ratio(ma, mb):.2f}x)",
                )
        if transform is not None:
            sa, sb = _dominant(Counter(mine["sig"])), _dominant(Counter(others["sig"]))
            if sa != sb:
                flag(label, "transform_output", "hard", f"transform gives '{sa}' vs '{sb}' in the other categories")
            if mine["scale"] and others["scale"]:
                va, vb = float(np.median(mine["scale"])), float(np.median(others["scale"]))
                if _ratio(va, vb) > VALUE_SCALE_FLAG:
                    flag(
                        label,
                        "value_scale",
                        "hard",
                        f"median largest |value| after the transform {va:g} vs {vb:g} in the other categories",
                    )
    if transform is not None and not any(f["kind"] == "transform_output" for f in flags):
        all_sigs = Counter(s for label in labels for s in raw[label]["sig"])
        if len(all_sigs) > 1:
            flag(
                "*",
                "transform_output",
                "warning",
                f"transform outputs are not all alike: {dict(all_sigs.most_common(5))}",
            )

    def line(f: dict[str, str]) -> str:
        return f"category '{f['category']}': {f['detail']}" if f["category"] != "*" else f["detail"]

    return {
        "n": len(items),
        "categories": categories,
        "flags": flags,
        "hard_faults": [line(f) for f in flags if f["severity"] == "hard"],
        "warnings": [line(f) for f in flags if f["severity"] == "warning"],
        "rules": {
            "mode/format": f"total variation distance to the other categories > {DISTRIBUTION_DISTANCE_FLAG}",
            "width/height/aspect_ratio": f"median more than {SIZE_RATIO_FLAG}x off the other categories' median",
            "transform_output": "most common output signature differs from the other categories'",
            "value_scale": "median per-image largest |value| after the transform more "
            f"than {VALUE_SCALE_FLAG:g}x off the others'",
        },
    }
