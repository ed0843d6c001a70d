"""One remote store, reached through fsspec (``s3://``, ``gs://``, ``az://``, ``sftp://``, ``file://``).

Credentials are never passed here: fsspec's implementations read them from the environment or the
store's own config (s3fs/botocore: ``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``, ``AWS_ENDPOINT_URL``,
``~/.aws``; sftp/paramiko: ``~/.ssh`` keys and the SSH agent; any ``FSSPEC_<PROTOCOL>_<KWARG>``
variable, fsspec's documented config mechanism: https://filesystem-spec.readthedocs.io/en/latest/features.html#configuration).

Every call that fails for any reason other than "no such object" raises :class:`StoreError` with a
one-line cause, so callers decide between a warning (background uploads) and a refusal (restore,
deliver). Writes to stores with real folders (local, SFTP) go to a temporary name and are renamed into
place; an object store's PUT is atomic by itself. So no reader ever sees half an object.
"""

from __future__ import annotations

import posixpath
import uuid
from pathlib import Path
from typing import Any

#: protocols whose paths are real folders (made before a write, written under a temp name then renamed)
FOLDER_PROTOCOLS = ("file", "local", "sftp", "ssh")
#: defaults that keep an unreachable store from hanging a command (the user's own config wins)
DEFAULTS: dict[str, dict[str, Any]] = {
    "s3": {
        "use_listings_cache": False,
        "config_kwargs": {"connect_timeout": 5, "read_timeout": 60, "retries": {"max_attempts": 2}},
    },
    "sftp": {"timeout": 10, "banner_timeout": 10, "auth_timeout": 10},
}


class StoreError(Exception):
    """The store could not be reached or refused the request (one line: the URI and the cause)."""


def _cause(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return f"{type(err).__name__}: {text}"[:300]


def redact(uri: str) -> str:
    """``uri`` without a password (``sftp://user:***@host``): what is shown and recorded."""
    scheme, sep, rest = uri.partition("://")
    if not sep:
        return uri
    netloc, slash, path = rest.partition("/")
    if "@" in netloc and ":" in netloc.rsplit("@", 1)[0]:
        netloc = netloc.rsplit("@", 1)[0].split(":", 1)[0] + ":***@" + netloc.rsplit("@", 1)[1]
    return f"{scheme}{sep}{netloc}{slash}{path}"


class Store:
    """The remote folder ``uri`` (an fsspec URI); paths below it are POSIX relative paths.

    Raises:
        StoreError: at construction when the store cannot be opened (an SFTP server that does not answer,
            a protocol whose package is missing: ``pip install 'tuneproof[remote]'``).
    """

    def __init__(self, uri: str):
        self.uri = uri.rstrip("/")
        self.shown = redact(self.uri)
        protocol = self.uri.split("://", 1)[0].lower()
        options = dict(DEFAULTS.get(protocol, {}))
        try:
            import fsspec  # noqa: PLC0415 - fsspec (and s3fs/paramiko) only for studies with storage.remote

            self.fs, root = fsspec.core.url_to_fs(self.uri, skip_instance_cache=True, **options)
        except ImportError as err:
            raise StoreError(
                f"{self.shown}: the {protocol}:// store needs a package that is not installed ({err}); "
                "pip install 'tuneproof[remote]'"
            ) from None
        except Exception as err:  # noqa: BLE001 - any failure to open the store is one line
            raise StoreError(f"{self.shown}: cannot open the store ({_cause(err)})") from None
        self.root = root.rstrip("/") or "/"
        protocols = self.fs.protocol if isinstance(self.fs.protocol, (tuple, list)) else (self.fs.protocol,)
        self.folders = any(p in FOLDER_PROTOCOLS for p in protocols)

    def path(self, rel: str) -> str:
        return posixpath.join(self.root, rel) if rel else self.root

    def _call(self, what: str, fn, *args, absent_ok: bool = True, **kwargs):
        """``fn(*args, **kwargs)``; FileNotFoundError passes through when ``absent_ok`` (a read or a removal
        of an absent object), else it is the store's fault like any other (a write whose folder cannot be
        made: ``file:///no/such/mount``)."""
        try:
            return fn(*args, **kwargs)
        except FileNotFoundError as err:
            if not absent_ok:
                raise StoreError(f"{self.shown}: {what} failed ({_cause(err)})") from None
            raise
        except Exception as err:  # noqa: BLE001 - every failure of the store becomes one line
            raise StoreError(f"{self.shown}: {what} failed ({_cause(err)})") from None

    def _placed(self, rel: str, write) -> None:
        """Write through ``write(path)``: on a folder store to a temp name, renamed into place."""
        dest = self.path(rel)
        if not self.folders:
            self._call(f"writing {rel}", write, dest, absent_ok=False)
            return
        parent = posixpath.dirname(dest)
        self._call(f"making {posixpath.dirname(rel) or '.'}", self.fs.makedirs, parent, exist_ok=True, absent_ok=False)
        tmp = posixpath.join(parent, f".{posixpath.basename(dest)}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            self._call(f"writing {rel}", write, tmp, absent_ok=False)
            self._call(f"publishing {rel}", self.fs.mv, tmp, dest, absent_ok=False)
        except BaseException:
            try:
                self.fs.rm(tmp)
            except Exception:  # noqa: BLE001, S110 - best effort: a leftover temp name is never read
                pass
            raise

    def put_bytes(self, rel: str, data: bytes) -> None:
        """Write ``data`` at ``rel`` (atomic for readers). Raises :class:`StoreError`."""
        self._placed(rel, lambda p: self.fs.pipe_file(p, data))

    def put_file(self, local: Path, rel: str, callback=None) -> None:
        """Upload the local file ``local`` to ``rel`` (atomic for readers). Raises :class:`StoreError`."""
        kwargs = {"callback": callback} if callback is not None else {}
        self._placed(rel, lambda p: self.fs.put_file(str(local), p, **kwargs))

    def read_bytes(self, rel: str) -> bytes:
        """The bytes at ``rel``. Raises FileNotFoundError (absent) or :class:`StoreError`."""
        return self._call(f"reading {rel}", self.fs.cat_file, self.path(rel))

    def get_file(self, rel: str, local: Path) -> None:
        """Download ``rel`` to the local path ``local``. Raises FileNotFoundError or :class:`StoreError`."""
        self._call(f"reading {rel}", self.fs.get_file, self.path(rel), str(local))

    def sizes(self, rel_dir: str) -> dict[str, int]:
        """``{path relative to rel_dir: size in bytes}`` of every file below ``rel_dir`` ({} when absent)."""
        base = self.path(rel_dir)
        try:
            self.fs.invalidate_cache()
            found = self._call(f"listing {rel_dir}", self.fs.find, base, detail=True)
        except FileNotFoundError:
            return {}
        out = {}
        for name, info in found.items():
            if info.get("type", "file") != "file":
                continue
            rel = posixpath.relpath(name, base.rstrip("/") if base != "/" else base)
            if not posixpath.basename(rel).startswith("."):
                out[rel] = int(info.get("size") or 0)
        return out

    def delete(self, rel: str) -> None:
        """Remove the object at ``rel`` (absent: nothing). Raises :class:`StoreError`."""
        try:
            self._call(f"removing {rel}", self.fs.rm, self.path(rel))
        except FileNotFoundError:
            pass
