"""The one example type every stage shares."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any


def natural_key(text: str) -> tuple:
    """Sort key reading runs of digits as numbers: ``chats.jsonl:2`` before ``chats.jsonl:10`` (file, then
    numeric line), ``ex9`` before ``ex10``; fault lists are sorted by it."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", str(text)))


@dataclass(frozen=True)
class Example:
    """One example as loaded from a source, after field mapping and before tokenisation.

    Attributes:
        id: stable id, unique within a study (e.g. ``"PlayMusic/train/0012"`` or ``"train.csv:17"``).
        text: the input text shown to the model.
        label: the category (class label, or intent for extraction); used for stratified splits,
            per-category audits and per-class metrics. ``None`` when the task has no categories.
        target: the expected output text for generative tasks (for extraction: a JSON string);
            for classification it is the label text. ``None`` only for unlabeled data.
        source: where it came from, ``"path:line"`` or ``"path#index"``, for error messages.
        split: the split given by the source (``"train"``, ``"validation"``, ...) or ``None``.
        meta: free extra fields (e.g. SNIPS slot spans); not hashed into the fingerprint.
        context: chat data (``format: chat``): the prompt context before the final user turn, as
            ``[{"role", "content"}]``: the row's own system message first when it has one, then the
            earlier user, assistant and tool turns in order (an assistant's tool calls under ``tool_calls``).
            Empty for flat rows. Part of the data fingerprint, of the duplicate check's text (:meth:`dedup_text`)
            and of every rendered prompt.
    """

    id: str
    text: str
    label: str | None = None
    target: str | None = None
    source: str = ""
    split: str | None = None
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    context: list[dict[str, Any]] = field(default_factory=list, hash=False)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Example:
        return cls(**d)

    @property
    def system(self) -> str | None:
        """The row's own system message (chat data), else None (``eval.prompt.system`` applies)."""
        return self.context[0]["content"] if self.context and self.context[0]["role"] == "system" else None

    def dedup_text(self, shared: frozenset[str] = frozenset()) -> str:
        """The input the duplicate check compares: the earlier turns (each as ``role: content`` on
        its own line) and the final user turn; the system message is left out (like
        ``eval.prompt.system``, one shared by every row would make every pair a near-duplicate), and so
        are the turns in ``shared`` (:func:`shared_turns`: a preamble the dataset repeats in most rows).
        For flat rows: :attr:`text`."""
        turns = [line for line in self.turn_lines() if line not in shared]
        return "\n".join([*turns, self.text]) if turns else self.text

    def turn_lines(self) -> list[str]:
        """The earlier turns but the system message, each as ``role: content`` (a tool call: its JSON)."""
        return [
            f"{t['role']}: {t['content'] or json.dumps(t.get('tool_calls'), sort_keys=True)}"
            for t in self.context
            if t["role"] != "system"
        ]

    def target_json(self) -> Any:
        """The target parsed as JSON (raises ``json.JSONDecodeError`` when it is not strict JSON)."""
        return json.loads(self.target) if self.target is not None else None


#: an earlier turn written in at least this share of a dataset's rows is a preamble the dataset repeats (few-shot
#: demonstrations copied into every conversation): like a shared system message, it is left out of the duplicate
#: check's text, else every pair of rows would read as near-duplicates and the split would fail
SHARED_TURN_SHARE = 0.5


def shared_turns(examples: list[Example]) -> frozenset[str]:
    """The earlier turns (:meth:`Example.turn_lines`) that at least :data:`SHARED_TURN_SHARE` of ``examples``
    (and two or more) hold: what :meth:`Example.dedup_text` leaves out. Empty for flat rows."""
    counts: dict[str, int] = {}
    for e in examples:
        for line in set(e.turn_lines()):
            counts[line] = counts.get(line, 0) + 1
    return frozenset(line for line, c in counts.items() if c >= 2 and c >= SHARED_TURN_SHARE * len(examples))
