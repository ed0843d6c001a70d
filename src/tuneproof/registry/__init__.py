"""The run registry: every command that does work is a run with an id, a folder and a status.

Layout inside a study folder::

    tuneproof.yaml
    tuneproof.sqlite          # the index (stdlib sqlite3), rebuilt from the run folders when lost
    runs/r0007-lora-r16/      # run.json (the run's own record), config.json, env.json, data.json,
                              # log.txt, metrics.jsonl, outputs.jsonl, summary.json

Statuses: running -> completed | failed | interrupted | invalid. A run is never deleted.

The run folder is the source of truth: ``runs/<id>/run.json`` holds the run's whole record (id,
kind, status, reason, times, host/pid, heartbeat, fingerprints, summary) and is rewritten
atomically with every change of the index row; reads of the reserved test split are also kept in
``runs/<id>/test_access.json``. So:

- a deleted ``tuneproof.sqlite`` is rebuilt from the run folders automatically the next time the
  registry is opened (one note on stderr); a damaged one is reported in one line and rebuilt with
  ``tuneproof registry rebuild`` (the damaged file is kept beside it as
  ``tuneproof.sqlite.damaged-<time>``);
- a new run's id is past the largest of the index and the run folders, and its folder must not
  exist: a run never appends to another run's folder.

Liveness: a live run's process writes its last-seen time (``heartbeat``) every
:data:`HEARTBEAT_S` seconds. A ``running`` run is found stale, and marked ``interrupted`` with the
reason, when its process is gone on this host (pid and process start time), or, whatever the host
(a restarted container has a new hostname), when its heartbeat is older than
:data:`STALE_AFTER_S`. ``tuneproof runs mark-interrupted RUN --why ...`` marks one explicitly.

Faults of the machine inside a run (disk full, read-only folder) mark it ``failed`` with the
reason ``disk full: ...`` / ``read-only: ...``, remove its temporary files and raise a one-line
:class:`TuneproofError` (exit 2); a train run so failed is continued by ``tuneproof resume``. So
that a truly full disk still has room for that record, the study folder keeps a 256 KiB ballast
file ``.tuneproof.reserve``, deleted when the disk is found full and made again at a later open.
Temporary files (``.NAME.*.tmp``) left in the folders of runs that are no longer running, and
``exports/.rNNNN.*`` folders left by a killed export, and the temp folder and lock file an export
run recorded before it was killed (beside any ``--out`` folder), are removed when the next run starts.

One concern per module: ``records`` (kinds, statuses, the index row, the record checksum), ``paths``
(recorded paths read in a copied or moved study), ``run`` (a run in progress), ``index`` (the SQLite
index and :class:`Registry`), ``liveness`` (heartbeats, staleness), ``ballast`` (the full-disk reserve,
machine-fault errors), ``cleanup`` (what killed processes left), ``signals`` (how a run ends: Ctrl-C,
SIGTERM, faults) and ``sealed_test`` (the log of test-split reads).
"""

from __future__ import annotations

from tuneproof.registry.ballast import RESERVE_BYTES, RESERVE_FILE
from tuneproof.registry.index import KEPT_META, Registry
from tuneproof.registry.liveness import HEARTBEAT_S, STALE_AFTER_S, resume_hint
from tuneproof.registry.paths import (
    RELATIVE_PATHS,
    STUDY_LAYOUT,
    RecordedPath,
    read_recorded_path,
    study_relative,
    trained_paths_line,
)
from tuneproof.registry.records import (
    DB_NAME,
    KINDS,
    OVERRIDES,
    RECORD_FILE,
    RECORD_SCHEMA,
    STATUSES,
    TEST_ACCESS_FILE,
    RunRecord,
    iso,
    override_flags,
    record_disagreement,
    record_problem,
    record_sha256,
)
from tuneproof.registry.run import CARRY, Run
from tuneproof.registry.signals import STOPPED, Stop

__all__ = [
    "CARRY",
    "DB_NAME",
    "HEARTBEAT_S",
    "KEPT_META",
    "KINDS",
    "OVERRIDES",
    "RECORD_FILE",
    "RECORD_SCHEMA",
    "RELATIVE_PATHS",
    "RESERVE_BYTES",
    "RESERVE_FILE",
    "STALE_AFTER_S",
    "STATUSES",
    "STOPPED",
    "STUDY_LAYOUT",
    "TEST_ACCESS_FILE",
    "RecordedPath",
    "Registry",
    "Run",
    "RunRecord",
    "Stop",
    "iso",
    "override_flags",
    "read_recorded_path",
    "record_disagreement",
    "record_problem",
    "record_sha256",
    "resume_hint",
    "study_relative",
    "trained_paths_line",
]
