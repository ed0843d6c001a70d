"""The baseline (step 2 of PROTOCOL.md) and the record of every run: the runs table (all of them, with
their flags) and the variants' lineage (what each changed against its parent)."""

from __future__ import annotations

from tuneproof.deliver.dossier.blocks import (
    NOT_RUN,
    _dur,
    _fmt,
    _paragraph,
    _table,
    flatten,
    not_completed,
    seconds_text,
)
from tuneproof.deliver.dossier.evidence import _Evidence
from tuneproof.evaluation.screen import metric_short
from tuneproof.registry import iso, override_flags
from tuneproof.ui import capped


def _baseline(ev: _Evidence) -> list[dict]:
    b = ev.latest("baseline")
    if not b:  # an interrupted or failed baseline is said as such, never "not run yet"
        return not_completed(ev, "baseline", "tuneproof baseline")
    if b.id in ev.missing:
        return [{"type": "strong", "text": f"INCOMPLETE: {ev.missing[b.id]['what']}: its metrics are not shown"}]
    base = b.summary.get("base") or {}
    blocks = [
        _paragraph(
            f"{b.id}: the base model {base.get('name', ev.ctx.study.model.base)} (revision "
            f"{base.get('revision', '-')}) on "
            f"{b.summary.get('n_eval', '?')} '{ev.ctx.study.eval.split}' "
            f"examples, {seconds_text(b.summary.get('eval_seconds'))}"
            + (f" for {b.summary['eval_repeats']} repeats (eval.repeat)" if b.summary.get("eval_repeats") else "")
            + "."
        )
    ]
    floors = (b.summary.get("noise") or {}).get("floors") or {}
    if floors:  # how much the baseline's numbers moved by themselves (evaluation/noise.py)
        shown = [k for k in b.summary.get("metrics") or {} if k in floors] or list(floors)  # the headline metrics
        blocks.append(
            _paragraph(
                f"noise floor over {b.summary['eval_repeats']} repeats (max - min of each metric; runs/{b.id}/"
                "noise.json): "
                + ", ".join(f"{metric_short(k)} {floors[k]:.4g}" for k in shown)
                + f"; per-example flips {(b.summary.get('noise') or {}).get('flips', 0)}"
            )
        )
    metrics = b.summary.get("metrics", {})
    blocks.append(
        _table(["metric", "value"], [[metric_short(k), v] for k, v in metrics.items()])
        if metrics
        else _paragraph("no metrics recorded")
    )
    return blocks


def resume_notes(ev: _Evidence, r) -> list[str]:
    """One phrase per ``tuneproof resume`` of the train run ``r`` (its summary's ``resumes``, written by the
    resume recipe), e.g. ``"interrupted after step 3 and resumed exactly from its checkpoint at step 2"``: the
    status it had, the last step its dead process logged (``metrics.jsonl``: the step rows before each
    ``{"event": "resume"}`` row; omitted when none was logged), the checkpoint's step, and the newer checkpoints
    ``--fallback`` skipped. A resume restores the optimizer, schedule, RNG states and data position, so the run
    equals an uninterrupted one (docs/CASES.md C12). Empty for a run never resumed."""
    resumes = [x for x in (r.summary.get("resumes") or []) if isinstance(x, dict)]
    if not resumes:
        return []
    stopped: list[int | None] = []  # the last step logged before each resume
    last = None
    for m in ev.rows(r.id, "metrics.jsonl"):
        if m.get("event") == "resume":
            stopped.append(last)
        elif isinstance(m.get("step"), int):
            last = m["step"]
    notes = []
    for i, x in enumerate(resumes):
        at = stopped[i] if i < len(stopped) else None
        skipped = x.get("skipped") or []
        notes.append(
            f"{x.get('previous_status') or 'interrupted'}"
            + (f" after step {at}" if at is not None else "")
            + (f" ({x['previous_reason']})" if x.get("previous_reason") else "")
            + f" and resumed exactly from its checkpoint at step {x.get('from_step', '?')}"
            + (f" ({len(skipped)} newer checkpoint(s) skipped by --fallback)" if skipped else "")
        )
    return notes


def resumed_line(ev: _Evidence, run_id: str | None) -> str | None:
    """``"r0004 was interrupted after step 3 and resumed exactly from its checkpoint at step 2"`` (several
    resumes joined by "; then "), or None when the run was never resumed (:func:`resume_notes`)."""
    r = next((x for x in ev.runs if x.id == run_id), None)
    notes = resume_notes(ev, r) if r is not None else []
    return f"{run_id} was " + "; then ".join(notes) if notes else None


def _flags(r, baseline_fp: str | None) -> list[str]:
    flags = []
    if baseline_fp and r.data_fingerprint and r.data_fingerprint != baseline_fp and r.kind in ("train", "eval"):
        flags.append("data differs from baseline")
    flags += override_flags(r.summary)
    if r.summary.get("multi_change"):
        flags.append("multi-change variant")
    if r.summary.get("forced"):
        flags.append("forced export")
    resumes = [x for x in (r.summary.get("resumes") or []) if isinstance(x, dict)]
    if resumes:
        flags.append(f"resumed x{len(resumes)} (from step {', '.join(str(x.get('from_step', '?')) for x in resumes)})")
    return flags


def _runs(ev: _Evidence) -> list[dict]:
    if not ev.runs:
        return [_paragraph(f"{NOT_RUN}")]
    b = ev.latest("baseline")
    bfp = b.data_fingerprint if b else None
    rows = []
    for r in ev.runs:
        m = r.summary.get("metrics") or {}
        head = ", ".join(f"{metric_short(k)} {_fmt(v)}" for k, v in list(m.items())[:2])
        if r.kind == "train" and r.summary.get("final_loss") is not None:
            head = f"final loss {_fmt(r.summary['final_loss'], 4)}"
        if r.id in ev.missing:
            head = f"INCOMPLETE: {ev.missing[r.id]['what']}"
        rows.append(
            [
                r.id,
                r.kind,
                r.status,
                r.reason or "",
                r.parent or "",
                iso(r.created),
                _dur(r),
                head,
                "; ".join(_flags(r, bfp)),
            ]
        )
    blocks = [
        _table(["id", "kind", "status", "reason", "parent", "created (UTC)", "duration", "headline", "flags"], rows)
    ]
    bad = [r for r in ev.runs if r.status != "completed"]
    if bad:
        blocks.append(_paragraph(f"{len(bad)} run(s) did not complete; none is hidden:"))
        blocks.append(
            {
                "type": "list",
                "items": [f"{r.id} ({r.kind}) {r.status}: {r.reason or 'no reason recorded'}" for r in bad],
            }
        )
    else:
        blocks.append(_paragraph("every run completed."))
    resumed = [line for line in (resumed_line(ev, r.id) for r in ev.runs) if line]
    if resumed:  # a resumed run's status is that of its last process: the interruptions are said here
        blocks.append(_paragraph(f"{len(resumed)} run(s) were interrupted and resumed (`tuneproof resume`):"))
        blocks.append({"type": "list", "items": resumed})
    return blocks


def _change_of(ev: _Evidence, r) -> str:
    var = r.summary.get("variant") or {}
    ch = var.get("change")
    if ch:
        if isinstance(ch, dict):
            return "; ".join(
                f"{k}: {_fmt(v.get('from') if isinstance(v, dict) else v)} -> "
                f"{_fmt(v.get('to') if isinstance(v, dict) else '')}"
                if isinstance(v, dict)
                else f"{k}: {_fmt(v)}"
                for k, v in ch.items()
            )
        if isinstance(ch, list):
            return "; ".join(str(x) for x in ch)
        return str(ch)
    a, b = ev.json(r.parent, "config.json") or {}, ev.json(r.id, "config.json") or {}
    da, db = dict(flatten(a, depth=4)), dict(flatten(b, depth=4))
    diff = [f"{k}: {_fmt(da.get(k))} -> {_fmt(db.get(k))}" for k in sorted(set(da) | set(db)) if da.get(k) != db.get(k)]
    return capped(diff, cap=5, sep="; ") if diff else "no config change recorded"


def _lineage(ev: _Evidence) -> list[dict]:
    trains = {r.id: r for r in ev.runs if r.kind == "train"}
    if not trains:
        return [_paragraph(f"{NOT_RUN} (no train run)")]
    children: dict[str | None, list] = {}
    for r in trains.values():
        children.setdefault(r.parent if r.parent in trains else None, []).append(r)
    if not any(k is not None for k in children):
        return [
            _paragraph(
                f"no variants yet: {len(trains)} train run(s), each from the study file "
                "(`tuneproof train --from RUN --set KEY=VALUE` makes one)."
            )
        ]
    # the hypothesis in force (frozen unless --use-edited-hypothesis)
    metric = (ev.judging.primary.get("success") or {}).get("metric") or ev.ctx.study.hypothesis.success.metric
    b = ev.latest("baseline")
    bval = (b.summary.get("metrics") or {}).get(metric) if b else None
    evals = {r.parent: r for r in ev.runs if r.kind == "eval" and r.status == "completed"}
    lines: list[str] = []

    def walk(r, prefix: str, last: bool, root: bool) -> None:
        e = evals.get(r.id)
        val = (e.summary.get("metrics") or {}).get(metric) if e else None
        score = (
            f" | {metric} {_fmt(val)}"
            + (f" ({val - bval:+.3f} vs baseline)" if isinstance(val, float) and isinstance(bval, float) else "")
            if val is not None
            else ""
        )
        what = "from the study file" if root else _change_of(ev, r)
        lines.append(f"{prefix}{'' if root else ('`- ' if last else '|- ')}{r.id} [{r.status}] {what}{score}")
        kids = children.get(r.id, [])
        for i, k in enumerate(kids):
            walk(k, prefix + ("" if root else ("   " if last else "|  ")), i == len(kids) - 1, False)

    for r in children.get(None, []):
        walk(r, "", True, True)
    return [{"type": "pre", "text": "\n".join(lines)}]
