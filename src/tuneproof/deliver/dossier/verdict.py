"""The headline: the first screen (Summary), the Verdict section with its criteria table, and the limits
observed on the latest candidate."""

from __future__ import annotations

from collections import Counter

from tuneproof.deliver.dossier.blocks import NOT_RUN, _ci, _fmt, _paragraph, _table
from tuneproof.deliver.dossier.delivery import _bundle, _rental_line
from tuneproof.deliver.dossier.eval_sets import set_guard_blocks
from tuneproof.deliver.dossier.evidence import (
    _RESCORE,
    _Evidence,
    _incomplete_block,
    _kind_of,
    _latest_candidate,
    missing_evidence,
)
from tuneproof.deliver.dossier.runs import _change_of, resumed_line
from tuneproof.deliver.headline import noise_lines, other_comparisons, stale_comparisons
from tuneproof.deliver.limits import (
    FIRST_SCREEN_LIMITS,
    limits_lines,
    observed_limits,
    summary_limits,
)
from tuneproof.evaluation.screen import guard_lines
from tuneproof.storage import safety_line
from tuneproof.ui import capped, capped_items


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
                f"({o.get('detail', '')}); {ev.headline.says}",
            }
        )
        blocks.append(criteria_table(verdicts))
        blocks += set_guard_blocks(verdicts)  # a guard on eval.sets that decided the verdict, with its numbers
        for who, key in (("candidate", "dominant"), ("baseline", "dominant_baseline")):  # one-class collapse
            if (first.get(key) or {}).get("flagged"):
                blocks.append({"type": "strong", "text": f"warning: the {who} {first[key]['detail']}"})
        decided, noise_notes = noise_lines(first, verdicts)  # eval.repeat: the noise floor, when measured
        if decided:
            blocks.append({"type": "strong", "text": decided})
        blocks += [_paragraph(line) for line in noise_notes]
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
    others = _other_lines(ev) + [
        f"{line}: not a verdict" for line in stale_comparisons(ev.runs, ev.json) if ev.headline is None
    ]
    if others:  # candidate vs candidate: listed as such, never the headline
        blocks.append({"type": "list", "items": capped_items(others, cap=3, where="section Comparisons")})
    items = [
        f"hypothesis: {h.get('behaviour')}; success: {succ.get('metric')} gains "
        f"at least {succ.get('min_gain')} over the baseline "
        f"(95% CI lower bound); {len(h.get('guards') or [])} guard(s)",
        f"study: {s.name} ({s.hypothesis.task}); base model: {s.model.base}"
        + (f" @ {s.model.revision}" if s.model.revision else ""),
    ]
    if cid:
        items.append(f"the candidate changed against the baseline: {_candidate_change(ev, cid)}")
    items += _resumed_candidates(ev, cid, exp)
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
    items += [line for line in [safety_line(ev.ctx.study_dir, ev.ctx.study.storage)] if line]  # storage.remote
    blocks.append({"type": "list", "items": items})
    lim = _observed(ev)
    if lim is not None:
        lines = summary_limits(lim[1])
        blocks.append(
            _paragraph(f"limits observed of {lim[0]} (at most {FIRST_SCREEN_LIMITS}; all of them in Limits observed):")
        )
        blocks.append({"type": "list", "items": lines or ["none observed"]})
    return blocks


def _trained_by(ev: _Evidence, run_id: str | None) -> str | None:
    """The train run behind ``run_id``: itself when it is one, else its parent when that is one (an eval run)."""
    rec = next((r for r in ev.runs if r.id == run_id), None)
    if rec is not None and rec.kind != "train":
        rec = next((r for r in ev.runs if r.id == rec.parent), None)
    return rec.id if rec is not None and rec.kind == "train" else None


def _resumed_candidates(ev: _Evidence, cid: str | None, exp) -> list[str]:
    """One line per train run behind the judged candidate (``cid``, its eval run) and the delivered one (the
    export's parent) that was interrupted and resumed (:func:`~tuneproof.deliver.dossier.runs.resumed_line`):
    its status alone says ``completed``."""
    ids = dict.fromkeys(t for t in (_trained_by(ev, cid), _trained_by(ev, exp.parent if exp else None)) if t)
    return [line for line in (resumed_line(ev, t) for t in ids) if line]


def _other_lines(ev: _Evidence) -> list[str]:
    """One line per comparison that is not against a baseline run (two candidates): what it compared and that
    it is no verdict of the hypothesis."""
    return [
        f"comparison {c.id}: {', '.join(cands) or '?'} vs {ref} ({_kind_of(ev, ref)} run, not a baseline): "
        "candidates compared with each other, not a verdict of the hypothesis"
        for c, ref, cands in other_comparisons(ev.runs, ev.json)
    ]


def criteria_table(verdicts: list[dict]) -> dict:
    """The first screen's table: one row per criterion (success, each guard) with its verdict, the
    numbers and, for a per-class / per-field guard, a note whose lists are capped
    (:func:`tuneproof.ui.capped`; every item is in ``compare.json``) and, for a per-class guard,
    which multiplicity correction decided (Holm, with the uncorrected verdict beside it)."""
    rows = []
    for v in verdicts:
        shown = guard_lines(v)[0] if v.get("items") else (v.get("detail") or "") if v.get("set") else ""
        corr = v.get("correction") or {}
        if corr.get("method") == "holm":  # the verdict used a multiplicity correction: say so, uncorrected beside
            unc = corr.get("failing_uncorrected") or []
            shown += (
                f"; decided with Holm over {corr.get('family_size')} classes (exact McNemar per class); "
                f"uncorrected: {corr.get('verdict_uncorrected')}" + (f", {len(unc)} failing" if unc else "")
            )
        elif corr and corr.get("failing_uncorrected"):
            shown += f"; no multiplicity correction over {corr.get('family_size')} classes"
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
            f"({ev.headline.says}; {against} hypothesis)",
        }
    ]
    blocks.append(
        {
            "type": "list",
            "items": [
                f"{v['name']}: {v['verdict']}" + (f" ({v['noise']['why']})" if v.get("noise") else "") for v in verdicts
            ],
        }
    )
    decided, _ = noise_lines(r, verdicts)
    if decided:
        blocks.append(_paragraph(decided))
    blocks += [_paragraph(line) for line in _resumed_candidates(ev, cid, None)]
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
