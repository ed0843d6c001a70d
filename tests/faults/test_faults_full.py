"""The full fault set (run by hand: ``python -m tests.faults.run_all --full``): real full and
read-only file systems (a tmpfs mounted for the test; needs root, skipped otherwise), and
``kill -9`` / SIGTERM / SIGINT of ``tuneproof train`` at many moments, each followed by
``tuneproof resume``, which must end exactly like an uninterrupted run (or refuse when no
checkpoint exists yet)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from tuneproof.registry import Registry

pytestmark = [pytest.mark.fault_full, pytest.mark.filterwarnings("ignore")]


@pytest.fixture()
def tmpfs(tmp_path):
    """A 16 MiB tmpfs mounted at tmp_path/disk (root only)."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("mount -t tmpfs is not permitted here")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


HOOKED = textwrap.dedent(
    """
    import os, signal, sys
    import tuneproof.training.loop as L
    import tuneproof.io as io
    from tuneproof.cli import main
    MODE, AT = sys.argv[1], int(sys.argv[2])
    ARMED = {"on": False}

    def fill(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            while True:
                os.write(fd, b"\\0" * 65536)
        except OSError:
            pass
        finally:
            os.close(fd)

    orig_train = L.train
    def train(*a, **kw):
        inner = kw.get("progress")
        def progress(step, total, loss):
            if inner:
                inner(step, total, loss)
            if step == AT:
                ARMED["on"] = True
                if MODE == "fill":
                    fill(os.environ["FILLER"])
                elif MODE in ("SIGKILL", "SIGTERM", "SIGINT"):
                    os.kill(os.getpid(), getattr(signal, MODE))
        kw["progress"] = progress
        return orig_train(*a, **kw)
    L.train = train

    if MODE == "kill-in-checkpoint":  # SIGKILL once the tensors of step AT are in the temp folder
        import safetensors.torch as st
        orig_save = st.save_file
        def save_file(tensors, filename, metadata=None):
            orig_save(tensors, filename, metadata=metadata)
            if (metadata or {}).get("step") == str(AT):
                os.kill(os.getpid(), signal.SIGKILL)
        st.save_file = save_file
    if MODE == "kill-in-record":  # SIGKILL inside the first atomic write of run.json after step AT (the end of training):
        orig_write = io.atomic_write_bytes  # the temp file written, not renamed
        def atomic_write_bytes(path, data):
            if str(path).endswith("run.json") and ARMED["on"]:
                tmp = os.path.join(os.path.dirname(str(path)), "." + os.path.basename(str(path)) + ".dead.tmp")
                open(tmp, "wb").write(data[: len(data) // 2])
                os.kill(os.getpid(), signal.SIGKILL)
            return orig_write(path, data)
        io.atomic_write_bytes = atomic_write_bytes
    main(sys.argv[3:])
    """  # noqa: E501 (the child's script, run as written)
)


def _hooked(mode: str, at: int, *args: str, env=None) -> subprocess.CompletedProcess:
    from tiny_study import cli_env

    e = cli_env()
    e.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", HOOKED, mode, str(at), *args], capture_output=True, text=True, env=e, timeout=600
    )


def _train(study, mode, at, env=None):
    return _hooked(mode, at, "train", "--study", str(study), "--skip-preflight", "fault suite", env=env)


@pytest.fixture(scope="module")
def reference(tiny_base, tmp_path_factory):
    """Per-step losses and final adapter of the uninterrupted 8-step run."""
    from tiny_study import adapter_tensors, losses_by_step, make_study

    study = make_study(tmp_path_factory.mktemp("ref") / "s", tiny_base)
    proc = _train(study, "none", 0)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = study / "runs" / "r0003"
    return {"losses": losses_by_step(run_dir), "adapter": adapter_tensors(run_dir)}


def _assert_exact(run_dir, reference):
    import torch

    from tiny_study import adapter_tensors, losses_by_step

    assert losses_by_step(run_dir) == reference["losses"]
    got = adapter_tensors(run_dir)
    assert sorted(got) == sorted(reference["adapter"])
    assert all(torch.equal(got[k], reference["adapter"][k]) for k in got)


def _no_temps(study):
    from tuneproof.io import is_temp_name

    return [str(p) for p in study.rglob("*") if is_temp_name(p.name)]


MOMENTS = [("SIGKILL", k) for k in range(1, 8)] + [
    ("kill-in-checkpoint", 4),
    ("kill-in-record", 8),
    ("SIGTERM", 3),
    ("SIGTERM", 6),
    ("SIGINT", 5),
]


@pytest.mark.fault("full: kill/signal at a moment, then resume")
@pytest.mark.parametrize("mode,at", MOMENTS, ids=[f"{m}-{a}" for m, a in MOMENTS])
def test_killed_at_a_moment_then_resumed_exactly(tiny_base, tmp_path, reference, mode, at):
    from tiny_study import cli, make_study

    study = make_study(tmp_path / "s", tiny_base)
    proc = _train(study, mode, at)
    expected = {"SIGTERM": 143, "SIGINT": 130}.get(mode, -9)
    assert proc.returncode == expected, proc.stdout + proc.stderr
    rec = Registry(study).get("r0003")
    assert rec.status == "interrupted", rec
    if expected == -9:  # found stale; with a checkpoint to continue from, the reason says how
        ckpt = any((study / "runs" / "r0003" / "checkpoints").glob("step-*"))
        assert rec.reason == "process died without recording an end (found stale)" + (
            "; resume with: tuneproof resume r0003" if ckpt else ""
        )
        assert ckpt == (at >= 2)
    proc = cli("resume", "r0003", "--study", str(study))
    if mode == "SIGKILL" and at == 1:  # killed before the first checkpoint (step 2): nothing to continue
        assert proc.returncode == 2 and "no checkpoint (step-*) to resume from" in proc.stdout
        return
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rec = Registry(study).get("r0003")
    assert rec.status == "completed" and rec.summary["steps"] == 8
    assert _no_temps(study) == []
    _assert_exact(study / "runs" / "r0003", reference)


@pytest.mark.fault("full: real disk full (tmpfs)")
def test_a_really_full_disk_mid_run(tiny_base, tmpfs, reference):
    from tiny_study import cli, make_study

    study = make_study(tmpfs / "s", tiny_base)
    filler = tmpfs / "filler"
    proc = _train(study, "fill", 3, env={"FILLER": str(filler)})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert (
        f"run r0003 failed: {study / 'runs' / 'r0003'}" in out
        and ": disk full (" in out
        and "No space left on device" in out
    )
    assert "tuneproof resume r0003" in out and "Traceback" not in out
    rec = Registry(study).get("r0003")
    assert rec.status == "failed" and rec.reason.startswith("disk full: ")
    assert _no_temps(study) == []
    filler.unlink()  # space freed
    proc = cli("resume", "r0003", "--study", str(study))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert Registry(study).get("r0003").status == "completed"
    _assert_exact(study / "runs" / "r0003", reference)


@pytest.mark.fault("full: real read-only file system (tmpfs)")
def test_a_really_read_only_study_folder(tiny_base, tmpfs):
    from tiny_study import cli, make_study

    study = make_study(tmpfs / "s", tiny_base)
    Registry(study).close()
    assert subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], capture_output=True).returncode == 0
    try:
        for args in (["train", "--skip-preflight", "x"], ["runs"]):
            proc = cli(*args, "--study", str(study))
            out = proc.stdout + proc.stderr
            assert proc.returncode == 2, out
            assert "read-only" in out and str(study) in out and "Traceback" not in out
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(tmpfs)], capture_output=True)


@pytest.mark.fault("full: real disk full (tmpfs)")
def test_a_really_full_disk_at_the_start_of_a_command(tiny_base, tmpfs):
    from tiny_study import cli, make_study

    study = make_study(tmpfs / "s", tiny_base, prepare=False)
    Registry(study).close()
    for wal in ("tuneproof.sqlite-wal", "tuneproof.sqlite-shm"):
        (study / wal).unlink(missing_ok=True)
    filler = tmpfs / "filler"
    with open(filler, "wb") as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        except OSError:
            pass
    try:
        proc = cli("runs", "--study", str(study))
    finally:
        filler.unlink()
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    # SQLite cannot make its WAL index (-shm): "disk I/O error", said as the full disk it is
    assert f"error: {study / 'tuneproof.sqlite'}: disk full (disk I/O error; 0 bytes free in {study})\n" in out, out
    assert "Traceback" not in out
