"""The remote copy of a study (``storage.remote``): kept while commands run, restored anywhere.

- :mod:`~tuneproof.storage.store`: one fsspec store (S3, GCS, Azure, SFTP, a local folder); every
  failure one line (:class:`StoreError`);
- :mod:`~tuneproof.storage.mirror`: content-addressed objects published by a manifest written last,
  the lease that keeps a second machine off a prefix, how much is safe off the box;
- :mod:`~tuneproof.storage.uploader`: the background thread fed by the registry's hooks;
- :mod:`~tuneproof.storage.restore`: download and check every sha256 against the manifest;
- :mod:`~tuneproof.storage.deliver`: upload a folder, read it back and check every sha256.

:func:`attach` gives a registry the hooks of a study that names ``storage.remote``: the gate (before a
run is created) checks the lease once per command and starts the uploader; the step and end hooks ask
for a push; at exit the uploader flushes for at most ``storage.flush_s`` seconds.
"""

from __future__ import annotations

import atexit
import sys
from pathlib import Path

from tuneproof.errors import TuneproofError
from tuneproof.storage.deliver import UPLOADS_FILE, deliver_to, measured_upload, record_upload
from tuneproof.storage.mirror import LeaseHeld, Mirror, check_lease, human, safety
from tuneproof.storage.store import Store, StoreError, redact
from tuneproof.storage.uploader import Uploader
from tuneproof.ui import visible_text

TAKE_OVER_HINT = (
    "give this study its own storage.remote prefix, or, when that machine is gone for good, take the copy "
    "over: tuneproof sync --take-over (on a fresh machine: tuneproof restore URI)"
)


def _stderr(line: str) -> None:
    print(visible_text(line), file=sys.stderr, flush=True)  # URIs and paths are user text: control characters shown


#: the hooks attached in this process, closed (last push, then one line) by :func:`close_all`
OPEN: list = []


def close_all() -> None:
    """Flush and close every attached uploader (the CLI calls it when a command returns, before the
    interpreter shuts down its thread pools; ``atexit`` does it for library use)."""
    while OPEN:
        OPEN.pop().close()


class Attached:
    """The hooks of one command (:func:`attach`)."""

    def __init__(self, uploader: Uploader, flush_s: float, warn):
        self.uploader = uploader
        self.flush_s = flush_s
        self.warn = warn
        self.gated = False
        self.closed = False

    def gate(self, registry, kind) -> None:  # noqa: ARG002
        """Before the first run of the command: the lease (refused: one-line error), then uploads start."""
        if self.gated:
            return
        self.gated = True
        mirror = self.uploader.mirror
        try:
            check_lease(mirror.connect(), mirror.state, study=mirror.study)
            self.uploader.leased = True
        except LeaseHeld as err:
            raise TuneproofError(str(err), hint=TAKE_OVER_HINT) from None
        except StoreError as err:
            mirror.drop()
            self.uploader.down = str(err)
            self.warn(
                f"warning: the remote copy is unreachable ({err}); the run goes on and stays on this machine only "
                "until the store answers (retrying in the background; `tuneproof sync` sends what is missing)"
            )
        atexit.register(self.close)

    def started(self, registry, record) -> None:  # noqa: ARG002
        self.uploader.live += 1
        self.uploader.request()

    def stepped(self, registry, run_id, row) -> None:  # noqa: ARG002
        self.uploader.request()

    def ended(self, registry, record) -> None:  # noqa: ARG002
        self.uploader.live = max(0, self.uploader.live - 1)
        self.uploader.request("flush")

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            line = self.uploader.summary_line(self.uploader.close(self.flush_s))
        except Exception as err:  # noqa: BLE001 - the command's own result stands; this is one line
            line = f"warning: the remote copy's state could not be read ({err})"
        if line:
            self.warn(line)


def safety_line(study_dir: Path, storage) -> str | None:
    """One line for ``rental status`` and the dossier: how much of the study is safe off the box (bytes,
    the newest checkpoint there) and how much is on this machine only; None without ``storage.remote``."""
    if storage is None or not storage.remote:
        return None
    s = safety(Path(study_dir), storage.remote, storage.exclude)
    if not s["published"]:
        return f"remote copy {redact(storage.remote)}: nothing uploaded yet (tuneproof sync)"
    import datetime  # noqa: PLC0415 - one formatting call

    when = datetime.datetime.fromtimestamp(s["published"], datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    ckpt = f", newest checkpoint there {s['newest_checkpoint']}" if s["newest_checkpoint"] else ", no checkpoint there"
    local = (
        f"; on this machine only: {len(s['local_only'])} file(s), {human(s['local_only_bytes'])} (tuneproof sync)"
        if s["local_only"]
        else "; nothing on this machine only"
    )
    return (
        f"remote copy {redact(storage.remote)}: {s['files']} file(s), {human(s['bytes'])} safe off the box "
        f"as of {when} UTC{ckpt}{local}"
    )


def attach(registry, study, study_dir: Path, *, warn=None) -> Attached | None:
    """Hand ``registry`` the storage hooks when ``study.storage.remote`` is set (None otherwise)."""
    cfg = getattr(study, "storage", None)
    if cfg is None or not cfg.remote:
        return None
    warn = warn or _stderr
    mirror = Mirror(Path(study_dir), cfg.remote, cfg.exclude, study=study.name, say=warn)
    hooks = Attached(Uploader(mirror, warn=warn), cfg.flush_s, warn)
    registry.gate_hooks.append(hooks.gate)
    registry.start_hooks.append(hooks.started)
    registry.step_hooks.append(hooks.stepped)
    registry.end_hooks.append(hooks.ended)
    OPEN.append(hooks)
    return hooks


__all__ = [
    "Attached",
    "LeaseHeld",
    "Mirror",
    "Store",
    "StoreError",
    "TAKE_OVER_HINT",
    "UPLOADS_FILE",
    "attach",
    "close_all",
    "deliver_to",
    "measured_upload",
    "record_upload",
    "redact",
    "safety",
    "safety_line",
]
