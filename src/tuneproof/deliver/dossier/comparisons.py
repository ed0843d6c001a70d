"""Paired comparisons with the baseline, per-class tables, confusions and their plots."""

from __future__ import annotations

from tuneproof.deliver.dossier.blocks import _ci, _fig, _paragraph, _table, not_completed
from tuneproof.deliver.dossier.evidence import _Evidence, _kind_of
from tuneproof.deliver.limits import (
    PER_FIELD_METRIC,
    per_class_metric,
)
from tuneproof.deliver.plots import confusion, metric_bars
from tuneproof.evaluation.screen import correction_line, fmt_p, guard_lines, metric_short
from tuneproof.tasks import get_task
from tuneproof.ui import capped


def _control_blocks(r: dict) -> list[dict]:
    """The candidate against each control (the baseline, each few-shot control): the success metric paired, its
    95% CI, the McNemar counts, the success verdict against it; and the control the verdict was judged against
    (:mod:`tuneproof.evaluation.controls`). Nothing for a comparison with the baseline alone."""
    controls = r.get("controls") or {}
    if len(controls) < 2:
        return []
    judged = r.get("judged_control") or {}
    rows = []
    for rid, b in controls.items():
        s, c = b.get("success") or {}, b.get("counts") or {}
        rows.append(
            [
                b.get("label"),
                rid + (" (judged against)" if rid == judged.get("run") else ""),
                s.get("base"),
                s.get("cand"),
                s.get("delta"),
                _ci(s.get("ci")),
                f"{c.get('fixed')} / {c.get('broken')}",
                fmt_p((b.get("mcnemar") or {}).get("p_value")),
                s.get("verdict"),
            ]
        )
    metric = next((b.get("success") or {}).get("metric") for b in controls.values())
    blocks = [
        _table(
            [
                "control",
                "run",
                f"{metric}: control",
                "candidate",
                "delta",
                "95% CI",
                "fixed / broken",
                "McNemar p",
                "success",
            ],
            rows,
        ),
        _paragraph(f"the success criterion was judged against {judged.get('run')}: {judged.get('why')}."),
    ]
    if r.get("control_reason"):
        blocks.append({"type": "strong", "text": r["control_reason"]})
    return blocks


def _comparisons(ev: _Evidence, plots: bool) -> list[dict]:
    compares = [r for r in ev.runs if r.kind == "compare" and r.status == "completed"]
    if not compares:
        return not_completed(ev, "compare", "tuneproof compare RUN")
    blocks: list[dict] = []
    task = ev.ctx.task
    for c in compares:
        data = ev.json(c.id, "compare.json") or {}
        ref = data.get("baseline")
        kind = _kind_of(ev, ref)
        for cid, r in (data.get("candidates") or {}).items():
            cnt = r.get("counts", {})
            h = ev.headline
            if kind != "baseline":
                title = f"{cid} vs candidate {ref} ({c.id}; {kind} run {ref} is not a baseline: not the verdict)"
            else:
                head = h is not None and h.compare.id == c.id and h.cid == cid
                title = f"{cid} vs baseline {ref} ({c.id})" + ("; the verdict" if head else "")
            blocks.append({"type": "strong", "text": title})
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
            blocks += _control_blocks(r)
            pc, pf = r.get("per_class") or {}, r.get("per_field") or {}
            cm = per_class_metric(task)
            if pc:
                blocks += per_class_blocks(pc, cm, _failing_items(r, "per_class"), _corrected_guard(r))
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


def _corrected_guard(r: dict) -> dict | None:
    """The first per-class guard verdict that carries per-class tests (``correction``), or None."""
    return next(
        (
            v
            for v in r.get("verdicts") or []
            if str(v.get("metric", "")).startswith("per_class") and v.get("correction")
        ),
        None,
    )


def per_class_blocks(pc: dict, metric: str, failing: set[str], guard: dict | None = None) -> list[dict]:
    """The per-class table sorted by delta (most negative first): classes that fail a guard or whose
    metric changed come first; with more than :data:`FOLD_CLASSES_OVER` classes the unchanged
    rest is folded (``details``).

    With ``guard`` (a per-class guard's verdict that carries ``correction``, see
    :func:`tuneproof.evaluation.compare.judge`), a paragraph says which multiplicity correction the
    verdict used, and each judged class gets its exact McNemar p-value, Holm-adjusted p, BH q-value,
    its verdict without the correction and the verdict the guard used."""
    items = {it["name"]: it for it in (guard or {}).get("items") or []}

    def row(k: str) -> list:
        v = pc[k].get(metric) or {}
        out = [
            k,
            v.get("base"),
            v.get("cand"),
            v.get("delta"),
            _ci(v.get("ci")),
            v.get("support"),
            "fails a guard" if k in failing else "",
        ]
        if guard is not None:
            it = items.get(k) or {}
            out += [
                *(fmt_p(it.get(x)) if x in it else "" for x in ("p_value", "p_holm", "q_bh")),
                "yes" if it.get("moved_bh") else "",
                it.get("verdict_uncorrected", ""),
                it.get("verdict", ""),
            ]
        return out

    def key(k: str):
        d = (pc[k].get(metric) or {}).get("delta")
        return (d is None, d if d is not None else 0.0, k)

    cols = ["class", f"{metric} baseline", f"{metric} candidate", "delta", "95% CI", "support", "guard"]
    head: list[dict] = []
    if guard is not None:
        cols += ["McNemar p", "Holm p", "BH q", "moved (BH)", "uncorrected", "verdict"]
        head.append(_paragraph(f"{guard.get('name')}: {correction_line(guard)}."))
        head.append(_paragraph(f"Per-class test: {guard['correction'].get('test')}."))
    changed = sorted((k for k in pc if k in failing or ((pc[k].get(metric) or {}).get("delta") or 0.0) != 0.0), key=key)
    rest = sorted((k for k in pc if k not in changed), key=key)
    if len(pc) <= FOLD_CLASSES_OVER or not rest:
        return head + [_table(cols, [row(k) for k in changed + rest])]
    out = head + [
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
