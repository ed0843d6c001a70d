"""Characters that render as nothing: zero-width spaces and joiners, the byte-order mark, soft
hyphens, bidirectional marks, variation selectors, tag characters and control characters.

Two texts that differ only by such characters look identical on a screen and to a reader, so the
duplicate check (:func:`tuneproof.data.dedup.normalise`), the label audit and the empty-text rule
(:mod:`tuneproof.data.cleaning`) must see through them.

The set, :func:`invisible_code_points`, is the union of

- every code point of Unicode general category ``Cf`` (format: U+200B ZERO WIDTH SPACE, U+200C
  ZWNJ, U+200D ZWJ, U+FEFF BYTE ORDER MARK, U+00AD SOFT HYPHEN, U+2060 WORD JOINER, U+200E/F
  LRM/RLM, U+202A..U+202E and U+2066..U+2069 bidi controls, U+E0001..U+E007F tags, ...), as the
  running Python's ``unicodedata`` classifies them;
- the ``Default_Ignorable_Code_Point`` ranges of the Unicode Character Database
  (``DerivedCoreProperties.txt``, Unicode 15.1: code points "which should be rendered invisibly if
  not supported", which add e.g. U+034F COMBINING GRAPHEME JOINER, U+115F/U+1160/U+3164/U+FFA0
  Hangul fillers, U+180B..U+180F Mongolian selectors, U+FE00..U+FE0F and U+E0100..U+E01EF
  variation selectors) - ``unicodedata`` does not expose that property, so the ranges are listed;
- every category ``Cc`` control character that is not whitespace (``"\\x00"``, ``"\\x7f"``,
  ``"\\x1b"``); whitespace controls (tab, newline) stay, since they separate words.

Removing ZWNJ/ZWJ can join two Persian or Indic letter forms that a writer kept apart; for
comparing texts that is the wanted answer (the words are the same words).
"""

from __future__ import annotations

import functools
import sys
import unicodedata

# Default_Ignorable_Code_Point, Unicode 15.1 DerivedCoreProperties.txt (inclusive ranges).
DEFAULT_IGNORABLE_RANGES: tuple[tuple[int, int], ...] = (
    (0x00AD, 0x00AD),
    (0x034F, 0x034F),
    (0x061C, 0x061C),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180F),
    (0x200B, 0x200F),
    (0x202A, 0x202E),
    (0x2060, 0x206F),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0),
    (0xFFF0, 0xFFF8),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)


@functools.cache
def invisible_code_points() -> frozenset[int]:
    """The invisible code points (built once from the running ``unicodedata``, ~0.3 s)."""
    points = {cp for lo, hi in DEFAULT_IGNORABLE_RANGES for cp in range(lo, hi + 1)}
    for cp in range(sys.maxunicode + 1):
        cat = unicodedata.category(chr(cp))
        if cat == "Cf" or (cat == "Cc" and not chr(cp).isspace()):
            points.add(cp)
    return frozenset(points)


@functools.cache
def _deletion_table() -> dict[int, None]:
    return dict.fromkeys(invisible_code_points())


def remove_invisible(text: str) -> str:
    """``text`` without its invisible characters (see the module docstring for the set).

    ``"a\\u200bb\\ufeff"`` -> ``"ab"``; ``"co\\u00adoperate"`` -> ``"cooperate"``; tab and newline kept.
    """
    return text.translate(_deletion_table())


def is_blank(text: str) -> bool:
    """True when ``text`` shows nothing: only whitespace and invisible characters (``"\\u200b \\ufeff"``)."""
    return not remove_invisible(text).strip()
