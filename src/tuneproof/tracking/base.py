"""What a tracker receives: one run read back from its folder, in tracker-neutral form."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuneproof.io import flatten_keys

#: files never sent as artifacts (checkpoints can be GBs; the tracker state is ours)
SKIP_DIRS = ("checkpoints",)
SKIP_FILES = ("tracking.json",)
MAX_ARTIFACT_BYTES = 64 << 20  # 64 MiB: larger files stay in the run folder only

_KEY_RE = re.compile(r"[^A-Za-z0-9_\-./ ]")


class TrackerUnavailable(RuntimeError):
    """The tracker's package is missing (the message names the pip extra)."""


def clean_key(key: str) -> str:
    """A metric/param key every tracker accepts (MLflow: alphanumerics, ``_ - . / space``)."""
    return _KEY_RE.sub("_", key)[:250]


flatten = flatten_keys  # {"a": {"b": 1}, "c": [1, 2]} -> {"a.b": 1, "c": [1, 2]}


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))


@dataclass
class RunView:
    """One run as trackers see it.

    Attributes:
        run_id / kind / status / reason / parent: from the registry.
        params: flattened resolved config, values as strings (``training.learning_rate`` -> ``"0.0002"``).
        steps: per-step rows ``(step, {metric: float})`` from ``metrics.jsonl``, in step order.
        summary: flattened numeric values of ``summary.json`` (``summary.`` prefix).
        artifacts: files of the run folder to upload (checkpoints and files over 64 MiB left out).
    """

    run_id: str
    kind: str
    status: str
    reason: str | None
    parent: str | None
    params: dict[str, str] = field(default_factory=dict)
    steps: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    summary: dict[str, float] = field(default_factory=dict)
    artifacts: list[Path] = field(default_factory=list)

    @property
    def tags(self) -> dict[str, str]:
        tags = {"tuneproof.run_id": self.run_id, "tuneproof.kind": self.kind, "tuneproof.status": self.status}
        if self.reason:
            tags["tuneproof.reason"] = self.reason[:5000]
        if self.parent:
            tags["tuneproof.parent"] = self.parent
        return tags

    @classmethod
    def read(cls, record, run_dir: Path) -> RunView:
        run_dir = Path(run_dir)
        view = cls(record.id, record.kind, record.status, record.reason, record.parent)
        config = _read_json(run_dir / "config.json")
        if isinstance(config, dict):
            view.params = {
                clean_key(k): (v if isinstance(v, str) else json.dumps(v))[:6000] for k, v in flatten(config).items()
            }
        metrics = run_dir / "metrics.jsonl"
        if metrics.is_file():
            for i, line in enumerate(metrics.read_text(encoding="utf-8", errors="replace").splitlines()):
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut by a kill -9: the registry says how the run ended
                if not isinstance(row, dict):
                    continue
                step = row.get("step", i)
                values = {clean_key(k): float(v) for k, v in row.items() if k != "step" and is_number(v)}
                if values and isinstance(step, int):
                    view.steps.append((step, values))
        summary = _read_json(run_dir / "summary.json")
        if isinstance(summary, dict):
            view.summary = {clean_key(f"summary.{k}"): float(v) for k, v in flatten(summary).items() if is_number(v)}
        for path in sorted(run_dir.rglob("*")):
            rel = path.relative_to(run_dir)
            if not path.is_file() or rel.parts[0] in SKIP_DIRS or path.name in SKIP_FILES or path.name.startswith("."):
                continue
            if path.stat().st_size <= MAX_ARTIFACT_BYTES:
                view.artifacts.append(path)
        return view


def _read_json(path: Path) -> Any:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


class Tracker:
    """One tracker backend. ``mirror`` sends a :class:`RunView` and returns its new state.

    ``previous`` is what the last ``mirror`` of this run returned (``{}`` the first time): the
    tracker's own run id, ``steps_sent`` (how many step rows were sent) and ``params_sent``, so a
    second mirror adds only what is new. Errors propagate; :func:`tuneproof.tracking.mirror_run`
    turns them into a warning and a pending state.
    """

    name = "tracker"

    def mirror(self, view: RunView, previous: dict[str, Any]) -> dict[str, Any]:  # pragma: no cover - interface
        raise NotImplementedError
