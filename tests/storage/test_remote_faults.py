"""Issue 31 item 4: the faults a remote copy meets, each against a real store (moto's S3 server, a
file:// folder): unreachable at start, mid-run and at deliver; kill -9 during an upload, then sync and
restore; an object altered or deleted in the store; two machines on one prefix; the local disk full
while uploading."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from helpers import out, remote_study, run, train_signalled
from servers import BUCKET, free_port
from tiny_study import cli_env
from tuneproof.errors import TuneproofError
from tuneproof.registry import Registry
from tuneproof.storage import Store, deliver_to, safety
from tuneproof.storage.mirror import Mirror, newest_manifest, object_name
from tuneproof.storage.uploader import Uploader

pytestmark = pytest.mark.slow  # real S3 / SFTP servers and `tuneproof` processes: left out of `pytest -m "not slow"`


def _consistent(store: Store) -> dict:
    """The newest manifest, after checking every object it names is there with its sha256."""
    manifest = newest_manifest(store)
    assert manifest is not None
    for rel, entry in manifest["files"].items():
        body = store.read_bytes(object_name(entry["sha256"]))
        assert hashlib.sha256(body).hexdigest() == entry["sha256"], rel
    return manifest


def _set_remote(study: Path, uri: str) -> None:
    cfg = yaml.safe_load((study / "tuneproof.yaml").read_text())
    cfg["storage"] = {"remote": uri}
    (study / "tuneproof.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))


@pytest.fixture(scope="module")
def interrupted_remote(tiny_base, tmp_path_factory):
    """``(study, remote folder)``: the tiny study mirrored to file://REMOTE, its 8-step run stopped by
    SIGTERM after step 5 (checkpoints step-000004 and step-000005 in the copy). Tests work on copies."""
    root = tmp_path_factory.mktemp("interrupted-remote")
    remote = root / "remote"
    study = remote_study(root / "study", tiny_base, f"file://{remote}")
    proc = train_signalled(study, 5, "SIGTERM")
    assert proc.returncode == 143, out(proc)
    return study, remote


@pytest.mark.fault("remote: store unreachable at start")
def test_unreachable_at_start_trains_with_one_warning_then_sync_sends_it(tiny_base, s3, s3_env, tmp_path):
    uri = f"s3://{BUCKET}/faults/offline-at-start"
    study = remote_study(tmp_path / "study", tiny_base, uri)
    dead = {**s3.env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}  # nothing listens there
    proc = run("train", "--study", str(study), "--skip-preflight", "offline", env=dead)
    assert proc.returncode == 0, out(proc)
    assert proc.stderr.count("unreachable") == 1, proc.stderr  # one warning line, however many retries
    assert "the run goes on and stays on this machine only" in out(proc)
    assert "still on this machine only" in out(proc) and "tuneproof sync --wait" in out(proc)
    assert Registry(study).get("r0003").status == "completed"
    assert safety(study, uri)["files"] == 0

    proc = run("sync", "--study", str(study), env=dead)
    assert proc.returncode == 2 and "the remote copy is unreachable" in out(proc)
    assert "still on this machine only" in out(proc)
    proc = run("sync", "--wait", "--study", str(study), env=s3.env)
    assert proc.returncode == 0, out(proc)
    assert "nothing is on this machine only" in out(proc)
    assert "runs/r0003/adapter/adapter_model.safetensors" in _consistent(Store(uri))["files"]


MOTO_PROCESS = (
    "from moto.server import ThreadedMotoServer as S; import sys, time; "
    "S(ip_address='127.0.0.1', port=int(sys.argv[1]), verbose=False).start(); time.sleep(3600)"
)

KILL_AT_STEP = """
import os, signal, sys
import tuneproof.training.loop as L
from tuneproof.cli import main

AT, PID = int(sys.argv[1]), int(sys.argv[2])
orig = L.train
def train(*a, **kw):
    inner = kw.get("progress")
    def progress(step, total, loss):
        if inner:
            inner(step, total, loss)
        if step == AT:
            os.kill(PID, signal.SIGKILL)
    kw["progress"] = progress
    return orig(*a, **kw)
L.train = train
main(sys.argv[3:])
"""


def _moto_process(port: int, env: dict) -> subprocess.Popen:
    import boto3

    proc = subprocess.Popen([sys.executable, "-c", MOTO_PROCESS, str(port)], env={**os.environ, **env})
    client = boto3.client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{port}",
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    for _ in range(100):
        try:
            client.create_bucket(Bucket=BUCKET)
            return proc
        except Exception:  # noqa: BLE001 - not listening yet
            time.sleep(0.1)
    raise RuntimeError("moto server did not start")


@pytest.mark.fault("remote: store gone mid-run")
def test_store_gone_mid_run_the_run_completes_then_sync_and_restore(tiny_base, s3, tmp_path):
    port = free_port()
    env = {**s3.env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    server = _moto_process(port, env)
    uri = f"s3://{BUCKET}/faults/mid-run"
    study = remote_study(tmp_path / "study", tiny_base, uri)
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                KILL_AT_STEP,
                "3",
                str(server.pid),
                "train",
                "--study",
                str(study),
                "--skip-preflight",
                "store dies at step 3",
            ],
            capture_output=True,
            text=True,
            env={**cli_env(), **env},
            timeout=300,
        )
        server.wait(timeout=10)
        assert proc.returncode == 0, out(proc)
        assert proc.stderr.count("unreachable") == 1, proc.stderr
        assert Registry(study).get("r0003").status == "completed" and Registry(study).get("r0003").summary["steps"] == 8
        assert "still on this machine only" in out(proc)
        server = _moto_process(port, env)  # the store is back (empty: a new server)
        proc = run("sync", "--study", str(study), env=env)
        assert proc.returncode == 0 and "nothing is on this machine only" in out(proc), out(proc)
        proc = run("restore", uri, str(tmp_path / "restored"), env=env)
        assert proc.returncode == 0 and "every file matches its recorded sha256" in out(proc), out(proc)
    finally:
        server.kill()
        server.wait()


@pytest.mark.fault("remote: kill -9 during an upload")
def test_kill_9_during_an_upload_leaves_the_previous_copy_then_sync_and_restore(tiny_base, s3_env, tmp_path):
    uri = f"s3://{BUCKET}/faults/kill9"
    study = remote_study(tmp_path / "study", tiny_base, uri)
    proc = run("sync", "--study", str(study))
    assert proc.returncode == 0, out(proc)
    before = _consistent(Store(uri))
    (study / "blob.bin").write_bytes(os.urandom(80 << 20))  # a large upload: multipart, seconds long
    sync = subprocess.Popen(
        [sys.executable, "-c", "from tuneproof.cli import main; main()", "sync", "--study", str(study)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )
    for line in sync.stderr:
        if "remote: sending blob.bin" in line:
            time.sleep(0.3)
            sync.send_signal(signal.SIGKILL)  # mid-upload
            break
    sync.wait(timeout=60)
    assert sync.returncode == -signal.SIGKILL
    after = _consistent(Store(uri))  # still the previous manifest, every object in place
    assert after["seq"] == before["seq"] and "blob.bin" not in after["files"]

    proc = run("sync", "--study", str(study))
    assert proc.returncode == 0 and "nothing is on this machine only" in out(proc), out(proc)
    proc = run("restore", uri, str(tmp_path / "restored"))
    assert proc.returncode == 0, out(proc)
    assert (tmp_path / "restored" / "blob.bin").read_bytes() == (study / "blob.bin").read_bytes()


@pytest.mark.fault("remote: object altered or deleted in the store")
def test_altered_and_deleted_objects_are_named_and_resume_falls_back_only_when_asked(interrupted_remote, tmp_path):
    _, src = interrupted_remote
    remote = shutil.copytree(src, tmp_path / "remote")
    manifest = json.loads(sorted((remote / "manifests").glob("m-*.json"))[-1].read_text())
    newest = manifest["files"]["runs/r0003/checkpoints/step-000005/tensors.safetensors"]["sha256"]
    obj = remote / object_name(newest)
    data = bytearray(obj.read_bytes())
    data[-7] ^= 0x01  # one bit of one weight, in the store
    obj.write_bytes(bytes(data))
    gone = manifest["files"]["runs/r0002/outputs.jsonl"]["sha256"]
    (remote / object_name(gone)).unlink()

    dest = tmp_path / "new" / "study"
    proc = run("restore", f"file://{remote}", str(dest))
    assert proc.returncode == 3, out(proc)
    text = out(proc)
    found = hashlib.sha256(bytes(data)).hexdigest()
    assert (
        f"altered: runs/r0003/checkpoints/step-000005/tensors.safetensors: sha256 {found} differs from {newest} "
        "in the manifest (altered in the store)"
    ) in text
    assert f"missing: runs/r0002/outputs.jsonl: its object {gone[:12]} is missing from the store" in text
    assert "checkpoint: runs/r0003/checkpoints/step-000005: checkpoint has no tensors.safetensors" in text
    assert not (dest / "runs/r0003/checkpoints/step-000005/tensors.safetensors").exists()  # never written
    _set_remote(dest, f"file://{remote}")

    proc = run("resume", "r0003", "--study", str(dest))
    assert proc.returncode == 2 and "--fallback" in out(proc), out(proc)
    assert Registry(dest).get("r0003").status == "interrupted"
    proc = run("resume", "r0003", "--study", str(dest), "--fallback")
    assert proc.returncode == 0, out(proc)
    rec = Registry(dest).get("r0003")
    assert rec.status == "completed" and rec.summary["resumes"][-1]["from_step"] == 4


@pytest.mark.fault("remote: two machines on one prefix")
def test_a_second_machine_on_the_same_prefix_is_refused_naming_the_first(interrupted_remote, tmp_path):
    study, src = interrupted_remote
    remote = shutil.copytree(src, tmp_path / "remote")
    uri = f"file://{remote}"
    held = json.loads((remote / "lease.json").read_text())
    other = shutil.copytree(study, tmp_path / "second-machine", ignore=shutil.ignore_patterns(".tuneproof-remote.json"))
    _set_remote(other, uri)
    proc = run("train", "--study", str(other), "--skip-preflight", "second machine")
    assert proc.returncode == 2, out(proc)
    assert (
        f"{uri} is the remote copy written by study folder {held['folder']} on host {held['host']} "
        f"(pid {held['pid']}, last seen"
    ) in out(proc)
    assert "tuneproof sync --take-over" in out(proc)
    assert [r.id for r in Registry(other).list(kind="train")] == ["r0003"]  # no run was created
    proc = run("sync", "--study", str(other))
    assert proc.returncode == 2 and f"on host {held['host']}" in out(proc)
    proc = run("sync", "--take-over", "--study", str(other))
    assert proc.returncode == 0, out(proc)
    assert json.loads((remote / "lease.json").read_text())["lease"] != held["lease"]


@pytest.mark.fault("remote: local disk full while uploading")
def test_disk_full_while_uploading_pauses_with_one_line_then_goes_on(interrupted_remote, tmp_path, monkeypatch):
    study, src = interrupted_remote
    remote = tmp_path / "remote"
    uri = f"file://{remote}"
    said: list[str] = []
    up = Uploader(Mirror(study, uri), warn=said.append)

    def full(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(study / ".tuneproof-remote.json"))

    monkeypatch.setattr("tuneproof.storage.mirror.write_state", full)
    up.request()
    up.request("flush")
    up.close(30)
    assert len(said) == 1, said  # one line, however many pushes failed
    assert said[0].startswith("warning: the remote copy is paused: disk full on this machine")
    assert "the run goes on, free space then `tuneproof sync`" in said[0]
    monkeypatch.undo()
    said.clear()
    again = Uploader(Mirror(study, uri), warn=said.append)
    again.request("flush")
    safe = again.close(30)
    assert safe["local_only"] == [] and safe["files"] > 20, said


@pytest.mark.fault("remote: store unreachable at deliver")
def test_unreachable_at_deliver_is_not_delivered(tmp_path):
    (tmp_path / "bundle").mkdir()
    (tmp_path / "bundle" / "adapter.safetensors").write_bytes(b"x" * 100)
    dead = f"sftp://nobody@127.0.0.1:{free_port()}/nowhere"
    with pytest.raises(TuneproofError) as err:
        deliver_to(tmp_path, dead, {"bundle": tmp_path / "bundle"}, what="export r0004")
    assert err.value.message.startswith(f"not delivered: {dead}: cannot open the store (")
    assert not (tmp_path / "uploads.jsonl").exists()  # nothing measured, nothing said delivered
