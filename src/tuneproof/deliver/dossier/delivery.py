"""What is handed over: exports (bundles read in this study folder), the rental plan and the rental."""

from __future__ import annotations

from typing import Any

from tuneproof import clock
from tuneproof.deliver import rental as rent
from tuneproof.deliver.dossier.blocks import NOT_RUN, _fmt, _paragraph, _table
from tuneproof.deliver.dossier.evidence import _Evidence
from tuneproof.deliver.rental_plan import cost_lines, load_plan
from tuneproof.errors import TuneproofError
from tuneproof.registry import RELATIVE_PATHS, RecordedPath

#: rental.json records its bundle relative to the study (docs/CONTRACTS.md, "Rental window")
_RENTAL_PATHS = {RELATIVE_PATHS: True}


def _bundle(ev: _Evidence, recorded: Any, summary: dict | None = None) -> RecordedPath | None:
    """A recorded bundle folder (``summary``: the export run's) read in this study folder (a copied study
    names its own copy, :meth:`Registry.recorded_path`); None when none was recorded."""
    return ev.reg.recorded_path(str(recorded), summary) if recorded else None


def _bundle_cell(ev: _Evidence, recorded: Any, summary: dict | None = None) -> str:
    got = _bundle(ev, recorded, summary)
    if got is None:
        return ""
    return got.shown if got.warning is None else f"{got.shown} (not in this folder: {got.warning})"


def _exports(ev: _Evidence) -> list[dict]:
    exps = [r for r in ev.runs if r.kind == "export"]
    if not exps:
        return [_paragraph(f"{NOT_RUN} (`tuneproof export RUN [--merge]`)")]
    rows = [
        [
            r.id,
            r.parent,
            r.status,
            r.reason or "",
            _bundle_cell(ev, r.summary.get("bundle"), r.summary),
            _fmt(r.summary.get("verified")),
            ("forced: " + str((r.summary.get("forced") or {}).get("status"))) if r.summary.get("forced") else "",
            _fmt(r.summary.get("merge")),
        ]
        for r in exps
    ]
    return [
        _table(["export run", "train run", "status", "reason", "bundle", "verified", "forced", "merged"], rows),
        _paragraph("check a bundle anywhere with `tuneproof verify BUNDLE --base PATH`."),
    ]


def _plan(ev: _Evidence) -> list[dict]:
    try:
        plan = load_plan(ev.ctx.study_dir)
    except Exception:  # noqa: BLE001
        plan = None
    if not plan:
        return [_paragraph(f"{NOT_RUN} (`tuneproof plan --days 7 --hourly-rate 2.5`)")]
    rows = [[p["phase"], f"{p['hours']:.2f}", p["basis"]] for p in plan["phases"]]
    rows.append(
        ["total", f"{plan['total_h']:.2f}", f"of {plan['available_h']:.0f} h rented; spare {plan['spare_h']:.1f} h"]
    )
    items = [
        f"variants of the configured budget that fit: {plan['variants_fit']} ("
        f"{plan['per_variant_h']:.2f} h each); planned: {plan['variants']}",
        *cost_lines(plan),
    ]
    items += (
        [f"note: {n}" for n in plan.get("notes", [])]
        + [f"warning: {w}" for w in plan.get("warnings", [])]
        + [f"assumption: {a}" for a in plan.get("assumptions", [])]
    )
    head = f"{plan['days']:g}-day rental, {plan['variants']} variant(s) of {plan['steps_per_variant']} steps:"
    return [_paragraph(head), _table(["phase", "hours", "basis"], rows), {"type": "list", "items": items}]


def _rental_record(ev: _Evidence) -> tuple[dict | None, str | None]:
    """``(rental.json as validated, None)``; ``(None, why)`` when it is there but not a valid record."""
    try:
        return rent.load(ev.ctx.study_dir), None
    except TuneproofError as err:
        return None, err.message.splitlines()[0]


def _rental_line(ev: _Evidence) -> list[str]:
    """The first screen's rental line: a window that ended without a verified export says so; a delivery
    is claimed verified only when it still checks (:func:`tuneproof.deliver.rental.delivery`)."""
    rental, bad = _rental_record(ev)
    if bad is not None:
        return [f"rental: NOT READ ({bad})"]
    if rental is None:
        return []
    d = rent.delivery(ev.ctx.study_dir, rental.get("delivered"))
    if d and d["verified"]:
        shown = _bundle_cell(ev, d["bundle"], _RENTAL_PATHS)
        return [f"rental: delivered {d['train']} ({shown}, verified in a fresh process)"]
    now = clock.now()
    left = min(rental["ends"] - (now + rent.clock_shift(rental)), rental["ends"] - rental["start"])
    if left <= 0:
        return [
            f"rental: the window ended {rent.iso_utc(rental['ends'])} WITHOUT A VERIFIED EXPORT "
            + (f"(the delivery is not verified: {d['problem']}; " if d else "(")
            + "`tuneproof rental deliver`; section Rental)"
        ]
    return [f"rental: {left / 3600:.1f} h left, ends {rent.iso_utc(rental['ends'])}"]


def _rental(ev: _Evidence) -> list[dict]:
    """Planned vs used per phase with the ratio, the rates used, the overrides and the stopped runs."""
    rental, bad = _rental_record(ev)
    if bad is not None:
        return [_paragraph(f"NOT READ: {bad}")]
    if rental is None:
        return [_paragraph(f"{NOT_RUN} (`tuneproof rental start --days 7`)")]
    st = rent.status(rental, ev.reg, ev.ctx.study_dir, clock.now(), rental["work"])
    rows = [
        [p["phase"], f"{p['planned_h']:.2f}", f"{p['used_h']:.2f}", "" if p["ratio"] is None else f"{p['ratio']:.2f}"]
        for p in st["phases"]
    ]
    start_rates = rental.get("rates") or {}
    items = [
        f"rates at the start: {start_rates.get('s_per_step', 0):.3g} s/step ({start_rates.get('step_source')}); "
        f"{start_rates.get('eval_s_per_example', 0):.3g} s per evaluated example ({start_rates.get('eval_source')})",
        f"rates now: {st['rates']['s_per_step']:.3g} s/step ({st['rates']['step_source']}); "
        f"{st['rates']['eval_s_per_example']:.3g} s per evaluated example ({st['rates']['eval_source']})",
        f"reserve kept for the end: {st['reserve_h']:.2f} h ({'; '.join(st['reserve_parts'])})",
    ]
    items += [f"override: {o['command']} spent the reserve: {o['reason']} ({o['numbers']})" for o in st["overrides"]]
    items += [f"stopped: {s['run']} {s['reason']} (now {s['status']})" for s in st["stopped"]]
    items += [
        f"the clock went back {(b['from'] - b['to']) / 3600:.2f} h at {b['where']} ({rent.iso_utc(b['to'])})"
        for b in st["clock_went_back"]
    ]
    items += [f"clock: {f}" for f in st["flags"]]
    if len(st["machines"]) > 1:
        items.append(
            "machines: " + ", ".join(f"{m['host']} from {rent.iso_utc(m['first_seen'])}" for m in st["machines"])
        )
    d = st["delivered"] or {}
    items.append(
        f"delivered: {d['train']} as {_bundle_cell(ev, d['bundle'], _RENTAL_PATHS)}, verified in a fresh process"
        if d.get("verified")
        else (f"delivered: {d['train']}, NOT VERIFIED now ({d['problem']})" if d else "delivered: nothing verified yet")
        + (" and the window has ended" if st["ended"] else "")
    )
    head = (
        f"window {rent.iso_utc(st['start'])} to {rent.iso_utc(st['ends'])}: "
        + ("ended" if st["ended"] else f"{st['left_h']:.1f} h left")
        + "; the plan's estimate judged against what each phase used:"
    )
    blocks = [_paragraph(head), _table(["phase", "planned h", "used h", "used/planned"], rows)]
    done = [c for c in st["commands"] if c["used_h"] is not None]
    if done:  # each command's own estimate against its measured start-to-end
        blocks.append(
            _table(
                ["command", "estimate h", "used h", "used/estimate", "how it ended", "runs"],
                [
                    [
                        c["command"],
                        f"{c['estimate_h']:.3f}",
                        f"{c['used_h']:.3f}",
                        f"{c['used_h'] / c['estimate_h']:.2f}" if c["estimate_h"] else "",
                        c["status"],
                        ", ".join(c["runs"]),
                    ]
                    for c in done[-10:]
                ],
            )
        )
        if len(done) > 10:
            items.append(f"commands: the last 10 of {len(done)} shown (all in rental.json)")
    return [*blocks, {"type": "list", "items": items}]
