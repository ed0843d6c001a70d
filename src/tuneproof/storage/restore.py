"""Download a remote copy into a folder, checking every file's sha256 against the manifest.

:func:`fetch` writes each file through a temp name, only after its bytes hash to the sha256 the
manifest records (the object's own name): an altered object is never written, a missing one is
named. The registry index snapshot is read for the run ids it lists, so a run folder missing from
the copy is named too. The record-level checks (checkpoints against their index, outputs against
their recorded hashes, the hypothesis seal) belong to the restore recipe, which sees those units.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sqlite3
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from tuneproof.errors import TuneproofError
from tuneproof.storage.mirror import human, newest_manifest, object_name
from tuneproof.storage.store import Store


@dataclass
class Fetched:
    """What :func:`fetch` wrote and what it could not."""

    manifest: dict[str, Any]
    files: int = 0
    bytes: int = 0
    missing: list[str] = field(default_factory=list)  # "<path>: ..." lines
    altered: list[str] = field(default_factory=list)
    index_runs: list[str] | None = None  # run ids the uploaded registry index lists


def _safe_rel(rel: str) -> bool:
    p = PurePosixPath(rel)
    return bool(rel) and not p.is_absolute() and ".." not in p.parts and "\\" not in rel


def _sha_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _index_runs(store: Store, entry: dict[str, Any] | None, problems: list[str]) -> list[str] | None:
    if not entry:
        return None
    tmp = Path(tempfile.mkdtemp(prefix="tuneproof-index-")) / "index.sqlite"
    try:
        store.get_file(object_name(entry["sha256"]), tmp)
        if _sha_of(tmp) != entry["sha256"]:
            problems.append(f"registry index: object {entry['sha256'][:12]} was altered in the store")
            return None
        conn = sqlite3.connect(f"file:{tmp}?mode=ro", uri=True)
        with contextlib.closing(conn):
            return [r[0] for r in conn.execute("SELECT id FROM runs ORDER BY seq")]
    except FileNotFoundError:
        problems.append(f"registry index: object {entry['sha256'][:12]} is missing from the store")
        return None
    except sqlite3.Error as err:
        problems.append(f"registry index: unreadable ({err})")
        return None
    finally:
        tmp.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            tmp.parent.rmdir()


def fetch(store: Store, dest: Path, *, say=None) -> Fetched:
    """Write the newest manifest's files into ``dest`` (made; must be empty or absent).

    Returns :class:`Fetched` (files written, bytes, missing and altered ones named).

    Raises:
        TuneproofError: no manifest at the URI, or ``dest`` is not empty.
        StoreError: the store cannot be reached.
    """
    say = say or (lambda line: None)
    manifest = newest_manifest(store)
    if manifest is None:
        raise TuneproofError(
            f"{store.shown}: no remote copy of a study here (no manifest under {store.shown}/manifests/)",
            hint="check the URI (the study's storage.remote) and the credentials in the environment",
        )
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise TuneproofError(
            f"{dest}: is a file, not a folder; restore writes into a new folder",
            hint="name a new folder: tuneproof restore URI NEW_FOLDER",
        )
    if dest.exists() and any(dest.iterdir()):
        raise TuneproofError(
            f"{dest}: the folder is not empty; restore writes into a new folder",
            hint="name a new folder: tuneproof restore URI NEW_FOLDER",
        )
    # files go to a hidden folder beside dest, renamed into place once all are written: a restore killed
    # (kill -9, the machine lost) leaves no half folder under the name asked, and the next restore clears it
    work = dest.parent / f".{dest.name}.restoring"
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
    except OSError as err:
        raise TuneproofError(
            f"{dest}: cannot make the folder ({err.strerror or type(err).__name__})",
            hint="name a folder in a place this user can write: tuneproof restore URI NEW_FOLDER",
        ) from None
    try:
        fetched = _fetch_files(store, work, manifest, say)
        if dest.exists():
            dest.rmdir()  # empty (checked above)
        os.replace(work, dest)
        return fetched
    except BaseException:  # unreachable store, full disk, Ctrl-C: no half-restored folder is left behind
        shutil.rmtree(work, ignore_errors=True)
        raise


def _fetch_files(store: Store, dest: Path, manifest: dict[str, Any], say) -> Fetched:
    out = Fetched(manifest=manifest)
    files = manifest["files"]
    total = sum(int(f.get("size") or 0) for f in files.values())
    say(f"restoring {len(files)} file(s), {human(total)}, from {store.shown} (manifest {manifest['name']})")
    if manifest.get("skipped"):
        say(
            f"note: newer manifest(s) {', '.join(manifest['skipped'])} do not parse (torn by a killed upload, or "
            f"edited): restored from {manifest['name']}, the newest that does"
        )
    for rel, entry in files.items():
        if not _safe_rel(rel):
            out.altered.append(f"{rel}: refused, the manifest names a path outside the study folder")
            continue
        want = str(entry.get("sha256"))
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.restore.tmp")
        try:
            store.get_file(object_name(want), tmp)
        except FileNotFoundError:
            out.missing.append(f"{rel}: its object {want[:12]} is missing from the store")
            continue
        found = _sha_of(tmp)
        if found != want:
            tmp.unlink(missing_ok=True)
            out.altered.append(f"{rel}: sha256 {found} differs from {want} in the manifest (altered in the store)")
            continue
        os.replace(tmp, target)
        out.files += 1
        out.bytes += os.path.getsize(target)
    out.index_runs = _index_runs(store, manifest.get("index"), out.missing)
    return out
