"""Duplicates between and inside splits (docs/PROTOCOL.md step 3: examples that occur both in
training and in evaluation).

Three levels, each containing the one before it:

- ``exact``: the two texts are identical, byte for byte.
- ``normalised``: identical after :func:`normalise` (invisible characters such as U+200B removed,
  NFKC, casefold, punctuation removed, whitespace collapsed), e.g. ``"hello world "`` and
  ``"Hello, world"``, or ``"hello\u200bworld"`` and ``"helloworld"``.
- ``near``: the Jaccard similarity of the two shingle sets (word or character n-grams of the
  normalised texts) is at least ``threshold``. Normalised-identical pairs count here too.

Near-duplicates are found as in Broder (1997), "On the resemblance and containment of
documents": one MinHash signature per distinct normalised text (identical to
``datasketch.MinHash``, scheme ``affine32``, computed block-wise in numpy), banded exactly as
``datasketch.MinHashLSH`` bands them to propose candidate pairs (:func:`lsh_candidates`, a
sort-based equivalent of its hash tables; a test checks it returns the same candidates), and
each candidate is then verified with the *exact* Jaccard similarity of its two shingle sets
(candidates whose MinHash estimate is more than 4 standard errors below the threshold are
dropped first, :func:`estimate_floor`, which keeps templated corpora from flooding the exact
check). The datasketch documentation of ``MinHashLSH.query`` says its results are approximate and must
be filtered again; filtering on the exact Jaccard (rather than the MinHash estimate, whose
standard error at 128 permutations is about 0.035 near 0.8) means a reported pair is never
below the threshold and a pair at the threshold is not lost to estimation noise. The MinHash
estimate is reported next to it.

The LSH band parameters are not datasketch's default optimiser (which, for threshold 0.8 and 128
permutations, picks 9 bands of 13 rows: only 40% of pairs at similarity 0.8 become candidates).
:func:`lsh_params` picks the bands so that a pair *at* the threshold becomes a candidate with
probability >= 0.99 (the S-curve ``1 - (1 - s**r)**b`` of Leskovec, Rajaraman and Ullman,
*Mining of Massive Datasets*, ch. 3.4); the exact verification removes the extra candidates.
"""

from __future__ import annotations

import functools
import hashlib
import math
import numbers
import sys
import unicodedata
from array import array
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np
from datasketch import MinHash

from tuneproof.data.examples import Example, shared_turns
from tuneproof.data.invisible import invisible_code_points, remove_invisible
from tuneproof.errors import TuneproofError

SPLIT_ORDER = ("train", "validation", "test")
LEVELS = ("exact", "normalised", "near")
CANDIDATE_PROBABILITY_AT_THRESHOLD = 0.99
_CHUNK_SHINGLES = 1 << 16  # shingles hashed per numpy block: 65,536 x num_perm x 4 bytes (32 MiB at 128)


# --------------------------------------------------------------------------- text -> sets
def normalise(text: str) -> str:
    """The text used for the ``normalised`` level and for shingling.

    Steps, in order: invisible characters deleted (zero-width space, ZWNJ, ZWJ, byte-order mark,
    soft hyphen, bidi marks, variation selectors, every Unicode ``Cf`` format character and
    non-whitespace control: :mod:`tuneproof.data.invisible`), Unicode NFKC, ``str.casefold``,
    every character of a Unicode punctuation category (``P*``: ``.,?!'"-()`` and their non-ASCII
    forms) and every invisible character NFKC produced removed (deleted, not replaced by a space:
    ``"don't"`` -> ``"dont"``, ``"pay\u200bment"`` -> ``"payment"``), whitespace runs collapsed to
    one space and stripped. Symbols (``$``, ``%``, ``+``) and digits are kept: they change the
    meaning.
    """
    text = unicodedata.normalize("NFKC", remove_invisible(text)).casefold().translate(_deletion_table())
    return " ".join(text.split())


@functools.cache
def _deletion_table() -> dict[int, None]:
    # Every code point of a Unicode punctuation category and every invisible one, mapped to
    # deletion (built once, ~0.5 s).
    punctuation = (cp for cp in range(sys.maxunicode + 1) if unicodedata.category(chr(cp))[0] == "P")
    return dict.fromkeys(invisible_code_points().union(punctuation))


def shingle_set(normalised_text: str, shingles: str = "word", ngram: int = 3) -> set[str]:
    """The set of shingles of an already normalised text.

    ``"word"``: word n-grams joined by one space. ``"char"``: character n-grams (spaces
    included). A text shorter than ``ngram`` units gives one shingle, the whole text, so short
    texts ("x", "hello world") still compare; an empty text gives the empty set.
    """
    if not normalised_text:
        return set()
    if shingles == "word":
        words = normalised_text.split(" ")
        if len(words) <= ngram:
            return {normalised_text}
        return {" ".join(words[i : i + ngram]) for i in range(len(words) - ngram + 1)}
    if len(normalised_text) <= ngram:
        return {normalised_text}
    return {normalised_text[i : i + ngram] for i in range(len(normalised_text) - ngram + 1)}


def jaccard(a: set, b: set) -> float:
    """|a & b| / |a | b|; 1.0 for two empty sets."""
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


# --------------------------------------------------------------------------- MinHash
def lsh_params(threshold: float, num_perm: int) -> tuple[int, int]:
    """LSH bands ``b`` and rows per band ``r`` (``b * r <= num_perm``).

    Rule: the largest ``r`` (fewest spurious candidates) with ``b = num_perm // r >= 2`` such that
    a pair of Jaccard similarity ``threshold`` becomes a candidate with probability
    ``1 - (1 - threshold**r)**b >= 0.99`` (Mining of Massive Datasets, ch. 3.4). Falls back to
    ``r = 1`` when no ``r`` reaches 0.99. threshold 0.8, 128 permutations -> (21, 6).
    """
    for r in range(num_perm // 2, 0, -1):
        b = num_perm // r
        if 1.0 - (1.0 - threshold**r) ** b >= CANDIDATE_PROBABILITY_AT_THRESHOLD:
            return b, r
    return num_perm, 1


def _fmix32(h: np.ndarray) -> np.ndarray:
    """MurmurHash3 32-bit finalizer (the pre-mix datasketch applies in the affine32 scheme)."""
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def _sha1_32(shingle: str) -> int:
    # Same value as datasketch.hashfunc.sha1_hash32(shingle.encode("utf-8")).
    return int.from_bytes(hashlib.sha1(shingle.encode("utf-8")).digest()[:4], "little")


def minhash_signatures(shingle_lists: Iterable[Iterable[str]], num_perm: int = 128, seed: int = 1) -> np.ndarray:
    """MinHash signatures, ``uint32 [number of texts, num_perm]``.

    Row ``i`` equals ``datasketch.MinHash(num_perm, seed).update_batch([s.encode() for s in
    shingle_lists[i]])`` with datasketch's default ``affine32`` scheme (sha1 32-bit hash,
    MurmurHash3 finalizer, ``a*h + b mod 2**32``), computed block-wise in numpy instead of one
    Python object per text (about 4x less CPU than ``MinHash.bulk``; most of the rest is sha1).
    ``shingle_lists`` may be a generator (it is read once); every shingle list must be
    non-empty (``ValueError`` otherwise). With a datasketch older than 2.0 (legacy scheme only)
    it falls back to ``MinHash.bulk``.
    """
    template = MinHash(num_perm=num_perm, seed=seed)
    if getattr(template, "scheme", "legacy") != "affine32":  # pragma: no cover - datasketch < 2.0
        return _signatures_datasketch(shingle_lists, num_perm, seed)
    a, b = (np.asarray(p, dtype=np.uint32) for p in template.permutations)
    # One pass over the shingles, kept as 4-byte hashes (not Python strings) to bound memory.
    flat_hashes, count_list = array("I"), array("q")
    for shs in shingle_lists:
        before = len(flat_hashes)
        flat_hashes.extend(_sha1_32(s) for s in shs)
        count_list.append(len(flat_hashes) - before)
    counts = np.frombuffer(count_list, dtype=np.int64)
    if counts.size and counts.min() == 0:
        raise ValueError("minhash_signatures: every shingle list must be non-empty")
    hashes = _fmix32(np.frombuffer(flat_hashes, dtype=f"u{flat_hashes.itemsize}").astype(np.uint32))
    del flat_hashes
    ends = np.cumsum(counts)
    out = np.empty((counts.size, num_perm), dtype=np.uint32)
    first = 0
    while first < counts.size:
        start = int(ends[first - 1]) if first else 0
        last = int(np.searchsorted(ends, start + _CHUNK_SHINGLES, side="right"))
        last = max(last, first + 1)
        stop = int(ends[last - 1])
        if stop - start > _CHUNK_SHINGLES:  # one long text: running minimum over blocks
            acc = np.full(num_perm, np.iinfo(np.uint32).max, dtype=np.uint32)
            for lo in range(start, stop, _CHUNK_SHINGLES):
                block = a[:, None] * hashes[None, lo : min(lo + _CHUNK_SHINGLES, stop)] + b[:, None]
                acc = np.minimum(acc, block.min(axis=1))
            out[first] = acc
        else:
            # [num_perm, shingles]: uint32 wraparound is the mod 2**32; reducing along the last,
            # contiguous axis is ~6x faster than along the first.
            permuted = a[:, None] * hashes[None, start:stop] + b[:, None]
            offsets = np.concatenate(([0], ends[first : last - 1] - start))
            out[first:last] = np.minimum.reduceat(permuted, offsets, axis=1).T
        first = last
    return out


def _signatures_datasketch(shingle_lists: list[Iterable[str]], num_perm: int, seed: int) -> np.ndarray:
    """Reference path: one ``datasketch.MinHash`` per text (slow; used by tests and old datasketch)."""
    data = ([s.encode("utf-8") for s in shs] for shs in shingle_lists)
    mhs = MinHash.bulk(data, num_perm=num_perm, seed=seed)
    if not mhs:
        return np.empty((0, num_perm), dtype=np.uint32)
    return np.vstack([m.hashvalues for m in mhs])


_BAND_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # odd 64-bit constant (golden ratio), polynomial band hash


_PAIR_BLOCK_BYTES = 1 << 25  # 32 MiB of slot comparisons at a time when filtering pairs


def estimate_floor(threshold: float, num_perm: int) -> float:
    """The lowest MinHash estimate kept before the exact check: ``threshold - 4 * sigma``.

    ``sigma = sqrt(t (1 - t) / num_perm)`` is the standard error of the MinHash estimator (the
    share of equal slots is a binomial proportion, Broder 1997). A pair whose true Jaccard is at
    the threshold falls below the floor with probability about 3e-5 (normal approximation);
    pairs far below the threshold (templated texts sharing half their shingles) are dropped
    before the exact check. threshold 0.8, 128 permutations -> 0.659.
    """
    return threshold - 4.0 * math.sqrt(threshold * (1.0 - threshold) / num_perm)


def _keep(signatures: np.ndarray, x: np.ndarray, y: np.ndarray, min_equal: float) -> np.ndarray:
    """Mask of pairs (x[i], y[i]) with at least ``min_equal`` equal signature slots (blockwise)."""
    keep = np.empty(x.size, dtype=bool)
    step = max(1, _PAIR_BLOCK_BYTES // signatures.shape[1])
    for lo in range(0, x.size, step):
        hi = lo + step
        keep[lo:hi] = (signatures[x[lo:hi]] == signatures[y[lo:hi]]).sum(axis=1) >= min_equal
    return keep


def _bucket_pairs(
    signatures: np.ndarray, members: np.ndarray, min_equal: float | None
) -> tuple[np.ndarray, np.ndarray]:
    """All pairs i < j of one bucket (``members`` sorted), filtered by equal slots, row-block by
    row-block so a bucket of m rows never holds m^2 comparisons in memory at once."""
    m = members.size
    if min_equal is None:
        iu, ju = np.triu_indices(m, 1)
        return members[iu], members[ju]
    xs, ys = [], []
    block = max(1, _PAIR_BLOCK_BYTES // (m * signatures.shape[1]))
    for lo in range(0, m - 1, block):
        rows_ = members[lo : lo + block]
        rest = members[lo + 1 :]
        equal = (signatures[rows_][:, None, :] == signatures[rest][None, :, :]).sum(axis=2)
        later = np.arange(rest.size)[None, :] >= np.arange(rows_.size)[:, None]  # rest[j] after rows_[i]
        i, j = np.nonzero((equal >= min_equal) & later)
        xs.append(rows_[i])
        ys.append(rest[j])
    return np.concatenate(xs), np.concatenate(ys)


def lsh_candidates(signatures: np.ndarray, bands: int, rows: int, min_estimate: float | None = None) -> np.ndarray:
    """Candidate pairs of the MinHash LSH banding, ``int64 [K, 2]`` with ``i < j``, sorted.

    Same rule as ``datasketch.MinHashLSH(params=(bands, rows))``: band ``k`` is the signature
    slots ``[k*rows, (k+1)*rows)``; two rows are candidates when any band is equal. datasketch
    keeps one Python dict of sets per band (for 100,000 texts and 21 bands: ~20 s and ~800 MiB);
    here each band is hashed to one uint64 per row and the rows are sorted so equal bands are
    adjacent (~0.5 s CPU and a few MiB for 100,000 texts). Equal bands always give equal hashes,
    so no candidate of MinHashLSH is lost; a rare hash collision only adds a candidate, which the
    exact Jaccard check then rejects. A bucket of m rows yields m(m-1)/2 pairs, as in MinHashLSH.

    With ``min_estimate`` (see :func:`estimate_floor`), pairs whose MinHash estimate (share of
    equal slots) is below it are dropped bucket by bucket, so memory follows the kept pairs,
    not the m^2 pairs of a large bucket.
    """
    n, num_perm = signatures.shape
    if bands * rows > num_perm:
        raise ValueError(f"lsh_candidates: {bands} bands x {rows} rows > {num_perm} signature slots")
    min_equal = None if min_estimate is None else min_estimate * num_perm
    codes = []
    for k in range(bands):
        h = np.zeros(n, dtype=np.uint64)
        for col in range(k * rows, (k + 1) * rows):
            h = (h ^ signatures[:, col].astype(np.uint64)) * _BAND_MULTIPLIER  # wraps mod 2**64
        order = np.argsort(h, kind="stable").astype(np.int64)
        hs = h[order]
        starts = np.flatnonzero(np.concatenate(([True], hs[1:] != hs[:-1])))
        lengths = np.diff(np.concatenate((starts, [n])))
        two = starts[lengths == 2]  # the usual bucket: one pair, done without a Python loop
        if two.size:
            x, y = np.minimum(order[two], order[two + 1]), np.maximum(order[two], order[two + 1])
            if min_equal is not None:
                keep = _keep(signatures, x, y, min_equal)
                x, y = x[keep], y[keep]
            codes.append(x * n + y)
        for start, m in zip(starts[lengths > 2].tolist(), lengths[lengths > 2].tolist()):
            x, y = _bucket_pairs(signatures, np.sort(order[start : start + m]), min_equal)
            codes.append(x * n + y)
    codes = [c for c in codes if c.size]
    if not codes:
        return np.empty((0, 2), dtype=np.int64)
    unique = np.unique(np.concatenate(codes))
    return np.stack((unique // n, unique % n), axis=1)


# --------------------------------------------------------------------------- report
@dataclass
class Collision:
    """Two examples that collide. ``kind`` is the strongest level the pair reaches.

    ``similarity``: exact Jaccard of the two shingle sets (1.0 for exact / normalised pairs);
    ``minhash_estimate``: the MinHash estimate of it (share of equal signature slots).
    """

    kind: Literal["exact", "normalised", "near"]
    id_a: str
    id_b: str
    text_a: str
    text_b: str
    similarity: float
    minhash_estimate: float


@dataclass
class SplitPairReport:
    """Collisions between split ``first`` and split ``second`` (or inside one split when equal).

    ``counts[level]`` (level in exact / normalised / near, each containing the one before):
    ``pairs`` listed pairs at that level or stronger; ``first_colliding`` / ``second_colliding``
    distinct examples of each split in those pairs; ``fraction`` = ``second_colliding /
    n_second``. Every colliding example appears in at least one pair, with the strongest kind it
    reaches. Inside one split a pair is (earlier, later), ``second_colliding`` counts the
    examples that duplicate an earlier one, and copies of one text are chained to its first
    occurrence (n copies: n - 1 pairs, not n(n-1)/2). Across splits, n copies in ``first`` and m
    in ``second`` are star-linked (at most n + m - 1 pairs, not n*m); distinct texts give one
    pair each, so for usual data ``pairs`` is the number of colliding (first, second) pairs.
    """

    first: str
    second: str
    n_first: int
    n_second: int
    counts: dict[str, dict[str, Any]] = field(default_factory=dict)
    collisions: list[Collision] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "first": self.first,
            "second": self.second,
            "n_first": self.n_first,
            "n_second": self.n_second,
            "counts": self.counts,
            "collisions": [asdict(c) for c in self.collisions],
        }


@dataclass
class DedupReport:
    """Result of :func:`find_duplicates`. ``pairs`` is keyed ``"<first>/<second>"`` (e.g.
    ``"train/test"``, ``"train/train"``), splits in the order train, validation, test, others."""

    settings: dict[str, Any]
    split_sizes: dict[str, int]
    pairs: dict[str, SplitPairReport]

    def pair(self, first: str, second: str) -> SplitPairReport:
        """The report of one split pair; raises :class:`TuneproofError` when it does not exist."""
        key = f"{first}/{second}"
        if key not in self.pairs:
            raise TuneproofError(f"dedup report: no split pair '{key}' (have: {', '.join(self.pairs)})")
        return self.pairs[key]

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict: ``settings``, ``split_sizes``, ``pairs`` (each :meth:`SplitPairReport.to_dict`)."""
        return {
            "settings": dict(self.settings),
            "split_sizes": dict(self.split_sizes),
            "pairs": {k: p.to_dict() for k, p in self.pairs.items()},
        }

    def summary_lines(self) -> list[str]:
        """Short lines for the dossier: one per pair of different splits (also when clean), then
        one per split that has duplicates inside it."""
        t = self.settings["threshold"]
        lines = []
        ordered = sorted(self.pairs.values(), key=lambda p: p.first == p.second)
        for p in ordered:
            c = p.counts
            if c["near"]["pairs"] == 0 and p.first != p.second:
                lines.append(f"{p.first}/{p.second}: no duplicates ({p.n_second} {p.second} examples checked)")
                continue
            if c["near"]["pairs"] == 0:
                continue
            parts = ", ".join(
                f"{c[lv]['second_colliding']} ({100 * c[lv]['fraction']:.1f}%) {label}"
                for lv, label in (
                    ("exact", "exact"),
                    ("normalised", "normalised"),
                    ("near", f"near (Jaccard >= {t:g})"),
                )
            )
            if p.first == p.second:  # "test (inside the split): 3 of 140 examples repeat an earlier one: ..."
                lines.append(
                    f"{p.first} (inside the split): {c['near']['second_colliding']} of {p.n_second} examples "
                    f"repeat an earlier one: {parts}"
                )
            else:
                lines.append(f"{p.first}/{p.second}: of {p.n_second} {p.second} examples also in {p.first}: {parts}")
        return lines


# --------------------------------------------------------------------------- detection
def ordered_splits(names: Iterable[str]) -> list[str]:
    """Split names in train, validation, test order, any others after them sorted."""
    names = list(names)
    known = [s for s in SPLIT_ORDER if s in names]
    return known + sorted(s for s in names if s not in SPLIT_ORDER)


def _check_inputs(splits, threshold, shingles, ngram, num_perm) -> None:
    if not isinstance(splits, dict) or not splits:
        raise TuneproofError("find_duplicates: splits must be a non-empty dict {split name: [Example, ...]}")
    if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real) or not (0.0 < threshold <= 1.0):
        raise TuneproofError(
            f"dedup: threshold must be in (0, 1], got {threshold!r}", hint="set data.dedup.threshold, e.g. 0.8"
        )
    if shingles not in ("word", "char"):
        raise TuneproofError(f"dedup: shingles must be 'word' or 'char', got {shingles!r}")
    if not isinstance(ngram, int) or ngram < 1:
        raise TuneproofError(f"dedup: ngram must be an integer >= 1, got {ngram!r}")
    if not isinstance(num_perm, int) or num_perm < 16:
        raise TuneproofError(f"dedup: num_perm must be an integer >= 16, got {num_perm!r}")
    seen: dict[str, str] = {}
    for split, examples in splits.items():
        if not isinstance(examples, (list, tuple)):
            raise TuneproofError(
                f"find_duplicates: split '{split}' must be a list of Example, got {type(examples).__name__}"
            )
        for ex in examples:
            if not isinstance(getattr(ex, "text", None), str):
                where = getattr(ex, "source", "") or getattr(ex, "id", "?")
                raise TuneproofError(
                    f"{where}: example {getattr(ex, 'id', '?')!r} in split '{split}' has no text string"
                )
            if ex.id in seen:
                raise TuneproofError(
                    f"{ex.source or ex.id}: example id {ex.id!r} occurs twice (splits '{seen[ex.id]}' and '{split}')",
                    hint="ids must be unique within a study",
                )
            seen[ex.id] = split


def find_duplicates(
    splits: dict[str, list[Example]],
    *,
    threshold: float = 0.8,
    shingles: Literal["word", "char"] = "word",
    ngram: int = 3,
    num_perm: int = 128,
    seed: int = 1,
) -> DedupReport:
    """Exact, normalised and near-duplicate pairs for every pair of splits and inside each split.

    Args:
        splits: split name -> examples; example ids must be unique across all splits.
        threshold: Jaccard similarity (0, 1] of shingle sets at or above which two texts are
            near-duplicates (``data.dedup.threshold``).
        shingles: ``"word"`` or ``"char"`` n-grams of the normalised text.
        ngram: shingle size, in words or characters.
        num_perm: MinHash permutations (signature length).
        seed: seed of the MinHash permutations (results are deterministic for a seed).

    Returns:
        :class:`DedupReport`. Cost: one MinHash per distinct normalised text, O(total shingles x
        num_perm) numpy work, then exact verification of each LSH candidate pair.

    Raises:
        TuneproofError: empty ``splits``, an example without a text string, a duplicated id, or a
            setting out of range.
    """
    _check_inputs(splits, threshold, shingles, ngram, num_perm)
    names = ordered_splits(splits)
    rank = {s: i for i, s in enumerate(names)}
    # Global index g -> (split, example); positions follow the split order then the list order.
    flat: list[tuple[str, Example]] = [(s, ex) for s in names for ex in splits[s]]
    # the compared text of each example, a preamble of turns shared by most rows left out (data/examples.py)
    shared = shared_turns([ex for _, ex in flat])
    texts = [ex.dedup_text(shared) for _, ex in flat]
    texts_of = {ex.id: t for (_, ex), t in zip(flat, texts)}

    # Normalised groups: distinct normalised text -> member indices (in order).
    group_of_text: dict[str, int] = {}
    group_members: list[list[int]] = []
    group_text: list[str] = []
    for g in range(len(flat)):
        norm = normalise(texts[g])
        u = group_of_text.get(norm)
        if u is None:
            u = group_of_text[norm] = len(group_members)
            group_members.append([])
            group_text.append(norm)
        group_members[u].append(g)
    del group_of_text

    # Near-duplicate candidate pairs of groups: MinHash + LSH, verified by exact Jaccard.
    b, r = lsh_params(threshold, num_perm)
    near_groups = _near_group_pairs(group_text, threshold, shingles, ngram, num_perm, seed, b, r)

    pairs: dict[str, SplitPairReport] = {}
    for i, s1 in enumerate(names):
        for s2 in names[i:]:
            pairs[f"{s1}/{s2}"] = SplitPairReport(s1, s2, len(splits[s1]), len(splits[s2]))

    def add(kind: str, ga: int, gb: int, sim: float, est: float) -> None:
        (sa, a), (sb, bb) = flat[ga], flat[gb]
        if rank[sa] > rank[sb] or (sa == sb and ga > gb):
            (sa, a), (sb, bb) = (sb, bb), (sa, a)
        pairs[f"{sa}/{sb}"].collisions.append(Collision(kind, a.id, bb.id, texts_of[a.id], texts_of[bb.id], sim, est))

    def link_across(group_a: list[int], group_b: list[int], kind: str, sim: float, est: float) -> None:
        # Star links between copies in two splits: each example pairs with the first example of
        # the other side that has its exact text (kind "exact"), else with the other side's
        # first example. Every example appears with its strongest kind; n x m copies give at
        # most n + m - 1 pairs instead of n * m.
        first_a: dict[str, int] = {}
        first_b: dict[str, int] = {}
        for g in group_a:
            first_a.setdefault(texts[g], g)
        for g in group_b:
            first_b.setdefault(texts[g], g)
        linked = set()
        for gb in group_b:
            ga = first_a.get(texts[gb])
            if ga is not None:
                add("exact", ga, gb, 1.0, 1.0)
            else:
                ga = group_a[0]
                add(kind, ga, gb, sim, est)
            linked.add(ga)
        for ga in group_a:
            if ga not in linked:
                gb = first_b.get(texts[ga])
                if gb is not None:
                    add("exact", ga, gb, 1.0, 1.0)
                else:
                    add(kind, ga, group_b[0], sim, est)

    # Copies inside one split are chained to the first copy with the same exact text, else to the
    # group's first example in that split; copies in two splits are star-linked (link_across).
    for members in group_members:
        if len(members) < 2:
            continue
        by_split: dict[str, list[int]] = defaultdict(list)
        for g in members:
            by_split[flat[g][0]].append(g)
        for ms in by_split.values():
            first_of_text: dict[str, int] = {}
            for g in ms:
                text = texts[g]
                if text in first_of_text:
                    add("exact", first_of_text[text], g, 1.0, 1.0)
                else:
                    first_of_text[text] = g
                    if g != ms[0]:
                        add("normalised", ms[0], g, 1.0, 1.0)
        split_names = sorted(by_split, key=rank.get)
        for x, s1 in enumerate(split_names):
            for s2 in split_names[x + 1 :]:
                link_across(by_split[s1], by_split[s2], "normalised", 1.0, 1.0)

    # Between two near groups (different normalised texts, so never an exact pair): inside a
    # split the two groups' first examples (the other copies are chained to those); across
    # splits star links.
    for u, v, sim, est in near_groups:
        su: dict[str, list[int]] = defaultdict(list)
        sv: dict[str, list[int]] = defaultdict(list)
        for g in group_members[u]:
            su[flat[g][0]].append(g)
        for g in group_members[v]:
            sv[flat[g][0]].append(g)
        for s1, ga_list in su.items():
            for s2, gb_list in sv.items():
                if s1 == s2:
                    add("near", ga_list[0], gb_list[0], sim, est)
                else:
                    link_across(ga_list, gb_list, "near", sim, est)

    position = {ex.id: g for g, (_, ex) in enumerate(flat)}
    for p in pairs.values():
        p.collisions.sort(key=lambda c: (position[c.id_a], position[c.id_b]))
        p.counts = _counts(p)

    settings = {
        "threshold": threshold,
        "shingles": shingles,
        "ngram": ngram,
        "num_perm": num_perm,
        "seed": seed,
        "lsh_bands": b,
        "lsh_rows": r,
        "estimate_floor": estimate_floor(threshold, num_perm),
        "verification": "exact Jaccard of shingle sets",
        "normalisation": "invisible characters removed, NFKC, casefold, punctuation removed, whitespace collapsed",
    }
    return DedupReport(settings, {s: len(splits[s]) for s in names}, pairs)


def _counts(p: SplitPairReport) -> dict[str, dict[str, Any]]:
    out = {}
    for level_index, level in enumerate(LEVELS):
        kinds = set(LEVELS[: level_index + 1])
        hits = [c for c in p.collisions if c.kind in kinds]
        second = len({c.id_b for c in hits})
        out[level] = {
            "pairs": len(hits),
            "first_colliding": len({c.id_a for c in hits}),
            "second_colliding": second,
            "fraction": second / p.n_second if p.n_second else 0.0,
        }
    return out


def _near_group_pairs(
    group_text: list[str], threshold: float, shingles: str, ngram: int, num_perm: int, seed: int, b: int, r: int
) -> list[tuple[int, int, float, float]]:
    """(u, v, exact Jaccard, MinHash estimate) for distinct normalised texts u < v at or above the threshold."""
    idx = [u for u, t in enumerate(group_text) if t]
    if len(idx) < 2:
        return []
    sigs = minhash_signatures((shingle_set(group_text[u], shingles, ngram) for u in idx), num_perm, seed)

    candidates = lsh_candidates(sigs, b, r, min_estimate=estimate_floor(threshold, num_perm))

    out = []
    cache: dict[int, set[str]] = {}

    def sset(k: int) -> set[str]:
        if k not in cache:
            cache[k] = shingle_set(group_text[idx[k]], shingles, ngram)
        return cache[k]

    for k1, k2 in candidates.tolist():
        sim = jaccard(sset(k1), sset(k2))
        if sim >= threshold:
            est = float(np.mean(sigs[k1] == sigs[k2]))
            out.append((idx[k1], idx[k2], sim, est))
    return out


# --------------------------------------------------------------------------- policy
def apply_policy(
    splits: dict[str, list[Example]], report: DedupReport, policy: Literal["report", "drop-from-train"]
) -> tuple[list[Example], list[str]]:
    """Apply ``data.dedup.policy`` to the train split.

    ``"report"``: train unchanged, nothing dropped. ``"drop-from-train"``: every train example in
    a collision (exact, normalised or near) with any other split is removed; duplicates inside
    train are kept (they are reported, not a leak).

    Returns:
        ``(new_train, dropped_ids)``, ids in train order.

    Raises:
        TuneproofError: unknown policy, no ``"train"`` split, or a report computed on other splits.
    """
    if policy not in ("report", "drop-from-train"):
        raise TuneproofError(f"dedup: unknown policy {policy!r}", hint="use 'report' or 'drop-from-train'")
    if "train" not in splits:
        raise TuneproofError(f"dedup: no 'train' split to apply the policy to (splits: {', '.join(splits)})")
    sizes = {s: len(v) for s, v in splits.items()}
    if sizes != report.split_sizes:
        raise TuneproofError(
            f"dedup: the report was computed on splits {report.split_sizes}, not on {sizes}",
            hint="run find_duplicates again on the current splits",
        )
    train = list(splits["train"])
    if policy == "report":
        return train, []
    leaked: set[str] = set()
    for p in report.pairs.values():
        if p.first == p.second or "train" not in (p.first, p.second):
            continue
        for c in p.collisions:
            leaked.add(c.id_a if p.first == "train" else c.id_b)
    kept = [ex for ex in train if ex.id not in leaked]
    dropped = [ex.id for ex in train if ex.id in leaked]
    return kept, dropped
