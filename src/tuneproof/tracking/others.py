"""Weights & Biases and Trackio backends, used when their package is installed (not a dependency).

Both follow the same ``init / log(step) / summary / finish`` shape; a run keeps its tuneproof id as
the tracker's run id, so mirroring it again resumes the same tracker run (W&B ``resume="allow"``).
"""

from __future__ import annotations

import importlib
import re
from typing import Any

from tuneproof.tracking.base import RunView, Tracker, TrackerUnavailable


def _import(name: str):
    try:
        return importlib.import_module(name)
    except ImportError as err:
        raise TrackerUnavailable(f"{name} is not installed: pip install {name}") from err


class WandbTracker(Tracker):
    """``tracking.wandb.project`` (default the study name), ``tracking.wandb.mode`` (online | offline)."""

    name = "wandb"

    def __init__(self, settings, study_name: str):
        self.project = (settings.project if settings is not None else None) or study_name
        self.mode = settings.mode if settings is not None else None
        self.wandb = _import("wandb")

    def mirror(self, view: RunView, previous: dict[str, Any]) -> dict[str, Any]:
        run_id = previous.get("run_id") or re.sub(r"[^A-Za-z0-9_-]", "-", f"{self.project}-{view.run_id}")[:64]
        run = self.wandb.init(
            project=self.project,
            id=run_id,
            name=view.run_id,
            resume="allow",
            mode=self.mode,
            config=view.params,
            tags=[view.kind, view.status],
            reinit=True,
        )
        steps_sent = int(previous.get("steps_sent", 0))
        for step, _t, row in view.steps[steps_sent:]:
            run.log(row, step=step)
        run.summary.update({**view.summary, **view.tags})
        for path in view.artifacts:
            run.save(str(path), base_path=str(path.parent), policy="now")
        run.finish(exit_code=0 if view.status == "completed" else 1)
        return {"run_id": run_id, "status": view.status, "steps_sent": len(view.steps)}


class TrackioTracker(Tracker):
    """``tracking.trackio.project`` (default the study name); Trackio's wandb-like API."""

    name = "trackio"

    def __init__(self, settings, study_name: str):
        self.project = (settings.project if settings is not None else None) or study_name
        self.trackio = _import("trackio")

    def mirror(self, view: RunView, previous: dict[str, Any]) -> dict[str, Any]:
        self.trackio.init(project=self.project, name=view.run_id, config={**view.params, **view.tags}, resume="allow")
        steps_sent = int(previous.get("steps_sent", 0))
        for step, _t, row in view.steps[steps_sent:]:
            self.trackio.log(row, step=step)
        if view.summary:
            self.trackio.log(view.summary)
        self.trackio.finish()
        return {"run_id": view.run_id, "status": view.status, "steps_sent": len(view.steps)}
