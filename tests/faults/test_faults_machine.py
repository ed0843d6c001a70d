"""Faults of the machine give one clear line and leave nothing behind (docs/CASES.md, faults of the machine): disk full
at start and mid-run, read-only study folder, SIGTERM (exit 143), a closed stdout pipe. Disk full
and read-only are injected (an OSError with errno ENOSPC / EROFS raised by the writer, or the
sqlite3 error the library raises); tests/faults/test_faults_full.py repeats them on real tmpfs
mounts."""

from __future__ import annotations

import errno
import os
import sqlite3
import subprocess
import sys
import textwrap

import pytest

from tuneproof.cli import main
from tuneproof.registry import Registry

pytestmark = pytest.mark.filterwarnings("ignore")


def cli(args, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(args)
    out = capsys.readouterr()
    return exit_.value.code, out.out + out.err


def _temps(folder):
    from tuneproof.io import is_temp_name

    return sorted(p.name for p in folder.rglob("*") if is_temp_name(p.name))


def _enospc(path):
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


@pytest.mark.fault("machine: disk full mid-run")
def test_disk_full_mid_run_fails_the_run_removes_temps_and_resume_continues(
    tiny_base, tmp_path, capsys, monkeypatch, one_thread
):
    """The checkpoint writer (safetensors' Rust writer) hits a full disk at step 4, as it reports it."""
    import safetensors.torch as st
    from safetensors import SafetensorError

    from tiny_study import make_study
    from tuneproof.training.resume_state import list_checkpoints

    study = make_study(tmp_path / "s", tiny_base)  # r0001 data check, r0002 baseline; 8 steps, a checkpoint every 2
    original = st.save_file

    def full_at_step_4(tensors, filename, metadata=None):
        if (metadata or {}).get("step") == "4":
            with open(filename, "wb") as fh:
                fh.write(b"\0" * 1000)  # the partial file a full disk leaves
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        return original(tensors, filename, metadata=metadata)

    monkeypatch.setattr(st, "save_file", full_at_step_4)
    code, out = cli(["train", "--study", str(study), "--skip-preflight", "fault test"], capsys)
    run_dir = study / "runs" / "r0003"
    assert code == 2, out
    assert (
        f"run r0003 failed: {run_dir}: disk full (Error while serializing: I/O "
        "error: No space left on device (os error 28))" in out
    )
    assert "tuneproof resume r0003" in out and "Traceback" not in out
    rec = Registry(study).get("r0003")
    assert rec.status == "failed" and rec.reason.startswith("disk full: ")
    assert _temps(study) == [] and not [p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".")]
    assert [p.name for p in list_checkpoints(run_dir)] == ["step-000002"]

    monkeypatch.setattr(st, "save_file", original)  # space freed
    code, out = cli(["resume", "r0003", "--study", str(study)], capsys)
    assert code == 0, out
    rec = Registry(study).get("r0003")
    assert (rec.status, rec.summary["steps"], rec.summary["resumes"][0]["from_step"]) == ("completed", 8, 2)
    assert rec.summary["resumes"][0]["previous_reason"].startswith("disk full: ")


@pytest.mark.fault("machine: disk full at start")
def test_disk_full_at_start_one_line_run_failed_nothing_left(tiny_base, tmp_path, capsys, monkeypatch):
    import tuneproof.io as io
    from tiny_study import make_study

    study = make_study(tmp_path / "s", tiny_base)
    Registry(study).close()  # the index exists; now the disk is full

    def full(path, data):
        path = os.fspath(path)
        tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.x1y2.tmp")
        with open(tmp, "wb") as fh:
            fh.write(data[:10])
        raise _enospc(tmp)

    monkeypatch.setattr(io, "atomic_write_bytes", full)
    code, out = cli(["train", "--study", str(study), "--skip-preflight", "fault test"], capsys)
    assert code == 2, out
    assert f"{study / 'runs' / 'r0003'}: disk full (No space left on device) writing .run.json.x1y2.tmp" in out
    assert "Traceback" not in out and len(out[out.index("error: ") :].strip().splitlines()) == 2
    monkeypatch.undo()
    rec = Registry(study).get("r0003")
    assert rec.status == "failed" and rec.reason.startswith("disk full: ")
    assert _temps(study) == []


@pytest.mark.fault("machine: disk full at start")
@pytest.mark.parametrize(
    "message,cause",
    [
        ("database or disk is full", "disk full"),
        ("attempt to write a readonly database", "read-only"),
        ("unable to open database file", "read-only"),
    ],
)
def test_the_index_cannot_be_written_one_line_exit_2(tmp_path, capsys, monkeypatch, message, cause):
    from tuneproof.recipes.init import template_text

    (tmp_path / "tuneproof.yaml").write_text(template_text("extraction"))

    def refuse(path):
        raise sqlite3.OperationalError(message)

    monkeypatch.setattr(Registry, "_connect", staticmethod(refuse))
    code, out = cli(["runs", "--study", str(tmp_path)], capsys)
    assert code == 2
    assert out.startswith(f"error: {tmp_path / 'tuneproof.sqlite'}: {cause} ({message})")
    assert "Traceback" not in out and len(out.strip().splitlines()) == 2


@pytest.mark.fault("machine: disk full at start")
@pytest.mark.parametrize(
    "free,said",
    [
        (12 * 1024, "disk full (disk I/O error; 12 KiB free in {study})"),
        (0, "disk full (disk I/O error; 0 bytes free in {study})"),
        (40 * 1024**3, "I/O error (disk I/O error)"),  # space left: an I/O error is what it says
    ],
)
def test_sqlite_disk_io_error_on_a_full_disk_is_said_disk_full_with_the_free_space(
    tmp_path, capsys, monkeypatch, free, said
):
    """SQLite reports a WAL index (-shm) it cannot grow on a full disk as "disk I/O error"."""
    import shutil
    from collections import namedtuple

    from tuneproof.recipes.init import template_text

    (tmp_path / "tuneproof.yaml").write_text(template_text("extraction"))

    def refuse(path):
        raise sqlite3.OperationalError("disk I/O error")

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(16 << 20, (16 << 20) - free, free))
    monkeypatch.setattr(Registry, "_connect", staticmethod(refuse))
    code, out = cli(["runs", "--study", str(tmp_path)], capsys)
    assert code == 2
    assert out.startswith(f"error: {tmp_path / 'tuneproof.sqlite'}: {said.format(study=tmp_path)}\n"), out
    assert "Traceback" not in out and len(out.strip().splitlines()) == 2


@pytest.mark.fault("machine: read-only study folder")
def test_read_only_study_folder_mid_command(tmp_path, capsys, monkeypatch):
    """A folder that turns read-only (EROFS) while a run records: failed with reason read-only."""
    import tuneproof.io as io

    reg = Registry(tmp_path)
    with reg.run("baseline"):
        pass
    original = io.atomic_write_bytes

    def rofs(path, data):
        if str(path).endswith("outputs.jsonl"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return original(path, data)

    monkeypatch.setattr(io, "atomic_write_bytes", rofs)
    with pytest.raises(Exception) as err, reg.run("eval") as run:
        io.write_jsonl(run.path("outputs.jsonl"), [{"id": 1}])
    assert type(err.value).__name__ == "TuneproofError" and err.value.exit_code == 2
    assert str(err.value).startswith(
        f"run r0002 failed: {tmp_path / 'runs' / 'r0002'}: read-only (Read-only file system) writing outputs.jsonl"
    )
    rec = reg.get("r0002")
    assert rec.status == "failed" and rec.reason.startswith("read-only: ")


@pytest.mark.fault("machine: read-only study folder")
@pytest.mark.skipif(
    os.geteuid() == 0, reason="root writes into a chmod 555 folder; the full set mounts a read-only tmpfs"
)
def test_read_only_study_folder_real_chmod(tmp_path, capsys):
    reg = Registry(tmp_path)
    reg.close()
    os.chmod(tmp_path, 0o555)
    try:
        code, out = cli(["runs", "--study", str(tmp_path)], capsys)
    finally:
        os.chmod(tmp_path, 0o755)
    assert code == 2 and "read-only" in out and "Traceback" not in out


PROBE = textwrap.dedent(
    """
    import os, signal, sys, time
    from tuneproof.cli import app, main
    from tuneproof.registry import Registry
    from tuneproof.ui import console

    @app.command("fault-probe")
    def probe(study: str, lines: int = 0, term: bool = False) -> None:
        reg = Registry(study)
        with reg.run("compare") as run:
            for i in range(lines):
                console.print(f"row {i}: " + "x" * 100)
            if term:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(30)
            run.update_summary(verdict="pass")

    main(sys.argv[1:])
    """
)


def _env():
    return dict(os.environ, COLUMNS="200", HF_HUB_OFFLINE="1", PYTHONPATH=os.pathsep.join(sys.path))


@pytest.mark.fault("machine: SIGTERM")
def test_sigterm_exits_143_with_the_run_interrupted(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, "fault-probe", str(tmp_path), "--term"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )
    assert proc.returncode == 143, proc.stdout + proc.stderr
    assert (
        f"run r0001 (compare) interrupted by SIGTERM; recorded as interrupted, run the command again: "
        f"tuneproof fault-probe {tmp_path} --term"
    ) in proc.stderr.splitlines()
    rec = Registry(tmp_path).get("r0001")
    assert (rec.status, rec.reason) == ("interrupted", "terminated (signal 15)")


@pytest.mark.fault("machine: broken pipe")
def test_a_closed_stdout_pipe_never_fails_a_completed_run(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", PROBE, "fault-probe", str(tmp_path), "--lines", "5000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(),
    )
    first = proc.stdout.readline()  # `| head -1`
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert first.startswith(b"row 0: ")
    assert "BrokenPipe" not in err and "Exception ignored" not in err and "Traceback" not in err
    rec = Registry(tmp_path).get("r0001")
    assert (rec.status, rec.summary) == ("completed", {"verdict": "pass"})


@pytest.mark.fault("machine: broken pipe")
def test_runs_into_head_exits_0(tmp_path):
    reg = Registry(tmp_path)
    for _ in range(300):
        with reg.run("eval"):
            pass
    reg.close()
    shell = (
        f"set -o pipefail; {sys.executable} -c 'from tuneproof.cli import "
        f"main; main()' runs --study {tmp_path} | head -1"
    )
    proc = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (
        len(proc.stdout.splitlines()) == 1 and "Exception ignored" not in proc.stderr and "Traceback" not in proc.stderr
    )
