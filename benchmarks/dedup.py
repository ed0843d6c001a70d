"""Benchmark of tuneproof.data.dedup.find_duplicates on synthetic short texts (run by hand).

    python benchmarks/dedup.py [--texts 100000] [--pairs 2000] [--seed 0]

Builds ``--texts`` texts of 6-15 words drawn from a 20,000-word vocabulary with Zipf-like
frequencies (p(rank k) ~ 1/(k+10)), split 80% train / 20% test, and plants ``--pairs``
near-duplicate pairs across the two splits: a train text and a copy in test edited by one of

- append one word at the end    (word 3-gram Jaccard (n-2)/(n-1), >= 0.8 for n >= 6 words),
- prepend one word at the start (same),
- substitute the last word, only for n >= 11 words ((n-3)/(n-1) >= 0.8).

It prints the true Jaccard distribution of the planted pairs, the wall time of
``find_duplicates`` and its CPU time (seconds; CPU time is less sensitive to other load on the
machine), the load average, the peak RSS of the process (MiB, ``resource.getrusage``), the
recall of the planted pairs at the near level, and the reported pairs that were not planted.
Results are written up in docs/benchmarks-dedup.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tuneproof.data.dedup import find_duplicates, jaccard, normalise, shingle_set  # noqa: E402
from tuneproof.data.examples import Example  # noqa: E402


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def make_vocabulary(rng: np.random.Generator, size: int) -> list[str]:
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words: set[str] = set()
    while len(words) < size:
        n = int(rng.integers(3, 10))
        words.add("".join(rng.choice(letters, n)))
    return sorted(words)


def make_texts(rng: np.random.Generator, vocab: list[str], count: int) -> list[list[str]]:
    p = 1.0 / (np.arange(len(vocab)) + 10.0)
    p /= p.sum()
    lengths = rng.integers(6, 16, count)  # 6..15 words
    flat = rng.choice(len(vocab), int(lengths.sum()), p=p)
    out, pos = [], 0
    for n in lengths:
        out.append([vocab[i] for i in flat[pos : pos + n]])
        pos += n
    return out


def edit(rng: np.random.Generator, vocab: list[str], words: list[str]) -> tuple[str, list[str]]:
    kinds = ["append", "prepend"] + (["substitute-last"] if len(words) >= 11 else [])
    kind = kinds[int(rng.integers(len(kinds)))]
    new = vocab[int(rng.integers(len(vocab)))]
    if kind == "append":
        return kind, words + [new]
    if kind == "prepend":
        return kind, [new] + words
    while new == words[-1]:
        new = vocab[int(rng.integers(len(vocab)))]
    return kind, words[:-1] + [new]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--texts", type=int, default=100_000, help="total texts (train + test)")
    ap.add_argument("--pairs", type=int, default=2_000, help="planted train/test near-duplicate pairs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threshold", type=float, default=0.8)
    ap.add_argument(
        "--templated",
        type=int,
        default=0,
        help="replace this many train texts (and a quarter as many test texts) by 'my order number is NNNNNN': "
        "texts sharing half their 3-grams (Jaccard 0.5), the worst case for LSH candidates",
    )
    args = ap.parse_args()

    rng = np.random.default_rng(args.seed)
    vocab = make_vocabulary(rng, 20_000)
    n_test = args.texts // 5
    n_train = args.texts - n_test
    train_words = make_texts(rng, vocab, n_train)
    test_words = make_texts(rng, vocab, n_test - args.pairs)
    sources = rng.choice(n_train, args.pairs, replace=False)
    planted, kinds, true_j = set(), {}, []
    for src in sources:
        kind, words = edit(rng, vocab, train_words[src])
        kinds[kind] = kinds.get(kind, 0) + 1
        test_words.append(words)
        planted.add((f"train/{src}", f"test/{len(test_words) - 1}"))
        a = shingle_set(normalise(" ".join(train_words[src])))
        b = shingle_set(normalise(" ".join(words)))
        true_j.append(jaccard(a, b))
    planted_sources = set(sources.tolist())
    replaceable = [i for i in range(n_train) if i not in planted_sources][: args.templated]
    for i in replaceable:
        train_words[i] = ["my", "order", "number", "is", str(int(rng.integers(100_000, 1_000_000)))]
    for i in range(min(args.templated // 4, n_test - args.pairs)):
        test_words[i] = ["my", "order", "number", "is", str(int(rng.integers(100_000, 1_000_000)))]
    train = [Example(f"train/{i}", " ".join(w)) for i, w in enumerate(train_words)]
    test = [Example(f"test/{i}", " ".join(w)) for i, w in enumerate(test_words)]
    order = rng.permutation(len(test))
    test = [test[i] for i in order]
    del train_words, test_words

    tj = np.array(true_j)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(
        f"texts: {len(train)} train + {len(test)} test; planted pairs: "
        f"{args.pairs} {kinds}; templated: {args.templated}"
    )
    print(
        "true word-3-gram Jaccard of planted pairs: "
        f"min {tj.min():.3f}, p5 {np.percentile(tj, 5):.3f}, median {np.median(tj):.3f}, max {tj.max():.3f}; "
        f"{(tj >= args.threshold).mean():.1%} >= {args.threshold}"
    )
    rss_before = peak_rss_mib()
    t0, c0 = time.perf_counter(), time.process_time()
    report = find_duplicates({"train": train, "test": test}, threshold=args.threshold)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    rss_after = peak_rss_mib()

    cross = report.pair("train", "test")
    found = {(c.id_a, c.id_b) for c in cross.collisions}
    hits = len(planted & found)
    false_cross = len(found - planted)
    within = sum(len(p.collisions) for p in report.pairs.values() if p.first == p.second)
    print(f"settings: {report.settings}")
    print(f"find_duplicates wall time: {wall:.1f} s (CPU time of this process: {cpu:.1f} s)")
    print(f"load average (1, 5, 15 min) after the run: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"peak RSS: {rss_after:.0f} MiB (before the call: {rss_before:.0f} MiB)")
    print(f"recall of planted pairs: {hits}/{len(planted)} = {hits / len(planted):.4f}")
    print(f"reported train/test pairs not planted: {false_cross}; pairs reported inside a split: {within}")
    if args.templated:
        print("  (templated texts: identical order numbers are real duplicates, counted above as not planted)")
    if false_cross:
        for c in [c for c in cross.collisions if (c.id_a, c.id_b) not in planted][:5]:
            print(f"  {c.kind} {c.similarity:.3f}: {c.text_a!r} | {c.text_b!r}")
    print("\n".join(report.summary_lines()))


if __name__ == "__main__":
    main()
