"""Deliver a folder to a store: upload every file, read each back and check its sha256.

The delivery's manifest (``MANIFEST.sha256.json``: relative path -> sha256 and size) is written
after every file, and only after every file read back from the store hashes to its recorded sha256
does :func:`deliver_folder` return; any difference raises, naming the file and both hashes.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from tuneproof.errors import CheckFailed, TuneproofError
from tuneproof.io import SCHEMA_VERSION, append_jsonl, read_jsonl, sha256_file
from tuneproof.storage.store import Store, StoreError, redact
from tuneproof.study import remote_uri

DELIVERY_MANIFEST = "MANIFEST.sha256.json"


#: deliveries to a store, one JSON line each ({"what", "uri", "bytes", "seconds", "time"}): the measured
#: upload time the rental plan and reserve include
UPLOADS_FILE = "uploads.jsonl"


def record_upload(study_dir: Path, *, what: str, uri: str, size: int, seconds: float, when: float) -> None:
    """Append one measured delivery (``size`` in bytes, ``seconds`` from the first byte sent to the last
    sha256 read back) to :data:`UPLOADS_FILE`; the URI is recorded without a password."""
    append_jsonl(
        Path(study_dir) / UPLOADS_FILE,
        {"what": what, "uri": redact(uri), "bytes": int(size), "seconds": round(float(seconds), 3), "time": when},
    )


def measured_upload(study_dir: Path) -> dict | None:
    """The last measured delivery of :func:`record_upload` (None when nothing was delivered to a store)."""
    path = Path(study_dir) / UPLOADS_FILE
    try:
        rows = read_jsonl(path) if path.is_file() else []
    except (TuneproofError, OSError):
        return None
    return rows[-1] if rows else None


def deliver_folder(store: Store, folders: dict[str, Path], *, say=None) -> dict[str, Any]:
    """Upload each ``{name: local folder or file}`` under ``store`` as ``name/...``, then the manifest,
    then read every file back and compare its sha256.

    Returns ``{"files", "bytes", "upload_s", "check_s", "uri"}``.

    Raises:
        StoreError: the store cannot be reached (nothing said delivered).
        CheckFailed: a file read back differs from what was sent, or is absent (names it and both hashes).
    """
    say = say or (lambda line: None)
    files: dict[str, dict[str, Any]] = {}
    local: dict[str, Path] = {}
    for name, src in folders.items():
        src = Path(src)
        items = [src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file() and not p.is_symlink())
        for p in items:
            rel = name if src.is_file() else f"{name}/{p.relative_to(src).as_posix()}"
            local[rel] = p
            files[rel] = {"sha256": sha256_file(p), "size": p.stat().st_size}
    started = time.monotonic()
    sent = 0
    for rel, p in local.items():
        store.put_file(p, rel)
        sent += files[rel]["size"]
    manifest = {"schema_version": SCHEMA_VERSION, "written": round(time.time(), 3), "files": files}
    store.put_bytes(DELIVERY_MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
    upload_s = time.monotonic() - started
    say(f"sent {len(files)} file(s) to {store.shown} in {upload_s:.1f} s; reading them back")
    started = time.monotonic()
    back = json.loads(store.read_bytes(DELIVERY_MANIFEST))
    bad = []
    for rel, entry in back["files"].items():
        try:
            found = hashlib.sha256(store.read_bytes(rel)).hexdigest()
        except FileNotFoundError:
            bad.append(f"{rel}: absent from the store after upload")
            continue
        if found != entry["sha256"] or entry["sha256"] != files.get(rel, {}).get("sha256"):
            bad.append(f"{rel}: sha256 {found} read back differs from {files.get(rel, {}).get('sha256')} sent")
    if set(back["files"]) != set(files):
        bad.append(f"{DELIVERY_MANIFEST}: lists {len(back['files'])} file(s), {len(files)} were sent")
    if bad:
        raise CheckFailed(
            f"{store.shown}: not delivered, {len(bad)} file(s) differ after upload: " + "; ".join(bad[:5]),
            hint="deliver again (the store changed or damaged them); nothing was said delivered",
        )
    return {
        "files": len(files),
        "bytes": sent,
        "upload_s": upload_s,
        "check_s": time.monotonic() - started,
        "uri": store.shown,
    }


def deliver_to(study_dir: Path, uri: str, folders: dict[str, Path], *, what: str, say=None) -> dict[str, Any]:
    """:func:`deliver_folder` to the store at ``uri``, the measured time recorded (:func:`record_upload`).

    Raises:
        TuneproofError: the store cannot be reached (one line; nothing is said delivered).
        CheckFailed: a file read back differs (see :func:`deliver_folder`).
    """
    try:
        uri = remote_uri(uri)
    except ValueError as err:
        raise TuneproofError(
            f"not delivered: {err}", hint="give the store as s3://bucket/prefix, sftp://host/path or file:///path"
        ) from None
    try:
        store = Store(uri)
        done = deliver_folder(store, folders, say=say)
    except StoreError as err:
        raise TuneproofError(
            f"not delivered: {err}",
            hint="the local bundle and dossier stand as they are; check the network and the credentials, then "
            "run the same command again",
        ) from None
    record_upload(
        study_dir, what=what, uri=uri, size=done["bytes"], seconds=done["upload_s"] + done["check_s"], when=time.time()
    )
    return done
