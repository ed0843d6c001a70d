"""The remote copy's rules that need no server: credentials refused in the study file, a torn manifest
skipped, what is copied, how much is safe off the box (a file:// store)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tiny_study import study_config
from tuneproof.context import parse_study
from tuneproof.errors import TuneproofError
from tuneproof.storage import Store, StoreError, redact, safety
from tuneproof.storage.mirror import Mirror, local_files, newest_manifest
from tuneproof.storage.restore import fetch


def test_a_password_in_storage_remote_is_refused_and_never_shown(tmp_path):
    raw = study_config(tmp_path / "base")
    raw["storage"] = {"remote": "sftp://alice:s3cr3t@host.example/studies/x"}
    with pytest.raises(TuneproofError) as err:
        parse_study(raw, tmp_path / "tuneproof.yaml")
    text = str(err.value)
    assert "storage.remote" in text and "credentials come from the environment" in text
    assert "s3cr3t" not in text
    assert redact("sftp://alice:s3cr3t@host/x") == "sftp://alice:***@host/x"
    raw["storage"] = {"remote": "ftp:/nowhere"}
    with pytest.raises(TuneproofError, match="is not a remote URI"):
        parse_study(raw, tmp_path / "tuneproof.yaml")


def _folder(tmp_path: Path) -> Path:
    study = tmp_path / "study"
    (study / "runs" / "r0001" / "checkpoints" / "step-000002").mkdir(parents=True)
    (study / "runs" / "r0001" / "checkpoints" / ".step-000003.tmp-ab").mkdir()
    (study / "runs" / "r0001" / "checkpoints" / ".step-000003.tmp-ab" / "tensors.safetensors").write_bytes(b"half")
    (study / "runs" / "r0001" / "checkpoints" / "step-000002" / "tensors.safetensors").write_bytes(b"t" * 10)
    (study / "runs" / "r0001" / "checkpoints" / "index.json").write_text("{}")
    (study / "runs" / "r0001" / "checkpoints" / "step-000002" / "state.json").write_text("{}")
    (study / "tuneproof.yaml").write_text("name: x\n")
    (study / "tuneproof.sqlite").write_bytes(b"live index")
    (study / ".tuneproof.reserve").write_bytes(b"\0" * 10)
    (study / "models").mkdir()
    (study / "models" / "big.bin").write_bytes(b"b" * 100)
    return study


def test_what_is_copied_and_in_which_order(tmp_path):
    study = _folder(tmp_path)
    files = list(local_files(study, ["models/**"]))
    assert files == [
        "tuneproof.yaml",
        "runs/r0001/checkpoints/step-000002/state.json",
        "runs/r0001/checkpoints/step-000002/tensors.safetensors",
        "runs/r0001/checkpoints/index.json",  # after the folders it lists
    ]


def test_a_torn_manifest_is_skipped_and_safety_counts_what_is_local_only(tmp_path):
    study = _folder(tmp_path)
    uri = f"file://{tmp_path / 'remote'}"
    result = Mirror(study, uri, ["models/**"]).push(with_index=False)
    assert (result.sent_files, result.published) == (3, "m-000001.json")  # two files hold "{}": one object
    store = Store(uri)
    store.put_bytes("manifests/m-000002.json", b'{"kind": "tuneproof-remote-manifest", "files": {"a"')  # torn
    assert newest_manifest(store)["name"] == "m-000001.json"
    safe = safety(study, uri, ["models/**"])
    assert (safe["files"], safe["bytes"], safe["local_only"]) == (4, 8 + 10 + 2 + 2, [])
    assert safe["newest_checkpoint"] == "runs/r0001/checkpoints/step-000002"
    (study / "runs" / "r0001" / "log.txt").write_text("12345")
    safe = safety(study, uri, ["models/**"])
    assert (safe["local_only"], safe["local_only_bytes"]) == (["runs/r0001/log.txt"], 5)
    manifest = json.loads((tmp_path / "remote" / "manifests" / "m-000001.json").read_text())
    assert set(manifest["files"]) == set(local_files(study, ["models/**"])) - {"runs/r0001/log.txt"}


def test_old_manifests_and_only_their_objects_are_removed(tmp_path):
    study = _folder(tmp_path)
    uri = f"file://{tmp_path / 'remote'}"
    mirror = Mirror(study, uri, ["models/**"])
    for i in range(5):  # five versions of one file: five manifests
        (study / "notes.txt").write_text(f"version {i}\n")
        mirror.push(with_index=False)
    store = Store(uri)
    store.put_bytes("objects/ff/" + "f" * 64, b"not named yet")  # another process's upload before its manifest
    assert mirror.collect() == 2  # versions 0 and 1
    names = sorted(p.name for p in (tmp_path / "remote" / "manifests").iterdir())
    assert names == ["m-000003.json", "m-000004.json", "m-000005.json"]
    assert (tmp_path / "remote" / "objects" / "ff" / ("f" * 64)).exists()
    kept = newest_manifest(store)["files"]["notes.txt"]["sha256"]
    assert store.read_bytes(f"objects/{kept[:2]}/{kept}") == b"version 4\n"


@pytest.mark.parametrize(
    ("uri", "said"),
    [
        ("sftp://host.example", "names no folder on host.example"),
        ("file://relative/x", "file:///relative/x for the folder /relative/x"),
        ("s3:/bucket", "is not a remote URI"),
    ],
)
def test_a_remote_uri_that_would_land_elsewhere_is_refused_naming_the_form(tmp_path, uri, said):
    raw = study_config(tmp_path / "base")
    raw["storage"] = {"remote": uri}
    with pytest.raises(TuneproofError, match=said):
        parse_study(raw, tmp_path / "tuneproof.yaml")


def test_the_scheme_of_a_remote_uri_is_read_in_any_case(tmp_path):
    raw = study_config(tmp_path / "base")
    raw["storage"] = {"remote": "S3://bucket/prefix/"}
    assert parse_study(raw, tmp_path / "tuneproof.yaml").storage.remote == "s3://bucket/prefix"


def test_a_file_remote_inside_the_study_it_copies_is_refused(tmp_path):
    study = _folder(tmp_path)
    with pytest.raises(TuneproofError, match="is inside the study folder it copies"):
        Mirror(study, f"file://{study / 'backup'}")
    Mirror(study, f"file://{tmp_path / 'backup'}")  # beside it: accepted


def test_a_folder_the_store_cannot_make_is_one_store_error_never_a_traceback(tmp_path):
    (tmp_path / "afile").write_text("x")
    for folder in (tmp_path / "afile" / "remote", Path("/proc/no-such-tuneproof-mount/remote")):
        store = Store(f"file://{folder}")  # NotADirectoryError, FileNotFoundError (a missing mount)
        with pytest.raises(StoreError, match="making objects/ab failed"):
            store.put_bytes("objects/ab/abc", b"data")


def test_a_hand_edited_newest_manifest_is_skipped_and_restore_names_it(tmp_path):
    study = _folder(tmp_path)
    uri = f"file://{tmp_path / 'remote'}"
    Mirror(study, uri, ["models/**"]).push(with_index=False)
    store = Store(uri)
    m = json.loads(store.read_bytes("manifests/m-000001.json"))
    m["files"]["tuneproof.yaml"]["sha256"] = "../../../etc/passwd"  # edited by hand
    store.put_bytes("manifests/m-000002.json", json.dumps(m).encode())
    found = newest_manifest(store)
    assert (found["name"], found["skipped"]) == ("m-000001.json", ["m-000002.json"])
    said: list[str] = []
    out = fetch(store, tmp_path / "restored", say=said.append)
    assert out.files == 4 and not out.altered and not out.missing
    assert "m-000002.json do not parse" in said[1] and "restored from m-000001.json" in said[1]


def test_a_restore_cut_by_the_store_leaves_no_half_folder(tmp_path, monkeypatch):
    study = _folder(tmp_path)
    uri = f"file://{tmp_path / 'remote'}"
    Mirror(study, uri, ["models/**"]).push(with_index=False)
    store = Store(uri)
    calls = []

    def cut(rel, local):
        calls.append(rel)
        if len(calls) == 3:
            raise StoreError("store gone")
        Path(local).write_bytes(store.read_bytes(rel))

    monkeypatch.setattr(store, "get_file", cut)
    with pytest.raises(StoreError):
        fetch(store, tmp_path / "new" / "restored")
    assert list((tmp_path / "new").iterdir()) == []  # neither the folder nor its hidden work folder
    (tmp_path / "empty").mkdir()
    with pytest.raises(StoreError):
        calls.clear()
        fetch(store, tmp_path / "empty")
    assert list((tmp_path / "empty").iterdir()) == []  # the empty folder given stays, empty
    (tmp_path / "afile").write_text("x")
    with pytest.raises(TuneproofError, match="is a file, not a folder"):
        fetch(store, tmp_path / "afile")
    # a restore killed by kill -9 leaves only its hidden work folder: the next one clears it and completes
    (tmp_path / "new" / ".restored.restoring" / "runs").mkdir(parents=True)
    (tmp_path / "new" / ".restored.restoring" / "half.bin").write_bytes(b"half")
    monkeypatch.undo()
    out = fetch(store, tmp_path / "new" / "restored")
    assert out.files == 4 and sorted(p.name for p in (tmp_path / "new").iterdir()) == ["restored"]
    assert not (tmp_path / "new" / "restored" / "half.bin").exists()


def test_restore_refuses_a_mistyped_uri_and_an_unmakeable_folder_in_one_line(tmp_path):
    from tuneproof.recipes.restore import run_restore

    with pytest.raises(TuneproofError, match="cannot restore: 's3:/bucket' is not a remote URI"):
        run_restore("s3:/bucket", tmp_path / "x")
    study = _folder(tmp_path)
    Mirror(study, f"file://{tmp_path / 'remote'}", ["models/**"]).push(with_index=False)
    with pytest.raises(TuneproofError, match="cannot make the folder"):
        run_restore(f"FILE://{tmp_path / 'remote'}", Path("/proc/no-such-tuneproof-mount/study"))
    assert not (tmp_path / "x").exists()


def test_a_copied_study_folder_is_another_study_and_a_moved_one_keeps_its_prefix(tmp_path):
    import shutil

    from tuneproof.storage.mirror import LeaseHeld, check_lease

    study = _folder(tmp_path)
    uri = f"file://{tmp_path / 'remote'}"
    first = Mirror(study, uri, ["models/**"])
    check_lease(first.connect(), first.state)
    first.push(with_index=False)
    copy = Path(shutil.copytree(study, tmp_path / "copy"))  # with its hidden state: the same lease id
    second = Mirror(copy, uri, ["models/**"])
    assert second.state["lease"] == first.state["lease"]
    with pytest.raises(LeaseHeld, match=f"written by study folder {study.resolve()} on host"):
        check_lease(second.connect(), second.state)
    moved = study.rename(tmp_path / "moved")
    third = Mirror(moved, uri, ["models/**"])
    check_lease(third.connect(), third.state)  # the original folder is gone: a move, the prefix is its own
    check_lease(second.connect(), second.state, take_over=True)
    assert second.state["lease"] != first.state["lease"]  # taken over: the copy's own id from now on
    with pytest.raises(LeaseHeld, match=f"written by study folder {copy.resolve()} on host"):
        check_lease(third.connect(), third.state)


@pytest.mark.parametrize("command", [["export", "r0003"], ["rental", "deliver"]])
def test_a_mistyped_to_uri_is_refused_before_any_export(tmp_path, capfd, command):
    from tuneproof.cli import main

    with pytest.raises(SystemExit) as done:
        main([*command, "--study", str(tmp_path / "no-study"), "--to", "s3:/bucket"])
    assert done.value.code == 2
    captured = capfd.readouterr()
    err = captured.out + captured.err
    assert "--to: 's3:/bucket' is not a remote URI" in err and "Traceback" not in err
    assert not (Path.cwd() / "s3:").exists()  # fsspec would have read it as a local folder


@pytest.mark.parametrize(("pattern", "hit"), [("*.json", "hypothesis.frozen.json"), ("runs/**", "runs/r0001/run.json")])
def test_storage_exclude_may_not_leave_the_evidence_out(tmp_path, pattern, hit):
    raw = study_config(tmp_path / "base")
    raw["storage"] = {"remote": "s3://bucket/x", "exclude": ["models/**", pattern]}
    with pytest.raises(TuneproofError, match=f"'{re.escape(pattern)}' would leave {hit} out of the remote copy"):
        parse_study(raw, tmp_path / "tuneproof.yaml")
    raw["storage"]["exclude"] = ["models/**", "runs/*/checkpoints/**"]  # bytes the user may choose to keep local
    assert parse_study(raw, tmp_path / "tuneproof.yaml").storage.exclude == ["models/**", "runs/*/checkpoints/**"]


def test_a_manifest_naming_a_file_and_a_folder_of_one_name_is_one_line_and_leaves_nothing(tmp_path):
    from tuneproof.recipes.restore import run_restore

    study = _folder(tmp_path)
    uri = f"file://{tmp_path / 'remote'}"
    Mirror(study, uri, ["models/**"]).push(with_index=False)
    store = Store(uri)
    m = json.loads(store.read_bytes("manifests/m-000001.json"))
    m["files"]["tuneproof.yaml/inner"] = m["files"]["tuneproof.yaml"]  # edited by hand: a file used as a folder
    m["seq"] = 2
    store.put_bytes("manifests/m-000002.json", json.dumps(m).encode())
    with pytest.raises(TuneproofError, match=r"cannot restore into .*restored: File exists: .*tuneproof\.yaml") as err:
        run_restore(uri, tmp_path / "restored")
    assert "cannot be written here (edited by hand?)" in err.value.hint
    assert sorted(p.name for p in tmp_path.iterdir()) == ["remote", "study"]
