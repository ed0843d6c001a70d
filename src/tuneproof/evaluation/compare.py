"""Paired comparison of a candidate against the baseline, example by example, and the verdicts.

The protocol (PROTOCOL.md, steps 1-2) compares the adapted model against its concrete
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
from typing import Any, Callable, Sequence

import numpy as np

from tuneproof.errors import TuneproofError
from tuneproof.evaluation.metrics import HEADLINE_METRICS, finite_or_none, score

CONFIDENCE = 0.95
TOP_SHARE = 0.05  # "top 5% of examples" for the concentration flag
_EPS = 1e-12  # float tolerance of threshold comparisons
_CELLS_PER_CHUNK = 4_000_000  # bootstrap weight-matrix cells per chunk (32 MB of float64)

Blocks = dict[str, np.ndarray]


# --------------------------------------------------------------------------- small helpers
def _div(num: np.ndarray, den: np.ndarray, undefined: float) -> np.ndarray:
    """num / den elementwise; ``undefined`` where den == 0 (0 = sklearn zero_division=0, NaN = skip)."""
    num, den = np.broadcast_arrays(np.asarray(num, dtype=float), np.asarray(den, dtype=float))
    out = np.full(num.shape, undefined, dtype=float)
    np.divide(num, den, out=out, where=den != 0)
    return out


def _col(values: Sequence[float]) -> np.ndarray:
    return np.asarray(values, dtype=float).reshape(-1, 1)


def _onehot(keys: Sequence[Any], vocab: Sequence[Any]) -> np.ndarray:
    index = {v: j for j, v in enumerate(vocab)}
    out = np.zeros((len(keys), len(vocab)))
    for i, k in enumerate(keys):
        if k in index:
            out[i, index[k]] = 1.0
    return out


# --------------------------------------------------------------------------- per-task statistics
# Each builder turns scored records into additive per-example statistics ("blocks", each an
# [n, m] array) plus a function mapping their sums ([B, m] per block) to metric values ([B]).
# Every metric is a function of sums of per-example statistics, so one weighted sum per
# bootstrap resample recomputes all of them exactly.
MetricFn = Callable[[Blocks, int, float], dict]


def _classification_stats(recs: list[dict], labels: list[str]) -> Blocks:
    refs = [str(r["reference"]).strip() for r in recs]
    preds = [str(r.get("prediction") or "").strip() for r in recs]
    ref1, pred1 = _onehot(refs, labels), _onehot(preds, labels)
    return {"correct": _col([r["correct"] for r in recs]), "tp": ref1 * pred1, "pred": pred1, "sup": ref1}


def _classification_metrics(labels: list[str]) -> MetricFn:
    def fn(z: Blocks, n: int, undefined: float) -> dict:
        tp, pr, su = z["tp"], z["pred"], z["sup"]
        f1_0 = _div(2 * tp, pr + su, 0.0)
        out: dict = {
            "accuracy": z["correct"][:, 0] / n,
            "macro_f1": f1_0.mean(axis=1),
            "weighted_f1": _div((f1_0 * su).sum(axis=1), su.sum(axis=1), 0.0),
            "micro_f1": _div(2 * tp.sum(axis=1), pr.sum(axis=1) + su.sum(axis=1), 0.0),
        }
        rec, prec, f1 = _div(tp, su, undefined), _div(tp, pr, undefined), _div(2 * tp, pr + su, undefined)
        for j, lab in enumerate(labels):
            out[("per_class", lab, "recall")] = rec[:, j]
            out[("per_class", lab, "precision")] = prec[:, j]
            out[("per_class", lab, "f1")] = f1[:, j]
        return out

    return fn


def _extraction_stats(recs: list[dict], classes: list[str], fields: list[str]) -> Blocks:
    sc = [r["scores"] for r in recs]
    member = _onehot([s["class"] for s in sc], classes)
    pred = _onehot([s["pred_intent"] for s in sc], classes)
    intent_ok = _col([s["intent_correct"] for s in sc])
    exact = _col([r["correct"] for r in recs])
    tp, fp, fn = _col([s["tp"] for s in sc]), _col([s["fp"] for s in sc]), _col([s["fn"] for s in sc])
    ftp, ffp, ffn = (np.zeros((len(recs), len(fields))) for _ in range(3))
    fhas, fexact = np.zeros_like(ftp), np.zeros_like(ftp)
    findex = {f: j for j, f in enumerate(fields)}
    for i, s in enumerate(sc):
        for slot, (a, b, c) in s["fields"].items():
            j = findex.get(slot)
            if j is None:
                continue
            ftp[i, j], ffp[i, j], ffn[i, j] = a, b, c
            if a + c > 0:  # the reference has this slot
                fhas[i, j] = 1.0
                fexact[i, j] = float(b == 0 and c == 0)
    return {
        "valid": _col([s["json_valid"] for s in sc]),
        "required": _col([s["required_present"] for s in sc]),
        "intent": intent_ok,
        "exact": exact,
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "c_member": member,
        "c_pred": pred,
        "c_intent_tp": member * intent_ok,
        "c_exact": member * exact,
        "c_tp": member * tp,
        "c_fp": member * fp,
        "c_fn": member * fn,
        "f_tp": ftp,
        "f_fp": ffp,
        "f_fn": ffn,
        "f_has": fhas,
        "f_exact": fexact,
    }


def _extraction_metrics(classes: list[str], fields: list[str]) -> MetricFn:
    def fn(z: Blocks, n: int, undefined: float) -> dict:
        tp, fp, fneg = z["tp"][:, 0], z["fp"][:, 0], z["fn"][:, 0]
        out: dict = {
            "json_valid_rate": z["valid"][:, 0] / n,
            "required_fields_rate": z["required"][:, 0] / n,
            "intent_accuracy": z["intent"][:, 0] / n,
            "exact_match": z["exact"][:, 0] / n,
            "field_precision": _div(tp, tp + fp, 0.0),
            "field_recall": _div(tp, tp + fneg, 0.0),
            "field_f1": _div(2 * tp, 2 * tp + fp + fneg, 0.0),
        }
        m, itp, pr = z["c_member"], z["c_intent_tp"], z["c_pred"]
        ctp, cfp, cfn = z["c_tp"], z["c_fp"], z["c_fn"]
        per_c = {
            "recall": _div(itp, m, undefined),
            "precision": _div(itp, pr, undefined),
            "f1": _div(2 * itp, pr + m, undefined),
            "exact_match": _div(z["c_exact"], m, undefined),
            "field_precision": _div(ctp, ctp + cfp, undefined),
            "field_recall": _div(ctp, ctp + cfn, undefined),
            "field_f1": _div(2 * ctp, 2 * ctp + cfp + cfn, undefined),
        }
        for j, c in enumerate(classes):
            for key, arr in per_c.items():
                out[("per_class", c, key)] = arr[:, j]
        ftp, ffp, ffn = z["f_tp"], z["f_fp"], z["f_fn"]
        per_f = {
            "precision": _div(ftp, ftp + ffp, undefined),
            "recall": _div(ftp, ftp + ffn, undefined),
            "f1": _div(2 * ftp, 2 * ftp + ffp + ffn, undefined),
            "exact_match_rate": _div(z["f_exact"], z["f_has"], undefined),
        }
        for j, f in enumerate(fields):
            for key, arr in per_f.items():
                out[("per_field", f, key)] = arr[:, j]
        return out

    return fn


_FORMAT_RATES = {"json_valid": "json_valid_rate", "schema_valid": "schema_valid_rate", "regex_match": "regex_match_rate", "required_present": "required_fields_rate"}


def _format_stats(recs: list[dict], classes: list[str], rate_keys: list[str]) -> Blocks:
    sc = [r["scores"] for r in recs]
    member = _onehot([None if r.get("category") is None else str(r["category"]) for r in recs], classes)
    comp, exact = _col([s["compliant"] for s in sc]), _col([s["exact"] for s in sc])
    blocks = {"compliant": comp, "exact": exact, "c_member": member, "c_compliant": member * comp, "c_exact": member * exact}
    for key in rate_keys:
        blocks[key] = _col([s[key] for s in sc])
    return blocks


def _format_metrics(classes: list[str], rate_keys: list[str]) -> MetricFn:
    def fn(z: Blocks, n: int, undefined: float) -> dict:
        out: dict = {"compliance_rate": z["compliant"][:, 0] / n, "exact_match": z["exact"][:, 0] / n}
        for key in rate_keys:
            out[_FORMAT_RATES[key]] = z[key][:, 0] / n
        comp, ex = _div(z["c_compliant"], z["c_member"], undefined), _div(z["c_exact"], z["c_member"], undefined)
        for j, c in enumerate(classes):
            out[("per_class", c, "compliance_rate")] = comp[:, j]
            out[("per_class", c, "exact_match")] = ex[:, j]
        return out

    return fn


# --------------------------------------------------------------------------- pairing
def _pair(base_records: Sequence[dict], cand_records: Sequence[dict]) -> tuple[list[dict], list[dict]]:
    """Align both runs on ``id`` (baseline order). Raises TuneproofError on any mismatch."""

    def index(recs: Sequence[dict], side: str) -> dict:
        out: dict = {}
        for i, r in enumerate(recs):
            if "id" not in r:
                raise TuneproofError(f"{side} output record #{i} has no 'id'", hint="outputs.jsonl rows need an id (CONTRACTS.md)")
            rid = str(r["id"])
            if rid in out:
                raise TuneproofError(f"{side} outputs hold id '{rid}' twice", hint="each example must be evaluated once")
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
    return {"base": finite_or_none(base), "cand": finite_or_none(cand), "delta": finite_or_none(cand - base), "ci": _ci(delta_samples)}


# --------------------------------------------------------------------------- concentration
_GAIN_BASIS = {
    "extraction": {
        "json_valid_rate": "json_valid",
        "required_fields_rate": "required_present",
        "intent_accuracy": "intent_correct",
        "field_f1": "field_f1",
        "field_precision": "field_f1",
        "field_recall": "field_f1",
    },
    "format": {"exact_match": "exact", **{v: k for k, v in _FORMAT_RATES.items()}},
}


def _example_score(rec: dict, basis: str) -> float:
    if basis == "correct":
        return float(rec["correct"])
    s = rec["scores"]
    if basis == "field_f1":  # per-example F1 of (slot, value) pairs; 1.0 when nothing to extract and nothing predicted
        den = 2 * s["tp"] + s["fp"] + s["fn"]
        return 2 * s["tp"] / den if den else 1.0
    return float(s[basis])


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
    parts = []
    if flag_examples:
        parts.append(f"{len(top)} example(s) (top {TOP_SHARE:.0%}) carry {top_sum / net:.0%} of the net gain of {net:g}")
    if flag_class:
        parts.append(f"class '{top_class}' carries {class_sum / net:.0%} of the net gain of {net:g}")
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
        "detail": "; ".join(parts) if parts else "gain not concentrated" if net > 0 else "no net gain",
    }


# --------------------------------------------------------------------------- comparison
def mcnemar_exact(fixed: int, broken: int) -> float:
    """Exact two-sided McNemar p-value: binomial test of ``fixed`` of ``fixed + broken`` at p = 0.5.

    McNemar (1947); exact form as ``scipy.stats.binomtest(..., alternative="two-sided")``.
    Returns 1.0 when there are no discordant pairs. Example: fixed 10, broken 2 -> 0.03857421875.
    """
    from scipy.stats import binomtest

    if fixed + broken == 0:
        return 1.0
    return float(binomtest(int(fixed), int(fixed + broken), 0.5, alternative="two-sided").pvalue)


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
) -> dict:
    """Compare candidate outputs against baseline outputs on the same examples.

    Both record lists (rows of ``outputs.jsonl``: ``id``, ``category``, ``reference``,
    ``prediction``) are re-scored here with the same metric definitions
    (:func:`tuneproof.evaluation.metrics.score`; classification uses ``labels``, default the
    label set of the references), so stale ``correct`` / ``scores`` fields cannot skew the comparison.

    Args:
        task: ``"classification"``, ``"extraction"`` or ``"format"``.
        required_fields: hypothesis.required_fields.
        eval_cfg: the study's :class:`tuneproof.study.Eval` (allow_fenced_json, json_schema, regex).
        hypothesis: the study's :class:`tuneproof.study.Hypothesis`; when given, the result holds
            ``verdicts`` and ``overall`` from :func:`judge`.
        iterations: bootstrap resamples (``eval.bootstrap_iterations``).
        seed: bootstrap seed (``eval.seed``).
        labels: classification label set (default: the sorted references); pass the study's
            full label set so a class absent from the eval split still counts as valid.

    Returns:
        A JSON-ready dict: ``task``, ``n``, ``counts`` (``fixed`` = baseline wrong and candidate
        right, ``broken``, ``unchanged_right``, ``unchanged_wrong``; "right" is the per-example
        ``correct``: label match, exact match, or format compliance), ``fixed_ids``,
        ``broken_ids``, ``mcnemar`` (``{"fixed", "broken", "p_value", "test"}``),
        ``bootstrap`` (``{"iterations", "seed", "confidence", "method"}``), ``headline``
        (metric names), ``metrics`` (``{name: {"base", "cand", "delta", "ci": [lo, hi]}}``
        for every aggregate metric), ``per_class`` and ``per_field``
        (``{name: {key: {"base", "cand", "delta", "ci", "support"}}}``), ``concentration``,
        ``base_metrics``, ``cand_metrics`` and, with a hypothesis, ``verdicts`` and
        ``overall``. NaN values are written as None.

    Raises:
        TuneproofError: the id sets differ (says how many are missing on each side), a
            duplicate id, a reference that differs between the runs, or a hypothesis metric
            the task does not report.
    """
    base_raw, cand_raw = _pair(base_records, cand_records)
    n = len(base_raw)
    if task == "classification":
        refs = {str(r.get("reference", "")).strip() for r in base_raw}
        labels = [str(x) for x in labels] if labels is not None else sorted(refs - {""})
    else:
        labels = None
    base, base_m = score(task, base_raw, required_fields=required_fields, eval_cfg=eval_cfg, labels=labels)
    cand, cand_m = score(task, cand_raw, required_fields=required_fields, eval_cfg=eval_cfg, labels=labels)

    if task == "classification":
        classes, fields = labels, []
        bb, cb = _classification_stats(base, labels), _classification_stats(cand, labels)
        metric_fn = _classification_metrics(labels)
        example_class = [str(r["reference"]).strip() for r in base]
    elif task == "extraction":
        classes, fields = sorted(base_m["per_class"]), sorted(set(base_m["per_field"]) | set(cand_m["per_field"]))
        bb, cb = _extraction_stats(base, classes, fields), _extraction_stats(cand, classes, fields)
        metric_fn = _extraction_metrics(classes, fields)
        example_class = [r["scores"]["class"] for r in base]
    else:
        classes, fields = sorted(base_m["per_class"]), []
        rate_keys = [k for k in _FORMAT_RATES if k in base[0]["scores"]]
        bb, cb = _format_stats(base, classes, rate_keys), _format_stats(cand, classes, rate_keys)
        metric_fn = _format_metrics(classes, rate_keys)
        example_class = [r.get("category") for r in base]

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
            bv = bm.get(name, {}).get(sub, 0.0)
            cv = cm.get(name, {}).get(sub, 0.0)
            item = _entry(bv, cv, deltas[key])
            item["support"] = bm.get(name, cm.get(name, {})).get("support")
            per[group].setdefault(name, {})[sub] = item

    base_ok = np.array([r["correct"] for r in base], dtype=bool)
    cand_ok = np.array([r["correct"] for r in cand], dtype=bool)
    ids = [str(r["id"]) for r in base]
    fixed_mask, broken_mask = ~base_ok & cand_ok, base_ok & ~cand_ok
    counts = {
        "fixed": int(fixed_mask.sum()),
        "broken": int(broken_mask.sum()),
        "unchanged_right": int((base_ok & cand_ok).sum()),
        "unchanged_wrong": int((~base_ok & ~cand_ok).sum()),
    }

    success_metric = getattr(getattr(hypothesis, "success", None), "metric", None)
    basis = _GAIN_BASIS.get(task, {}).get(success_metric, "correct")
    gains = np.array([_example_score(c, basis) - _example_score(b, basis) for b, c in zip(base, cand)])

    headline = list(HEADLINE_METRICS[task])
    if task == "format":
        headline = ["compliance_rate"] + [_FORMAT_RATES[k] for k in rate_keys] + ["exact_match"]
    result = {
        "task": task,
        "n": n,
        "counts": counts,
        "fixed_ids": [i for i, m in zip(ids, fixed_mask) if m],
        "broken_ids": [i for i, m in zip(ids, broken_mask) if m],
        "mcnemar": {
            "fixed": counts["fixed"],
            "broken": counts["broken"],
            "p_value": mcnemar_exact(counts["fixed"], counts["broken"]),
            "test": "McNemar (1947) exact: two-sided binomial test on discordant pairs, p=0.5",
        },
        "bootstrap": {
            "iterations": int(iterations),
            "seed": int(seed),
            "confidence": CONFIDENCE,
            "method": "paired percentile bootstrap over examples (Efron & Tibshirani 1993)",
        },
        "headline": headline,
        "metrics": metrics,
        "per_class": per["per_class"],
        "per_field": per["per_field"],
        "concentration": _concentration(ids, example_class, gains, basis),
        "base_metrics": base_m,
        "cand_metrics": cand_m,
    }
    if hypothesis is not None:
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

    - success (``threshold`` = min_gain): pass if CI low >= min_gain, fail if CI high <
      min_gain, else inconclusive.
    - guard with ``max_drop`` d (``threshold`` = -d): fail if CI high < -d (it certainly
      dropped more than allowed), pass if CI low >= -d, else inconclusive. With ``floor`` f:
      fail if the candidate's point value < f. Both set: fail if either fails.
    - ``per_class_<key>`` / ``per_field_<key>`` (e.g. ``per_class_recall``, ``per_class_f1``,
      ``per_field_f1``) apply the guard to every class / field and name each failing one;
      the per-item CI conditions on resamples where the item's metric is defined, and the
      point delta decides when no resample defines it. A per-class guard with ``classes``
      applies to those classes only.

    Raises:
        TuneproofError: a metric the comparison does not report (names the study key), or a
            guard with neither max_drop nor floor.
    """
    out = []
    succ = hypothesis.success
    e = _metric_entry(compare_result, succ.metric, "hypothesis.success.metric")
    v = _ci_rule(e["ci"], e["delta"], succ.min_gain) if e["ci"] is not None else "inconclusive"
    out.append({
        "name": f"success: {succ.metric} gain >= {succ.min_gain:g}",
        "kind": "success",
        "metric": succ.metric,
        **{k: e[k] for k in ("base", "cand", "delta", "ci")},
        "threshold": succ.min_gain,
        "floor": None,
        "verdict": v,
        "detail": f"delta {_fmt(e['delta'])}, 95% CI {_fmt_ci(e['ci'])} vs required gain {succ.min_gain:g}",
    })

    for gi, guard in enumerate(hypothesis.guards):
        key = f"hypothesis.guards[{gi}]"
        if guard.max_drop is None and guard.floor is None:
            raise TuneproofError(f"{key}: guard on '{guard.metric}' has neither max_drop nor floor", hint="set max_drop and/or floor")
        threshold = None if guard.max_drop is None else 0.0 - guard.max_drop
        rule = " and ".join(
            ([f"drop <= {guard.max_drop:g}"] if guard.max_drop is not None else []) + ([f">= {guard.floor:g}"] if guard.floor is not None else [])
        )
        group = next((g for g in ("per_class", "per_field") if guard.metric.startswith(g + "_")), None)
        if group is None:
            e = _metric_entry(compare_result, guard.metric, f"{key}.metric")
            verdict, why = _guard_item(e, guard.max_drop, guard.floor)
            out.append({
                "name": f"guard: {guard.metric} {rule}",
                "kind": "guard",
                "metric": guard.metric,
                **{k: e[k] for k in ("base", "cand", "delta", "ci")},
                "threshold": threshold,
                "floor": guard.floor,
                "verdict": verdict,
                "detail": "; ".join(why) if why else f"delta {_fmt(e['delta'])}, 95% CI {_fmt_ci(e['ci'])}",
            })
            continue
        sub = guard.metric[len(group) + 1 :]
        items_src = {name: m[sub] for name, m in compare_result.get(group, {}).items() if sub in m}
        only = getattr(guard, "classes", None)
        if only is not None and group == "per_class":
            missing = [c for c in only if c not in compare_result.get(group, {})]
            if missing:
                raise TuneproofError(f"{key}.classes: {', '.join(repr(c) for c in missing)} not among the compared classes",
                                     hint=f"classes: {', '.join(sorted(compare_result.get(group, {})))}")
            items_src = {name: e for name, e in items_src.items() if name in only}
        if not items_src:
            available = sorted({f"{group}_{s}" for m in compare_result.get(group, {}).values() for s in m})
            raise TuneproofError(
                f"{key}.metric: '{guard.metric}' is not reported for task '{compare_result['task']}'",
                hint=f"use one of {', '.join(available) or 'the aggregate metrics'}",
            )
        items, failing, unsure = [], [], []
        for name, e in items_src.items():
            verdict, why = _guard_item(e, guard.max_drop, guard.floor)
            items.append({"name": name, **{k: e[k] for k in ("base", "cand", "delta", "ci")}, "support": e.get("support"), "verdict": verdict})
            if verdict == "fail":
                failing.append(f"{name} ({sub} {_r(e['base'])} -> {_r(e['cand'])}: {'; '.join(why)})")
            elif verdict == "inconclusive":
                unsure.append(name)
        worst = min(items, key=lambda it: math.inf if it["delta"] is None else it["delta"])
        verdict = _combine([it["verdict"] for it in items])
        detail = (
            f"failing {'classes' if group == 'per_class' else 'fields'}: " + "; ".join(failing)
            if failing
            else f"inconclusive for: {', '.join(unsure)}"
            if unsure
            else f"all {len(items)} hold; worst '{worst['name']}' delta {_fmt(worst['delta'])}"
        )
        if failing and unsure:
            detail += f"; inconclusive for: {', '.join(unsure)}"
        out.append({
            "name": f"guard: {guard.metric}{' for ' + ', '.join(only) if only else ''} {rule}",
            "kind": "guard",
            "metric": guard.metric,
            **{k: worst[k] for k in ("base", "cand", "delta", "ci")},
            "threshold": threshold,
            "floor": guard.floor,
            "verdict": verdict,
            "detail": detail,
            "items": items,
        })
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
    if failed:
        verdict, detail = "fail", "failed: " + "; ".join(failed)
    elif success and all(v["verdict"] == "pass" for v in success):
        verdict = "pass"
        detail = "success criterion met, no guard failed"
        if unsure_guards:
            detail += "; inconclusive guards: " + "; ".join(unsure_guards)
    else:
        verdict, detail = "inconclusive", "success criterion not established (CI includes the required gain)"
    return {"verdict": verdict, "detail": detail}
