"""Control runs: the evaluations of the base model a candidate is compared with (docs/PROTOCOL.md step 2).

A control is a completed ``baseline`` run: the plain baseline (the base model under the study's prompt), or a
few-shot control (``tuneproof baseline --few-shot K``: the same procedure with K training examples shown before
each evaluated one, summary ``control: few_shot``, ``few_shot: K``; its fingerprint has a ``control`` part,
:mod:`tuneproof.evaluation.fingerprint`). ``train`` wants a plain baseline; ``compare`` shows the candidate against
each control and judges the success criterion against the one the frozen hypothesis names
(``hypothesis.success.against``: ``baseline``, or ``strongest``: the best completed control on the success metric
when the first train run froze the hypothesis, :func:`strongest_control`).
"""

from __future__ import annotations

import math
from typing import Any

from tuneproof.evaluation.compare import overall_verdict
from tuneproof.evaluation.fingerprint import diff_fingerprints, study_eval_fingerprint
from tuneproof.evaluation.screen import fmt_p
from tuneproof.ui import fmt

#: the run summary's key naming the control (absent on a plain baseline)
CONTROL_KEY = "control"


def control_kind(rec: Any) -> str | None:
    """The control a run is (``few_shot``), or None for a plain baseline or any other run."""
    value = (getattr(rec, "summary", None) or {}).get(CONTROL_KEY)
    return str(value) if value else None


def control_label(rec: Any) -> str:
    """How a control is named on screens: ``baseline (the base model, the study's prompt)`` or ``5-shot prompt``."""
    if control_kind(rec) == "few_shot":
        return f"{rec.summary.get('few_shot')}-shot prompt"
    return "baseline (the base model, the study's prompt)"


def plain_baselines(registry: Any, status: str = "completed") -> list[Any]:
    """The ``baseline`` runs of ``status`` that are not controls (oldest first)."""
    return [r for r in registry.list(kind="baseline", status=status) if control_kind(r) is None]


def latest_plain_baseline(registry: Any) -> Any:
    """The latest completed plain baseline (a few-shot control is never it), or None."""
    runs = plain_baselines(registry)
    return runs[-1] if runs else None


def few_shot_controls(registry: Any) -> list[Any]:
    """The latest completed few-shot control per K (oldest K first, in run order)."""
    latest: dict[Any, Any] = {}
    for r in registry.list(kind="baseline", status="completed"):
        if control_kind(r) is not None:
            latest[(control_kind(r), r.summary.get("few_shot"))] = r
    return sorted(latest.values(), key=lambda r: r.seq)


def fingerprint_of(registry: Any, rec: Any) -> dict:
    """The evaluation fingerprint a run recorded (``eval.json``), ``{}`` when none."""
    return (registry.run_json(rec.id, "eval.json") or {}).get("fingerprint") or {}


def same_procedure(registry: Any, rec: Any, efp: dict | None) -> bool:
    """Whether ``rec`` was evaluated by the procedure ``efp`` (its ``control`` part aside); True without ``efp``."""
    if not efp:
        return True
    recorded = fingerprint_of(registry, rec)
    return bool(recorded.get("parts")) and not diff_fingerprints(recorded, efp, controls=True)


def metric_value(registry: Any, rec: Any, metric: str) -> float | None:
    """A run's recorded value of ``metric`` (``eval.json``'s metrics, else the summary's), None when absent."""
    for source in ((registry.run_json(rec.id, "eval.json") or {}).get("metrics") or {}, rec.summary.get("metrics")):
        v = (source or {}).get(metric)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            return float(v)
    return None


def strongest_control(registry: Any, metric: str, efp: dict | None, baseline_id: str | None = None) -> dict | None:
    """The best completed control on ``metric`` under the procedure ``efp``: the plain baseline (``baseline_id``,
    default the latest plain one of that procedure) and the latest few-shot control per K of that procedure.

    A tie keeps the plain baseline (then the earlier run). Returns ``{"setting": "strongest", "run", "control",
    "label", "metric", "value", "considered": [{"run", "control", "label", "value"}]}``; None when no control has
    a value of ``metric``.
    """
    plain = [r for r in plain_baselines(registry) if same_procedure(registry, r, efp)]
    if baseline_id is not None:
        plain = [registry.get(baseline_id)]
    runs = plain[-1:] + [r for r in few_shot_controls(registry) if same_procedure(registry, r, efp)]
    considered = [
        {"run": r.id, "control": control_kind(r) or "baseline", "label": control_label(r), "value": v}
        for r in runs
        if (v := metric_value(registry, r, metric)) is not None
    ]
    if not considered:
        return None
    best = considered[0]
    for c in considered[1:]:
        if c["value"] > best["value"]:
            best = c
    return {"setting": "strongest", **best, "metric": metric, "considered": considered}


def choose_against(ctx: Any) -> dict | None:
    """What the first train run freezes for ``hypothesis.success.against: strongest``: the strongest control of
    the study's current procedure on the success metric (:func:`strongest_control`), or, when no completed control
    has a value, ``{"setting": "strongest", "run": None, "note"}`` (compare then judges against the baseline and
    says why). None for ``against: baseline`` (nothing is recorded: the frozen file stays as before).
    """
    success = ctx.study.hypothesis.success
    if getattr(success, "against", "baseline") != "strongest":
        return None
    efp = study_eval_fingerprint(ctx)
    chosen = strongest_control(ctx.registry, success.metric, efp)
    if chosen is None:
        return {
            "setting": "strongest",
            "run": None,
            "metric": success.metric,
            "note": f"no completed control of this procedure had a value of {success.metric} at freeze time",
        }
    return chosen


def control_block(rec: Any, result: dict) -> dict:
    """One control's line of a candidate's comparison (``compare.json``'s ``candidates[id].controls[run]``): the
    control (run, kind, label, K), the paired counts and McNemar test on the success metric's per-example rule, every
    metric's delta with its 95% paired bootstrap interval, the success verdict against this control and the overall
    verdict the hypothesis would give against it."""
    success = next((v for v in result.get("verdicts") or [] if v.get("kind") == "success"), None)
    return {
        "run": rec.id,
        "control": control_kind(rec) or "baseline",
        "label": control_label(rec),
        "few_shot": (rec.summary or {}).get("few_shot"),
        "n": result.get("n"),
        "counts": result.get("counts"),
        "counts_basis": result.get("counts_basis"),
        "mcnemar": result.get("mcnemar"),
        "metrics": result.get("metrics"),
        "success": success,
        "overall": result.get("overall"),
        "noise": result.get("noise"),  # the pair's noise floors the success verdict was judged above (eval.repeat)
    }


def judge_against_control(result: dict, judged: dict, label: str, run_id: str, baseline_id: str) -> dict:
    """``result`` (a candidate against the plain baseline, its verdicts judged) with its success verdict replaced by
    the one against the control the frozen hypothesis names (``judged``: :func:`control_block` of that control);
    the guards stay judged against the baseline. The verdicts against the baseline are kept as
    ``verdicts_vs_baseline`` / ``overall_vs_baseline``; when the control changes the verdict, ``control_reason``
    says so in one line (it heads the overall detail, the dossier's first screen shows it).

    Returns the updated ``result`` (the same dict).
    """
    success = judged.get("success")
    if not success or not result.get("verdicts"):
        return result
    moved = {
        **success,
        "name": f"{success['name']} vs {label} {run_id}",
        "against": run_id,
        "against_label": label,
    }
    result["verdicts_vs_baseline"] = result["verdicts"]
    result["overall_vs_baseline"] = result["overall"]
    result["verdicts"] = [moved if v.get("kind") == "success" else v for v in result["verdicts"]]
    overall = dict(overall_verdict(result["verdicts"]))
    plain = next((v for v in result["verdicts_vs_baseline"] if v.get("kind") == "success"), {})
    reason = None
    if overall["verdict"] != result["overall_vs_baseline"]["verdict"] or plain.get("verdict") != success["verdict"]:
        beats = {"pass": "beats", "fail": "does not beat", "inconclusive": "is not shown to beat"}
        reason = (
            f"the candidate {beats.get(plain.get('verdict'), 'is judged ' + str(plain.get('verdict')))} the baseline "
            f"{baseline_id} (delta {_num(plain.get('delta'))}, 95% CI {_ci(plain.get('ci'))}) but "
            f"{beats.get(success['verdict'], 'is judged ' + success['verdict'] + ' against')} the {label} {run_id} "
            f"(delta {_num(success.get('delta'))}, 95% CI {_ci(success.get('ci'))}; required gain "
            f"{_num(success.get('threshold'))}): the success criterion is judged against the strongest control "
            "(hypothesis.success.against: strongest)"
        )
        overall["detail"] = f"{reason}; {overall['detail']}"
    result["overall"] = overall
    result["control_reason"] = reason
    return result


def _num(x: Any) -> str:
    return "n/a" if not isinstance(x, (int, float)) else f"{x:+.4f}"


def _ci(ci: Any) -> str:
    if not ci or any(not isinstance(x, (int, float)) for x in ci):
        return "n/a"
    return f"[{ci[0]:+.4f}, {ci[1]:+.4f}]"


def control_lines(r: dict) -> list[str]:
    """The candidate against each control, one line each (success metric delta, its 95% paired bootstrap CI,
    McNemar counts and p, the success verdict against it), and which control the verdict was judged against."""
    blocks = r.get("controls") or {}
    if len(blocks) < 2 and not r.get("control_reason"):
        return []
    judged = (r.get("judged_control") or {}).get("run")
    lines = ["  against each control (paired by example id):"]
    for rid, b in blocks.items():
        s, c = b.get("success") or {}, b.get("counts") or {}
        lines.append(
            f"    {'*' if rid == judged else ' '} {b['label']} {rid}: {s.get('metric')} {fmt(s.get('base'))} -> "
            f"{fmt(s.get('cand'))}, delta {fmt(s.get('delta'))} "
            f"[{', '.join(fmt(x) for x in (s.get('ci') or [None, None]))}]; fixed {c.get('fixed')}, broken "
            f"{c.get('broken')}, McNemar p = {fmt_p((b.get('mcnemar') or {}).get('p_value'))}; success "
            f"{s.get('verdict')}"
        )
    lines.append(f"  success judged against {judged} (*): {(r.get('judged_control') or {}).get('why')}")
    if r.get("control_reason"):
        lines.append(f"  {r['control_reason']}")
    return lines
