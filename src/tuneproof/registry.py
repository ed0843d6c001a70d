"""The run registry: every command that does work is a run with an id, a folder and a status.

Layout inside a study folder::

    tuneproof.yaml
    tuneproof.sqlite          # the index (stdlib sqlite3), rebuilt from the run folders when lost
    runs/r0007-lora-r16/      # run.json (the run's own record), config.json, env.json, data.json,
                              # log.txt, metrics.jsonl, outputs.jsonl, summary.json

Statuses: running -> completed | failed | interrupted | invalid. A run is never deleted.

The run folder is the source of truth: ``runs/<id>/run.json`` holds the run's whole record (id,
kind, status, reason, times, host/pid, heartbeat, fingerprints, summary) and is rewritten
atomically with every change of the index row; reads of the reserved test split are also kept in
``runs/<id>/test_access.json``. So:

- a deleted ``tuneproof.sqlite`` is rebuilt from the run folders automatically the next time the
  registry is opened (one note on stderr); a damaged one is reported in one line and rebuilt with
  ``tuneproof registry rebuild`` (the damaged file is kept beside it as
  ``tuneproof.sqlite.damaged-<time>``);
- a new run's id is past the largest of the index and the run folders, and its folder must not
  exist: a run never appends to another run's folder.

Liveness: a live run's process writes its last-seen time (``heartbeat``) every
:data:`HEARTBEAT_S` seconds. A ``running`` run is found stale, and marked ``interrupted`` with the
reason, when its process is gone on this host (pid and process start time), or, whatever the host
(a restarted container has a new hostname), when its heartbeat is older than
:data:`STALE_AFTER_S`. ``tuneproof runs mark-interrupted RUN --why ...`` marks one explicitly.

Faults of the machine inside a run (disk full, read-only folder) mark it ``failed`` with the
reason ``disk full: ...`` / ``read-only: ...``, remove its temporary files and raise a one-line
:class:`TuneproofError` (exit 2); a train run so failed is continued by ``tuneproof resume``. So
that a truly full disk still has room for that record, the study folder keeps a 256 KiB ballast
file ``.tuneproof.reserve``, deleted when the disk is found full and made again at a later open.
Temporary files (``.NAME.*.tmp``) left in the folders of runs that are no longer running, and
``exports/.rNNNN.*`` folders left by a killed export, and the temp folder and lock file an export
run recorded before it was killed (beside any ``--out`` folder), are removed when the next run starts.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import sqlite3
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tuneproof import clock, procs
from tuneproof.errors import CheckFailed, Stopped, Terminated, TuneproofError
from tuneproof.io import (
    append_jsonl,
    fault_cause,
    fault_message,
    is_temp_name,
    read_json,
    remove_free_lock,
    remove_temps,
    space_note,
    write_json,
)
from tuneproof.study import STUDY_FILE

KINDS = ("baseline", "train", "eval", "test", "export", "preflight", "data-check", "compare", "report")
STATUSES = ("running", "completed", "failed", "interrupted", "invalid")
DB_NAME = "tuneproof.sqlite"
RECORD_FILE = "run.json"  # the run's own record, in its folder
TEST_ACCESS_FILE = "test_access.json"
HEARTBEAT_S = 30.0  # a live run writes its last-seen time this often (seconds)
ORPHAN_AFTER_S = 60.0  # an empty run folder unknown to the index this old was left by a killed process
STALE_AFTER_S = 300.0  # a running run unseen for this long (seconds) is stale, whatever its host
RESERVE_FILE = ".tuneproof.reserve"  # ballast freed on a full disk so that the failure can still be recorded
RESERVE_BYTES = 256 * 1024
_ID_RE = re.compile(r"^r(\d{4,})(-[A-Za-z0-9_.-]+)?$")

#: summary key -> what ``runs``, the tree and the dossier say about a run that carries it
OVERRIDES = {
    "preflight_override": "preflight overridden",
    "data_check_override": "data check overridden",
    "baseline_override": "baseline overridden",
    "rental_override": "rental reserve used",
}

#: summary values every run created in this process gets (``rental_override``: a command allowed to
#: spend the rental's reserve, :mod:`tuneproof.recipes.rental`); the CLI clears it per command
CARRY: dict[str, Any] = {}

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


def _now() -> float:
    return clock.now()


def iso(ts: float | None) -> str:
    """Seconds since the epoch as an ISO-8601 UTC string ('' for None)."""
    return "" if ts is None else datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def override_flags(summary: dict[str, Any], *, with_reason: bool = True) -> list[str]:
    """``["data check overridden: no time", ...]``: the protocol steps a run skipped (its summary's
    ``*_override`` keys, :data:`OVERRIDES`), with the recorded reasons."""
    out = []
    for key, label in OVERRIDES.items():
        reason = summary.get(key)
        if reason:
            out.append(f"{label}: {reason}" if with_reason and isinstance(reason, str) else label)
    return out


def _proc_start(pid: int) -> str | None:
    """The kernel start time of ``pid`` (:func:`tuneproof.procs.process_start`), to tell a reused pid apart."""
    return procs.process_start(pid)


def _alive(pid: int, proc_start: str | None) -> bool:
    return procs.alive(pid, proc_start)


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
    def from_row(cls, row: sqlite3.Row) -> RunRecord:
        return cls(
            id=row["id"],
            seq=row["seq"],
            kind=row["kind"],
            status=row["status"],
            reason=row["reason"],
            parent=row["parent"],
            name=row["name"],
            created=row["created"],
            ended=row["ended"],
            config_hash=row["config_hash"],
            data_fingerprint=row["data_fingerprint"],
            eval_fingerprint=row["eval_fingerprint"],
            summary=json.loads(row["summary"] or "{}"),
        )


class Run:
    """A run in progress: its id, folder and helpers to record evidence into it."""

    def __init__(self, registry: Registry, record: RunRecord):
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
        """Append one row (step, loss, lr, ...) to ``metrics.jsonl``, then hand it to the registry's
        step hooks (trackers logging while the run runs)."""
        row = {"time": round(_now(), 3), **row}
        append_jsonl(self.dir / "metrics.jsonl", row)
        self.registry._hooks(self.registry.step_hooks, self.id, row)

    def note(self, message: str) -> None:
        """Append a line to ``log.txt``."""
        path = self.dir / "log.txt"
        try:
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(f"{iso(_now())} {message}\n")
        except OSError as err:
            if err.filename is None:
                err.filename = str(path)
            raise

    def set(self, **fields: Any) -> None:
        """Set indexed fields: config_hash, data_fingerprint, eval_fingerprint."""
        self.registry._update(self.id, **fields)

    def update_summary(self, **values: Any) -> None:
        """Merge values into the run's summary (stored in the index and ``summary.json``)."""
        self.summary.update(values)
        self.registry._update(self.id, summary=json.dumps(self.summary, default=str))
        self.write_json("summary.json", {"run": self.id, "kind": self.kind, **self.summary})


_Terminated = Terminated  # former private name


@dataclass
class Stop:
    """How a run was stopped by a signal in this process (the CLI's last line names it)."""

    run_id: str
    kind: str
    how: str  # "SIGTERM", "Ctrl-C", or the stop's own words
    step: int | None  # the last optimizer step done (train runs)
    checkpoint: bool  # the run folder holds a checkpoint to resume from
    world_size: int
    study_dir: Path

    def line(self, command: str | None = None) -> str:
        """``run r0003 interrupted by SIGTERM at step 3; resume with: tuneproof resume r0003``; a run
        that cannot be resumed says to run ``command`` (the command line that started it) again."""
        how = f"by {self.how}" if self.how in ("SIGTERM", "Ctrl-C") else f"({self.how})"
        head = f"run {self.run_id}" + ("" if self.kind == "train" else f" ({self.kind})") + f" interrupted {how}"
        if self.how.startswith("stopped:"):  # a rule stopped it (the rental's reserve), not a signal
            head = f"run {self.run_id} {self.how}"
        head += f" at step {self.step}" if self.step is not None else ""
        again = f": {command}" if command else ""
        if self.kind != "train":
            return f"{head}; recorded as interrupted, run the command again{again}"
        if not self.checkpoint:
            return f"{head}, before its first checkpoint: nothing to resume, start it again{again}"
        study = (
            "" if Path.cwd().resolve() == self.study_dir.resolve() else f" --study {shlex.quote(str(self.study_dir))}"
        )
        nproc = f" --nproc-per-node {self.world_size}" if self.world_size > 1 else ""
        return f"{head}; resume with: tuneproof resume {self.run_id}{nproc}{study}"


#: the runs stopped by a signal in this process, oldest first (``tuneproof.cli`` prints their lines)
STOPPED: list[Stop] = []


def _fault_error(err: BaseException, cause: str, folder: Path, hint: str) -> TuneproofError:
    return TuneproofError(fault_message(err, cause, folder), hint=hint)


#: the fields of a run record that later steps rely on (docs/CONTRACTS.md): hashed into ``record_sha256`` and
#: compared with the index; ``heartbeat`` (a best-effort beat written to the index only), ``pid``, ``host`` and
#: ``proc_start`` (where a live run runs, for the staleness rule) are left out
_CHECKED = (
    "id",
    "seq",
    "kind",
    "status",
    "reason",
    "parent",
    "name",
    "created",
    "ended",
    "config_hash",
    "data_fingerprint",
    "eval_fingerprint",
    "summary",
)


def record_sha256(rec: dict[str, Any]) -> str:
    """sha256 of a run record's :data:`_CHECKED` fields (canonical JSON: sorted keys, no spaces)."""
    body = {k: rec.get(k) for k in _CHECKED}
    return hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode()
    ).hexdigest()


def record_problem(found: dict[str, Any], index: dict[str, Any] | None = None) -> str | None:
    """What is wrong with a ``run.json`` as read (``found``): its ``record_sha256`` does not match its fields
    (an edit by hand), naming the first field that differs from ``index`` when given. None when it is whole.

    Times are never evidence of an edit: an end before the start is the machine's clock stepping back while
    the run ran (recorded as read and flagged by :meth:`Registry.finish`, ``summary.clock_went_back``);
    tampering is what the hash tells."""
    if found.get("record_sha256") != record_sha256(found):
        if index is not None:
            for k in _CHECKED:
                if found.get(k) != index.get(k):
                    return f"{k} {_short(found.get(k))} in the file, {_short(index.get(k))} in the index"
        return f"record_sha256 {str(found.get('record_sha256'))[:16]} does not match its fields"
    return None


def clock_flag(created: Any, ended: float) -> dict[str, Any] | None:
    """``summary.clock_went_back`` of a run that ends at ``ended`` (seconds since the epoch, as read) before
    it was ``created``: the machine's clock stepped back while it ran. Both times are kept as read; the
    flag says so (``{"seconds": created - ended, "note": ...}``). None when the end is not before the start."""
    if not isinstance(created, (int, float)) or ended >= created:
        return None
    return {
        "seconds": round(created - ended, 3),
        "note": f"the clock went back while the run ran: it ended {iso(ended)} UTC, before it started "
        f"{iso(created)} UTC (times as read; check the machine's clock)",
    }


def _short(value: Any) -> str:
    text = json.dumps(value, default=str, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _seq_of(name: str) -> int | None:
    m = _ID_RE.match(name)
    return int(m.group(1)) if m else None


#: the folders of a study's own layout: a recorded absolute path ``<root>/exports/...`` or ``<root>/runs/...``
#: belongs to the study folder ``<root>``
STUDY_LAYOUT = ("exports", "runs")
#: summary key of a run that records its paths inside the study relative to it (:func:`study_relative`)
RELATIVE_PATHS = "paths_relative_to_study"


def _inside(path: Path, folder: Path) -> Path | None:
    """``path`` relative to ``folder`` (as written, then both resolved), or None when it lies elsewhere."""
    for p, f in ((path, folder), (path.resolve(), folder.resolve())):
        if p.is_relative_to(f):
            return p.relative_to(f)
    return None


def study_relative(study_dir: str | Path, path: str | Path) -> str:
    """How a run records ``path``: relative to the study folder (POSIX, ``exports/r0003``) when it lies
    inside it, so that a copied or moved study reads its own copy; absolute when it lies elsewhere (an
    export with ``--out /elsewhere``)."""
    p = Path(os.path.abspath(path))
    rel = _inside(p, Path(study_dir))
    return str(p) if rel is None else (rel.as_posix() or ".")


@dataclass(frozen=True)
class RecordedPath:
    """A path a run recorded, read back in the study folder as it is now (:meth:`Registry.recorded_path`).

    ``path``: where the file is in this study folder (or was recorded, outside any study); ``shown``: how
    screens and the dossier name it (relative to the study folder inside it, else absolute); ``moved``:
    the recorded path was absolute under the folder this study was copied or moved from and is read from
    this folder; ``warning``: one line when this folder has no copy of it (never a pointer elsewhere).
    """

    recorded: str
    path: Path
    shown: str
    moved: bool = False
    warning: str | None = None


def read_recorded_path(
    study_dir: str | Path, recorded: str, moved_from: Path | None = None, *, relative_records: bool = False
) -> RecordedPath:
    """Resolve a recorded path against the study folder ``study_dir`` as it is now.

    - relative (this version records paths inside the study so): ``study_dir / recorded``;
    - absolute inside ``study_dir``: unchanged;
    - absolute under another study folder, which this one was copied or moved from (``moved_from``, the
      folder the registry was created in; or, for a study copied before the registry recorded it, the
      nearest folder above the path that holds a study file, or the ``<root>`` of ``<root>/exports/...`` /
      ``<root>/runs/...`` when the recorded path is gone): the same relative path in ``study_dir``, with a
      warning when this folder has no such file (the original folder's file is never used);
    - anything else (an export with ``--out /elsewhere``): unchanged.

    ``relative_records``: the run recorded its paths inside the study relative (:data:`RELATIVE_PATHS` in its
    summary), so an absolute one lies outside by choice: only ``moved_from`` is mapped, never guessed.
    """
    here = Path(study_dir)
    p = Path(recorded)
    if not p.is_absolute():
        return RecordedPath(recorded, here / p, p.as_posix())
    rel = _inside(p, here)
    if rel is not None:
        return RecordedPath(recorded, p, rel.as_posix())
    root = None
    if moved_from is not None and (rel := _inside(p, moved_from)) is not None:
        root = moved_from
    elif not relative_records:
        parts = p.parts
        at = max((i for i, part in enumerate(parts) if part in STUDY_LAYOUT and 0 < i < len(parts) - 1), default=None)
        study = next((a for a in p.parents if (a / STUDY_FILE).is_file()), None)  # another study folder holds it
        if study is not None:
            root, rel = study, p.relative_to(study)
        elif at is not None and not p.exists():
            root, rel = Path(*parts[:at]), Path(*parts[at:])
    if root is None or rel is None:
        return RecordedPath(recorded, p, str(p))
    mine = here / rel
    if mine.exists():
        return RecordedPath(recorded, mine, rel.as_posix(), moved=True)
    where = (
        f"{root}, the folder this study was copied or moved from"
        if root == moved_from or (root / STUDY_FILE).is_file()
        else f"{root}, which is gone (this study was copied or moved from there)"
    )
    return RecordedPath(
        recorded,
        mine,
        rel.as_posix(),
        moved=True,
        warning=f"{recorded} was recorded in {where}; this study folder has no {rel.as_posix()}",
    )


class Registry:
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

    def _make_reserve(self) -> None:
        """Write the ballast file if it is missing (best effort: no space, no ballast)."""
        path = self.study_dir / RESERVE_FILE
        if path.exists():
            return
        try:
            with open(path, "wb") as fh:
                fh.write(b"\0" * RESERVE_BYTES)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError:
            try:
                path.unlink()
            except OSError:
                pass

    def _release_reserve(self) -> None:
        try:
            (self.study_dir / RESERVE_FILE).unlink()
        except OSError:
            pass

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
            with contextlib.suppress(OSError):
                if not any(d.iterdir()):  # made by a process killed before it recorded anything: no run
                    d.rmdir()
                    continue
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
        """``{"summary": ...}`` with :func:`clock_flag` added when the run ends before it started (the clock
        went back), else ``{}``; a line in the run's log and on stderr says so."""
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

    def _liveness(self, row: Any, now: float) -> tuple[bool, str]:
        """``(stale, reason)`` of a ``running`` row (see the module docstring)."""
        seen = row["heartbeat"] or row["created"]
        age = now - seen
        if row["host"] == socket.gethostname() and row["pid"] is not None:
            if not _alive(row["pid"], row["proc_start"]):
                live = procs.live_processes(self.runs_dir / row["id"])  # ranks that outlived their launcher
                if live:
                    names = ", ".join(f"{p['name']} pid {p['pid']}" for p in live)
                    return False, f"its launcher pid {row['pid']} is gone but {names} still run on this host"
                return True, "process died without recording an end (found stale)"
            return False, f"live process pid {row['pid']} on this host"
        if age > STALE_AFTER_S:
            return True, (
                f"no heartbeat for {age / 60:.0f} min (host {row['host']}, pid {row['pid']}; "
                f"stale after {STALE_AFTER_S / 60:.0f} min): found stale"
            )
        return False, f"pid {row['pid']} on host {row['host']}, last heartbeat {age:.0f} s ago"

    def mark_stale(self) -> list[str]:
        """Mark ``running`` runs whose process is gone, or whose heartbeat is older than
        :data:`STALE_AFTER_S` whatever the host, as interrupted. Returns their ids."""
        stale = []
        now = _now()
        for row in self._conn.execute(
            "SELECT id, pid, host, proc_start, created, heartbeat FROM runs WHERE status = 'running'"
        ).fetchall():
            dead, reason = self._liveness(row, now)
            if dead:
                stale.append((row["id"], reason))
        for rid, reason in stale:
            self.finish(rid, "interrupted", reason)
        return [rid for rid, _ in stale]

    def where_running(self, run_id: str) -> str:
        """Where a ``running`` run runs, e.g. ``pid 4242 on host gpu-3, last heartbeat 12 s ago``."""
        row = self._conn.execute("SELECT * FROM runs WHERE id = ?", (self.get(run_id).id,)).fetchone()
        return self._liveness(row, _now())[1]

    def mark_interrupted(self, run_id: str, why: str) -> RunRecord:
        """Mark a ``running`` run interrupted by hand (its machine is gone; ``tuneproof runs mark-interrupted``).

        Raises:
            TuneproofError: no reason, the run is not running, or it runs in a live process on this host.
        """
        rec = self.get(run_id)
        if not why.strip():
            raise TuneproofError("mark-interrupted needs a reason (--why)")
        if rec.status != "running":
            raise TuneproofError(
                f"run {rec.id} is {rec.status}, not running" + (f" ({rec.reason})" if rec.reason else ""),
                hint="only a running run is marked interrupted",
            )
        row = self._conn.execute("SELECT * FROM runs WHERE id = ?", (rec.id,)).fetchone()
        if row["host"] == socket.gethostname() and row["pid"] is not None and _alive(row["pid"], row["proc_start"]):
            raise TuneproofError(
                f"run {rec.id} runs in the live process {row['pid']} on this host",
                hint="stop it instead: Ctrl-C in its terminal or `kill -TERM "
                f"{row['pid']}` (a train run writes a checkpoint)",
            )
        seen = row["heartbeat"] or row["created"]
        self.finish(
            rec.id,
            "interrupted",
            f"marked interrupted: {why.strip()} (last heartbeat {iso(seen)} UTC, host {row['host']}, pid {row['pid']})",
        )
        self._ended(rec.id)
        return self.get(rec.id)

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

    @contextlib.contextmanager
    def run(self, kind: str, *, parent: str | None = None, name: str | None = None) -> Iterator[Run]:
        """Create a run, yield it, and record how it ended.

        Normal exit -> completed; ``KeyboardInterrupt`` or SIGTERM -> interrupted (re-raised as
        ``KeyboardInterrupt`` / :class:`Terminated`); a fault of the machine -> failed with the
        reason ``disk full: ...`` or ``read-only: ...`` and a one-line :class:`TuneproofError`;
        any other exception -> failed with its message (re-raised). A run that a check marked
        ``invalid`` inside the block keeps that status.
        """
        run = self.create(kind, parent=parent, name=name)
        with self._lifecycle(run):
            run.note(f"start kind={kind} parent={parent}")
            self._note_cleanup(run, kind)
            yield run

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

    @contextlib.contextmanager
    def reopen(self, run_id: str, *, note: str = "resume") -> Iterator[Run]:
        """Set an interrupted or failed run back to ``running`` in this process and record how it
        ends, like :meth:`run` (used by ``tuneproof resume``: the run keeps its id and folder).

        Raises:
            TuneproofError: the run is completed, invalid or still running in a live process.
        """
        rec = self.get(run_id)
        if rec.status not in ("interrupted", "failed"):
            raise TuneproofError(
                f"run {rec.id} is {rec.status}" + (f" ({rec.reason})" if rec.reason else ""),
                hint="only an interrupted or failed run can be continued",
            )
        pid = os.getpid()
        with self._lock:  # one statement, conditional on the status: two resumes at once, one wins
            taken = self._conn.execute(
                "UPDATE runs SET status = 'running', reason = NULL, ended = NULL, pid = ?, host = ?, proc_start = ?, "
                "heartbeat = ? WHERE id = ? AND status IN ('interrupted', 'failed')",
                (pid, socket.gethostname(), _proc_start(pid), _now(), rec.id),
            ).rowcount
            if not taken:
                now = self._conn.execute("SELECT status FROM runs WHERE id = ?", (rec.id,)).fetchone()[0]
                raise TuneproofError(
                    f"run {rec.id} is {now} (another process took it over just now: {self.where_running(rec.id)})",
                    hint="only one process continues a run; wait for it to end",
                )
            self._sync(rec.id)
        run = Run(self, self.get(rec.id))
        run.summary = dict(rec.summary)
        if CARRY:
            run.update_summary(**CARRY)
        with self._lifecycle(run):
            run.note(f"{note} (was {rec.status}{': ' + rec.reason if rec.reason else ''})")
            self._note_cleanup(run, rec.kind)
            yield run

    def _beat(self, run_id: str, stop: threading.Event, every: float) -> None:
        """The heartbeat thread: last-seen time every ``every`` seconds while the run is running.
        Best effort: a missed beat (disk full, locked index) only makes the run look older."""
        try:
            conn = sqlite3.connect(self.db_path, timeout=5, isolation_level=None)
            conn.row_factory = sqlite3.Row
        except sqlite3.Error:
            return
        try:
            while not stop.wait(every):
                try:
                    with self._lock:
                        cur = conn.execute(
                            "UPDATE runs SET heartbeat = ? WHERE id = ? AND status = 'running'", (_now(), run_id)
                        )
                        if cur.rowcount:
                            self._sync(run_id, conn)
                except (sqlite3.Error, OSError):
                    pass
        finally:
            conn.close()

    @contextlib.contextmanager
    def _lifecycle(self, run: Run) -> Iterator[Run]:
        """Record how the block ends: completed, interrupted (Ctrl-C/SIGTERM, with the last step),
        failed (machine faults named), and keep the heartbeat while it runs."""

        def _on_term(signum, frame):  # noqa: ARG001
            raise Terminated(f"signal {signum}")

        old = None
        try:
            old = signal.signal(signal.SIGTERM, _on_term)
        except ValueError:  # not the main thread
            old = None
        stop = threading.Event()
        beat = threading.Thread(
            target=self._beat, args=(run.id, stop, HEARTBEAT_S), name=f"heartbeat-{run.id}", daemon=True
        )
        beat.start()
        try:
            if self.start_hooks:
                self._hooks(self.start_hooks, self.get(run.id))
            yield run
        except (KeyboardInterrupt, Terminated) as err:
            if isinstance(err, Stopped):
                reason = str(err)
            elif isinstance(err, Terminated):
                reason = f"terminated ({err})" if not str(err).startswith("terminated") else str(err)
            else:
                reason = f"interrupted ({err})" if str(err) else "interrupted by Ctrl-C"
            last = run.summary.get("last_step")
            if last is not None and " at step " not in reason:
                reason += f" at step {last}"
            try:
                run.note(reason)
                self.finish(run.id, "interrupted", reason)
            except (OSError, sqlite3.Error):
                self._finish_quietly(run.id, "interrupted", reason)
            words = str(err).strip()
            how = (
                "SIGTERM"
                if isinstance(err, Terminated)
                else ("Ctrl-C" if words in ("", f"signal {int(signal.SIGINT)}") else words)
            )
            try:
                ckpt = any(p.is_dir() for p in (run.dir / "checkpoints").glob("step-*"))
            except OSError:
                ckpt = False
            STOPPED.append(
                Stop(run.id, run.kind, how, last, ckpt, int(run.summary.get("world_size") or 1), self.study_dir)
            )
            if isinstance(err, Terminated):
                raise Terminated(reason) from None
            if isinstance(err, Stopped):
                raise Stopped(reason) from None
            raise KeyboardInterrupt(reason) from None
        except BaseException as err:
            cause = fault_cause(err, run.dir)
            if cause is not None:
                msg = fault_message(err, cause, run.dir)
                self._finish_quietly(run.id, "failed", f"{cause}: {msg}"[:500])
                hint = (
                    f"free space (or make the folder writable), then continue it: tuneproof resume {run.id}"
                    if run.kind == "train"
                    else "free space (or make the folder writable), then run the command again"
                )
                raise TuneproofError(f"run {run.id} failed: {msg}", hint=hint) from None
            text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            try:
                run.note(f"failed: {type(err).__name__}: {err}")
                self.finish(run.id, "failed", f"{type(err).__name__}: {text}"[:500])
            except (OSError, sqlite3.Error):
                self._finish_quietly(run.id, "failed", f"{type(err).__name__}: {text}"[:500])
            if isinstance(err, TuneproofError):
                err.name_run(run.id)  # the message that ends a run names it
            raise
        else:
            if self.get(run.id).status == "running":
                self.finish(run.id, "completed")
            run.note("end")
        finally:
            stop.set()
            beat.join(timeout=10)
            remove_temps(run.dir)
            if old is not None:
                signal.signal(signal.SIGTERM, old)
            self._ended(run.id)

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
