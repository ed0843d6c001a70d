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
import time
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
    DB_NAME,
    KINDS,
    RECORD_FILE,
    RECORD_SCHEMA,
    STATUSES,
    TEST_ACCESS_FILE,
    RunRecord,
    _now,
    _seq_of,
    clock_flag,
    iso,
    record_disagreement,
    record_problem,
    record_sha256,
)
from tuneproof.registry.run import CARRY, Run
from tuneproof.registry.sealed_test import SealedTestLog
from tuneproof.registry.signals import Lifecycle

#: ``meta`` keys a rebuild carries over from the index it replaces, when that one can still be read (the seal of the
#: frozen hypothesis, :mod:`tuneproof.hypothesis`, outlives the run that froze it)
KEPT_META = ("hypothesis_seal",)
ORPHAN_AFTER_S = 60.0  # an empty run folder unknown to the index this old was left by a killed process

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
    heartbeat REAL,
    record_sha256 TEXT
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
                if self.rebuilt["edited"]:
                    print(
                        f"warning: {len(self.rebuilt['edited'])} {RECORD_FILE} edited after it was written (hash "
                        f"missing or not matching), listed invalid: {', '.join(self.rebuilt['edited'])} (see "
                        "`tuneproof runs`)",
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

    def meta(self, key: str) -> str | None:
        """The value the index keeps under ``key`` in its ``meta`` table (``study_dir``, ``hypothesis_seal``); None."""
        row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else row["value"]

    def set_meta(self, key: str, value: str) -> None:
        """Keep ``value`` under ``key`` in the index's ``meta`` table (replacing it); a rebuild carries the keys of
        :data:`KEPT_META` over from the index it replaces when that one can still be read."""
        with self._lock:
            self._conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

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
            if "record_sha256" not in cols:  # an index written before it kept the hash of each run.json it wrote
                conn.execute("ALTER TABLE runs ADD COLUMN record_sha256 TEXT")
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

    def _drop_empty_orphans(self) -> list[str]:
        """Remove run folders that are empty, unknown to the index and older than :data:`ORPHAN_AFTER_S`: a
        process killed (``kill -9``) between making the folder and recording the run left them (nothing was
        written into them; ``rmdir`` removes only an empty folder). Returns their names."""
        known = {r[0] for r in self._conn.execute("SELECT id FROM runs")}
        now = time.time()  # compared with the file system's mtime, not a recorded time
        gone = []
        for d in self._record_folders():
            try:
                if d.name in known or now - d.stat().st_mtime < ORPHAN_AFTER_S or any(d.iterdir()):
                    continue
                d.rmdir()
            except OSError:
                continue
            gone.append(d.name)
        return gone

    def _columns(self) -> list[str]:
        return [r["name"] for r in self._conn.execute("PRAGMA table_info(runs)")]

    def _record(self, run_id: str, conn: sqlite3.Connection | None = None) -> dict[str, Any]:
        row = (conn or self._conn).execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        rec = {k: row[k] for k in row.keys()}
        rec["summary"] = json.loads(rec.get("summary") or "{}")
        return rec

    def _sync(self, run_id: str, conn: sqlite3.Connection | None = None) -> None:
        """Write ``runs/<id>/run.json`` from the index row (atomically), with its ``record_sha256`` (also kept in
        the row: a run.json of this run must carry one from now on)."""
        with self._lock:
            rec = self._record(run_id, conn)
            digest = record_sha256(rec)
            write_json(
                self.runs_dir / run_id / RECORD_FILE,
                {"schema_version": RECORD_SCHEMA, "record": "tuneproof run", **rec, "record_sha256": digest},
            )
            if rec.get("record_sha256") != digest:  # the index keeps the hash of the run.json it last wrote
                (conn or self._conn).execute("UPDATE runs SET record_sha256 = ? WHERE id = ?", (digest, run_id))

    def check_record(self, run_id: str) -> RunRecord:
        """The run's record, after checking ``runs/<id>/run.json`` against itself and the index, for a
        step that relies on it (export, compare, test: docs/CONTRACTS.md, "What the run record authenticates").

        Refused, naming the file and what is wrong:

        - a ``run.json`` edited by hand (its ``record_sha256`` no longer matches), naming the first field that
          differs from the index;
        - a ``run.json`` without ``record_sha256`` although a tuneproof that hashes its records wrote it (its
          ``schema_version`` is 2, the index kept its hash, or an earlier run's record carries one): a removed
          hash is not a pass. Only a record of schema 1 (an older tuneproof) may lack it;
        - a whole ``run.json`` (its hash valid) that disagrees with the index: neither is taken, the first field
          that differs is named (a record restored from an older copy, an edited index, a command killed
          between its two writes);
        - a missing or unreadable ``run.json`` of a run the index kept a hash for.

        Raises:
            CheckFailed: (exit 3) as above; nothing is rewritten.
        """
        rec = self.get(run_id)
        path = self.runs_dir / rec.id / RECORD_FILE
        index = self._record(rec.id)
        kept = index.get("record_sha256")
        try:
            found = read_json(path)
        except TuneproofError as err:
            if not kept:
                return rec
            why = err.message.removeprefix(str(path) + ":").strip()
            raise CheckFailed(
                f"{path}: the run's record is missing or unreadable ({why}); "
                f"the index kept its record_sha256 {kept[:16]}",
                hint="restore the run folder's run.json; nothing was read from the run",
            ) from None
        if not isinstance(found, dict):
            found = {}
        problem = record_problem(found, index, hash_expected=self._hash_expected(rec.id, index))
        if problem is not None:
            raise CheckFailed(
                f"{path}: edited after it was written ({problem})",
                hint="run.json mirrors the index (tuneproof.sqlite), which still holds the record: "
                "undo the edit; nothing was read from it",
            )
        differs = record_disagreement(found, index)
        if differs is not None:
            which = (
                "the index changed after run.json was last written (an edit of tuneproof.sqlite, or a command "
                "killed between its two writes)"
                if kept == found.get("record_sha256")
                else "run.json is not the one the index last wrote (a record restored from an older copy, or "
                "rehashed by hand)"
            )
            raise CheckFailed(
                f"{path}: its record_sha256 is valid but it disagrees with the index {self.db_path.name} "
                f"({differs}): {which}; neither is taken",
                hint="find which of the two was changed; `tuneproof registry rebuild` rebuilds the index from the "
                "run folders (run.json wins), or restore the run folder from a copy",
            )
        return rec

    def _hash_expected(self, run_id: str, index: dict[str, Any] | None = None) -> str | None:
        """Why ``run_id``'s ``run.json`` must carry ``record_sha256`` whatever its ``schema_version`` says: the
        index kept the hash of the run.json it wrote, or the record of an earlier run carries one (the study was
        run by a tuneproof that hashes its records before this run began). None when nothing says so."""
        kept = (index or {}).get("record_sha256")
        if kept:
            return f"the index kept its record_sha256 {kept[:16]}"
        seq = _seq_of(run_id)
        for d in self._record_folders():
            if seq is None or (_seq_of(d.name) or 0) >= seq:
                break
            with contextlib.suppress(TuneproofError):
                other = read_json(d / RECORD_FILE)
                if isinstance(other, dict) and "record_sha256" in other:
                    return f"the record of the earlier run {d.name} carries one"
        return None

    def _load_folders(self) -> dict[str, Any]:
        """Insert every run folder's record into the (empty) index. Returns ``{"runs", "lost", "edited",
        "test_accesses"}``.

        A folder without a readable ``run.json`` (written before records existed, or damaged) is
        listed as ``invalid`` with the reason, its kind taken from ``summary.json`` when present (``lost``). A
        ``run.json`` edited after it was written (:func:`record_problem`: its hash does not match; or it has no
        ``record_sha256`` although its ``schema_version`` is 2 or an earlier run's record carries one, so a
        removed hash is never rebuilt ``completed``) is kept and listed ``invalid`` with the reason and the
        status it claimed (``edited``).
        """
        cols = set(self._columns())
        restored, lost, edited, accesses = [], [], [], []
        taken: set[int] = set()
        hashed: str | None = None  # the first run folder whose record carries record_sha256
        for d in self._record_folders():
            seq = _seq_of(d.name)
            with contextlib.suppress(OSError):
                if not any(d.iterdir()):  # made by a process killed before it recorded anything: no run
                    d.rmdir()
                    continue
            try:
                rec = read_json(d / RECORD_FILE)
                if not isinstance(rec, dict) or rec.get("id") != d.name:
                    raise TuneproofError(f"{d / RECORD_FILE}: not the record of {d.name}")
                why = f"the record of the earlier run {hashed} carries one" if hashed else None
                problem = record_problem(rec, hash_expected=why)
                hashed = hashed or (d.name if "record_sha256" in rec else None)
                if problem is not None:  # edited by hand (or its hash removed): kept, listed invalid with the reason
                    was = rec.get("status")
                    rec["status"] = "invalid"
                    rec["reason"] = f"{RECORD_FILE} edited after it was written ({problem}); recorded as {was}"
                    rec.pop("record_sha256", None)  # the index keeps no hash of a record it does not vouch for
                    edited.append(d.name)
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
        for rid in lost + edited:
            self._sync(rid)
        return {"runs": restored, "lost": lost, "edited": edited, "test_accesses": len(accesses)}

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
        carried = cls._readable_meta(db)
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
            for key, value in carried.items():
                reg.set_meta(key, value)
            out = reg._load_folders()
            out["stale"] = reg.mark_stale()
        except sqlite3.DatabaseError as err:
            raise reg._db_error(err) from None
        finally:
            if hasattr(reg, "_conn"):
                reg._conn.close()
        out["kept"] = str(kept) if kept else None
        return out

    @staticmethod
    def _readable_meta(db: Path) -> dict[str, str]:
        """The :data:`KEPT_META` values of the index ``db`` when it can still be read (read-only), else {}."""
        if not db.is_file():
            return {}
        try:
            conn = sqlite3.connect(db.resolve().as_uri() + "?mode=ro&immutable=1", uri=True, timeout=5)  # no side files
            try:
                rows = conn.execute(
                    f"SELECT key, value FROM meta WHERE key IN ({', '.join('?' * len(KEPT_META))})", KEPT_META
                ).fetchall()
            finally:
                conn.close()
        except sqlite3.Error:
            return {}
        return {k: v for k, v in rows if isinstance(v, str)}

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
                self._drop_empty_orphans()  # the number an empty folder of a killed process held is free again
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
        ended = _now()
        self._update(run_id, status=status, reason=reason, ended=ended, **self._clock_fields(run_id, ended))

    def _clock_fields(self, run_id: str, ended: float) -> dict[str, Any]:
        """``{"summary": ...}`` with :func:`~tuneproof.registry.records.clock_flag` added when the run ends
        before it started (the clock went back), else ``{}``; a line in the run's log and on stderr says so."""
        row = self._conn.execute("SELECT created, summary FROM runs WHERE id = ?", (run_id,)).fetchone()
        flag = clock_flag(row["created"], ended) if row is not None else None
        if flag is None:
            return {}
        summary = {**json.loads(row["summary"] or "{}"), "clock_went_back": flag}
        print(f"warning: run {run_id}: {flag['note']}", file=sys.stderr)
        with contextlib.suppress(OSError):
            with open(self.runs_dir / run_id / "log.txt", "a", encoding="utf-8") as fh:
                fh.write(f"{iso(ended)} {flag['note']}\n")
        return {"summary": json.dumps(summary, default=str)}

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
