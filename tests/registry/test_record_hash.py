"""A run record's hash is never optional (issue 33 item 14; docs/CONTRACTS.md, "What the run record
authenticates"): a ``run.json`` whose ``record_sha256`` was removed is not a pass, whether the index is there
(``check_record`` refuses it) or dropped (a rebuild lists the run invalid with the status it claimed); only a
record of schema 1, written before tuneproof hashed its records, may lack it. A ``run.json`` with a valid hash
that disagrees with the index is named and refused, never rewritten from it."""

from __future__ import annotations

import json
import sqlite3

import pytest

from tuneproof.cli import main
from tuneproof.errors import CheckFailed
from tuneproof.registry import RECORD_SCHEMA, Registry, record_sha256

pytestmark = pytest.mark.filterwarnings("ignore")


def _study(tmp_path):
    reg = Registry(tmp_path)
    with reg.run("baseline") as base:
        base.update_summary(metrics={"accuracy": 0.5})
    with reg.run("eval") as ev:
        ev.update_summary(metrics={"accuracy": 0.55}, outputs_sha256="a" * 64)
    reg.close()
    return base.id, ev.id


def _forge(path, *, schema=None, **summary):
    """Remove the hash, forge the metrics (and optionally claim an older schema), as a hand edit would."""
    rec = json.loads(path.read_text())
    del rec["record_sha256"]
    rec["summary"].update(summary)
    if schema is not None:
        rec["schema_version"] = schema
    path.write_text(json.dumps(rec, indent=2))


def _drop_index(study):
    for ext in ("", "-wal", "-shm"):
        (study / f"tuneproof.sqlite{ext}").unlink(missing_ok=True)


def test_a_record_carries_its_schema_and_the_index_keeps_its_hash(tmp_path):
    _, ev = _study(tmp_path)
    rec = json.loads((tmp_path / "runs" / ev / "run.json").read_text())
    assert rec["schema_version"] == RECORD_SCHEMA == 2
    reg = Registry(tmp_path)
    assert reg.row(ev)["record_sha256"] == rec["record_sha256"] == record_sha256(rec)
    assert reg.check_record(ev).status == "completed"


@pytest.mark.fault("forgery: record_sha256 removed from run.json, the index dropped")
@pytest.mark.parametrize("schema", [None, 1])
def test_a_removed_hash_is_rebuilt_invalid_not_completed(tmp_path, capsys, schema):
    base, ev = _study(tmp_path)
    _forge(tmp_path / "runs" / ev / "run.json", schema=schema, metrics={"accuracy": 1.0})
    _drop_index(tmp_path)
    reg = Registry(tmp_path)
    rec = reg.get(ev)
    why = "its schema_version is 2" if schema is None else f"the record of the earlier run {base} carries one"
    assert (rec.status, rec.reason) == (
        "invalid",
        f"run.json edited after it was written (record_sha256 is missing, yet {why}; only a run.json written "
        "before tuneproof hashed its records (schema_version 1) may lack it); recorded as completed",
    )
    assert reg.rebuilt["edited"] == [ev] and reg.get(base).status == "completed"
    err = capsys.readouterr().err
    assert (
        f"warning: 1 run.json edited after it was written (hash missing or not matching), listed invalid: {ev}" in err
    )


@pytest.mark.fault("forgery: record_sha256 removed from run.json, the index kept")
@pytest.mark.parametrize("schema", [None, 1])
def test_a_removed_hash_is_refused_where_the_record_is_relied_on(tmp_path, schema):
    _, ev = _study(tmp_path)
    path = tmp_path / "runs" / ev / "run.json"
    before = path.read_text()
    kept = json.loads(before)["record_sha256"]
    _forge(path, schema=schema)
    reg = Registry(tmp_path)
    with pytest.raises(CheckFailed) as err:
        reg.check_record(ev)
    why = "its schema_version is 2" if schema is None else f"the index kept its record_sha256 {kept[:16]}"
    assert err.value.message == (
        f"{path}: edited after it was written (record_sha256 is missing, yet {why}; only a run.json written "
        "before tuneproof hashed its records (schema_version 1) may lack it)"
    )
    path.unlink()  # a removed record is no pass either
    with pytest.raises(CheckFailed, match=f"the index kept its record_sha256 {kept[:16]}"):
        reg.check_record(ev)


def test_a_record_written_before_the_hash_is_still_read(tmp_path):
    """A study of an older tuneproof: every run.json of schema 1 without a hash, an index without the column."""
    base, ev = _study(tmp_path)
    for rid in (base, ev):
        path = tmp_path / "runs" / rid / "run.json"
        rec = json.loads(path.read_text())
        del rec["record_sha256"]
        rec["schema_version"] = 1
        path.write_text(json.dumps(rec))
    conn = sqlite3.connect(tmp_path / "tuneproof.sqlite")
    conn.execute("UPDATE runs SET record_sha256 = NULL")
    conn.commit()
    conn.close()
    reg = Registry(tmp_path)
    assert reg.check_record(ev).status == "completed"
    reg.close()
    _drop_index(tmp_path)
    reg = Registry(tmp_path)
    assert [r.status for r in reg.list()] == ["completed", "completed"] and reg.rebuilt["edited"] == []


@pytest.mark.fault("forgery: run.json replaced by an older whole copy")
def test_a_whole_record_that_disagrees_with_the_index_is_named_not_rewritten(tmp_path):
    reg = Registry(tmp_path)
    with reg.run("baseline") as run:
        pass
    path = tmp_path / "runs" / run.id / "run.json"
    older = path.read_text()  # a whole record tuneproof wrote ...
    reg.invalidate(run.id, "label leak found")
    path.write_text(older)  # ... put back over the newer one
    with pytest.raises(CheckFailed) as err:
        reg.check_record(run.id)
    assert err.value.message == (
        f"{path}: its record_sha256 is valid but it disagrees with the index tuneproof.sqlite (status 'completed' in "
        "the file, 'invalid' in the index): run.json is not the one the index last wrote (a record restored from an "
        "older copy, or rehashed by hand); neither is taken"
    )
    assert "tuneproof registry rebuild" in err.value.hint
    assert path.read_text() == older  # named, not rewritten from the index


@pytest.mark.fault("forgery: the index edited, run.json whole")
def test_an_index_edited_behind_a_whole_record_is_named(tmp_path):
    reg = Registry(tmp_path)
    with reg.run("baseline") as run:
        pass
    reg.invalidate(run.id, "label leak found")
    reg.close()
    conn = sqlite3.connect(tmp_path / "tuneproof.sqlite")
    conn.execute("UPDATE runs SET status = 'completed', reason = NULL WHERE id = ?", (run.id,))
    conn.commit()
    conn.close()
    path = tmp_path / "runs" / run.id / "run.json"
    with pytest.raises(CheckFailed) as err:
        Registry(tmp_path).check_record(run.id)
    assert err.value.message.startswith(
        f"{path}: its record_sha256 is valid but it disagrees with the index tuneproof.sqlite (status 'invalid' in "
        "the file, 'completed' in the index): the index changed after run.json was last written"
    )
    assert json.loads(path.read_text())["status"] == "invalid"


@pytest.mark.fault("forgery: record_sha256 removed, then registry rebuild")
def test_registry_rebuild_lists_a_record_without_its_hash(tmp_path, capsys):
    _, ev = _study(tmp_path)
    _forge(tmp_path / "runs" / ev / "run.json", metrics={"accuracy": 1.0})
    with pytest.raises(SystemExit) as e:
        main(["registry", "rebuild", "--study", str(tmp_path)])
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert (
        f"warning: 1 run.json edited after it was written (record_sha256 missing or not matching its fields), "
        f"listed as invalid with the status it claimed: {ev}" in out
    )
    assert Registry(tmp_path).get(ev).status == "invalid"
