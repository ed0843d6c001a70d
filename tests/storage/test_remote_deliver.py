"""Issue 31 item 3: ``rental deliver --to URI`` uploads the verified bundle and the dossier to a real
S3-compatible server (moto on 127.0.0.1), reads every file back and checks its sha256 against the
delivery manifest before saying delivered; the measured upload time enters the reserve and the plan."""

from __future__ import annotations

import hashlib
import json

import pytest

from helpers import out, remote_study, run
from servers import BUCKET
from tuneproof.storage import Store

pytestmark = pytest.mark.slow  # real S3 / SFTP servers and `tuneproof` processes: left out of `pytest -m "not slow"`


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_rental_deliver_to_s3_checks_every_file_read_back_and_the_reserve_counts_the_upload(
    tiny_base, s3_env, tmp_path
):
    study = remote_study(tmp_path / "study", tiny_base, None)
    proc = run("train", "--study", str(study), "--skip-preflight", "deliver test")
    assert proc.returncode == 0, out(proc)
    proc = run("rental", "start", "--days", "3", "--study", str(study))
    assert proc.returncode == 0, out(proc)

    uri = f"s3://{BUCKET}/deliveries/tiny"
    proc = run("rental", "deliver", "--run", "r0003", "--to", uri, "--study", str(study))
    assert proc.returncode == 0, out(proc)
    assert f"delivered to {uri}: " in out(proc) and "every sha256 read back and checked" in out(proc)

    store = Store(uri)
    manifest = json.loads(store.read_bytes("MANIFEST.sha256.json"))
    files = manifest["files"]
    assert "dossier.md" in files and "bundle/manifest.json" in files
    assert any(rel.startswith("bundle/") and rel.endswith(".safetensors") for rel in files)
    for rel, entry in files.items():
        local = study / "exports" / "r0003" / rel.removeprefix("bundle/") if rel.startswith("bundle/") else study / rel
        assert _sha(local.read_bytes()) == entry["sha256"] == _sha(store.read_bytes(rel)), rel

    rental = json.loads((study / "rental.json").read_text())
    remote = rental["delivered"]["remote"]
    assert remote["checked"] is True and remote["files"] == len(files) and remote["uri"] == uri
    (row,) = [json.loads(line) for line in (study / "uploads.jsonl").read_text().splitlines()]
    assert row["uri"] == uri and row["bytes"] == sum(e["size"] for e in files.values()) and row["seconds"] > 0

    proc = run("rental", "status", "--json", "--study", str(study))
    assert proc.returncode == 0, out(proc)
    parts = json.loads(proc.stdout)["reserve_parts"]
    assert any(p.startswith("upload to the store ") for p in parts), parts
