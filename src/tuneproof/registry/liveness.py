"""Liveness: the heartbeat a live run writes, and the rule that finds a ``running`` run stale (its process
gone on this host, or its heartbeat older than :data:`STALE_AFTER_S` whatever the host)."""

from __future__ import annotations

import socket
import sqlite3
import threading
from typing import Any

from tuneproof import procs
from tuneproof.errors import TuneproofError
from tuneproof.registry.records import RunRecord, _now, iso

HEARTBEAT_S = 30.0  # a live run writes its last-seen time this often (seconds)
STALE_AFTER_S = 300.0  # a running run unseen for this long (seconds) is stale, whatever its host


def _proc_start(pid: int) -> str | None:
    """The kernel start time of ``pid`` (:func:`tuneproof.procs.process_start`), to tell a reused pid apart."""
    return procs.process_start(pid)


def _alive(pid: int, proc_start: str | None) -> bool:
    return procs.alive(pid, proc_start)


def resume_hint(run_dir, run_id: str, kind: str, world_size: int = 1) -> str | None:
    """``resume with: tuneproof resume r0003`` for a train run whose folder holds a checkpoint
    (``checkpoints/step-*``), with ``--nproc-per-node`` when it trained in several processes; else None."""
    if kind != "train":
        return None
    try:
        if not any(p.is_dir() for p in (run_dir / "checkpoints").glob("step-*")):
            return None
    except OSError:
        return None
    nproc = f" --nproc-per-node {world_size}" if world_size > 1 else ""
    return f"resume with: tuneproof resume {run_id}{nproc}"


class Liveness:
    """Staleness, heartbeats and ``mark-interrupted``, a part of :class:`~tuneproof.registry.Registry`."""

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
        :data:`STALE_AFTER_S` whatever the host, as interrupted (a train run with a checkpoint: its
        reason ends ``resume with: tuneproof resume rNNNN``, :func:`resume_hint`). Returns their ids."""
        stale = []
        now = _now()
        for row in self._conn.execute(
            "SELECT id, kind, pid, host, proc_start, created, heartbeat FROM runs WHERE status = 'running'"
        ).fetchall():
            dead, reason = self._liveness(row, now)
            if dead:  # a train run with a checkpoint says how to continue it
                hint = resume_hint(self.runs_dir / row["id"], row["id"], row["kind"], self._world_size(row["id"]))
                stale.append((row["id"], f"{reason}; {hint}" if hint else reason))
        for rid, reason in stale:
            self.finish(rid, "interrupted", reason)
        return [rid for rid, _ in stale]

    def _world_size(self, run_id: str) -> int:
        """The processes a run trained in (its summary's ``world_size``; 1 when unreadable)."""
        try:
            return int(self.get(run_id).summary.get("world_size") or 1)
        except (TuneproofError, OSError, ValueError, TypeError):
            return 1

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
