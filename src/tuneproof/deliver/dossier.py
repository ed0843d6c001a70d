"""The dossier: every piece of evidence of a study, collected once and rendered twice (Markdown for
the terminal, one self-contained HTML page with plots).

:func:`collect` reads the registry and the run folders (never the data, never a model) and
returns ``{"title", "sections": [{"id", "title", "blocks"}]}``; a block is one of

- ``{"type": "p", "text"}``, ``{"type": "strong", "text"}``, ``{"type": "list", "items"}``,
- ``{"type": "table", "cols", "rows"}``, ``{"type": "pre", "text"}``,
- ``{"type": "figure", "png": bytes, "caption"}``,
- ``{"type": "details", "summary", "blocks"}``: blocks folded under a one-line summary
  (``<details>`` in HTML and in GitHub Markdown).

The first section ("Summary") is the first screen: it stands alone (hypothesis, verdict with its
intervals, or ``INCOMPLETE: ...`` naming the evidence a verdict would need that is missing or broken, what the candidate
changed against the baseline, runs that did not complete and why, limits, test-split reads) and links every section
below it.

:func:`to_markdown` and :func:`to_html` render that structure; every string is escaped by the
renderer (``tuneproof.ui.markdown_text`` / ``html_text``: control characters as visible escapes such
as ``\\x1b``, Markdown and HTML syntax neutralised), so text from the user's data can never become
markup. A part whose command was not run says "not run yet" and names the command.
"""

from __future__ import annotations

import base64
import re
from collections import Counter
from typing import Any

from tuneproof import clock
from tuneproof import hypothesis as hyp
from tuneproof.deliver import rental as rent
from tuneproof.deliver.limits import (
    FIRST_SCREEN_LIMITS,
    PER_FIELD_METRIC,
    limits_lines,
    observed_limits,
    per_class_metric,
    summary_limits,
)
from tuneproof.deliver.plots import confusion, loss_curves, memory_throughput, metric_bars, token_lengths
from tuneproof.deliver.rental_plan import cost_lines, load_plan
from tuneproof.errors import TuneproofError
from tuneproof.evaluation.screen import fmt_p, guard_lines, metric_short
from tuneproof.io import read_jsonl, sha256_json
from tuneproof.modalities.base import (
    LOSS_NORMALISATION,
    SUGGESTED_MAX_LENGTH,
    TEXT_CHECK_LINES,
    TEXT_CHECKS,
    TOKEN_LENGTHS,
    Modality,
)
from tuneproof.preflight.checks import PREFLIGHT_NAMES
from tuneproof.preflight.report import headline
from tuneproof.registry import RELATIVE_PATHS, RecordedPath, iso, override_flags
from tuneproof.tasks import get_task
from tuneproof.ui import capped, capped_items, html_text, markdown_text, visible_text

NOT_RUN = "not run yet"


# --------------------------------------------------------------------------- small helpers
def _fmt(x: Any, nd: int = 3) -> str:
    """A value as the dossier prints it: ``nd`` decimals for floats, lower-case booleans, ``-`` for None."""
    if isinstance(x, bool):
        return str(x).lower()
    if isinstance(x, float):
        return f"{x:.{nd}f}" if abs(x) < 1e6 else f"{x:.3g}"
    return "-" if x is None else str(x)


def _ci(ci: Any) -> str:
    return "[" + ", ".join(_fmt(x) for x in (ci or [None, None])) + "]"


def _dur(rec) -> str:
    if not rec.ended or not rec.created:
        return ""
    s = rec.ended - rec.created
    return f"{s:.1f} s" if s < 120 else (f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h")


def flatten(obj: Any, prefix: str = "", depth: int = 3) -> list[tuple[str, Any]]:
    """Scalar leaves of a nested dict as ``(dotted key, value)``; lists of scalars joined."""
    out: list[tuple[str, Any]] = []
    if isinstance(obj, dict) and depth > 0:
        for k, v in obj.items():
            if k == "schema_version":
                continue
            key = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, dict):
                out += flatten(v, key, depth - 1)
            elif isinstance(v, list):
                if all(not isinstance(x, (dict, list)) for x in v):
                    out.append((key, capped([_fmt(x) for x in v])))
            else:
                out.append((key, v))
    return out


def _paragraph(text: str) -> dict:
    """A ``{"type": "p"}`` block."""
    return {"type": "p", "text": text}


def _table(cols: list[str], rows: list[list[Any]]) -> dict:
    return {"type": "table", "cols": cols, "rows": [[_fmt(v) for v in r] for r in rows]}


def _fig(png: bytes | None, caption: str) -> list[dict]:
    return [{"type": "figure", "png": png, "caption": caption}] if png else []


class _Evidence:
    """Cached reads of run files for one dossier build."""

    def __init__(self, ctx, use_edited: str | None = None):
        self.ctx = ctx
        self.reg = ctx.registry
        self.runs = self.reg.list()
        self._json: dict[tuple[str, str], Any] = {}
        self.judging_error = None
        self.gaps: list[dict[str, str]] = []  # evidence a verdict needs that is missing: {"what", "message", "hint"}
        try:
            self.judging = hyp.resolve(ctx.study_dir, ctx.study, self.reg, use_edited)
        except hyp.SealBroken as err:  # no verdict against a hypothesis that is not the one frozen
            self.judging = hyp.Judging(current=hyp.hypothesis_view(ctx.study))
            self.judging_error = err.message
            self.gaps.append({"what": err.what, "message": err.message, "hint": err.hint or ""})
        except TuneproofError as err:  # e.g. the task changed after training: say so, still render
            if use_edited is not None and not use_edited.strip():
                raise
            self.judging, self.judging_error = (
                hyp.Judging(current=hyp.hypothesis_view(ctx.study)),
                str(err).splitlines()[0],
            )

    def judged(self, entry: dict) -> tuple[tuple[list, dict] | None, tuple[str, dict] | None]:
        """A recorded comparison entry judged against the hypothesis in force, and (when the study
        file's differs) ``(name, overall)`` of the other one; None where it needs re-scoring."""
        j = self.judging
        if j.frozen is None and "hypothesis_hash" not in entry:  # nothing frozen: as recorded
            return (entry.get("verdicts") or [], entry.get("overall") or {}), None
        primary = hyp.rejudge(entry, j.primary)
        other = None
        if j.other is not None:
            got = hyp.rejudge(entry, j.other)
            other = (j.other_name, got[1] if got else {"verdict": None, "detail": _RESCORE})
        return primary, other

    def json(self, run_id: str, name: str) -> Any:
        key = (run_id, name)
        if key not in self._json:
            try:
                self._json[key] = self.reg.run_json(run_id, name)
            except Exception:  # noqa: BLE001 - a damaged artifact must not stop the dossier
                self._json[key] = None
        return self._json[key]

    def rows(self, run_id: str, name: str) -> list[dict]:
        path = self.reg.runs_dir / run_id / name
        try:
            return read_jsonl(path) if path.exists() else []
        except Exception:  # noqa: BLE001
            return []

    def latest(self, kind: str, any_status: bool = False):
        runs = [r for r in self.runs if r.kind == kind and (any_status or r.status == "completed")]
        return runs[-1] if runs else None


def missing_evidence(ev: _Evidence) -> list[dict[str, str]]:
    """What the latest comparison's verdict rests on that is gone: its ``compare.json``, the
    baseline's or a candidate's per-example outputs (a deleted run folder), plus a broken seal of the
    frozen hypothesis (:func:`tuneproof.hypothesis.check_sealed`). Each ``{"what", "message", "hint"}``;
    [] when the verdict can be backed."""
    gaps = list(ev.gaps)
    c = ev.latest("compare")
    if c is None:
        return gaps
    data = ev.json(c.id, "compare.json")
    if data is None:
        path = ev.reg.runs_dir / c.id / "compare.json"
        return gaps + [
            {
                "what": f"comparison {c.id}'s compare.json is missing",
                "message": f"{path}: comparison {c.id}'s compare.json is missing",
                "hint": "run `tuneproof compare RUN` again",
            }
        ]
    who = [("baseline", data.get("baseline"))] + [("candidate", cid) for cid in data.get("candidates") or {}]
    for role, rid in who:
        if not rid:
            continue
        path = ev.reg.runs_dir / rid / "outputs.jsonl"
        if path.is_file():
            continue
        redo = "`tuneproof baseline`" if role == "baseline" else "`tuneproof eval TRAIN_RUN`"
        gaps.append(
            {
                "what": f"{role} {rid}'s outputs are missing (runs/{rid}/outputs.jsonl)",
                "message": f"{path}: {role} {rid}'s outputs are missing; comparison {c.id} was computed from them",
                "hint": f"restore the run folder runs/{rid}, or run {redo} and `tuneproof compare` again",
            }
        )
    return gaps


def _incomplete_block(gaps: list[dict[str, str]]) -> dict:
    return {"type": "strong", "text": "INCOMPLETE: " + "; ".join(g["what"] for g in gaps)}


# --------------------------------------------------------------------------- sections
_RESCORE = "scored with other required fields or format rule: run `tuneproof compare` again to judge it"


def _verdict_text(ev: _Evidence, entry: dict | None) -> str | None:
    if not entry:
        return None
    primary, other = ev.judged(entry)
    o = primary[1] if primary else {"verdict": None, "detail": _RESCORE}
    text = f"{o.get('verdict')} ({o.get('detail')})"
    if other:
        text += f"; with the {other[0]} hypothesis: {other[1].get('verdict')} ({other[1].get('detail')})"
    return text


def _summary(ev: _Evidence) -> list[dict]:
    """The first screen: it stands alone; every other section is linked below it
    (tests/deliver/test_deliver_dossier.py)."""
    s = ev.ctx.study
    by_status = Counter(r.status for r in ev.runs)
    comp, first, cid = _latest_candidate(ev)
    exp = ev.latest("export")
    h = ev.judging.primary if ev.judging.frozen is not None else ev.judging.current
    succ = h.get("success") or {}
    blocks: list[dict] = []
    judged = ev.judged(first) if first else None
    gaps = missing_evidence(ev)
    if gaps:  # never a verdict its evidence cannot back
        blocks.append(_incomplete_block(gaps))
        blocks.append({"type": "list", "items": [f"{g['message']} ({g['hint']})" for g in gaps]})
    elif first and judged and judged[0] is not None:
        verdicts, o = judged[0]
        blocks.append(
            {
                "type": "strong",
                "text": f"verdict ({ev.judging.judged_against} hypothesis): {str(o.get('verdict', '?')).upper()} "
                f"({o.get('detail', '')}); {cid} vs baseline "
                f"{(ev.json(comp.id, 'compare.json') or {}).get('baseline')} ({comp.id})",
            }
        )
        blocks.append(criteria_table(verdicts))
        for who, key in (("candidate", "dominant"), ("baseline", "dominant_baseline")):  # one-class collapse
            if (first.get(key) or {}).get("flagged"):
                blocks.append({"type": "strong", "text": f"warning: the {who} {first[key]['detail']}"})
        if judged[1]:
            blocks.append(
                _paragraph(
                    f"with the {judged[1][0]} hypothesis instead: "
                    f"{judged[1][1].get('verdict')} ({judged[1][1].get('detail')})"
                )
            )
    elif first:
        blocks.append({"type": "strong", "text": f"verdict: NOT JUDGED: the comparison {comp.id} was {_RESCORE}"})
    else:
        blocks.append(
            {"type": "strong", "text": "verdict: none yet: no comparison with the baseline (`tuneproof compare RUN`)"}
        )
    items = [
        f"hypothesis: {h.get('behaviour')}; success: {succ.get('metric')} gains "
        f"at least {succ.get('min_gain')} over the baseline "
        f"(95% CI lower bound); {len(h.get('guards') or [])} guard(s)",
        f"study: {s.name} ({s.hypothesis.task}); base model: {s.model.base}"
        + (f" @ {s.model.revision}" if s.model.revision else ""),
    ]
    if cid:
        items.append(f"the candidate changed against the baseline: {_candidate_change(ev, cid)}")
    bad = [r for r in ev.runs if r.status != "completed"]
    items.append(
        f"runs: {len(ev.runs)} (" + ", ".join(f"{n} {k}" for k, n in sorted(by_status.items())) + ")"
        if ev.runs
        else "runs: none yet"
    )
    items += capped_items(
        [f"did not complete: {r.id} ({r.kind}) {r.status}: {r.reason or 'no reason recorded'}" for r in bad],
        cap=5,
        where="section Runs",
    )
    acc = ev.reg.test_accesses()
    if not acc:
        items.append("test split: not read")
    else:
        reused = [a for a in acc if (a.get("result") or {}).get("test_reuse")]
        items.append(
            f"test split: read {len(acc)} time(s) ("
            + capped([f"{a['run']} for {a['candidate']}" for a in acc], cap=5)
            + ")"
            + (f"; {len(reused)} read(s) recorded as reuse" if reused else "")
            + ("; reading it more than once wears out its value as a control" if len(acc) > 1 else "")
        )
    if exp is None:
        items.append("export: not run yet (`tuneproof export RUN`)")
    else:
        got = _bundle(ev, exp.summary.get("bundle"), exp.summary)
        items.append(
            f"export: {got.shown} (verified in a fresh process)"
            if got is None or got.warning is None
            else f"export: {got.warning}: export it again here (`tuneproof export {exp.parent}`)"
        )
    if ev.reg.moved_from is not None:
        items.append(
            f"study folder: copied or moved from {ev.reg.moved_from}; the paths its runs recorded there are "
            "read in this folder"
        )
    items += _rental_line(ev)
    blocks.append({"type": "list", "items": items})
    lim = _observed(ev)
    if lim is not None:
        lines = summary_limits(lim[1])
        blocks.append(
            _paragraph(f"limits observed of {lim[0]} (at most {FIRST_SCREEN_LIMITS}; all of them in Limits observed):")
        )
        blocks.append({"type": "list", "items": lines or ["none observed"]})
    return blocks


def criteria_table(verdicts: list[dict]) -> dict:
    """The first screen's table: one row per criterion (success, each guard) with its verdict, the
    numbers and, for a per-class / per-field guard, a note whose lists are capped
    (:func:`tuneproof.ui.capped`; every item is in ``compare.json``)."""
    rows = []
    for v in verdicts:
        shown = guard_lines(v)[0] if v.get("items") else ""
        rows.append(
            [
                v.get("name"),
                v.get("verdict"),
                v.get("base"),
                v.get("cand"),
                f"{_fmt(v.get('delta'))} {_ci(v.get('ci'))}",
                shown,
            ]
        )
    return _table(["criterion", "verdict", "baseline", "candidate", "delta [95% CI]", "note"], rows)


def _candidate_change(ev: _Evidence, cid: str) -> str:
    """What the candidate's train run did to the base model: method, budget, and a variant's change."""
    rec = next((r for r in ev.runs if r.id == cid), None)
    train = next((r for r in ev.runs if rec is not None and r.id == rec.parent and r.kind == "train"), None)
    if train is None:
        return f"{cid} is not the evaluation of a train run"
    cfg = ev.json(train.id, "config.json") or {}
    m, t = cfg.get("method") or {}, cfg.get("training") or {}
    kind = m.get("kind", "?")
    what = f"{kind}" + (
        f" r {m.get('r')}, alpha {m.get('alpha')} on {', '.join(m.get('target_modules') or [])}"
        if kind in ("lora", "qlora", "dora")
        else ""
    )
    if m.get("modules_to_save"):
        what += f" (also trains {', '.join(m['modules_to_save'])})"
    budget = (
        f"{t.get('max_steps')} optimizer steps"
        if t.get("max_steps")
        else f"{t.get('epochs')} epoch(s)"
        if t.get("epochs")
        else "1 epoch"
    )
    text = (
        f"{train.id} trained {what}; {budget} of {t.get('micro_batch_size')} x "
        f"{t.get('gradient_accumulation_steps', 1)} examples, "
        f"learning rate {t.get('learning_rate')}"
    )
    if train.summary.get("final_loss") is not None:
        text += f"; final loss {_fmt(train.summary['final_loss'], 4)}"
    if train.parent and (train.summary.get("variant") or {}):
        text += f"; variant of {train.parent}: {_change_of(ev, train)}"
    return text


def _hypothesis_items(h: dict) -> list[str]:
    items = [
        f"behaviour: {h.get('behaviour')}",
        f"task: {h.get('task')}",
        f"success: {(h.get('success') or {}).get('metric')} gains at least "
        f"{(h.get('success') or {}).get('min_gain')} over the baseline",
    ]
    for g in h.get("guards") or []:
        # only the conditions written apply (a floor alone allows any drop above it)
        rule = " and ".join(
            x
            for x in [
                f"must not drop by more than {g['max_drop']} vs the baseline" if g.get("max_drop") is not None else "",
                f"must stay at or above {g['floor']}" if g.get("floor") is not None else "",
            ]
            if x
        )
        only = f" for {capped(g['classes'])}" if g.get("classes") else ""
        items.append(f"guard: {g.get('metric')}{only} {rule or 'has no condition'}")
    if h.get("required_fields"):
        items.append(f"required fields: {capped(h['required_fields'])}")
    fmt = {k: v for k, v in (h.get("format") or {}).items() if v not in (None, False)}
    if fmt:
        items.append(
            "format rule: "
            + "; ".join(
                f"eval.{k} = {v if isinstance(v, str) else sha256_json(v)[:12] if isinstance(v, dict) else v}"
                for k, v in fmt.items()
            )
        )
    return items


def _hypothesis(ev: _Evidence) -> list[dict]:
    j = ev.judging
    if ev.judging_error:
        return [
            {"type": "list", "items": _hypothesis_items(j.current)},
            {"type": "strong", "text": f"warning: {ev.judging_error}"},
        ]
    if j.frozen is None:
        return [
            {"type": "list", "items": _hypothesis_items(j.current)},
            _paragraph(
                "not frozen yet: the first train run fixes it (`tuneproof train`); "
                "until then the study file's hypothesis is in force."
            ),
        ]
    first = next((r for r in ev.runs if r.id == j.frozen_run), None)
    when = f", {iso(first.created)} UTC" if first else ""
    blocks = [
        _paragraph(
            f"frozen with the first train run {j.frozen_run}{when}; sha256 {str(j.frozen_hash)[:16]} (from {j.source}):"
        ),
        {"type": "list", "items": _hypothesis_items(j.frozen)},
    ]
    if j.changed:
        blocks.append(
            {
                "type": "strong",
                "text": f"warning: the study file's hypothesis differs from the frozen one ({len(j.diff)} "
                f"change{'s' if len(j.diff) != 1 else ''}); the verdicts below are judged against the "
                f"{j.judged_against} hypothesis and the {j.other_name} one's verdict is given next to it",
            }
        )
        blocks.append(
            _table(
                ["key", "frozen", "study file now"],
                [[c["key"], hyp._short(c["old"]), hyp._short(c["new"])] for c in j.diff],
            )
        )
    else:
        blocks.append(_paragraph("the study file's hypothesis is unchanged since."))
    if j.reason:
        blocks.append(
            {
                "type": "strong",
                "text": f"this dossier judges against the EDITED hypothesis (--use-edited-hypothesis): {j.reason}",
            }
        )
    uses = hyp.overrides(ev.ctx.study_dir)
    if uses:
        blocks.append(_paragraph(f"--use-edited-hypothesis was used {len(uses)} time(s):"))
        blocks.append(
            {
                "type": "list",
                "items": [
                    f"{iso(u.get('time'))} UTC {u.get('command')}"
                    + (f" {u['run']}" if u.get("run") else "")
                    + f": {u.get('reason')}"
                    for u in uses
                ],
            }
        )
    return blocks


def _baseline(ev: _Evidence) -> list[dict]:
    b = ev.latest("baseline")
    if not b:
        return [_paragraph(f"{NOT_RUN} (`tuneproof baseline`)")]
    base = b.summary.get("base") or {}
    blocks = [
        _paragraph(
            f"{b.id}: the base model {base.get('name', ev.ctx.study.model.base)} (revision "
            f"{base.get('revision', '-')}) on "
            f"{b.summary.get('n_eval', '?')} '{ev.ctx.study.eval.split}' "
            f"examples, {b.summary.get('eval_seconds', '?')} s."
        )
    ]
    metrics = b.summary.get("metrics", {})
    blocks.append(
        _table(["metric", "value"], [[metric_short(k), v] for k, v in metrics.items()])
        if metrics
        else _paragraph("no metrics recorded")
    )
    return blocks


def _flags(r, baseline_fp: str | None) -> list[str]:
    flags = []
    if baseline_fp and r.data_fingerprint and r.data_fingerprint != baseline_fp and r.kind in ("train", "eval"):
        flags.append("data differs from baseline")
    flags += override_flags(r.summary)
    if r.summary.get("multi_change"):
        flags.append("multi-change variant")
    if r.summary.get("forced"):
        flags.append("forced export")
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


def _data_check(ev: _Evidence, plots: bool, modality: Modality) -> list[dict]:
    """The data check's verdict, sizes and, as the modality declares them (``dossier_sections``),
    the token lengths, the suggested max_length and the text checks (duplicates, encoding)."""
    sections = modality.dossier_sections
    r = ev.latest("data-check", any_status=True)
    if not r:
        return [_paragraph(f"{NOT_RUN} (`tuneproof data check`)")]
    s = r.summary
    blocks = [
        _paragraph(
            f"{r.id}: {r.status}"
            + (f" ({r.reason})" if r.reason else "")
            + (f"; passed: {_fmt(s.get('passed'))}" if "passed" in s else "")
            + (f"; hard faults: {s.get('hard_faults')}" if "hard_faults" in s else "")
        )
    ]
    if isinstance(s.get("sizes"), dict):
        blocks.append(_paragraph("split sizes: " + ", ".join(f"{k} {v}" for k, v in s["sizes"].items())))
    lengths = s.get("lengths") if isinstance(s.get("lengths"), dict) else {}
    if lengths and TOKEN_LENGTHS in sections:
        rows = [
            [k, v.get("p50"), v.get("p95"), v.get("max"), v.get("truncated_share")]
            for k, v in lengths.items()
            if isinstance(v, dict)
        ]
        blocks.append(_table(["split", "p50 tokens", "p95 tokens", "max tokens", "share truncated"], rows))
    if s.get("suggest_max_length") and SUGGESTED_MAX_LENGTH in sections:
        blocks.append(
            _paragraph(
                f"suggested max_length: {s['suggest_max_length']} (configured: {ev.ctx.study.training.max_length})"
            )
        )
    rep = ev.json(r.id, "data_check.json") or {}
    dup_rows, examples = _duplicate_rows(rep.get("dedup") if isinstance(rep, dict) else None)
    if dup_rows and TEXT_CHECKS in sections:  # the text duplicate finder's (an image study's are in its image audit)
        blocks.append(
            _paragraph(
                "duplicates across splits first (the second split's examples that "
                "also occur in the first), then inside each split:"
            )
        )
        blocks.append(_table(["splits", "where", "examples checked", "exact", "normalised", "near"], dup_rows))
        if examples:
            blocks.append(
                {
                    "type": "details",
                    "summary": f"{len(examples)} cross-split duplicate(s), first listed",
                    "blocks": [_table(["kind", "first", "second", "similarity", "text (second)"], examples)],
                }
            )
    elif s.get("duplicates"):
        blocks.append({"type": "list", "items": [str(x) for x in s["duplicates"]]})
    shown = (
        s
        if TEXT_CHECKS in sections or not isinstance(s.get("checks"), list)
        else {**s, "checks": [c for c in s["checks"] if not str(c).startswith(TEXT_CHECK_LINES)]}
    )
    shown_apart = ("sizes", "lengths", "duplicates", "passed", "hard_faults", "suggest_max_length")
    other = [(k, v) for k, v in flatten(shown) if k.split(".")[0] not in shown_apart]
    if other:
        blocks.append(_table(["key", "value"], other[:30]))
    if plots and TOKEN_LENGTHS in sections:
        raw = _raw_lengths(rep)
        stats = ((rep.get("lengths") or {}).get("splits") if isinstance(rep.get("lengths"), dict) else None) or lengths
        blocks += _fig(
            token_lengths(raw, stats, ev.ctx.study.training.max_length), "token lengths per split (data check)"
        )
    return blocks


#: cross-split duplicate pairs listed (folded) in the data-check section
DUPLICATES_LISTED = 20


def _duplicate_rows(dedup: dict | None) -> tuple[list[list], list[list]]:
    """Rows per split pair from the data check's dedup report (cross-split pairs first:
    train/validation, train/test, validation/test; then inside each split) and the first
    :data:`DUPLICATES_LISTED` cross-split collisions."""
    pairs = (dedup or {}).get("pairs") if isinstance(dedup, dict) else None
    if not isinstance(pairs, dict) or not pairs:
        return [], []
    t = (dedup.get("settings") or {}).get("threshold")
    rows, examples = [], []
    for p in sorted(pairs.values(), key=lambda p: p.get("first") == p.get("second")):
        c, n = p.get("counts") or {}, p.get("n_second") or 0

        def cell(level: str, c: dict = c, n: int = n) -> str:
            k = (c.get(level) or {}).get("second_colliding", 0)
            return f"{k} ({100 * k / n:.1f}%)" if n else str(k)

        cross = p.get("first") != p.get("second")
        rows.append(
            [
                f"{p.get('first')}/{p.get('second')}",
                "across splits" if cross else "inside the split",
                n,
                cell("exact"),
                cell("normalised"),
                cell("near") + (f" (Jaccard >= {t:g})" if isinstance(t, (int, float)) else ""),
            ]
        )
        if cross:
            for col in p.get("collisions") or []:
                if len(examples) < DUPLICATES_LISTED:
                    examples.append(
                        [
                            col.get("kind"),
                            col.get("id_a"),
                            col.get("id_b"),
                            col.get("similarity"),
                            str(col.get("text_b", ""))[:120],
                        ]
                    )
    return rows, examples


def _raw_lengths(rep: dict) -> dict[str, list[int]] | None:
    """Raw token lengths per split if the data check stored them (any of a few layouts)."""
    for holder in (rep, rep.get("lengths") if isinstance(rep.get("lengths"), dict) else {}):
        for key in ("token_lengths", "lengths_by_split", "values", "raw"):
            v = holder.get(key) if isinstance(holder, dict) else None
            if isinstance(v, dict) and v and all(isinstance(x, list) for x in v.values()):
                return {k: [int(i) for i in x if isinstance(i, (int, float))] for k, x in v.items()}
    return None


_MEM = re.compile(r"(peak|memory|mem_|_mem|bytes|gib|mib)", re.I)
_THR = re.compile(r"(tokens_per_s|s_per_step|examples_per_s|steps_per_s|throughput)", re.I)


def _gib(key: str, v: float) -> float | None:
    k = key.lower()
    if "gib" in k or k.endswith("_gb"):
        return v
    if "mib" in k or k.endswith("_mb"):
        return v / 1024
    if "bytes" in k or k.endswith("_b") or v > 1e5:
        return v / 2**30
    return None


_STEP_MEM = re.compile(
    r"^L(\d+)_(estimate|peak|step_peak|estimate_in_step|allocated_step_peak)_gib$|^L(\d+)_(measured_over_estimate)$"
)


def _plain(key: str, rate: str = "tokens") -> tuple[str, str, float | None]:
    """``(plain name, unit, factor)`` of a dotted preflight key; ``factor`` converts bytes to GiB;
    ``rate``: what the training throughput counts (``Modality.unit``)."""
    last = key.split(".")[-1]
    if last in PREFLIGHT_NAMES:
        name, unit = PREFLIGHT_NAMES[last]
        unit = f"{rate}/s" if unit == "tokens/s" else unit
        ctx = key.split(".")[:-1]
        if ctx and ctx[0] not in ("memory", "throughput", "smoke"):
            name += f" ({' '.join(ctx)})"
        elif len(ctx) > 1:
            name += f" ({' '.join(ctx[1:])})"
        return name, unit, 1 / 2**30 if last.endswith("_bytes") else None
    words = key.replace(".", " ").replace("_", " ")
    for suffix, unit, factor in (
        (" bytes", "GiB", 1 / 2**30),
        (" gib", "GiB", None),
        (" seconds", "s", None),
        (" per s", "/s", None),
    ):
        if words.endswith(suffix):
            return words[: -len(suffix)].strip(), unit, factor
    return words, "", None


def _label(key: str, unit: bool = False, rate: str = "tokens") -> str:
    """A plot label for a preflight key: its plain name (with the unit when ``unit``; ``rate`` as in :func:`_plain`)."""
    m = _STEP_MEM.match(key.split(".")[-1])
    if m:
        what = {
            "estimate": "step total, estimate",
            "peak": "step total, measured",
            "estimate_in_step": "step adds, estimate",
            "step_peak": "step adds, measured",
            "allocated_step_peak": "step's tensors, measured",
            "measured_over_estimate": "measured / estimate",
        }[m.group(2) or m.group(4)]
        return f"L{m.group(1) or m.group(3)}: {what}"
    name, u, _ = _plain(key, rate)
    return f"{name} ({u})" if unit and u else name


def preflight_tables(summary: dict, rate: str = "tokens") -> tuple[list[list], list[list]]:
    """The preflight summary as two tables: step memory per sequence length ``[length, estimate,
    measured peak, in-step estimate, in-step measured, the step's tensors measured, measured /
    estimate]`` (GiB, 2 decimals; the ratio of the step's tensors to the in-step estimate) and every
    other number ``[plain name, value, unit]``; raw keys such as ``memory.L37_estimate_in_step_gib``
    become "the step adds, estimate" at length 37; ``rate``: what the throughput counts (``Modality.unit``)."""
    memory = summary.get("memory") if isinstance(summary.get("memory"), dict) else {}
    by_len: dict[int, dict[str, float]] = {}
    for k, v in memory.items():
        m = _STEP_MEM.match(str(k))
        if m and isinstance(v, (int, float)):
            by_len.setdefault(int(m.group(1) or m.group(3)), {})[m.group(2) or m.group(4)] = float(v)
    mem_rows = [
        [
            length,
            *(
                f"{d[k]:.2f}" if k in d else "-"
                for k in (
                    "estimate",
                    "peak",
                    "estimate_in_step",
                    "step_peak",
                    "allocated_step_peak",
                    "measured_over_estimate",
                )
            ),
        ]
        for length, d in sorted(by_len.items())
    ]
    # speedups_auto has its own table (speedups_auto_rows): its reasons are longer than the cut below
    apart = ("checks", "passed", "failed", "memory_breakdown", "speedups_auto")
    rest = {k: v for k, v in summary.items() if k not in apart}
    rest["memory"] = {k: v for k, v in memory.items() if not _STEP_MEM.match(str(k))}
    rows = []
    for k, v in flatten(rest, depth=4):
        if isinstance(v, str) and len(v) >= 200 or v is None:
            continue
        name, unit, factor = _plain(k, rate)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            val = v * factor if factor else v
            shown = (
                f"{val:.2f}"
                if unit == "GiB"
                else (
                    f"{val:,}"
                    if isinstance(val, int)
                    else _fmt(float(val), 1 if abs(val) >= 100 else 3 if abs(val) >= 0.01 or val == 0 else 5)
                )
            )
        else:
            shown = _fmt(v)
        rows.append([name, shown, unit])
    return mem_rows, rows


def speedups_auto_rows(record: Any) -> list[list[str]]:
    """What ``training.speedups: auto`` resolved to (a run summary's ``speedups_auto``, written by
    :func:`tuneproof.training.speedups.resolve_auto`) as ``[speed-up, "used" | "off", reason]``, one row
    per speed-up in the order auto tried them, the reason whole; ``[]`` for a run without auto."""
    decisions = record.get("decisions") if isinstance(record, dict) else None
    if not isinstance(decisions, dict):
        return []
    return [
        [str(name), "used" if d.get("used") else "off", str(d.get("reason") or "")]
        for name, d in decisions.items()
        if isinstance(d, dict)
    ]


def _auto_blocks(run_id: str, record: Any) -> list[dict]:
    """The table of :func:`speedups_auto_rows` under a line naming the run it was resolved in."""
    rows = speedups_auto_rows(record)
    if not rows:
        return []
    return [
        _paragraph(f"{run_id}: training.speedups auto, each speed-up used or left off and why:"),
        _table(["speed-up", "auto", "why"], rows),
    ]


def _preflight(ev: _Evidence, plots: bool, modality: Modality) -> list[dict]:
    r = ev.latest("preflight", any_status=True)
    if not r:
        return [_paragraph(f"{NOT_RUN} (`tuneproof preflight`)")]
    s = r.summary
    blocks = [
        _paragraph(
            f"{r.id}: {r.status}"
            + (f" ({r.reason})" if r.reason else "")
            + (f"; passed: {_fmt(s.get('passed'))}" if "passed" in s else "")
        )
    ]
    checks = s.get("checks")
    rows = []

    def line(name: str, c: dict) -> list:  # the number that matters, as on the preflight's screen
        message = c.get("detail") or c.get("message") or ""
        passed = c.get("passed", c.get("status"))
        return [name, _fmt(passed), headline({"name": name, "passed": passed, "message": message, **c})]

    if isinstance(checks, list):
        rows = [line(c.get("name", "?"), c) for c in checks if isinstance(c, dict)]
    elif isinstance(checks, dict):
        for name, c in checks.items():
            rows.append(line(name, c) if isinstance(c, dict) else [name, _fmt(c), ""])
    if rows:
        blocks.append(_paragraph(f"each check's whole message and numbers: runs/{r.id}/preflight.json"))
        blocks.append(_table(["check", "passed", "the number that matters"], rows))
    mem_rows, rows = preflight_tables(s, modality.unit)
    if mem_rows:
        blocks.append(
            _paragraph(
                "step memory at the configured micro-batch, estimate next to measured (GiB; measured: process resident "
                "set on a CPU, peak allocated on a GPU):"
            )
        )
        blocks.append(
            _table(
                [
                    "sequence length (tokens)",
                    "step total, estimate",
                    "step total, measured peak",
                    "the step adds, estimate",
                    "the step adds, measured",
                    "the step's tensors, measured",
                    "measured / estimate (tensors vs the step's parts)",
                ],
                mem_rows,
            )
        )
    bd = s.get("memory_breakdown") if isinstance(s.get("memory_breakdown"), dict) else None
    if bd and bd.get("rows") and bd.get("lengths"):
        blocks.append(
            _paragraph(
                "step memory estimate itemised, MiB (2**20 bytes), micro-batch "
                f"{bd.get('micro_batch')}; then the measured "
                "step (its tensors: the CPU allocator's count or CUDA's peak "
                "allocated; the process: resident set on a CPU):"
            )
        )
        blocks.append(
            _table(
                ["part", *(f"length {n}" for n in bd["lengths"])],
                [
                    [str(r[0]), *("-" if v is None else _fmt(v) for v in r[1:])]
                    for r in bd["rows"]
                    if isinstance(r, list) and r
                ],
            )
        )
    if rows:
        blocks.append(_table(["quantity", "value", "unit"], rows[:40]))
    blocks += _auto_blocks(r.id, s.get("speedups_auto"))
    if plots:
        nums = [
            (k, float(v))
            for k, v in flatten(s, depth=4)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
        ]
        mem = {
            _label(k): g
            for k, v in nums
            if _MEM.search(k) and not _THR.search(k) and "budget" not in k.lower()
            for g in [_gib(k, v)]
            if g is not None
        }
        thr = {_label(k, unit=True, rate=modality.unit): v for k, v in nums if _THR.search(k)}
        blocks += _fig(memory_throughput(mem, thr), "step memory and throughput (preflight)")
    return blocks


def _speedups_cell(summary: dict) -> str:
    """The speed-ups a train run used (``training.chunked_loss``, ``length_grouping``, ``packing``,
    ``bf16_base_weights``: each recorded in the summary's ``speedups`` after its check passed) and the
    padding share of epoch 0 before and after the layout; ``none`` for a run that trained without
    them, ``-`` for one that recorded no steps (e.g. interrupted before its summary)."""
    used = list(summary.get("speedups") or {})
    pad = summary.get("padding") or {}
    cell = ", ".join(used) if used else "none"
    if used and isinstance(pad.get("before"), (int, float)) and isinstance(pad.get("after"), (int, float)):
        cell += f" (padding {pad['before']:.1%} -> {pad['after']:.1%})"
    return cell if summary.get("steps") is not None or used else "-"


def _training(ev: _Evidence, plots: bool, modality: Modality) -> list[dict]:
    """Every train run (steps, losses, seconds, the rate in the modality's unit, speed-ups) and, where the
    modality declares it, the loop's loss normalisation; the loss curves."""
    trains = [r for r in ev.runs if r.kind == "train"]
    if not trains:
        return [_paragraph(f"{NOT_RUN} (`tuneproof train`)")]
    rows = []
    series = {}
    for r in trains:
        s = r.summary
        rows.append(
            [
                r.id,
                r.status,
                s.get("steps", s.get("last_step")),
                s.get("first_loss"),
                s.get("final_loss"),
                s.get("train_seconds"),
                s.get("tokens_per_s"),
                s.get("trainable"),
                s.get("dtype"),
                _speedups_cell(s),
            ]
        )
        pts = [
            (int(m["step"]), float(m["loss"]))
            for m in ev.rows(r.id, "metrics.jsonl")
            if "step" in m and isinstance(m.get("loss"), (int, float))
        ]
        if pts:
            series[r.id] = list(dict(pts).items())  # a resumed step logged twice: the last row wins
    blocks = [
        _table(
            [
                "run",
                "status",
                "steps",
                "first loss",
                "final loss",
                "seconds",
                f"{modality.unit}/s",
                "trainable params",
                "dtype",
                "speed-ups",
            ],
            rows,
        )
    ]
    for r in trains:  # what auto resolved to in the loop, which is what the run trained with
        blocks += _auto_blocks(r.id, r.summary.get("speedups_auto"))
    norm = next((r.summary.get("loss_normalisation") for r in trains if r.summary.get("loss_normalisation")), None)
    if norm and LOSS_NORMALISATION in modality.dossier_sections:
        blocks.append(_paragraph(f"loss normalisation: {norm}"))
    if plots:
        blocks += _fig(loss_curves(series), "training loss curves (runs/<id>/metrics.jsonl)")
    return blocks


def _comparisons(ev: _Evidence, plots: bool) -> list[dict]:
    compares = [r for r in ev.runs if r.kind == "compare" and r.status == "completed"]
    if not compares:
        return [_paragraph(f"{NOT_RUN} (`tuneproof compare RUN`)")]
    blocks: list[dict] = []
    task = ev.ctx.task
    for c in compares:
        data = ev.json(c.id, "compare.json") or {}
        for cid, r in (data.get("candidates") or {}).items():
            cnt = r.get("counts", {})
            blocks.append({"type": "strong", "text": f"{cid} vs baseline {data.get('baseline')} ({c.id})"})
            blocks.append(
                _paragraph(
                    f"{r.get('n')} paired examples: fixed {cnt.get('fixed')}, "
                    f"broken {cnt.get('broken')}, unchanged right "
                    f"{cnt.get('unchanged_right')}, unchanged wrong {cnt.get('unchanged_wrong')}; McNemar exact p = "
                    f"{fmt_p((r.get('mcnemar') or {}).get('p_value'))}. Intervals: 95% paired bootstrap of the delta."
                )
            )
            basis, cc = r.get("counts_basis") or {}, r.get("counts_correct")
            if basis:  # tests/deliver/test_show_basis.py: the counts follow the success metric's per-example rule
                extra = (
                    " On the per-example `correct` (exact match / right class): "
                    f"fixed {cc['fixed']}, broken {cc['broken']}, "
                    f"unchanged right {cc['unchanged_right']}, unchanged wrong {cc['unchanged_wrong']}."
                    if cc and basis.get("rule") != "correct"
                    else ""
                )
                blocks.append(
                    _paragraph(f"counts basis ({basis.get('metric') or 'correct'}): {basis.get('description')}.{extra}")
                )
            if (r.get("dominant") or {}).get("flagged"):
                blocks.append({"type": "strong", "text": f"warning: the candidate {r['dominant']['detail']}"})
            blocks.append(
                _table(
                    ["metric", "baseline", "candidate", "delta", "95% CI"],
                    [
                        [metric_short(m), v.get("base"), v.get("cand"), v.get("delta"), _ci(v.get("ci"))]
                        for m, v in (r.get("metrics") or {}).items()
                    ],
                )
            )
            pc, pf = r.get("per_class") or {}, r.get("per_field") or {}
            cm = per_class_metric(task)
            if pc:
                blocks += per_class_blocks(pc, cm, _failing_items(r, "per_class"))
                blocks += _confusion_summary(ev, data.get("baseline"), cid, task)
            if pf:
                blocks.append(
                    _table(
                        [
                            "field",
                            f"{PER_FIELD_METRIC} baseline",
                            f"{PER_FIELD_METRIC} candidate",
                            "delta",
                            "95% CI",
                            "support",
                        ],
                        [
                            [
                                k,
                                (v.get(PER_FIELD_METRIC) or {}).get("base"),
                                (v.get(PER_FIELD_METRIC) or {}).get("cand"),
                                (v.get(PER_FIELD_METRIC) or {}).get("delta"),
                                _ci((v.get(PER_FIELD_METRIC) or {}).get("ci")),
                                (v.get(PER_FIELD_METRIC) or {}).get("support"),
                            ]
                            for k, v in pf.items()
                        ],
                    )
                )
            if (r.get("concentration") or {}).get("detail"):
                blocks.append(_paragraph(f"where the gain comes from: {r['concentration']['detail']}"))
            items, folded = [], []
            for v in r.get("verdicts", []):
                failing = [it for it in v.get("items") or [] if it.get("verdict") == "fail"]
                items.append(f"{v['name']}: {v['verdict']}: {guard_lines(v)[0] if failing else v.get('detail', '')}")
                if failing:  # one row per failing class / field, all of them (the screen shows 10)
                    folded.append(
                        {
                            "type": "details",
                            "summary": f"{len(failing)} failing: {v['name']}",
                            "blocks": [
                                _table(
                                    ["name", "baseline", "candidate", "delta", "95% CI", "support", "why"],
                                    [
                                        [
                                            it["name"],
                                            it.get("base"),
                                            it.get("cand"),
                                            it.get("delta"),
                                            _ci(it.get("ci")),
                                            it.get("support"),
                                            it.get("why", ""),
                                        ]
                                        for it in failing
                                    ],
                                )
                            ],
                        }
                    )
            items += [f"note: {n}" for n in r.get("notes", [])]
            if r.get("fixed_ids"):
                items.append("fixed (wrong before, right after): " + capped(r["fixed_ids"]))
            if r.get("broken_ids"):
                items.append("broken (right before, wrong after): " + capped(r["broken_ids"]))
            if items:
                blocks.append({"type": "list", "items": items})
            blocks += folded
            if plots:
                blocks += _comparison_plots(ev, data.get("baseline"), cid, r, task)
    return blocks


#: a per-class table longer than this folds the classes that did not change (and pass every guard)
FOLD_CLASSES_OVER = 12
#: confusions listed in the confusion summary; heat maps of more classes than this are folded
TOP_CONFUSIONS = 10
FOLD_HEATMAP_OVER = 15


def _failing_items(r: dict, group: str) -> set[str]:
    return {
        it["name"]
        for v in r.get("verdicts") or []
        if str(v.get("metric", "")).startswith(group)
        for it in v.get("items") or []
        if it.get("verdict") == "fail"
    }


def per_class_blocks(pc: dict, metric: str, failing: set[str]) -> list[dict]:
    """The per-class table sorted by delta (most negative first): classes that fail a guard or whose
    metric changed come first; with more than :data:`FOLD_CLASSES_OVER` classes the unchanged
    rest is folded (``details``)."""

    def row(k: str) -> list:
        v = pc[k].get(metric) or {}
        return [
            k,
            v.get("base"),
            v.get("cand"),
            v.get("delta"),
            _ci(v.get("ci")),
            v.get("support"),
            "fails a guard" if k in failing else "",
        ]

    def key(k: str):
        d = (pc[k].get(metric) or {}).get("delta")
        return (d is None, d if d is not None else 0.0, k)

    cols = ["class", f"{metric} baseline", f"{metric} candidate", "delta", "95% CI", "support", "guard"]
    changed = sorted((k for k in pc if k in failing or ((pc[k].get(metric) or {}).get("delta") or 0.0) != 0.0), key=key)
    rest = sorted((k for k in pc if k not in changed), key=key)
    if len(pc) <= FOLD_CLASSES_OVER or not rest:
        return [_table(cols, [row(k) for k in changed + rest])]
    out = [
        _paragraph(
            f"{len(changed)} of {len(pc)} classes changed or fail a guard, sorted by delta "
            f"(most negative first); the {len(rest)} unchanged are folded below."
        )
    ]
    if changed:
        out.append(_table(cols, [row(k) for k in changed]))
    out.append(
        {
            "type": "details",
            "summary": f"{len(rest)} unchanged classes",
            "blocks": [_table(cols, [row(k) for k in rest])],
        }
    )
    return out


def top_confusions(conf: dict | None, n: int = TOP_CONFUSIONS) -> list[tuple[str, str, int, int]]:
    """The ``n`` largest off-diagonal cells ``(true, predicted, count, row total)`` of a confusion
    matrix (``{"labels", "columns", "matrix"}``, rows = references), ties by name."""
    if not conf or not conf.get("matrix"):
        return []
    cells = []
    for true, counts in zip(conf["labels"], conf["matrix"]):
        total = sum(counts)
        for j, c in enumerate(counts):
            pred = conf["columns"][j]
            if c and pred != true:
                cells.append((true, pred, int(c), int(total)))
    return sorted(cells, key=lambda t: (-t[2], t[0], t[1]))[:n]


def _confusion_summary(ev: _Evidence, base_id: str | None, cid: str, task: str) -> list[dict]:
    if not get_task(task).has_confusion:
        return []
    conf = ((ev.json(cid, "eval.json") or {}).get("metrics") or {}).get("confusion")
    top = top_confusions(conf)
    if not top:
        return [_paragraph(f"top confusions of {cid}: none (every prediction is its reference class)")] if conf else []
    bconf = ((ev.json(base_id, "eval.json") or {}).get("metrics") or {}).get("confusion") if base_id else None
    bcell = {}
    if bconf and bconf.get("matrix"):
        for true, counts in zip(bconf["labels"], bconf["matrix"]):
            for pred, c in zip(bconf["columns"], counts):
                bcell[(true, pred)] = int(c)
    rows = [[t, p, c, f"{c / tot:.0%}" if tot else "-", bcell.get((t, p), "-")] for t, p, c, tot in top]
    return [
        _paragraph(
            f"top {len(rows)} confusions of the candidate {cid} (true class "
            "predicted as another; the heat maps are below):"
        ),
        _table(["true class", "predicted as", "examples", "share of the class", f"baseline {base_id}"], rows),
    ]


def _comparison_plots(ev: _Evidence, base_id: str | None, cid: str, r: dict, task: str) -> list[dict]:
    out: list[dict] = []
    for section, metric, what in (
        (r.get("per_class") or {}, per_class_metric(task), "class"),
        (r.get("per_field") or {}, PER_FIELD_METRIC, "field"),
    ):
        names = [k for k, v in section.items() if isinstance(v.get(metric), dict)]
        if names:
            png = metric_bars(
                names,
                [section[k][metric].get("base") for k in names],
                [section[k][metric].get("cand") for k in names],
                metric=metric,
                title=f"{metric} per {what}: baseline {base_id} vs {cid}",
                cand_label=cid,
                base_label=f"baseline {base_id}",
                what=what,
            )
            out += _fig(png, f"per-{what} {metric}, baseline vs candidate {cid}")
    if get_task(task).has_confusion:
        for rid, who in ((base_id, "baseline"), (cid, "candidate")):
            conf = ((ev.json(rid, "eval.json") or {}).get("metrics") or {}).get("confusion") if rid else None
            if conf and conf.get("matrix"):
                fig = _fig(
                    confusion(conf["matrix"], conf["labels"], conf["columns"], title=f"confusion matrix, {who} {rid}"),
                    f"confusion matrix of the {who} {rid} (rows: true class, columns: predicted)",
                )
                if (
                    len(conf["labels"]) > FOLD_HEATMAP_OVER and fig
                ):  # unreadable at a glance: the top confusions table says it
                    fig = [
                        {
                            "type": "details",
                            "summary": f"confusion heat map of the {who} {rid} ({len(conf['labels'])} classes)",
                            "blocks": fig,
                        }
                    ]
                out += fig
    return out


def _test_log(ev: _Evidence) -> list[dict]:
    acc = ev.reg.test_accesses()
    if not acc:
        return [_paragraph("the reserved test split has not been read.")]
    rows = []
    for a in acc:
        res = a.get("result") or {}
        m = res.get("metrics") if isinstance(res.get("metrics"), dict) else res
        text = ", ".join(
            f"{metric_short(k)} {_fmt(v)}" for k, v in list(m.items())[:3] if not isinstance(v, (dict, list))
        )
        vs = res.get("versus_base") or {}
        for k, v in list((vs.get("metrics") or {}).items())[:1]:  # the same read, paired with the base model
            text += f"; vs the base model: {metric_short(k)} delta {_fmt(v.get('delta'))} {_ci(v.get('ci'))}"
        if res.get("judged_against") == "edited":
            text += f" (scored with the EDITED hypothesis: {res.get('use_edited_reason')})"
        rows.append([a["run"], a["candidate"], iso(a["time"]), text])
    blocks = [_table(["run", "candidate", "time (UTC)", "result"], rows)]
    if len(acc) > 1:
        blocks.append(
            {
                "type": "strong",
                "text": f"the test split was read {len(acc)} times: choosing among "
                "candidates on it wears out its value as a control",
            }
        )
    return blocks


def _latest_candidate(ev: _Evidence) -> tuple[Any, dict | None, str | None]:
    c = ev.latest("compare")
    if not c:
        return None, None, None
    data = ev.json(c.id, "compare.json") or {}
    cands = data.get("candidates") or {}
    if not cands:
        return c, None, None
    cid = next(iter(cands))
    return c, cands[cid], cid


def _verdict(ev: _Evidence) -> list[dict]:
    gaps = missing_evidence(ev)
    if gaps:
        return [_incomplete_block(gaps)]
    c, r, cid = _latest_candidate(ev)
    if not r:
        return [_paragraph(f"{NOT_RUN}: no comparison with the baseline (`tuneproof compare RUN`)")]
    primary, other = ev.judged(r)
    if primary is None:
        return [{"type": "strong", "text": f"NOT JUDGED: the comparison {c.id} was {_RESCORE}"}]
    verdicts, o = primary
    against = ev.judging.judged_against
    blocks = [
        {
            "type": "strong",
            "text": f"{str(o.get('verdict', '?')).upper()}: {o.get('detail', '')} "
            f"({cid}, {c.id}; {against} hypothesis)",
        }
    ]
    blocks.append({"type": "list", "items": [f"{v['name']}: {v['verdict']}" for v in verdicts]})
    if other:
        blocks.append(
            _paragraph(f"with the {other[0]} hypothesis instead: {other[1].get('verdict')} ({other[1].get('detail')})")
        )
    return blocks


def _observed(ev: _Evidence) -> tuple[str, dict] | None:
    """``(run id, observed limits)`` of the latest compared candidate, else of the latest eval run."""
    c, r, cid = _latest_candidate(ev)
    if not cid:
        e = ev.latest("eval")
        if not e:
            return None
        cid, r = e.id, None
    em = (ev.json(cid, "eval.json") or {}).get("metrics")
    return cid, observed_limits(
        ev.ctx.task,
        eval_metrics=em,
        outputs=ev.rows(cid, "outputs.jsonl"),
        comparison=r,
        test_accesses=ev.reg.test_accesses(),
    )


def _limits(ev: _Evidence) -> list[dict]:
    got = _observed(ev)
    if got is None:
        return [_paragraph(f"{NOT_RUN}: no evaluated run")]
    cid, lim = got
    return [
        _paragraph(f"of {cid} on the evaluation split (weak: below {lim['weak_below']}):"),
        {"type": "list", "items": limits_lines(lim, 12) or ["none observed"]},
    ]


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


def _rental_record(ev: _Evidence) -> dict | None:
    try:
        return rent.load(ev.ctx.study_dir)
    except TuneproofError:
        return None


def _rental_line(ev: _Evidence) -> list[str]:
    """The first screen's rental line: a window that ended without a verified export says so."""
    rental = _rental_record(ev)
    if rental is None:
        return []
    delivered = rental.get("delivered") or {}
    if delivered.get("verified"):
        shown = _bundle_cell(ev, delivered["bundle"], _RENTAL_PATHS)
        return [f"rental: delivered {delivered['train']} ({shown}, verified in a fresh process)"]
    if clock.now() >= rental["ends"]:
        return [
            f"rental: the window ended {rent.iso_utc(rental['ends'])} WITHOUT A VERIFIED EXPORT "
            "(`tuneproof rental deliver`; section Rental)"
        ]
    return [f"rental: {(rental['ends'] - clock.now()) / 3600:.1f} h left, ends {rent.iso_utc(rental['ends'])}"]


def _rental(ev: _Evidence) -> list[dict]:
    """Planned vs used per phase with the ratio, the rates used, the overrides and the stopped runs."""
    rental = _rental_record(ev)
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
    if len(st["machines"]) > 1:
        items.append(
            "machines: " + ", ".join(f"{m['host']} from {rent.iso_utc(m['first_seen'])}" for m in st["machines"])
        )
    d = st["delivered"] or {}
    items.append(
        f"delivered: {d['train']} as {_bundle_cell(ev, d['bundle'], _RENTAL_PATHS)}, verified in a fresh process"
        if d.get("verified")
        else "delivered: nothing verified yet" + (" and the window has ended" if st["ended"] else "")
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


def _environment(ev: _Evidence) -> list[dict]:
    for r in reversed(ev.runs):
        env = ev.json(r.id, "env.json")
        if env:
            rows = [[k, v] for k, v in flatten(env, depth=2) if v not in (None, "", [])]
            return [
                _paragraph(f"as recorded by {r.id} ({r.kind}); every run stores its own env.json."),
                _table(["key", "value"], rows),
            ]
    return [_paragraph(NOT_RUN)]


def collect(ctx, *, plots: bool = True, use_edited: str | None = None) -> dict[str, Any]:
    """Every section of the dossier (see the module docstring); ``plots`` draws the figures;
    ``use_edited`` (the reason of ``--use-edited-hypothesis``) judges against the study file's
    hypothesis instead of the frozen one. ``"incomplete"``: :func:`missing_evidence` (then the first
    screen and the Verdict section say ``INCOMPLETE: ...`` instead of a verdict)."""
    ev = _Evidence(ctx, use_edited)
    modality = ctx.modality  # what applies: token lengths and the loop's normalisation to text, the rate's unit
    sections = [
        ("summary", "Summary", _summary(ev)),
        ("hypothesis", "Hypothesis and guards", _hypothesis(ev)),
        ("baseline", "Baseline", _baseline(ev)),
        ("runs", "Runs (all of them)", _runs(ev)),
        ("lineage", "Variants (lineage)", _lineage(ev)),
        ("data-check", "Data check", _data_check(ev, plots, modality)),
        ("preflight", "Preflight", _preflight(ev, plots, modality)),
        ("training", "Training", _training(ev, plots, modality)),
        ("comparisons", "Comparisons with the baseline", _comparisons(ev, plots)),
        ("test-log", "Test split access log", _test_log(ev)),
        ("verdict", "Verdict", _verdict(ev)),
        ("limits", "Limits observed", _limits(ev)),
        ("exports", "Exports", _exports(ev)),
        ("plan", "Rental plan", _plan(ev)),
        ("rental", "Rental", _rental(ev)),
        ("environment", "Environment", _environment(ev)),
    ]
    return {
        "title": f"Dossier: {ctx.study.name}",
        "sections": [{"id": i, "title": t, "blocks": b} for i, t, b in sections],
        "incomplete": missing_evidence(ev),
    }


# --------------------------------------------------------------------------- renderers
#: the dossier's text mixes its own words with the user's (labels, reasons, recorded errors): a paragraph
#: or a cell longer than this is cut with "... (N more characters)"
TEXT_LIMIT = 10_000


def _md_text(v: Any) -> str:
    """Text for Markdown (:func:`tuneproof.ui.markdown_text`): control characters visible, links,
    HTML, emphasis and line-start syntax neutralised; the backticks of the dossier's commands kept."""
    return markdown_text(v, one_line=False, limit=TEXT_LIMIT, code_spans=True)


def _md_cell(v: Any) -> str:
    """One table cell: as :func:`_md_text`, on one line (a newline reads ``\\n``), ``|`` escaped."""
    return markdown_text(v, one_line=True, limit=TEXT_LIMIT, code_spans=True)


def _md_pre(text: str) -> list[str]:
    """A fenced block longer than any run of backticks inside it, its control characters visible."""
    text = visible_text(text, limit=None)
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", text)), default=0))
    return [fence, text, fence, ""]


def _html(v: Any) -> str:
    return html_text(v, limit=TEXT_LIMIT)


def _md_blocks(blocks: list[dict]) -> list[str]:
    out: list[str] = []
    for b in blocks:
        t = b["type"]
        if t == "p":
            out += [_md_text(b["text"]), ""]
        elif t == "strong":
            out += [f"**{_md_text(b['text'])}**", ""]
        elif t == "list":
            out += [f"- {_md_text(x)}" for x in b["items"]] + [""]
        elif t == "pre":
            out += _md_pre(b["text"])
        elif t == "table":
            out += ["| " + " | ".join(_md_cell(c) for c in b["cols"]) + " |", "|" + "---|" * len(b["cols"])]
            out += ["| " + " | ".join(_md_cell(v) for v in r) + " |" for r in b["rows"]] + [""]
        elif t == "figure":
            out += [f"_(plot in dossier.html: {_md_cell(b['caption'])})_", ""]
        elif t == "details":  # GitHub Markdown folds it; the summary is escaped like HTML text
            out += (
                [f"<details><summary>{_html(b['summary'])}</summary>", ""]
                + _md_blocks(b["blocks"])
                + ["</details>", ""]
            )
    return out


def to_markdown(d: dict[str, Any]) -> str:
    """GitHub-flavoured Markdown; figures are named (they are in the HTML page). The first section
    (the first screen) ends with links to every other section."""
    out = [f"# {_md_text(d['title'])}", ""]
    for i, s in enumerate(d["sections"]):
        out += [f'<a id="{_html(s["id"])}"></a>', "", f"## {_md_cell(s['title'])}", ""] + _md_blocks(s["blocks"])
        if i == 0 and len(d["sections"]) > 1:
            out += ["details: " + " · ".join(f"[{x['title']}](#{x['id']})" for x in d["sections"][1:]), ""]
    return "\n".join(out).rstrip() + "\n"


CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;max-width:1100px;\
margin:2em auto;padding:0 1em;color:#1d2733;line-height:1.45}
h1{border-bottom:2px solid #2f6fb3;padding-bottom:.2em}h2{margin-top:1.8em;border-bottom:1px solid #d5dbe1}
table{border-collapse:collapse;margin:.6em 0;font-size:.88em;display:block;overflow-x:auto}
th,td{border:1px solid #d5dbe1;padding:.25em .55em;text-align:left;vertical-align:top}th{background:#eef2f6}
pre{background:#f4f6f8;padding:.8em;overflow-x:auto}figure{margin:1em 0}\
figure img{max-width:100%;border:1px solid #e3e7eb}
figcaption{font-size:.85em;color:#56606b}.strong{font-weight:600}\
nav a{margin-right:.8em;font-size:.9em;display:inline-block}
td,th{overflow-wrap:break-word}details{margin:.5em 0}summary{cursor:pointer;color:#2f6fb3}
"""


def _html_blocks(blocks: list[dict]) -> list[str]:
    e = _html
    out: list[str] = []
    for b in blocks:
        t = b["type"]
        if t == "p":
            out.append(f"<p>{e(b['text'])}</p>")
        elif t == "strong":
            out.append(f'<p class="strong">{e(b["text"])}</p>')
        elif t == "list":
            out.append("<ul>" + "".join(f"<li>{e(str(x))}</li>" for x in b["items"]) + "</ul>")
        elif t == "pre":
            out.append(f"<pre>{html_text(b['text'], limit=None)}</pre>")
        elif t == "table":
            out.append(
                "<table><thead><tr>"
                + "".join(f"<th>{e(str(c))}</th>" for c in b["cols"])
                + "</tr></thead><tbody>"
                + "".join("<tr>" + "".join(f"<td>{e(str(v))}</td>" for v in r) + "</tr>" for r in b["rows"])
                + "</tbody></table>"
            )
        elif t == "figure":
            data = base64.b64encode(b["png"]).decode("ascii")
            out.append(
                f'<figure><img alt="{e(b["caption"])}" src="data:image/png;base64,{data}">'
                f"<figcaption>{e(b['caption'])}</figcaption></figure>"
            )
        elif t == "details":
            out.append(
                f"<details><summary>{e(str(b['summary']))}</summary>"
                + "".join(_html_blocks(b["blocks"]))
                + "</details>"
            )
    return out


def to_html(d: dict[str, Any]) -> str:
    """One self-contained HTML page (inline CSS, images as base64 data URIs, no script, nothing
    fetched); every text is escaped (:func:`tuneproof.ui.html_text`). The first section is the first
    screen; the links to every section follow it."""
    e = _html
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><title>{e(d["title"])}</title>',
        f"<style>{CSS}</style></head><body>",
        f"<h1>{e(d['title'])}</h1>",
    ]
    nav = (
        "<nav>details: " + "".join(f'<a href="#{e(s["id"])}">{e(s["title"])}</a>' for s in d["sections"][1:]) + "</nav>"
    )
    for i, s in enumerate(d["sections"]):
        out.append(f'<section id="{e(s["id"])}"><h2>{e(s["title"])}</h2>')
        out += _html_blocks(s["blocks"])
        out.append("</section>")
        if i == 0:
            out.append(nav)
    out.append("</body></html>")
    return "\n".join(out) + "\n"
