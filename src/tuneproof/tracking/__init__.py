"""Runs sent to experiment trackers: MLflow while they run, and Weights & Biases or Trackio when
they end (when installed).

The registry (``tuneproof.sqlite`` + ``runs/<id>/``) stays the source of truth; a tracker holds a
copy. :func:`attach` hands the registry three hooks (:class:`Mirror`):

- when a run starts (or is resumed): the MLflow run is opened with the run's start time, the
  ``running`` status, the params of its kind (:data:`tuneproof.tracking.base.PARAM_GROUPS`) and the
  ``mlflow.parentRunId`` of the study run, so the UI shows the study's runs as one tree;
- after each ``metrics.jsonl`` row: its metrics (``train/loss``, ``train/learning_rate``...) at the
  row's step and time (the first at once, then at most every :data:`FLUSH_S` seconds);
- when it ends (completed, failed, interrupted or invalid): its end time and status, the summary
  metrics (``eval/accuracy``; a comparison's ``field_f1/delta``, ``field_f1/ci_low``,
  ``field_f1/ci_high`` and its verdict tag), the tags ``tuneproof.status`` / ``tuneproof.reason`` /
  ``tuneproof.kind`` / ``tuneproof.run_id`` / ``tuneproof.parent``, and the run folder's files
  (outputs, preflight report...; checkpoints excluded). W&B and Trackio get the whole run then.

A tracker that is down or refuses never fails a run: the run's ``runs/<id>/tracking.json`` says
``pending: true`` with the error, the tracker is not tried again by this command, and the command
prints one warning naming how many runs wait; the next run's end (or ``tuneproof track sync``)
retries every pending run. Sending is idempotent: a run sent again (resumed, invalidated later)
reuses its tracker run and adds only the steps not sent yet.

Study keys: ``tracking.mlflow.uri`` (default ``$MLFLOW_TRACKING_URI``, else ``sqlite:///<study>/mlflow.db``;
a SQLite store keeps its artifacts in ``mlflow-artifacts/`` beside the database; a folder store,
``file://.../mlruns``, is refused) and ``tracking.mlflow.experiment`` (default the study name);
``tracking.wandb.project`` / ``tracking.wandb.mode``; ``tracking.trackio.project``; or the shorthand
``report_to: [mlflow]`` (the names transformers' ``TrainingArguments.report_to`` uses).
"""

from __future__ import annotations

import http
import math
import re
import sys
import time
from pathlib import Path
from typing import Any

from tuneproof.errors import TuneproofError
from tuneproof.io import read_json, write_json
from tuneproof.study import read_study, validate_study
from tuneproof.tracking.base import RunView, Tracker, TrackerUnavailable, step_metrics
from tuneproof.tracking.mlflow import MlflowTracker
from tuneproof.tracking.others import TrackioTracker, WandbTracker
from tuneproof.ui import visible_text

TRACKING_FILE = "tracking.json"
#: step rows are sent at most this often (seconds; the first at once, the rest at the run's end):
#: one MLflow write to a SQLite store takes about 36 ms on a loaded 2-core machine
FLUSH_S = 2.0

__all__ = [
    "RunView",
    "Tracker",
    "TrackerUnavailable",
    "Mirror",
    "attach",
    "attach_study_file",
    "trackers_for",
    "mirror_run",
    "sync",
    "publish_dossier",
    "TRACKING_FILE",
]


def _stderr(line: str) -> None:
    sys.stderr.write(line + "\n")


def trackers_for(study, study_dir=None) -> list[Tracker]:
    """The trackers a study asks for (``tracking.*`` and ``report_to``), in a stable order.

    Raises:
        TuneproofError: a tracker is asked for but its package is not installed (names the extra),
            or ``$MLFLOW_TRACKING_URI`` names MLflow's folder store.
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


#: words of a connection fault in a tracker's error -> what the warning says
_UNREACHABLE = (
    ("Connection refused", "connection refused"),
    ("timed out", "timed out"),
    ("Name or service not known", "unknown host"),
    ("Temporary failure in name resolution", "unknown host"),
    ("Max retries exceeded", "no answer"),
)


#: how a server that answered with an HTTP error status says it, by library: urllib3's retry ("too many 500
#: error responses", also after MLflow's retries), MLflow's REST check ("error code 403 != 200"), requests'
#: ``raise_for_status`` ("500 Server Error"). Checked before :data:`_UNREACHABLE`: such a server answered.
_HTTP_STATUS = (
    re.compile(r"too many (\d{3}) error responses"),
    re.compile(r"error code (\d{3}) != 200"),
    re.compile(r"\b(\d{3}) (?:Client|Server) Error"),
)


def _http_words(code: int) -> str:
    try:
        phrase = http.HTTPStatus(code).phrase
    except ValueError:
        phrase = "error"
    return f"the server answered HTTP {code} ({phrase})"


def _error(err: BaseException) -> str:
    """A tracker's error in a few words: the HTTP status a server answered with (``the server answered HTTP
    500 (Internal Server Error)``), ``connection refused`` for a server that is down, else ``Type: first
    line`` (cut at 120 characters, control characters shown as escapes)."""
    text = str(err)
    for pattern in _HTTP_STATUS:
        if m := pattern.search(text):
            return _http_words(int(m.group(1)))
    for needle, words in _UNREACHABLE:
        if needle in text:
            return words
    first = (text.strip().splitlines() or [type(err).__name__])[0]
    return f"{type(err).__name__}: {visible_text(first, one_line=True, limit=120)}"


def mirror_run(trackers: list[Tracker], record, run_dir: Path, *, down: dict[str, str] | None = None) -> dict[str, Any]:
    """Send one run to every tracker; never raises for a tracker fault, never prints.

    Args:
        trackers: from :func:`trackers_for`.
        record: the run's :class:`tuneproof.registry.RunRecord` (id, kind, status, reason, parent, times).
        run_dir: ``runs/<id>/``.
        down: tracker name -> error of the trackers found down by this command: not tried again,
            the run stays pending for them; a tracker that fails here is added.

    Returns:
        The new ``tracking.json`` state: per tracker ``{"run_id", "steps_sent", "params_sent",
        "status"}``, plus ``pending`` (True when a tracker failed) and ``errors``.
    """
    down = {} if down is None else down
    state = _state(run_dir)
    view = RunView.read(record, run_dir)
    errors: dict[str, str] = {}
    for tracker in trackers:
        if tracker.name in down:
            errors[tracker.name] = down[tracker.name]
            continue
        try:
            state[tracker.name] = tracker.mirror(view, state.get(tracker.name) or {})
        except Exception as err:  # noqa: BLE001 - a tracker must never fail the run
            errors[tracker.name] = down[tracker.name] = _error(err)
    state["pending"] = bool(errors)
    state["errors"] = errors
    write_json(run_dir / TRACKING_FILE, state)
    return state


def sync(
    trackers: list[Tracker], registry, *, only_pending: bool = True, down: dict[str, str] | None = None
) -> dict[str, list[str]]:
    """Mirror every ended run whose ``tracking.json`` is pending (or absent, or every run when
    ``only_pending`` is False). Returns ``{"mirrored": [ids], "pending": [ids]}``."""
    done: dict[str, list[str]] = {"mirrored": [], "pending": []}
    if not trackers:
        return done
    down = {} if down is None else down
    for rec in registry.list():
        if rec.status == "running":
            continue
        run_dir = registry.runs_dir / rec.id
        if not run_dir.is_dir():
            continue
        state = _state(run_dir)
        if only_pending and state and not state.get("pending"):
            continue
        if state and all(t.name in down for t in trackers):
            done["pending"].append(rec.id)  # every tracker is down: leave its state as it is
            continue
        state = mirror_run(trackers, rec, run_dir, down=down)
        done["pending" if state["pending"] else "mirrored"].append(rec.id)
    return done


def waiting(registry) -> list[str]:
    """The runs whose ``tracking.json`` is pending (a tracker has not received them)."""
    return [rec.id for rec in registry.list() if _state(registry.runs_dir / rec.id).get("pending")]


class Mirror:
    """The registry hooks of one command (:func:`attach`): open each run in the live trackers when
    it starts, log each step, send the rest when it ends, and say a tracker that is down once.

    Args:
        trackers: from :func:`trackers_for`.
        config: the resolved study the command runs (the params of a run as it starts).
        warn: callable taking one line (default: stderr).
    """

    def __init__(self, trackers: list[Tracker], config: dict[str, Any] | None, *, warn=None):
        self.trackers = trackers
        self.config = config
        self.warn = warn or _stderr
        self.down: dict[str, str] = {}  # tracker name -> error, for the rest of this command
        self.warned: set[str] = set()
        self.live: dict[str, dict[str, Any]] = {}  # run id -> {"kind", tracker name -> state}
        self.queued: dict[str, list] = {}  # run id -> step rows not sent yet
        self.flushed: dict[str, float] = {}  # run id -> time.monotonic() of the last send

    def _fail(self, tracker: Tracker, err: BaseException) -> None:
        self.down.setdefault(tracker.name, _error(err))

    def _say(self, registry) -> None:
        """One warning per tracker found down by this command, naming how many runs wait."""
        fresh = [name for name in self.down if name not in self.warned]
        if not fresh:
            return
        self.warned.update(fresh)
        ids = waiting(registry)
        shown = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
        where = {t.name: getattr(t, "uri", None) for t in self.trackers}
        for name in fresh:
            at = f" at {visible_text(where[name], one_line=True, limit=80)}" if where.get(name) else ""
            self.warn(
                f"warning: {name}{at} did not take the runs ({self.down[name]}); "
                f"{len(ids)} run(s) wait for `tuneproof track sync`: {shown}"
            )

    def started(self, registry, record) -> None:
        run_dir = registry.runs_dir / record.id
        state = _state(run_dir)
        # a resumed run's folder already holds steps: those never sent (a tracker added since, a process
        # killed -9) go first, so that the count of steps sent stays an index into metrics.jsonl
        view = RunView.read(record, run_dir)
        if not view.params:
            view.params = RunView.start(record, self.config).params
        live: dict[str, Any] = {"kind": record.kind}
        for tracker in self.trackers:
            if not tracker.live or tracker.name in self.down:
                continue
            try:
                state[tracker.name] = live[tracker.name] = tracker.start(view, state.get(tracker.name) or {})
            except Exception as err:  # noqa: BLE001 - a tracker must never fail the run
                self._fail(tracker, err)
        self.live[record.id] = live
        state["pending"] = True  # until the end is sent: a run killed here is sent by the next sync
        write_json(run_dir / TRACKING_FILE, state)
        self._say(registry)

    def _adopt(self, registry, run_id: str) -> dict[str, Any] | None:
        """The live state of a run another process opened (the launcher of a torchrun worker):
        the tracker runs its ``tracking.json`` names, or None when it names none."""
        try:
            record = registry.get(run_id)
        except Exception:  # noqa: BLE001 - an unknown run is not this hook's to report
            return None
        state = _state(registry.runs_dir / run_id)
        live: dict[str, Any] = {"kind": record.kind}
        for tracker in self.trackers:
            if tracker.live and isinstance(state.get(tracker.name), dict) and state[tracker.name].get("run_id"):
                live[tracker.name] = state[tracker.name]
        return live if len(live) > 1 else None

    def stepped(self, registry, run_id: str, row: dict[str, Any]) -> None:
        if run_id not in self.live:
            self.live[run_id] = self._adopt(registry, run_id)
        live = self.live.get(run_id)
        if not live:
            return
        step = step_metrics(live["kind"], row)
        if step is None:
            return
        queued = self.queued.setdefault(run_id, [])
        queued.append(step)
        if time.monotonic() - self.flushed.get(run_id, -math.inf) < FLUSH_S:
            return
        self.flushed[run_id] = time.monotonic()
        self.queued[run_id] = []
        sent = False
        for tracker in self.trackers:
            if tracker.name not in live or tracker.name in self.down:
                continue
            try:
                live[tracker.name] = tracker.log_steps(live[tracker.name], queued)
                sent = True
            except Exception as err:  # noqa: BLE001
                self._fail(tracker, err)
        if sent:
            state = _state(registry.runs_dir / run_id)
            state.update({k: v for k, v in live.items() if k != "kind"})
            write_json(registry.runs_dir / run_id / TRACKING_FILE, state)
        self._say(registry)

    def ended(self, registry, record) -> None:
        self.live.pop(record.id, None)
        self.queued.pop(record.id, None)  # the rows not sent yet are in metrics.jsonl: the mirror sends them
        mirror_run(self.trackers, record, registry.runs_dir / record.id, down=self.down)
        sync(self.trackers, registry, only_pending=True, down=self.down)
        self._say(registry)


def attach(registry, study, study_dir, config: dict[str, Any] | None = None, *, warn=None) -> Mirror | None:
    """Hand ``registry`` the hooks of the trackers ``study`` asks for; None without trackers.

    A tracker that cannot be used (its package missing, a folder store in ``$MLFLOW_TRACKING_URI``)
    is one warning line and no hooks: the command goes on."""
    warn = warn or _stderr
    try:
        trackers = trackers_for(study, study_dir)
    except Exception as err:  # noqa: BLE001 - a missing package is said once, the run goes on
        warn(f"warning: tracking disabled ({err})")
        return None
    if not trackers:
        return None
    mirror = Mirror(trackers, config, warn=warn)
    registry.start_hooks.append(mirror.started)
    registry.step_hooks.append(mirror.stepped)
    registry.end_hooks.append(mirror.ended)
    return mirror


def attach_study_file(registry, study_dir, *, warn=None) -> Mirror | None:
    """:func:`attach` for a command that reads no more of the study than its trackers (``invalidate``,
    ``runs mark-interrupted``): the study file validated by the schema alone; a study file that does
    not validate leaves the registry without trackers (the change reaches them at the next sync)."""
    try:
        raw, path = read_study(study_dir)
        study = validate_study(raw, path)
    except TuneproofError:
        return None
    return attach(registry, study, study_dir, None, warn=warn)


def publish_dossier(study, study_dir: Path, paths: list[Path], *, warn=None) -> list[str]:
    """Send the dossier files to every tracker that takes files (MLflow: artifacts of the study
    run, the parent of every run). Returns the trackers that received them; a tracker fault is one
    warning line, never an error."""
    warn = warn or _stderr
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
            state[tracker.name] = publish(paths, state.get(tracker.name) or {})
            sent.append(tracker.name)
        except Exception as err:  # noqa: BLE001
            warn(f"warning: dossier not sent to {tracker.name} ({_error(err)})")
    write_json(state_path, state)
    return sent
