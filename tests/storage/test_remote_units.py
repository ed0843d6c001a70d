"""The remote copy's rules that need no server: credentials refused in the study file, a torn manifest
skipped, what is copied, how much is safe off the box (a file:// store)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tiny_study import study_config
from tuneproof.context import parse_study
from tuneproof.errors import TuneproofError
from tuneproof.storage import Store, redact, safety
from tuneproof.storage.mirror import Mirror, local_files, newest_manifest


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
