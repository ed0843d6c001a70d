"""The data check (step 3 of PROTOCOL.md): counts, audits, duplicates, token lengths."""

from __future__ import annotations

from tuneproof.deliver.dossier.blocks import NOT_RUN, _fig, _fmt, _paragraph, _table, flatten
from tuneproof.deliver.dossier.evidence import _Evidence
from tuneproof.deliver.plots import token_lengths
from tuneproof.modalities.modality import (
    SUGGESTED_MAX_LENGTH,
    TEXT_CHECK_LINES,
    TEXT_CHECKS,
    TOKEN_LENGTHS,
    Modality,
)


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
    blocks += _paraphrase_blocks(rep.get("semantic_dedup") if isinstance(rep, dict) else None)
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


def _paraphrase_blocks(sem: dict | None) -> list[dict]:
    """The paraphrase pass (``data.dedup.semantic``): one line per evaluated split, then its pairs
    (train text, evaluated text, cosine; at most :data:`DUPLICATES_LISTED`, highest cosine first, folded)."""
    if not isinstance(sem, dict) or not isinstance(sem.get("splits"), dict):
        return []
    st = sem.get("settings") or {}
    out = [
        _paragraph(
            f"paraphrases across splits ({st.get('encoder', 'sentence encoder')}, cosine >= {st.get('threshold')}, "
            f"policy {st.get('policy', 'report')}):"
        )
    ]
    rows, pairs = [], []
    for key, r in sem["splits"].items():
        rows.append(
            [key, r.get("n_eval"), r.get("eval_colliding"), r.get("paraphrase_only"), len(r.get("pairs") or [])]
        )
        pairs += [
            [key, p.get("id_train"), p.get("id_eval"), p.get("cosine"), p.get("text_train"), p.get("text_eval")]
            for p in (r.get("pairs") or [])[:DUPLICATES_LISTED]
        ]
    out.append(_table(["splits", "examples checked", "with a train paraphrase", "not lexical", "pairs"], rows))
    if pairs:
        out.append(
            {
                "type": "details",
                "summary": f"{len(pairs)} paraphrase pair(s), highest cosine first (all in data_check.json)",
                "blocks": [_table(["splits", "train", "evaluated", "cosine", "train text", "evaluated text"], pairs)],
            }
        )
    return out


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
