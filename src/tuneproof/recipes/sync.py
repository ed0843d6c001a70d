"""Recipe ``sync``: send what the remote copy (``storage.remote``) lacks, and say what is still local only.

Features (option that turns each on):
- one push of every file of the study folder the newest manifest lacks, the registry index snapshot,
  then the next manifest (:mod:`tuneproof.storage.mirror`); manifests past the last three and the
  objects only they named are removed;
- ``--wait``: an unreachable store is retried with backoff (1 s doubling to 60 s) until it answers
  (Ctrl-C stops); without it an unreachable store is one line, the files still local only, exit 2;
- ``--take-over``: this machine takes the prefix's lease from another host (that machine is gone);
  without it a prefix written by another host is refused, naming it (exit 2);
- says how much is safe off the box: files, bytes, the newest checkpoint there, and what is local only;
- :func:`send_export` (``export --to URI``): the bundle uploaded, read back and checked file by file.
"""

from __future__ import annotations

import time
from pathlib import Path

from tuneproof.context import StudyContext
from tuneproof.errors import TuneproofError
from tuneproof.io import fault_cause, fault_message
from tuneproof.storage import TAKE_OVER_HINT, deliver_to
from tuneproof.storage.mirror import LeaseHeld, Mirror, check_lease, human, safety
from tuneproof.storage.store import StoreError
from tuneproof.study import STUDY_FILE
from tuneproof.ui import console, err_console, user_text

MAX_BACKOFF_S = 60.0


def _say_err(line: str) -> None:
    err_console.print(user_text(line), soft_wrap=True)  # names files of the study and the store's URI


def _say_user(line: str) -> None:
    console.print(user_text(line), soft_wrap=True)


def require_remote(ctx: StudyContext) -> str:
    """``storage.remote`` of the study. Raises :class:`TuneproofError` when it is not set."""
    if not ctx.study.storage.remote:
        raise TuneproofError(
            f"{ctx.study_dir / STUDY_FILE}: storage.remote is not set: there is no remote copy to sync",
            hint="add `storage: {remote: s3://bucket/prefix}` (or sftp://, file://; see docs/remote.md)",
        )
    return ctx.study.storage.remote


def print_safety(safe: dict, shown: str) -> None:
    """The lines that say how much of the study is off the box."""
    ckpt = f"; newest checkpoint there: {safe['newest_checkpoint']}" if safe["newest_checkpoint"] else ""
    console.print(
        f"remote copy {user_text(shown)}: {safe['files']} file(s), {human(safe['bytes'])} safe off this machine"
        f"{user_text(ckpt)}",
        soft_wrap=True,
    )
    if safe["local_only"]:
        shown_files = ", ".join(safe["local_only"][:5]) + (
            f" and {len(safe['local_only']) - 5} more" if len(safe["local_only"]) > 5 else ""
        )
        console.print(
            f"still on this machine only: {len(safe['local_only'])} file(s), {human(safe['local_only_bytes'])}: "
            f"{user_text(shown_files)}",
            soft_wrap=True,
        )
    else:
        console.print("nothing is on this machine only")


def run_sync(ctx: StudyContext, *, wait: bool = False, take_over: bool = False) -> dict:
    """Push the study to ``storage.remote``; returns :func:`tuneproof.storage.mirror.safety`.

    Raises:
        TuneproofError: no ``storage.remote``; another host holds the prefix (without ``take_over``);
            the store is unreachable (without ``wait``).
    """
    uri = require_remote(ctx)
    cfg = ctx.study.storage
    mirror = Mirror(ctx.study_dir, uri, cfg.exclude, study=ctx.study.name, say=_say_err)
    delay, said = 1.0, False
    while True:
        try:
            check_lease(mirror.connect(), mirror.state, take_over=take_over, study=ctx.study.name)
            result = mirror.push(with_index=True)
            mirror.collect()
            break
        except LeaseHeld as err:
            raise TuneproofError(str(err), hint=TAKE_OVER_HINT) from None
        except OSError as err:  # this machine's disk (the index snapshot, the local state): full, read-only
            cause = fault_cause(err, ctx.study_dir)
            if cause is None:
                raise
            raise TuneproofError(
                f"sync stopped: {fault_message(err, cause, ctx.study_dir)}",
                hint="free space on this machine, then tuneproof sync again (the remote copy keeps its last manifest)",
            ) from None
        except StoreError as err:
            mirror.drop()
            if not wait:
                print_safety(safety(ctx.study_dir, uri, cfg.exclude), uri)
                raise TuneproofError(
                    f"the remote copy is unreachable: {err}",
                    hint="check the network and the credentials in the environment; "
                    "`tuneproof sync --wait` retries until the store answers",
                ) from None
            if not said:
                err_console.print(
                    f"the remote copy is unreachable ({user_text(str(err), one_line=True)}); retrying until it "
                    "answers (Ctrl-C stops)",
                    soft_wrap=True,
                )
                said = True
            time.sleep(delay)
            delay = min(MAX_BACKOFF_S, delay * 2)
    console.print(
        f"sent {result.sent_files} file(s), {human(result.sent_bytes)}"
        + (f"; published {result.published}" if result.published else "; the remote copy was up to date"),
        soft_wrap=True,
    )
    safe = safety(ctx.study_dir, uri, cfg.exclude)
    print_safety(safe, mirror.store.shown if mirror.store else uri)
    return safe


def send_export(ctx: StudyContext, export_id: str, uri: str) -> dict:
    """``export --to URI``: upload the bundle export run ``export_id`` wrote (verified in a fresh process by
    the export) to ``uri``, read every file back and check its sha256 against the delivery manifest.

    Raises:
        TuneproofError: the store cannot be reached (the local bundle stands; nothing is said delivered).
        CheckFailed: a file read back differs from the one sent.
    """
    summary = ctx.registry.get(export_id).summary
    bundle = ctx.registry.recorded_path(str(summary.get("bundle")), summary).path
    sent = deliver_to(ctx.study_dir, uri, {"bundle": Path(bundle)}, what=f"export {export_id}", say=_say_user)
    console.print(
        f"delivered {user_text(str(bundle))} to {user_text(sent['uri'])}: {sent['files']} file(s), "
        f"{human(sent['bytes'])}, every sha256 read back and checked ({sent['upload_s'] + sent['check_s']:.1f} s)",
        soft_wrap=True,
    )
    return sent
