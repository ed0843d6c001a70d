"""A run in progress: its folder and the helpers that record evidence into it."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from tuneproof.io import (
    append_jsonl,
    write_json,
)
from tuneproof.registry.records import RunRecord, _now, iso

#: spend the rental's reserve, :mod:`tuneproof.recipes.rental`); the CLI clears it per command
CARRY: dict[str, Any] = {}


class Run:
    """A run in progress: its id, folder and helpers to record evidence into it.

    ``registry``: the :class:`~tuneproof.registry.Registry` that made it (typed ``Any``: the registry's module
    imports this one).
    """

    def __init__(self, registry: Any, record: RunRecord):
        self.registry = registry
        self.id = record.id
        self.kind = record.kind
        self.parent = record.parent
        self.dir = registry.runs_dir / record.id
        self.dir.mkdir(parents=True, exist_ok=True)
        self.summary: dict[str, Any] = {}
        self.log = logging.getLogger(f"tuneproof.run.{self.id}")

    def path(self, name: str) -> Path:
        return self.dir / name

    def write_json(self, name: str, obj: Any) -> Path:
        """Write a schema-versioned JSON artifact into the run folder, atomically."""
        return write_json(self.dir / name, obj)

    def metric(self, **row: Any) -> None:
        """Append one row (step, loss, lr, ...) to ``metrics.jsonl``, then hand it to the registry's
        step hooks (trackers logging while the run runs)."""
        row = {"time": round(_now(), 3), **row}
        append_jsonl(self.dir / "metrics.jsonl", row)
        self.registry._hooks(self.registry.step_hooks, self.id, row)

    def note(self, message: str) -> None:
        """Append a line to ``log.txt``."""
        path = self.dir / "log.txt"
        try:
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(f"{iso(_now())} {message}\n")
        except OSError as err:
            if err.filename is None:
                err.filename = str(path)
            raise

    def set(self, **fields: Any) -> None:
        """Set indexed fields: config_hash, data_fingerprint, eval_fingerprint."""
        self.registry._update(self.id, **fields)

    def update_summary(self, **values: Any) -> None:
        """Merge values into the run's summary (stored in the index and ``summary.json``)."""
        self.summary.update(values)
        self.registry._update(self.id, summary=json.dumps(self.summary, default=str))
        self.write_json("summary.json", {"run": self.id, "kind": self.kind, **self.summary})
