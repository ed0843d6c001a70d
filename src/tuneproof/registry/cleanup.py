"""Temporary files and folders left by killed processes, removed when the next run starts."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from tuneproof.io import (
    is_temp_name,
    remove_free_lock,
    remove_temps,
)
from tuneproof.registry.run import Run


class Cleanup:
    """Removal of what killed processes left, a part of :class:`~tuneproof.registry.Registry`."""

    def clean_stale_temps(self, kind: str | None = None) -> list[Path]:
        """Remove temporary files left by killed processes; returns what was removed.

        - ``runs/<id>/**/.NAME.*.tmp`` of every run that is not running (nobody writes there);
        - ``exports/.<name>.*`` bundle folders, when no export run is running (``kind`` export);
        - the temp folder and the lock file an export run recorded (``summary.temp_folder``,
          ``summary.lock_file``, beside its ``--out`` folder; relative to the study folder inside it, read in
          this folder by :meth:`recorded_path`) when that run is no longer running;
        - ``.NAME.*.tmp`` in the study folder older than 10 minutes (atomic writes take seconds).
        """
        removed: list[Path] = []
        status = {r.id: r.status for r in self.list()}
        for d in self._record_folders():
            if status.get(d.name) != "running":
                removed += remove_temps(d)
        if kind == "export":
            others = [r for r in self.list(kind="export", status="running")]
            exports = self.study_dir / "exports"
            if len(others) <= 1 and exports.is_dir():  # only this run (just created) is running
                for p in exports.iterdir():
                    if p.name.startswith(".") and p.is_dir() and not p.is_symlink():  # made inside an export run
                        shutil.rmtree(p, ignore_errors=True)
                        removed.append(p)
        for r in self.list(kind="export"):  # temp folders and locks a killed export recorded (wherever --out put them)
            if r.status == "running":
                continue
            # recorded relative to the study folder (or absolute by an older version: read in this folder, so a
            # copied study never removes the original folder's files)
            tmp, lock = (
                self.recorded_path(str(v), r.summary) if v else None
                for v in (r.summary.get("temp_folder"), r.summary.get("lock_file"))
            )
            tmp, lock = (None if v is None or v.warning else v.path for v in (tmp, lock))
            if tmp and is_temp_name(Path(tmp).name) and Path(tmp).is_dir() and not Path(tmp).is_symlink():
                shutil.rmtree(tmp, ignore_errors=True)
                removed.append(Path(tmp))
            if lock and Path(lock).name.endswith(".lock") and remove_free_lock(lock):
                removed.append(Path(lock))
        removed += remove_temps(self.study_dir, older_than_s=600, recursive=False)
        return removed

    def _note_cleanup(self, run: Run, kind: str) -> None:
        removed = self.clean_stale_temps(kind)
        if removed:
            shown = ", ".join(
                str(p.relative_to(self.study_dir)) if p.is_relative_to(self.study_dir) else str(p) for p in removed[:5]
            )
            more = f" and {len(removed) - 5} more" if len(removed) > 5 else ""
            run.note(f"removed {len(removed)} stale temporary file(s) left by a killed process: {shown}{more}")
            print(
                f"note: removed {len(removed)} stale temporary file(s) left by a killed process: {shown}{more}",
                file=sys.stderr,
            )
