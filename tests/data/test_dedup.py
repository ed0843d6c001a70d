"""Duplicates across and inside splits (docs/CASES.md C14) and the MinHash/LSH machinery behind them."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import numpy as np
import pytest
from datasketch import LeanMinHash, MinHashLSH

from tuneproof.data import dedup
from tuneproof.data.cleaning import clean, validate
from tuneproof.data.dedup import (
    apply_policy,
    estimate_floor,
    find_duplicates,
    jaccard,
    lsh_candidates,
    lsh_params,
    minhash_signatures,
    normalise,
    shingle_set,
)
from tuneproof.data.examples import Example
from tuneproof.errors import TuneproofError

BANKING77 = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "banking77"


def _split(name: str, texts: list[str]) -> list[Example]:
    return [Example(id=f"{name}/{i}", text=t, split=name, source=f"{name}.csv:{i + 2}") for i, t in enumerate(texts)]


def _c14() -> dict[str, list[Example]]:
    return {
        "train": _split("train", ["a b c", "hello world ", "x"]),
        "test": _split("test", ["hello world", "a b c", "zzz"]),
    }


# --------------------------------------------------------------------------- normalise / shingles
@pytest.mark.parametrize(
    "raw, expected",
    [
        ("  Hello,   WORLD! ", "hello world"),
        ("hello world ", "hello world"),
        ("\n\nWhat businesses accept this card?", "what businesses accept this card"),
        ("ﬁne ＡＢＣ", "fine abc"),  # NFKC: ligature and full-width letters
        ("Straße", "strasse"),  # casefold, not lower
        ("don't", "dont"),  # punctuation deleted, not replaced by a space
        ("«¿Qué?» — sí…", "qué sí"),  # non-ASCII punctuation
        ("pay $5 + 10%", "pay $5 + 10"),  # symbols kept, % is punctuation (Po)
        ("\t", ""),
        ("pay\u200bment", "payment"),  # ZERO WIDTH SPACE
        ("\ufeffhello", "hello"),  # byte-order mark
        ("co\u00adoperate", "cooperate"),  # soft hyphen
        ("a\u200cb\u200dc", "abc"),  # ZWNJ, ZWJ
        ("a\u2060b\u200e\u202ec\u2066", "abc"),  # word joiner, LRM, bidi override and isolate (Cf)
        ("card\ufe0f\U000e0041", "card"),  # variation selector, tag character
        ("a\x00b\x7f", "ab"),  # non-whitespace controls
        ("\u200b\ufeff", ""),
        ("ｐａｙ\u200bｍｅｎｔ", "payment"),  # NFKC and invisible together
    ],
)
def test_normalise(raw, expected):
    assert normalise(raw) == expected


def test_a_zero_width_space_pair_across_train_and_validation_is_a_normalised_duplicate():
    splits = {
        "train": _split("train", ["how do i top\u200b up my card", "unrelated text here"]),
        "validation": _split("validation", ["\ufeffHow do I top up my card?", "something else entirely"]),
    }
    p = find_duplicates(splits).pair("train", "validation")
    assert p.counts["exact"]["pairs"] == 0
    assert p.counts["normalised"]["pairs"] == 1
    assert [(c.kind, c.id_a, c.id_b) for c in p.collisions] == [("normalised", "train/0", "validation/0")]


def test_invisible_only_texts_are_empty_for_drop_empty_and_validation():
    examples = _split("train", ["\u200b\ufeff", "ok", " \u00ad "])
    kept, dropped = clean(examples, ["strip", "drop_empty"])
    assert [e.id for e in kept] == ["train/1"]
    assert [d["id"] for d in dropped] == ["train/0", "train/2"]
    with pytest.raises(TuneproofError, match=r"2 empty text\(s\): train.csv:2, train.csv:4"):
        validate(examples)
    cleaned, _ = clean(_split("train", ["top\u200bup\u2060"]), ["remove_invisible"])
    assert cleaned[0].text == "topup"


def test_past_twenty_empty_texts_the_error_names_a_file_listing_them_all(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    with pytest.raises(TuneproofError) as err:
        validate(_split("train", [" "] * 23))
    msg = err.value.message
    assert msg.startswith("23 empty text(s): train.csv:2, ") and "train.csv:20, train.csv:21 and 3 more, all 23 " in msg
    listed = Path(msg.rsplit(" listed in ", 1)[1])
    assert listed.read_text().splitlines() == [f"train.csv:{i}" for i in range(2, 25)]


def test_shingle_set_word_char_and_short_texts():
    assert shingle_set("a b c d") == {"a b c", "b c d"}
    assert shingle_set("hello world") == {"hello world"}  # fewer words than n: the whole text
    assert shingle_set("x") == {"x"}
    assert shingle_set("") == set()
    assert shingle_set("abcd", "char", 3) == {"abc", "bcd"}
    assert shingle_set("ab", "char", 3) == {"ab"}
    assert jaccard({"a", "b"}, {"b", "c"}) == pytest.approx(1 / 3)


# --------------------------------------------------------------------------- docs/CASES.md C14
def test_c14_exact_and_normalised_overlap_with_ids():
    report = find_duplicates(_c14())
    p = report.pair("train", "test")
    assert p.counts["exact"] == {
        "pairs": 1,
        "first_colliding": 1,
        "second_colliding": 1,
        "fraction": pytest.approx(1 / 3),
    }
    assert p.counts["normalised"]["second_colliding"] == 2
    assert p.counts["normalised"]["fraction"] == pytest.approx(2 / 3)
    assert p.counts["near"]["fraction"] == pytest.approx(2 / 3)
    got = [(c.kind, c.id_a, c.id_b, c.text_a, c.text_b, c.similarity) for c in p.collisions]
    assert got == [
        ("exact", "train/0", "test/1", "a b c", "a b c", 1.0),
        ("normalised", "train/1", "test/0", "hello world ", "hello world", 1.0),
    ]
    assert report.pair("train", "train").collisions == []
    assert report.pair("test", "test").collisions == []
    assert set(report.pairs) == {"train/train", "train/test", "test/test"}
    d = json.loads(json.dumps(report.to_dict()))
    assert d["pairs"]["train/test"]["counts"]["exact"]["pairs"] == 1
    assert d["split_sizes"] == {"train": 3, "test": 3}
    assert d["settings"]["lsh_bands"] == 21 and d["settings"]["lsh_rows"] == 6
    assert report.summary_lines()[0] == (
        "train/test: of 3 test examples also in train: 1 (33.3%) exact, 2 (66.7%) normalised, "
        "2 (66.7%) near (Jaccard >= 0.8)"
    )


def test_c14_drop_from_train_policy():
    splits = _c14()
    report = find_duplicates(splits)
    kept, dropped = apply_policy(splits, report, "drop-from-train")
    assert dropped == ["train/0", "train/1"]
    assert [e.id for e in kept] == ["train/2"]
    same, none = apply_policy(splits, report, "report")
    assert same == splits["train"] and none == []


def test_near_duplicates_use_the_exact_jaccard():
    base = "the quick brown fox jumps over the lazy dog"
    train = _split("train", [base, "completely different words in this one sentence", "the cat sat on the mat today"])
    test = _split("test", [base + " today", "the dog sat on the mat today"])  # 7/8 = 0.875 ; 3/5 = 0.6 trigram overlap
    report = find_duplicates({"train": train, "test": test})
    p = report.pair("train", "test")
    assert [(c.kind, c.id_a, c.id_b) for c in p.collisions] == [("near", "train/0", "test/0")]
    assert p.collisions[0].similarity == pytest.approx(7 / 8)
    assert 0.6 < p.collisions[0].minhash_estimate <= 1.0
    assert p.counts["exact"]["pairs"] == 0 and p.counts["normalised"]["pairs"] == 0
    assert p.counts["near"] == {"pairs": 1, "first_colliding": 1, "second_colliding": 1, "fraction": 0.5}
    # at threshold 0.9 the 0.875 pair is not a near-duplicate
    assert find_duplicates({"train": train, "test": test}, threshold=0.9).pair("train", "test").collisions == []
    # char shingles see the same pair (39 character 5-grams shared, 45 in the union)
    chars = find_duplicates({"train": train, "test": test}, shingles="char", ngram=5).pair("train", "test")
    assert [(c.id_a, c.id_b) for c in chars.collisions] == [("train/0", "test/0")]
    assert chars.collisions[0].similarity == pytest.approx(39 / 45)


def test_inside_a_split_copies_are_chained_to_the_first():
    train = _split("train", ["Hi there", "hi there", "Hi there", "hi there!", "hi there"])
    p = find_duplicates({"train": train}).pair("train", "train")
    assert [(c.kind, c.id_a, c.id_b) for c in p.collisions] == [
        ("normalised", "train/0", "train/1"),
        ("exact", "train/0", "train/2"),
        ("normalised", "train/0", "train/3"),
        ("exact", "train/1", "train/4"),
    ]
    assert p.counts["exact"]["second_colliding"] == 2  # 5 texts, 3 distinct raw texts
    assert p.counts["normalised"]["second_colliding"] == 4  # 5 texts, 1 distinct normalised text
    assert p.counts["normalised"]["fraction"] == pytest.approx(4 / 5)


def test_many_copies_across_splits_are_star_linked_not_multiplied():
    train = _split("train", ["hi"] * 50 + ["unrelated text here"])
    test = _split("test", ["Hi"] * 30 + ["hi"] * 2)
    splits = {"train": train, "test": test}
    p = find_duplicates(splits).pair("train", "test")
    assert len(p.collisions) == 50 + 32 - 1  # not 50 * 32
    assert p.counts["exact"] == {
        "pairs": 51,
        "first_colliding": 50,
        "second_colliding": 2,
        "fraction": pytest.approx(2 / 32),
    }
    assert p.counts["normalised"]["first_colliding"] == 50 and p.counts["normalised"]["second_colliding"] == 32
    assert ("normalised", "train/0", "test/0") == (p.collisions[0].kind, p.collisions[0].id_a, p.collisions[0].id_b)
    within = find_duplicates(splits).pair("train", "train")
    assert within.counts["exact"]["pairs"] == 49 and all(c.id_a == "train/0" for c in within.collisions)
    _, dropped = apply_policy(splits, find_duplicates(splits), "drop-from-train")
    assert dropped == [f"train/{i}" for i in range(50)]


def test_three_splits_every_pair_and_policy_uses_validation_too():
    splits = {
        "test": _split("test", ["where is my card"]),
        "train": _split("train", ["Where is my card?", "how do i top up", "a new phone"]),
        "validation": _split("validation", ["How do I top up", "where is my card"]),
    }
    report = find_duplicates(splits)
    assert list(report.pairs) == [
        "train/train",
        "train/validation",
        "train/test",
        "validation/validation",
        "validation/test",
        "test/test",
    ]
    assert report.pair("train", "validation").counts["normalised"]["second_colliding"] == 2
    assert [(c.kind, c.id_a, c.id_b) for c in report.pair("validation", "test").collisions] == [
        ("exact", "validation/1", "test/0")
    ]
    kept, dropped = apply_policy(splits, report, "drop-from-train")
    assert dropped == ["train/0", "train/1"] and [e.id for e in kept] == ["train/2"]


def test_empty_texts_are_normalised_duplicates_but_never_near():
    report = find_duplicates({"train": _split("train", ["?", "a b c"]), "test": _split("test", ["!!", "a b d"])})
    p = report.pair("train", "test")
    assert [(c.kind, c.id_a, c.id_b) for c in p.collisions] == [("normalised", "train/0", "test/0")]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"threshold": 0.0}, "threshold must be in (0, 1]"),
        ({"threshold": 1.5}, "threshold must be in (0, 1]"),
        ({"threshold": "0.8"}, "threshold must be in (0, 1]"),
        ({"shingles": "token"}, "shingles must be 'word' or 'char'"),
        ({"ngram": 0}, "ngram must be an integer >= 1"),
        ({"num_perm": 8}, "num_perm must be an integer >= 16"),
    ],
)
def test_bad_settings_are_user_errors(kwargs, message):
    with pytest.raises(TuneproofError, match=message.replace("(", r"\(").replace(")", r"\)").replace("]", r"\]")):
        find_duplicates(_c14(), **kwargs)


def test_bad_inputs_are_user_errors():
    with pytest.raises(TuneproofError, match="non-empty dict"):
        find_duplicates({})
    twice = {"train": _split("train", ["a"]), "test": [Example(id="train/0", text="b", source="test.csv:2")]}
    with pytest.raises(
        TuneproofError, match=r"test.csv:2: example id 'train/0' occurs twice \(splits 'train' and 'test'\)"
    ):
        find_duplicates(twice)
    with pytest.raises(TuneproofError, match="split 'train' must be a list of Example, got NoneType"):
        find_duplicates({"train": None})  # type: ignore[dict-item]
    with pytest.raises(TuneproofError, match="has no text string"):
        find_duplicates({"train": [Example(id="x", text=None, source="t.csv:5")]})  # type: ignore[arg-type]
    splits = _c14()
    report = find_duplicates(splits)
    with pytest.raises(TuneproofError, match="unknown policy 'drop'"):
        apply_policy(splits, report, "drop")  # type: ignore[arg-type]
    with pytest.raises(TuneproofError, match="no 'train' split"):
        apply_policy({"test": splits["test"]}, report, "drop-from-train")
    with pytest.raises(TuneproofError, match="the report was computed on splits"):
        apply_policy({"train": splits["train"][:2], "test": splits["test"]}, report, "drop-from-train")
    with pytest.raises(TuneproofError, match="no split pair 'train/validation'"):
        report.pair("train", "validation")


# --------------------------------------------------------------------------- MinHash / LSH machinery
def test_lsh_params_give_candidate_probability_099_at_the_threshold():
    assert lsh_params(0.8, 128) == (21, 6)
    for t in (0.5, 0.7, 0.8, 0.9, 1.0):
        b, r = lsh_params(t, 128)
        assert b * r <= 128 and b >= 2
        assert 1 - (1 - t**r) ** b >= 0.99
        if r < 64:  # one more row per band would drop below 0.99
            b2, r2 = 128 // (r + 1), r + 1
            assert b2 < 2 or 1 - (1 - t**r2) ** b2 < 0.99


def _random_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(40)]
    texts = [" ".join(rng.choice(vocab) for _ in range(rng.randint(3, 12))) for _ in range(n)]
    texts += [t + " extra" for t in texts[: n // 4]]  # near-duplicates, so buckets are not all singletons
    return texts


def test_minhash_signatures_equal_datasketch(monkeypatch):
    monkeypatch.setattr(dedup, "_CHUNK_SHINGLES", 7)  # force many blocks, including one text per block
    lists = [sorted(shingle_set(normalise(t))) for t in _random_texts(60)]
    fast = minhash_signatures(lists, num_perm=64, seed=3)
    assert fast.dtype == np.uint32 and fast.shape == (len(lists), 64)
    np.testing.assert_array_equal(fast, dedup._signatures_datasketch(lists, 64, 3))


def test_lsh_candidates_equal_datasketch_minhashlsh():
    lists = [sorted(shingle_set(normalise(t))) for t in _random_texts(400, seed=1)]
    sigs = minhash_signatures(lists, num_perm=128, seed=1)
    b, r = lsh_params(0.5, 128)
    ours = {tuple(p) for p in lsh_candidates(sigs, b, r).tolist()}
    lsh = MinHashLSH(num_perm=128, params=(b, r))
    mhs = [LeanMinHash(seed=1, hashvalues=s, scheme="affine32") for s in sigs]
    for k, m in enumerate(mhs):
        lsh.insert(k, m)
    theirs = {(k, j) for k, m in enumerate(mhs) for j in lsh.query(m) if j > k}
    assert len(theirs) > 100
    assert ours == theirs


# --------------------------------------------------------------------------- real data
def _read_banking77(name: str) -> list[Example]:
    with open(BANKING77 / f"{name}.csv", encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    return [
        Example(id=f"{name}.csv:{i + 2}", text=r["text"], label=r["category"], split=name) for i, r in enumerate(rows)
    ]


@pytest.mark.skipif(not BANKING77.is_dir(), reason="../shared/data/banking77 not present")
def test_banking77_train_test_overlap():
    splits = {"train": _read_banking77("train"), "test": _read_banking77("test")}
    # SOURCE.md counts 6 shared texts after strip + case folding:
    train_keys = {e.text.strip().casefold() for e in splits["train"]}
    assert sum(e.text.strip().casefold() in train_keys for e in splits["test"]) == 6
    report = find_duplicates(splits)
    p = report.pair("train", "test")
    assert p.counts["exact"]["second_colliding"] == 0
    # normalise() also collapses inner whitespace ("UK.  Can" / "UK. Can": +1) and removes
    # punctuation ("address ?" / "address?", "reverted, why?" / "reverted.  Why?", ...: +4).
    assert p.counts["normalised"]["second_colliding"] == 11
    assert p.counts["normalised"]["pairs"] == 11
    texts = {(c.text_a, c.text_b) for c in p.collisions if c.kind == "normalised"}
    assert ("How do I change my address ?", "How do I change my address?") in texts
    assert ("\nHow do I unblock my PIN?", "How do I unblock my PIN?") in texts
    assert p.counts["near"]["second_colliding"] == 56  # word 3-gram Jaccard >= 0.8, seed 1
    assert all(c.similarity >= 0.8 for c in p.collisions)
    within = report.pair("train", "train")
    assert within.counts["exact"]["second_colliding"] == 0
    assert within.counts["normalised"]["second_colliding"] == 10
    kept, dropped = apply_policy(splits, report, "drop-from-train")
    assert len(dropped) == p.counts["near"]["first_colliding"]
    assert len(kept) == 10003 - len(dropped)


def test_estimate_floor_filters_only_low_estimates():
    assert estimate_floor(0.8, 128) == pytest.approx(0.8 - 4 * (0.8 * 0.2 / 128) ** 0.5)  # 0.6586
    lists = [sorted(shingle_set(normalise(t))) for t in _random_texts(400, seed=2)]
    sigs = minhash_signatures(lists, num_perm=128, seed=1)
    b, r = lsh_params(0.5, 128)
    everything = lsh_candidates(sigs, b, r)
    kept = lsh_candidates(sigs, b, r, min_estimate=0.6)
    estimates = (sigs[everything[:, 0]] == sigs[everything[:, 1]]).mean(axis=1)
    np.testing.assert_array_equal(kept, everything[estimates >= 0.6])
    assert 0 < len(kept) < len(everything)


def test_large_buckets_are_filtered_blockwise(monkeypatch):
    monkeypatch.setattr(dedup, "_PAIR_BLOCK_BYTES", 128 * 40)  # a few rows per block
    lists = [sorted(shingle_set(normalise(t))) for t in _random_texts(300, seed=3)]
    sigs = minhash_signatures(lists, num_perm=128, seed=1)
    sigs[:60, :6] = 7  # one bucket of 60 rows in band 0
    everything = lsh_candidates(sigs, 21, 6)
    kept = lsh_candidates(sigs, 21, 6, min_estimate=0.5)
    estimates = (sigs[everything[:, 0]] == sigs[everything[:, 1]]).mean(axis=1)
    assert len(everything) >= 60 * 59 // 2
    np.testing.assert_array_equal(kept, everything[estimates >= 0.5])


def test_duplicates_inside_one_split_are_said_plainly():
    """The data check's line for copies inside a split (the quickstart printed "test/test: of 140
    test examples duplicate an earlier one: ..."): the split once, the count of examples first."""
    splits = {
        "train": [Example(id=f"train/{i}", text=t) for i, t in enumerate(["a b c d", "e f g h", "a b c d", "i j k l"])],
        "test": [Example(id="test/0", text="m n o p")],
    }
    lines = find_duplicates(splits).summary_lines()
    assert (
        "train (inside the split): 1 of 4 examples repeat an earlier one: 1 (25.0%) exact, 1 (25.0%) normalised, "
        "1 (25.0%) near (Jaccard >= 0.8)" in lines
    )


def test_a_preamble_of_turns_shared_by_most_rows_is_left_out_like_a_system_message():
    from tuneproof.data.examples import SHARED_TURN_SHARE, shared_turns

    # every conversation repeats the same 6 demonstration turns before its own question
    pre = []
    for q, a in [("what is two plus two", "four"), ("capital of france", "paris"), ("colour of the sky", "blue")]:
        pre += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    questions = {
        "train": ["book a table for two tonight", "play some jazz music", "weather in oslo tomorrow"],
        "validation": ["set an alarm for seven", "play some jazz music"],
    }
    splits = {
        s: [Example(id=f"{s}/{i}", text=q, split=s, context=list(pre)) for i, q in enumerate(qs)]
        for s, qs in questions.items()
    }
    flat = [e for exs in splits.values() for e in exs]
    assert SHARED_TURN_SHARE == 0.5 and len(shared_turns(flat)) == 6
    assert flat[0].dedup_text(shared_turns(flat)) == "book a table for two tonight"
    rep = find_duplicates(splits, threshold=0.5)
    pair = rep.pairs["train/validation"]
    # only the repeated question is a duplicate; the preamble alone would have linked every pair
    assert [(c.kind, c.id_a, c.id_b, c.text_a) for c in pair.collisions] == [
        ("exact", "train/1", "validation/1", "play some jazz music")
    ]
    # a turn held by one row of four is that row's own context: compared
    own = [Example(id="x", text="q", context=[{"role": "user", "content": "hi"}])] + [
        Example(id=f"y{i}", text=f"q{i}") for i in range(3)
    ]
    assert shared_turns(own) == frozenset() and own[0].dedup_text(shared_turns(own)) == "user: hi\nq"
