"""A token-level view of what is trained: each token's text, id, whether it is supervised, the
target it is scored against, special tokens made visible and the truncation point marked; for
sequence classification the class index and name the head is trained on.

It renders :class:`~tuneproof.data.preprocess.Encoded` objects, i.e. the output of the very
code path the trainer uses; nothing is re-tokenised here.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
from rich.text import Text

from tuneproof.data.examples import Example
from tuneproof.data.preprocess import IGNORE_INDEX, Encoded, visible
from tuneproof.ui import html_text, visible_text

#: shown for a byte-level token that only completes the character(s) shown before it (see :func:`readable_tokens`)
CONTINUES = "＋"
LEGEND_CAUSAL = (
    "legend: dim = prompt (not in the loss); green = supervised (in the loss); magenta = special token; '|' between "
    "tokens; 'scored' lists each supervised position as input token → the target token its logits are scored against; "
    f"{CONTINUES} = a token that completes the character before it (byte-level BPE splits some characters)"
)
LEGEND_CLS = (
    "legend: every token is input (dim; no token is scored); the classification head is trained on the class index "
    "shown as 'class K = name'; magenta = special token; '|' between tokens"
)


def choose_examples(examples: list[Example], encoded: list[Encoded], per_category: int, seed: int = 0) -> list[int]:
    """Indices of exactly ``per_category`` examples of each category (seeded; fewer when a
    category has fewer), or ``per_category`` in total when no example has a category. The
    longest example overall is always one of them (it replaces one pick of its category).
    Categories in sorted order, examples in input order within one."""
    rng = np.random.default_rng(seed)
    by_cat: dict[str | None, list[int]] = defaultdict(list)
    for i, ex in enumerate(examples):
        by_cat[ex.label].append(i)
    longest = max(range(len(encoded)), key=lambda i: encoded[i].full_length) if encoded else None
    chosen: list[int] = []
    for cat in sorted(by_cat, key=lambda c: (c is None, str(c))):
        idx = by_cat[cat]
        picks = sorted(rng.choice(idx, size=min(per_category, len(idx)), replace=False).tolist())
        if longest is not None and examples[longest].label == cat and longest not in picks:
            picks = sorted(picks[:-1] + [longest]) if len(picks) == per_category else sorted(picks + [longest])
        chosen += picks
    return chosen


#: tokens one character may span at most: UTF-8 takes up to 4 bytes, a byte-level token at least one
_MAX_SPLIT = 4


def readable_tokens(ids: list[int], tokenizer) -> list[str]:
    """Each token's text, readable: a byte-level BPE token holds bytes, and one character of
    Vietnamese, Chinese or an emoji can be split over several tokens, each of which decodes alone
    to ``U+FFFD`` (``�``). Such a run is decoded together: its first token shows the whole
    character(s), each following token of the run shows :data:`CONTINUES` (so the token
    boundaries stay visible). Special tokens show as written (``<|im_end|>``); a run that no
    following tokens complete (truly invalid bytes) keeps ``�``.

    Returns one string per id, in order.
    """
    special = set(tokenizer.all_special_ids)
    out: list[str] = []
    i = 0
    while i < len(ids):
        if ids[i] in special:
            out.append(tokenizer.convert_ids_to_tokens(ids[i]))
            i += 1
            continue
        alone = tokenizer.decode([ids[i]])
        end = i + 1
        if "\ufffd" in alone:
            for j in range(i + 2, min(len(ids), i + 1 + _MAX_SPLIT) + 1):
                if ids[j - 1] in special:
                    break
                if tokenizer.decode(ids[i:j]).count("\ufffd") < alone.count("\ufffd"):
                    end = j
                    if "\ufffd" not in tokenizer.decode(ids[i:j]):
                        break
        if end == i + 1:
            out.append(alone)
        else:
            out += [tokenizer.decode(ids[i:end])] + [CONTINUES] * (end - i - 1)
        i = end
    return out


def token_rows(enc: Encoded, tokenizer) -> list[dict]:
    """One row per position: ``pos, id, text, special, supervised, scored_against``.

    ``text`` is the token made readable (:func:`readable_tokens`: byte-level pieces of one
    character merged). ``scored_against`` is the token the logits at this position are trained to
    predict (the label of the next position, after the causal shift), as readable, or None.
    """
    special = set(tokenizer.all_special_ids)
    texts = readable_tokens(list(enc.input_ids), tokenizer)
    rows = []
    for t, tid in enumerate(enc.input_ids):
        nxt = enc.labels[t + 1] if t + 1 < len(enc.labels) else IGNORE_INDEX
        if nxt == IGNORE_INDEX:
            against = None
        elif t + 1 < len(enc.input_ids) and enc.input_ids[t + 1] == nxt:
            against = texts[t + 1]
        else:
            against = readable_tokens([nxt], tokenizer)[0]
        rows.append(
            {
                "pos": t,
                "id": tid,
                "text": texts[t],
                "special": tid in special,
                "supervised": bool(enc.labels) and enc.labels[t] != IGNORE_INDEX,
                "scored_against": against,
            }
        )
    return rows


def scored_pairs(rows: list[dict]) -> list[str]:
    """``"pos:input→target"`` for each position whose logits are scored (docs/CASES.md C2 kind: a shifted
    alignment shows as pairs that do not read as "this token, then the next")."""
    return [
        f"{r['pos']}:{visible(r['text'])}→{visible(r['scored_against'])}"
        for r in rows
        if r["scored_against"] is not None
    ]


def _visible(text: str) -> str:
    return visible(text)


def class_line(enc: Encoded, classes: list[str] | None) -> str:
    """``"class 3 = 'card_arrival' (of 77)"``: what the head is trained on, or the fault."""
    n = f" (of {len(classes)})" if classes else ""
    if enc.class_index is None:
        return f"class: none, label {enc.category!r} is not a class{n}"
    return f"class {enc.class_index} = {enc.category!r}{n}"


def header(enc: Encoded, classes: list[str] | None = None) -> str:
    """The one-line summary of an example."""
    kept = len(enc.input_ids)
    who = visible_text(enc.id, one_line=True)
    if enc.category:  # an example without a category printed 'ex100 []'
        who += f" [{visible_text(enc.category, one_line=True)}]"
    if enc.class_index is not None or not enc.labels:
        return (
            f"{who} sequence classification: {enc.full_length} tokens ({kept} kept); "
            f"the head is trained on {class_line(enc, classes)}"
        )
    return (
        f"{who} prompt {enc.prompt_tokens} + answer {enc.answer_tokens} tokens; "
        f"{enc.n_supervised} supervised"
        + (f" ({enc.context_supervised} in earlier assistant turns)" if enc.context_supervised else "")
        + f"; length {enc.full_length}/{kept} kept"
    )


def prefix_diff_lines(enc: Encoded) -> list[str]:
    """Both strings and the character diff when the training prefix differs from the inference
    prompt (docs/CASES.md C3 kind); empty otherwise."""
    d = enc.prefix_diff
    if not d:
        return []
    return [
        f"training prefix differs from the inference prompt (first difference at character {d['first_difference']}):",
        f"  inference prompt: {visible(d['prompt'])}",
        f"  training prefix:  {visible(d['training_prefix'])}",
        f"  diff ([-prompt only-] {{+training only+}}): {visible_text(d['diff'], limit=None)}",
    ]


def render_rich(enc: Encoded, tokenizer, classes: list[str] | None = None):
    """A Rich ``Text``: prompt tokens dim, supervised tokens green, special tokens magenta, ``|``
    between tokens; then the scored pairs (causal LM) or the class line (classification)."""

    out = Text()
    out.append(header(enc, classes) + "\n", style="bold")
    rows = token_rows(enc, tokenizer)
    for r in rows:
        style = "bold green" if r["supervised"] else "dim"
        if r["special"]:
            style += " magenta"
        out.append(_visible(r["text"]), style=style)
        out.append("|", style="grey50")
    if enc.truncated:
        out.append(f"  ✂ truncated here: {enc.full_length - len(enc.input_ids)} tokens cut", style="bold red")
    pairs = scored_pairs(rows)
    if pairs:
        out.append("\n  scored: " + "  ".join(pairs), style="green")
    elif enc.class_index is not None or not enc.labels:
        out.append(f"\n  {class_line(enc, classes)}", style="bold green")
    for line in prefix_diff_lines(enc):
        out.append("\n  " + line, style="red")
    for n in enc.notes:
        out.append(f"\n  note: {n}", style="yellow")
    for f in enc.faults:
        out.append(f"\n  FAULT: {f}", style="bold red")
    return out


def render_html(items: list[tuple[Encoded, list[dict]]], title: str, classes: list[str] | None = None) -> str:
    """One self-contained HTML page (no external resources); every data text is escaped."""
    css = (
        "body{font-family:sans-serif;margin:2em} .tok{font-family:monospace;border:1px solid "
        "#ccc;margin:1px;padding:1px 2px;"
        "display:inline-block} .sup{background:#c8f7c5} .pro{color:#777} .spe{color:#a0a;font-weight:bold}"
        " .cut{color:#c00;font-weight:bold} .fault{color:#c00} "
        ".cls{background:#c8f7c5;font-weight:bold} h2{font-size:1em;margin-top:2em}"
    )
    is_cls = bool(items) and (items[0][0].class_index is not None or not items[0][0].labels)
    legend = (
        "every token is input (grey; no token is scored); the classification head is trained on the class index shown "
        "as 'class K = name' (green); purple: special tokens. Hover a token for its id."
        if is_cls
        else "green: supervised (loss computed); grey: prompt (ignored); purple: special tokens. "
        "Hover a token for its id and the token it is scored against."
    )
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>"
        f"{html_text(title)}</title><style>{css}</style></head><body>",
        f"<h1>{html_text(title)}</h1><p>{html_text(legend)}</p>",
    ]
    for enc, rows in items:
        parts.append(f"<h2>{html_text(header(enc, classes))}</h2><div>")
        for r in rows:
            cls = "tok " + ("sup" if r["supervised"] else "pro") + (" spe" if r["special"] else "")
            tip = f"pos {r['pos']} id {r['id']}" + (
                f" → scored against {r['scored_against']!r}" if r["scored_against"] is not None else ""
            )
            parts.append(f"<span class='{cls}' title='{html_text(tip)}'>{html_text(_visible(r['text']))}</span>")
        if enc.truncated:
            parts.append(f"<span class='cut'>✂ truncated: {enc.full_length - len(enc.input_ids)} tokens cut</span>")
        parts.append("</div>")
        if is_cls:
            parts.append(f"<p class='cls'>{html_text(class_line(enc, classes))}</p>")
        diff = prefix_diff_lines(enc)
        if diff:
            parts.append("<pre class='fault'>" + html_text("\n".join(diff), limit=None) + "</pre>")
        for n in enc.notes:
            parts.append(f"<p>note: {html_text(n)}</p>")
        for f in enc.faults:
            parts.append(f"<p class='fault'>FAULT: {html_text(f)}</p>")
    parts.append("</body></html>")
    return "".join(parts)
