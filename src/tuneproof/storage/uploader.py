"""The background uploader: pushes the study to its remote copy while commands run.

The registry's hooks only put a request on a bounded queue (:data:`QUEUE_SIZE`; a full queue means a
push is already pending, so the request is dropped): a training step never waits for the network.
One daemon thread takes the requests, coalesces them, and pushes (:meth:`Mirror.push`) at most every
:data:`MIN_INTERVAL_S` seconds, and every :data:`POLL_S` seconds while a run is live (checkpoints as
they are written). A failed push is retried with exponential backoff (1 s doubling to
:data:`MAX_BACKOFF_S`); the first failure is one warning line, the recovery one note. At the end of
the command (``atexit``) the uploader waits at most ``storage.flush_s`` seconds for a last push with
the registry index, then says what is still local only (``tuneproof sync`` sends it).
"""

from __future__ import annotations

import queue
import threading
import time

from tuneproof.io import fault_cause
from tuneproof.storage.mirror import LeaseHeld, Mirror, check_lease, human, safety
from tuneproof.storage.store import StoreError

QUEUE_SIZE = 8
POLL_S = 10.0
MIN_INTERVAL_S = 2.0
MAX_BACKOFF_S = 60.0


class Uploader:
    """One command's uploads of one study (see the module docstring).

    Args:
        mirror: what to push where.
        warn: prints one line on stderr.
    """

    def __init__(self, mirror: Mirror, *, warn):
        self.mirror = mirror
        self.warn = warn
        self.queue: queue.Queue[str] = queue.Queue(maxsize=QUEUE_SIZE)
        self.live = 0
        self.down: str | None = None  # the cause while the store is unreachable
        self.refused: str | None = None  # another machine holds the prefix: uploads stopped
        self.local_fault: str | None = None
        self.leased = False
        self.sent_files = 0
        self.sent_bytes = 0
        self.flushed = threading.Condition()
        self.flush_asked = 0  # flushes asked for (never dropped, unlike a full queue's wake-up)
        self.flush_done = 0  # flushes tried (pushed, or failed and said)
        self.stopping = False
        self.thread: threading.Thread | None = None
        self.last_push = 0.0

    # -- requests (never block)
    def request(self, what: str = "push") -> int:
        """Ask for a push (``flush``: with the registry index); returns the flush number to wait for. Never
        blocks: a full queue drops the wake-up (a push is pending anyway), never a flush."""
        if self.thread is None:
            self.thread = threading.Thread(target=self._work, name="tuneproof-remote", daemon=True)
            self.thread.start()
        with self.flushed:
            if what == "flush":
                self.flush_asked += 1
            asked = self.flush_asked
        try:
            self.queue.put_nowait(what)
        except queue.Full:
            pass
        return asked

    # -- the worker
    def _work(self) -> None:
        backoff = 0.0
        while True:
            wait = backoff if backoff else (POLL_S if self.live else None)
            try:
                what = self.queue.get(timeout=wait)
            except queue.Empty:
                what = "push"
            items = [what]
            while True:  # coalesce what piled up
                try:
                    items.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            with self.flushed:
                asked = self.flush_asked
            flush = asked > self.flush_done
            if self.stopping and not flush:
                return
            if not self.refused:
                gap = MIN_INTERVAL_S - (time.monotonic() - self.last_push)
                if gap > 0 and not flush and not backoff:
                    time.sleep(gap)
                ok = self.attempt(with_index=flush)
                backoff = 0.0 if ok else min(MAX_BACKOFF_S, max(1.0, backoff * 2))
            if flush:
                with self.flushed:
                    self.flush_done = asked
                    self.flushed.notify_all()

    def attempt(self, *, with_index: bool) -> bool:
        """One push; a failure is reported once and returns False (the caller retries)."""
        self.last_push = time.monotonic()
        try:
            if not self.leased:
                check_lease(self.mirror.connect(), self.mirror.state, study=self.mirror.study)
                self.leased = True
            result = self.mirror.push(with_index=with_index)
            if with_index and result.published:
                self.mirror.collect()  # manifests past the last three, and objects only they named
        except StoreError as err:
            self.mirror.drop()
            if self.down is None:
                self.warn(
                    f"warning: the remote copy is unreachable ({err}); the study stays on this machine only until "
                    "it answers (retrying in the background; `tuneproof sync` sends what is missing)"
                )
            self.down = str(err)
            return False
        except LeaseHeld as err:
            self.refused = str(err)
            self.warn(f"warning: uploads stopped: {err}")
            return True
        except OSError as err:
            cause = fault_cause(err, self.mirror.study_dir) or type(err).__name__
            if self.local_fault is None:
                self.warn(
                    f"warning: the remote copy is paused: {cause} on this machine ({err}); the run goes on, "
                    "free space then `tuneproof sync`"
                )
            self.local_fault = cause
            return False
        if self.down is not None:
            self.warn(f"note: the remote copy {self.mirror.store.shown if self.mirror.store else ''} answers again")
        self.down = None
        self.local_fault = None
        self.sent_files += result.sent_files
        self.sent_bytes += result.sent_bytes
        return True

    def close(self, timeout_s: float) -> dict:
        """Ask for a last push with the index, wait at most ``timeout_s`` seconds, stop the thread, and
        return :func:`safety` (what the remote holds, what is local only)."""
        if self.thread is not None and self.thread.is_alive():
            want = self.request("flush")
            with self.flushed:
                self.flushed.wait_for(lambda: self.flush_done >= want, timeout=timeout_s)
                self.stopping = True
            try:
                self.queue.put_nowait("stop")
            except queue.Full:
                pass
        return safety(self.mirror.study_dir, self.mirror.uri, self.mirror.exclude)

    def summary_line(self, safe: dict) -> str | None:
        """The line said at the end of a command that uploaded or left something local only (None: quiet)."""
        if self.refused:
            return f"warning: nothing was uploaded: {self.refused}"
        shown = self.mirror.store.shown if self.mirror.store else self.mirror.uri
        if safe["local_only"]:
            why = f" ({self.down})" if self.down else (f" ({self.local_fault})" if self.local_fault else "")
            return (
                f"warning: {len(safe['local_only'])} file(s), {human(safe['local_only_bytes'])}, are still on this "
                f"machine only{why}; send them with `tuneproof sync --wait`"
            )
        if self.sent_files:
            ckpt = f", newest checkpoint {safe['newest_checkpoint']}" if safe["newest_checkpoint"] else ""
            return f"remote copy {shown}: {safe['files']} file(s), {human(safe['bytes'])} safe off this machine{ckpt}"
        return None
