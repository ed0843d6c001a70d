"""Recipe ``rental``: the rental window, held to its plan (docs/PROTOCOL.md step 7). The record and its
rules are :mod:`tuneproof.deliver.rental`.

Features (option that turns each on):
- ``rental start --days N [--ends ISO-TIME]``: the window in the study (``rental.json``), with the
  plan at that moment and the rates it used, each with its source (completed runs, preflight, default);
- ``rental status [--json]``: per phase planned vs used hours and their ratio, hours left, the
  reserve still needed (evaluation, test read, export + verify, a fresh-process re-read), the
  overrides, the stopped runs, the machines, a clock that went back, the next protocol step; once
  the reserve is reached, the best candidate that passed its comparison and the command that
  delivers it; 80 columns;
- :func:`spend`, around every command that spends hours (``data check``, ``baseline``,
  ``preflight``, ``train`` and its variants, ``resume``, ``eval``, ``test``, ``export``): the
  command's estimate from the measured rates; a command whose estimate passes into the reserve of
  the phases after it is refused (exit 3, one line with the numbers) unless ``--use-reserve REASON``
  (recorded in ``rental.json`` and in the run's summary as ``rental_override``, shown like the other
  protocol overrides); a train run (or resume) that reaches the reserve while it runs stops at a
  checkpoint, ``stopped: rental reserve``, resumable; the command's start and end are read from the
  clock once each and kept in the rental's ledger; ``export`` is never refused (the reserve is kept
  for it);
- ``rental deliver [--run RUN] [--html]``: export the best passed candidate (or RUN; a completed
  export of it whose bundle is there is kept), verify the bundle in a fresh process, write the
  dossier, in that order; recorded as the rental's deliverable.
Without ``rental.json`` in the study, :func:`spend` does nothing.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tuneproof import clock, procs, registry
from tuneproof.context import StudyContext, parse_study
from tuneproof.deliver import rental as rent
from tuneproof.deliver.rental_plan import days_text
from tuneproof.errors import CheckFailed, Stopped, TuneproofError
from tuneproof.io import sha256_file
from tuneproof.recipes.export import run_export
from tuneproof.recipes.plan import split_sizes
from tuneproof.recipes.protocol import check_reason
from tuneproof.recipes.report import run_report
from tuneproof.recipes.variants import plan_grid, plan_variant
from tuneproof.recipes.verify import run_verify
from tuneproof.registry import Registry, study_relative
from tuneproof.storage import deliver_to, safety, safety_line
from tuneproof.training.budget import total_steps
from tuneproof.ui import console, err_console, print_json, table, user_text

OVERRIDE_FLAG = "--use-reserve"


def study_work(ctx: StudyContext) -> dict[str, int]:
    """``{"steps", "checkpoint_every", "n_eval", "n_test"}``: the study's training budget and the
    predictions of its evaluation and test splits (as evaluated: examples x ``eval.repeat``), each plus the prompts
    of ``eval.sets`` (generated once by every evaluation after the split)."""
    s = ctx.study
    sizes = split_sizes(ctx)
    n_eval = sizes.get(s.eval.split, 0)
    if s.eval.max_examples:
        n_eval = min(n_eval, s.eval.max_examples)
    repeat = s.eval.repeat  # each repeat predicts every example again (tuneproof.evaluation.noise)
    extra = sum(len(x.examples) for x in ctx.eval_sets) if s.eval.sets else 0  # every evaluation generates them
    return {
        "steps": total_steps(s.training, sizes.get("train", 0)),
        "checkpoint_every": s.training.checkpoint_every,
        "n_eval": n_eval * repeat + extra,
        "n_test": sizes.get(s.data.test_split, 0) * repeat + extra,
    }


def _say(lines: list[str]) -> None:
    for line in lines:
        err_console.print(f"[yellow]rental[/]: {user_text(line)}", soft_wrap=True)


def run_start(ctx: StudyContext, *, days: float, ends: str | None = None) -> dict[str, Any]:
    """Record the window and print it; returns the record.

    Raises:
        TuneproofError: a window is already recorded, bad ``--days`` / ``--ends`` (exit 2).
    """
    end = rent.parse_ends(ends) if ends is not None else None
    now = clock.now()
    rental = rent.start(ctx.study_dir, ctx.registry, days=days, ends=end, now=now, work=study_work(ctx))
    r = rental["rates"]
    console.print(
        f"rental window: {rent.iso_utc(rental['start'])} to {rent.iso_utc(rental['ends'])} "
        f"({days_text(round(rental['days'], 2))}); plan: {rental['plan']['variants_fit']} variant(s) fit",
        soft_wrap=True,
    )
    console.print(
        f"rates: {r['s_per_step']:.3g} s/step ({user_text(r['step_source'])}); "
        f"{r['eval_s_per_example']:.3g} s per evaluated example ({user_text(r['eval_source'])}); "
        f"reload {r['reload_s']:.0f} s ({user_text(r['reload_source'])})",
        soft_wrap=True,
    )
    console.print(f"next: {rent.next_protocol_step(ctx.registry)}; tuneproof rental status shows the clock")
    return rental


def run_status(ctx: StudyContext, *, as_json: bool = False) -> dict[str, Any]:
    """Print where the window stands (or its JSON); returns :func:`tuneproof.deliver.rental.status`.

    Raises:
        TuneproofError: no window recorded (exit 2).
    """
    rental = _require(ctx.study_dir)
    now = clock.now()
    seen = (rental.get("clock") or {}).get("last_seen")
    said = rent.close_orphans(rental, ctx.registry, now) + rent.observe(rental, now, "rental status")
    if said or rental["clock"]["last_seen"] != seen:  # the clock reading is kept: a later one behind it went back
        rent.save(ctx.study_dir, rental)
    st = rent.status(rental, ctx.registry, ctx.study_dir, now, study_work(ctx))
    if ctx.study.storage.remote:  # how much is safe off the box (no network: the last published manifest)
        st["remote"] = safety(ctx.study_dir, ctx.study.storage.remote, ctx.study.storage.exclude)
        st["remote_line"] = safety_line(ctx.study_dir, ctx.study.storage)
    if as_json:
        print_json(st)
        return st
    _say(said)
    print_status(st)
    if st.get("remote_line"):
        console.print(user_text(st["remote_line"]), soft_wrap=True)
    return st


def print_status(st: dict[str, Any]) -> None:
    """The status screen, 80 columns wide: each line of numbers fits, none is wrapped between a
    number and its name (the window's start is in ``rental status --json`` and ``rental start``)."""
    state = "ENDED" if st["ended"] else f"{st['left_h']:.1f} h left"
    console.print(
        f"rental ends {rent.iso_utc(st['ends'])}: {state}; "
        f"reserve needed {st['reserve_h']:.2f} h" + (" (reached)" if st["reserve_reached"] else ""),
        soft_wrap=False,
    )
    rows = [
        [
            p["phase"],
            f"{p['planned_h']:.2f}",
            f"{p['used_h']:.2f}",
            "" if p["ratio"] is None else f"{p['ratio']:.2f}",
        ]
        for p in st["phases"]
    ]
    console.print(table("phases (hours)", ["phase", "planned", "used", "used/planned"], rows))
    console.print("reserve: " + "; ".join(st["reserve_parts"]))
    r = st["rates"]
    console.print(f"step time: {r['s_per_step']:.3g} s ({user_text(r['step_source'])})")
    console.print(f"evaluation: {r['eval_s_per_example']:.3g} s/example ({user_text(r['eval_source'])})")
    for o in st["overrides"]:
        console.print(f"reserve used by {o['command']}: {user_text(o['reason'])}")
    for s in st["stopped"]:
        console.print(f"{s['run']}: {user_text(s['reason'])} ({s['status']}); tuneproof resume {s['run']}")
    for b in st["clock_went_back"]:
        console.print(f"clock went back {(b['from'] - b['to']) / 3600:.2f} h at {user_text(b['where'])}")
    for f in st["flags"]:
        console.print(f"clock: {user_text(f)}", soft_wrap=True)
    if len(st["machines"]) > 1:
        console.print("machines: " + ", ".join(user_text(m["host"]) for m in st["machines"]))
    best = st["best_candidate"]
    if best and (st["reserve_reached"] or st["ended"]):
        console.print(f"best passed candidate: {best['train']} (eval {best['eval']}, compare {best['compare']})")
        console.print("delivers it: " + "; ".join(st["deliver_commands"]) + " (or: tuneproof rental deliver)")
    console.print(f"next: {st['next']}")


def _say_user(line: str) -> None:
    console.print(user_text(line), soft_wrap=True)  # names the store's URI (from the command line)


def _require(study_dir: Path) -> dict[str, Any]:
    rental = rent.load(study_dir)
    if rental is None:
        raise TuneproofError(
            f"{Path(study_dir) / rent.RENTAL_FILE}: no rental window recorded",
            hint="start one: tuneproof rental start --days 7",
        )
    return rental


def _steps_left(reg: Registry, run: str | None) -> int | None:
    if run is None:
        return None
    try:
        rec = reg.get(run)
    except TuneproofError:
        return None
    total = (rec.summary.get("budget") or {}).get("total_steps")
    if not isinstance(total, int):
        return None
    return max(0, total - int(rec.summary.get("last_step") or 0))


@contextlib.contextmanager
def spend(
    study_dir: Path,
    command: str,
    *,
    override: str | None = None,
    ctx: StudyContext | None = None,
    data: Path | None = None,
    run: str | None = None,
    steps: int | None = None,
    variants: int = 1,
    variant: tuple[str, list[str], str | None] | None = None,
) -> Iterator[dict[str, Any] | None]:
    """Hold ``command`` to the rental window (see the module docstring); yields the ledger entry, or
    None when the study has no window. ``run``: the run a resume continues (its steps left);
    ``steps`` / ``variants``: a variant's budget and how many a ``--grid`` makes, or ``variant``
    (``train --from``'s parent, ``--set`` list and ``--grid``) to plan them from.

    Raises:
        CheckFailed: the estimate passes into the reserve of the phases after ``command`` (exit 3).
        TuneproofError: ``--use-reserve`` with an empty reason, or without a window (exit 2).
    """
    override = check_reason(OVERRIDE_FLAG, override)
    study_dir = Path(study_dir)
    if not (study_dir / rent.RENTAL_FILE).exists():
        if override is not None:
            raise TuneproofError(
                f"{OVERRIDE_FLAG}: {study_dir / rent.RENTAL_FILE} holds no rental window, so no reserve to use",
                hint=f"leave out {OVERRIDE_FLAG}, or start a window: tuneproof rental start --days 7",
            )
        yield None
        return
    rental = _require(study_dir)
    ctx = ctx or StudyContext.open(study_dir, data)
    reg = ctx.registry
    now = clock.now()
    _say(rent.close_orphans(rental, reg, now) + rent.observe(rental, now, command))
    shift = rent.clock_shift(rental)  # the reading lacks the steps back the window recorded
    work = study_work(ctx)
    rates = rent.rates(reg)
    if command == "resume":
        steps = _steps_left(reg, run)
    if variant is not None:
        steps, variants = variant_budget(ctx, *variant)
    est_s, basis = rent.estimate(rates, work, command, steps=steps, variants=variants)
    reserve_s, parts = rent.reserve(rates, work, command)
    deadline = rental["ends"] - reserve_s
    phase = rent.COMMAND_PHASE[command]
    if now + shift + est_s > deadline and command not in ("export", "deliver"):  # the reserve exists for these two
        numbers = (
            f"{command} needs ~{est_s / 3600:.2f} h ({basis}; step time from {rates['step_source']}) but "
            f"{max(0.0, deadline - now - shift) / 3600:.2f} h remain before the reserve of {reserve_s / 3600:.2f} h "
            f"({'; '.join(parts)}); the window ends {rent.iso_utc(rental['ends'])}"
        )
        if override is None:
            rent.save(study_dir, rental)
            raise CheckFailed(
                f"rental: {numbers}",
                hint=f"deliver now: tuneproof rental deliver; or spend the reserve: {OVERRIDE_FLAG} REASON (recorded)",
            )
        rental["overrides"].append({"command": command, "time": now, "reason": override, "numbers": numbers})
        registry.CARRY["rental_override"] = override
        _say([f"{command} spends the reserve ({override}): {numbers}"])
    first_seq = _next_seq(reg)
    pid = os.getpid()
    entry = {
        "command": command,
        "phase": phase,
        "start": now,
        "end": None,
        "estimate_s": est_s,
        "basis": basis,
        # who runs it: an entry whose process is gone is ended by the next command (rent.close_orphans)
        "pid": pid,
        "host": socket.gethostname(),
        "proc_start": procs.process_start(pid),
        "first_seq": first_seq,
    }
    rental["commands"].append(entry)
    index = len(rental["commands"]) - 1
    rent.save(study_dir, rental)
    stop = deadline - shift if command in ("train", "resume") and override is None else None
    outcome = "completed"
    try:
        with clock.stop_at(stop, rent.RESERVE_STOP):
            yield entry
    except Stopped:
        outcome = rent.RESERVE_STOP
        raise
    except (KeyboardInterrupt, SystemExit):
        outcome = "interrupted"
        raise
    except BaseException as err:
        outcome = f"failed: {type(err).__name__}"
        raise
    finally:
        registry.CARRY.pop("rental_override", None)
        end = clock.now()
        latest = rent.load(study_dir) or rental  # a nested command (deliver) may have written it
        made = [r.id for r in Registry(study_dir).list() if r.seq >= first_seq]
        if command == "resume" and run is not None:  # a resume continues its run: no new one is made
            with contextlib.suppress(TuneproofError):
                made.insert(0, reg.get(run).id)
        if index < len(latest.get("commands", [])):
            latest["commands"][index].update(end=end, status=outcome, runs=made)
            past = rent.command_hours(latest, latest["commands"][index], end)[1]
            if past > 0:
                _flag_past_end(study_dir, made, command, latest["ends"], past)
        _say(rent.observe(latest, end, f"the end of {command}"))
        rent.save(study_dir, latest)


def _flag_past_end(study_dir: Path, runs: list[str], command: str, ends: float, past_h: float) -> None:
    """The window ended while ``command`` ran: its runs carry ``rental_window_ended`` in their summary and
    the screen says so (its hours count up to the window's end, :func:`tuneproof.deliver.rental.command_hours`)."""
    note = f"the rental window ended {rent.iso_utc(ends)} while {command} ran ({past_h:.2f} h past it)"
    reg = Registry(study_dir)
    try:
        for rid in runs:
            run = registry.Run(reg, reg.get(rid))
            run.summary = dict(reg.get(rid).summary)
            run.update_summary(rental_window_ended=note)
    finally:
        reg.close()
    _say([f"{note}: {', '.join(runs) or 'no run'} flagged; its hours count up to the end"])


def _manifest_sha(bundle: Path) -> str | None:
    """sha256 of the bundle's ``manifest.json`` as verified (None when it cannot be read)."""
    try:
        return sha256_file(Path(bundle) / "manifest.json")
    except OSError:
        return None


def variant_budget(ctx: StudyContext, parent: str, sets: list[str], grid: str | None) -> tuple[int, int]:
    """``(steps of the largest variant, number of variants)`` that ``train --from parent`` makes."""
    if grid:
        plans, _ = plan_grid(ctx.registry, parent, grid, sets)
    else:
        plans = [plan_variant(ctx.registry, parent, sets)]
    n_train = split_sizes(ctx).get("train", 0)
    steps = [total_steps(parse_study(p.config, "variant").training, n_train) for p in plans]
    return max(steps, default=0), max(1, len(plans))


def _next_seq(reg: Registry) -> int:
    runs = reg.list()
    return (max(r.seq for r in runs) + 1) if runs else 1


def run_deliver(
    ctx: StudyContext, *, run: str | None = None, html: bool = False, to: str | None = None
) -> dict[str, Any]:
    """Export the best passed candidate (or ``run``), verify the bundle in a fresh process, write the
    dossier (``html``: also dossier.html); ``to``: then upload the bundle and the dossier to that store and
    read every file back against its sha256 (:func:`tuneproof.storage.deliver_to`) before saying delivered;
    records the deliverable in ``rental.json``. A completed
    export of that run whose bundle is still there is kept (the verification below checks every file
    of it again) instead of exporting again. Returns ``{"train", "export", "bundle", "verified",
    "dossier"}``.

    Raises:
        TuneproofError: no window recorded (exit 2).
        CheckFailed: no candidate passed its comparison and no ``--run`` was given, or the bundle
            failed its verification (exit 3).
    """
    _require(ctx.study_dir)
    best = rent.best_candidate(ctx.registry)
    train = run or (best or {}).get("train")
    if train is None:
        raise CheckFailed(
            "rental deliver: no candidate passed its comparison, so there is nothing to export",
            hint="write the evidence with tuneproof report, or name a run: tuneproof rental deliver --run RUN",
        )
    start = clock.now()
    console.print(f"deliver {train}: export, verify in a fresh process, report")
    with spend(ctx.study_dir, "deliver", ctx=ctx):
        kept = [r for r in ctx.registry.list(kind="export", status="completed") if r.parent == train]
        bundle = ctx.study_dir / "exports" / train  # the default folder (a copied study: its own copy)
        if kept and (bundle / "manifest.json").is_file():
            export_id = kept[-1].id
            console.print(f"export: {user_text(bundle)} from export run {export_id} (kept)", soft_wrap=True)
        else:
            export_id = run_export(ctx, train)
            # recorded relative to the study folder (exports/r0003), read in this folder
            summary = ctx.registry.get(export_id).summary
            bundle = ctx.registry.recorded_path(summary.get("bundle") or str(bundle), summary).path
        report = run_verify(bundle)
        delivered = {
            "train": train,
            "export": export_id,
            "bundle": study_relative(ctx.study_dir, bundle),
            "verified": bool(report.get("passed")),
            "verify_seconds": report.get("seconds"),
            "time": clock.now(),
            "started": start,
            "chosen": "--run" if run else "best passed candidate",
            # the manifest verified now: a later status claims the delivery only while it is this one
            "manifest_sha256": _manifest_sha(bundle) if report.get("passed") else None,
        }
        rental = _require(ctx.study_dir)
        rental["delivered"] = delivered
        rent.save(ctx.study_dir, rental)
        dossier = run_report(ctx, html=html)
        if to is not None and delivered["verified"]:
            files = {"bundle": bundle, dossier.name: dossier}
            if html and dossier.with_name("dossier.html").is_file():
                files["dossier.html"] = dossier.with_name("dossier.html")
            sent = deliver_to(ctx.study_dir, to, files, what=f"rental deliver {train}", say=_say_user)
            rental = _require(ctx.study_dir)
            rental["delivered"]["remote"] = {**sent, "checked": True}
            rent.save(ctx.study_dir, rental)
            delivered["remote"] = rental["delivered"]["remote"]
            console.print(
                f"delivered to {user_text(sent['uri'])}: {sent['files']} file(s), every sha256 read back and "
                f"checked ({sent['upload_s'] + sent['check_s']:.1f} s)",
                soft_wrap=True,
            )
    delivered["dossier"] = str(dossier)
    console.print(
        f"delivered {train}: {user_text(bundle)} verified in a fresh process; dossier {user_text(dossier)}",
        soft_wrap=True,
    )
    return delivered
