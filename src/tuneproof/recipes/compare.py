"""Recipe ``compare``: candidates against the baseline, example by example (docs/PROTOCOL.md step 2).

Features:
- never judges a baseline or candidate evaluation that did not complete (interrupted, failed, invalid,
  outputs missing or short): ``r0005 was interrupted at example 8 of 12; evaluate again`` (exit 3, with or
  without ``--allow-different-procedure``; :func:`tuneproof.evaluation.outputs.check_complete`);
- refuses runs whose evaluation procedure differs (names the differing part; ``--allow-different-procedure``
  marks the comparison instead), flags a data fingerprint that differs from the baseline's;
- paired counts (fixed / broken / unchanged) and McNemar's exact test on the per-example rule of the
  success metric (basis named; exact-match counts as a second line), paired bootstrap intervals of
  every metric delta, per-class and per-field deltas, concentration of the gain, a candidate that
  predicts one class for most examples;
- the success criterion's gain judged above max(min_gain, noise floor): the floor is the larger of both runs'
  measured spreads over their ``eval.repeat`` repeats (``noise.json``; not measured without repeats: min_gain
  alone); the screen and ``compare.json`` say which threshold applied and why, and the per-example flips;
- the success criterion and guards of the hypothesis judged: pass / fail / inconclusive / not
  measurable, against the hypothesis frozen with the first train run (``hypothesis.frozen.json``);
  when the study file's hypothesis differs, the change is shown key by key and both verdicts are
  given; ``--use-edited-hypothesis REASON`` judges against the edited one (the reason is recorded
  in ``compare.json`` and ``hypothesis.overrides.jsonl``, and shown in the dossier);
- ``eval.sets``: per set, the agreement of the candidate's outputs with the baseline's and, where the set has
  references, the task's metrics with paired bootstrap CIs (``compare.json``'s ``sets``), judged by the guards
  that name a set (``hypothesis.guards[].set``, docs/eval-sets.md).
"""

from __future__ import annotations

from typing import Any

from tuneproof import hypothesis as hyp
from tuneproof.context import StudyContext
from tuneproof.errors import CheckFailed, TuneproofError
from tuneproof.evaluation.compare import paired_compare
from tuneproof.evaluation.controls import (
    control_block,
    control_kind,
    control_label,
    control_lines,
    few_shot_controls,
    judge_against_control,
    latest_plain_baseline,
    strongest_control,
)
from tuneproof.evaluation.eval_sets import compare_sets, set_lines
from tuneproof.evaluation.fingerprint import diff_fingerprints
from tuneproof.evaluation.noise import comparison_floor, flips_text, noise_decided_text, read_noise
from tuneproof.evaluation.outputs import SET_OUTPUTS_KEY, check_complete
from tuneproof.evaluation.recording import load_outputs
from tuneproof.evaluation.screen import fmt_p, guard_lines, metric_short
from tuneproof.io import read_json
from tuneproof.models.identity import compare_recorded
from tuneproof.tasks import task_config
from tuneproof.ui import console, fmt, heartbeat, table, user_text


def resolve_candidate(ctx: StudyContext, run_id: str) -> str:
    """An evaluation-like run for ``run_id``: itself, or the latest completed eval of a train run."""
    rec = ctx.registry.get(run_id)
    if rec.kind in ("eval", "baseline", "test"):
        return rec.id
    if rec.kind == "train":
        evals = [r for r in ctx.registry.list(kind="eval", status="completed") if r.parent == rec.id]
        if not evals:
            raise TuneproofError(
                f"train run {rec.id} has no completed eval run", hint=f"run `tuneproof eval {rec.id}` first"
            )
        return evals[-1].id
    raise TuneproofError(
        f"run {rec.id} is a {rec.kind} run; compare takes baseline/eval runs (or a train run with an eval)",
        hint="name a baseline or eval run (`tuneproof runs` lists them with their kind)",
    )


def _paired(
    ctx: StudyContext, base_out: list, out: list, view: dict, noise: dict | None = None, recs: tuple | None = None
) -> dict:
    """The paired comparison scored and judged under one hypothesis view (frozen or edited); ``noise``: both
    runs' noise floors (:func:`tuneproof.evaluation.noise.comparison_floor`); ``recs`` (``(baseline record,
    candidate record)``) adds the comparison on each of the study's ``eval.sets`` that both runs recorded
    (:func:`tuneproof.evaluation.eval_sets.compare_sets`)."""
    sets = None
    if recs is not None and ctx.study.eval.sets:
        recorded = [set((r.summary or {}).get(SET_OUTPUTS_KEY) or {}) for r in recs]
        names = [s.name for s in ctx.study.eval.sets if all(s.name in got for got in recorded)]
        sets = compare_sets(
            ctx.registry.runs_dir,
            *recs,
            names,
            task=ctx.task,
            required_fields=view["required_fields"],
            eval_cfg=hyp.eval_for(view, ctx.study.eval),
            iterations=ctx.study.eval.bootstrap_iterations,
            seed=ctx.study.eval.seed,
            labels=task_config(ctx).labels,
        )
    result = paired_compare(
        base_out,
        out,
        ctx.task,
        required_fields=view["required_fields"],
        eval_cfg=hyp.eval_for(view, ctx.study.eval),
        hypothesis=hyp.as_hypothesis(view),
        iterations=ctx.study.eval.bootstrap_iterations,
        seed=ctx.study.eval.seed,
        labels=task_config(ctx).labels,
        noise=noise,
        sets=sets,
    )
    result["hypothesis_hash"], result["scoring"] = hyp.view_hash(view), hyp.scoring(view)
    return result


def check_same_base(ctx: StudyContext, base_rec, rec) -> None:
    """Refuse a candidate whose train run started from other base weights (or config.json) than
    the baseline evaluated: the sha256 recorded in both runs' ``base.json`` (docs/CASES.md C13). Runs
    recorded without ``base.json`` are not checked.

    Raises:
        TuneproofError: names both runs and both hashes.
    """
    train_id = rec.parent if rec.kind in ("eval", "test") else None
    paths = [ctx.registry.runs_dir / base_rec.id / "base.json", ctx.registry.runs_dir / (train_id or "") / "base.json"]
    if train_id is None or not all(p.is_file() for p in paths):
        return
    problems = compare_recorded(read_json(paths[0]), read_json(paths[1]))
    if problems:
        raise TuneproofError(
            f"baseline {base_rec.id} evaluated another base model than the one {train_id} (candidate {rec.id}) "
            f"was trained on: " + "; ".join(problems),
            hint="run `tuneproof baseline` again on the base the candidate was trained on, then compare",
        )


def run_compare(
    ctx: StudyContext,
    candidates: list[str],
    *,
    against: str | None = None,
    allow_different_procedure: bool = False,
    use_edited_hypothesis: str | None = None,
) -> str:
    """Compare each candidate with the baseline; returns the compare run id (``compare.json`` in it).

    Raises:
        CheckFailed: the baseline or a candidate did not complete its evaluation
            (:func:`tuneproof.evaluation.outputs.check_complete`), or the frozen hypothesis is not the one
            sealed before training (:func:`tuneproof.hypothesis.check_sealed`); exit 3, before any compare run.
        TuneproofError: see :func:`tuneproof.hypothesis.resolve` (empty reason, task changed after training).
    """
    if against is None:
        latest = latest_plain_baseline(ctx.registry)  # a few-shot control is shown beside it, never in its place
        if latest is None:
            raise TuneproofError("no completed baseline run", hint="run `tuneproof baseline` first")
        against = latest.id
    else:  # --against: an evaluation (a train run: its latest eval), never a compare or data-check run
        against = resolve_candidate(ctx, against)
    judging = hyp.resolve(ctx.study_dir, ctx.study, ctx.registry, use_edited_hypothesis)
    cand_ids = [resolve_candidate(ctx, c) for c in candidates]
    for rid in [against, *cand_ids]:  # an interrupted, incomplete or hand-edited evaluation record is never judged
        check_complete(ctx.registry, ctx.registry.check_record(rid))
    base_rec, base_out = load_outputs(ctx, against)
    base_noise = read_noise(ctx.registry.runs_dir / base_rec.id, base_rec)  # None: evaluated once
    base_efp = (ctx.registry.run_json(base_rec.id, "eval.json") or {}).get("fingerprint", {})
    controls, judged_id, judged_why = _controls(ctx, base_rec, base_efp, judging)
    results: dict[str, Any] = {}
    with ctx.registry.run("compare", parent=base_rec.id) as run, heartbeat("compare", "scoring") as beat:
        for cid in cand_ids:
            rec, out = load_outputs(ctx, cid)
            notes = []
            efp = (ctx.registry.run_json(rec.id, "eval.json") or {}).get("fingerprint", {})
            is_control = control_kind(base_rec) is not None or control_kind(rec) is not None
            differs = diff_fingerprints(base_efp, efp, controls=is_control) if base_efp and efp else ["unknown"]
            if differs:
                msg = f"{rec.id} was evaluated differently from baseline {base_rec.id} (differs: {', '.join(differs)})"
                if not allow_different_procedure:
                    raise TuneproofError(
                        msg,
                        hint="re-run `tuneproof eval` with the study's procedure, or pass "
                        "--allow-different-procedure (recorded)",
                    )
                notes.append("DIFFERENT PROCEDURE: " + msg)
            check_same_base(ctx, base_rec, rec)
            if rec.data_fingerprint and base_rec.data_fingerprint and rec.data_fingerprint != base_rec.data_fingerprint:
                notes.append(f"data fingerprint of {rec.id} differs from the baseline's")
            if control_kind(base_rec) is not None:  # never the verdict either (tuneproof.deliver.headline)
                notes.append(
                    f"{base_rec.id} ({control_label(base_rec)}) is a control, not the plain baseline: the guards are "
                    "judged against it here; the verdict of the hypothesis is `tuneproof compare RUN` without --against"
                )
            if base_rec.kind != "baseline":  # never the verdict (tuneproof.deliver.headline)
                notes.append(
                    f"{base_rec.id} ({base_rec.kind} run) is not a baseline: this compares two candidates; the "
                    "verdict of the hypothesis is judged against a baseline run (the dossier lists this as such)"
                )
            beat.update(f"{rec.id}: paired bootstrap ({ctx.study.eval.bootstrap_iterations} resamples)")
            noise = None
            cand_noise = read_noise(ctx.registry.runs_dir / rec.id, rec)
            if base_noise is not None or cand_noise is not None:
                noise = comparison_floor(base_noise, cand_noise, base_rec.id, rec.id)
            result = _paired(ctx, base_out, out, judging.primary, noise, (base_rec, rec))
            if judging.other is not None:
                alt = hyp.rejudge(result, judging.other)  # same scoring: judge the same numbers
                if alt is None:  # required fields or format rule changed: score again
                    other = _paired(ctx, base_out, out, judging.other, noise, (base_rec, rec))
                    alt = (other["verdicts"], other["overall"])
                result["alternative"] = {
                    "hypothesis": judging.other_name,
                    "hypothesis_hash": hyp.view_hash(judging.other),
                    "verdicts": alt[0],
                    "overall": alt[1],
                }
            _against_controls(
                ctx, rec.id, result, controls, out, efp, judging, (judged_id, judged_why), base_rec, notes
            )
            result["judged_against"] = judging.judged_against
            result["notes"] = notes
            results[rec.id] = result
            if rec.id == cand_ids[0]:
                print_judging(judging)
            _print(rec.id, base_rec.id, result, f"runs/{run.id}/compare.json", against=base_rec.kind)
        first = results[cand_ids[0]]
        overall = first.get("overall", {})
        alt = (first.get("alternative") or {}).get("overall") or {}
        both = (
            {f"verdict_{judging.other_name}": alt.get("verdict"), f"detail_{judging.other_name}": alt.get("detail")}
            if alt
            else {}
        )
        run.write_json(
            "compare.json",
            {
                "baseline": base_rec.id,
                "baseline_kind": base_rec.kind,  # another kind than baseline: two candidates, never the verdict
                "candidates": results,
                "hypothesis": judging.to_json(),
                "controls": [
                    {"run": r.id, "control": control_kind(r) or "baseline", "label": control_label(r)}
                    for r in [base_rec, *(c for c, _ in controls)]
                ],
                "judged_control": {"run": judged_id, "label": _label_of(ctx, judged_id), "why": judged_why},
                "verdict": overall.get("verdict"),
                "detail": overall.get("detail"),
                **both,
            },
        )
        run.update_summary(
            baseline=base_rec.id,
            candidates=cand_ids,
            verdict=overall.get("verdict"),
            verdicts={cid: r.get("overall", {}).get("verdict") for cid, r in results.items()},
            judged_against=judging.judged_against,
            judged_control=judged_id,
            hypothesis_changed=judging.changed,
            use_edited_hypothesis=judging.reason,
            **{k: v for k, v in both.items() if k.startswith("verdict_")},
        )
        hyp.record_override(ctx.study_dir, judging, "compare", run.id)
        return run.id


def _label_of(ctx: StudyContext, run_id: str) -> str:
    return control_label(ctx.registry.get(run_id))


def _controls(ctx: StudyContext, base_rec, base_efp: dict, judging) -> tuple[list, str, str]:
    """The other completed controls a candidate is shown against (the plain baseline when ``base_rec`` is not it,
    and the latest few-shot control per K), each with its outputs, and the control the success criterion is
    judged against with why: the frozen hypothesis's choice for ``success.against: strongest``
    (``hypothesis.frozen.json``'s ``against``), the strongest now when nothing is frozen yet, else ``base_rec``.

    Raises:
        CheckFailed: a control did not complete its evaluation (:func:`check_complete`).
        TuneproofError: the control the frozen hypothesis names is no longer in the registry.
    """
    setting = (judging.primary.get("success") or {}).get("against", hyp.AGAINST_DEFAULT)
    judged_id, why = base_rec.id, "hypothesis.success.against: baseline"
    if control_kind(base_rec) is not None:  # `--against` a few-shot control: not the plain baseline the key means
        why = (
            f"--against {base_rec.id} ({control_label(base_rec)}): the control named, not the verdict of the "
            "hypothesis (hypothesis.success.against: baseline is judged by `tuneproof compare RUN` without --against)"
        )
    if setting == "strongest":
        named = judging.against_control if judging.frozen is not None else None
        if named is None and judging.frozen is None:
            metric = (judging.primary.get("success") or {}).get("metric")
            named = strongest_control(ctx.registry, metric, base_efp) if metric else None
            when = "chosen now (nothing frozen yet: no train run)"
        else:
            when = "chosen when the hypothesis was frozen"
        if named and named.get("run"):
            judged_id = ctx.registry.get(named["run"]).id
            if judging.frozen is not None:
                _check_frozen_control(ctx, judged_id, named)
            why = (
                f"hypothesis.success.against: strongest: {named.get('label')} {judged_id} "
                f"({named.get('metric')} {named.get('value')}), {when}"
            )
        else:
            why = "hypothesis.success.against: strongest, but no control was recorded at freeze time: " + str(
                (named or {}).get("note") or "the hypothesis was frozen before the key existed"
            )
    plain = latest_plain_baseline(ctx.registry)
    runs = ([plain] if plain is not None else []) + few_shot_controls(ctx.registry)
    if judged_id not in [r.id for r in runs]:
        runs.append(ctx.registry.get(judged_id))
    out = []
    for rec in runs:
        if rec.id == base_rec.id:
            continue
        check_complete(ctx.registry, ctx.registry.check_record(rec.id))
        out.append((rec, load_outputs(ctx, rec.id)[1]))
    return out, judged_id, why


def _check_frozen_control(ctx: StudyContext, run_id: str, named: dict) -> None:
    """The control the frozen hypothesis judges the success criterion against (``success.against: strongest``)
    is still a completed evaluation. Evaluating the base model again never replaces it (a control evaluated later
    is never judged against), so "evaluate again" is no way out: the message names the frozen choice and the two
    that are.

    Raises:
        CheckFailed: (exit 3) the run is no longer completed (invalidated, its record or outputs missing or
            edited), naming it, ``hypothesis.frozen.json`` and what to do.
    """
    try:
        check_complete(ctx.registry, ctx.registry.check_record(run_id))
    except TuneproofError as err:
        raise CheckFailed(
            f"hypothesis.frozen.json: success.against: strongest judges the success criterion against "
            f"{named.get('label')} {run_id} ({named.get('metric')} {named.get('value')}, chosen when the hypothesis "
            f"was frozen), and it cannot be read: {err.message.removesuffix('; evaluate again')}",
            hint=f"restore {run_id}'s folder as recorded; or judge with the study file's hypothesis set to "
            "success.against: baseline (`tuneproof compare RUN --use-edited-hypothesis REASON`, recorded)",
        ) from None


def _against_controls(
    ctx: StudyContext,
    cid: str,
    result: dict,
    controls: list,
    out: list,
    efp: dict,
    judging,
    judged: tuple[str, str],
    base_rec,
    notes: list[str],
) -> None:
    """The candidate against each other control (paired, judged under the same view): ``result["controls"]``
    (:func:`tuneproof.evaluation.controls.control_block`, the compared baseline first), ``result["judged_control"]``;
    the success verdict judged against ``judged_id`` when it is not the compared baseline
    (:func:`tuneproof.evaluation.controls.judge_against_control`). A control evaluated by another procedure (its
    ``control`` part aside) is left out with a note, unless it is the judged one (refused); the candidate ``cid``
    itself is never its own control."""
    judged_id, why = judged
    blocks = {base_rec.id: control_block(base_rec, result)}
    for rec, cout in controls:
        if rec.id == cid:
            continue  # a control compared as a candidate is not its own control
        cfp = (ctx.registry.run_json(rec.id, "eval.json") or {}).get("fingerprint", {})
        differs = diff_fingerprints(cfp, efp, controls=True) if cfp and efp else ["unknown"]
        if differs:
            msg = f"control {rec.id} ({control_label(rec)}) was evaluated differently (differs: {', '.join(differs)})"
            if rec.id == judged_id:
                raise TuneproofError(
                    msg + "; the frozen hypothesis judges the success criterion against it",
                    hint="evaluate the candidate with the study's procedure (`tuneproof eval`)",
                )
            notes.append(msg + ": not compared")
            continue
        # the success criterion against a control is judged above the pair's own noise floor (eval.repeat)
        floors = [read_noise(ctx.registry.runs_dir / r.id, r) for r in (rec, ctx.registry.get(cid))]
        noise = comparison_floor(*floors, rec.id, cid) if any(f is not None for f in floors) else None
        blocks[rec.id] = control_block(rec, _paired(ctx, cout, out, judging.primary, noise))
    result["controls"] = blocks
    result["judged_control"] = {"run": judged_id, "label": blocks.get(judged_id, {}).get("label"), "why": why}
    if judged_id != base_rec.id and judged_id in blocks:
        judge_against_control(result, blocks[judged_id], blocks[judged_id]["label"], judged_id, base_rec.id)


def print_judging(judging) -> None:
    """The hypothesis change, key by key, and which hypothesis the verdict follows (nothing when unchanged)."""
    for line in judging.lines():
        console.print(
            user_text(line) if line.startswith("  ") else f"[bold yellow]{user_text(line)}[/]", soft_wrap=True
        )


def summary_lines(cid: str, bid: str, r: dict, against: str = "baseline") -> list[str]:
    """The plain-text lines of the compare screen above the metrics table: paired counts on the
    success metric's per-example rule (its basis named), the exact-match counts as a second line,
    and a candidate that predicts one class for most examples. ``against``: the kind of run ``bid`` is
    (another kind than ``baseline`` reads ``vs candidate``)."""
    c, basis = r["counts"], r.get("counts_basis") or {}
    role = "baseline" if against == "baseline" else "candidate"
    lines = [
        f"{cid} vs {role} {bid} on {r['n']} paired examples: fixed {c['fixed']}, broken {c['broken']}, "
        f"unchanged right {c['unchanged_right']}, unchanged wrong {c['unchanged_wrong']}; "
        f"McNemar exact p = {fmt_p(r['mcnemar']['p_value'])}"
    ]
    if basis:
        lines.append(f"  basis: {basis.get('metric') or 'per-example correct'}: {basis.get('description')}")
    cc = r.get("counts_correct")
    if cc and basis.get("rule") != "correct":
        lines.append(
            f"  on the per-example `correct` (exact match / right class): fixed {cc['fixed']}, broken {cc['broken']}, "
            f"unchanged right {cc['unchanged_right']}, unchanged wrong {cc['unchanged_wrong']}; "
            f"McNemar exact p = {fmt_p(r['mcnemar_correct']['p_value'])}"
        )
    succ = next((v for v in r.get("verdicts") or [] if v.get("kind") == "success"), None)
    th = (succ or {}).get("noise") or r.get("success_threshold")
    if succ and th:  # which threshold judged the gain, and why (eval.repeat)
        lines.append(f"  success threshold: {th['why']}")
        if succ.get("decided_by_noise_floor"):
            lines.append(f"  WARNING: {noise_decided_text(succ)}")
    flips = flips_text(r.get("noise"))
    if flips:
        lines.append(f"  {flips}")
    for who, key in (("candidate", "dominant"), ("baseline", "dominant_baseline")):
        d = r.get(key)
        if d and d.get("flagged"):
            lines.append(f"  WARNING: the {who} {d['detail']}")
    bm = r.get("base_metrics") or {}
    for metric, key in (("macro_f1", "macro_over"), ("intent_macro_f1", "intent_macro_over")):
        if bm.get(key) and metric in r.get("metrics", {}):
            lines.append(f"  {metric}: {bm[key]}")
    return lines


def _print(cid: str, bid: str, r: dict, where: str = "compare.json", against: str = "baseline") -> None:
    for line in summary_lines(cid, bid, r, against):
        console.print(user_text(line).replace("WARNING", "[yellow]WARNING[/]"), soft_wrap=True)
    rows = [
        [
            user_text(metric_short(m), one_line=True),
            fmt(v["base"]),
            fmt(v["cand"]),
            fmt(v["delta"]),
            "[" + ", ".join(fmt(x) for x in (v.get("ci") or [None, None])) + "]",
        ]
        for m, v in r["metrics"].items()
    ]
    console.print(
        table(
            "metrics (95% paired bootstrap CI of the delta)", ["metric", "baseline", "candidate", "delta", "CI"], rows
        )
    )
    for line in set_lines(r.get("sets") or {}):  # eval.sets: agreement and reference metrics per set
        console.print(user_text(line), soft_wrap=True)
    for v in r.get("verdicts", []):
        color = {"pass": "green", "fail": "red"}.get(v["verdict"], "yellow")
        lines = guard_lines(v, where)
        console.print(
            f"  [{color}]{v['verdict']:14s}[/] {user_text(v['name'], one_line=True)}: {user_text(lines[0])}",
            soft_wrap=True,
        )
        for line in lines[1:]:
            console.print(user_text(line), soft_wrap=True)
    if r.get("overall"):
        against = r.get("judged_against", "")
        console.print(
            "  overall"
            f"{' (' + against + ' hypothesis)' if against in ('frozen', 'edited') and r.get('alternative') else ''}: "
            f"[bold]{r['overall']['verdict']}[/] ({user_text(r['overall']['detail'])})",
            soft_wrap=True,
        )
    alt = r.get("alternative")
    if alt:
        console.print(f"  with the {alt['hypothesis']} hypothesis instead:")
        for v in alt["verdicts"]:
            console.print(f"    {v['verdict']:14s} {user_text(v['name'], one_line=True)}", soft_wrap=True)
        console.print(
            f"  overall ({alt['hypothesis']} hypothesis): [bold]"
            f"{alt['overall']['verdict']}[/] ({user_text(alt['overall']['detail'])})",
            soft_wrap=True,
        )
    for line in control_lines(r):
        console.print(user_text(line), soft_wrap=True)
    for n in r.get("notes", []):
        console.print(f"  [yellow]note[/]: {user_text(n)}", soft_wrap=True)
