"""MLflow backend (``pip install 'tuneproof[tracking]'``: mlflow-skinny + SQLAlchemy for a SQLite store).

Uses ``mlflow.tracking.MlflowClient`` (no global active run), so mirroring never touches a run the
user has open in the same process. Batches follow MLflow's ``log_batch`` limits (1000 metrics,
100 params, 100 tags per call; param values up to 6000 characters — MLflow REST API docs).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from tuneproof.tracking.base import RunView, Tracker, TrackerUnavailable

#: tuneproof status -> MLflow RunStatus name
STATUS = {
    "completed": "FINISHED",
    "failed": "FAILED",
    "invalid": "FAILED",
    "interrupted": "KILLED",
    "running": "RUNNING",
}


def _client(uri: str | None):
    # a tracker that is down must cost seconds, not MLflow's default 7 retries with backoff
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    try:
        from mlflow.tracking import MlflowClient  # noqa: PLC0415
    except ImportError as err:
        raise TrackerUnavailable("MLflow is not installed: pip install 'tuneproof[tracking]'") from err
    return MlflowClient(tracking_uri=uri)


def _chunks(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i : i + size]


class MlflowTracker(Tracker):
    """Mirror to MLflow: experiment = ``tracking.mlflow.experiment`` or the study name; one
    MLflow run per tuneproof run, named by its id."""

    name = "mlflow"

    def __init__(self, settings, study_name: str, study_dir=None):
        default = f"sqlite:///{Path(study_dir).resolve() / 'mlflow.db'}" if study_dir is not None else None
        self.uri = (settings.uri if settings is not None else None) or os.environ.get("MLFLOW_TRACKING_URI") or default
        self.experiment = (settings.experiment if settings is not None else None) or study_name

    def _experiment_id(self, client) -> str:
        exp = client.get_experiment_by_name(self.experiment)
        if exp is not None:
            return exp.experiment_id
        # a SQLite store keeps its artifacts beside the database, never in the current folder (MLflow's default
        # ./mlruns)
        location = None
        if self.uri and self.uri.startswith("sqlite:///"):
            location = (Path(self.uri[len("sqlite:///") :]).parent / "mlflow-artifacts").resolve().as_uri()
        return client.create_experiment(self.experiment, artifact_location=location)

    def mirror(self, view: RunView, previous: dict[str, Any]) -> dict[str, Any]:
        from mlflow.entities import Metric, Param, RunTag  # noqa: PLC0415

        client = _client(self.uri)
        exp_id = self._experiment_id(client)
        run_id = previous.get("run_id")
        if run_id:
            try:
                client.get_run(run_id)
            except Exception:  # noqa: BLE001 - deleted on the server: start over
                run_id, previous = None, {}
        if not run_id:
            run_id = client.create_run(exp_id, run_name=view.run_id, tags={"mlflow.runName": view.run_id}).info.run_id
        sent_params = set(previous.get("params_sent", []))
        params = [Param(k, v) for k, v in view.params.items() if k not in sent_params]
        for chunk in _chunks(params, 100):
            client.log_batch(run_id, params=chunk)
        steps_sent = int(previous.get("steps_sent", 0))
        now = int(time.time() * 1000)  # MLflow metric timestamps are milliseconds
        metrics = [Metric(k, v, now, step) for step, row in view.steps[steps_sent:] for k, v in row.items()]
        metrics += [Metric(k, v, now, 0) for k, v in view.summary.items()]
        for chunk in _chunks(metrics, 1000):
            client.log_batch(run_id, metrics=chunk)
        tags = [RunTag(k, v) for k, v in view.tags.items()]
        for chunk in _chunks(tags, 100):
            client.log_batch(run_id, tags=chunk)
        for path in view.artifacts:
            client.log_artifact(run_id, str(path), artifact_path=_artifact_dir(view, path))
        client.set_terminated(run_id, status=STATUS.get(view.status, "FINISHED"))
        return {
            "run_id": run_id,
            "uri": self.uri,
            "experiment": self.experiment,
            "status": view.status,
            "steps_sent": len(view.steps),
            "params_sent": sorted(sent_params | {p.key for p in params}),
        }

    def publish_files(self, run_name: str, paths, previous: dict[str, Any]) -> dict[str, Any]:
        """Log ``paths`` as artifacts of the study-level MLflow run ``run_name`` (created once)."""
        client = _client(self.uri)
        exp_id = self._experiment_id(client)
        run_id = previous.get("run_id")
        if run_id:
            try:
                client.get_run(run_id)
            except Exception:  # noqa: BLE001
                run_id = None
        if not run_id:
            run_id = client.create_run(
                exp_id, run_name=run_name, tags={"mlflow.runName": run_name, "tuneproof.kind": "report"}
            ).info.run_id
        for path in paths:
            client.log_artifact(run_id, str(path))
        client.set_terminated(run_id, status="FINISHED")
        return {"run_id": run_id, "uri": self.uri, "experiment": self.experiment}


def _artifact_dir(view: RunView, path) -> str | None:
    """Sub-folder of the artifact inside the run folder (None for top-level files)."""
    for parent in path.parents:
        if parent.name == view.run_id:
            rel = path.parent.relative_to(parent)
            return None if str(rel) == "." else str(rel)
    return None
