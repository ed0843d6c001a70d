"""What must not get worse outside the task, in the dossier (docs/eval-sets.md): per ``eval.sets`` entry of the
headline comparison, n, the agreement of the candidate's outputs with the baseline's with its 95% CI, the task's
metrics with the paired CI of the delta where the set has references, and a few disagreeing examples (prompt,
baseline output, candidate output); on the first screen, the set guard that decided the verdict."""

from __future__ import annotations

from tuneproof.deliver.dossier.blocks import _ci, _fmt, _paragraph, _table
from tuneproof.deliver.dossier.evidence import _Evidence, _latest_candidate

#: characters of a prompt or an output a disagreement row shows (the whole rows are in compare.json)
SHOWN_CHARS = 200


def set_guard_blocks(verdicts: list[dict]) -> list[dict]:
    """First-screen lines for the guards on an ``eval.sets`` entry that did not pass: a failing one decides the
    verdict (``the verdict fails on eval.sets 'general': agreement 0.7000 (7 of 10 ...) below floor 0.8``), an
    inconclusive one keeps it from passing cleanly. [] when every set guard passed (or there is none)."""
    out = []
    for v in verdicts:
        if not v.get("set") or v.get("verdict") == "pass":
            continue
        how = "the verdict fails on" if v.get("verdict") == "fail" else "inconclusive on"
        out.append({"type": "strong", "text": f"{how} eval.sets '{v['set']}': {v.get('name')}: {v.get('detail')}"})
    return out


def _clip(x) -> str:
    text = "-" if x is None else str(x)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + f"... ({len(text) - SHOWN_CHARS} more)"


def _eval_sets(ev: _Evidence) -> list[dict]:
    """The section: one table of every set (n, agreement and CI, disagreeing count), the reference metrics per set,
    and the first disagreeing examples of each."""
    c, entry, cid = _latest_candidate(ev)
    sets = (entry or {}).get("sets") or {}
    if not sets:
        names = ", ".join(s.name for s in ev.ctx.study.eval.sets)
        return [_paragraph(f"no comparison on the evaluation sets ({names}) yet (`tuneproof compare RUN`)")]
    blocks = [
        _paragraph(
            f"{cid} against baseline {ev.headline.baseline if ev.headline else '?'} ({c.id}); agreement: the share of "
            "a set's examples whose candidate answer equals the baseline's (the answer as scored, surrounding "
            "whitespace stripped); 95% percentile bootstrap intervals"
        )
    ]
    rows = []
    for name, s in sets.items():
        a = s.get("agreement") or {}
        rows.append(
            [
                name,
                s.get("n"),
                f"{_fmt(a.get('cand'))} ({a.get('agree')} of {a.get('n')})",
                _ci(a.get("ci")),
                s.get("disagreeing"),
                "yes" if s.get("references") else "no",
            ]
        )
    blocks.append(_table(["set", "n", "agreement", "95% CI", "disagreeing", "references"], rows))
    for name, s in sets.items():
        metrics = s.get("metrics") or {}
        if metrics:
            blocks.append(_paragraph(f"set '{name}': the task's metrics on its references"))
            blocks.append(
                _table(
                    ["metric", "baseline", "candidate", "delta [95% CI]"],
                    [
                        [m, e.get("base"), e.get("cand"), f"{_fmt(e.get('delta'))} {_ci(e.get('ci'))}"]
                        for m, e in metrics.items()
                    ],
                )
            )
        shown = s.get("disagreements") or []
        if shown:
            blocks.append(
                _paragraph(
                    f"set '{name}': the first {len(shown)} of {s.get('disagreeing')} disagreeing examples (every "
                    f"output in runs/{cid}/sets/{name}/outputs.jsonl)"
                )
            )
            blocks.append(
                _table(
                    ["id", "prompt", "baseline output", "candidate output"],
                    [[d.get("id"), _clip(d.get("input")), _clip(d.get("base")), _clip(d.get("cand"))] for d in shown],
                )
            )
    return blocks
