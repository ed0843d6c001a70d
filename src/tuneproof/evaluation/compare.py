"""Paired comparison of a candidate against the baseline, example by example, and the verdicts.

The protocol (docs/PROTOCOL.md steps 1-2) compares the adapted model against its concrete
starting point on the same examples, so that gains and losses can be traced to examples and
categories, and judges the result against the hypothesis fixed before training.

Methods and their sources:

- Pairing is by example ``id``; the two runs must hold the same ids and the same references.
- McNemar's test (McNemar 1947, *Psychometrika* 12:153) in its exact form: a two-sided
  binomial test of ``fixed`` successes out of ``fixed + broken`` discordant pairs with
  p = 0.5 (``scipy.stats.binomtest``). Concordant pairs carry no information about the
  difference.
- Paired bootstrap (Efron & Tibshirani 1993, *An Introduction to the Bootstrap*, ch. 13;
  Koehn 2004 for its use on system comparisons): resample example indices with replacement
  (``numpy.random.default_rng(seed)``), apply the *same* indices to both runs, recompute
  every metric, and take the 2.5 / 97.5 percentiles of the delta (percentile interval, 95%).
  Per-class / per-field CIs condition on resamples where the metric is defined (NaN
  otherwise, ``numpy.nanpercentile``); aggregate metrics keep scikit-learn's
  ``zero_division=0`` semantics so that they equal the point metrics of
  :mod:`tuneproof.evaluation.metrics` on the full sample.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from tuneproof.errors import TuneproofError
from tuneproof.evaluation.multiplicity import ALPHA, benjamini_hochberg, holm
from tuneproof.evaluation.noise import success_threshold
from tuneproof.tasks import TaskConfig, get_task
from tuneproof.tasks.parsing import finite_or_none
from tuneproof.tasks.task import Blocks, MetricFn
from tuneproof.ui import capped

CONFIDENCE = 0.95
TOP_SHARE = 0.05  # "top 5% of examples" for the concentration flag
_EPS = 1e-12  # float tolerance of threshold comparisons
_CELLS_PER_CHUNK = 4_000_000  # bootstrap weight-matrix cells per chunk (32 MB of float64)
#: where a capped list of classes or fields is whole (each guard's ``items``)
COMPARE_JSON = "compare.json"


# --------------------------------------------------------------------------- pairing
def _pair(base_records: Sequence[dict], cand_records: Sequence[dict]) -> tuple[list[dict], list[dict]]:
    """Align both runs on ``id`` (baseline order). Raises TuneproofError on any mismatch."""

    def index(recs: Sequence[dict], side: str) -> dict:
        out: dict = {}
        for i, r in enumerate(recs):
            if "id" not in r:
                raise TuneproofError(
                    f"{side} output record #{i} has no 'id'", hint="outputs.jsonl rows need an id (CONTRACTS.md)"
                )
            rid = str(r["id"])
            if rid in out:
                raise TuneproofError(
                    f"{side} outputs hold id '{rid}' twice", hint="each example must be evaluated once"
                )
            out[rid] = r
        return out

    base, cand = index(base_records, "baseline"), index(cand_records, "candidate")
    only_base, only_cand = sorted(set(base) - set(cand)), sorted(set(cand) - set(base))
    if only_base or only_cand:
        raise TuneproofError(
            f"the runs were evaluated on different examples: {len(only_base)} baseline ids missing from the candidate "
            f"(e.g. {only_base[:3]}), {len(only_cand)} candidate ids missing from the baseline (e.g. {only_cand[:3]})",
            hint="evaluate both on the same split and eval.max_examples (see the eval fingerprint)",
        )
    if not base:
        raise TuneproofError("no examples to compare: both output files are empty")
    ids = list(base)
    for rid in ids:
        rb, rc = str(base[rid].get("reference", "")).strip(), str(cand[rid].get("reference", "")).strip()
        if rb != rc:
            raise TuneproofError(
                f"example '{rid}' has a different reference in the baseline and the candidate",
                hint="the runs used different data versions; re-run the baseline on the current data",
            )
    return [base[i] for i in ids], [cand[i] for i in ids]


# --------------------------------------------------------------------------- bootstrap
def _bootstrap_deltas(
    base_blocks: Blocks, cand_blocks: Blocks, metric_fn: MetricFn, n: int, iterations: int, seed: int
) -> dict:
    """Paired bootstrap: {metric key: [iterations] array of cand - base on the same resamples}."""
    names = list(base_blocks)
    widths = [base_blocks[k].shape[1] for k in names]
    mat = np.hstack([base_blocks[k] for k in names] + [cand_blocks[k] for k in names])  # [n, 2K]
    total = sum(widths)
    rng = np.random.default_rng(seed)
    chunk = max(1, min(iterations, _CELLS_PER_CHUNK // max(n, 1)))
    deltas: dict = {}
    done = 0
    while done < iterations:
        b = min(chunk, iterations - done)
        idx = rng.integers(0, n, size=(b, n))
        # weights[r, i] = how many times example i is drawn in resample r
        weights = np.bincount((idx + (np.arange(b) * n)[:, None]).ravel(), minlength=b * n).reshape(b, n).astype(float)
        sums = weights @ mat  # [b, 2K]
        split: dict = {"base": {}, "cand": {}}
        for side, start in (("base", 0), ("cand", total)):
            off = start
            for k, w in zip(names, widths):
                split[side][k] = sums[:, off : off + w]
                off += w
        vb, vc = metric_fn(split["base"], n, math.nan), metric_fn(split["cand"], n, math.nan)
        for key in vb:
            deltas.setdefault(key, []).append(vc[key] - vb[key])
        done += b
    return {k: np.concatenate(v) for k, v in deltas.items()}


def _ci(delta: np.ndarray | None) -> list | None:
    if delta is None or not np.isfinite(delta).any():
        return None
    alpha = (1 - CONFIDENCE) / 2 * 100
    lo, hi = np.nanpercentile(delta, [alpha, 100 - alpha])
    return [float(lo), float(hi)]


def _entry(base: float, cand: float, delta_samples: np.ndarray | None) -> dict:
    return {
        "base": finite_or_none(base),
        "cand": finite_or_none(cand),
        "delta": finite_or_none(cand - base),
        "ci": _ci(delta_samples),
    }


# --------------------------------------------------------------------------- concentration
def _concentration(ids: list[str], classes: list[str | None], gains: np.ndarray, basis: str) -> dict:
    """Flag when the top 5% of examples, or one class, carry more than half of the net gain."""
    n = len(ids)
    net = float(gains.sum())
    k = max(1, math.ceil(TOP_SHARE * n))
    order = np.argsort(-gains, kind="stable")[:k]
    top = [int(i) for i in order if gains[i] > 0]
    top_sum = float(gains[top].sum()) if top else 0.0
    by_class: dict = {}
    for c, g in zip(classes, gains):
        key = "<none>" if c is None else str(c)
        by_class[key] = by_class.get(key, 0.0) + float(g)
    top_class = max(by_class, key=lambda c: by_class[c]) if by_class else None
    class_sum = by_class.get(top_class, 0.0) if top_class is not None else 0.0
    flag_examples = net > 0 and top_sum > 0.5 * net
    flag_class = net > 0 and len(by_class) > 1 and class_sum > 0.5 * net
    gained, lost = float(gains[gains > 0].sum()), float(-gains[gains < 0].sum())
    parts = []
    if flag_examples:
        parts.append(
            f"{len(top)} example(s) (top {TOP_SHARE:.0%}) carry {top_sum / net:.0%} of the net gain of {net:g}"
            + _over_net(top_sum, net, "these examples gain")
        )
    if flag_class:
        parts.append(
            f"class '{top_class}' carries {class_sum / net:.0%} of the net gain of {net:g}"
            + _over_net(class_sum, net, "this class gains")
        )
    if parts and net < max(5.0, 0.02 * n):
        parts.append(
            f"the net gain is small ({net:g} of {n} examples: {gained:g} gained, "
            f"{lost:g} lost), so its shares swing with a few examples"
        )
    return {
        "basis": basis,
        "net_gain": net,
        "top_k": k,
        "top_ids": [ids[i] for i in top],
        "top_share": top_sum / net if net > 0 else None,
        "flag_examples": bool(flag_examples),
        "by_class": by_class,
        "top_class": top_class,
        "class_share": class_sum / net if net > 0 else None,
        "flag_class": bool(flag_class),
        "flagged": bool(flag_examples or flag_class),
        "gained": gained,
        "lost": lost,
        "detail": "; ".join(parts)
        if parts
        else "gain not concentrated"
        if net > 0
        else f"no net gain ({gained:g} gained, {lost:g} lost over {n} examples: net {net:g})",
    }


def _over_net(part: float, net: float, who: str) -> str:
    """Why a share can exceed 100%: the rest of the examples lose part of what ``who`` gain."""
    if part <= net + 1e-12:
        return ""
    return (
        f" ({who} {part:g}; the other examples lose {part - net:g} in total, so the net is {net:g}: "
        f"a share above 100% means the rest gives back part of this gain)"
    )


# --------------------------------------------------------------------------- comparison
def mcnemar_exact(fixed: int, broken: int) -> float:
    """Exact two-sided McNemar p-value: binomial test of ``fixed`` of ``fixed + broken`` at p = 0.5.

    McNemar (1947); exact form as ``scipy.stats.binomtest(..., alternative="two-sided")``.
    Returns 1.0 when there are no discordant pairs. Example: fixed 10, broken 2 -> 0.03857421875.
    """
    from scipy.stats import binomtest  # noqa: PLC0415 (lazy: scipy.stats costs ~1 s of start-up)

    if fixed + broken == 0:
        return 1.0
    return float(binomtest(int(fixed), int(fixed + broken), 0.5, alternative="two-sided").pvalue)


DOMINANT_SHARE = 0.8  # "one class for most examples": the top predicted class gets >= 80% of the predictions


def dominant_prediction(pred_keys: Sequence[str | None], ref_keys: Sequence[str | None]) -> dict | None:
    """Say when one predicted class takes most predictions (e.g. 287 of 287).

    Flagged when the most frequent predicted class gets at least :data:`DOMINANT_SHARE` of all
    examples and more than its share among the references (a majority class predicted at its
    own rate is not flagged), with at least 2 reference classes. Returns ``{"class", "count",
    "n", "share", "reference_share", "flagged", "detail"}`` or None when the kind predicts no class.
    """
    preds = [p for p in pred_keys if p is not None]
    refs = [r for r in ref_keys if r is not None]
    if not preds or len(set(refs)) < 2:
        return None
    n = len(pred_keys)
    top, count = Counter(preds).most_common(1)[0]
    ref_share = sum(1 for r in refs if r == top) / max(1, len(refs))
    share = count / n
    flagged = share >= DOMINANT_SHARE and share > ref_share + 1e-12
    return {
        "class": top,
        "count": count,
        "n": n,
        "share": share,
        "reference_share": ref_share,
        "flagged": bool(flagged),
        "detail": f"predicts '{top}' for {count} of {n} examples ({share:.0%}; {ref_share:.1%} of the references)",
    }


def _paired_counts(base_ok: np.ndarray, cand_ok: np.ndarray) -> dict:
    fixed, broken = ~base_ok & cand_ok, base_ok & ~cand_ok
    counts = {
        "fixed": int(fixed.sum()),
        "broken": int(broken.sum()),
        "unchanged_right": int((base_ok & cand_ok).sum()),
        "unchanged_wrong": int((~base_ok & ~cand_ok).sum()),
    }
    return {
        "counts": counts,
        "fixed": fixed,
        "broken": broken,
        "mcnemar": {
            "fixed": counts["fixed"],
            "broken": counts["broken"],
            "p_value": mcnemar_exact(counts["fixed"], counts["broken"]),
            "test": "McNemar (1947) exact: two-sided binomial test on discordant pairs, p=0.5",
        },
    }


CLASS_TEST = (
    "exact McNemar (1947) per class: two-sided binomial test of fixed vs broken among the class's examples "
    "(reference class), p=0.5"
)


def per_class_tests(
    example_class: Sequence[str | None], base_ok: np.ndarray, cand_ok: np.ndarray, classes: Sequence[str]
) -> dict:
    """One paired test per class, with the family's Holm and Benjamini-Hochberg adjustments.

    Within each class (the examples whose reference is that class, ``example_class``), the exact
    McNemar test of :func:`mcnemar_exact` on the per-example rule (``base_ok`` / ``cand_ok``,
    ``[n]`` booleans). For classification with the ``correct`` rule this is the paired test of the
    class's recall. The family is every class with at least one example; Holm (1979) and
    Benjamini-Hochberg (1995) adjust over it (:mod:`tuneproof.evaluation.multiplicity`).

    Args:
        example_class: ``[n]`` the class of each example (None: in no class).
        classes: the compared classes (``per_class`` keys); classes with no example get
            ``n`` 0 and ``p_value`` 1.0 and stay out of the family.

    Returns:
        ``{"test", "alpha", "family_size", "moved_bh": [classes], "classes": {class: {"n", "fixed",
        "broken", "p_value", "p_holm", "q_bh", "moved_bh"}}}``; ``p_holm`` / ``q_bh`` are None
        outside the family.
    """
    labels = np.array(["" if c is None else str(c) for c in example_class], dtype=object)
    out: dict = {}
    for c in dict.fromkeys([*classes, *(str(c) for c in example_class if c is not None)]):
        mask = labels == c
        fixed = int((mask & ~base_ok & cand_ok).sum())
        broken = int((mask & base_ok & ~cand_ok).sum())
        out[c] = {"n": int(mask.sum()), "fixed": fixed, "broken": broken, "p_value": mcnemar_exact(fixed, broken)}
        out[c].update(p_holm=None, q_bh=None, moved_bh=False)
    family = [c for c, t in out.items() if t["n"] > 0]
    ps = [out[c]["p_value"] for c in family]
    holm_p, _ = holm(ps)
    bh_q, bh_rej = benjamini_hochberg(ps)
    for c, hp, q, rej in zip(family, holm_p, bh_q, bh_rej):
        out[c].update(p_holm=hp, q_bh=q, moved_bh=bool(rej))
    return {
        "test": CLASS_TEST,
        "alpha": ALPHA,
        "family_size": len(family),
        "moved_bh": [c for c in family if out[c]["moved_bh"]],
        "classes": out,
    }


def paired_compare(
    base_records: Sequence[dict],
    cand_records: Sequence[dict],
    task: str,
    *,
    required_fields: Sequence[str] | None,
    eval_cfg: Any,
    hypothesis: Any = None,
    iterations: int = 1000,
    seed: int = 0,
    labels: Sequence[str] | None = None,
    noise: dict | None = None,
    sets: dict[str, dict] | None = None,
) -> dict:
    """Compare candidate outputs against baseline outputs on the same examples.

    Both record lists (rows of ``outputs.jsonl``: ``id``, ``category``, ``reference``,
    ``prediction``) are re-scored here with the same metric definitions (the task kind's scorer,
    :mod:`tuneproof.tasks`), so stale ``correct`` / ``scores`` fields cannot skew the comparison.

    Args:
        task: a task kind (``classification``, ``multi-label``, ``extraction``, ``format``).
        required_fields: hypothesis.required_fields.
        eval_cfg: the study's :class:`tuneproof.study.Eval` (allow_fenced_json, json_schema, regex, grammar).
        hypothesis: the study's :class:`tuneproof.study.Hypothesis`; when given, the result holds
            ``verdicts`` and ``overall`` from :func:`judge`, and the paired counts follow its
            success metric.
        iterations: bootstrap resamples (``eval.bootstrap_iterations``).
        seed: bootstrap seed (``eval.seed``).
        labels: label set of kinds that have one (default: the references'); pass the study's
            full label set so a class absent from the eval split still counts as valid.
        noise: both runs' noise floors (:func:`tuneproof.evaluation.noise.comparison_floor`; None: neither was
            evaluated with ``eval.repeat`` > 1), kept as ``noise`` in the result; the success criterion is judged
            above max(min_gain, floor), and ``success_threshold`` (with a hypothesis) says which applied and why
            (:func:`tuneproof.evaluation.noise.success_threshold`).
        sets: the comparisons on ``eval.sets`` (:func:`tuneproof.evaluation.eval_sets.compare_sets`), kept as
            ``sets`` and judged by the guards that name a set.

    Returns:
        A JSON-ready dict: ``task``, ``n``, ``counts`` (``fixed`` = failing in the baseline and
        passing in the candidate, ``broken``, ``unchanged_right``, ``unchanged_wrong``) on the
        per-example rule of the success metric, described by ``counts_basis`` (``{"metric",
        "rule", "description"}``; e.g. field F1 >= 0.5 per example for ``field_f1``; the
        per-example ``correct`` without a hypothesis), ``fixed_ids``, ``broken_ids``,
        ``mcnemar`` (``{"fixed", "broken", "p_value", "test"}``) on the same basis;
        ``counts_correct`` / ``mcnemar_correct`` / ``broken_ids_correct`` on the per-example
        ``correct`` (exact match, class correct ...) as a second line; ``bootstrap``,
        ``headline``, ``metrics`` (``{name: {"base", "cand", "delta", "ci": [lo, hi]}}``),
        ``per_class`` and ``per_field`` (``{name: {key: {"base", "cand", "delta", "ci",
        "support"}}}``), ``per_class_tests`` (:func:`per_class_tests`, on the per-example rule of the
        first per-class guard's metric, else the success metric's), ``concentration``,
        ``dominant`` (one class for most predictions, see
        :func:`dominant_prediction`; None when the kind predicts no class), ``base_metrics``,
        ``cand_metrics`` and, with a hypothesis, ``verdicts`` and ``overall``. NaN values are
        written as None.

    Raises:
        TuneproofError: the id sets differ (says how many are missing on each side), a
            duplicate id, a reference that differs between the runs, or a hypothesis metric
            the task does not report.
    """
    kind = get_task(task)
    base_raw, cand_raw = _pair(base_records, cand_records)
    n = len(base_raw)
    cfg = TaskConfig.make(required_fields, eval_cfg, labels)
    base, base_m = kind.score(base_raw, cfg)
    cand, cand_m = kind.score(cand_raw, cfg)
    st = kind.bootstrap_stats(base, cand, base_m, cand_m, cfg)
    bb, cb, metric_fn = st.base, st.cand, st.metric_fn

    # The vectorised metrics must equal the scorer's on the full sample (one definition, two codes).
    ones = {k: v.sum(axis=0, keepdims=True) for k, v in bb.items()}
    full_base = metric_fn(ones, n, 0.0)
    for key, val in full_base.items():
        ref = base_m[key] if isinstance(key, str) else base_m[key[0]].get(key[1], {}).get(key[2], 0.0)
        if not math.isclose(float(val[0]), float(ref), rel_tol=1e-9, abs_tol=1e-12):
            raise RuntimeError(f"internal: bootstrap metric {key} = {val[0]} disagrees with the scorer ({ref})")

    deltas = _bootstrap_deltas(bb, cb, metric_fn, n, iterations, seed)

    metrics = {k: _entry(base_m[k], cand_m[k], deltas[k]) for k in full_base if isinstance(k, str)}
    per: dict = {"per_class": {}, "per_field": {}}
    for key in full_base:
        if isinstance(key, tuple):
            group, name, sub = key
            bm, cm = base_m.get(group, {}), cand_m.get(group, {})
            item = _entry(bm.get(name, {}).get(sub, 0.0), cm.get(name, {}).get(sub, 0.0), deltas[key])
            item["support"] = bm.get(name, cm.get(name, {})).get("support")
            per[group].setdefault(name, {})[sub] = item

    ids = [str(r["id"]) for r in base]
    success_metric = getattr(getattr(hypothesis, "success", None), "metric", None)
    rule = kind.example_rule(success_metric)
    on_rule = _paired_counts(
        np.array([rule.passing(r) for r in base], dtype=bool), np.array([rule.passing(r) for r in cand], dtype=bool)
    )
    on_correct = _paired_counts(
        np.array([bool(r["correct"]) for r in base], dtype=bool),
        np.array([bool(r["correct"]) for r in cand], dtype=bool),
    )
    gains = np.array([rule.score(c) - rule.score(b) for b, c in zip(base, cand)])
    guard_metrics = [g.metric for g in getattr(hypothesis, "guards", None) or [] if g.metric.startswith("per_class_")]
    class_rule = kind.example_rule(guard_metrics[0]) if guard_metrics else rule
    class_tests = per_class_tests(
        st.example_class,
        np.array([class_rule.passing(r) for r in base], dtype=bool),
        np.array([class_rule.passing(r) for r in cand], dtype=bool),
        list(per["per_class"]),
    )
    class_tests.update(rule=class_rule.name, description=class_rule.description)

    result = {
        "task": task,
        "n": n,
        "counts": on_rule["counts"],
        "counts_basis": {"metric": success_metric, "rule": rule.name, "description": rule.description},
        "fixed_ids": [i for i, m in zip(ids, on_rule["fixed"]) if m],
        "broken_ids": [i for i, m in zip(ids, on_rule["broken"]) if m],
        "mcnemar": on_rule["mcnemar"],
        "counts_correct": on_correct["counts"],
        "mcnemar_correct": on_correct["mcnemar"],
        "broken_ids_correct": [i for i, m in zip(ids, on_correct["broken"]) if m],
        "bootstrap": {
            "iterations": int(iterations),
            "seed": int(seed),
            "confidence": CONFIDENCE,
            "method": "paired percentile bootstrap over examples (Efron & Tibshirani 1993)",
        },
        "headline": kind.headline_for(metrics),
        "metrics": metrics,
        "per_class": per["per_class"],
        "per_field": per["per_field"],
        "per_class_tests": class_tests,
        "concentration": _concentration(ids, st.example_class, gains, rule.name),
        "dominant": dominant_prediction([kind.predicted_key(r) for r in cand], [kind.reference_key(r) for r in cand]),
        "dominant_baseline": dominant_prediction(
            [kind.predicted_key(r) for r in base], [kind.reference_key(r) for r in base]
        ),
        "base_metrics": base_m,
        "cand_metrics": cand_m,
        "noise": noise,
    }
    if sets:
        result["sets"] = sets
    if hypothesis is not None:
        # which threshold judges the success criterion's gain, and why (also when no floor was measured)
        result["success_threshold"] = success_threshold(hypothesis.success.min_gain, noise, hypothesis.success.metric)
        result["verdicts"] = judge(hypothesis, result)
        result["overall"] = overall_verdict(result["verdicts"])
    return result


# --------------------------------------------------------------------------- verdicts
def _fmt(x: Any) -> str:
    return "n/a" if x is None else f"{x:+.4f}" if isinstance(x, float) else str(x)


def _ci_rule(ci: list | None, delta: float | None, threshold: float) -> str:
    """pass: CI lower bound >= threshold; fail: CI upper bound < threshold; else inconclusive.

    Without a CI (metric undefined in every resample) the point delta decides pass / fail.
    """
    if ci is None:
        if delta is None:
            return "inconclusive"
        return "pass" if delta >= threshold - _EPS else "fail"
    if ci[0] >= threshold - _EPS:
        return "pass"
    if ci[1] < threshold - _EPS:
        return "fail"
    return "inconclusive"


def _guard_item(entry: dict, max_drop: float | None, floor: float | None) -> tuple[str, list[str]]:
    verdicts, why = [], []
    if max_drop is not None:
        v = _ci_rule(entry["ci"], entry["delta"], 0.0 - max_drop)
        verdicts.append(v)
        if v != "pass":
            why.append(f"delta {_fmt(entry['delta'])} CI {_fmt_ci(entry['ci'])} vs allowed drop {max_drop:g}")
    if floor is not None:
        cand = entry["cand"]
        v = "fail" if cand is None or cand < floor - _EPS else "pass"
        verdicts.append(v)
        if v == "fail":
            why.append(f"candidate {cand if cand is None else round(cand, 4)} below floor {floor:g}")
    return _combine(verdicts), why


def _fmt_ci(ci: list | None) -> str:
    return "n/a" if ci is None else f"[{ci[0]:+.4f}, {ci[1]:+.4f}]"


def _combine(verdicts: list[str]) -> str:
    if "fail" in verdicts:
        return "fail"
    if "inconclusive" in verdicts:
        return "inconclusive"
    return "pass"


def _metric_entry(compare_result: dict, metric: str, key: str) -> dict:
    if metric not in compare_result["metrics"]:
        raise TuneproofError(
            f"{key}: metric '{metric}' is not reported for task '{compare_result['task']}'",
            hint=f"use one of {', '.join(sorted(compare_result['metrics']))}",
        )
    return compare_result["metrics"][metric]


def judge(hypothesis: Any, compare_result: dict) -> list[dict]:
    """Judge the success criterion and every guard of the hypothesis on a comparison.

    Each verdict is ``{"name", "kind": "success"|"guard", "metric", "base", "cand", "delta",
    "ci": [lo, hi], "threshold", "floor", "verdict": "pass"|"fail"|"inconclusive", "detail"}``;
    per-class / per-field guards also carry ``items`` (one verdict per class or field) and
    report base/cand/delta/ci of their worst item (lowest point delta).

    Rules (the CI is the paired-bootstrap 95% interval of cand - base):

    - success (``threshold`` = max(min_gain, noise floor)): pass if CI low >= threshold, fail if CI high <
      threshold, else inconclusive. The noise floor is the comparison's (``compare_result["noise"]``,
      :func:`tuneproof.evaluation.noise.success_threshold`: the larger of both runs' measured spreads of the
      success metric over their ``eval.repeat`` repeats; not measured without repeats, and then min_gain alone
      applies, as before, and the verdict holds no ``noise``). With a measured floor, ``noise`` says which threshold
      applied and why; ``decided_by_noise_floor`` is True when
      the verdict under min_gain alone (``verdict_min_gain``) differs (a gain above min_gain but not above the
      floor).
    - guard with ``max_drop`` d (``threshold`` = -d): fail if CI high < -d (it certainly
      dropped more than allowed), pass if CI low >= -d, else inconclusive. With ``floor`` f:
      fail if the candidate's point value < f. Both set: fail if either fails.
    - ``per_class_<key>`` / ``per_field_<key>`` (e.g. ``per_class_recall``, ``per_class_f1``,
      ``per_field_f1``) apply the guard to every class / field and name each failing one;
      the per-item CI conditions on resamples where the item's metric is defined, and the
      point delta decides when no resample defines it. A per-class guard with ``classes``
      applies to those classes only. An item whose support in the evaluated split is below
      the guard's ``min_support`` (default 1) reads "not measurable (support 0)": neither pass
      nor fail; the detail states the support the guard needs. A guard with no measurable item
      is "not measurable".
    - Multiplicity (per-class guards, ``correction``): each judged class also carries the exact
      McNemar p-value of its examples (``per_class_tests``), Holm's adjusted ``p_holm`` and the
      Benjamini-Hochberg ``q_bh`` / ``moved_bh`` over the guard's judged classes, and its
      ``verdict_uncorrected``. With Holm (``holm``, or ``auto`` from
      :data:`AUTO_HOLM_MIN_CLASSES` judged classes), a class whose drop rule fails on its own CI
      but whose ``p_holm`` > 0.05 reads "inconclusive" (family-wise error rate 5%, Holm 1979); a
      floor failure stays a failure. The guard's ``correction`` records the method used, the
      family size, the uncorrected verdict and failing classes, and BH's moved classes.
    - Only the conditions the study writes apply: ``floor`` alone does not also demand "no drop".

    Raises:
        TuneproofError: a metric the comparison does not report (names the study key), or a
            guard with neither max_drop nor floor.
    """
    out = []
    succ = hypothesis.success
    e = _metric_entry(compare_result, succ.metric, "hypothesis.success.metric")
    # the gain counts only above max(min_gain, noise floor) (tuneproof.evaluation.noise: eval.repeat)
    th = success_threshold(succ.min_gain, compare_result.get("noise"), succ.metric)
    v = _ci_rule(e["ci"], e["delta"], th["threshold"]) if e["ci"] is not None else "inconclusive"
    verdict = {
        "name": f"success: {succ.metric} gain >= {succ.min_gain:g}",
        "kind": "success",
        "metric": succ.metric,
        **{k: e[k] for k in ("base", "cand", "delta", "ci")},
        "threshold": succ.min_gain,
        "floor": None,
        "verdict": v,
        "detail": f"delta {_fmt(e['delta'])}, 95% CI {_fmt_ci(e['ci'])} vs required gain {succ.min_gain:g}",
    }
    if th["noise_floor"] is not None:  # measured: say which threshold applied and why (not measured: as before)
        on_min_gain = _ci_rule(e["ci"], e["delta"], succ.min_gain) if e["ci"] is not None else "inconclusive"
        if th["applied"] == "noise floor":
            verdict["name"] += f" and >= noise floor {th['noise_floor']:.4g}"
        verdict.update(
            threshold=th["threshold"],
            noise=th,
            decided_by_noise_floor=v != on_min_gain,
            verdict_min_gain=on_min_gain,  # the verdict against min_gain alone
            detail=f"delta {_fmt(e['delta'])}, 95% CI {_fmt_ci(e['ci'])} vs required gain {th['threshold']:.4g} "
            f"({th['why']})",
        )
    out.append(verdict)

    for gi, guard in enumerate(hypothesis.guards):
        key = f"hypothesis.guards[{gi}]"
        if guard.max_drop is None and guard.floor is None:
            raise TuneproofError(
                f"{key}: guard on '{guard.metric}' has neither max_drop nor floor", hint="set max_drop and/or floor"
            )
        threshold = None if guard.max_drop is None else 0.0 - guard.max_drop
        rule = " and ".join(
            ([f"drop <= {guard.max_drop:g}"] if guard.max_drop is not None else [])
            + ([f">= {guard.floor:g}"] if guard.floor is not None else [])
        )
        if getattr(guard, "set", None) is not None:  # a guard on an eval.sets entry (docs/eval-sets.md)
            out.append(_set_guard(key, guard, rule, threshold, compare_result))
            continue
        group = next((g for g in ("per_class", "per_field") if guard.metric.startswith(g + "_")), None)
        if group is None:
            e = _metric_entry(compare_result, guard.metric, f"{key}.metric")
            verdict, why = _guard_item(e, guard.max_drop, guard.floor)
            out.append(
                {
                    "name": f"guard: {guard.metric} {rule}",
                    "kind": "guard",
                    "metric": guard.metric,
                    **{k: e[k] for k in ("base", "cand", "delta", "ci")},
                    "threshold": threshold,
                    "floor": guard.floor,
                    "verdict": verdict,
                    "detail": "; ".join(why) if why else f"delta {_fmt(e['delta'])}, 95% CI {_fmt_ci(e['ci'])}",
                }
            )
            continue
        sub = guard.metric[len(group) + 1 :]
        items_src = {name: m[sub] for name, m in compare_result.get(group, {}).items() if sub in m}
        only = getattr(guard, "classes", None)
        if only is not None and group == "per_class":
            missing = [c for c in only if c not in compare_result.get(group, {})]
            if missing:
                raise TuneproofError(
                    f"{key}.classes: {', '.join(repr(c) for c in missing)} not among the compared classes",
                    hint=f"classes: {capped(sorted(compare_result.get(group, {})))}",
                )
            items_src = {name: e for name, e in items_src.items() if name in only}
        if not items_src:
            available = sorted({f"{group}_{s}" for m in compare_result.get(group, {}).values() for s in m})
            raise TuneproofError(
                f"{key}.metric: '{guard.metric}' is not reported for task '{compare_result['task']}'",
                hint=f"use one of {capped(available) or 'the aggregate metrics'}",
            )
        min_support = int(getattr(guard, "min_support", 1) or 1)
        what = "classes" if group == "per_class" else "fields"
        correction, adjusted = _correction(guard, group, compare_result, items_src, min_support)
        items, failing, unsure, unmeasurable, demoted, failing_unc = [], [], [], [], [], []
        for name, e in items_src.items():
            support = e.get("support")
            if support is not None and support < min_support:  # cannot be judged: neither pass nor fail
                items.append(
                    {
                        "name": name,
                        **{k: e[k] for k in ("base", "cand", "delta", "ci")},
                        "support": support,
                        "verdict": "not measurable",
                        "detail": f"not measurable (support {support}, needs >= {min_support})",
                    }
                )
                unmeasurable.append(f"{name} (support {support})")
                continue
            verdict, why = _guard_item(e, guard.max_drop, guard.floor)
            unc = verdict
            test = adjusted.get(name, {})
            if unc == "fail":
                failing_unc.append(name)
            if unc == "fail" and correction["method"] == "holm" and (test.get("p_holm") or 0.0) > ALPHA + 1e-15:
                # the drop rule failed on this class's own 95% CI, but its paired test does not survive Holm
                # over the family; a floor failure is a point rule, not a test, and stays a failure
                floor_fails = guard.floor is not None and _guard_item(e, None, guard.floor)[0] == "fail"
                if not floor_fails:
                    verdict = "inconclusive"
                    demoted.append(
                        f"{name} (McNemar p {test['p_value']:.3g}, Holm p {test['p_holm']:.3g} over "
                        f"{correction['family_size']})"
                    )
            items.append(
                {
                    "name": name,
                    **{k: e[k] for k in ("base", "cand", "delta", "ci")},
                    "support": support,
                    "verdict": verdict,
                    "verdict_uncorrected": unc,
                    **test,
                    **({"why": "; ".join(why)} if verdict == "fail" else {}),
                }
            )
            if verdict == "fail":
                failing.append(f"{name} ({sub} {_r(e['base'])} -> {_r(e['cand'])}: {'; '.join(why)})")
            elif verdict == "inconclusive":
                unsure.append(name)
        judged = [it for it in items if it["verdict"] != "not measurable"]
        stated = f"judged on {what} with support >= {min_support}"
        if not judged:
            verdict = "not measurable"
            worst = {"base": None, "cand": None, "delta": None, "ci": None}
            detail = f"not measurable: no {what[:-2] if what == 'classes' else what[:-1]} has support >= {min_support}"
        else:
            worst = min(judged, key=lambda it: math.inf if it["delta"] is None else it["delta"])
            verdict = _combine([it["verdict"] for it in judged])
            detail = (
                f"failing {what}: " + capped(failing, sep="; ", where=COMPARE_JSON)
                if failing
                else f"inconclusive for: {capped(unsure, where=COMPARE_JSON)}"
                if unsure
                else f"all {len(judged)} hold; worst '{worst['name']}' delta {_fmt(worst['delta'])}"
            )
            if failing and unsure:
                detail += f"; inconclusive for: {capped(unsure, where=COMPARE_JSON)}"
            if correction["method"] == "holm":
                stated += f"; Holm over {correction['family_size']} {what}, {correction['test_short']}"
            detail += f" ({stated})"
            if demoted:
                detail += f"; {len(demoted)} fail on their own CI but not after Holm: " + capped(
                    demoted, sep="; ", where=COMPARE_JSON
                )
        if unmeasurable:
            detail += f"; not measurable (support < {min_support}): {capped(unmeasurable, where=COMPARE_JSON)}"
        out.append(
            {
                "name": f"guard: {guard.metric}{' for ' + capped(only) if only else ''} {rule}",
                "kind": "guard",
                "metric": guard.metric,
                **{k: worst[k] for k in ("base", "cand", "delta", "ci")},
                "threshold": threshold,
                "floor": guard.floor,
                "min_support": min_support,
                "verdict": verdict,
                "detail": detail,
                "items": items,
                **(
                    {
                        "correction": {
                            **correction,
                            "verdict_uncorrected": _combine([it["verdict_uncorrected"] for it in judged])
                            if judged
                            else "not measurable",
                            "failing_uncorrected": failing_unc,
                            "moved_bh": [n for n, t in adjusted.items() if t.get("moved_bh")],
                        }
                    }
                    if group == "per_class"
                    else {}
                ),
            }
        )
    return out


def _set_guard(key: str, guard: Any, rule: str, threshold: float | None, compare_result: dict) -> dict:
    """The verdict of a guard on an ``eval.sets`` entry (``compare_result["sets"][name]``): ``agreement`` against
    its ``floor`` (a point rule, as every floor), a task metric by :func:`_guard_item` (``max_drop`` on the
    paired bootstrap CI of the delta, ``floor`` on the candidate's value). "not measurable" when the comparison
    holds no outputs on the set (``test``'s pairing on the test split; ``compare`` always holds them, the
    evaluation fingerprint pairing only runs evaluated on the same sets).

    Raises:
        TuneproofError: a task metric the set does not report (names ``hypothesis.guards[i].metric``)."""
    s = (compare_result.get("sets") or {}).get(guard.set)

    def verdict_of(values: dict, verdict: str, detail: str) -> dict:
        return {
            "name": f"guard: {guard.metric} on set {guard.set} {rule}",
            "kind": "guard",
            "metric": guard.metric,
            "set": guard.set,
            **{k: values.get(k) for k in ("base", "cand", "delta", "ci")},
            "threshold": threshold,
            "floor": guard.floor,
            "verdict": verdict,
            "detail": detail,
        }

    if s is None:  # e.g. the test split's pairing with the base model, or runs paired across procedures
        return verdict_of(
            {},
            "not measurable",
            f"not measurable here: this comparison holds no outputs of both runs on eval.sets '{guard.set}' "
            "(`tuneproof compare` of a baseline and a candidate evaluated with the study's eval.sets judges it)",
        )
    if guard.metric == "agreement":
        e = s["agreement"]
    else:
        e = (s.get("metrics") or {}).get(guard.metric)
        if e is None:
            raise TuneproofError(
                f"{key}.metric: '{guard.metric}' is not reported on eval.sets '{guard.set}'"
                + ("" if s.get("references") else " (the set has no references)"),
                hint=f"use agreement{', ' + ', '.join(sorted(s.get('metrics') or {})) if s.get('metrics') else ''}",
            )
    verdict, why = _guard_item(e, guard.max_drop, guard.floor)
    where = f"on set '{guard.set}' ({s.get('n')} examples)"
    if guard.metric == "agreement":
        shown = (
            f"agreement {_r(e['cand'])} ({e.get('agree')} of {e.get('n')} outputs equal the base's), "
            f"95% CI {_ci01(e['ci'])}"
        )
        detail = f"{where}: {shown}" + (f"; below floor {guard.floor:g}" if verdict == "fail" else "")
    else:
        detail = f"{where}: {guard.metric} {_r(e['base'])} -> {_r(e['cand'])}, " + (
            "; ".join(why) if why else f"delta {_fmt(e['delta'])}, 95% CI {_fmt_ci(e['ci'])}"
        )
    return verdict_of(e, verdict, detail)


def _ci01(ci: list | None) -> str:
    return "n/a" if ci is None else f"[{ci[0]:.4f}, {ci[1]:.4f}]"


#: ``correction: auto`` applies Holm from this many judged classes on; below it the guard keeps each
#: class's own 95% CI (the verdicts of studies with few classes stay as they were)
AUTO_HOLM_MIN_CLASSES = 10


def _correction(
    guard: Any, group: str, compare_result: dict, items_src: dict, min_support: int
) -> tuple[dict, dict[str, dict]]:
    """Which multiplicity correction a per-class guard's verdict uses, and each judged class's test.

    Returns ``(correction, adjusted)``: ``correction`` is ``{"method": "holm"|"none", "requested",
    "alpha", "family_size", "test", "test_short"}``; ``adjusted`` maps each judged class (support >=
    ``min_support``) to ``{"p_value", "p_holm", "q_bh", "moved_bh", "fixed", "broken"}``, with Holm
    and Benjamini-Hochberg over the guard's own family (its judged classes). Per-field guards and
    comparisons without ``per_class_tests`` (older compare.json) get method "none" and no tests.
    """
    requested = str(getattr(guard, "correction", "auto") or "auto")
    tests = (compare_result.get("per_class_tests") or {}).get("classes") if group == "per_class" else None
    judged = [n for n, e in items_src.items() if e.get("support") is None or e["support"] >= min_support]
    adjusted: dict[str, dict] = {}
    if tests is not None and judged:
        ps = [float((tests.get(n) or {}).get("p_value", 1.0)) for n in judged]
        hp, _ = holm(ps)
        q, moved = benjamini_hochberg(ps)
        for n, p, a, b, r in zip(judged, ps, hp, q, moved):
            t = tests.get(n) or {}
            adjusted[n] = {
                "p_value": p,
                "p_holm": a,
                "q_bh": b,
                "moved_bh": bool(r),
                "fixed": t.get("fixed", 0),
                "broken": t.get("broken", 0),
            }
    use_holm = tests is not None and (
        requested == "holm" or (requested == "auto" and len(judged) >= AUTO_HOLM_MIN_CLASSES)
    )
    correction = {
        "method": "holm" if use_holm else "none",
        "requested": requested,
        "alpha": ALPHA,
        "family_size": len(judged),
        "test": CLASS_TEST,
        "test_short": "exact McNemar per class",
    }
    return correction, adjusted


def guard_support(hypothesis: Any, task: str, examples: Sequence[Any], cfg: TaskConfig, split: str) -> list[dict]:
    """How many classes (fields) each per-class / per-field guard can judge on ``examples``, before any run.

    The support of a class or field is the scorer's own (``support`` of ``per_class`` /
    ``per_field``; e.g. references of that class, or gold values of that field), computed by scoring
    the references against themselves, so it is the number :func:`judge_hypothesis` will compare with
    the guard's ``min_support``.

    Args:
        examples: the evaluated examples (the eval split as ``eval.max_examples`` caps it), each with
            ``id``, ``label``, ``text``, ``target``.
        cfg: the scorer's config (:func:`tuneproof.tasks.task_config`), with the study's label set.
        split: the split's name, for the line.

    Returns:
        one ``{"guard", "metric", "min_support", "n", "items", "measurable", "unmeasurable": {name:
        support}, "warn", "line"}`` per such guard; ``warn`` when none or fewer than half of the items
        are measurable. Guards on aggregate metrics are left out.
    """
    kind = get_task(task)
    records = [
        {"id": e.id, "category": e.label, "input": e.text, "reference": e.target, "prediction": e.target}
        for e in examples
    ]
    metrics: dict | None = None
    out = []
    for gi, guard in enumerate(hypothesis.guards):
        group = next((g for g in ("per_class", "per_field") if guard.metric.startswith(g + "_")), None)
        if group is None:
            continue
        if metrics is None:
            metrics = kind.score(records, cfg)[1] if records else {}
        support = {name: int(m.get("support") or 0) for name, m in (metrics.get(group) or {}).items()}
        if guard.classes is not None and group == "per_class":
            support = {c: support.get(c, 0) for c in guard.classes}
        what = "classes" if group == "per_class" else "fields"
        ms = int(guard.min_support)
        low = {k: v for k, v in sorted(support.items(), key=lambda kv: (kv[1], kv[0])) if v < ms}
        measurable = len(support) - len(low)
        warn = bool(support) and (measurable == 0 or measurable < len(support) / 2)
        line = (
            f"hypothesis.guards[{gi}] {guard.metric} (min_support {ms}): {measurable} of {len(support)} {what} "
            f"measurable on {split} ({len(records)} examples)"
        )
        if low:
            names = [f"'{k}' {v}" for k, v in low.items()]
            line += f"; support under {ms}: " + capped(names)
        if warn:
            line += (
                f"; compare would call {'it' if measurable == 0 else 'those'} 'not measurable': lower min_support, "
                "evaluate more examples (eval.max_examples, data.split.max_examples) or name the classes"
            )
        out.append(
            {
                "guard": gi,
                "metric": guard.metric,
                "min_support": ms,
                "n": len(records),
                "items": len(support),
                "measurable": measurable,
                "unmeasurable": low,
                "warn": warn,
                "line": line,
            }
        )
    return out


def _r(x: Any) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def overall_verdict(verdicts: list[dict]) -> dict:
    """``{"verdict", "detail"}``: "pass" only if the success criterion passes and no guard fails;
    "fail" if the success criterion or any guard fails; otherwise "inconclusive"."""
    success = [v for v in verdicts if v["kind"] == "success"]
    guards = [v for v in verdicts if v["kind"] == "guard"]
    failed = [v["name"] for v in verdicts if v["verdict"] == "fail"]
    unsure_guards = [v["name"] for v in guards if v["verdict"] == "inconclusive"]
    unmeasurable = [v["name"] for v in guards if v["verdict"] == "not measurable"]
    if failed:
        verdict, detail = "fail", "failed: " + capped(failed, sep="; ")
    elif success and all(v["verdict"] == "pass" for v in success):
        verdict = "pass"
        detail = "success criterion met, no guard failed"
        if unsure_guards:
            detail += "; inconclusive guards: " + capped(unsure_guards, sep="; ")
        if unmeasurable:
            detail += "; not measurable guards: " + capped(unmeasurable, sep="; ")
    else:
        verdict, detail = "inconclusive", "success criterion not established (CI includes the required gain)"
    return {"verdict": verdict, "detail": detail}
