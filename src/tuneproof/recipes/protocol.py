"""Protocol order, enforced (docs/PROTOCOL.md steps 2 and 3): ``baseline`` and ``train`` need a passed
data check for the current data fingerprint, and ``train`` needs a completed baseline for the
current evaluation fingerprint.

Rules:

- the data check that counts is the latest ``data-check`` run with the current data fingerprint
  that reached a verdict (its summary holds ``passed``; a check that crashed or was interrupted
  reached none, an invalidated one is ignored). Passed: go on. Failed: refuse, naming the run and
  its first hard fault. None: run it now, inline (a run of its own), and refuse if it fails;
- the baseline that counts is a completed ``baseline`` run with the current evaluation
  fingerprint (:func:`tuneproof.evaluation.fingerprint.eval_fingerprint`) on the same base model
  revision. None: refuse, naming what differs from the latest baseline (the parts of the
  fingerprint, or the base revision) and the command to run;
- a hypothesis frozen and sealed by an earlier train run (whatever that run's status now) must still be the
  file it sealed: a deleted or edited ``hypothesis.frozen.json`` refuses ``train`` rather than freezing a new
  one (:func:`tuneproof.hypothesis.require_sealed`);
- a refusal is a :class:`~tuneproof.errors.CheckFailed` (exit 3, a protocol check failed, like a
  missing preflight) and starts no run of the refused kind;
- an override takes a reason (``--skip-data-check REASON``, ``--skip-baseline REASON``); the run
  records it in its summary (``data_check_override``, ``baseline_override``) and ``runs``,
  ``runs --tree`` and the dossier show it (:func:`tuneproof.registry.override_flags`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tuneproof import hypothesis as hyp
from tuneproof.errors import CheckFailed, TuneproofError
from tuneproof.evaluation.controls import plain_baselines
from tuneproof.evaluation.fingerprint import diff_fingerprints, study_eval_fingerprint
from tuneproof.io import read_json
from tuneproof.recipes.data_check import run_data_check
from tuneproof.ui import console, user_text


def _study_opt(ctx) -> str:
    return f" --study {ctx.study_dir}" if Path.cwd().resolve() != Path(ctx.study_dir).resolve() else ""


def check_reason(flag: str, reason: str | None) -> str | None:
    """``None`` (no override) or the stripped reason.

    Raises:
        TuneproofError: an empty reason (exit 2).
    """
    if reason is None:
        return None
    if not reason.strip():
        raise TuneproofError(
            f'{flag} needs a reason, e.g. {flag} "the data check r0003 was run on a copy of this data"'
        )
    return reason.strip()


def latest_data_check(ctx, fingerprint: str):
    """The latest data-check run of ``fingerprint`` that reached a verdict, or None."""
    done = [
        r
        for r in ctx.registry.list(kind="data-check")
        if r.data_fingerprint == fingerprint and r.status in ("completed", "failed") and "passed" in r.summary
    ]
    return done[-1] if done else None


def require_data_check(ctx, command: str, override: str | None = None) -> str | None:
    """Refuse ``command`` unless the data check of the current data fingerprint passed; runs it
    inline when there is none. Returns the passed data-check run id, or None under ``override``.

    Raises:
        CheckFailed: the data check failed (now or before) - names the run, its first hard fault
            and the commands to run (exit 3).
        TuneproofError: an empty override reason (exit 2).
    """
    override = check_reason("--skip-data-check", override)
    if override is not None:
        console.print(
            f"[yellow]warning[/]: {command} without a passed data check; recorded override: {user_text(override)}",
            soft_wrap=True,
        )
        return None
    fp = ctx.data_fingerprint()["hash"]
    rec = latest_data_check(ctx, fp)
    opt = _study_opt(ctx)
    skip = f'`tuneproof {command}{opt} --skip-data-check "REASON"` (the override is recorded in the run)'
    if rec is None:
        console.print(f"[yellow]no data check for data fingerprint {fp[:12]}[/]: running `tuneproof data check` first")
        try:
            return run_data_check(ctx)
        except CheckFailed as err:
            raise CheckFailed(
                f"{command} refused: {err.message}",
                hint=f"fix the data or the study file and run `tuneproof data check{opt}`, or {skip}",
            ) from None
    if rec.summary.get("passed"):
        console.print(f"[dim]data check {rec.id} passed for this data ({fp[:12]})[/]")
        return rec.id
    first = ""
    rep_path = ctx.registry.runs_dir / rec.id / "data_check.json"
    if rep_path.exists():
        faults = (read_json(rep_path) or {}).get("hard_faults") or []
        first = f", first: {faults[0]}" if faults else ""
    n = rec.summary.get("hard_faults", "?")
    raise CheckFailed(
        f"{command} refused: the data check {rec.id} of this data ({fp[:12]}) "
        f"failed with {n} hard fault{'' if n == 1 else 's'}{first}",
        hint=f"fix the data or the study file and run `tuneproof data check{opt}`, or {skip}",
    )


def require_baseline(ctx, override: str | None = None) -> str | None:
    """Refuse ``train`` unless a completed baseline has the current evaluation fingerprint and base
    revision (docs/PROTOCOL.md step 2). Returns its run id, or None under ``override``.

    Raises:
        CheckFailed: no such baseline - names what differs from the latest one and the command (exit 3).
        TuneproofError: an empty override reason (exit 2).
    """
    override = check_reason("--skip-baseline", override)
    if override is not None:
        console.print(
            "[yellow]warning[/]: training without a baseline for this "
            f"evaluation procedure; recorded override: {user_text(override)}",
            soft_wrap=True,
        )
        return None
    efp = study_eval_fingerprint(ctx)
    revision = ctx.base.revision
    done = plain_baselines(ctx.registry)  # a few-shot control (baseline --few-shot K) never gates train
    for rec in reversed(done):
        if (
            rec.eval_fingerprint == efp["hash"]
            and (rec.summary.get("base") or {}).get("revision", revision) == revision
        ):
            console.print(f"[dim]baseline {rec.id} matches this evaluation procedure ({efp['hash'][:12]})[/]")
            return rec.id
    opt = _study_opt(ctx)
    if not done:
        why = "no completed baseline in this study"
    else:
        last = done[-1]
        diffs = []
        last_rev = (last.summary.get("base") or {}).get("revision")
        if last_rev and last_rev != revision:
            diffs.append(f"the base revision ({last_rev[:19]} -> {revision[:19]})")
        if last.eval_fingerprint != efp["hash"]:
            path = ctx.registry.runs_dir / last.id / "eval.json"
            recorded = (read_json(path) or {}).get("fingerprint", {}) if path.exists() else {}
            parts = diff_fingerprints(recorded, efp) if recorded.get("parts") else []
            diffs.append("the evaluation fingerprint" + (f" ({', '.join(parts)} differ)" if parts else ""))
            held = last.summary.get("base_weights", "fp32")
            if held != ctx.base_weights:  # a bf16-base candidate is never judged against an fp32-base baseline unsaid
                diffs.append(f"the base weights dtype ({held} -> {ctx.base_weights}, training.bf16_base_weights)")
        why = f"the latest baseline {last.id} does not match: {', '.join(diffs)}"
    raise CheckFailed(
        f"train refused: {why}",
        hint=f"run `tuneproof baseline{opt}` first (protocol step 2), or "
        f'`tuneproof train{opt} --skip-baseline "REASON"` '
        "(the override is recorded in the run)",
    )


def require_order(
    ctx, *, data_check_override: str | None = None, baseline_override: str | None = None
) -> dict[str, Any]:
    """The gates of ``train``: the seal of a frozen hypothesis (a study freezes it once,
    :func:`tuneproof.hypothesis.require_sealed`; no override), the data check, then the baseline. Returns the
    summary fields the train run records: ``data_check_run`` and ``baseline_run`` (run ids or None) and any
    ``*_override`` reason.

    Raises:
        CheckFailed: a gate refused (exit 3; :class:`~tuneproof.hypothesis.SealBroken` for the seal), before any
            run starts.
    """
    hyp.require_sealed(ctx.study_dir, ctx.registry, "train")
    fields: dict[str, Any] = {
        "data_check_run": require_data_check(ctx, "train", data_check_override),
        "baseline_run": require_baseline(ctx, baseline_override),
    }
    if data_check_override:
        fields["data_check_override"] = data_check_override.strip()
    if baseline_override:
        fields["baseline_override"] = baseline_override.strip()
    return fields
