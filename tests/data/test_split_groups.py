"""Splits that do not leak (docs/PROTOCOL.md step 3): when tuneproof cuts splits itself (fractions or
carve_from), exact, normalised and near-duplicate texts go to one split whole, and the manifest
records the grouping rule."""

from __future__ import annotations

import json

import pytest

from tuneproof.data.dedup import find_duplicates
from tuneproof.data.examples import Example
from tuneproof.data.split import build_splits, duplicate_groups, freeze_or_reuse, stratified_split
from tuneproof.errors import TuneproofError
from tuneproof.study import Dedup, SplitPolicy

WORDS = (
    "rent tax lease deposit tenant landlord notice clause court payment damage repair term renewal "
    "breach penalty insurance utility parking pet"
).split()


def _pool(n_unique=120, groups=15):
    """``n_unique`` distinct texts plus ``groups`` planted duplicate groups of 4: an exact copy, a
    case/punctuation variant (normalised) and a one-word edit (near, Jaccard >= 0.8 on word 3-grams)."""
    out, planted = [], []
    for i in range(n_unique):
        words = [WORDS[(i * 7 + j * 5 + i // 20) % len(WORDS)] for j in range(12)] + [f"n{i}"]
        out.append(Example(id=f"u{i:04d}", text=" ".join(words), label="ab"[i % 2], source=f"d.csv:{i + 2}"))
    for g in range(groups):
        base = " ".join(f"{WORDS[(g + j * 3) % len(WORDS)]}" for j in range(20)) + f" group{g} marker"
        variants = [base, base, base.upper() + "!", base.replace(f"group{g}", f"group{g} also")]
        ids = []
        for k, text in enumerate(variants):
            ids.append(f"g{g:02d}-{k}")
            out.append(Example(id=ids[-1], text=text, label="ab"[g % 2], source=f"d.csv:{1000 + 4 * g + k}"))
        planted.append(ids)
    return out, planted


def test_planted_duplicate_groups_never_cross_splits():
    pool, planted = _pool()
    groups = duplicate_groups(pool, Dedup())
    gid = {ex.id: g for ex, g in zip(pool, groups)}
    assert all(len({gid[i] for i in ids}) == 1 for ids in planted)  # each planted group found whole
    assert len(set(groups)) == 120 + 15
    info: dict = {}
    splits = build_splits(
        pool, SplitPolicy(seed=13, fractions={"train": 0.6, "validation": 0.2, "test": 0.2}), "test", Dedup(), info
    )
    where = {ex.id: name for name, items in splits.items() for ex in items}
    crossing = [ids for ids in planted if len({where[i] for i in ids}) > 1]
    assert crossing == []
    assert sum(len(v) for v in splits.values()) == 180
    report = find_duplicates(splits)
    assert {k: p.counts["near"]["pairs"] for k, p in report.pairs.items() if p.first != p.second} == {
        "train/validation": 0,
        "train/test": 0,
        "validation/test": 0,
    }
    assert info["groups_kept_whole"] == 15 and info["grouping"]["threshold"] == 0.8
    # without grouping the same seed puts planted copies in different splits (the leak this prevents)
    plain = stratified_split(pool, {"train": 0.6, "validation": 0.2, "test": 0.2}, 13)
    where_plain = {ex.id: name for name, items in plain.items() for ex in items}
    assert sum(len({where_plain[i] for i in ids}) > 1 for ids in planted) > 0


def test_carve_from_keeps_groups_whole_and_manifest_records_rule(tmp_path):
    pool, planted = _pool(60, 8)
    given = [
        Example(id=f"v{i}", text=f"validation sentence {i} unique words here", label="ab"[i % 2], split="validation")
        for i in range(10)
    ]
    train = [ex.__class__(**{**ex.__dict__, "split": "train"}) for ex in pool]
    policy = SplitPolicy(seed=5, fractions={"train": 0.75, "validation": 0.0, "test": 0.25}, carve_from="train")
    info: dict = {}
    splits, created = freeze_or_reuse(
        tmp_path,
        lambda: build_splits(train + given, policy, "test", Dedup(), info),
        train + given,
        grouping=lambda: info.get("grouping"),
    )
    assert created and sorted(splits) == ["test", "train", "validation"]
    where = {ex.id: name for name, items in splits.items() for ex in items}
    assert [ids for ids in planted if len({where[i] for i in ids}) > 1] == []
    assert len(splits["test"]) + len(splits["train"]) == 92 and len(splits["validation"]) == 10
    manifest = json.loads((tmp_path / "splits.json").read_text())
    assert manifest["grouping"] == {
        "rule": "exact, normalised and near-duplicate texts (data.dedup settings) are kept in one split",
        "threshold": 0.8,
        "shingles": "word",
        "ngram": 3,
        "num_perm": 128,
    }


def test_without_duplicates_the_split_is_unchanged_and_bad_fractions_named():
    items = [
        Example(id=f"e{i:03d}", text=f"completely different text number {i} " + "x" * i, label="abc"[i % 3])
        for i in range(90)
    ]
    grouped = stratified_split(items, {"train": 0.8, "validation": 0.1, "test": 0.1}, 3, duplicate_groups(items))
    plain = stratified_split(items, {"train": 0.8, "validation": 0.1, "test": 0.1}, 3)
    assert {k: [e.id for e in v] for k, v in grouped.items()} == {k: [e.id for e in v] for k, v in plain.items()}
    assert [len(v) for v in plain.values()] == [72, 9, 9]
    with pytest.raises(
        TuneproofError, match=r"data.split.fractions.train is 1.5: each fraction must be between 0 and 1"
    ):
        stratified_split(items, {"train": 1.5, "test": -0.5}, 3)


def test_banking77_carved_validation_has_no_duplicate_of_train(shared_data):
    """Real data: BANKING77 train holds exact and near-duplicate texts; carving validation out of it
    (the classification template's split) puts none of them across train/validation."""
    from dataclasses import replace

    from tuneproof.data.sources import load_banking77

    train = [e for e in load_banking77(shared_data / "banking77")[0] if e.split == "train"]
    policy = SplitPolicy(seed=13, fractions={"train": 0.9, "validation": 0.1}, carve_from="train")
    splits = build_splits(train, policy, "test", Dedup())
    assert len(splits["train"]) + len(splits["validation"]) == 10003
    report = find_duplicates(splits)
    assert report.pair("train", "validation").counts["near"]["pairs"] == 0
    # the same carve without grouping (old behaviour) leaks
    plain = stratified_split(train, {"train": 0.9, "validation": 0.1}, 13)
    plain = {k: [replace(e, split=k) for e in v] for k, v in plain.items()}
    assert find_duplicates(plain).pair("train", "validation").counts["near"]["second_colliding"] > 0


def test_a_split_left_empty_by_one_duplicate_group_says_so_not_check_the_sources():
    # texts that differ in one word of forty: every input is a near duplicate of every other
    body = " ".join(f"word{k}" for k in range(40))
    pool = [
        Example(id=f"c{i:02d}", text=f"{body} request{i}", label=None, target="x", source=f"c.jsonl:{i + 1}")
        for i in range(30)
    ]
    policy = SplitPolicy(fractions={"train": 0.8, "validation": 0.1, "test": 0.1})
    with pytest.raises(TuneproofError) as err:
        build_splits(pool, policy, "test")
    assert "is empty: 30 of 30 examples are linked as duplicates" in str(err.value)
    assert "Jaccard >= 0.8" in str(err.value) and "data.dedup.threshold" in err.value.hint
