"""Named, ordered cleaning rules applied to every example's text before anything else, then the
validation of what is left.

The ordered list of rule names is part of the data fingerprint, so changing a rule changes the
data version. The rules act *before* validation: a source with 10 empty texts loads when
``drop_empty`` is a rule (each drop is listed with its ``file:line``), and is refused, naming every
empty text, when it is not.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import replace

from tuneproof.data.examples import Example
from tuneproof.data.invisible import is_blank, remove_invisible
from tuneproof.data.rows import capped
from tuneproof.errors import TuneproofError

_WS = re.compile(r"\s+")

RULES = {
    "strip": lambda t: t.strip(),
    "collapse_whitespace": lambda t: _WS.sub(" ", t),
    "nfkc": lambda t: unicodedata.normalize("NFKC", t),
    "remove_invisible": remove_invisible,
}


def clean(examples: list[Example], rules: list[str]) -> tuple[list[Example], list[dict[str, str]]]:
    """Apply ``rules`` in order to each text (and to the earlier user turns of chat data).
    ``drop_empty`` drops examples whose text shows nothing after the other rules: empty, or only
    whitespace and invisible characters (``"\u200b"``, :func:`tuneproof.data.invisible.is_blank`).
    ``remove_invisible`` deletes zero-width and other invisible characters (:mod:`tuneproof.data.invisible`).

    Returns ``(kept, dropped)``; ``dropped`` is ``[{"id", "source", "rule"}]`` in input order
    (``source`` is the example's ``file:line``).
    """
    kept, dropped = [], []
    for ex in examples:
        text = _apply(ex.text, rules)
        if "drop_empty" in rules and is_blank(text):
            dropped.append({"id": ex.id, "source": ex.source or ex.id, "rule": "drop_empty"})
            continue
        # chat data: the earlier user turns are inputs too, cleaned alike (system and assistant turns as written)
        context = [dict(t, content=_apply(t["content"], rules)) if t["role"] == "user" else t for t in ex.context]
        if text != ex.text or context != ex.context:
            ex = replace(ex, text=text, context=context)
        kept.append(ex)
    return kept, dropped


def _apply(text: str, rules: list[str]) -> str:
    for name in rules:
        if name in RULES:
            text = RULES[name](text)
    return text


def validate(examples: list[Example]) -> None:
    """Refuse empty texts left after cleaning (all of them named, past 20 in a file the error names).

    Raises:
        TuneproofError: at least one example's text shows nothing (empty, whitespace or invisible
            characters only, such as a lone U+200B ZERO WIDTH SPACE).
    """
    empty = [ex.source or ex.id for ex in examples if is_blank(ex.text)]
    if empty:
        shown = capped(empty, "empty-texts")
        raise TuneproofError(
            f"{len(empty)} empty text(s): {shown}", hint="add drop_empty to data.cleaning, or fix the data"
        )


def dropped_summary(dropped: list[dict[str, str]]) -> str:
    """The data check line, e.g. ``"10 empty texts dropped: a.csv:3, a.csv:7, ..."``; all listed."""
    if not dropped:
        return "empty texts dropped: none"
    return f"{len(dropped)} empty texts dropped: " + ", ".join(d["source"] for d in dropped)
