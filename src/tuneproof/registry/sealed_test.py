"""The log of reads of the reserved (sealed) test split, kept in the index and in each run folder."""

from __future__ import annotations

import json
from typing import Any

from tuneproof.io import (
    read_json,
    write_json,
)
from tuneproof.registry.records import TEST_ACCESS_FILE, _now


class SealedTestLog:
    """Reads of the reserved test split, a part of :class:`~tuneproof.registry.Registry`."""

    # ------------------------------------------------------------------ sealed test split
    def log_test_access(self, run_id: str, candidate: str, result: dict[str, Any]) -> None:
        """Record one read of the reserved test split (every read is shown in the dossier); kept
        in the index and in ``runs/<run_id>/test_access.json`` (restored by a rebuild)."""
        t = _now()
        self._conn.execute(
            "INSERT INTO test_access (run, candidate, time, result) VALUES (?, ?, ?, ?)",
            (run_id, candidate, t, json.dumps(result, default=str)),
        )
        path = self.runs_dir / run_id / TEST_ACCESS_FILE
        prior = read_json(path).get("accesses", []) if path.exists() else []
        write_json(path, {"accesses": [*prior, {"run": run_id, "candidate": candidate, "time": t, "result": result}]})

    def test_accesses(self) -> list[dict[str, Any]]:
        rows = self._conn.execute("SELECT * FROM test_access ORDER BY seq").fetchall()
        return [
            {"run": r["run"], "candidate": r["candidate"], "time": r["time"], "result": json.loads(r["result"] or "{}")}
            for r in rows
        ]
