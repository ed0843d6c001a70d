"""Atomic, schema-versioned artifacts and strict text decoding.

Every artifact is written to a temporary file in the same folder and renamed into place
(``os.replace`` is atomic on POSIX), so an interrupted run never leaves a half file.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable

from tuneproof import SCHEMA_VERSION
from tuneproof.errors import TuneproofError


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
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
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
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
        fh.flush()


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
    """Decode a file as UTF-8, repairing CESU-8 surrogate pairs (CASES C17).

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
            f"{path}: not UTF-8 at byte offset {first_bad} (bytes {raw[first_bad:first_bad + 4].hex(' ')})",
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


def sha256_json(obj: Any) -> str:
    """Hex sha256 of the canonical JSON of ``obj`` (sorted keys, no whitespace)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode()).hexdigest()
