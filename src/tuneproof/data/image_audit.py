"""Data-check audits of an image-classification study (docs/PROTOCOL.md step 3: for images,
their sizes and the transforms each class goes through):

- form per class: width / height / aspect ratio / PIL mode / file format distributions, before and
  after the study's transform (:func:`tuneproof.data.images.audit_images` and its flag rules);
- duplicates across splits: exact (same sha256 of the file bytes) and near (perceptual hash,
  ``imagehash.phash``, Hamming distance <= :data:`NEAR_DISTANCE` of 64 bits);
- shortcuts: whether the image *form* alone (width, height, aspect ratio, mode, format; not the
  file size, which follows the content) predicts the class far above chance, with a depth-2
  decision tree, cross-validated
  (scikit-learn). Shortcut learning: Geirhos et al. 2020, Nature Machine Intelligence 2, 665-673.
"""

from __future__ import annotations

from collections import Counter
from itertools import combinations
from typing import Any

import numpy as np

from tuneproof.data.dedup import ordered_splits
from tuneproof.data.examples import Example
from tuneproof.data.image_sources import open_image
from tuneproof.data.images import audit_images

NEAR_DISTANCE = 4  # of 64 pHash bits; ImageHash's README treats small distances (< ~5) as the same picture
SHORTCUT_MARGIN = 0.25  # cross-validated accuracy of the form-only tree minus the majority-class rate
FORM_FEATURES = (
    "width",
    "height",
    "aspect_ratio",
    "mode",
    "format",
)  # not the file size: PNG/JPEG bytes follow the content


def image_duplicates(splits: dict[str, list[Example]], max_distance: int = NEAR_DISTANCE) -> dict[str, Any]:
    """Exact and near duplicate images across every pair of splits, counted in images (as the text
    duplicates are, :meth:`tuneproof.data.dedup.DedupReport.summary_lines`), the pairs listed.

    An image of the later split of a pair (train, validation, test order) that has a copy in the
    earlier one counts once, under ``exact`` when any of its copies is exact, else ``near``; one
    image matching three others is one image and three pairs.

    Returns:
        ``{"pairs": {"test/train": {"exact": [[id_a, id_b]], "near": [[id_a, id_b, distance]]}},
        "counts": {"test/train": {"split": "test", "n": images of that split, "exact": images, "near": images}},
        "rule", "n_exact", "n_near" (images), "n_exact_pairs", "n_near_pairs", "summary": one line}``;
        near pairs exclude exact ones; pair keys are the two split names sorted.
    """
    import imagehash  # noqa: PLC0415 - imagehash loads only when image_duplicates() runs

    hashes: dict[str, list[tuple[str, str, Any]]] = {}
    for name, items in splits.items():
        hashes[name] = [
            (e.id, e.meta.get("image_sha256", ""), imagehash.phash(open_image(e.meta["image"]).convert("RGB")))
            for e in items
            if e.meta.get("image")
        ]
    pairs: dict[str, dict[str, list]] = {}
    counts: dict[str, dict[str, Any]] = {}
    n_exact = n_near = n_exact_pairs = n_near_pairs = 0
    for a, b in combinations(sorted(hashes), 2):
        by_sha = {}
        for id_b, sha_b, _ in hashes[b]:
            by_sha.setdefault(sha_b, []).append(id_b)
        exact = [[id_a, id_b] for id_a, sha_a, _ in hashes[a] for id_b in by_sha.get(sha_a, [])]
        exact_set = {tuple(p) for p in exact}
        near = []
        for id_a, _, ha in hashes[a]:
            for id_b, _, hb in hashes[b]:
                d = ha - hb
                if d <= max_distance and (id_a, id_b) not in exact_set:
                    near.append([id_a, id_b, int(d)])
        key = f"{a}/{b}"
        pairs[key] = {"exact": exact, "near": near}
        later = 1 if ordered_splits([a, b])[1] == b else 0  # the held-out side: the images counted
        exact_ids = {p[later] for p in exact}
        near_ids = {p[later] for p in near} - exact_ids
        counts[key] = {"split": (a, b)[later], "n": len(hashes[(a, b)[later]]), "exact": len(exact_ids)}
        counts[key]["near"] = len(near_ids)
        n_exact, n_near = n_exact + len(exact_ids), n_near + len(near_ids)
        n_exact_pairs, n_near_pairs = n_exact_pairs + len(exact), n_near_pairs + len(near)
    hit = [(k, c) for k, c in counts.items() if c["exact"] or c["near"]]
    summary = (
        "image duplicates across splits: "
        + "; ".join(f"{c['exact']} exact, {c['near']} near of {c['n']} {c['split']} images ({k})" for k, c in hit)
        + f" ({n_exact_pairs + n_near_pairs} pairs listed in data_check.json)"
        if hit
        else f"image duplicates: none across {'/'.join(sorted(hashes))}"
    )
    return {
        "pairs": pairs,
        "counts": counts,
        "n_exact": n_exact,
        "n_near": n_near,
        "n_exact_pairs": n_exact_pairs,
        "n_near_pairs": n_near_pairs,
        "summary": summary,
        "rule": "exact: same sha256 of the file; near: pHash (imagehash) "
        f"Hamming distance <= {max_distance} of 64 bits",
    }


def _form_matrix(items: list[Example]) -> tuple[np.ndarray, list[str]]:
    modes = sorted({e.meta.get("mode", "") for e in items})
    formats = sorted({e.meta.get("format", "") for e in items})
    rows = []
    for e in items:
        m = e.meta
        w, h = float(m.get("width", 0)), float(m.get("height", 0))
        rows.append(
            [
                w,
                h,
                w / h if h else 0.0,
                float(modes.index(m.get("mode", ""))),
                float(formats.index(m.get("format", ""))),
            ]
        )
    return np.asarray(rows, dtype=np.float64), [e.label for e in items]


def shortcut_check(items: list[Example], margin: float = SHORTCUT_MARGIN, seed: int = 0) -> dict[str, Any]:
    """Does the image form alone predict the class? A depth-2 decision tree on
    :data:`FORM_FEATURES`, ``StratifiedKFold`` cross-validation (up to 5 folds), compared with the
    majority-class rate; each feature is also tried alone to name the one that carries it.

    Returns:
        ``{"cv_accuracy", "chance", "margin", "flag" (bool), "feature" (the best single feature),
        "per_feature": {feature: cv accuracy}, "folds", "message"}``; ``flag`` is None (not
        measurable) with fewer than 2 classes or fewer than 2 images in the smallest class.
    """
    from sklearn.model_selection import StratifiedKFold, cross_val_score  # noqa: PLC0415 - sklearn.model_selection loads only when shortcut_check() runs
    from sklearn.tree import DecisionTreeClassifier  # noqa: PLC0415 - sklearn.tree loads only when shortcut_check() runs

    x, y = _form_matrix(items)
    counts = Counter(y)
    if len(counts) < 2 or min(counts.values()) < 2:
        return {"flag": None, "message": "shortcut check: not measurable (needs 2 classes with 2 images each)"}
    folds = min(5, min(counts.values()))
    cv = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)

    def acc(cols: list[int]) -> float:
        tree = DecisionTreeClassifier(max_depth=2, random_state=seed)
        return float(cross_val_score(tree, x[:, cols], y, cv=cv).mean())

    overall = acc(list(range(x.shape[1])))
    per_feature = {name: round(acc([i]), 4) for i, name in enumerate(FORM_FEATURES)}
    chance = max(counts.values()) / len(y)
    feature = max(per_feature, key=lambda k: per_feature[k])
    flag = overall - chance >= margin
    message = (
        f"shortcut: image {feature} alone predicts the class (form-only tree {overall:.2f} vs chance {chance:.2f}, "
        f"{folds}-fold CV); the model may learn the {feature} instead of the content"
        if flag
        else f"shortcut check: none (form-only tree {overall:.2f} vs chance {chance:.2f}, {folds}-fold CV)"
    )
    return {
        "cv_accuracy": round(overall, 4),
        "chance": round(chance, 4),
        "margin": margin,
        "flag": flag,
        "feature": feature,
        "per_feature": per_feature,
        "folds": folds,
        "message": message,
    }


def audit_image_study(splits: dict[str, list[Example]], pipeline=None) -> dict[str, Any]:
    """Everything the data check reports for an image study: per-split form audit (with the
    pipeline's transform), duplicates across splits, and the shortcut check on the train split.

    Returns ``{"form": {split: audit_images result}, "duplicates", "shortcut", "warnings",
    "hard_faults"}`` (one-line strings)."""
    form: dict[str, Any] = {}
    warnings: list[str] = []
    hard: list[str] = []
    for name, items in sorted(splits.items()):
        items = [e for e in items if e.meta.get("image")]
        if not items:
            continue
        transform = None
        if pipeline is not None:

            def transform(im, _p=pipeline):
                return _p.processor(images=im.convert(_p.transforms.mode), return_tensors="np", **_p.kwargs)[
                    "pixel_values"
                ][0]

        rep = audit_images([(e.meta["image"], e.label) for e in items], transform)
        form[name] = rep
        warnings += [f"{name}: {w}" for w in rep["warnings"]]
        hard += [f"{name}: {h}" for h in rep["hard_faults"]]
    dups = image_duplicates(splits)
    if dups["n_exact"] or dups["n_near"]:
        warnings.append(dups["summary"])
    shortcut = shortcut_check(splits.get("train", []))
    if shortcut.get("flag"):
        warnings.append(shortcut["message"])
    return {"form": form, "duplicates": dups, "shortcut": shortcut, "warnings": warnings, "hard_faults": hard}
