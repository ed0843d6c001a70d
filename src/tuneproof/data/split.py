"""Deterministic, seeded, stratified splits and the frozen split manifest.

The manifest ``splits.json`` (example ids per split) is written once, the first time a study's
data is prepared, and reused by every later run, so all runs see the same split. The reserved
test split is withheld from every stage except ``tuneproof test``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np

from tuneproof.data.examples import Example
from tuneproof.errors import TuneproofError
from tuneproof.io import read_json, sha256_json, write_json

MANIFEST = "splits.json"


def stratified_take(examples: list[Example], n: int, seed: int) -> list[Example]:
    """A stratified subset of ``n`` examples (per-label round robin over seeded shuffles), in id order.

    Every label present gets at least ``n // n_labels`` examples when it has that many.
    """
    if n >= len(examples):
        return list(examples)
    rng = np.random.default_rng(seed)
    by_label: dict[str | None, list[Example]] = defaultdict(list)
    for ex in examples:
        by_label[ex.label].append(ex)
    queues = []
    for label in sorted(by_label, key=lambda x: (x is None, str(x))):
        items = sorted(by_label[label], key=lambda e: e.id)
        order = rng.permutation(len(items))
        queues.append([items[i] for i in order])
    picked: list[Example] = []
    while len(picked) < n:
        for q in queues:
            if q and len(picked) < n:
                picked.append(q.pop())
    return sorted(picked, key=lambda e: e.id)


def stratified_split(examples: list[Example], fractions: dict[str, float], seed: int) -> dict[str, list[Example]]:
    """Split by label with the given fractions (they must sum to 1 within 1e-6).

    For each label the examples are shuffled with ``seed`` and cut by cumulative fractions, so each
    split keeps the label proportions (rounding goes to the last split).
    """
    total = sum(fractions.values())
    if abs(total - 1.0) > 1e-6:
        raise TuneproofError(f"data.split.fractions sum to {total:.4f}, not 1", hint="e.g. {train: 0.8, validation: 0.1, test: 0.1}")
    rng = np.random.default_rng(seed)
    by_label: dict[str | None, list[Example]] = defaultdict(list)
    for ex in examples:
        by_label[ex.label].append(ex)
    out: dict[str, list[Example]] = {name: [] for name in fractions}
    names = list(fractions)
    for label in sorted(by_label, key=lambda x: (x is None, str(x))):
        items = sorted(by_label[label], key=lambda e: e.id)
        items = [items[i] for i in rng.permutation(len(items))]
        start = 0
        for k, name in enumerate(names):
            end = len(items) if k == len(names) - 1 else start + int(round(fractions[name] * len(items)))
            out[name] += items[start:end]
            start = end
    return {k: sorted(v, key=lambda e: e.id) for k, v in out.items()}


def build_splits(examples: list[Example], policy, test_split: str) -> dict[str, list[Example]]:
    """Assign every example to a split.

    Examples whose source gives a split keep it; the rest are split by ``policy.fractions``. When no
    split named in ``policy.fractions`` is given by the sources and ``policy.carve_from`` is set, it is
    carved out of that split (stratified, with its fraction; e.g. a test split out of train). ``policy.max_examples`` then
    caps splits by a stratified subset.

    Raises:
        TuneproofError: an empty split, or duplicate example ids.
    """
    seen: dict[str, str] = {}
    for ex in examples:
        if ex.id in seen:
            raise TuneproofError(f"duplicate example id '{ex.id}' ({seen[ex.id]} and {ex.source})", hint="set data.fields.id to a unique column")
        seen[ex.id] = ex.source
    splits: dict[str, list[Example]] = defaultdict(list)
    unsplit = []
    for ex in examples:
        (splits[ex.split].append(ex) if ex.split else unsplit.append(ex))
    if unsplit:
        for name, items in stratified_split(unsplit, policy.fractions, policy.seed).items():
            splits[name] += items
    if policy.carve_from:
        if policy.carve_from not in splits:
            raise TuneproofError(f"data.split.carve_from: split '{policy.carve_from}' does not exist (have {sorted(splits)})")
        missing = {n: f for n, f in policy.fractions.items() if n not in splits and n != policy.carve_from}
        if missing:
            rest = 1.0 - sum(missing.values())
            if rest <= 0:
                raise TuneproofError(f"data.split.fractions of the carved splits {sorted(missing)} leave nothing in '{policy.carve_from}'")
            parts = stratified_split(splits[policy.carve_from], {policy.carve_from: rest, **missing}, policy.seed)
            splits.update(parts)
    for name, cap in policy.max_examples.items():
        if name in splits:
            splits[name] = stratified_take(splits[name], cap, policy.seed)
    result = {}
    for name, items in splits.items():
        if not items:
            raise TuneproofError(f"split '{name}' is empty", hint="check data.sources and data.split")
        result[name] = [replace(ex, split=name) for ex in sorted(items, key=lambda e: e.id)]
    return result


def manifest_of(splits: dict[str, list[Example]]) -> dict:
    return {"splits": {name: [e.id for e in items] for name, items in sorted(splits.items())},
            "hash": sha256_json({n: [e.id for e in v] for n, v in sorted(splits.items())})}


def freeze_or_reuse(
    study_dir: Path, splits: dict[str, list[Example]], examples: list[Example]
) -> tuple[dict[str, list[Example]], bool]:
    """Write ``splits.json`` the first time; afterwards rebuild the splits from it.

    Returns ``(splits, created)``.

    Raises:
        TuneproofError: the manifest names example ids that the current data no longer has.
    """
    path = study_dir / MANIFEST
    if not path.exists():
        write_json(path, manifest_of(splits))
        return splits, True
    frozen = read_json(path)["splits"]
    by_id = {e.id: e for e in examples}
    out = {}
    for name, ids in frozen.items():
        missing = [i for i in ids if i not in by_id]
        if missing:
            raise TuneproofError(
                f"{path}: {len(missing)} example ids of split '{name}' are not in the data any more (e.g. '{missing[0]}')",
                hint="the data changed: restore it, or start a new study (the manifest is frozen on purpose)",
            )
        out[name] = [replace(by_id[i], split=name) for i in ids]
    return out, False
