"""The one time source: the registry records the injected clock's times, and a stop time set for a
train run is read through the same clock."""

from __future__ import annotations

import json
import os
import time

import pytest

from tuneproof import clock
from tuneproof.errors import CheckFailed
from tuneproof.registry import Registry


def test_run_times_come_from_the_injected_clock(tmp_path):
    t = [1_000_000.0]
    with clock.use(lambda: t[0]):
        reg = Registry(tmp_path)
        with reg.run("baseline") as r:
            t[0] += 3600.0
        rec = reg.get(r.id)
    assert (rec.created, rec.ended) == (1_000_000.0, 1_003_600.0)
    assert clock.now() > 1_700_000_000  # the machine's clock again after the block


def test_stop_reason_follows_the_clock_and_is_cleared_after_the_block():
    t = [50.0]
    with clock.use(lambda: t[0]), clock.stop_at(100.0, "stopped: rental reserve"):
        assert clock.stop_reason() is None
        t[0] = 100.0
        assert clock.stop_reason() == "stopped: rental reserve"
    assert clock.stop_reason() is None


@pytest.mark.fault("machine: the clock steps back during a run")
def test_a_clock_step_back_during_a_run_is_recorded_as_read_and_flagged_never_taken_as_an_edit(
    tmp_path, capsys, monkeypatch
):
    """Issue 33 item 13: the clock stepped back 3 h while a train run ran. The run stays completed, its
    record passes the check export relies on, a rebuild lists it completed, and the run is flagged."""
    t = [2_000_000_000.0]
    with clock.use(lambda: t[0]):
        reg = Registry(tmp_path)
        with reg.run("train") as r:
            r.update_summary(steps=4)
            t[0] -= 3 * 3600.0  # NTP (or a user) set the clock back 3 h while it ran
        rec = reg.check_record(r.id)  # export / --force / rental deliver read the record through this
        assert (rec.status, rec.created, rec.ended) == ("completed", 2_000_000_000.0, 2_000_000_000.0 - 10800)
        flag = rec.summary["clock_went_back"]
        assert flag["seconds"] == 10800.0
        assert "the clock went back while the run ran" in flag["note"]
        assert rec.summary["steps"] == 4
        reg.close()
        (tmp_path / "tuneproof.sqlite").unlink()
        out = Registry.rebuild(tmp_path)
    assert out["lost"] == []
    again = Registry(tmp_path).get(r.id)
    assert (again.status, again.reason) == ("completed", None)
    assert f"warning: run {r.id}: the clock went back while the run ran" in capsys.readouterr().err
    assert (tmp_path / "runs" / r.id / "log.txt").read_text().count("the clock went back") == 1
    from tuneproof.recipes.runs import show_runs
    from tuneproof.ui import console

    monkeypatch.setattr(console, "_width", 200)
    show_runs(tmp_path)
    assert "clock went back 3.00 h while it ran" in capsys.readouterr().out  # the run list names the flag


def test_an_edited_run_record_is_still_refused_by_its_hash(tmp_path):
    """The cousin that must stay: tampering is what the hash tells (an edited end time is named)."""
    reg = Registry(tmp_path)
    with reg.run("train") as r:
        pass
    path = tmp_path / "runs" / r.id / "run.json"
    rec = json.loads(path.read_text())
    rec["ended"] = rec["created"] + 1e6
    path.write_text(json.dumps(rec))
    with pytest.raises(CheckFailed, match="edited after it was written \\(ended "):
        reg.check_record(r.id)


@pytest.mark.fault("leftovers: an empty run folder of a killed process")
def test_an_empty_run_folder_left_by_a_killed_process_is_removed_and_its_number_reused(tmp_path):
    """Issue 33 item 17: kill -9 between making runs/rNNNN and recording the run left an empty folder, which
    a rebuild listed as an invalid run ('record lost') and which held its number for good."""
    reg = Registry(tmp_path)
    with reg.run("train") as r:
        pass
    orphan = tmp_path / "runs" / "r0002"
    orphan.mkdir()
    os.utime(orphan, (time.time() - 120, time.time() - 120))
    fresh = tmp_path / "runs" / "r0003"
    fresh.mkdir()  # another process may be recording it right now: kept
    with reg.run("eval", parent=r.id) as e:
        pass
    assert e.id == "r0004" and not orphan.exists() and fresh.is_dir()
    with reg.run("eval", parent=r.id) as e2:  # once the folder is old and still empty: gone too
        pass
    assert e2.id == "r0005"
    os.utime(fresh, (time.time() - 120, time.time() - 120))
    with reg.run("eval", parent=r.id) as e3:
        pass
    assert not fresh.exists() and e3.id == "r0006"
    (tmp_path / "runs" / "r0007").mkdir()  # the last number, left empty: a rebuild lists no run for it
    reg.close()
    (tmp_path / "tuneproof.sqlite").unlink()
    out = Registry.rebuild(tmp_path)
    assert out["runs"] == [r.id, "r0004", "r0005", "r0006"] and out["lost"] == []
    assert not (tmp_path / "runs" / "r0007").exists()
    with Registry(tmp_path).run("eval") as e4:  # its number is free again
        pass
    assert e4.id == "r0007"


def test_training_after_the_first_test_read_is_found_by_run_order_not_by_the_clock(tmp_path):
    """The clock's cousin in the sealed test split: a train run started after the first test read, with the
    clock stepped back 1 h in between, was dated before the read and not named as reuse."""
    from types import SimpleNamespace

    from tuneproof.recipes.test_split import test_reuse

    t = [2_000_000_000.0]
    with clock.use(lambda: t[0]):
        reg = Registry(tmp_path)
        with reg.run("train") as first:
            pass
        with reg.run("test") as tr:
            reg.log_test_access(tr.id, first.id, {"accuracy": 0.5})
        t[0] -= 3600.0
        with reg.run("train") as later:
            pass
        reasons = test_reuse(SimpleNamespace(registry=reg), first.id)
    assert reasons[-1].startswith("training continued after the first test read (") and reasons[-1].endswith(later.id)
