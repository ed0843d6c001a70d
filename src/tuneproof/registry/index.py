"""The SQLite index of a study's runs (:class:`Registry`), mirrored in each run folder's ``run.json``: opening,
rebuilding from the folders, queries, creating and finishing runs."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import sqlite3
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tuneproof.errors import CheckFailed, TuneproofError
from tuneproof.io import (
    fault_cause,
    fault_message,
    read_json,
    remove_temps,
    space_note,
    write_json,
)
from tuneproof.registry.ballast import Ballast, _fault_error
from tuneproof.registry.cleanup import Cleanup
from tuneproof.registry.liveness import Liveness, _proc_start
from tuneproof.registry.paths import RELATIVE_PATHS, RecordedPath, read_recorded_path
from tuneproof.registry.records import (
    _CHECKED,
    DB_NAME,
    KINDS,
    RECORD_FILE,
    STATUSES,
    TEST_ACCESS_FILE,
    RunRecord,
    _now,
    _seq_of,
    record_problem,
    record_sha256,
)
from tuneproof.registry.run import CARRY, Run
from tuneproof.registry.sealed_test import SealedTestLog
from tuneproof.registry.signals import Lifecycle

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
    summary TEXT,
    heartbeat REAL
);
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT
);
CREATE TABLE IF NOT EXISTS test_access (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    run TEXT NOT NULL,
    candidate TEXT NOT NULL,
    time REAL NOT NULL,
    result TEXT
);
"""


class Registry(Ballast, Liveness, Cleanup, Lifecycle, SealedTestLog):
    """The SQLite index of a study's runs, mirrored in each run folder's ``run.json``.

    Args:
        study_dir: the study folder (holds ``tuneproof.yaml``).

    Raises:
        TuneproofError: the index is damaged (one line; ``tuneproof registry rebuild``), or the
            study folder is read-only / the disk is full (one line naming the folder and cause).
    """

    def __init__(self, study_dir: str | Path):
        self.study_dir = Path(study_dir)
        self.runs_dir = self.study_dir / "runs"
        self.db_path = self.study_dir / DB_NAME
        self._lock = threading.RLock()
        self.rebuilt: dict[str, Any] | None = None
        #: callables ``(registry, record)`` run when a run starts or is reopened (trackers)
        self.start_hooks: list = []
        #: callables ``(registry, run_id, row)`` run after each ``metrics.jsonl`` row (trackers)
        self.step_hooks: list = []
        #: callables ``(registry, record)`` run after a run's final status is recorded (trackers)
        self.end_hooks: list = []
        try:
            self.study_dir.mkdir(parents=True, exist_ok=True)
            missing = not self.db_path.exists() or self.db_path.stat().st_size == 0
            self._conn = self._connect(self.db_path)
            self._make_reserve()
            self.moved_from = self._home()
            if missing and self._record_folders():
                self.rebuilt = self._load_folders()
                print(
                    f"note: {self.db_path} was missing: rebuilt from "
                    f"{len(self.rebuilt['runs'])} run folder(s) in {self.runs_dir}",
                    file=sys.stderr,
                )
            self.mark_stale()
        except sqlite3.DatabaseError as err:
            raise self._db_error(err) from None
        except OSError as err:
            cause = fault_cause(err, self.study_dir)
            if cause is None:
                raise
            raise _fault_error(
                err, cause, self.study_dir, "free space or make the study folder writable, then run the command again"
            ) from None

    def _home(self) -> Path | None:
        """The folder this study was copied or moved from (the registry records the folder it was created
        in, ``meta.study_dir``), or None when it is still there. A registry without the record (written by
        an older version, or rebuilt) records the current folder."""
        here = str(self.study_dir.resolve())
        row = self._conn.execute("SELECT value FROM meta WHERE key = 'study_dir'").fetchone()
        if row is None:
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('study_dir', ?)", (here,))
            return None
        return None if row["value"] == here else Path(row["value"])

    def recorded_path(self, recorded: str, summary: dict[str, Any] | None = None) -> RecordedPath:
        """A path a run recorded (``summary``: that run's), read in this study folder (:func:`read_recorded_path`)."""
        relative = bool((summary or {}).get(RELATIVE_PATHS))
        return read_recorded_path(self.study_dir, recorded, self.moved_from, relative_records=relative)

    def _db_error(self, err: sqlite3.DatabaseError) -> TuneproofError:
        cause = fault_cause(err, self.study_dir)
        if cause is not None:
            return TuneproofError(
                f"{self.db_path}: {cause} ({err}{space_note(err, cause, self.study_dir)})",
                hint="free space or make the study folder writable, then run the command again",
            )
        if isinstance(err, sqlite3.OperationalError) and "locked" in str(err):
            return TuneproofError(
                f"{self.db_path}: locked by another process for 30 s ({err})", hint="run the command again"
            )
        return TuneproofError(
            f"{self.db_path}: the run registry is damaged ({err})",
            hint="rebuild it from the run folders: tuneproof registry rebuild",
        )

    @staticmethod
    def _connect(path: Path) -> sqlite3.Connection:
        conn = sqlite3.connect(path, timeout=30, isolation_level=None)
        try:
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA journal_mode=WAL")
            check = conn.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise sqlite3.DatabaseError(f"quick_check: {check}")
            conn.executescript(_SCHEMA)
            cols = {r["name"] for r in conn.execute("PRAGMA table_info(runs)")}
            if "heartbeat" not in cols:  # an index written before heartbeats
                conn.execute("ALTER TABLE runs ADD COLUMN heartbeat REAL")
        except BaseException:
            conn.close()
            raise
        return conn

    def close(self) -> None:
        self._conn.close()

    # ------------------------------------------------------------------ the run folders
    def _record_folders(self) -> list[Path]:
        """Run folders (``runs/rNNNN[-name]/``), in id order."""
        if not self.runs_dir.is_dir():
            return []
        dirs = [d for d in self.runs_dir.iterdir() if d.is_dir() and _seq_of(d.name) is not None]
        return sorted(dirs, key=lambda d: (_seq_of(d.name), d.name))

    def _columns(self) -> list[str]:
        return [r["name"] for r in self._conn.execute("PRAGMA table_info(runs)")]

    def _record(self, run_id: str, conn: sqlite3.Connection | None = None) -> dict[str, Any]:
        row = (conn or self._conn).execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        rec = {k: row[k] for k in row.keys()}
        rec["summary"] = json.loads(rec.get("summary") or "{}")
        return rec

    def _sync(self, run_id: str, conn: sqlite3.Connection | None = None) -> None:
        """Write ``runs/<id>/run.json`` from the index row (atomically), with its ``record_sha256``."""
        with self._lock:
            rec = self._record(run_id, conn)
            write_json(
                self.runs_dir / run_id / RECORD_FILE,
                {"record": "tuneproof run", **rec, "record_sha256": record_sha256(rec)},
            )

    def check_record(self, run_id: str) -> RunRecord:
        """The run's record, after checking ``runs/<id>/run.json`` against itself and the index, for a
        step that relies on it (export, compare, test: docs/CONTRACTS.md, "What the run record authenticates").

        A ``run.json`` edited by hand (its ``record_sha256`` no longer matches) is refused, naming the first
        field that differs from the index; one that tuneproof wrote but that is behind the index (a crash
        between the two writes) is written again from the index. A ``run.json`` of an older tuneproof
        (no ``record_sha256``) is not checked.

        Raises:
            CheckFailed: the record was edited after it was written (exit 3).
        """
        rec = self.get(run_id)
        path = self.runs_dir / rec.id / RECORD_FILE
        try:
            found = read_json(path)
        except TuneproofError:
            return rec
        if not isinstance(found, dict) or "record_sha256" not in found:
            return rec
        problem = record_problem(found, self._record(rec.id))
        if problem is not None:
            raise CheckFailed(
                f"{path}: edited after it was written ({problem})",
                hint="run.json mirrors the index (tuneproof.sqlite), which still holds the record: "
                "undo the edit; nothing was read from it",
            )
        if {k: v for k, v in found.items() if k in _CHECKED} != {
            k: v for k, v in self._record(rec.id).items() if k in _CHECKED
        }:
            self._sync(rec.id)  # written by tuneproof, behind the index: the index wins
        return rec

    def _load_folders(self) -> dict[str, Any]:
        """Insert every run folder's record into the (empty) index. Returns ``{"runs", "lost", "test_accesses"}``.

        A folder without a readable ``run.json`` (written before records existed, or damaged) is
        listed as ``invalid`` with the reason, its kind taken from ``summary.json`` when present.
        """
        cols = set(self._columns())
        restored, lost, accesses = [], [], []
        taken: set[int] = set()
        for d in self._record_folders():
            seq = _seq_of(d.name)
            try:
                rec = read_json(d / RECORD_FILE)
                if not isinstance(rec, dict) or rec.get("id") != d.name:
                    raise TuneproofError(f"{d / RECORD_FILE}: not the record of {d.name}")
                problem = record_problem(rec) if "record_sha256" in rec else None
                if problem is not None:  # edited by hand: kept, listed invalid with the reason
                    was = rec.get("status")
                    rec["status"] = "invalid"
                    rec["reason"] = f"{RECORD_FILE} edited after it was written ({problem}); recorded as {was}"
                    lost.append(d.name)
            except TuneproofError:
                summary = {}
                try:
                    summary = read_json(d / "summary.json")
                except TuneproofError:
                    pass
                created = min((p.stat().st_mtime for p in d.iterdir()), default=d.stat().st_mtime)
                rec = {
                    "id": d.name,
                    "seq": seq,
                    "kind": summary.get("kind", "unknown") if isinstance(summary, dict) else "unknown",
                    "status": "invalid",
                    "reason": f"record lost: rebuilt from the folder without a readable {RECORD_FILE}",
                    "created": created,
                    "summary": summary if isinstance(summary, dict) else {},
                }
                lost.append(d.name)
            if seq in taken:  # two folders with one number: the second keeps its folder, the index a free number
                lost.append(d.name)
                rec["reason"] = (rec.get("reason") or "") + f" (number {seq} taken by another folder)"
                seq = max(taken) + 1000
            taken.add(seq)
            rec["seq"] = seq
            row = {k: v for k, v in rec.items() if k in cols}
            row["summary"] = json.dumps(row.get("summary") or {}, default=str)
            self._conn.execute(
                f"INSERT INTO runs ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", tuple(row.values())
            )
            restored.append(d.name)
            if (d / TEST_ACCESS_FILE).exists():
                try:
                    for a in read_json(d / TEST_ACCESS_FILE).get("accesses", []):
                        accesses.append(a)
                except (TuneproofError, AttributeError):
                    pass
        for a in sorted(accesses, key=lambda a: a.get("time", 0)):
            self._conn.execute(
                "INSERT INTO test_access (run, candidate, time, result) VALUES (?, ?, ?, ?)",
                (a["run"], a["candidate"], a["time"], json.dumps(a.get("result", {}), default=str)),
            )
        for rid in lost:
            self._sync(rid)
        return {"runs": restored, "lost": lost, "test_accesses": len(accesses)}

    @classmethod
    def rebuild(cls, study_dir: str | Path) -> dict[str, Any]:
        """Rebuild ``tuneproof.sqlite`` from the run folders (``tuneproof registry rebuild``).

        The current index (damaged or not) is moved aside to ``tuneproof.sqlite.damaged-<UTC
        time>`` (with its ``-wal``/``-shm`` files), never deleted. Run it while no command is
        running in the study.

        Returns ``{"runs": [ids], "lost": [ids without a readable run.json], "test_accesses": n,
        "kept": path of the old index or None, "stale": [ids found stale]}``.
        """
        study_dir = Path(study_dir)
        db = study_dir / DB_NAME
        kept = None
        if db.exists():
            stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
            kept = db.with_name(f"{DB_NAME}.damaged-{stamp}")
            os.replace(db, kept)
            for ext in ("-wal", "-shm"):
                side = db.with_name(DB_NAME + ext)
                if side.exists():
                    os.replace(side, kept.with_name(kept.name + ext))
        reg = cls.__new__(cls)
        reg.study_dir, reg.runs_dir, reg.db_path, reg._lock, reg.rebuilt = (
            study_dir,
            study_dir / "runs",
            db,
            threading.RLock(),
            None,
        )
        reg.start_hooks, reg.step_hooks, reg.end_hooks = [], [], []
        reg.moved_from = None
        try:
            reg._conn = cls._connect(db)
            out = reg._load_folders()
            out["stale"] = reg.mark_stale()
        except sqlite3.DatabaseError as err:
            raise reg._db_error(err) from None
        finally:
            if hasattr(reg, "_conn"):
                reg._conn.close()
        out["kept"] = str(kept) if kept else None
        return out

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

    def row(self, run_id: str) -> dict[str, Any]:
        """Every column of the run's index row (host, pid, heartbeat... included)."""
        return self._record(self.get(run_id).id)

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

    def run_json(self, run_id: str, name: str) -> Any:
        """The JSON file ``name`` of run ``run_id`` (``runs/<id>/<name>``), or None when the run has none.

        Raises:
            TuneproofError: no such run (:meth:`get`).
        """
        path = self.run_dir(run_id) / name
        return read_json(path) if path.exists() else None

    # ------------------------------------------------------------------ lifecycle
    def _update(self, run_id: str, **fields: Any) -> None:
        if not fields:
            return
        cols = ", ".join(f"{k} = ?" for k in fields)
        with self._lock:
            self._conn.execute(f"UPDATE runs SET {cols} WHERE id = ?", (*fields.values(), run_id))
            self._sync(run_id)

    def _next_seq(self) -> int:
        in_index = self._conn.execute("SELECT COALESCE(MAX(seq), 0) FROM runs").fetchone()[0]
        in_folders = max((_seq_of(d.name) or 0 for d in self._record_folders()), default=0)
        return max(in_index, in_folders) + 1

    def create(self, kind: str, *, parent: str | None = None, name: str | None = None) -> Run:
        """Insert a new ``running`` run and make its folder. Ids are ``r0001``, ``r0002-name``...

        The number is past the largest in the index and among the run folders, and the folder is
        made new (never reused). A fault of the machine while recording raises a one-line
        :class:`TuneproofError` (the run, if inserted, is marked failed).
        """
        if kind not in KINDS:
            raise ValueError(f"unknown run kind {kind!r}")
        if name is not None and not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise TuneproofError(f"run name '{name}': use letters, digits, '.', '_' and '-' only")
        pid = os.getpid()
        run_id = None
        try:
            with self._lock, self._conn:
                self._conn.execute("BEGIN IMMEDIATE")
                seq = self._next_seq()
                self.runs_dir.mkdir(parents=True, exist_ok=True)
                while True:
                    run_id = f"r{seq:04d}" + (f"-{name}" if name else "")
                    try:
                        (self.runs_dir / run_id).mkdir()
                        break
                    except FileExistsError:
                        seq += 1
                now = _now()
                self._conn.execute(
                    "INSERT INTO runs (id, seq, kind, status, parent, name, created, pid, host, proc_start, heartbeat) "
                    "VALUES (?, ?, ?, 'running', ?, ?, ?, ?, ?, ?, ?)",
                    (run_id, seq, kind, parent, name, now, pid, socket.gethostname(), _proc_start(pid), now),
                )
            self._sync(run_id)
        except (OSError, sqlite3.OperationalError) as err:
            cause = fault_cause(err, self.study_dir)
            if cause is None:
                raise
            if run_id is not None:
                if self._conn.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone():
                    self._finish_quietly(
                        run_id, "failed", f"{cause}: {fault_message(err, cause, self.runs_dir / run_id)}"
                    )
                remove_temps(self.runs_dir / run_id)
            raise _fault_error(
                err,
                cause,
                self.runs_dir if run_id is None else self.runs_dir / run_id,
                "free space or make the study folder writable, then run the command again",
            ) from None
        run = Run(self, self.get(run_id))
        if CARRY:
            run.update_summary(**CARRY)
        return run

    def finish(self, run_id: str, status: str, reason: str | None = None) -> None:
        """Set the final status (completed, failed, interrupted, invalid) and the end time."""
        if status not in STATUSES or status == "running":
            raise ValueError(status)
        self._update(run_id, status=status, reason=reason, ended=_now())

    def _finish_quietly(self, run_id: str, status: str, reason: str) -> None:
        """:meth:`finish` when the machine may be failing: the index row first; ``run.json`` if it
        can be written. On a full disk the ballast file is deleted first to make room."""
        if reason.startswith("disk full"):
            self._release_reserve()
        try:
            with self._lock:
                self._conn.execute(
                    "UPDATE runs SET status = ?, reason = ?, ended = ? WHERE id = ?", (status, reason, _now(), run_id)
                )
        except sqlite3.Error:
            pass
        try:
            self._sync(run_id)
        except (OSError, sqlite3.Error):
            pass

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
        if self.end_hooks:
            self._hooks(self.end_hooks, self.get(run_id))

    def _hooks(self, hooks: list, *args: Any) -> None:
        """Call each hook with ``(self, *args)``; a hook never changes the run (its error is one log line)."""
        for hook in hooks:
            try:
                hook(self, *args)
            except Exception as err:  # noqa: BLE001
                logging.getLogger("tuneproof").warning("hook %s failed: %s", getattr(hook, "__name__", hook), err)
