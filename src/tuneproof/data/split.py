"""Deterministic, seeded, stratified splits and the frozen split manifest.

When tuneproof cuts splits itself (``data.split.fractions`` for sources without a split, or
``carve_from``), identical and near-identical texts (the ``data.dedup`` settings: exact,
normalised, MinHash near-duplicates, see :mod:`tuneproof.data.dedup`) form one group and a group
goes to one split whole, so tuneproof's own split never creates cross-split duplicates. The
manifest records that grouping rule.

The manifest ``splits.json`` (example ids per split) is written once, the first time a study's
data is prepared, and reused by every later run, so all runs see the same split. It records the
split settings that cut it (:func:`split_settings`: ``data.split.*``, ``data.test_split``, the
grouping rule). When the study's settings differ from the recorded ones, or the data no longer
holds an id the manifest names, the splits are cut again and the manifest rewritten as long as no
run has used it (a data check, passed or failed, does not count: it only reads); once a run has,
the study is refused, naming the file, the settings that changed and the runs. A changed cap is
never silently ignored. The reserved test split is withheld from every stage except ``tuneproof test``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

from tuneproof.data.dedup import find_duplicates
from tuneproof.data.examples import Example
from tuneproof.data.rows import capped
from tuneproof.data.sources import LEGACY_ID
from tuneproof.errors import TuneproofError
from tuneproof.io import read_json, sha256_json, write_json
from tuneproof.study import Dedup

MANIFEST = "splits.json"


def _label_queues(examples: list[Example], seed: int) -> tuple[list, list[list[Example]]]:
    """Labels in sorted order (None last) and, per label, its examples in a seeded shuffle (drawn from the end)."""
    rng = np.random.default_rng(seed)
    by_label: dict[str | None, list[Example]] = defaultdict(list)
    for ex in examples:
        by_label[ex.label].append(ex)
    labels = sorted(by_label, key=lambda x: (x is None, str(x)))
    queues = []
    for label in labels:
        items = sorted(by_label[label], key=lambda e: e.id)
        order = rng.permutation(len(items))
        queues.append([items[i] for i in order])
    return labels, queues


def label_classes(label: str | None) -> tuple[str, ...] | None:
    """The classes an example's label names: a JSON array of strings (a multi-label example, or a
    list-valued intent, kept by the reader as its JSON text) gives its members, sorted and unique;
    any other label is one class. None for a label that is not a list."""
    if not isinstance(label, str) or not label.startswith("["):
        return None
    try:
        value = json.loads(label)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        return None
    return tuple(sorted(set(value)))


def _balanced_take_sets(examples: list[Example], n: int, seed: int) -> list[Example]:
    """:func:`balanced_take` when labels are lists: each draw goes to the class held by the fewest
    drawn examples so far (ties: sorted order) that still has an undrawn holder, from a seeded shuffle
    of the examples holding it; a drawn example counts for every class it holds. So every class is
    held by about the same number of drawn examples, whatever combinations the lists form (one
    distinct list per example, as in NLU++, would otherwise decide the draw by the lists' sort
    order). Examples with an empty list form the class ``"[]"``."""
    rng = np.random.default_rng(seed)
    holders: dict[str, list[Example]] = defaultdict(list)
    classes_of: dict[str, tuple[str, ...]] = {}
    for ex in examples:
        classes = label_classes(ex.label)
        if classes is None:  # a plain label beside list labels: its own class
            classes = (str(ex.label),)
        classes_of[ex.id] = classes or ("[]",)
        for c in classes_of[ex.id]:
            holders[c].append(ex)
    queues: dict[str, list[Example]] = {}
    for c in sorted(holders):
        items = sorted(holders[c], key=lambda e: e.id)
        queues[c] = [items[i] for i in rng.permutation(len(items))]
    held = dict.fromkeys(queues, 0)
    picked: dict[str, Example] = {}
    while len(picked) < n:
        for q in queues.values():
            while q and q[-1].id in picked:
                q.pop()
        open_ = [c for c, q in queues.items() if q]
        if not open_:
            break
        c = min(open_, key=lambda k: held[k])  # min keeps the first of equals: sorted order
        ex = queues[c].pop()
        picked[ex.id] = ex
        for k in classes_of[ex.id]:
            held[k] += 1
    return sorted(picked.values(), key=lambda e: e.id)


def balanced_take(examples: list[Example], n: int, seed: int) -> list[Example]:
    """A class-balanced subset of ``n`` examples, in id order: the same number per label (a round
    robin over the labels in sorted order, each drawing from its seeded shuffle), so every label gets
    ``n // n_labels`` examples, or all it has when fewer; the class proportions are not kept
    (``data.split.subset: balanced``; ``eval.max_examples`` always draws this way). When labels are
    lists (multi-label, a list-valued intent: :func:`label_classes`), each member class counts, not
    each distinct list."""
    if n >= len(examples):
        return list(examples)
    if any(label_classes(e.label) is not None for e in examples):
        return _balanced_take_sets(examples, n, seed)
    _, queues = _label_queues(examples, seed)
    picked: list[Example] = []
    while len(picked) < n:
        for q in queues:
            if q and len(picked) < n:
                picked.append(q.pop())
    return sorted(picked, key=lambda e: e.id)


def stratified_quotas(counts: list[int], n: int) -> list[int]:
    """Examples per class for a stratified subset of ``n`` out of classes of ``counts`` examples.

    Each class gets its share ``n * count / total`` rounded down, at least 1 when ``n`` allows one
    per class; what is left (or taken back) goes by the largest remainder (Hamilton's method), ties
    to the earlier class. The quotas sum to ``min(n, total)`` and never exceed a class's count.
    """
    total = sum(counts)
    if n >= total:
        return list(counts)
    share = [n * c / total for c in counts]
    quota = [int(x) for x in share]
    if n >= sum(1 for c in counts if c):
        quota = [max(q, 1 if c else 0) for q, c in zip(quota, counts)]
    order = sorted(range(len(counts)), key=lambda k: (-(share[k] - quota[k]), k))
    while sum(quota) < n:
        k = next(k for k in order if quota[k] < counts[k])
        quota[k] += 1
        order.remove(k)
        order.append(k)
    while sum(quota) > n:  # the floor of 1 took too much: take back from the most over-served class
        k = max((k for k in range(len(counts)) if quota[k] > 1), key=lambda k: (quota[k] - share[k], -k))
        quota[k] -= 1
    return quota


def stratified_take(examples: list[Example], n: int, seed: int) -> list[Example]:
    """A stratified subset of ``n`` examples, in id order: each label keeps its share of the split
    (:func:`stratified_quotas`: at least one example of every label when ``n`` allows), drawn from
    the label's seeded shuffle (``data.split.subset: stratified``, the default)."""
    if n >= len(examples):
        return list(examples)
    _, queues = _label_queues(examples, seed)
    quotas = stratified_quotas([len(q) for q in queues], n)
    picked = [ex for q, k in zip(queues, quotas) for ex in q[len(q) - k :]]
    return sorted(picked, key=lambda e: e.id)


#: how ``data.split.max_examples`` draws, by ``data.split.subset``
SUBSET_RULES = {
    "stratified": "stratified: each class keeps its share of the split (at least 1 example when the cap allows)",
    "balanced": "balanced: the same number of examples per class (round robin), class shares not kept",
}


def subset_line(manifest: dict, policy) -> str | None:
    """The data check's statement of how ``data.split.max_examples`` drew the frozen splits, from the
    manifest's ``subset`` record; a manifest written before the rule was recorded drew class-balanced
    subsets. None when nothing was capped."""
    rec = manifest.get("subset")
    caps = (rec or {}).get("max_examples") or dict(policy.max_examples)
    if not caps:
        return None
    head = "split caps (data.split.max_examples): " + ", ".join(f"{k} {v}" for k, v in caps.items()) + ", drawn "
    if rec is None:
        line = head + SUBSET_RULES["balanced"] + f" ({MANIFEST} was written before the rule was recorded)"
        drawn = "balanced"
    else:
        line, drawn = head + rec["description"], rec["rule"]
    if drawn != getattr(policy, "subset", drawn):
        line += f"; data.split.subset is now {policy.subset}: the frozen {MANIFEST} keeps its draw"
    return line


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
    """Raises :class:`TuneproofError` naming the count of duplicated example ids and each with both
    sources (past 20, the rest in a file the error names: :func:`~tuneproof.data.rows.capped`), so that all
    are fixed in one pass."""
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
            f"{len(dups)} duplicate example ids: " + capped(dups, "duplicate-ids"),
            hint="set data.fields.id to a unique column",
        )


def build_splits(
    examples: list[Example], policy, test_split: str, dedup=None, info: dict | None = None
) -> dict[str, list[Example]]:
    """Assign every example to a split.

    Examples whose source gives a split keep it; the rest are split by ``policy.fractions``. When no
    split named in ``policy.fractions`` is given by the sources and ``policy.carve_from`` is set, it is
    carved out of that split (stratified, with its fraction; e.g. a test split out of train). ``policy.max_examples``
    then caps splits by a subset drawn as ``policy.subset`` says (:data:`SUBSET_RULES`). Whenever tuneproof
    cuts a split itself, duplicate groups
    (:func:`duplicate_groups` with ``dedup``, the ``data.dedup`` settings) stay whole; ``info``,
    when given, receives ``{"grouping": rule, "groups_kept_whole": number of groups of 2+}`` and, with caps,
    ``"subset": {"rule", "description", "max_examples"}``.

    Raises:
        TuneproofError: an empty split, duplicate example ids, fractions outside [0, 1].
    """
    check_unique_ids(examples)
    splits: dict[str, list[Example]] = defaultdict(list)
    unsplit = []
    for ex in examples:
        (splits[ex.split].append(ex) if ex.split else unsplit.append(ex))
    grouped = 0
    largest = (0, 0)  # (examples in the largest duplicate group kept whole, examples in its pool)

    def cut(pool: list[Example], fractions: dict[str, float]) -> dict[str, list[Example]]:
        nonlocal grouped, largest
        _check_fractions(fractions)
        groups = duplicate_groups(pool, dedup)
        sizes = defaultdict(int)
        for g in groups:
            sizes[g] += 1
        grouped += sum(1 for v in sizes.values() if v > 1)
        largest = max(largest, (max(sizes.values(), default=0), len(pool)))
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
    rule = getattr(policy, "subset", "stratified")
    take = balanced_take if rule == "balanced" else stratified_take
    for name, cap in policy.max_examples.items():
        if name in splits:
            splits[name] = take(splits[name], cap, policy.seed)
    if info is not None:
        info["grouping"] = grouping_rule(dedup)
        info["groups_kept_whole"] = grouped
        if policy.max_examples:
            caps = dict(policy.max_examples)
            info["subset"] = {"rule": rule, "description": SUBSET_RULES[rule], "max_examples": caps}
    result = {}
    for name, items in splits.items():
        if not items and largest[0] > 1 and largest[0] * 2 > largest[1]:
            raise TuneproofError(
                f"split '{name}' is empty: {largest[0]} of {largest[1]} examples are linked as duplicates "
                f"(exact, normalised or near, Jaccard >= {grouping_rule(dedup)['threshold']} of the input with its "
                "earlier turns) and a group of duplicates is kept whole in one split",
                hint="text shared by every row (a long common preamble, few-shot turns) belongs in a system "
                "message or eval.prompt; else raise data.dedup.threshold, or give each source its split",
            )
        if not items:
            raise TuneproofError(f"split '{name}' is empty", hint="check data.sources and data.split")
        result[name] = [replace(ex, split=name) for ex in sorted(items, key=lambda e: e.id)]
    return result


#: how the manifest's default ids number JSON Lines rows (recorded; a manifest without it is older)
ID_NUMBERING = "file line"


def split_order(names, eval_split: str, test_split: str) -> list[str]:
    """Split names in the order screens and records list them: ``train``, the evaluation split
    (``eval.split``), the other splits sorted, the reserved test split (``data.test_split``) last.
    Stable whatever order the sources or the split manifest gave them."""
    names = list(names)
    head = [n for n in ("train", eval_split) if n in names]
    tail = [test_split] if test_split in names and test_split not in head else []
    return list(dict.fromkeys(head + sorted(n for n in names if n not in head and n not in tail) + tail))


def split_settings(policy, test_split: str, dedup=None) -> dict:
    """The settings that decide which example goes to which split, as recorded in the manifest
    (``settings``): ``data.split.seed``, ``fractions``, ``max_examples``, ``subset``, ``carve_from``,
    ``data.test_split`` and the duplicate-grouping rule (:func:`grouping_rule`)."""
    return {
        "data.split.seed": policy.seed,
        "data.split.fractions": dict(policy.fractions),
        "data.split.max_examples": dict(policy.max_examples),
        "data.split.subset": getattr(policy, "subset", "stratified"),
        "data.split.carve_from": policy.carve_from,
        "data.test_split": test_split,
        "data.dedup (grouping)": {k: v for k, v in grouping_rule(dedup).items() if k != "rule"},
    }


def changed_settings(manifest: dict, settings: dict) -> list[str]:
    """``["data.split.max_examples: {'validation': 70} -> {'validation': 50}", ...]``: the settings
    that differ from those the manifest records. A manifest written before settings were recorded
    is compared on what it holds: the caps of its ``subset`` record (none: uncapped)."""
    recorded = manifest.get("settings")
    if recorded is None:
        caps = (manifest.get("subset") or {}).get("max_examples") or {}
        recorded = {"data.split.max_examples": caps}
    return [f"{k}: {recorded[k]} -> {settings[k]}" for k in settings if k in recorded and recorded[k] != settings[k]]


def manifest_of(
    splits: dict[str, list[Example]],
    grouping: dict | None = None,
    subset: dict | None = None,
    settings: dict | None = None,
) -> dict:
    """The manifest: example ids per split, their hash, how default ids number JSON Lines rows
    (``id_numbering``), the split settings that cut it (``settings``, :func:`split_settings`), (when
    tuneproof cut splits) the grouping rule and (when ``data.split.max_examples`` capped splits) how
    the subsets were drawn."""
    out = {
        "splits": {name: [e.id for e in items] for name, items in sorted(splits.items())},
        "hash": sha256_json({n: [e.id for e in v] for n, v in sorted(splits.items())}),
        "id_numbering": ID_NUMBERING,
    }
    if settings is not None:
        out["settings"] = settings
    if grouping is not None:
        out["grouping"] = grouping
    if subset is not None:
        out["subset"] = subset
    return out


def freeze_or_reuse(
    study_dir: Path,
    splits,
    examples: list[Example],
    grouping: dict | None = None,
    subset=None,
    info=None,
    *,
    settings: dict | None = None,
    runs_using: Callable[[], list[str]] | None = None,
) -> tuple[dict[str, list[Example]], bool]:
    """Write ``splits.json`` the first time; afterwards rebuild the splits from it.

    ``splits`` is the split dict, or a zero-argument callable returning it (only called when no
    manifest exists yet, so a frozen study does not cut again). ``grouping`` and ``subset`` (dicts, or
    zero-argument callables returning them, called after ``splits``) are recorded in the manifest,
    and so are ``settings`` (:func:`split_settings` of the study).

    When ``settings`` differ from the manifest's (:func:`changed_settings`), or the manifest names
    example ids the data no longer has, ``runs_using()`` (the ids of the runs that used the manifest)
    decides: none, the splits are cut again and the manifest rewritten (``info["resplit"]`` lists
    why); some, the study is refused.

    A manifest without ``id_numbering`` was written when JSON Lines ids were 0-based record indices
    (``d:2`` for ``d.jsonl:3``): its JSON Lines examples keep those ids (``Example.meta``
    :data:`~tuneproof.data.sources.LEGACY_ID`), so the study's runs, outputs and comparisons stay
    consistent; ``info`` (when given) receives ``{"legacy_ids": n}``, the number of examples renamed.

    Returns ``(splits, created)`` (``created`` also when the manifest was rewritten).

    Raises:
        TuneproofError: the split settings changed, or the manifest names example ids that the
            current data no longer has, after a run used the manifest (names the file, what changed
            and the runs).
    """
    path = study_dir / MANIFEST

    def cut_and_write() -> tuple[dict[str, list[Example]], bool]:
        made = splits() if callable(splits) else splits
        record = manifest_of(
            made, grouping() if callable(grouping) else grouping, subset() if callable(subset) else subset, settings
        )
        write_json(path, record)
        return made, True

    if not path.exists():
        return cut_and_write()
    manifest = read_json(path)
    if not isinstance(manifest, dict) or not isinstance(manifest.get("splits"), dict):
        raise TuneproofError(
            f"{path}: not a split manifest (no 'splits' object)",
            hint="restore it from a backup, or delete it when no run used it (the splits are then cut again)",
        )
    changed = changed_settings(manifest, settings) if settings is not None else []
    ids = {e.id for e in examples} | {e.meta[LEGACY_ID] for e in examples if LEGACY_ID in e.meta}
    gone = sum(1 for names in manifest["splits"].values() for i in names if i not in ids)
    if changed or gone:
        why = changed + ([f"{gone} example ids it names are not in the data any more"] if gone else [])
        used = runs_using() if runs_using is not None else ["(unknown)"]
        if not used:
            if info is not None:
                info["resplit"] = why
            return cut_and_write()
        if changed:
            shown = ", ".join(used[:5]) + (f" and {len(used) - 5} more" if len(used) > 5 else "")
            raise TuneproofError(
                f"{path} was cut with other split settings ({'; '.join(changed)}) and runs {shown} used it",
                hint="put the settings back as the manifest records them, or start a new study folder for the new "
                "split (the manifest is frozen once a run used it, so every run sees the same split)",
            )
    frozen = manifest["splits"]
    if "id_numbering" not in manifest:  # written before JSON Lines ids followed file lines: keep its ids
        renamed = [replace(e, id=e.meta[LEGACY_ID]) if LEGACY_ID in e.meta else e for e in examples]
        n_legacy = sum(1 for e in examples if LEGACY_ID in e.meta)
        if n_legacy:
            check_unique_ids(renamed)
            examples = renamed
            if info is not None:
                info["legacy_ids"] = n_legacy
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
