"""The run registry: every command that does work is a run with an id, a folder and a status.

Layout inside a study folder::

    tuneproof.yaml
    tuneproof.sqlite          # the index (stdlib sqlite3)
    runs/r0007-lora-r16/      # config.json, env.json, data.json, log.txt, metrics.jsonl, outputs.jsonl, summary.json

Statuses: running -> completed | failed | interrupted | invalid. A run is never deleted. A run
left ``running`` by a process that died (kill -9, power loss) is found stale the next time the
registry is opened and marked ``interrupted`` with the reason.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import socket
import sqlite3
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from tuneproof.errors import TuneproofError
from tuneproof.io import append_jsonl, write_json

KINDS = ("baseline", "train", "eval", "test", "export", "preflight", "data-check", "compare", "report")
STATUSES = ("running", "completed", "failed", "interrupted", "invalid")
DB_NAME = "tuneproof.sqlite"
_ID_RE = re.compile(r"^r(\d{4,})(-[A-Za-z0-9_.-]+)?$")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    seq INTEGER UNIQUE NOT NULL,
    kind TEXT NOT NULL,
    status TEXT NOT NULL,
    reason TEXT,
    parent TEXT,
    name TEXT,
    created REAL NOT NULL,
    ended REAL,
    pid INTEGER,
    host TEXT,
    proc_start TEXT,
    config_hash TEXT,
    data_fingerprint TEXT,
    eval_fingerprint TEXT,
    summary TEXT
);
CREATE TABLE IF NOT EXISTS test_access (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    run TEXT NOT NULL,
    candidate TEXT NOT NULL,
    time REAL NOT NULL,
    result TEXT
);
"""


def _now() -> float:
    return time.time()


def iso(ts: float | None) -> str:
    """Seconds since the epoch as an ISO-8601 UTC string ('' for None)."""
    return "" if ts is None else datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _proc_start(pid: int) -> str | None:
    """The kernel start time of ``pid`` (field 22 of /proc/PID/stat), to tell a reused pid apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int, proc_start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if proc_start is not None and Path("/proc").exists():
        return _proc_start(pid) == proc_start
    return True


@dataclass
class RunRecord:
    """One row of the index."""

    id: str
    seq: int
    kind: str
    status: str
    reason: str | None
    parent: str | None
    name: str | None
    created: float
    ended: float | None
    config_hash: str | None
    data_fingerprint: str | None
    eval_fingerprint: str | None
    summary: dict[str, Any]

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> "RunRecord":
        return cls(
            id=row["id"], seq=row["seq"], kind=row["kind"], status=row["status"], reason=row["reason"],
            parent=row["parent"], name=row["name"], created=row["created"], ended=row["ended"],
            config_hash=row["config_hash"], data_fingerprint=row["data_fingerprint"],
            eval_fingerprint=row["eval_fingerprint"], summary=json.loads(row["summary"] or "{}"),
        )


class Run:
    """A run in progress: its id, folder and helpers to record evidence into it."""

    def __init__(self, registry: "Registry", record: RunRecord):
        self.registry = registry
        self.id = record.id
        self.kind = record.kind
        self.parent = record.parent
        self.dir = registry.runs_dir / record.id
        self.dir.mkdir(parents=True, exist_ok=True)
        self.summary: dict[str, Any] = {}
        self.log = logging.getLogger(f"tuneproof.run.{self.id}")

    def path(self, name: str) -> Path:
        return self.dir / name

    def write_json(self, name: str, obj: Any) -> Path:
        """Write a schema-versioned JSON artifact into the run folder, atomically."""
        return write_json(self.dir / name, obj)

    def metric(self, **row: Any) -> None:
        """Append one row (step, loss, lr, ...) to ``metrics.jsonl``."""
        append_jsonl(self.dir / "metrics.jsonl", {"time": round(_now(), 3), **row})

    def note(self, message: str) -> None:
        """Append a line to ``log.txt``."""
        with open(self.dir / "log.txt", "a", encoding="utf-8") as fh:
            fh.write(f"{iso(_now())} {message}\n")

    def set(self, **fields: Any) -> None:
        """Set indexed fields: config_hash, data_fingerprint, eval_fingerprint."""
        self.registry._update(self.id, **fields)

    def update_summary(self, **values: Any) -> None:
        """Merge values into the run's summary (stored in the index and ``summary.json``)."""
        self.summary.update(values)
        self.registry._update(self.id, summary=json.dumps(self.summary, default=str))
        self.write_json("summary.json", {"run": self.id, "kind": self.kind, **self.summary})


class Terminated(BaseException):
    """Raised inside a run by SIGTERM so that it is recorded as interrupted."""


_Terminated = Terminated  # former private name


class Registry:
    """The SQLite index of a study's runs.

    Args:
        study_dir: the study folder (holds ``tuneproof.yaml``).
    """

    def __init__(self, study_dir: str | Path):
        self.study_dir = Path(study_dir)
        self.runs_dir = self.study_dir / "runs"
        self.db_path = self.study_dir / DB_NAME
        self.study_dir.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(self.db_path, timeout=30, isolation_level=None)
        self._conn.row_factory = sqlite3.Row
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.executescript(_SCHEMA)
        #: callables ``(registry, record)`` run after a run's final status is recorded (trackers)
        self.end_hooks: list = []
        self.mark_stale()

    def close(self) -> None:
        self._conn.close()

    # ------------------------------------------------------------------ queries
    def get(self, run_id: str) -> RunRecord:
        """The record of ``run_id`` (a full id, or its ``rNNNN`` prefix).

        Raises:
            TuneproofError: no such run (lists the latest ids).
        """
        row = self._conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            m = re.match(r"^r(\d+)$", run_id)
            if m:
                row = self._conn.execute("SELECT * FROM runs WHERE seq = ?", (int(m.group(1)),)).fetchone()
        if row is None:
            known = [r.id for r in self.list()][-5:]
            raise TuneproofError(
                f"run '{run_id}' does not exist in {self.db_path}",
                hint=f"known runs: {', '.join(known) if known else 'none yet'}; see `tuneproof runs`",
            )
        return RunRecord.from_row(row)

    def list(self, kind: str | None = None, status: str | None = None) -> list[RunRecord]:
        q, args = "SELECT * FROM runs", []
        cond = []
        if kind:
            cond.append("kind = ?")
            args.append(kind)
        if status:
            cond.append("status = ?")
            args.append(status)
        if cond:
            q += " WHERE " + " AND ".join(cond)
        q += " ORDER BY seq"
        return [RunRecord.from_row(r) for r in self._conn.execute(q, args).fetchall()]

    def latest(self, kind: str, status: str = "completed") -> RunRecord | None:
        runs = self.list(kind=kind, status=status)
        return runs[-1] if runs else None

    def run_dir(self, run_id: str) -> Path:
        return self.runs_dir / self.get(run_id).id

    # ------------------------------------------------------------------ lifecycle
    def _update(self, run_id: str, **fields: Any) -> None:
        if not fields:
            return
        cols = ", ".join(f"{k} = ?" for k in fields)
        self._conn.execute(f"UPDATE runs SET {cols} WHERE id = ?", (*fields.values(), run_id))

    def create(self, kind: str, *, parent: str | None = None, name: str | None = None) -> Run:
        """Insert a new ``running`` run and make its folder. Ids are ``r0001``, ``r0002-name``..."""
        if kind not in KINDS:
            raise ValueError(f"unknown run kind {kind!r}")
        if name is not None and not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise TuneproofError(f"run name '{name}': use letters, digits, '.', '_' and '-' only")
        pid = os.getpid()
        with self._conn:
            self._conn.execute("BEGIN IMMEDIATE")
            seq = (self._conn.execute("SELECT COALESCE(MAX(seq), 0) FROM runs").fetchone()[0]) + 1
            run_id = f"r{seq:04d}" + (f"-{name}" if name else "")
            self._conn.execute(
                "INSERT INTO runs (id, seq, kind, status, parent, name, created, pid, host, proc_start) "
                "VALUES (?, ?, ?, 'running', ?, ?, ?, ?, ?, ?)",
                (run_id, seq, kind, parent, name, _now(), pid, socket.gethostname(), _proc_start(pid)),
            )
        return Run(self, self.get(run_id))

    def finish(self, run_id: str, status: str, reason: str | None = None) -> None:
        """Set the final status (completed, failed, interrupted, invalid) and the end time."""
        if status not in STATUSES or status == "running":
            raise ValueError(status)
        self._update(run_id, status=status, reason=reason, ended=_now())

    def invalidate(self, run_id: str, reason: str) -> RunRecord:
        """Mark a run invalid with a reason (by the user or by a check). The run stays listed."""
        rec = self.get(run_id)
        if not reason.strip():
            raise TuneproofError("invalidate needs a reason (--why)")
        prior = f" (was {rec.status}{': ' + rec.reason if rec.reason else ''})"
        if rec.status in ("running", "failed") and rec.reason and reason in rec.reason:
            prior = ""  # the failure was this very check (e.g. a NaN loss): say it once
        self._update(rec.id, status="invalid", reason=reason + prior, ended=rec.ended or _now())
        if rec.status != "running":  # a run invalidated after it ended: the hooks see the new status
            self._ended(rec.id)
        return self.get(rec.id)

    def _ended(self, run_id: str) -> None:
        """Run the end hooks; a hook never changes how the run ended (its error is one warning line)."""
        for hook in self.end_hooks:
            try:
                hook(self, self.get(run_id))
            except Exception as err:  # noqa: BLE001
                logging.getLogger("tuneproof").warning("end hook %s failed for %s: %s", getattr(hook, "__name__", hook), run_id, err)

    def mark_stale(self) -> list[str]:
        """Mark ``running`` runs whose process is gone as interrupted. Returns their ids."""
        stale = []
        host = socket.gethostname()
        for row in self._conn.execute("SELECT id, pid, host, proc_start FROM runs WHERE status = 'running'").fetchall():
            if row["host"] == host and row["pid"] is not None and not _alive(row["pid"], row["proc_start"]):
                stale.append(row["id"])
        for rid in stale:
            self.finish(rid, "interrupted", "process died without recording an end (found stale)")
        return stale

    @contextlib.contextmanager
    def run(self, kind: str, *, parent: str | None = None, name: str | None = None) -> Iterator[Run]:
        """Create a run, yield it, and record how it ended.

        Normal exit -> completed; ``KeyboardInterrupt`` or SIGTERM -> interrupted; any other
        exception -> failed with its message (the exception is re-raised). A run that a check
        marked ``invalid`` inside the block keeps that status.
        """
        run = self.create(kind, parent=parent, name=name)
        run.note(f"start kind={kind} parent={parent}")
        with self._lifecycle(run):
            yield run

    @contextlib.contextmanager
    def reopen(self, run_id: str, *, note: str = "resume") -> Iterator[Run]:
        """Set an interrupted or failed run back to ``running`` in this process and record how it
        ends, like :meth:`run` (used by ``tuneproof resume``: the run keeps its id and folder).

        Raises:
            TuneproofError: the run is completed, invalid or still running in a live process.
        """
        rec = self.get(run_id)
        if rec.status not in ("interrupted", "failed"):
            raise TuneproofError(f"run {rec.id} is {rec.status}" + (f" ({rec.reason})" if rec.reason else ""),
                                 hint="only an interrupted or failed run can be continued")
        pid = os.getpid()
        self._update(rec.id, status="running", reason=None, ended=None, pid=pid, host=socket.gethostname(), proc_start=_proc_start(pid))
        run = Run(self, self.get(rec.id))
        run.summary = dict(rec.summary)
        run.note(f"{note} (was {rec.status}{': ' + rec.reason if rec.reason else ''})")
        with self._lifecycle(run):
            yield run

    @contextlib.contextmanager
    def _lifecycle(self, run: Run) -> Iterator[Run]:
        """Record how the block ends: completed, interrupted (Ctrl-C/SIGTERM, with the last step), failed."""

        def _on_term(signum, frame):  # noqa: ARG001
            raise Terminated(f"signal {signum}")

        old = None
        try:
            old = signal.signal(signal.SIGTERM, _on_term)
        except ValueError:  # not the main thread
            old = None
        try:
            yield run
        except (KeyboardInterrupt, Terminated) as err:
            if isinstance(err, KeyboardInterrupt):
                reason = f"interrupted ({err})" if str(err) else "interrupted by Ctrl-C"
            else:
                reason = f"terminated ({err})"
            last = run.summary.get("last_step")
            if last is not None:
                reason += f" at step {last}"
            run.note(reason)
            self.finish(run.id, "interrupted", reason)
            raise KeyboardInterrupt(reason) from None
        except BaseException as err:
            msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            run.note(f"failed: {type(err).__name__}: {err}")
            self.finish(run.id, "failed", f"{type(err).__name__}: {msg}"[:500])
            raise
        else:
            if self.get(run.id).status == "running":
                self.finish(run.id, "completed")
            run.note("end")
        finally:
            if old is not None:
                signal.signal(signal.SIGTERM, old)
            self._ended(run.id)

    # ------------------------------------------------------------------ sealed test split
    def log_test_access(self, run_id: str, candidate: str, result: dict[str, Any]) -> None:
        """Record one read of the reserved test split (every read is shown in the dossier)."""
        self._conn.execute(
            "INSERT INTO test_access (run, candidate, time, result) VALUES (?, ?, ?, ?)",
            (run_id, candidate, _now(), json.dumps(result, default=str)),
        )

    def test_accesses(self) -> list[dict[str, Any]]:
        rows = self._conn.execute("SELECT * FROM test_access ORDER BY seq").fetchall()
        return [{"run": r["run"], "candidate": r["candidate"], "time": r["time"], "result": json.loads(r["result"] or "{}")} for r in rows]
