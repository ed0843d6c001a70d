"""Mirror runs to experiment trackers: MLflow, and Weights & Biases or Trackio when installed.

The registry (``tuneproof.sqlite`` + ``runs/<id>/``) stays the source of truth; a tracker holds a
copy, written when a run ends (completed, failed, interrupted or invalid) from the run folder:

- params: the resolved config (``config.json``), flattened to dotted keys (``training.learning_rate``);
- per-step metrics: every numeric column of ``metrics.jsonl`` at its ``step``;
- summary metrics: every numeric value of ``summary.json``, flattened (``summary.macro_f1``);
- status: the tracker's run status plus the tags ``tuneproof.status`` / ``tuneproof.reason`` /
  ``tuneproof.kind`` / ``tuneproof.run_id`` / ``tuneproof.parent``;
- artifacts: the run folder's files (outputs, preflight report, dossier...), checkpoints excluded.

A tracker that is down or refuses never fails a run: the command prints one warning line, writes
``runs/<id>/tracking.json`` with ``pending: true`` and the error, and the next run's end (or
``tuneproof track sync``) retries every pending run. Mirroring is idempotent: a run mirrored
again (resumed, invalidated later) reuses its tracker run and adds only the steps not sent yet.

Study keys: ``tracking.mlflow.uri`` (default ``$MLFLOW_TRACKING_URI``, else ``sqlite:///<study>/mlflow.db``;
a SQLite store keeps its artifacts in ``mlflow-artifacts/`` beside the database) and
``tracking.mlflow.experiment`` (default the study name); ``tracking.wandb.project`` /
``tracking.wandb.mode``; ``tracking.trackio.project``; or the shorthand ``report_to: [mlflow]``
(the names transformers' ``TrainingArguments.report_to`` uses).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from tuneproof.io import read_json, write_json
from tuneproof.tracking.base import RunView, Tracker, TrackerUnavailable
from tuneproof.tracking.mlflow import MlflowTracker
from tuneproof.tracking.others import TrackioTracker, WandbTracker

TRACKING_FILE = "tracking.json"

__all__ = [
    "RunView",
    "Tracker",
    "TrackerUnavailable",
    "trackers_for",
    "mirror_run",
    "sync",
    "publish_dossier",
    "TRACKING_FILE",
]


def trackers_for(study, study_dir=None) -> list[Tracker]:
    """The trackers a study asks for (``tracking.*`` and ``report_to``), in a stable order.

    Raises:
        TuneproofError: a tracker is asked for but its package is not installed (names the extra).
    """
    cfg = study.tracking
    asked = set(study.report_to)
    out: list[Tracker] = []
    if cfg.mlflow is not None or "mlflow" in asked:
        out.append(MlflowTracker(cfg.mlflow, study.name, study_dir))  # no URI anywhere: <study>/mlflow.db
    if cfg.wandb is not None or "wandb" in asked:
        out.append(WandbTracker(cfg.wandb, study.name))
    if cfg.trackio is not None or "trackio" in asked:
        out.append(TrackioTracker(cfg.trackio, study.name))
    return out


def _state(run_dir: Path) -> dict[str, Any]:
    path = run_dir / TRACKING_FILE
    if not path.is_file():
        return {}
    try:
        state = read_json(path)
    except Exception:  # noqa: BLE001 - a damaged state file only costs a fresh tracker run
        return {}
    return state if isinstance(state, dict) else {}


def mirror_run(trackers: list[Tracker], record, run_dir: Path, *, warn=None) -> dict[str, Any]:
    """Send one run to every tracker; never raises for a tracker fault.

    Args:
        trackers: from :func:`trackers_for`.
        record: the run's :class:`tuneproof.registry.RunRecord` (id, kind, status, reason, parent).
        run_dir: ``runs/<id>/``.
        warn: callable taking one line (default: stderr).

    Returns:
        The new ``tracking.json`` state: per tracker ``{"run_id", "steps_sent", "params_sent",
        "status"}``, plus ``pending`` (True when a tracker failed) and ``errors``.
    """
    warn = warn or (lambda line: sys.stderr.write(line + "\n"))
    state = _state(run_dir)
    view = RunView.read(record, run_dir)
    errors: dict[str, str] = {}
    for tracker in trackers:
        previous = state.get(tracker.name) or {}
        try:
            state[tracker.name] = tracker.mirror(view, previous)
        except Exception as err:  # noqa: BLE001 - a tracker must never fail the run
            first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
            errors[tracker.name] = f"{type(err).__name__}: {first}"
            warn(
                f"warning: run {record.id} not mirrored to {tracker.name} ({errors[tracker.name]}); "
                f"it is retried at the end of the next run or by `tuneproof track sync`"
            )
    state["pending"] = bool(errors)
    state["errors"] = errors
    write_json(run_dir / TRACKING_FILE, state)
    return state


def sync(trackers: list[Tracker], registry, *, only_pending: bool = True, warn=None) -> dict[str, list[str]]:
    """Mirror every ended run whose ``tracking.json`` is pending (or absent, or every run when
    ``only_pending`` is False). Returns ``{"mirrored": [ids], "pending": [ids]}``."""
    done: dict[str, list[str]] = {"mirrored": [], "pending": []}
    if not trackers:
        return done
    for rec in registry.list():
        if rec.status == "running":
            continue
        run_dir = registry.runs_dir / rec.id
        if not run_dir.is_dir():
            continue
        state = _state(run_dir)
        if only_pending and state and not state.get("pending"):
            continue
        state = mirror_run(trackers, rec, run_dir, warn=warn)
        done["pending" if state["pending"] else "mirrored"].append(rec.id)
    return done


def end_hook(study, study_dir=None):
    """A registry end hook for ``study`` (or None without trackers): mirrors the run that just
    ended, then retries the pending ones."""
    try:
        trackers = trackers_for(study, study_dir)
    except Exception as err:  # noqa: BLE001 - a missing package is said once, the run goes on
        sys.stderr.write(f"warning: tracking disabled ({err})\n")
        return None
    if not trackers:
        return None

    def hook(registry, record) -> None:
        mirror_run(trackers, record, registry.runs_dir / record.id)
        sync(trackers, registry, only_pending=True)

    return hook


def publish_dossier(study, study_dir: Path, paths: list[Path], *, warn=None) -> list[str]:
    """Send the dossier files to every tracker that takes files (MLflow: a run named ``dossier``
    in the study's experiment, the same one each time). Returns the trackers that received them;
    a tracker fault is one warning line, never an error."""
    warn = warn or (lambda line: sys.stderr.write(line + "\n"))
    try:
        trackers = trackers_for(study, study_dir)
    except Exception as err:  # noqa: BLE001
        warn(f"warning: tracking disabled ({err})")
        return []
    if not trackers:
        return []
    state_path = Path(study_dir) / ".tracking-dossier.json"
    state = read_json(state_path) if state_path.is_file() else {}
    sent = []
    for tracker in trackers:
        publish = getattr(tracker, "publish_files", None)
        if publish is None:
            continue
        try:
            state[tracker.name] = publish("dossier", paths, state.get(tracker.name) or {})
            sent.append(tracker.name)
        except Exception as err:  # noqa: BLE001
            warn(
                f"warning: dossier not sent to {tracker.name} ({type(err).__name__}: "
                f"{str(err).splitlines()[0][:200] if str(err) else ''})"
            )
    write_json(state_path, state)
    return sent
