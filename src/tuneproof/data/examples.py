"""The one example type every stage shares."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any


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
    """

    id: str
    text: str
    label: str | None = None
    target: str | None = None
    source: str = ""
    split: str | None = None
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Example:
        return cls(**d)

    def target_json(self) -> Any:
        """The target parsed as JSON (raises ``json.JSONDecodeError`` when it is not strict JSON)."""
        return json.loads(self.target) if self.target is not None else None
