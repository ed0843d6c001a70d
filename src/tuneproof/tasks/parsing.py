"""Parsing model outputs and targets: strict JSON (RFC 8259), with the code-fence rule of docs/CASES.md C16.

Shared by every task kind (:mod:`tuneproof.tasks`) and the data check.
"""

from __future__ import annotations

import ast
import json
import math
import re
from typing import Any

import numpy as np

_FENCE = re.compile(r"^```[A-Za-z0-9_+.-]*[ \t]*\r?\n(?P<body>.*?)\r?\n?[ \t]*```$", re.DOTALL)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json_output(text: str | None, allow_fenced: bool = False) -> tuple[Any, str | None]:
    """Parse a model output (or a target) as strict JSON.

    The text is stripped of surrounding whitespace and parsed with ``json.loads``; ``NaN`` /
    ``Infinity`` are rejected (not JSON per RFC 8259). Python-literal style
    (``{'a': True}``) is invalid. Output wrapped in a Markdown code fence
    (```` ```json ... ``` ````) is invalid unless ``allow_fenced`` (docs/CASES.md C16), in which case
    the fence is removed first.

    Args:
        text: the raw output; ``None`` counts as empty.
        allow_fenced: accept one surrounding code fence (study key ``eval.allow_fenced_json``).

    Returns:
        ``(obj, None)`` when valid (``obj`` may itself be ``None`` for the JSON ``null``), or
        ``(None, reason)``. ``reason`` starts with a kind followed by ``:``, one of
        ``empty``, ``code_fence``, ``python_literal``, ``not_json``, e.g.
        ``"python_literal: Expecting property name enclosed in double quotes at line 1 column 2
        (single quotes / True / None are Python, not JSON)"``.
    """
    s = (text or "").strip()
    if not s:
        return None, "empty: the output is empty"
    if s.startswith("```"):
        m = _FENCE.match(s)
        if not allow_fenced:
            return None, "code_fence: the output is wrapped in a ``` code fence (eval.allow_fenced_json is false)"
        if m is None:
            return None, "code_fence: unterminated or malformed ``` code fence"
        s = m.group("body").strip()
        if not s:
            return None, "empty: the code fence is empty"
    try:
        return json.loads(s, parse_constant=_reject_constant), None
    except json.JSONDecodeError as err:
        where = f"{err.msg} at line {err.lineno} column {err.colno}"
    except ValueError as err:  # NaN / Infinity
        return None, f"not_json: {err}"
    if len(s) <= 20_000:
        try:
            lit = ast.literal_eval(s)
        except Exception:  # noqa: BLE001 - any failure just means "not a Python literal either"
            lit = None
        if isinstance(lit, (dict, list, tuple)):
            return None, f"python_literal: {where} (single quotes / True / None are Python, not JSON)"
    return None, f"not_json: {where}"


def reason_kind(reason: str | None) -> str | None:
    """The kind of a parse failure reason (the part before the first ``:``), or None."""
    return None if reason is None else reason.split(":", 1)[0]


def finite_or_none(x: Any) -> Any:
    """A float for JSON artifacts: NaN / inf become None."""
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    return x
