"""The regular expressions a study file writes (``eval.answer_from``, ``eval.regex``), run with a time limit.

Python's :mod:`re` has no timeout: a pattern with nested repetition such as ``(a+)+$`` backtracks for
hours on a generation like ``"a" * 40 + "b"`` and hangs the evaluation with no message. The
`regex <https://pypi.org/project/regex/>`_ package (a dependency of transformers' tokenizers, pinned in
constraints.txt) reads the same syntax (its default V0 mode follows :mod:`re`) and takes a ``timeout`` per
call; past it the command stops with one line naming the study key and the pattern.
"""

from __future__ import annotations

from typing import Any

import regex

from tuneproof.errors import TuneproofError

DOTALL = regex.DOTALL
#: seconds one match of a study's pattern may take on one text (a sound pattern takes microseconds)
MATCH_TIMEOUT_S = 2.0


def pattern_error(pattern: str) -> str | None:
    """Why ``pattern`` is not a valid regular expression (the engine's message), or None when it is."""
    try:
        regex.compile(pattern)
    except regex.error as err:
        return str(err)
    return None


def compile_pattern(pattern: str, key: str) -> Any:
    """``pattern`` compiled (a ``regex`` pattern object, :mod:`re`'s interface).

    Raises:
        TuneproofError: not a valid regular expression, naming ``key`` (exit 2).
    """
    try:
        return regex.compile(pattern)
    except regex.error as err:
        raise TuneproofError(f"{key}: not a valid regular expression ({err})") from None


def _timed_out(key: str, pattern: str, text: str) -> TuneproofError:
    return TuneproofError(
        f"{key}: the regular expression {pattern!r} ran past {MATCH_TIMEOUT_S:g} s on one text of {len(text):,} "
        "characters (catastrophic backtracking: a repetition inside a repetition, like (a+)+)",
        hint=f"rewrite {key} without nested repetition (e.g. a+ instead of (a+)+), then run the command again",
    )


def search(pattern: str, text: str, key: str, flags: int = 0) -> Any:
    """``regex.search(pattern, text)`` within :data:`MATCH_TIMEOUT_S`; the match or None.

    Raises:
        TuneproofError: the search ran past the limit (names ``key``, the pattern and the text's length).
    """
    try:
        return regex.search(pattern, text, flags=flags, timeout=MATCH_TIMEOUT_S)
    except TimeoutError:
        raise _timed_out(key, pattern, text) from None


def fullmatch(compiled: Any, text: str, key: str) -> Any:
    """``compiled.fullmatch(text)`` (a :func:`compile_pattern` result) within :data:`MATCH_TIMEOUT_S`.

    Raises:
        TuneproofError: the match ran past the limit.
    """
    try:
        return compiled.fullmatch(text, timeout=MATCH_TIMEOUT_S)
    except TimeoutError:
        raise _timed_out(key, compiled.pattern, text) from None
