"""The claims of an export bundle, recomputed from the evidence it ships (tests/deliver/test_deliver_claims.py).

``manifest.json`` states results: the candidate's headline metrics, the comparison with the
baseline (verdict, counts, McNemar, metric deltas with bootstrap intervals, each guard's verdict)
and the training summary (steps, first and final loss). A bundle ships the per-example outputs
those results come from (``results/outputs.jsonl``: the eval run's, ``results/baseline_outputs.jsonl``:
the baseline's, both hash-listed in the manifest) and the per-step training log
(``results/train_metrics.jsonl``). :func:`check_claims` recomputes every claim (and the observed
limits: regressed and weak classes/fields, typical failures, broken examples) with the same
code that made it (:func:`tuneproof.evaluation.metrics.score`,
:func:`tuneproof.evaluation.compare.paired_compare`, same bootstrap seed and iterations) and names
each field whose claim does not match. The success verdict is judged above the noise floors the comparison
recorded (``scoring.comparison.noise``, ``eval.repeat``; None: not measured, min_gain alone).

Tolerance: recomputed floats must equal the claims within a relative 1e-9 (the same code on another
machine may differ in the last bits of a sum); the final loss is checked against the per-step log,
which rounds to 6 decimals (so within 1e-6). Nothing here imports torch.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from tuneproof import hypothesis as hyp
from tuneproof.deliver.limits import observed_limits
from tuneproof.evaluation.compare import judge, overall_verdict, paired_compare
from tuneproof.evaluation.controls import judge_against_control
from tuneproof.evaluation.eval_sets import compare_set
from tuneproof.evaluation.metrics import score
from tuneproof.io import read_json, read_jsonl
from tuneproof.study import Eval

OUTPUTS = "results/outputs.jsonl"
BASELINE_OUTPUTS = "results/baseline_outputs.jsonl"
#: the outputs of the control the success criterion was judged against (hypothesis.success.against: strongest)
CONTROL_OUTPUTS = "results/control_outputs.jsonl"
TRAIN_METRICS = "results/train_metrics.jsonl"
#: the outputs on ``eval.sets`` the comparison judged its set guards on: ``results/sets/<name>/{SET_OUTPUTS,
#: BASELINE_SET_OUTPUTS}`` (the candidate's and the baseline's rows, docs/eval-sets.md)
SETS_DIR = "sets"
SET_OUTPUTS = "outputs.jsonl"
BASELINE_SET_OUTPUTS = "baseline_outputs.jsonl"
REL_TOL = 1e-9
LOG_TOL = 1e-6  # metrics.jsonl stores losses rounded to 6 decimals


def _plain(obj: Any) -> Any:
    """The JSON form of ``obj`` (tuples to lists, NaN kept), as the manifest stores it."""
    return json.loads(json.dumps(obj, default=str))


def differences(claimed: Any, recomputed: Any, path: str, *, rel: float = REL_TOL, limit: int = 8) -> list[str]:
    """``"<field path>: manifest claims X, recomputed Y"`` for each leaf that differs (at most ``limit``)."""
    out: list[str] = []

    def walk(a: Any, b: Any, p: str) -> None:
        if len(out) >= limit:
            return
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b), key=str):
                if k not in b:
                    out.append(f"{p}.{k}: manifest claims {a[k]!r}, the recomputation has no such field")
                elif k not in a:
                    out.append(f"{p}.{k}: missing from the manifest (recomputed {b[k]!r})")
                else:
                    walk(a[k], b[k], f"{p}.{k}")
            return
        if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            for i, (x, y) in enumerate(zip(a, b)):
                walk(x, y, f"{p}[{i}]")
            return
        if (
            isinstance(a, (int, float))
            and isinstance(b, (int, float))
            and not isinstance(a, bool)
            and not isinstance(b, bool)
        ):
            if (
                a == b
                or (math.isnan(float(a)) and math.isnan(float(b)))
                or math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)
            ):
                return
        elif a == b:
            return
        out.append(f"{p}: manifest claims {a!r}, recomputed {b!r}")

    walk(_plain(claimed), _plain(recomputed), path)
    return out


def _eval(section: dict[str, Any], fmt: dict[str, Any] | None = None):
    return Eval.model_validate({**(section or {}), **(fmt or {})})


def _recompare(
    base_rows: list, cand: list, task: Any, required_fields: Any, ev: Eval, view: dict | None, labels: Any, **extra
) -> dict:
    """:func:`paired_compare` of ``base_rows`` and ``cand`` as ``compare`` made it: ``ev``'s bootstrap, judged under
    ``view`` (None: not judged); ``extra``: ``noise`` and ``sets`` as recorded."""
    return paired_compare(
        base_rows,
        cand,
        task,
        required_fields=required_fields,
        eval_cfg=ev,
        hypothesis=hyp.as_hypothesis(view) if view is not None else None,
        iterations=ev.bootstrap_iterations,
        seed=ev.seed,
        labels=labels,
        **extra,
    )


def _against_control(
    bundle: Path, control: dict, cand: list, task: Any, view: dict, ev: Eval, labels: Any, verdicts, overall, base_id
) -> tuple[list, dict]:
    """The verdicts with the success criterion judged again against the control the comparison named
    (``results/control_outputs.jsonl``, :func:`tuneproof.evaluation.controls.judge_against_control`); a bundle
    without that file keeps the baseline's verdicts, so the recomputed verdict differs from the claimed one."""
    path = bundle / CONTROL_OUTPUTS
    if not path.is_file():
        return verdicts, overall
    r_c = _recompare(
        read_jsonl(path), cand, task, view.get("required_fields"), ev, view, labels, noise=control.get("noise")
    )
    success = next((v for v in r_c.get("verdicts") or [] if v.get("kind") == "success"), None)
    result = judge_against_control(
        {"verdicts": verdicts, "overall": overall}, {"success": success}, control["label"], control["run"], base_id
    )
    return _plain(result["verdicts"]), _plain(result["overall"])


def _bundle_sets(bundle: Path, task: Any, required_fields: Any, ev: Eval, labels: Any) -> dict[str, dict] | None:
    """The comparison on each ``eval.sets`` entry the bundle ships outputs of (``results/sets/<name>/``), by the
    code compare used (:func:`tuneproof.evaluation.eval_sets.compare_set`); None when it ships none."""
    root = Path(bundle) / "results" / SETS_DIR
    names = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    if not names:
        return None
    return {
        name: compare_set(
            name,
            read_jsonl(root / name / BASELINE_SET_OUTPUTS),
            read_jsonl(root / name / SET_OUTPUTS),
            task,
            required_fields=required_fields,
            eval_cfg=ev,
            iterations=ev.bootstrap_iterations,
            seed=ev.seed,
            labels=labels,
        )
        for name in names
    }


def check_claims(bundle: Path, man: dict[str, Any]) -> list[str]:
    """Every claim of ``man`` (the bundle's manifest) that the shipped evidence does not support.

    Uses ``man["scoring"]`` (written by ``export``): the task, the label set, the eval run's
    scoring (required fields, ``eval`` section), the comparison's scoring and the hypothesis views
    its verdicts follow (:mod:`tuneproof.hypothesis`).

    Returns problems, each naming the manifest field (``metrics.accuracy``,
    ``comparison.verdict``, ``train.final_loss``...) with the claimed and the recomputed value;
    empty when every claim holds.
    """
    bundle = Path(bundle)
    problems: list[str] = []
    scoring = man.get("scoring")
    if not isinstance(scoring, dict) and (man.get("metrics") is not None or man.get("comparison")):
        return ["scoring: missing from the manifest, so its claims cannot be recomputed (export the run again)"]
    scoring = scoring or {}
    task, labels = scoring.get("task"), scoring.get("labels")
    outputs = bundle / OUTPUTS
    cand = read_jsonl(outputs) if outputs.is_file() else None
    m: dict[str, Any] | None = None  # the eval metrics, recomputed
    r: dict[str, Any] | None = None  # the paired comparison, recomputed

    if man.get("metrics") is not None:
        if cand is None:
            problems.append(f"metrics: claimed, but the bundle ships no {OUTPUTS} to recompute them from")
        else:
            er = scoring.get("eval_run") or {}
            _, m = score(
                task, cand, required_fields=er.get("required_fields"), eval_cfg=_eval(er.get("eval")), labels=labels
            )
            problems += differences(man["metrics"], {k: m.get(k) for k in man["metrics"]}, "metrics")
            ej = bundle / "results" / "eval.json"
            if ej.is_file():
                problems += differences((read_json(ej) or {}).get("metrics"), m, "results/eval.json metrics")

    comp = man.get("comparison")
    if comp:
        base_path = bundle / BASELINE_OUTPUTS
        if cand is None or not base_path.is_file():
            problems.append(
                f"comparison: claimed, but the bundle ships no {OUTPUTS} and {BASELINE_OUTPUTS} to recompute it from"
            )
        else:
            sc = scoring.get("comparison") or {}
            sw = sc.get("scored_with") or {}
            ev = _eval(sc.get("eval"), sw.get("format"))
            # the paired counts follow the judged hypothesis's success metric (its per-example rule), as compare counted
            # them
            view0 = sc.get("view")
            r = _plain(
                _recompare(
                    read_jsonl(base_path),
                    cand,
                    task,
                    sw.get("required_fields"),
                    ev,
                    view0,
                    labels,
                    noise=sc.get("noise"),  # the noise floors the verdict was judged above (None: not measured)
                    sets=_bundle_sets(bundle, task, sw.get("required_fields"), ev, labels),  # set guards judged on
                )
            )
            problems += differences(
                {k: comp.get(k) for k in ("counts", "mcnemar", "metrics")},
                {k: r.get(k) for k in ("counts", "mcnemar", "metrics")},
                "comparison",
            )
            views = [("", sc.get("view"))]
            if sc.get("other_view") is not None:
                views.append((f"_{sc.get('other_name')}", sc["other_view"]))
            for suffix, view in views:
                if view is None or comp.get(f"verdict{suffix}") is None:  # not judged (recorded as stale)
                    continue
                ev2 = ev
                if hyp.scoring(view) != sw:  # judged under another scoring: score again for it
                    ev2 = _eval(sc.get("eval"), view.get("format"))
                    r2 = _plain(
                        _recompare(
                            read_jsonl(base_path),
                            cand,
                            task,
                            view.get("required_fields"),
                            ev2,
                            view,
                            labels,
                            noise=sc.get("noise"),
                            sets=_bundle_sets(bundle, task, view.get("required_fields"), ev2, labels),
                        )
                    )
                else:
                    r2 = r
                verdicts = _plain(judge(hyp.as_hypothesis(view), r2))
                overall = overall_verdict(verdicts)
                control = sc.get("judged_control")
                if control is not None and not suffix:  # success.against: strongest named a control (the primary view)
                    verdicts, overall = _against_control(
                        bundle,
                        control,
                        cand,
                        task,
                        view,
                        ev2,
                        labels,
                        verdicts,
                        overall,
                        comp.get("baseline_run"),
                    )
                problems += differences(comp.get(f"verdict{suffix}"), overall["verdict"], f"comparison.verdict{suffix}")
                problems += differences(comp.get(f"detail{suffix}"), overall["detail"], f"comparison.detail{suffix}")
                if not suffix:
                    problems += differences(comp.get("verdicts"), verdicts, "comparison.verdicts")
    if man.get("limits") is not None and (m is not None or not man.get("metrics")) and (r is not None or not comp):
        cmp_json = (
            read_json(bundle / "results" / "compare.json") if (bundle / "results" / "compare.json").is_file() else {}
        )
        recorded = ((cmp_json or {}).get("candidates") or {}).get(man.get("eval_run")) or {}
        again = observed_limits(
            task,
            eval_metrics=m,
            outputs=cand or [],
            comparison={**r, "notes": recorded.get("notes") or []} if r else None,
            test_accesses=man.get("test_accesses") or [],
            forced=man.get("forced"),
        )
        problems += differences(man["limits"], again, "limits")
        if r is not None and recorded:
            problems += differences(
                {k: recorded.get(k) for k in ("counts", "mcnemar", "metrics")},
                {k: r.get(k) for k in ("counts", "mcnemar", "metrics")},
                "results/compare.json",
            )

    train = man.get("train") or {}
    if train.get("steps") is not None or train.get("final_loss") is not None:
        log = bundle / TRAIN_METRICS
        if not log.is_file():
            problems.append(f"train: claimed, but the bundle ships no {TRAIN_METRICS} to check it against")
        else:
            by_step: dict[int, float] = {}
            for row in read_jsonl(log):
                if "loss" in row and "step" in row:
                    by_step[int(row["step"])] = row["loss"]  # the last row of a step wins (a resume logs it again)
            if by_step:
                last = max(by_step)
                problems += differences(train.get("steps"), last, "train.steps")
                if train.get("final_loss") is not None:
                    problems += (
                        differences(train["final_loss"], by_step[last], "train.final_loss", rel=0)
                        if not math.isclose(train["final_loss"], by_step[last], abs_tol=LOG_TOL)
                        else []
                    )
                if (
                    train.get("first_loss") is not None
                    and 1 in by_step
                    and not math.isclose(train["first_loss"], by_step[1], abs_tol=LOG_TOL)
                ):
                    problems.append(
                        f"train.first_loss: manifest claims {train['first_loss']!r}, "
                        f"{TRAIN_METRICS} step 1 has {by_step[1]!r}"
                    )
            ts = bundle / "results" / "train_summary.json"
            if ts.is_file():
                summary = read_json(ts) or {}
                for key in ("steps", "final_loss", "first_loss"):
                    if key in summary and train.get(key) is not None:
                        problems += differences(train[key], summary[key], f"train.{key}")
    return problems
