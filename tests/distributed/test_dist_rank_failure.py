"""How the launcher reads the ranks' error files (no processes started): the first rank to fail is
named with its error; a collective timeout names the ranks that did not answer (a hung rank); a
stop on every rank is an interruption. End to end, a rank that sleeps forever in step 2 with
``distributed.timeout_s: 8`` ended the run in 83 s on the loaded 2-core machine (8 s timeout, then
torchrun's shutdown of the hung rank) with the timeout message asserted here."""

from __future__ import annotations

import json

from tuneproof.recipes.torchrun import rank_failure, torchrun_failures


def _write(run_dir, rank, type_, message, t, timeout=False):
    (run_dir / f"rank-{rank}.error.json").write_text(
        json.dumps({"rank": rank, "type": type_, "message": message, "timeout": timeout, "time": t})
    )


def test_first_rank_to_fail_is_named_not_the_ones_that_died_of_it(tmp_path):
    _write(tmp_path, 1, "ValueError", "bad row 17", 100.0)
    _write(tmp_path, 0, "RuntimeError", "Connection closed by peer", 100.5)
    kind, msg = rank_failure(tmp_path, 2, 600)
    assert kind == "failed"
    assert msg == f"rank 1 failed: ValueError: bad row 17 (log: {tmp_path / 'rank-1.log'})"


def test_a_hung_rank_is_named_after_the_timeout(tmp_path):
    _write(tmp_path, 0, "RuntimeError", "Timed out waiting 8000ms for send operation to complete", 100.0, timeout=True)
    kind, msg = rank_failure(tmp_path, 2, 8)
    assert kind == "timeout"
    assert msg.startswith(
        "rank 0 waited 8 s (distributed.timeout_s) in a collective and gave up: rank 1 did not answer (hung or killed)"
    )


def test_every_rank_stopped_is_an_interruption_and_health_is_its_own_kind(tmp_path):
    _write(tmp_path, 0, "KeyboardInterrupt", "stop_after=3", 100.0)
    _write(tmp_path, 1, "KeyboardInterrupt", "stopped with another rank", 100.1)
    assert rank_failure(tmp_path, 2, 600) == ("interrupted", "stop_after=3")
    _write(tmp_path, 1, "HealthFault", "step 2: nonfinite_loss: loss is nan", 99.0)
    assert rank_failure(tmp_path, 2, 600) == ("health", "rank 1: step 2: nonfinite_loss: loss is nan")


def test_no_error_file_points_at_the_launcher_log(tmp_path):
    kind, msg = rank_failure(tmp_path, 2, 600)
    assert kind == "failed" and "launcher.log" in msg


# torchrun's ChildFailedError report as torch 2.x writes it (torch.distributed.elastic.multiprocessing.errors)
REPORT = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
tuneproof.recipes.torchrun FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-02_03:10:01
  host      : box
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 4241)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-02_03:10:01
  host      : box
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 4242)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 4242
============================================================
"""


def test_a_rank_killed_without_a_word_is_named_from_torchruns_report(tmp_path):
    assert torchrun_failures(REPORT) == {
        0: {"exitcode": 1, "pid": 4241, "signal": None, "time": "2026-12-02_03:10:01", "root": False},
        1: {"exitcode": -9, "pid": 4242, "signal": "SIGKILL", "time": "2026-12-02_03:10:01", "root": True},
    }
    gloo = "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:29500"
    _write(tmp_path, 0, "RuntimeError", gloo, 100.0)  # the survivor: the only error file
    old = "an earlier attempt's report\n" + REPORT.replace("-9 (pid: 4242)  (SIGKILL)", "-15 (pid: 4000)  (SIGTERM)")
    (tmp_path / "launcher.log").write_text(old + REPORT)
    kind, msg = rank_failure(tmp_path, 2, 600, log_offset=len(old))
    assert kind == "failed"
    assert msg == (
        "rank 1 was killed by signal 9 (SIGKILL) without reporting an error (torchrun: exit code -9, pid 4242); "
        f"rank 0 then failed: RuntimeError: {gloo} (logs: {tmp_path / 'rank-1.log'}, {tmp_path / 'launcher.log'})"
    )
    # a resume appends to launcher.log: an earlier attempt's report is not this launch's
    (tmp_path / "launcher.log").write_text(old)
    assert rank_failure(tmp_path, 2, 600, log_offset=len(old))[1].startswith("rank 0 failed: RuntimeError: ")
    assert rank_failure(tmp_path, 2, 600)[1].startswith("rank 1 was killed by signal 15 (SIGTERM) ")


def test_the_rank_torchrun_stopped_is_not_the_cause(tmp_path):
    """torchrun stops the survivors with SIGTERM: with no error file at all, the SIGKILLed rank is named."""
    stopped = REPORT.replace("exitcode  : 1 (pid: 4241)", "exitcode  : -15 (pid: 4241)  (SIGTERM)")
    (tmp_path / "launcher.log").write_text(stopped)
    kind, msg = rank_failure(tmp_path, 2, 600)
    assert (kind, msg) == (
        "failed",
        "rank 1 was killed by signal 9 (SIGKILL) without reporting an error (torchrun: exit code -9, pid 4242); "
        f"rank 0 was killed by signal 15 (SIGTERM) (logs: {tmp_path / 'rank-1.log'}, {tmp_path / 'launcher.log'})",
    )


# the CI run of 2026-12-02: rank 1 raised, torchrun stopped rank 0 (blocked in a collective) before it wrote its file
RAISED = (
    REPORT.replace("exitcode  : 1 (pid: 4241)", "exitcode  : -15 (pid: 4241)  (SIGTERM)")
    .replace("03:10:01\n  host      : box\n  rank      : 0", "03:10:02\n  host      : box\n  rank      : 0")
    .replace("exitcode  : -9 (pid: 4242)  (SIGKILL)", "exitcode  : 1 (pid: 4242)")
)


def test_a_rank_stopped_after_the_failure_is_not_its_cause(tmp_path):
    (tmp_path / "launcher.log").write_text(RAISED)
    _write(tmp_path, 1, "ValueError", "injected fault on rank 1", 100.0)
    assert rank_failure(tmp_path, 2, 600) == (
        "failed",
        "rank 1 failed: ValueError: injected fault on rank 1; rank 0 was killed by signal 15 (SIGTERM) after it "
        f"(log: {tmp_path / 'rank-1.log'})",
    )
    # the same second, and torchrun's SIGKILL of that rank after its grace period: still not the cause
    late = RAISED.replace("-15 (pid: 4241)  (SIGTERM)", "-9 (pid: 4241)  (SIGKILL)")
    for report in (late, late.replace("03:10:02", "03:10:31")):
        (tmp_path / "launcher.log").write_text(report)
        assert rank_failure(tmp_path, 2, 600)[1].startswith("rank 1 failed: ValueError: injected fault on rank 1; ")
    # but a SIGKILL seen in the same second as the first failure is a cause (the OOM killer, kill -9)
    (tmp_path / "launcher.log").write_text(late.replace("03:10:02", "03:10:01"))
    assert rank_failure(tmp_path, 2, 600)[1].startswith("rank 0 was killed by signal 9 (SIGKILL) without reporting")
    # and every rank stopped by Ctrl-C, one of them before it wrote its file, is an interruption
    (tmp_path / "rank-1.error.json").unlink()
    _write(tmp_path, 1, "Terminated", "stopped by SIGTERM", 100.0)
    (tmp_path / "launcher.log").write_text(
        RAISED.replace("exitcode  : 1 (pid: 4242)", "exitcode  : -15 (pid: 4242)  (SIGTERM)")
    )
    assert rank_failure(tmp_path, 2, 600) == ("interrupted", "stopped by SIGTERM")
