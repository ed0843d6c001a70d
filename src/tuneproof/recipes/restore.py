"""Recipe ``restore``: the study from its remote copy, on a fresh machine, with every hash checked.

Features:
- downloads the newest manifest's files into a new folder (``tuneproof restore URI [DIR]``; DIR
  defaults to the prefix's last name in the current folder), each checked against the sha256 the
  manifest records before it is written (:mod:`tuneproof.storage.restore`): an altered object is never
  written, a missing one is named;
- rebuilds the registry from the run folders (the index is never copied over) and names any run the
  uploaded index lists whose folder is not in the copy; runs the lost machine left ``running`` are
  marked ``interrupted`` (``machine lost: restored from URI on host H``), so ``tuneproof resume RUN``
  continues them;
- checks the records: every checkpoint against its ``index.json`` (a failing one is named:
  ``resume`` refuses it, ``resume --fallback`` continues from the newest older one that passes),
  every run's ``outputs.jsonl`` against its recorded ``outputs_sha256``, the frozen hypothesis
  against its seal;
- the rental window carries over (``rental.json`` is part of the copy); this host is recorded as a
  machine of the window, with the restore;
- this machine takes over the prefix's lease (the old one, if alive, stops uploading, with a warning);
- anything missing or altered: the rest is restored, then one CheckFailed (exit 3) names each problem.
"""

from __future__ import annotations

import socket
from pathlib import Path, PurePosixPath

from tuneproof import clock
from tuneproof.deliver import rental as rent
from tuneproof.errors import CheckFailed, TuneproofError
from tuneproof.evaluation.outputs import OUTPUTS, check_outputs
from tuneproof.hypothesis import check_sealed
from tuneproof.io import fault_cause, fault_message
from tuneproof.registry import Registry
from tuneproof.storage.mirror import check_lease, human, read_state, write_state
from tuneproof.storage.restore import fetch
from tuneproof.storage.store import Store, StoreError
from tuneproof.study import remote_uri
from tuneproof.training.resume_state import list_checkpoints, verify_checkpoint
from tuneproof.ui import console, err_console, user_text


def default_folder(uri: str) -> Path:
    """``./NAME`` for ``s3://bucket/studies/NAME``."""
    name = PurePosixPath(uri.split("://", 1)[-1].rstrip("/")).name or "restored-study"
    return Path.cwd() / name


def _problem(err: TuneproofError, dest: Path) -> str:
    return str(err.message if hasattr(err, "message") else err).replace(f"{dest}/", "")


def run_restore(uri: str, dest: Path | None = None) -> Path:
    """Restore the study at ``uri`` into ``dest``; returns the folder.

    Raises:
        TuneproofError: the store cannot be reached, holds no study, or ``dest`` is not empty (nothing written).
        CheckFailed: (exit 3) files missing or altered in the store, checkpoints, outputs or the frozen
            hypothesis that fail their recorded sha256; each named (the rest is restored).
    """
    try:
        uri = remote_uri(uri)
    except ValueError as err:
        raise TuneproofError(
            f"cannot restore: {err}", hint="give the study's storage.remote, as written there"
        ) from None
    dest = Path(dest or default_folder(uri)).resolve()
    try:
        store = Store(uri)
        fetched = fetch(store, dest, say=lambda line: err_console.print(user_text(line), soft_wrap=True))
    except StoreError as err:
        raise TuneproofError(
            f"cannot restore: {err}", hint="check the URI, the network and the credentials in the environment"
        ) from None
    except OSError as err:  # this machine's disk (full, read-only), or a path the manifest names that cannot be made
        cause = fault_cause(err, dest)
        what = (
            fault_message(err, cause, dest)
            if cause is not None
            else f"{err.strerror or type(err).__name__}{f': {err.filename}' if err.filename else ''}"
        )
        raise TuneproofError(
            f"cannot restore into {dest}: {what}",
            hint="free space (or pick a writable folder) and restore again (nothing was left in the folder)"
            if cause is not None
            else "a path the remote copy's manifest names cannot be written here (edited by hand?); nothing was left "
            "in the folder",
        ) from None
    problems = [f"missing: {m}" for m in fetched.missing] + [f"altered: {a}" for a in fetched.altered]
    host = socket.gethostname()
    reg = Registry(dest)
    try:
        for rec in reg.list(status="running"):
            reg.finish(rec.id, "interrupted", f"machine lost: restored from {store.shown} on host {host}")
        ids = {r.id for r in reg.list()}
        for rid in fetched.index_runs or []:
            if rid not in ids:
                problems.append(f"missing: run {rid} (listed in the uploaded registry index, no folder in the copy)")
        for rec in reg.list():
            run_dir = reg.runs_dir / rec.id
            for ckpt in list_checkpoints(run_dir):
                try:
                    verify_checkpoint(ckpt)
                except TuneproofError as err:
                    problems.append(f"checkpoint: {_problem(err, dest)}")
            if (run_dir / OUTPUTS).exists():
                try:
                    check_outputs(run_dir / OUTPUTS, rec)
                except TuneproofError as err:
                    problems.append(f"outputs: {_problem(err, dest)}")
        try:
            check_sealed(dest, reg)
        except TuneproofError as err:
            problems.append(f"hypothesis: {_problem(err, dest)}")
        rental = rent.load(dest)
        if rental is not None:
            now = clock.now()
            for line in rent.observe(rental, now, "restore"):
                err_console.print(user_text(line), soft_wrap=True)
            rental.setdefault("restores", []).append({"host": host, "time": now, "from": store.shown})
            rent.save(dest, rental)
    finally:
        reg.close()
    state = read_state(dest, fetched.manifest and uri)
    state["published"] = {
        "seq": int(fetched.manifest.get("seq", 0)),
        "time": fetched.manifest.get("written"),
        "files": {
            rel: [f["sha256"], f["size"], (dest / rel).stat().st_mtime_ns if (dest / rel).is_file() else None]
            for rel, f in fetched.manifest["files"].items()
        },
    }
    write_state(dest, state)
    try:
        check_lease(store, state, take_over=True, study=str(fetched.manifest.get("study", "")))
        lease = f"; this machine ({host}) now writes the remote copy"
    except StoreError as err:
        lease = f"; the lease could not be taken ({err}): run tuneproof sync --take-over"
    console.print(
        f"restored {fetched.files} file(s), {human(fetched.bytes)}, from {user_text(store.shown)} "
        f"(manifest {fetched.manifest['name']}, written on host {user_text(str(fetched.manifest.get('host')))}) "
        f"into {user_text(str(dest))}{user_text(lease)}",
        soft_wrap=True,
    )
    if problems:
        raise CheckFailed(
            f"restored {dest} with {len(problems)} problem(s): "
            + "; ".join(problems[:8])
            + (f"; and {len(problems) - 8} more" if len(problems) > 8 else ""),
            hint="a checkpoint that fails is refused by `tuneproof resume RUN`; `--fallback` continues from the "
            "newest older one that passes",
        )
    console.print(
        "every file matches its recorded sha256; next: "
        f"tuneproof runs --study {user_text(str(dest))}, tuneproof resume RUN --study {user_text(str(dest))}",
        soft_wrap=True,
    )
    return dest
