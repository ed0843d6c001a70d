"""Named, ordered cleaning rules applied to every example's text before anything else.

The ordered list of rule names is part of the data fingerprint, so changing a rule changes the
data version.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import replace

from tuneproof.data.examples import Example

_WS = re.compile(r"\s+")

RULES = {
    "strip": lambda t: t.strip(),
    "collapse_whitespace": lambda t: _WS.sub(" ", t),
    "nfkc": lambda t: unicodedata.normalize("NFKC", t),
}


def clean(examples: list[Example], rules: list[str]) -> tuple[list[Example], list[str]]:
    """Apply ``rules`` in order to each text. ``drop_empty`` drops examples whose text is empty after
    the other rules. Returns ``(kept, dropped_ids)``."""
    kept, dropped = [], []
    for ex in examples:
        text = ex.text
        for name in rules:
            if name in RULES:
                text = RULES[name](text)
        if "drop_empty" in rules and not text.strip():
            dropped.append(ex.id)
            continue
        kept.append(replace(ex, text=text) if text != ex.text else ex)
    return kept, dropped
