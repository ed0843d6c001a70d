"""What a tracker receives: one run read back from its folder, in tracker-neutral form, with the
names MLflow and W&B users know (``train/loss``, ``eval/field_f1``, ``field_f1/delta``).

- params: only the study keys that shape a run of this kind (:data:`PARAM_GROUPS`: a train run
  gets ``model.*``, ``method.*``, ``training.*``; a baseline ``model.*`` and ``eval.*``; a data
  check ``data.*``), flattened to dotted keys (``training.learning_rate``);
- per-step metrics: every numeric column of a ``metrics.jsonl`` row that has a ``step``, named
  ``<kind>/<column>`` (``train/loss``, ``train/learning_rate``, ``train/grad_norm``), at the
  row's own time;
- summary metrics: the scores of an evaluation (``eval/accuracy``, ``test/macro_f1``), a train
  run's totals (``train/final_loss``, ``train/tokens_per_s``), a comparison's paired deltas
  (``field_f1/delta``, ``field_f1/ci_low``, ``field_f1/ci_high``) and a data check's sizes;
- tags: ``tuneproof.run_id`` / ``kind`` / ``status`` / ``reason`` / ``parent``, a comparison's
  ``tuneproof.verdict`` and ``tuneproof.baseline``.
"""

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

#: study key groups sent as params, per run kind (what the run's result depends on)
PARAM_GROUPS: dict[str, tuple[str, ...]] = {
    "train": ("hypothesis.task", "model", "method", "training", "distributed"),
    "preflight": ("hypothesis.task", "model", "method", "training", "distributed"),
    "baseline": ("hypothesis.task", "model", "eval"),
    "eval": ("hypothesis.task", "model", "eval"),
    "test": ("hypothesis.task", "model", "eval"),
    "data-check": ("hypothesis.task", "data"),
    "compare": ("hypothesis",),
    "report": ("hypothesis",),
    "export": ("hypothesis.task", "model", "method"),
}

#: ``metrics.jsonl`` columns renamed to transformers' Trainer names (the rest keep theirs)
STEP_NAMES = {"lr": "learning_rate"}
#: a train run's summary values sent as metrics, and their names
TRAIN_SUMMARY = {
    "final_loss": "train/final_loss",
    "first_loss": "train/first_loss",
    "steps": "train/steps",
    "example_passes": "train/example_passes",
    "train_seconds": "train/runtime_s",
    "tokens_per_s": "train/tokens_per_s",
    "trainable": "train/trainable_params",
    "total_params": "train/total_params",
}
#: an evaluation's summary values (besides its scores) sent as metrics
EVAL_SUMMARY = {"n_eval": "examples", "eval_seconds": "runtime_s", "eval_examples_per_s": "examples_per_s"}

_KEY_RE = re.compile(r"[^A-Za-z0-9_\-./ ]")


class TrackerUnavailable(RuntimeError):
    """The tracker's package is missing (the message names the pip extra)."""


def import_tracker_package(name: str):
    """The tracker's package ``name`` (``wandb``, ``trackio``), imported on first use (not a dependency).

    Raises:
        TrackerUnavailable: it is not installed (the message names ``pip install <name>``).
    """
    import importlib  # noqa: PLC0415 - the tracker packages are optional

    try:
        return importlib.import_module(name)
    except ImportError as err:
        raise TrackerUnavailable(f"{name} is not installed: pip install {name}") from err


def clean_key(key: str) -> str:
    """A metric/param key every tracker accepts (MLflow: alphanumerics, ``_ - . / space``)."""
    return _KEY_RE.sub("_", key)[:250]


flatten = flatten_keys  # {"a": {"b": 1}, "c": [1, 2]} -> {"a.b": 1, "c": [1, 2]}


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))


def params_for(kind: str, config: dict[str, Any]) -> dict[str, str]:
    """The params a run of ``kind`` carries: the :data:`PARAM_GROUPS` of the resolved study
    ``config``, flattened, values as strings (lists and mappings as JSON; at most 6000 characters,
    MLflow's limit)."""
    flat = flatten(config)
    groups = PARAM_GROUPS.get(kind, ("hypothesis.task", "model"))
    return {
        clean_key(k): (v if isinstance(v, str) else json.dumps(v))[:6000]
        for k, v in flat.items()
        if any(k == g or k.startswith(g + ".") for g in groups)
    }


def step_metrics(kind: str, row: dict[str, Any]) -> tuple[int, int | None, dict[str, float]] | None:
    """``(step, time in ms or None, {name: value})`` of one ``metrics.jsonl`` row, or None when the
    row is not a step (no integer ``step``, no numeric column: a resume event)."""
    step = row.get("step")
    if not isinstance(step, int) or isinstance(step, bool):
        return None
    values = {
        clean_key(f"{kind}/{STEP_NAMES.get(k, k)}"): float(v)
        for k, v in row.items()
        if k not in ("step", "time") and is_number(v)
    }
    if not values:
        return None
    t = row.get("time")
    return step, (int(float(t) * 1000) if is_number(t) else None), values


def summary_metrics(kind: str, summary: dict[str, Any], run_dir: Path) -> tuple[dict[str, float], dict[str, str]]:
    """``(metrics, tags)`` of a run's summary (and, for a comparison, its ``compare.json``).

    Evaluations (baseline, eval: ``eval/``; test: ``test/``) give their scores; a train run the
    values of :data:`TRAIN_SUMMARY`; a comparison, per metric of its candidate against the baseline,
    ``<metric>/baseline``, ``<metric>/candidate``, ``<metric>/delta``, ``<metric>/ci_low`` and
    ``<metric>/ci_high`` (prefixed ``<candidate run>/`` when it compares several), plus the tags
    ``tuneproof.verdict``, ``tuneproof.verdict_detail`` and ``tuneproof.baseline``; a data check
    the split sizes and token lengths; any other kind its top-level numbers as ``<kind>/<key>``.
    """
    metrics: dict[str, float] = {}
    tags: dict[str, str] = {}
    if kind in ("baseline", "eval", "test"):
        prefix = "test" if kind == "test" else "eval"
        for k, v in (summary.get("metrics") or {}).items():
            if is_number(v):
                metrics[f"{prefix}/{k}"] = float(v)
        for k, name in EVAL_SUMMARY.items():
            if is_number(summary.get(k)):
                metrics[f"{prefix}/{name}"] = float(summary[k])
    elif kind == "train":
        metrics = {name: float(summary[k]) for k, name in TRAIN_SUMMARY.items() if is_number(summary.get(k))}
    elif kind == "compare":
        compared = _read_json(run_dir / "compare.json")
        if isinstance(compared, dict):
            base = compared.get("baseline")
            cands = {c: r for c, r in (compared.get("candidates") or {}).items() if c != base and isinstance(r, dict)}
            for cand, result in cands.items():
                prefix = f"{cand}/" if len(cands) > 1 else ""
                for name, m in (result.get("metrics") or {}).items():
                    if not isinstance(m, dict):
                        continue
                    ci = m.get("ci") if isinstance(m.get("ci"), list) and len(m["ci"]) == 2 else [None, None]
                    for part, v in (
                        ("baseline", m.get("base")),
                        ("candidate", m.get("cand")),
                        ("delta", m.get("delta")),
                    ):
                        if is_number(v):
                            metrics[f"{prefix}{name}/{part}"] = float(v)
                    for part, v in zip(("ci_low", "ci_high"), ci, strict=True):
                        if is_number(v):
                            metrics[f"{prefix}{name}/{part}"] = float(v)
            for key, tag in (("verdict", "tuneproof.verdict"), ("detail", "tuneproof.verdict_detail")):
                if isinstance(compared.get(key), str):
                    tags[tag] = compared[key][:5000]
            if isinstance(base, str):
                tags["tuneproof.baseline"] = base
    elif kind == "data-check":
        for split, n in (summary.get("sizes") or {}).items():
            if is_number(n):
                metrics[f"data/{split}_examples"] = float(n)
        for split, stats in (summary.get("lengths") or {}).items():
            for k in ("p50", "p95", "max", "truncated_share"):
                v = (stats or {}).get(k) if isinstance(stats, dict) else None
                if is_number(v):
                    metrics[
                        f"data/{split}_tokens_{k}" if k != "truncated_share" else f"data/{split}_truncated_share"
                    ] = float(v)
        if is_number(summary.get("hard_faults")):
            metrics["data/hard_faults"] = float(summary["hard_faults"])
    else:
        metrics = {f"{kind}/{k}": float(v) for k, v in summary.items() if k != "schema_version" and is_number(v)}
    if isinstance(summary.get("passed"), bool):
        tags["tuneproof.passed"] = str(summary["passed"]).lower()
    return {clean_key(k): v for k, v in metrics.items()}, tags


@dataclass
class RunView:
    """One run as trackers see it.

    Attributes:
        run_id / kind / status / reason / parent: from the registry.
        start_ms / end_ms: when the run started and ended (ms since the epoch; end None while running).
        params: :func:`params_for` the run's kind and its ``config.json``.
        steps: per-step rows ``(step, time ms or None, {metric: float})`` (:func:`step_metrics`), in file order.
        summary: :func:`summary_metrics` of ``summary.json``.
        artifacts: files of the run folder to upload (checkpoints and files over 64 MiB left out).
    """

    run_id: str
    kind: str
    status: str
    reason: str | None
    parent: str | None
    start_ms: int | None = None
    end_ms: int | None = None
    params: dict[str, str] = field(default_factory=dict)
    steps: list[tuple[int, int | None, dict[str, float]]] = field(default_factory=list)
    summary: dict[str, float] = field(default_factory=dict)
    summary_tags: dict[str, str] = field(default_factory=dict)
    artifacts: list[Path] = field(default_factory=list)

    @property
    def tags(self) -> dict[str, str]:
        tags = {"tuneproof.run_id": self.run_id, "tuneproof.kind": self.kind, "tuneproof.status": self.status}
        if self.reason:
            tags["tuneproof.reason"] = self.reason[:5000]
        if self.parent:
            tags["tuneproof.parent"] = self.parent
        return {**tags, **self.summary_tags}

    @classmethod
    def start(cls, record, config: dict[str, Any] | None) -> RunView:
        """What is known when a run starts: its record and the params of its study ``config``."""
        view = cls(record.id, record.kind, record.status, record.reason, record.parent)
        view.start_ms = int(record.created * 1000) if is_number(record.created) else None
        if isinstance(config, dict):
            view.params = params_for(record.kind, config)
        return view

    @classmethod
    def read(cls, record, run_dir: Path) -> RunView:
        run_dir = Path(run_dir)
        config = _read_json(run_dir / "config.json")
        view = cls.start(record, config if isinstance(config, dict) else None)
        view.end_ms = int(record.ended * 1000) if is_number(record.ended) else None
        metrics = run_dir / "metrics.jsonl"
        if metrics.is_file():
            for line in metrics.read_text(encoding="utf-8", errors="replace").splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut by a kill -9: the registry says how the run ended
                step = step_metrics(record.kind, row) if isinstance(row, dict) else None
                if step is not None:
                    view.steps.append(step)
        summary = _read_json(run_dir / "summary.json")
        if isinstance(summary, dict):
            view.summary, view.summary_tags = summary_metrics(record.kind, summary, run_dir)
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

    A tracker that logs while the run runs also implements ``start(view, previous, parent)`` (the
    run opened with its start time, params and the ``running`` status; returns the state) and
    ``log_steps(state, steps)`` (rows of :func:`step_metrics`).
    """

    name = "tracker"
    live = False

    def mirror(self, view: RunView, previous: dict[str, Any]) -> dict[str, Any]:  # pragma: no cover - interface
        raise NotImplementedError
