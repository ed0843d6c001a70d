"""Atomic, schema-versioned artifacts and strict text decoding.

Every artifact is written to a temporary file in the same folder and renamed into place
(``os.replace`` is atomic on POSIX), so an interrupted run never leaves a half file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from tuneproof.errors import TuneproofError

#: version of every JSON artifact tuneproof writes (the ``schema_version`` key)
SCHEMA_VERSION = 1


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temp file + rename. Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException as err:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(err, OSError) and err.filename is None:
            err.filename = str(path)  # a failed write() names no file: name the artifact
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write UTF-8 ``text`` atomically."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike, obj: Any, *, versioned: bool = True) -> Path:
    """Write ``obj`` as indented JSON, atomically. Dicts get ``schema_version`` first when ``versioned``."""
    if versioned and isinstance(obj, dict) and "schema_version" not in obj:
        obj = {"schema_version": SCHEMA_VERSION, **obj}
    return atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n")


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> Path:
    """Write rows as JSON Lines, atomically."""
    body = "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in rows)
    return atomic_write_text(path, body)


def append_jsonl(path: str | os.PathLike, row: dict) -> None:
    """Append one JSON line (used for logs such as metrics.jsonl that grow during a run)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(row, ensure_ascii=False, default=str) + "\n"
    size = path.stat().st_size if path.exists() else 0
    try:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
    except OSError as err:
        try:  # no half line: a full disk must not leave a broken last row (truncating needs no space)
            os.truncate(path, size)
        except OSError:
            pass
        if err.filename is None:
            err.filename = str(path)
        raise


# --------------------------------------------------------------------------- faults of the machine
DISK_FULL_ERRNOS = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
READ_ONLY_ERRNOS = {errno.EROFS, errno.EACCES, errno.EPERM}
_SQLITE_CAUSES = (  # sqlite3.OperationalError messages (sqlite3.c sqlite3ErrStr) -> cause
    ("database or disk is full", "disk full"),
    ("attempt to write a readonly database", "read-only"),
    ("unable to open database file", "read-only"),
    ("disk i/o error", "I/O error"),
)


#: below this many free bytes, an I/O error is a full disk: SQLite reports a ``-shm`` / ``-wal`` file it cannot
#: grow as "disk I/O error" (SQLITE_IOERR), not "database or disk is full"; its WAL index alone needs 32 KiB
LOW_SPACE_BYTES = 1 << 20


def free_space(folder: str | os.PathLike) -> int | None:
    """Free bytes on the file system of ``folder`` (its nearest existing parent), None when unknown."""
    folder = Path(folder)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def fault_cause(err: BaseException, folder: str | os.PathLike | None = None) -> str | None:
    """``"disk full"``, ``"read-only"`` or ``"I/O error"`` when ``err`` is a fault of the machine
    (an ``OSError`` with errno ENOSPC/EDQUOT, EROFS/EACCES/EPERM or EIO, or the same faults as
    reported by sqlite3), else None. Bad input (a missing file) is not a machine fault.

    ``folder``: where the command writes; an I/O error there while its file system has less than
    :data:`LOW_SPACE_BYTES` free is ``"disk full"`` (:func:`fault_message` then states the free space)."""
    seen = set()
    first = err
    while err is not None and id(err) not in seen:  # an OSError behind a library's own exception
        seen.add(id(err))
        cause = _fault_cause_one(err, sqlite3)
        if cause is not None:
            if cause == "I/O error" and folder is not None and _low_space(first, folder):
                return "disk full"
            return cause
        err = err.__cause__ or err.__context__
    return None


def _low_space(err: BaseException, folder: str | os.PathLike) -> bool:
    free = free_space(folder)
    return free is not None and free < LOW_SPACE_BYTES


def space_note(err: BaseException, cause: str, folder: str | os.PathLike | None) -> str:
    """``"; 12 KiB free in /data/study"`` when ``cause`` is a disk full found from an I/O error (the free
    space is then the evidence), else ``""``."""
    if cause != "disk full" or folder is None or fault_cause(err) != "I/O error":
        return ""
    free = free_space(folder)
    return "" if free is None else f"; {_size(free)} free in {folder}"


def _size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}".replace(".0 ", " ")
        n /= 1024
    return f"{n} bytes"


_TEXT_CAUSES = (  # messages of libraries that wrap the OS error in their own exception (safetensors' Rust writer:
    # "I/O error: No space left on device (os error 28)")
    (os.strerror(errno.ENOSPC), "disk full"),
    ("os error 28", "disk full"),
    (os.strerror(getattr(errno, "EDQUOT", errno.ENOSPC)), "disk full"),
    (os.strerror(errno.EROFS), "read-only"),
    ("os error 30", "read-only"),
)


def _fault_cause_one(err: BaseException, sqlite3) -> str | None:
    if isinstance(err, OSError):
        if err.errno in DISK_FULL_ERRNOS:
            return "disk full"
        if err.errno in READ_ONLY_ERRNOS:
            return "read-only"
        if err.errno == errno.EIO:
            return "I/O error"
        return None
    if isinstance(err, sqlite3.OperationalError):
        msg = str(err).lower()
        for text, cause in _SQLITE_CAUSES:
            if text in msg:
                return cause
        return None
    if isinstance(err, Exception) and not isinstance(err, sqlite3.Error):
        msg = str(err)
        for text, cause in _TEXT_CAUSES:
            if text in msg:
                return cause
    return None


def fault_message(err: BaseException, cause: str, folder: str | os.PathLike | None = None) -> str:
    """One line naming the folder and the cause, e.g.
    ``/data/study/runs/r0003: disk full (No space left on device) writing step-000004.pt``."""
    name = getattr(err, "filename", None)
    where = Path(name).parent if name else (Path(folder) if folder is not None else None)
    if folder is not None and name and not str(name).startswith(str(folder)):
        where = Path(folder)
    detail = (getattr(err, "strerror", None) or str(err)) + space_note(err, cause, folder)
    what = f" writing {Path(name).name}" if name else ""
    return f"{where if where is not None else 'the study folder'}: {cause} ({detail}){what}"


TEMP_SUFFIX = ".tmp"


def is_temp_name(name: str) -> bool:
    """Names of temporary files and folders this package writes before a rename: a leading dot and
    a ``.tmp`` suffix or a ``.tmp-`` part (``.outputs.jsonl.k3j2.tmp``, ``.step-000004.tmp-x8a1``)."""
    return name.startswith(".") and (name.endswith(TEMP_SUFFIX) or ".tmp-" in name)


def remove_temps(folder: str | os.PathLike, *, older_than_s: float | None = None, recursive: bool = True) -> list[Path]:
    """Delete temporary files/folders (:func:`is_temp_name`) under ``folder``; returns what was removed.

    ``older_than_s``: only entries whose mtime is at least that many seconds old (for folders a
    live process may be writing into). Errors (a vanished file, no permission) are ignored.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    removed = []
    now = time.time()
    found = folder.rglob(".*") if recursive else folder.glob(".*")
    for p in sorted(found, key=lambda q: len(q.parts)):
        if not is_temp_name(p.name) or any(p.is_relative_to(r) for r in removed):
            continue
        try:
            if older_than_s is not None and now - p.lstat().st_mtime < older_than_s:
                continue
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
            removed.append(p)
        except OSError:
            pass
    return removed


class Held(Exception):
    """The lock of :func:`exclusive_lock` is held by another process (``pid``: the holder's, when it wrote it)."""

    def __init__(self, path: Path, pid: int | None):
        super().__init__(f"{path} is held by pid {pid}")
        self.path, self.pid = path, pid


@contextlib.contextmanager
def exclusive_lock(path: str | os.PathLike) -> Iterator[Path]:
    """Hold an exclusive ``flock`` on the file ``path`` (made if missing, holding this process's pid) for the
    block, or raise :class:`Held` at once when another process holds it. The kernel drops the lock when
    its process dies (kill -9 included); the file is removed when the block ends, and a file left by a
    killed process is taken over by the next caller (the lock is on the file, not its existence).

    Raises:
        Held: another process holds the lock.
    """
    path = Path(path)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                pid = int(os.read(fd, 32).decode() or 0) or None
            except ValueError:
                pid = None
            os.close(fd)
            raise Held(path, pid) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:  # removed by the holder that just released it: lock the new file
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        yield path
    finally:
        with contextlib.suppress(OSError):
            path.unlink()  # before the unlock: a waiting process then sees another inode and opens again
        os.close(fd)


def remove_free_lock(path: str | os.PathLike) -> bool:
    """Remove a lock file of :func:`exclusive_lock` that no process holds (left by a killed one); True if removed."""
    if not os.path.isfile(path):
        return False
    try:
        with exclusive_lock(path):
            return True
    except (Held, OSError):
        return False


def read_json(path: str | os.PathLike) -> Any:
    """Read a JSON file; a missing or broken file raises :class:`TuneproofError` naming it."""
    path = Path(path)
    if not path.exists():
        raise TuneproofError(f"{path}: file not found")
    try:
        return json.loads(read_text(path)[0])
    except json.JSONDecodeError as err:
        raise TuneproofError(f"{path}:{err.lineno}:{err.colno}: invalid JSON ({err.msg})") from None


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Read JSON Lines; a broken line raises :class:`TuneproofError` naming file and line."""
    rows = []
    text, _ = read_text(path)
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise TuneproofError(f"{path}:{lineno}: invalid JSON line ({err.msg})") from None
    return rows


def read_text(path: str | os.PathLike) -> tuple[str, list[str]]:
    """Decode a file as UTF-8, repairing CESU-8 surrogate pairs (docs/CASES.md C17).

    Returns ``(text, repairs)`` where ``repairs`` lists what was repaired, e.g.
    ``["PlayMusic/train.json: byte 1234: CESU-8 surrogate pair decoded as U+1F355"]``.

    Raises:
        TuneproofError: file missing, or bytes that are neither UTF-8 nor CESU-8 (names the
            file and the byte offset).
    """
    path = Path(path)
    if not path.exists():
        raise TuneproofError(f"{path}: file not found", hint="check the path in the study file or --data")
    raw = path.read_bytes()
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        return raw.decode("utf-8"), []
    except UnicodeDecodeError as err:
        first_bad = err.start
    try:
        # CESU-8: a supplementary character stored as two 3-byte surrogates. 'surrogatepass'
        # decodes them to lone surrogates; the UTF-16 round trip pairs them into one code point.
        text = raw.decode("utf-8", "surrogatepass").encode("utf-16", "surrogatepass").decode("utf-16")
    except UnicodeError:
        raise TuneproofError(
            f"{path}: not UTF-8 at byte offset {first_bad} (bytes {raw[first_bad : first_bad + 4].hex(' ')})",
            hint="re-save the file as UTF-8",
        ) from None
    repairs = []
    offset = 0
    while True:
        pos = raw.find(b"\xed", offset)
        if pos < 0:
            break
        chunk = raw[pos : pos + 6]
        try:
            ch = chunk.decode("utf-8", "surrogatepass").encode("utf-16", "surrogatepass").decode("utf-16")
            repairs.append(f"{path}: byte {pos}: CESU-8 surrogate pair repaired to U+{ord(ch[0]):04X}")
            offset = pos + 6
        except UnicodeError:
            offset = pos + 1
    return text, repairs


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            block = fh.read(chunk)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


HASH_CACHE_MIN_BYTES = 1 << 20  # smaller files are hashed directly (faster than a cache lookup)


def hash_cache_dir() -> Path:
    """``$TUNEPROOF_HASH_CACHE``, else ``$XDG_CACHE_HOME/tuneproof/hashes`` (default ``~/.cache``)."""
    if os.environ.get("TUNEPROOF_HASH_CACHE"):
        return Path(os.environ["TUNEPROOF_HASH_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tuneproof" / "hashes"


def sha256_file_cached(path: str | os.PathLike, *, min_bytes: int = HASH_CACHE_MIN_BYTES) -> str:
    """:func:`sha256_file`, remembered by (absolute path, size, mtime, ctime, inode) in
    :func:`hash_cache_dir`, so a 16 GB base model is read once, not by every command.

    Any change of the file's bytes through the file system changes its mtime and ctime (ctime
    cannot be set back by ``touch``), so a cached value is reused only for the same file state.
    ``TUNEPROOF_REHASH=1`` (``tuneproof --rehash ...``) recomputes and refreshes every value. A
    cache that cannot be written (read-only) is skipped silently.
    """
    path = Path(path).resolve()
    st = path.stat()
    if st.st_size < min_bytes:
        return sha256_file(path)
    ident = f"{path}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\0{st.st_ino}"
    entry = hash_cache_dir() / (hashlib.sha256(ident.encode()).hexdigest() + ".json")
    if os.environ.get("TUNEPROOF_REHASH") != "1" and entry.is_file():
        try:
            rec = json.loads(entry.read_text(encoding="utf-8"))
            if rec.get("ident") == ident and isinstance(rec.get("sha256"), str) and len(rec["sha256"]) == 64:
                return rec["sha256"]
        except (OSError, ValueError):
            pass
    digest = sha256_file(path)
    try:
        write_json(entry, {"ident": ident, "path": str(path), "size": st.st_size, "sha256": digest})
    except OSError:
        pass
    return digest


def sha256_json(obj: Any) -> str:
    """Hex sha256 of the canonical JSON of ``obj`` (sorted keys, no whitespace)."""
    return hashlib.sha256(
        json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode()
    ).hexdigest()


def flatten_keys(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings -> ``{"dotted.key": leaf value}``; lists and empty mappings are leaves
    (``{"a": {"b": 1}, "c": [1, 2]}`` -> ``{"a.b": 1, "c": [1, 2]}``). Used for config diffs,
    the preflight's scope and tracker params."""
    if isinstance(obj, dict) and obj:
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(flatten_keys(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: obj}
