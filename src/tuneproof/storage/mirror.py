"""The remote copy of a study: content-addressed objects, published by a manifest written last.

Layout below ``storage.remote``::

    objects/ab/ab12...ef        # one object per distinct file content, named by its sha256
    manifests/m-000012.json     # {"files": {relative path: {"sha256", "size"}}, "index": {...}, host, time}
    lease.json                  # the machine that writes this prefix: {"host", "pid", "lease", "since", "seen"}

A push uploads every object the newest manifest lacks, then writes the next manifest. Objects are
written before the manifest that names them, and a manifest is one atomic write (a PUT, or a temp
name renamed on a folder store), so a machine killed mid-upload leaves the remote copy at its
previous manifest: readers take the newest manifest that parses. The last :data:`KEEP_MANIFESTS`
manifests are kept; objects no kept manifest names are removed after a push (:meth:`Mirror.collect`).

What is copied: every file of the study folder except hidden names (temp files, the registry's
ballast, checkpoint temp folders, this module's state ``.tuneproof-remote.json``), the live SQLite
index (its consistent snapshot goes as the manifest's ``index``), and the study's
``storage.exclude`` globs. A file of at most :data:`MEMORY_BYTES` is read once and those bytes are
hashed and sent; a larger file (a checkpoint, written once) is hashed, sent, and dropped from this
push if its size or modification time changed meanwhile. So an object's name is always the sha256
of its bytes, which :mod:`tuneproof.storage.restore` checks.

Local state, ``.tuneproof-remote.json`` in the study folder: this machine's lease id, a hash cache
keyed by (size, mtime), and what the last published manifest holds (for :func:`safety`, which
needs no network).
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import socket
import sqlite3
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuneproof.errors import TuneproofError
from tuneproof.io import SCHEMA_VERSION, read_json, sha256_file, write_json
from tuneproof.registry import DB_NAME
from tuneproof.storage.store import Store, StoreError

OBJECTS = "objects"
MANIFESTS = "manifests"
LEASE = "lease.json"
STATE_FILE = ".tuneproof-remote.json"
KEEP_MANIFESTS = 3
MEMORY_BYTES = 8 << 20  # files up to this size are read once, hashed and sent from memory
LARGE_BYTES = 64 << 20  # a file this large gets a progress line
MANIFEST_KIND = "tuneproof-remote-manifest"


def object_name(sha: str) -> str:
    return f"{OBJECTS}/{sha[:2]}/{sha}"


def human(n: float) -> str:
    """Bytes as ``12.3 MiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


# --------------------------------------------------------------------------- what is copied
def _excluded(rel: str, patterns: list[str]) -> bool:
    parts = rel.split("/")
    if any(p.startswith(".") for p in parts):
        return True
    if rel in (DB_NAME, f"{DB_NAME}-journal", f"{DB_NAME}-wal", f"{DB_NAME}-shm") or rel.startswith(f"{DB_NAME}."):
        return True
    return any(fnmatch.fnmatch(rel, p) for p in patterns)


def local_files(study_dir: Path, exclude: list[str] | None = None) -> dict[str, tuple[int, int]]:
    """``{relative path: (size in bytes, mtime in ns)}`` of the files a push copies, in upload order:
    each folder's ``index.json`` after the files beside it (a checkpoint index is written before its
    folder is renamed into place, so reading it last lists every checkpoint folder seen)."""
    found: dict[str, tuple[int, int]] = {}
    late: dict[str, tuple[int, int]] = {}
    for root, dirs, files in os.walk(study_dir):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            path = Path(root) / name
            rel = path.relative_to(study_dir).as_posix()
            if _excluded(rel, exclude or []) or path.is_symlink():
                continue
            try:
                st = path.stat()
            except OSError:  # removed meanwhile (a pruned checkpoint)
                continue
            (late if name == "index.json" else found)[rel] = (st.st_size, st.st_mtime_ns)
    return {**found, **late}


# --------------------------------------------------------------------------- local state
def read_state(study_dir: Path, uri: str | None = None) -> dict[str, Any]:
    """This machine's record of the remote copy (a fresh one when absent, unreadable or for another URI)."""
    path = Path(study_dir) / STATE_FILE
    try:
        state = read_json(path) if path.exists() else {}
    except Exception:  # noqa: BLE001 - a damaged cache is rebuilt, never trusted
        state = {}
    if not isinstance(state, dict) or (uri is not None and state.get("remote") != uri):
        state = {}
    state.setdefault("remote", uri)
    state.setdefault("lease", uuid.uuid4().hex)
    state.setdefault("hashes", {})
    state.setdefault("published", None)
    state["folder"] = str(Path(study_dir).resolve())  # with the host: this machine's folder holds the lease
    return state


def write_state(study_dir: Path, state: dict[str, Any]) -> None:
    write_json(Path(study_dir) / STATE_FILE, state)


# --------------------------------------------------------------------------- manifests
def manifest_names(store: Store) -> list[str]:
    """Manifest file names, oldest first."""
    names = [n for n in store.sizes(MANIFESTS) if n.startswith("m-") and n.endswith(".json") and "/" not in n]
    return sorted(names)


def newest_manifest(store: Store) -> dict[str, Any] | None:
    """The newest manifest that parses (a torn or foreign file is skipped), or None for an empty prefix.

    Raises:
        StoreError: the store cannot be read.
    """
    skipped: list[str] = []
    for name in reversed(manifest_names(store)):
        try:
            m = json.loads(store.read_bytes(f"{MANIFESTS}/{name}"))
        except (FileNotFoundError, ValueError):
            skipped.append(name)
            continue
        if _well_formed(m):
            m["name"] = name
            m["skipped"] = skipped  # newer manifests that did not parse (torn, or edited by hand)
            return m
        skipped.append(name)
    return None


def _entry_ok(entry: Any) -> bool:
    sha = entry.get("sha256") if isinstance(entry, dict) else None
    size = entry.get("size") if isinstance(entry, dict) else None
    return (
        isinstance(sha, str)
        and len(sha) == 64
        and all(c in "0123456789abcdef" for c in sha)
        and isinstance(size, int)
        and not isinstance(size, bool)
        and size >= 0
    )


def _well_formed(m: Any) -> bool:
    """A manifest of this kind whose every entry (and the index) is ``{"sha256": 64 hex digits, "size": int}``."""
    if not (isinstance(m, dict) and m.get("kind") == MANIFEST_KIND and isinstance(m.get("files"), dict)):
        return False
    if m.get("index") is not None and not _entry_ok(m["index"]):
        return False
    return all(isinstance(rel, str) and _entry_ok(e) for rel, e in m["files"].items())


def _seq(manifest: dict[str, Any] | None) -> int:
    return int(manifest.get("seq", 0)) if manifest else 0


# --------------------------------------------------------------------------- lease
class LeaseHeld(Exception):
    """Another machine writes this prefix (the message names it)."""


def _ours(held: dict[str, Any], state: dict[str, Any]) -> bool:
    """The lease is this machine's: its id from this folder (or from a folder of this host that was moved
    here), or this host and this study folder (a local state lost to a full disk keeps its lease: the id is
    adopted). A copy of the study folder carries its original's id: while the original's folder is there, the
    copy is another study and is refused."""
    if held.get("lease") == state["lease"]:
        folder = held.get("folder")
        if not folder or folder == state.get("folder"):
            return True
        # the same lease id from another folder: this folder was moved (the old one is gone), or copied with
        # its hidden state (the old one is still there: two studies would write one prefix)
        return held.get("host") == socket.gethostname() and not (Path(folder) / STATE_FILE).exists()
    if held.get("host") == socket.gethostname() and held.get("folder") and held.get("folder") == state.get("folder"):
        state["lease"] = held["lease"]
        return True
    return False


def check_lease(store: Store, state: dict[str, Any], *, take_over: bool = False, study: str = "") -> None:
    """Make sure this machine (``state['lease']``) holds ``lease.json``, writing it when absent.

    Raises:
        LeaseHeld: another machine's lease is there (names its host, pid and last-seen time);
            ``take_over`` replaces it.
        StoreError: the store cannot be reached.
    """
    now = time.time()
    try:
        held = json.loads(store.read_bytes(LEASE))
    except FileNotFoundError:
        held = None
    except ValueError:
        held = None  # a torn lease file: rewritten
    if isinstance(held, dict) and _ours(held, state) and not take_over:
        return
    if take_over:
        state["lease"] = uuid.uuid4().hex  # a copied folder's lease id is its original's: never shared again
    if isinstance(held, dict) and held.get("lease") and not take_over:
        seen = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(float(held.get("seen") or 0)))
        where = f"study folder {held.get('folder')} on " if held.get("folder") else ""
        raise LeaseHeld(
            f"{store.shown} is the remote copy written by {where}host {held.get('host')} (pid {held.get('pid')}, "
            f"last seen {seen} UTC): two studies writing one prefix would mix them"
        )
    mine = {"host": socket.gethostname(), "pid": os.getpid(), "lease": state["lease"], "since": now, "seen": now}
    mine.update({"study": study, "folder": state.get("folder")})
    store.put_bytes(LEASE, json.dumps(mine, indent=1).encode())
    # two machines starting at once: the last write wins; the loser finds out here
    back = json.loads(store.read_bytes(LEASE))
    if back.get("lease") != state["lease"]:
        raise LeaseHeld(f"{store.shown} was taken just now by host {back.get('host')} (pid {back.get('pid')})")


def touch_lease(store: Store, state: dict[str, Any], study: str = "") -> None:
    """Renew the lease's last-seen time (only when this machine holds it)."""
    try:
        held = json.loads(store.read_bytes(LEASE))
    except (FileNotFoundError, ValueError):
        held = {}
    if held.get("lease") is not None and not _ours(held, state):
        raise LeaseHeld(f"{store.shown} is now written by host {held.get('host')} (pid {held.get('pid')})")
    now = time.time()
    mine = {"host": socket.gethostname(), "pid": os.getpid(), "lease": state["lease"]}
    mine.update({"since": held.get("since", now), "seen": now, "study": study, "folder": state.get("folder")})
    store.put_bytes(LEASE, json.dumps(mine, indent=1).encode())


# --------------------------------------------------------------------------- push
@dataclass
class PushResult:
    """What one push did: files and bytes sent, the manifest published (None: nothing changed)."""

    sent_files: int = 0
    sent_bytes: int = 0
    published: str | None = None
    skipped: list[str] = field(default_factory=list)  # changed while being sent: next push


def index_snapshot(study_dir: Path) -> Path | None:
    """A consistent copy of the SQLite index (sqlite3's online backup) in a temp folder, or None without one.
    Raises OSError / sqlite3.Error (a full disk)."""
    db = Path(study_dir) / DB_NAME
    if not db.exists():
        return None
    out = Path(tempfile.mkdtemp(prefix="tuneproof-index-")) / DB_NAME
    src = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        dst = sqlite3.connect(out)
        with contextlib.closing(dst):
            src.backup(dst)
    finally:
        src.close()
    return out


def inside_study(study_dir: Path, uri: str) -> None:
    """Refuse a ``file://`` remote copy inside the study folder it copies (each push would copy the copy,
    and a lost disk loses both).

    Raises:
        TuneproofError: naming ``storage.remote`` and the folder.
    """
    scheme, _, rest = uri.partition("://")
    if scheme.lower() != "file":
        return
    remote = Path("/" + rest.partition("/")[2]).resolve()
    study = Path(study_dir).resolve()
    if remote == study or study in remote.parents:
        raise TuneproofError(
            f"{study / 'tuneproof.yaml'}: storage.remote {uri} is inside the study folder it copies: it would copy "
            "itself and is lost with this disk",
            hint="name a folder outside the study, on another disk or mount (file:///mnt/backup/study), or s3://, sftp://",
        )


class Mirror:
    """Pushes one study folder to one store (one thread at a time).

    Args:
        study_dir: the study folder.
        uri: ``storage.remote``.
        exclude: ``storage.exclude`` globs.
        say: prints one line (progress of large files).
    """

    def __init__(self, study_dir: Path, uri: str, exclude: list[str] | None = None, *, study: str = "", say=None):
        inside_study(Path(study_dir), uri)
        self.study_dir = Path(study_dir)
        self.uri = uri
        self.exclude = list(exclude or [])
        self.study = study
        self.say = say or (lambda line: None)
        self.state = read_state(self.study_dir, uri)
        self.store: Store | None = None
        self.remote_objects: dict[str, int] | None = None  # sha -> size, listed once per connection
        self.current: dict[str, Any] | None = None

    def connect(self) -> Store:
        """The store (opened again after a failure). Raises :class:`StoreError`."""
        if self.store is None:
            self.store = Store(self.uri)
            self.remote_objects = None
        return self.store

    def drop(self) -> None:
        """Forget the connection (after a failure): the next call opens it again."""
        self.store = None
        self.remote_objects = None

    def _objects(self) -> dict[str, int]:
        if self.remote_objects is None:
            store = self.connect()
            self.remote_objects = {k.rsplit("/", 1)[-1]: v for k, v in store.sizes(OBJECTS).items()}
            self.current = newest_manifest(store)
        return self.remote_objects

    def _hash(self, rel: str, size: int, mtime: int) -> str:
        cached = self.state["hashes"].get(rel)
        if cached and cached[0] == size and cached[1] == mtime:
            return cached[2]
        sha = sha256_file(self.study_dir / rel)
        self.state["hashes"][rel] = [size, mtime, sha]
        return sha

    def _send(self, rel: str, size: int, mtime: int) -> tuple[str, int, bool] | None:
        """Upload one file's content unless the store has it; ``(sha, size, sent)``, or None when the file
        changed or vanished meanwhile."""
        store = self.connect()
        path = self.study_dir / rel
        if size <= MEMORY_BYTES:
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                return None
            sha = hashlib.sha256(data).hexdigest()
            self.state["hashes"][rel] = [size, mtime, sha] if len(data) == size else None
            if self._objects().get(sha) == len(data):
                return sha, len(data), False
            store.put_bytes(object_name(sha), data)
            self._objects()[sha] = len(data)
            return sha, len(data), True
        try:
            sha = self._hash(rel, size, mtime)
        except FileNotFoundError:
            return None
        if self._objects().get(sha) == size:
            return sha, size, False
        if size >= LARGE_BYTES:
            self.say(f"remote: sending {rel} ({human(size)}) to {store.shown}")
        started = time.monotonic()
        try:
            store.put_file(path, object_name(sha))
        except StoreError:
            if not path.exists():
                return None  # removed meanwhile (a pruned checkpoint): not the store's fault
            raise
        try:
            st = path.stat()
        except FileNotFoundError:
            st = None
        if st is None or (st.st_size, st.st_mtime_ns) != (size, mtime):
            store.delete(object_name(sha))  # the bytes sent may not be the bytes hashed
            return None
        if size >= LARGE_BYTES:
            took = max(time.monotonic() - started, 1e-3)
            self.say(f"remote: sent {rel} ({human(size)} in {took:.0f} s, {human(size / took)}/s)")
        self._objects()[sha] = size
        return sha, size, True

    def push(self, *, with_index: bool = True) -> PushResult:
        """Upload what the newest manifest lacks, then publish the next manifest (when anything changed).

        Raises:
            StoreError: the store cannot be reached (nothing is published: the remote copy keeps its
                previous manifest).
            LeaseHeld: another machine holds the prefix.
            OSError: a local fault (a full disk while writing the index snapshot or the local state).
        """
        result = PushResult()
        self._objects()
        files: dict[str, dict[str, Any]] = {}
        mtimes: dict[str, int] = {}
        for rel, (size, mtime) in local_files(self.study_dir, self.exclude).items():
            sent = self._send(rel, size, mtime)
            if sent is None:
                result.skipped.append(rel)
                continue
            sha, n, was_sent = sent
            files[rel] = {"sha256": sha, "size": n}
            mtimes[rel] = mtime
            if was_sent:
                result.sent_files += 1
                result.sent_bytes += n
        index = (self.current or {}).get("index")
        if with_index:
            snap = index_snapshot(self.study_dir)
            if snap is not None:
                try:
                    data = snap.read_bytes()
                finally:
                    snap.unlink(missing_ok=True)
                    with contextlib.suppress(OSError):
                        snap.parent.rmdir()
                sha = hashlib.sha256(data).hexdigest()
                if self._objects().get(sha) != len(data):
                    self.connect().put_bytes(object_name(sha), data)
                    self._objects()[sha] = len(data)
                index = {"sha256": sha, "size": len(data)}
        prior = self.current or {}
        if files != prior.get("files") or index != prior.get("index"):
            store = self.connect()
            touch_lease(store, self.state, self.study)
            seq = _seq(self.current) + 1
            manifest = {
                "schema_version": SCHEMA_VERSION,
                "kind": MANIFEST_KIND,
                "seq": seq,
                "study": self.study,
                "host": socket.gethostname(),
                "written": round(time.time(), 3),
                "files": files,
                "index": index,
            }
            name = f"m-{seq:06d}.json"
            store.put_bytes(f"{MANIFESTS}/{name}", json.dumps(manifest, indent=1, sort_keys=True).encode())
            manifest["name"] = name
            self.current = manifest
            result.published = name
        self.state["published"] = {
            "seq": _seq(self.current),
            "time": (self.current or {}).get("written"),
            "files": {
                rel: [f["sha256"], f["size"], mtimes.get(rel)]
                for rel, f in (self.current or {}).get("files", {}).items()
            },
        }
        self.state["hashes"] = {k: v for k, v in self.state["hashes"].items() if v and k in files}
        write_state(self.study_dir, self.state)
        return result

    def collect(self) -> int:
        """Remove manifests older than the last :data:`KEEP_MANIFESTS` and the objects only they named
        (never an object no manifest names yet: another process may be about to publish it); returns
        the number of objects removed. Raises :class:`StoreError`."""
        store = self.connect()
        names = manifest_names(store)
        if len(names) <= KEEP_MANIFESTS:
            return 0

        def named(name: str) -> set[str]:
            try:
                m = json.loads(store.read_bytes(f"{MANIFESTS}/{name}"))
            except (FileNotFoundError, ValueError):
                return set()
            out = {f["sha256"] for f in m.get("files", {}).values()}
            return out | ({m["index"]["sha256"]} if m.get("index") else set())

        wanted: set[str] = set().union(*(named(n) for n in names[-KEEP_MANIFESTS:]))
        dropped: set[str] = set().union(*(named(n) for n in names[:-KEEP_MANIFESTS]))
        removed = 0
        for sha in sorted(dropped - wanted):
            store.delete(object_name(sha))
            self._objects().pop(sha, None)
            removed += 1
        for name in names[:-KEEP_MANIFESTS]:
            store.delete(f"{MANIFESTS}/{name}")
        return removed


# --------------------------------------------------------------------------- how much is safe
def safety(study_dir: Path, uri: str, exclude: list[str] | None = None) -> dict[str, Any]:
    """How much of the study is safe off the box, from the local state (no network).

    Returns ``{"remote", "published" (seconds since the epoch or None), "files", "bytes" (in the last
    published manifest), "newest_checkpoint" (``runs/ID/checkpoints/step-N`` or None), "local_only"
    (relative paths not in it or changed since), "local_only_bytes"}``.
    """
    state = read_state(study_dir, uri)
    published = state.get("published") or {}
    remote = published.get("files") or {}
    local_only, local_bytes = [], 0
    for rel, (size, mtime) in local_files(Path(study_dir), exclude).items():
        entry = remote.get(rel)
        if entry is None or entry[1] != size or (entry[2] is not None and entry[2] != mtime):
            local_only.append(rel)
            local_bytes += size
    ckpts = sorted(
        {
            rel.rsplit("/", 1)[0]
            for rel in remote
            if "/checkpoints/step-" in rel and rel.endswith("tensors.safetensors")
        },
        key=lambda r: (int(r.rsplit("step-", 1)[1]) if r.rsplit("step-", 1)[1].isdigit() else -1, r),
    )
    return {
        "remote": uri,
        "published": published.get("time"),
        "files": len(remote),
        "bytes": sum(int(e[1]) for e in remote.values()),
        "newest_checkpoint": ckpts[-1] if ckpts else None,
        "local_only": local_only,
        "local_only_bytes": local_bytes,
    }


__all__ = [
    "LeaseHeld",
    "Mirror",
    "PushResult",
    "StoreError",
    "check_lease",
    "local_files",
    "newest_manifest",
    "object_name",
    "read_state",
    "safety",
    "write_state",
]
