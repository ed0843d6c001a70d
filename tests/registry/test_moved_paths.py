"""Paths a run records inside its study folder, read back after the folder was copied or moved
(tuneproof.registry.read_recorded_path): relative records name the copy's own files; an absolute record
of an older version under the original folder is mapped onto the copy, or named in one warning when the
copy has no such file; a path deliberately outside the study stays as recorded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tuneproof.registry import Registry, read_recorded_path, study_relative


def _study(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "tuneproof.yaml").write_text("name: s\n")
    return folder


def test_a_path_inside_the_study_is_recorded_relative_and_one_outside_absolute(tmp_path):
    s = _study(tmp_path / "s")
    assert study_relative(s, s / "exports" / "r0003") == "exports/r0003"
    assert study_relative(s, tmp_path / "elsewhere" / "b") == str(tmp_path / "elsewhere" / "b")
    got = read_recorded_path(tmp_path / "copy", "exports/r0003")
    assert (got.path, got.shown, got.moved, got.warning) == (
        tmp_path / "copy" / "exports/r0003",
        "exports/r0003",
        False,
        None,
    )


def test_an_old_absolute_record_is_read_in_the_copy_or_named_when_the_copy_has_none(tmp_path):
    old = _study(tmp_path / "a" / "study")
    (old / "exports" / "r0002").mkdir(parents=True)
    recorded = str(old / "exports" / "r0002")
    new = tmp_path / "b" / "study2"
    shutil.copytree(old, new)

    # the original folder is still there: the copy reads its own copy all the same
    got = read_recorded_path(new, recorded)
    assert (got.path, got.shown, got.moved, got.warning) == (new / "exports" / "r0002", "exports/r0002", True, None)

    old.rename(tmp_path / "a" / "gone")  # the original moved away: mapped still
    assert read_recorded_path(new, recorded).path == new / "exports" / "r0002"

    shutil.rmtree(new / "exports" / "r0002")  # the copy has none: one warning, never the other folder's path
    got = read_recorded_path(new, recorded)
    assert got.path == new / "exports" / "r0002"
    assert got.warning == (
        f"{recorded} was recorded in {old}, which is gone (this study was copied or moved from there); "
        "this study folder has no exports/r0002"
    )


def test_a_bundle_exported_outside_the_study_stays_where_it_was_written(tmp_path):
    s = _study(tmp_path / "s")
    out = tmp_path / "shipping" / "exports" / "r0003"  # --out /elsewhere (its folder is no study)
    out.mkdir(parents=True)
    got = read_recorded_path(s, str(out))
    assert (got.path, got.shown, got.moved, got.warning) == (out, str(out), False, None)
    # written by this version (paths inside the study relative): an absolute path into another study folder
    # is where the user put it, never guessed to be this one's
    other = _study(tmp_path / "other")
    (other / "exports" / "r0003").mkdir(parents=True)
    (s / "exports" / "r0003").mkdir(parents=True)
    got = read_recorded_path(s, str(other / "exports" / "r0003"), relative_records=True)
    assert (got.path, got.moved, got.warning) == (other / "exports" / "r0003", False, None)
    assert read_recorded_path(s, str(other / "exports" / "r0003")).path == s / "exports" / "r0003"  # an older record


def test_the_registry_names_the_folder_a_study_was_copied_from(tmp_path):
    a = tmp_path / "a"
    Registry(a).close()
    b = tmp_path / "b"
    shutil.copytree(a, b)
    assert Registry(a).moved_from is None
    reg = Registry(b)
    assert reg.moved_from == a.resolve()
    # an absolute record under the folder it was created in is read in this one, whatever its shape
    (b / "notes").mkdir()
    assert reg.recorded_path(str(a.resolve() / "notes")).path == b.resolve() / "notes"


def test_a_copied_study_never_removes_the_original_folders_export_temp_folder(tmp_path):
    a = tmp_path / "a"
    reg = Registry(a)
    with reg.run("export", parent="r0001") as run:  # an export killed by an older version: absolute records
        tmp = a / "exports" / f".r0001.{run.id}.tmp-export"
        run.update_summary(temp_folder=str(tmp), lock_file=str(a / "exports" / ".r0001.lock"))
        tmp.mkdir(parents=True)
    reg.close()
    b = tmp_path / "b"
    shutil.copytree(a, b)
    removed = Registry(b).clean_stale_temps("export")
    assert removed == [b / "exports" / f".r0001.{run.id}.tmp-export"]
    assert tmp.is_dir() and not (b / "exports" / tmp.name).exists()
    assert json.loads((b / "runs" / run.id / "summary.json").read_text())["temp_folder"] == str(tmp)


def test_an_old_record_of_a_bundle_exported_inside_the_original_study_is_read_in_the_copy(tmp_path):
    old = _study(tmp_path / "a")
    (old / "shipping" / "b1").mkdir(parents=True)  # --out a/shipping/b1: inside the study, not its exports/
    new = tmp_path / "b"
    shutil.copytree(old, new)
    got = read_recorded_path(new, str(old / "shipping" / "b1"))
    assert (got.path, got.shown, got.moved, got.warning) == (new / "shipping" / "b1", "shipping/b1", True, None)
    shutil.rmtree(new / "shipping")
    assert read_recorded_path(new, str(old / "shipping" / "b1")).warning == (
        f"{old / 'shipping' / 'b1'} was recorded in {old}, the folder this study was copied or moved from; "
        "this study folder has no shipping/b1"
    )
