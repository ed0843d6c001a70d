"""Nothing left behind (docs/CASES.md, faults of the machine): stale temp files of killed commands are removed when the
next run starts; child processes die with their parent; two first-time model conversions at once: the
second waits on a file lock and reuses the first's folder, which the group can read."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
import types

import pytest

from tuneproof.registry import Registry

pytestmark = pytest.mark.filterwarnings("ignore")


def _env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie (not yet reaped by its new parent) counts as dead
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.fault("leftovers: stale temp files")
def test_stale_temp_files_are_removed_at_the_next_start(tmp_path, capsys):
    reg = Registry(tmp_path)
    dead = reg.create("eval")  # killed while writing outputs.jsonl and a checkpoint
    (tmp_path / "runs" / dead.id / ".outputs.jsonl.k3j2a.tmp").write_text('{"id": 1')
    (tmp_path / "runs" / dead.id / "checkpoints").mkdir()
    (tmp_path / "runs" / dead.id / "checkpoints" / ".step-000004.pt.tmp").write_bytes(b"\0" * 100)
    reg._update(dead.id, pid=2**22 + 7, proc_start="gone")  # its process is gone
    live = reg.create("eval")  # still running in this process: its temp file is being written
    (tmp_path / "runs" / live.id / ".outputs.jsonl.live1.tmp").write_text("{")
    (tmp_path / "exports").mkdir()
    (tmp_path / "exports" / ".r0002.a8d7f2").mkdir()  # a killed export's bundle folder
    (tmp_path / "exports" / ".r0002.a8d7f2" / "manifest.json").write_text("{}")
    (tmp_path / "exports" / "r0001").mkdir()  # a finished bundle: kept
    old = tmp_path / ".plan.json.x8y9.tmp"
    old.write_text("{")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    fresh = tmp_path / ".dossier.md.abcd.tmp"  # may be another command writing right now
    fresh.write_text("#")
    reg.close()

    reg = Registry(tmp_path)
    assert reg.get(dead.id).status == "interrupted"
    with reg.run("export") as run:
        pass
    err = capsys.readouterr().err
    assert "note: removed 4 stale temporary file(s) left by a killed process" in err
    assert not (tmp_path / "runs" / dead.id / ".outputs.jsonl.k3j2a.tmp").exists()
    assert not (tmp_path / "runs" / dead.id / "checkpoints" / ".step-000004.pt.tmp").exists()
    assert not (tmp_path / "exports" / ".r0002.a8d7f2").exists() and not old.exists()
    assert (tmp_path / "runs" / live.id / ".outputs.jsonl.live1.tmp").exists() and fresh.exists()
    assert (tmp_path / "exports" / "r0001").is_dir()
    assert "removed 4 stale temporary file(s)" in (tmp_path / "runs" / run.id / "log.txt").read_text()


@pytest.mark.fault("leftovers: stale temp files")
def test_a_failed_or_interrupted_run_removes_its_own_temp_files(tmp_path):
    reg = Registry(tmp_path)
    with pytest.raises(KeyboardInterrupt), reg.run("eval") as run:
        (run.dir / ".outputs.jsonl.q1.tmp").write_text("{")
        raise KeyboardInterrupt
    with pytest.raises(RuntimeError), reg.run("train") as run2:
        (run2.dir / "checkpoints").mkdir()
        (run2.dir / "checkpoints" / ".step-000002.pt.tmp").write_text("x")
        raise RuntimeError("boom")
    assert list(tmp_path.rglob("*.tmp")) == []


PARENT = textwrap.dedent(
    """
    import subprocess, sys, time
    from tuneproof.procs import child_env
    child = subprocess.Popen([sys.executable, "-c",
        "import time; from tuneproof.procs import die_with_parent; assert die_with_parent(); print('ready', flush=True); time.sleep(120)"],
        env=child_env(), stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    print(child.pid, flush=True)
    time.sleep(120)
    """  # noqa: E501 (the child's script, run as written)
)


@pytest.mark.fault("leftovers: orphaned child")
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
def test_a_child_dies_when_its_parent_is_killed_9(tmp_path):
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True, env=_env())
    child_pid = int(parent.stdout.readline())
    assert not _gone(child_pid)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(timeout=30)
    deadline = time.monotonic() + 20
    while not _gone(child_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(child_pid)


@pytest.mark.fault("leftovers: orphaned child")
def test_the_verify_and_reload_children_ask_to_die_with_their_parent(tmp_path, monkeypatch):
    import subprocess as sp

    import tuneproof.deliver.bundle_verification as BV
    import tuneproof.deliver.verify as V
    import tuneproof.preflight.reload as PF
    import tuneproof.procs as P

    calls = []
    monkeypatch.setattr(P, "die_with_parent", lambda: calls.append("child") or True)
    V.main([str(tmp_path / "no-bundle"), "--out", str(tmp_path / "r.json")])
    assert PF.reload_main(["not-reload"]) == 2
    assert calls == ["child", "child"]
    seen = []

    def fake_run(cmd, **kw):
        seen.append(kw["env"])
        raise sp.TimeoutExpired(cmd, 1)

    monkeypatch.setattr(BV.subprocess, "run", fake_run)
    monkeypatch.setattr(PF.subprocess, "run", fake_run)
    with pytest.raises(sp.TimeoutExpired):
        BV.verify_in_fresh_process(tmp_path)
    ctx = types.SimpleNamespace(
        study_dir=tmp_path, data_root=None, config={}, device_choice={"dtype": "fp32", "torch_device": "cpu"}
    )
    with pytest.raises(sp.TimeoutExpired):
        PF.reload_in_fresh_process(ctx, tmp_path, tmp_path / "adapter", "adapter", [])
    assert [env[P.PARENT_ENV] for env in seen] == [str(os.getpid())] * 2


BUILDER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from tuneproof.models.base import build_once
    dest, log = Path(sys.argv[1]), Path(sys.argv[2])
    def write(tmp):
        (log.parent / "started").write_text("1")
        with open(log, "a") as fh:
            fh.write(f"{os.getpid()}\\n")
        time.sleep(1.5)
        (tmp / "model.safetensors").write_bytes(b"weights")
    built = build_once(dest, write, "rev123", what="test.gguf")
    print("built" if built else "reused", (dest / "model.safetensors").read_bytes().decode())
    """
)


@pytest.mark.fault("leftovers: concurrent conversion")
def test_two_first_time_conversions_at_once_the_second_waits_and_reuses(tmp_path):
    dest, log = tmp_path / "cache" / "smollm2-abc", tmp_path / "conversions.log"
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / ".smollm2-abc.dead12").mkdir()  # a builder killed earlier
    first = subprocess.Popen(
        [sys.executable, "-c", BUILDER, str(dest), str(log)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / "started").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    second = subprocess.run(
        [sys.executable, "-c", BUILDER, str(dest), str(log)], capture_output=True, text=True, env=_env(), timeout=120
    )
    out1, err1 = first.communicate(timeout=120)
    assert first.returncode == 0 and second.returncode == 0, err1 + second.stderr
    assert out1.split() == ["built", "weights"] and second.stdout.split() == ["reused", "weights"]
    assert "another process is building" in second.stderr and "waiting for it and reusing it" in second.stderr
    assert len(log.read_text().splitlines()) == 1  # converted once
    assert (dest / ".tuneproof_revision").read_text() == "rev123\n"
    mode = stat.S_IMODE(dest.stat().st_mode)
    assert mode & 0o750 == 0o750 and mode != 0o700, oct(mode)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["smollm2-abc", "smollm2-abc.lock"]
