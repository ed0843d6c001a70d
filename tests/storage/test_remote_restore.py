"""Issue 31 items 1-2: a study mirrored to an S3-compatible server (moto on 127.0.0.1) while it trains,
its machine lost (the folder deleted) mid-train, restored into a new folder on another path and resumed
to the same final adapter bits as an uninterrupted run; then report works and the rental window
carries over. The same round trip over SFTP (OpenSSH's sshd) and a file:// remote."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from helpers import out, remote_study, run, train_signalled
from servers import BUCKET
from tiny_study import adapter_tensors, losses_by_step, make_study
from tuneproof.registry import Registry
from tuneproof.storage import Store, safety
from tuneproof.storage.mirror import newest_manifest, object_name
from tuneproof.training.resume_state import latest_checkpoint, load_checkpoint

pytestmark = pytest.mark.slow  # real S3 / SFTP servers and `tuneproof` processes: left out of `pytest -m "not slow"`

STEPS = 8


@pytest.fixture(scope="module")
def reference(tiny_base, tmp_path_factory):
    """The uninterrupted run, without a remote copy: per-step losses and the final adapter."""
    from tuneproof.context import StudyContext
    from tuneproof.recipes.train import run_train

    study = make_study(tmp_path_factory.mktemp("ref"), tiny_base)
    ctx = StudyContext.open(study)
    run_id = run_train(ctx)
    run_dir = ctx.registry.runs_dir / run_id
    ckpt = load_checkpoint(latest_checkpoint(run_dir))
    ctx.registry.close()
    return {"losses": ckpt["losses"], "adapter": adapter_tensors(run_dir), "metrics": losses_by_step(run_dir)}


def _same_as_reference(run_dir, reference) -> None:
    final = load_checkpoint(latest_checkpoint(run_dir))
    assert final["step"] == STEPS
    assert final["losses"] == reference["losses"]  # bit-identical floats, every step
    assert losses_by_step(run_dir) == reference["metrics"]
    got = adapter_tensors(run_dir)
    assert sorted(got) == sorted(reference["adapter"]) and len(got) == 8
    for name, tensor in reference["adapter"].items():
        assert torch.equal(got[name], tensor), name


def _lose_machine_then_restore_and_resume(study, uri, tmp_path, reference, env=None):
    """SIGTERM after step 5 (checkpoint), the folder deleted, restored elsewhere, resumed: exact."""
    proc = train_signalled(study, 5, "SIGTERM")
    assert proc.returncode == 143, out(proc)
    assert "safe off this machine, newest checkpoint runs/r0003/checkpoints/step-000005" in out(proc)
    shutil.rmtree(study)  # the machine is gone

    new = tmp_path / "new-machine" / "study"
    proc = run("restore", uri, str(new), env=env)
    assert proc.returncode == 0, out(proc)
    text = out(proc)
    assert "every file matches its recorded sha256" in text and "now writes the remote copy" in text
    reg = Registry(new)
    (rec,) = reg.list(kind="train")
    assert (rec.id, rec.status, rec.reason) == ("r0003", "interrupted", "terminated (signal 15) at step 5")
    assert [r.kind for r in reg.list()] == ["data-check", "baseline", "train"]
    reg.close()

    proc = run("resume", "r0003", "--study", str(new), env=env)
    assert proc.returncode == 0, out(proc)
    rec = Registry(new).get("r0003")
    assert rec.status == "completed" and rec.summary["resumes"][-1]["from_step"] == 5
    _same_as_reference(new / "runs" / "r0003", reference)
    return new


def test_s3_lost_machine_is_restored_and_resumed_to_the_same_adapter_bits(reference, tiny_base, s3_env, tmp_path):
    uri = f"s3://{BUCKET}/studies/e2e"
    study = remote_study(tmp_path / "box" / "study", tiny_base, uri)
    proc = run("rental", "start", "--days", "3", "--study", str(study))
    assert proc.returncode == 0, out(proc)
    new = _lose_machine_then_restore_and_resume(study, uri, tmp_path, reference)

    # the remote copy holds the resumed run too (the resume pushed it), every object named by its sha256
    store = Store(uri)
    manifest = newest_manifest(store)
    entry = manifest["files"]["runs/r0003/adapter/adapter_model.safetensors"]
    body = store.read_bytes(object_name(entry["sha256"]))
    assert body == (new / "runs/r0003/adapter/adapter_model.safetensors").read_bytes()
    # the registry index snapshot went along, and no credential was written anywhere in the copy
    assert manifest["index"]["size"] > 0
    for rel in manifest["files"]:
        assert b"testing" not in (new / rel).read_bytes() or rel.startswith("data/"), rel

    # the rental window carried over; the new host is recorded with the restore
    rental = json.loads((new / "rental.json").read_text())
    assert rental["restores"][-1]["from"] == uri and rental["restores"][-1]["host"]
    proc = run("rental", "status", "--study", str(new))
    assert proc.returncode == 0, out(proc)
    assert f"remote copy {uri}: " in out(proc) and "newest checkpoint there runs/r0003/checkpoints/step-000008" in out(
        proc
    )
    # the evidence reads: the dossier says how much is safe off the box
    proc = run("report", "--study", str(new))
    assert proc.returncode == 0, out(proc)
    assert f"remote copy {uri}" in " ".join((new / "dossier.md").read_text().split())


def test_sftp_round_trip_restores_and_resumes_exactly(reference, tiny_base, sftp_env, tmp_path):
    uri = sftp_env.uri(tmp_path / "sftp-store" / "study")
    study = remote_study(tmp_path / "box" / "study", tiny_base, uri)
    _lose_machine_then_restore_and_resume(study, uri, tmp_path, reference)
    # a folder store: objects and manifests were written under temp names and renamed; none is left
    left = [p for p in (tmp_path / "sftp-store").rglob("*") if p.name.endswith(".tmp")]
    assert left == []


def test_file_remote_sync_says_what_is_local_only_then_sends_it(tiny_base, tmp_path):
    remote = tmp_path / "disk" / "study"
    study = remote_study(tmp_path / "box" / "study", tiny_base, f"file://{remote}")
    proc = run("sync", "--study", str(study))
    assert proc.returncode == 0, out(proc)
    assert "nothing is on this machine only" in out(proc)
    (study / "notes.txt").write_text("written after the last sync\n")  # 28 bytes
    assert safety(study, f"file://{remote}")["local_only"] == ["notes.txt"]
    proc = run("sync", "--study", str(study))
    assert proc.returncode == 0, out(proc)
    assert "sent 1 file(s), 28 B" in out(proc) and "nothing is on this machine only" in out(proc)
    proc = run("sync", "--study", str(study))
    assert "sent 0 file(s), 0 B; the remote copy was up to date" in out(proc)
