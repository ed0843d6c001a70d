"""A token-level view of what is trained: each token's text, id, whether it is supervised, the
target it is scored against, special tokens made visible and the truncation point marked.

It renders :class:`~tuneproof.data.preprocess.Encoded` objects, i.e. the output of the very
code path the trainer uses; nothing is re-tokenised here.
"""

from __future__ import annotations

import html
from collections import defaultdict

import numpy as np

from tuneproof.data.examples import Example
from tuneproof.data.preprocess import Encoded
from tuneproof.training.loss import IGNORE_INDEX


def choose_examples(examples: list[Example], encoded: list[Encoded], per_category: int, seed: int = 0) -> list[int]:
    """Indices of ``per_category`` examples of each category (seeded), plus the longest example overall."""
    rng = np.random.default_rng(seed)
    by_cat: dict[str | None, list[int]] = defaultdict(list)
    for i, ex in enumerate(examples):
        by_cat[ex.label].append(i)
    chosen: list[int] = []
    for cat in sorted(by_cat, key=lambda c: (c is None, str(c))):
        idx = by_cat[cat]
        chosen += sorted(rng.choice(idx, size=min(per_category, len(idx)), replace=False).tolist())
    longest = max(range(len(encoded)), key=lambda i: encoded[i].full_length)
    if longest not in chosen:
        chosen.append(longest)
    return chosen


def token_rows(enc: Encoded, tokenizer) -> list[dict]:
    """One row per position: ``pos, id, text, special, supervised, scored_against``.

    ``scored_against`` is the token the logits at this position are trained to predict (the label
    of the next position, after the causal shift), or None.
    """
    special = set(tokenizer.all_special_ids)
    rows = []
    for t, tid in enumerate(enc.input_ids):
        nxt = enc.labels[t + 1] if t + 1 < len(enc.labels) else IGNORE_INDEX
        rows.append({
            "pos": t, "id": tid, "text": tokenizer.convert_ids_to_tokens(tid) if tid in special else tokenizer.decode([tid]),
            "special": tid in special, "supervised": bool(enc.labels) and enc.labels[t] != IGNORE_INDEX,
            "scored_against": None if nxt == IGNORE_INDEX else tokenizer.decode([nxt]),
        })
    return rows


def _visible(text: str) -> str:
    return text.replace("\n", "\\n").replace("\t", "\\t").replace(" ", "·")


def render_rich(enc: Encoded, tokenizer):
    """A Rich ``Text``: prompt tokens dim, supervised tokens green, special tokens magenta, ``|`` between tokens."""
    from rich.text import Text  # noqa: PLC0415

    out = Text()
    out.append(f"{enc.id} [{enc.category}] prompt {enc.prompt_tokens} + answer {enc.answer_tokens} tokens; "
               f"{enc.n_supervised} supervised; length {enc.full_length}/{len(enc.input_ids)} kept\n", style="bold")
    for r in token_rows(enc, tokenizer):
        style = "bold green" if r["supervised"] else "dim"
        if r["special"]:
            style += " magenta"
        out.append(_visible(r["text"]), style=style)
        out.append("|", style="grey50")
    if enc.truncated:
        out.append(f"  ✂ truncated here: {enc.full_length - len(enc.input_ids)} tokens cut", style="bold red")
    for f in enc.faults:
        out.append(f"\n  FAULT: {f}", style="bold red")
    return out


def render_html(items: list[tuple[Encoded, list[dict]]], title: str) -> str:
    """One self-contained HTML page (no external resources); every data text is escaped."""
    css = ("body{font-family:sans-serif;margin:2em} .tok{font-family:monospace;border:1px solid #ccc;margin:1px;padding:1px 2px;"
           "display:inline-block} .sup{background:#c8f7c5} .pro{color:#777} .spe{color:#a0a;font-weight:bold}"
           " .cut{color:#c00;font-weight:bold} .fault{color:#c00} h2{font-size:1em;margin-top:2em}")
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>{css}</style></head><body>",
             f"<h1>{html.escape(title)}</h1><p>green: supervised (loss computed); grey: prompt (ignored); purple: special tokens. "
             "Hover a token for its id and the token it is scored against.</p>"]
    for enc, rows in items:
        parts.append(f"<h2>{html.escape(enc.id)} [{html.escape(str(enc.category))}]: prompt {enc.prompt_tokens} + answer "
                     f"{enc.answer_tokens} tokens, {enc.n_supervised} supervised</h2><div>")
        for r in rows:
            cls = "tok " + ("sup" if r["supervised"] else "pro") + (" spe" if r["special"] else "")
            tip = f"pos {r['pos']} id {r['id']}" + (f" → scored against {r['scored_against']!r}" if r["scored_against"] is not None else "")
            parts.append(f"<span class='{cls}' title='{html.escape(tip, quote=True)}'>{html.escape(_visible(r['text']))}</span>")
        if enc.truncated:
            parts.append(f"<span class='cut'>✂ truncated: {enc.full_length - len(enc.input_ids)} tokens cut</span>")
        parts.append("</div>")
        for f in enc.faults:
            parts.append(f"<p class='fault'>FAULT: {html.escape(f)}</p>")
    parts.append("</body></html>")
    return "".join(parts)
