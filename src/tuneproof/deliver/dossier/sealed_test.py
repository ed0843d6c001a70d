"""The log of every read of the reserved (sealed) test split."""

from __future__ import annotations

from tuneproof.deliver.dossier.blocks import _ci, _fmt, _paragraph, _table
from tuneproof.deliver.dossier.evidence import _Evidence
from tuneproof.evaluation.screen import metric_short
from tuneproof.registry import iso


def _test_log(ev: _Evidence) -> list[dict]:
    acc = ev.reg.test_accesses()
    if not acc:
        return [_paragraph("the reserved test split has not been read.")]
    rows = []
    for a in acc:
        gap = ev.missing.get(a["run"])
        if gap is not None:  # its evidence is gone: never its numbers as if present
            rows.append([a["run"], a["candidate"], iso(a["time"]), f"INCOMPLETE: {gap['what']}"])
            continue
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
