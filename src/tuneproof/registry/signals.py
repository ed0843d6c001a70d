"""How a run ends: completed, failed (machine faults named), or interrupted by Ctrl-C / SIGTERM (with the
last step and the way to go on, :class:`Stop`); :meth:`Lifecycle.run` and :meth:`Lifecycle.reopen` wrap a
command's work in that record."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tuneproof.errors import Stopped, Terminated, TuneproofError
from tuneproof.io import (
    fault_cause,
    fault_message,
    remove_temps,
)
from tuneproof.registry.liveness import HEARTBEAT_S, _proc_start
from tuneproof.registry.records import _now
from tuneproof.registry.run import CARRY, Run

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


class Lifecycle:
    """Running and reopening a run and recording how it ended, a part of :class:`~tuneproof.registry.Registry`."""

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
