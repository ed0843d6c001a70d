"""Deterministic, seeded, stratified splits and the frozen split manifest.

When tuneproof cuts splits itself (``data.split.fractions`` for sources without a split, or
``carve_from``), identical and near-identical texts (the ``data.dedup`` settings: exact,
normalised, MinHash near-duplicates, see :mod:`tuneproof.data.dedup`) form one group and a group
goes to one split whole, so tuneproof's own split never creates cross-split duplicates. The
manifest records that grouping rule.

The manifest ``splits.json`` (example ids per split) is written once, the first time a study's
data is prepared, and reused by every later run, so all runs see the same split. The reserved
test split is withheld from every stage except ``tuneproof test``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np

from tuneproof.data.dedup import find_duplicates
from tuneproof.data.examples import Example
from tuneproof.errors import TuneproofError
from tuneproof.io import read_json, sha256_json, write_json
from tuneproof.study import Dedup

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


def duplicate_groups(examples: list[Example], dedup=None) -> list[int]:
    """Group index of each example: examples linked by an exact, normalised or near-duplicate pair
    (``find_duplicates`` with the ``data.dedup`` settings; transitive closure) share a group.
    Group indices follow the first member's position. ``dedup`` None: the default settings.

    Raises:
        TuneproofError: duplicate ids or invalid settings (from ``find_duplicates``).
    """
    if not examples:
        return []
    kw = (
        {}
        if dedup is None
        else {
            "threshold": dedup.threshold,
            "shingles": dedup.shingles,
            "ngram": dedup.ngram,
            "num_perm": dedup.num_perm,
        }
    )
    report = find_duplicates({"pool": list(examples)}, **kw)
    index = {ex.id: i for i, ex in enumerate(examples)}
    parent = list(range(len(examples)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for c in report.pair("pool", "pool").collisions:
        a, b = find(index[c.id_a]), find(index[c.id_b])
        if a != b:
            parent[max(a, b)] = min(a, b)
    roots = [find(i) for i in range(len(examples))]
    renumber: dict[int, int] = {}
    return [renumber.setdefault(r, len(renumber)) for r in roots]


def grouping_rule(dedup=None) -> dict:
    """The grouping rule as recorded in the manifest."""
    d = dedup or Dedup()
    return {
        "rule": "exact, normalised and near-duplicate texts (data.dedup settings) are kept in one split",
        "threshold": d.threshold,
        "shingles": d.shingles,
        "ngram": d.ngram,
        "num_perm": d.num_perm,
    }


def _check_fractions(fractions: dict[str, float]) -> None:
    bad = {k: v for k, v in fractions.items() if not (0.0 <= v <= 1.0)}
    if bad:
        k, v = next(iter(bad.items()))
        raise TuneproofError(
            f"data.split.fractions.{k} is {v:g}: each fraction must be between 0 and 1",
            hint="e.g. {train: 0.8, validation: 0.1, test: 0.1}",
        )
    total = sum(fractions.values())
    if abs(total - 1.0) > 1e-6:
        raise TuneproofError(
            f"data.split.fractions sum to {total:.4f}, not 1", hint="e.g. {train: 0.8, validation: 0.1, test: 0.1}"
        )


def stratified_split(
    examples: list[Example], fractions: dict[str, float], seed: int, groups: list[int] | None = None
) -> dict[str, list[Example]]:
    """Split by label with the given fractions (each in [0, 1], summing to 1 within 1e-6).

    For each label the examples are shuffled with ``seed`` and cut by cumulative fractions, so each
    split keeps the label proportions (rounding goes to the last split). With ``groups`` (a group
    index per example, :func:`duplicate_groups`), whole groups are shuffled and assigned: a group
    goes to the first split (in ``fractions`` order) still under its target count
    ``round(fraction * n)``, else to the last one; a group's label is its lowest-id member's.
    Without duplicates this is the same split as without groups.

    Raises:
        TuneproofError: a fraction outside [0, 1] (names the key), or fractions not summing to 1.
    """
    _check_fractions(fractions)
    rng = np.random.default_rng(seed)
    if groups is None:
        groups = list(range(len(examples)))
    members: dict[int, list[Example]] = defaultdict(list)
    for ex, g in zip(examples, groups):
        members[g].append(ex)
    by_label: dict[str | None, list[list[Example]]] = defaultdict(list)
    for g in members.values():
        g.sort(key=lambda e: e.id)
        by_label[g[0].label].append(g)
    out: dict[str, list[Example]] = {name: [] for name in fractions}
    names = list(fractions)
    for label in sorted(by_label, key=lambda x: (x is None, str(x))):
        items = sorted(by_label[label], key=lambda g: g[0].id)
        items = [items[i] for i in rng.permutation(len(items))]
        n = sum(len(g) for g in items)
        targets = [int(round(fractions[name] * n)) for name in names[:-1]]
        counts = [0] * len(names)
        for g in items:
            k = next((k for k, t in enumerate(targets) if counts[k] < t), len(names) - 1)
            counts[k] += len(g)
            out[names[k]] += g
    return {k: sorted(v, key=lambda e: e.id) for k, v in out.items()}


def check_unique_ids(examples: list[Example]) -> None:
    """Raises :class:`TuneproofError` naming the count of duplicated example ids and the first 5,
    each with both sources (``and N more``), so that all are fixed in one pass."""
    seen: dict[str, str] = {}
    dups: list[str] = []
    for ex in examples:
        if ex.id in seen:
            dups.append(f"'{ex.id}' ({seen[ex.id]} and {ex.source})")
        else:
            seen[ex.id] = ex.source
    if len(dups) == 1:
        raise TuneproofError(f"duplicate example id {dups[0]}", hint="set data.fields.id to a unique column")
    if dups:
        raise TuneproofError(
            f"{len(dups)} duplicate example ids: "
            + ", ".join(dups[:5])
            + (f" and {len(dups) - 5} more" if len(dups) > 5 else ""),
            hint="set data.fields.id to a unique column",
        )


def build_splits(
    examples: list[Example], policy, test_split: str, dedup=None, info: dict | None = None
) -> dict[str, list[Example]]:
    """Assign every example to a split.

    Examples whose source gives a split keep it; the rest are split by ``policy.fractions``. When no
    split named in ``policy.fractions`` is given by the sources and ``policy.carve_from`` is set, it is
    carved out of that split (stratified, with its fraction; e.g. a test split out of train). ``policy.max_examples``
    then caps splits by a stratified subset. Whenever tuneproof cuts a split itself, duplicate groups
    (:func:`duplicate_groups` with ``dedup``, the ``data.dedup`` settings) stay whole; ``info``,
    when given, receives ``{"grouping": rule, "groups_kept_whole": number of groups of 2+}``.

    Raises:
        TuneproofError: an empty split, duplicate example ids, fractions outside [0, 1].
    """
    check_unique_ids(examples)
    splits: dict[str, list[Example]] = defaultdict(list)
    unsplit = []
    for ex in examples:
        (splits[ex.split].append(ex) if ex.split else unsplit.append(ex))
    grouped = 0

    def cut(pool: list[Example], fractions: dict[str, float]) -> dict[str, list[Example]]:
        nonlocal grouped
        _check_fractions(fractions)
        groups = duplicate_groups(pool, dedup)
        sizes = defaultdict(int)
        for g in groups:
            sizes[g] += 1
        grouped += sum(1 for v in sizes.values() if v > 1)
        return stratified_split(pool, fractions, policy.seed, groups)

    if unsplit:
        for name, items in cut(unsplit, policy.fractions).items():
            splits[name] += items
    if policy.carve_from:
        if policy.carve_from not in splits:
            raise TuneproofError(
                f"data.split.carve_from: split '{policy.carve_from}' does not exist (have {sorted(splits)})"
            )
        missing = {n: f for n, f in policy.fractions.items() if n not in splits and n != policy.carve_from}
        if missing:
            rest = 1.0 - sum(missing.values())
            if rest <= 0:
                raise TuneproofError(
                    f"data.split.fractions of the carved splits {sorted(missing)} "
                    f"leave nothing in '{policy.carve_from}'"
                )
            parts = cut(splits[policy.carve_from], {policy.carve_from: rest, **missing})
            splits.update(parts)
    for name, cap in policy.max_examples.items():
        if name in splits:
            splits[name] = stratified_take(splits[name], cap, policy.seed)
    if info is not None:
        info["grouping"] = grouping_rule(dedup)
        info["groups_kept_whole"] = grouped
    result = {}
    for name, items in splits.items():
        if not items:
            raise TuneproofError(f"split '{name}' is empty", hint="check data.sources and data.split")
        result[name] = [replace(ex, split=name) for ex in sorted(items, key=lambda e: e.id)]
    return result


def manifest_of(splits: dict[str, list[Example]], grouping: dict | None = None) -> dict:
    """The manifest: example ids per split, their hash, and (when tuneproof cut splits) the grouping rule."""
    out = {
        "splits": {name: [e.id for e in items] for name, items in sorted(splits.items())},
        "hash": sha256_json({n: [e.id for e in v] for n, v in sorted(splits.items())}),
    }
    if grouping is not None:
        out["grouping"] = grouping
    return out


def freeze_or_reuse(
    study_dir: Path, splits, examples: list[Example], grouping: dict | None = None
) -> tuple[dict[str, list[Example]], bool]:
    """Write ``splits.json`` the first time; afterwards rebuild the splits from it.

    ``splits`` is the split dict, or a zero-argument callable returning it (only called when no
    manifest exists yet, so a frozen study does not cut again). ``grouping`` (or the callable's
    ``grouping`` entry in an ``info`` dict it filled) is recorded in the manifest.

    Returns ``(splits, created)``.

    Raises:
        TuneproofError: the manifest names example ids that the current data no longer has.
    """
    path = study_dir / MANIFEST
    if not path.exists():
        if callable(splits):
            splits = splits()
        write_json(path, manifest_of(splits, grouping() if callable(grouping) else grouping))
        return splits, True
    frozen = read_json(path)["splits"]
    by_id = {e.id: e for e in examples}
    out = {}
    for name, ids in frozen.items():
        missing = [i for i in ids if i not in by_id]
        if missing:
            raise TuneproofError(
                f"{path}: {len(missing)} example ids of split '{name}' are not "
                f"in the data any more (e.g. '{missing[0]}')",
                hint="the data changed: restore it, or start a new study (the manifest is frozen on purpose)",
            )
        out[name] = [replace(by_id[i], split=name) for i in ids]
    return out, False
