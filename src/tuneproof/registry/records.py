"""The run record: kinds, statuses, file names, the index row (:class:`RunRecord`) and the checksum that
tells a hand-edited ``run.json`` apart (:func:`record_sha256`); times and the overrides a run carries."""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from tuneproof import clock

KINDS = ("baseline", "train", "eval", "test", "export", "preflight", "data-check", "compare", "report")
STATUSES = ("running", "completed", "failed", "interrupted", "invalid")
DB_NAME = "tuneproof.sqlite"
RECORD_FILE = "run.json"  # the run's own record, in its folder
#: ``schema_version`` of ``run.json``: 2 carries ``record_sha256`` (1: written before tuneproof hashed its records)
RECORD_SCHEMA = 2
TEST_ACCESS_FILE = "test_access.json"
_ID_RE = re.compile(r"^r(\d{4,})(-[A-Za-z0-9_.-]+)?$")

#: summary key -> what ``runs``, the tree and the dossier say about a run that carries it
OVERRIDES = {
    "preflight_override": "preflight overridden",
    "data_check_override": "data check overridden",
    "baseline_override": "baseline overridden",
    "rental_override": "rental reserve used",
}

#: summary values every run created in this process gets (``rental_override``: a command allowed to


def _now() -> float:
    return clock.now()


def iso(ts: float | None) -> str:
    """Seconds since the epoch as an ISO-8601 UTC string ('' for None)."""
    return "" if ts is None else datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def override_flags(summary: dict[str, Any], *, with_reason: bool = True) -> list[str]:
    """``["data check overridden: no time", ...]``: the protocol steps a run skipped (its summary's
    ``*_override`` keys, :data:`OVERRIDES`), with the recorded reasons."""
    out = []
    for key, label in OVERRIDES.items():
        reason = summary.get(key)
        if reason:
            out.append(f"{label}: {reason}" if with_reason and isinstance(reason, str) else label)
    return out


@dataclass
class RunRecord:
    """One row of the index."""

    id: str
    seq: int
    kind: str
    status: str
    reason: str | None
    parent: str | None
    name: str | None
    created: float
    ended: float | None
    config_hash: str | None
    data_fingerprint: str | None
    eval_fingerprint: str | None
    summary: dict[str, Any]

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> RunRecord:
        return cls(
            id=row["id"],
            seq=row["seq"],
            kind=row["kind"],
            status=row["status"],
            reason=row["reason"],
            parent=row["parent"],
            name=row["name"],
            created=row["created"],
            ended=row["ended"],
            config_hash=row["config_hash"],
            data_fingerprint=row["data_fingerprint"],
            eval_fingerprint=row["eval_fingerprint"],
            summary=json.loads(row["summary"] or "{}"),
        )


#: the fields of a run record that later steps rely on (docs/CONTRACTS.md): hashed into ``record_sha256`` and
#: compared with the index; ``heartbeat`` (a best-effort beat written to the index only), ``pid``, ``host`` and
#: ``proc_start`` (where a live run runs, for the staleness rule) are left out
_CHECKED = (
    "id",
    "seq",
    "kind",
    "status",
    "reason",
    "parent",
    "name",
    "created",
    "ended",
    "config_hash",
    "data_fingerprint",
    "eval_fingerprint",
    "summary",
)


def record_sha256(rec: dict[str, Any]) -> str:
    """sha256 of a run record's :data:`_CHECKED` fields (canonical JSON: sorted keys, no spaces)."""
    body = {k: rec.get(k) for k in _CHECKED}
    return hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode()
    ).hexdigest()


def record_problem(
    found: dict[str, Any], index: dict[str, Any] | None = None, *, hash_expected: str | None = None
) -> str | None:
    """What is wrong with a ``run.json`` as read (``found``): no ``record_sha256`` although the record was
    written by a tuneproof that hashes its records (its ``schema_version`` is :data:`RECORD_SCHEMA` or more, or
    ``hash_expected`` says why: the index kept its hash, an earlier run carries one); a ``record_sha256`` that
    does not match its fields (an edit by hand), naming the first field that differs from ``index`` when
    given. None when it is whole (a record of schema 1 without a hash included).

    Times are never evidence of an edit: an end before the start is the machine's clock stepping back while
    the run ran (recorded as read and flagged by :meth:`Registry.finish`, ``summary.clock_went_back``);
    tampering is what the hash tells."""
    if "record_sha256" not in found:
        schema = found.get("schema_version")
        why = (
            f"its schema_version is {schema}"
            if isinstance(schema, int) and not isinstance(schema, bool) and schema >= RECORD_SCHEMA
            else hash_expected
        )
        if why is None:
            return None  # written before tuneproof hashed its records
        return (
            f"record_sha256 is missing, yet {why}; only a run.json written before tuneproof hashed its records "
            "(schema_version 1) may lack it"
        )
    if found.get("record_sha256") != record_sha256(found):
        if index is not None:
            for k in _CHECKED:
                if found.get(k) != index.get(k):
                    return f"{k} {_short(found.get(k))} in the file, {_short(index.get(k))} in the index"
        return f"record_sha256 {str(found.get('record_sha256'))[:16]} does not match its fields"
    return None


def record_disagreement(found: dict[str, Any], index: dict[str, Any]) -> str | None:
    """The first field later steps rely on (:data:`_CHECKED`) that a whole ``run.json`` (``found``, its hash
    valid) and the index row disagree on: ``status 'completed' in the file, 'invalid' in the index``; None when
    they agree."""
    for k in _CHECKED:
        if found.get(k) != index.get(k):
            return f"{k} {_short(found.get(k))} in the file, {_short(index.get(k))} in the index"
    return None


def clock_flag(created: Any, ended: float) -> dict[str, Any] | None:
    """``summary.clock_went_back`` of a run that ends at ``ended`` (seconds since the epoch, as read) before
    it was ``created``: the machine's clock stepped back while it ran. Both times are kept as read; the
    flag says so (``{"seconds": created - ended, "note": ...}``). None when the end is not before the start."""
    if not isinstance(created, (int, float)) or ended >= created:
        return None
    return {
        "seconds": round(created - ended, 3),
        "note": f"the clock went back while the run ran: it ended {iso(ended)} UTC, before it started "
        f"{iso(created)} UTC (times as read; check the machine's clock)",
    }


def _short(value: Any) -> str:
    text = json.dumps(value, default=str, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _seq_of(name: str) -> int | None:
    m = _ID_RE.match(name)
    return int(m.group(1)) if m else None


#: the folders of a study's own layout: a recorded absolute path ``<root>/exports/...`` or ``<root>/runs/...``
