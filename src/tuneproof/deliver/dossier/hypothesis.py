"""The hypothesis (step 1 of PROTOCOL.md) and its guards, as frozen and as judged."""

from __future__ import annotations

from tuneproof import hypothesis as hyp
from tuneproof.deliver.dossier.blocks import _paragraph, _table
from tuneproof.deliver.dossier.evidence import _Evidence
from tuneproof.io import sha256_json
from tuneproof.registry import iso
from tuneproof.ui import capped


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
        only += f" on eval.sets '{g['set']}' (vs the base's outputs)" if g.get("set") else ""
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
