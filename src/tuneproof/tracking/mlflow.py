"""MLflow backend (the ``tracking`` extra, :func:`tuneproof.errors.install_hint`: mlflow-skinny + SQLAlchemy
for a SQLite store; the ``mlflow`` extra adds MLflow's server and UI: ``mlflow ui``).

Uses ``mlflow.tracking.MlflowClient`` (no global active run), so mirroring never touches a run the
user has open in the same process. Every run of a study is nested under one study run (named after
the study, tag ``tuneproof.kind: study``) through MLflow's ``mlflow.parentRunId`` tag, which the UI
shows as a tree; the dossier is an artifact of that study run. Batches follow MLflow's
``log_batch`` limits (1000 metrics, 100 params, 100 tags per call; param values up to 6000
characters — MLflow REST API docs).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from tuneproof.errors import TuneproofError, install_hint
from tuneproof.study import MLFLOW_FOLDER_FIX, mlflow_folder_store
from tuneproof.tracking.base import RunView, Tracker, TrackerUnavailable

#: tuneproof status -> MLflow RunStatus name
STATUS = {
    "completed": "FINISHED",
    "failed": "FAILED",
    "invalid": "FAILED",
    "interrupted": "KILLED",
    "running": "RUNNING",
}
STUDY_KIND = "study"


def _client(uri: str | None):
    # a tracker that is down must cost seconds, not MLflow's default 7 retries with backoff
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    try:
        from mlflow.tracking import MlflowClient  # noqa: PLC0415 - mlflow is optional and slow to import
    except ImportError as err:
        raise TrackerUnavailable(f"MLflow is not installed: {install_hint('tracking')}") from err
    # MLflow's INFO lines ("Creating initial MLflow database tables...") are not the command's output
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    return MlflowClient(tracking_uri=uri)


def _chunks(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _now_ms() -> int:
    return int(time.time() * 1000)  # MLflow timestamps are milliseconds


class MlflowTracker(Tracker):
    """Mirror to MLflow: experiment = ``tracking.mlflow.experiment`` or the study name; one
    MLflow run per tuneproof run, named by its id, nested under the study run.

    Raises:
        TuneproofError: ``$MLFLOW_TRACKING_URI`` names a folder store (``file:...`` or a path).
    """

    name = "mlflow"
    live = True

    def __init__(self, settings, study_name: str, study_dir=None):
        default = f"sqlite:///{Path(study_dir).resolve() / 'mlflow.db'}" if study_dir is not None else None
        uri = settings.uri if settings is not None else None
        env = os.environ.get("MLFLOW_TRACKING_URI")
        if uri is None and env:
            if mlflow_folder_store(env):
                raise TuneproofError(f"$MLFLOW_TRACKING_URI '{env}' {MLFLOW_FOLDER_FIX}")
            uri = env
        self.uri = uri or default
        self.experiment = (settings.experiment if settings is not None else None) or study_name
        self.study_name = study_name
        self._client_obj = None
        self._ids: dict[str, str] = {}

    @property
    def client(self):
        if self._client_obj is None:
            self._client_obj = _client(self.uri)
        return self._client_obj

    def _experiment_id(self) -> str:
        if "experiment" in self._ids:
            return self._ids["experiment"]
        client = self.client
        exp = client.get_experiment_by_name(self.experiment)
        if exp is not None:
            self._ids["experiment"] = exp.experiment_id
            return exp.experiment_id
        # a SQLite store keeps its artifacts beside the database, never in the current folder (MLflow's default
        # ./mlruns)
        location = None
        if self.uri and self.uri.startswith("sqlite:///"):
            location = (Path(self.uri[len("sqlite:///") :]).parent / "mlflow-artifacts").resolve().as_uri()
        self._ids["experiment"] = client.create_experiment(self.experiment, artifact_location=location)
        return self._ids["experiment"]

    def study_run(self) -> str:
        """The MLflow run id of the study run (created the first time, found by its tag after)."""
        if "study" in self._ids:
            return self._ids["study"]
        client, exp_id = self.client, self._experiment_id()
        found = client.search_runs(
            [exp_id], filter_string=f"tags.`tuneproof.kind` = '{STUDY_KIND}'", order_by=["attributes.start_time ASC"]
        )
        if found:
            self._ids["study"] = found[0].info.run_id
        else:
            run = client.create_run(
                exp_id,
                run_name=self.study_name,
                tags={"mlflow.runName": self.study_name, "tuneproof.kind": STUDY_KIND},
            )
            client.set_terminated(run.info.run_id, status="FINISHED")
            self._ids["study"] = run.info.run_id
        return self._ids["study"]

    def _open(self, view: RunView, previous: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """The MLflow run of ``view`` (the one in ``previous`` when it still exists, else a new one)."""
        client = self.client
        run_id = previous.get("run_id")
        if run_id:
            try:
                client.get_run(run_id)
            except Exception:  # noqa: BLE001 - deleted on the server: start over
                run_id, previous = None, {}
        if not run_id:
            tags = {"mlflow.runName": view.run_id, "mlflow.parentRunId": self.study_run()}
            run_id = client.create_run(
                self._experiment_id(), start_time=view.start_ms, run_name=view.run_id, tags=tags
            ).info.run_id
        return run_id, previous

    def _send(self, run_id: str, view: RunView, previous: dict[str, Any], steps: list | None = None) -> dict[str, Any]:
        from mlflow.entities import Metric, Param, RunTag  # noqa: PLC0415 - mlflow is optional

        client = self.client
        sent_params = set(previous.get("params_sent", []))
        params = [Param(k, v) for k, v in view.params.items() if k not in sent_params]
        for chunk in _chunks(params, 100):
            client.log_batch(run_id, params=chunk)
        steps_sent = int(previous.get("steps_sent", 0))
        rows = view.steps[steps_sent:] if steps is None else steps
        now = _now_ms()
        metrics = [Metric(k, v, t or now, step) for step, t, row in rows for k, v in row.items()]
        metrics += [Metric(k, v, view.end_ms or now, 0) for k, v in view.summary.items()]
        for chunk in _chunks(metrics, 1000):
            client.log_batch(run_id, metrics=chunk)
        tags = [RunTag(k, v) for k, v in view.tags.items()]
        for chunk in _chunks(tags, 100):
            client.log_batch(run_id, tags=chunk)
        return {
            "run_id": run_id,
            "uri": self.uri,
            "experiment": self.experiment,
            "status": view.status,
            "steps_sent": steps_sent + len(rows),
            "params_sent": sorted(sent_params | {p.key for p in params}),
        }

    def start(self, view: RunView, previous: dict[str, Any]) -> dict[str, Any]:
        """Open the run as it starts: start time, params, tags, status RUNNING, and the steps of
        ``view`` not sent yet (a resumed run's earlier steps; its MLflow run is set back to RUNNING)."""
        run_id, previous = self._open(view, previous)
        if previous.get("run_id"):
            self.client.update_run(run_id, status="RUNNING")
        return self._send(run_id, view, previous)

    def log_steps(self, state: dict[str, Any], steps: list) -> dict[str, Any]:
        """Log step rows (:func:`tuneproof.tracking.base.step_metrics`) at their own time."""
        from mlflow.entities import Metric  # noqa: PLC0415 - mlflow is optional

        now = _now_ms()
        metrics = [Metric(k, v, t or now, step) for step, t, row in steps for k, v in row.items()]
        for chunk in _chunks(metrics, 1000):
            self.client.log_batch(state["run_id"], metrics=chunk)
        return {**state, "steps_sent": int(state.get("steps_sent", 0)) + len(steps)}

    def mirror(self, view: RunView, previous: dict[str, Any]) -> dict[str, Any]:
        run_id, previous = self._open(view, previous)
        state = self._send(run_id, view, previous)
        for path in view.artifacts:
            self.client.log_artifact(run_id, str(path), artifact_path=_artifact_dir(view, path))
        status = STATUS.get(view.status, "FINISHED")
        if status == "RUNNING":
            self.client.update_run(run_id, status=status)
        else:
            self.client.set_terminated(run_id, status=status, end_time=view.end_ms)
        return state

    def publish_files(self, paths, previous: dict[str, Any]) -> dict[str, Any]:
        """Log ``paths`` as artifacts of the study run."""
        run_id = self.study_run()
        for path in paths:
            self.client.log_artifact(run_id, str(path))
        return {"run_id": run_id, "uri": self.uri, "experiment": self.experiment}


def _artifact_dir(view: RunView, path) -> str | None:
    """Sub-folder of the artifact inside the run folder (None for top-level files)."""
    for parent in path.parents:
        if parent.name == view.run_id:
            rel = path.parent.relative_to(parent)
            return None if str(rel) == "." else str(rel)
    return None
