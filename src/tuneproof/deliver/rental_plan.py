"""The rental plan (docs/PROTOCOL.md step 7: a 3, 7 or 30 day rental planned in phases, initial
checks, experiments, evaluation, a margin to resume, export, with time to reload a checkpoint in a
fresh process).

Every duration comes from this study's measurements, in this order of preference:

- seconds per optimizer step: the median of completed train runs' ``train_seconds / steps`` (the
  training as it ran; a resumed run counts the steps of its last process), else the latest completed
  ``preflight`` run (``s_per_step`` or an alias, anywhere in its summary: a few timed steps, which
  may differ from a whole run several-fold); when both exist the plan says the preflight's rate too;
- evaluation seconds per example, the task kind's own measured rate (a classifier's batched
  forward pass is 10-30 times faster per example than generation): the median of completed
  baseline/eval runs' ``eval_seconds / n_eval`` (the full evaluation as it ran, at
  ``eval.batch_size``), else the preflight's one evaluation batch at ``eval.batch_size``
  (``eval_batch_s_per_example``, timed by its ``eval memory`` check), else the preflight's smoke
  evaluation (``eval_s_per_example``, or ``eval_seconds`` / ``n_eval``: a few examples, an upper bound);
- checkpoint reload in a fresh process: the preflight's ``reload_seconds`` when present, else the
  model loading measured in eval runs (duration minus evaluation) + :data:`PROCESS_START_S`, else
  :data:`DEFAULT_RELOAD_S` (each stated as the source);
- durations of the data check, preflight, baseline and export: their latest completed runs
  (``ended - created``), else an estimate from the two rates above.

Phases (hours): initial check (machine setup :data:`SETUP_H` + data check + preflight +
baseline), experiment (variants x steps x s/step), evaluation (variants x eval + one final test
evaluation), resume margin (the margin rule: one interruption per variant, each costing a
fresh-process reload + the steps since the last checkpoint, at most ``training.checkpoint_every``
and at most the variant's steps; it exceeds the experiment when the reload takes longer than the
training, and the plan then says so), export (export + its verification). The number of
variants that fit is the largest N with all phases within ``days x 24`` hours. The plan is in
hours; with an hourly rate it also gives the cost (rental, planned hours, one variant) as money.
The plan is saved as :data:`PLAN_FILE` in the study folder (:func:`load_plan` reads it back).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from tuneproof.errors import TuneproofError
from tuneproof.io import read_json
from tuneproof.storage import measured_upload

PLAN_FILE = "plan.json"  # in the study folder
SETUP_H = 1.0  # provisioning, environment install, copying data and weights (assumed, not measured)
DEFAULT_RELOAD_S = 300.0  # fresh-process start + model load + checkpoint load, when nothing is measured
PROCESS_START_S = 30.0  # interpreter start and imports of a fresh process (assumed)
STEP_KEYS = ("s_per_step", "seconds_per_step", "step_seconds", "step_s", "sec_per_step")
TOKENS_KEYS = ("tokens_per_s", "tokens_per_second", "throughput_tokens_per_s")
EVAL_PER_EX_KEYS = ("eval_s_per_example", "eval_seconds_per_example", "s_per_eval_example")
EVAL_KEYS = ("eval_seconds", "eval_s", "eval_time_s")
EVAL_N_KEYS = ("n_eval", "eval_examples", "eval_n")
RELOAD_KEYS = ("reload_seconds", "reload_s", "fresh_process_reload_s", "resume_seconds")


def find_number(obj: Any, keys: tuple[str, ...]) -> float | None:
    """The first positive number stored under one of ``keys`` in a nested dict/list (depth first,
    keys tried in order at each level). Tolerant of whatever layout a summary uses."""
    if isinstance(obj, dict):
        for k in keys:
            v = obj.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 and math.isfinite(v):
                return float(v)
        for v in obj.values():
            found = find_number(v, keys)
            if found is not None:
                return found
    elif isinstance(obj, list):
        for v in obj:
            found = find_number(v, keys)
            if found is not None:
                return found
    return None


def _duration(rec) -> float | None:
    """Seconds from a run's start to its end as read; None when unknown or negative (the clock went back
    while it ran: no duration is measured from it)."""
    if rec is None or not rec.ended or not rec.created or rec.ended < rec.created:
        return None
    return rec.ended - rec.created


def measure(registry) -> dict[str, Any]:
    """Collect the measured rates and durations from the registry (see the module docstring).

    Returns ``{"s_per_step", "step_source", "eval_s_per_example", "eval_source", "tokens_per_s",
    "reload_s", "reload_source", "durations": {kind: seconds}}`` (values None when unmeasured).
    """
    pre = registry.latest("preflight")
    pre_sum = pre.summary if pre else {}
    out: dict[str, Any] = {
        "s_per_step": None,
        "step_source": None,
        "eval_s_per_example": None,
        "eval_source": None,
        "tokens_per_s": None,
        "reload_s": None,
        "reload_source": None,
        "durations": {},
    }
    pre_sps = find_number(pre_sum, STEP_KEYS)
    if pre_sps is None and pre_sum:
        tps, tok_step = find_number(pre_sum, TOKENS_KEYS), find_number(pre_sum, ("tokens_per_step",))
        if tps and tok_step:
            pre_sps = tok_step / tps
    rates = train_rates(registry)
    if rates:  # the training as it ran beats the preflight's few timed steps (warm-up, other load)
        out.update(
            s_per_step=statistics.median(rates),
            step_source=f"median of {len(rates)} completed train run(s) (the training as it ran)",
        )
        if pre_sps is not None:
            out.update(preflight_s_per_step=pre_sps, preflight_step_source=f"preflight {pre.id}")
    elif pre_sps is not None:
        out.update(s_per_step=pre_sps, step_source=f"preflight {pre.id}")
    out["tokens_per_s"] = find_number(pre_sum, TOKENS_KEYS) or _median(
        [r.summary.get("tokens_per_s") for r in registry.list(kind="train", status="completed")]
    )

    rates = [
        r.summary["eval_seconds"] / (r.summary["n_eval"] * (r.summary.get("eval_repeats") or 1))  # per prediction
        for k in ("baseline", "eval")
        for r in registry.list(kind=k, status="completed")
        if isinstance(r.summary.get("eval_seconds"), (int, float))
        and r.summary["eval_seconds"] > 0
        and r.summary.get("n_eval")
    ]
    batch = find_number(pre_sum, ("eval_batch_s_per_example",))
    if rates:
        out.update(
            eval_s_per_example=statistics.median(rates),
            eval_source=f"median of {len(rates)} completed baseline/eval run(s) (the full evaluation as it ran)",
        )
    elif batch is not None:
        what = pre_sum.get("eval_batch_procedure") or "the study's evaluation procedure"
        out.update(
            eval_s_per_example=batch,
            eval_source=f"one evaluation batch of {pre_sum.get('eval_batch_size')} ({what}) in preflight {pre.id}",
        )
    else:
        per_ex = find_number(pre_sum, EVAL_PER_EX_KEYS)
        if per_ex is None:
            es, en = find_number(pre_sum, EVAL_KEYS), find_number(pre_sum, EVAL_N_KEYS)
            per_ex = es / en if es and en else None
        if per_ex is not None:
            out.update(
                eval_s_per_example=per_ex,
                eval_source=f"smoke evaluation of a few examples in preflight {pre.id} (an upper bound)",
            )
    reload_s = find_number(pre_sum, RELOAD_KEYS)
    if reload_s:
        out.update(reload_s=reload_s, reload_source=f"preflight {pre.id}")
    else:
        # an eval run loads base + adapter in its process: its duration minus the evaluation itself
        loads = [
            _duration(r) - r.summary["eval_seconds"]
            for r in registry.list(kind="eval", status="completed")
            if _duration(r) and isinstance(r.summary.get("eval_seconds"), (int, float))
        ]
        if loads:
            out.update(
                reload_s=PROCESS_START_S + statistics.median(loads),
                reload_source=f"model load measured in {len(loads)} eval run(s) + "
                f"{PROCESS_START_S:.0f} s process start (assumed)",
            )
        else:
            out.update(reload_s=DEFAULT_RELOAD_S, reload_source=f"assumed {DEFAULT_RELOAD_S:.0f} s (not measured)")
    for kind in ("data-check", "preflight", "baseline", "export"):
        d = _duration(registry.latest(kind))
        if d is not None:
            out["durations"][kind] = d
    up = measured_upload(registry.study_dir)  # export/deliver --to: the bundle sent and read back
    out["upload_s"] = up["seconds"] if up else None
    out["upload_source"] = f"the last delivery to {up['uri']} ({up['what']}, {up['bytes']} bytes)" if up else None
    return out


def train_rates(registry) -> list[float]:
    """Seconds per optimizer step of each completed train run, as it ran: ``train_seconds`` over the
    steps that process made (a resumed run's last segment: its steps since the checkpoint it resumed)."""
    rates = []
    for r in registry.list(kind="train", status="completed"):
        secs, steps = r.summary.get("train_seconds"), r.summary.get("steps")
        if not (isinstance(secs, (int, float)) and secs > 0 and isinstance(steps, int) and steps > 0):
            continue
        resumes = r.summary.get("resumes") or []
        if resumes and isinstance(resumes[-1], dict):
            steps -= int(resumes[-1].get("from_step") or 0)
        if steps > 0:
            rates.append(secs / steps)
    return rates


def _median(values) -> float | None:
    v = [x for x in values if isinstance(x, (int, float)) and x > 0]
    return statistics.median(v) if v else None


def require_measured(measured: dict[str, Any]) -> None:
    """Raise unless a step time and an evaluation time were measured.

    Raises:
        TuneproofError: naming what is missing and the command that measures it (exit 2).
    """
    missing = []
    if not measured.get("s_per_step"):
        missing.append("the time of a training step (run `tuneproof preflight`, or one `tuneproof train`)")
    if not measured.get("eval_s_per_example"):
        missing.append("the evaluation time (run `tuneproof preflight`, or `tuneproof baseline`)")
    if missing:
        raise TuneproofError(
            "nothing measured to plan from: no " + " and no ".join(missing),
            hint="the plan uses this study's measured throughput only, never a guess",
        )


def check_plan_args(days: float, hourly_rate: float | None = None, variants: int | None = None) -> None:
    """Refuse impossible plan options, naming each one.

    Raises:
        TuneproofError: ``--days`` not a finite number > 0, ``--hourly-rate`` not a finite number
            >= 0 (None: no rate given, hours only), or ``--variants`` below 1 (all faults in one message, exit 2).
    """
    bad = []
    if not (math.isfinite(days) and days > 0):
        bad.append(f"--days {days:g}: the rental length must be a number of days > 0")
    if hourly_rate is not None and not (math.isfinite(hourly_rate) and hourly_rate >= 0):
        bad.append(f"--hourly-rate {hourly_rate:g}: the price of one hour must be >= 0")
    if variants is not None and variants < 1:
        bad.append(f"--variants {variants}: plan for at least 1 variant (or leave it out: as many as fit)")
    if bad:
        raise TuneproofError("; ".join(bad), hint="e.g. tuneproof plan --days 7 --hourly-rate 2.5")


def make_plan(
    measured: dict[str, Any],
    *,
    days: float,
    hourly_rate: float | None = None,
    steps: int,
    checkpoint_every: int,
    n_eval: int,
    n_test: int,
    k_verify: int = 8,
    variants: int | None = None,
) -> dict[str, Any]:
    """The plan for a rental of ``days`` days (at ``hourly_rate`` per hour: None plans hours only).

    Args:
        measured: :func:`measure`'s result.
        steps: optimizer steps of one variant (the configured training budget).
        checkpoint_every: steps between checkpoints (the work lost by an interruption, at most).
        n_eval / n_test: examples of the evaluation split (as evaluated) and of the test split.
        variants: variants to plan for (default: as many as fit, at least 1).

    Returns ``{"days", "hourly_rate", "available_h", "per_variant_h", "variants_fit", "variants",
    "phases": [{"phase", "hours", "basis"}], "total_h", "spare_h", "fits", "cost", "warnings",
    "measured", "assumptions"}``; ``cost`` (money: ``rental``, ``planned_hours``, ``per_variant``) is
    None without an hourly rate.

    Raises:
        TuneproofError: nothing measured (no step time or no evaluation time), or bad arguments.
    """
    check_plan_args(days, hourly_rate, variants)
    require_measured(measured)
    sps, epx, reload_s = measured["s_per_step"], measured["eval_s_per_example"], measured["reload_s"]
    dur = measured.get("durations", {})
    h = 1 / 3600
    train_h = steps * sps * h
    eval_h = n_eval * epx * h
    resume_h = (reload_s + min(checkpoint_every, steps) * sps) * h
    per_variant = train_h + eval_h + resume_h

    def est(kind: str, default_s: float) -> tuple[float, str]:
        return (dur[kind] * h, "measured") if kind in dur else (default_s * h, "estimated")

    dc_h, dc_b = est("data-check", 60.0)
    pf_h, pf_b = est("preflight", 20 * sps + 2 * k_verify * epx + reload_s)
    bl_h, bl_b = est("baseline", n_eval * epx + reload_s)
    ex_h, ex_b = est("export", 2 * (k_verify * epx + reload_s))
    if measured.get("upload_s"):  # the deliverable sent off the box and read back (measured)
        ex_h += measured["upload_s"] * h
        ex_b += f"; upload {measured['upload_s']:.0f} s measured, {measured.get('upload_source')}"
    initial_h = SETUP_H + dc_h + pf_h + bl_h
    test_h = n_test * epx * h
    available = days * 24.0
    fixed = initial_h + test_h + ex_h
    fit = max(0, math.floor((available - fixed) / per_variant)) if per_variant > 0 else 0
    n = variants if variants is not None else max(1, fit)
    if n < 1:
        raise TuneproofError(f"--variants must be at least 1 (got {n})")
    phases = [
        {
            "phase": "initial check",
            "hours": initial_h,
            "basis": f"setup {SETUP_H:.1f} h (assumed) + data check {dc_h:.2f} h ({dc_b}) + "
            f"preflight {pf_h:.2f} h ({pf_b}) + baseline {bl_h:.2f} h ({bl_b})",
        },
        {"phase": "experiment", "hours": n * train_h, "basis": f"{n} variant(s) x {steps} steps x {sps:.3g} s/step"},
        {
            "phase": "evaluation",
            "hours": n * eval_h + test_h,
            "basis": f"{n} x {n_eval} examples + final test {n_test} examples, x {epx:.3g} s/example",
        },
        {
            "phase": "resume margin",
            "hours": n * resume_h,
            "basis": f"one interruption per variant: {n} x (reload in a fresh process {reload_s:.0f} s + up to "
            f"{min(checkpoint_every, steps)} steps since the last checkpoint, training.checkpoint_every "
            f"{checkpoint_every})",
        },
        {"phase": "export", "hours": ex_h, "basis": f"export + verification in a fresh process ({ex_b})"},
    ]
    total = sum(p["hours"] for p in phases)
    warnings = []
    if fit < 1:
        warnings.append(
            f"does not fit: one variant needs {per_variant:.1f} h on top of {fixed:.1f} h of fixed phases, "
            f"the rental has {available:.0f} h; shorten training.max_steps, evaluate fewer examples, or rent longer"
        )
    elif total > available:
        warnings.append(f"{n} variants do not fit: {total:.1f} h planned, {available:.0f} h rented; at most {fit} fit")
    notes = [f"step time used: {sps:.3g} s/step from {measured.get('step_source')}"]
    pre_sps = measured.get("preflight_s_per_step")
    if pre_sps:
        notes.append(
            f"{measured.get('preflight_step_source')} timed {pre_sps:.3g} s/step over a few steps; "
            f"the completed runs' rate is used ({pre_sps / sps:.2g}x the preflight's)"
        )
    if resume_h > train_h:
        notes.append(
            f"the resume margin ({n * resume_h:.2f} h) is larger than the experiment ({n * train_h:.2f} h): "
            f"one interruption per variant costs a reload of {reload_s:.0f} s ({measured.get('reload_source')}) "
            f"+ up to {min(checkpoint_every, steps)} steps, and a variant trains {steps * sps:.0f} s; "
            "a measured reload (preflight) or a smaller training.checkpoint_every lowers it"
        )
    return {
        "days": days,
        "hourly_rate": hourly_rate,
        "available_h": available,
        "steps_per_variant": steps,
        "per_variant_h": per_variant,
        "variants_fit": fit,
        "variants": n,
        "phases": phases,
        "total_h": total,
        "spare_h": available - total,
        "fits": total <= available and fit >= 1,
        "cost": (
            None
            if hourly_rate is None
            else {
                "rental": available * hourly_rate,
                "planned_hours": total * hourly_rate,
                "per_variant": per_variant * hourly_rate,
            }
        ),
        "warnings": warnings,
        "notes": notes,
        "measured": measured,
        "assumptions": [
            f"machine setup {SETUP_H:.1f} h",
            f"checkpoint reload: {measured['reload_source']}",
            "one interruption per variant",
            "the rented machine runs at the measured throughput",
        ],
    }


def cost_lines(plan: dict[str, Any]) -> list[str]:
    """The cost, labelled as money (or that none was computed without ``--hourly-rate``)."""
    c = plan.get("cost")
    if not c:
        return [
            f"planned {plan['total_h']:.2f} hours of the {plan['available_h']:.0f} "
            "rented; no cost computed (pass --hourly-rate RATE)"
        ]
    return [
        f"cost at {plan['hourly_rate']:g} per hour: rental of {plan['available_h']:.0f} h {c['rental']:.2f}; "
        f"cost of the {plan['total_h']:.2f} planned hours "
        f"{c['planned_hours']:.2f}; cost of one variant {c['per_variant']:.2f}"
    ]


def days_text(days: float) -> str:
    """``1 day``, ``7 days``, ``0.5 days``."""
    return f"{days:g} day" + ("" if days == 1 else "s")


def load_plan(study_dir: Path) -> dict[str, Any] | None:
    """The saved plan (``<study_dir>/plan.json``), or None when none was made."""
    path = Path(study_dir) / PLAN_FILE
    return read_json(path) if path.exists() else None
