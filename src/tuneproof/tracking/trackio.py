"""The Trackio backend (Trackio's wandb-like API), used when ``trackio`` is installed (not a dependency).

``init / log(step) / summary / finish``, as the W&B backend (:mod:`tuneproof.tracking.wandb`); a
run is named by its tuneproof id, so mirroring it again resumes it (``resume="allow"``).
"""

from __future__ import annotations

from typing import Any

from tuneproof.tracking.run_view import RunView, Tracker, import_tracker_package


class TrackioTracker(Tracker):
    """``tracking.trackio.project`` (default the study name); Trackio's wandb-like API."""

    name = "trackio"

    def __init__(self, settings, study_name: str):
        self.project = (settings.project if settings is not None else None) or study_name
        self.trackio = import_tracker_package("trackio")

    def mirror(self, view: RunView, previous: dict[str, Any]) -> dict[str, Any]:
        self.trackio.init(project=self.project, name=view.run_id, config={**view.params, **view.tags}, resume="allow")
        steps_sent = int(previous.get("steps_sent", 0))
        for step, _t, row in view.steps[steps_sent:]:
            self.trackio.log(row, step=step)
        if view.summary:
            self.trackio.log(view.summary)
        self.trackio.finish()
        return {"run_id": view.run_id, "status": view.status, "steps_sent": len(view.steps)}
