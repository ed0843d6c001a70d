"""The Weights & Biases backend, used when ``wandb`` is installed (not a dependency).

``init / log(step) / summary / finish``, as the Trackio backend (:mod:`tuneproof.tracking.trackio`);
a run keeps its tuneproof id as the tracker's run id, so mirroring it again resumes the same tracker
run (``resume="allow"``).
"""

from __future__ import annotations

import re
from typing import Any

from tuneproof.tracking.run_view import RunView, Tracker, import_tracker_package


class WandbTracker(Tracker):
    """``tracking.wandb.project`` (default the study name), ``tracking.wandb.mode`` (online | offline)."""

    name = "wandb"

    def __init__(self, settings, study_name: str):
        self.project = (settings.project if settings is not None else None) or study_name
        self.mode = settings.mode if settings is not None else None
        self.wandb = import_tracker_package("wandb")

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
