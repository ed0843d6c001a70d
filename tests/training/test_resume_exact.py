"""Exact resume (docs/CASES.md C12): a run interrupted at step k and resumed in a new process
gives the same per-step losses and final adapter weights as an uninterrupted run, on CPU with LoRA
dropout on (0.1), gradient accumulation 2 and a warmup + linear schedule.

Interruption: SIGTERM sent by the training process (``tuneproof train``) to itself after step 5
(graceful: checkpoint at step 5); the resume runs in another process (``tuneproof resume``), and
once more from the older periodic checkpoint of step 4 (what a hard kill leaves behind).
"""

from __future__ import annotations

import shutil

import pytest
import torch

from tiny_study import adapter_tensors, cli, losses_by_step, make_study, rows, train_dir
from tuneproof.cli import main
from tuneproof.registry import Registry
from tuneproof.training.resume_state import latest_checkpoint, list_checkpoints, load_checkpoint

STEPS = 8


@pytest.fixture(scope="module")
def reference(tiny_base, tmp_path_factory):
    """The uninterrupted run: per-step losses (full precision, from the final checkpoint) and adapter."""
    from tuneproof.context import StudyContext
    from tuneproof.recipes.train import run_train

    study = make_study(tmp_path_factory.mktemp("ref"), tiny_base)
    ctx = StudyContext.open(study)
    run_id = run_train(ctx)
    run_dir = ctx.registry.runs_dir / run_id
    ckpt = load_checkpoint(latest_checkpoint(run_dir))
    assert ckpt["step"] == STEPS and ckpt["reason"] == "final"
    return {"losses": ckpt["losses"], "adapter": adapter_tensors(run_dir), "metrics": losses_by_step(run_dir)}


def _assert_same_as_reference(run_dir, reference):
    final = load_checkpoint(latest_checkpoint(run_dir))
    assert final["step"] == STEPS
    assert final["losses"] == reference["losses"]  # bit-identical floats, every step
    assert losses_by_step(run_dir) == reference["metrics"]
    got = adapter_tensors(run_dir)
    assert sorted(got) == sorted(reference["adapter"]) and len(got) == 8  # lora_A/B of q,v in 2 layers
    for name, tensor in reference["adapter"].items():
        assert torch.equal(got[name], tensor), name


def test_reference_learns_and_dropout_is_on(reference, tiny_base, tmp_path):
    losses = reference["losses"]
    assert len(losses) == STEPS and losses[-1] < losses[0]
    # dropout is on: without it the losses differ from step 3 on (steps 1-2 cannot differ: LoRA B
    # starts at zero and the warmup's first learning rate is 0), so an exact resume must restore
    # the dropout RNG
    from tuneproof.context import StudyContext
    from tuneproof.recipes.train import run_train

    study = make_study(tmp_path / "nodrop", tiny_base)
    text = (study / "tuneproof.yaml").read_text().replace("dropout: 0.1", "dropout: 0.0")
    (study / "tuneproof.yaml").write_text(text)
    ctx = StudyContext.open(study)
    rid = run_train(ctx)
    no_drop = load_checkpoint(latest_checkpoint(ctx.registry.runs_dir / rid))["losses"]
    assert no_drop[:2] == losses[:2]
    assert all(a != b for a, b in zip(no_drop[2:], losses[2:]))


@pytest.mark.fault("machine: SIGTERM")
def test_sigterm_names_the_run_its_step_and_the_resume_command(interrupted_proc):
    """The line that ends a SIGTERM'd `tuneproof train` (stderr): which run, at which step, and the
    command that continues it (`tuneproof resume RUN`, with --study as the process ran elsewhere)."""
    study, proc = interrupted_proc
    (rec,) = Registry(study).list(kind="train")
    assert (rec.id, rec.status, rec.reason) == ("r0003", "interrupted", "terminated (signal 15) at step 5")
    assert proc.returncode == 143
    assert (
        f"run r0003 interrupted by SIGTERM at step 5; resume with: tuneproof resume r0003 --study {study}"
        in proc.stderr.splitlines()
    )
    assert "SIGTERM: stopping after this step with a checkpoint (send it again to stop now)" in proc.stderr.splitlines()
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.fault("machine: SIGINT / SIGTERM message")
def test_ctrl_c_names_the_run_too_and_a_run_without_checkpoint_is_not_offered_a_resume(tiny_base, tmp_path):
    """SIGINT (Ctrl-C) after step 3: exit 130, the same line with Ctrl-C; SIGTERM before the first
    step (no checkpoint): no resume offered, the command to start again instead; a baseline run
    stopped by SIGTERM says to run the command again."""
    import subprocess
    import sys

    from tiny_study import SELF_SIGNAL, cli_env

    study = make_study(tmp_path / "s", tiny_base)
    script = (
        "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n" + SELF_SIGNAL
    )  # a background pytest ignores SIGINT
    proc = subprocess.run(
        [sys.executable, "-c", script, "3", "SIGINT", "train", "--skip-preflight", "tiny test study"],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=300,
        cwd=study,
    )
    assert proc.returncode == 130, proc.stdout + proc.stderr
    rec = Registry(study).get("r0003")
    assert (rec.status, rec.reason) == ("interrupted", "interrupted by Ctrl-C at step 3")
    assert "run r0003 interrupted by Ctrl-C at step 3; resume with: tuneproof resume r0003" in proc.stderr.splitlines()
    assert "Ctrl-C: stopping after this step with a checkpoint (send it again to stop now)" in proc.stderr.splitlines()

    stop_early = (
        "import os, signal, sys\nimport tuneproof.training.loop as L\nfrom tuneproof.cli import main\n"
        "L.train = lambda *a, **k: os.kill(os.getpid(), signal.SIGTERM)\nmain(sys.argv[1:])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", stop_early, "train", "--skip-preflight", "tiny test study"],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=300,
        cwd=study,
    )
    assert proc.returncode == 143, proc.stdout + proc.stderr
    assert Registry(study).get("r0004").status == "interrupted"
    assert (
        "run r0004 interrupted by SIGTERM, before its first checkpoint: nothing to resume, start it again: "
        "tuneproof train --skip-preflight 'tiny test study'"
    ) in proc.stderr.splitlines()

    stop_baseline = (
        "import os, signal, sys\nimport tuneproof.evaluation.recording as C\nfrom tuneproof.cli import main\n"
        "C.predict = lambda *a, **k: os.kill(os.getpid(), signal.SIGTERM)\nmain(sys.argv[1:])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", stop_baseline, "baseline", "--study", str(study)],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=300,
    )
    assert proc.returncode == 143, proc.stdout + proc.stderr
    assert Registry(study).get("r0005").status == "interrupted"
    assert (
        f"run r0005 (baseline) interrupted by SIGTERM; recorded as interrupted, run the command again: "
        f"tuneproof baseline --study {study}"
    ) in proc.stderr.splitlines()


def test_sigterm_at_step_5_then_resume_in_new_process_is_exact(reference, interrupted, tmp_path):
    study = shutil.copytree(interrupted, tmp_path / "s")
    reg = Registry(study)
    (rec,) = reg.list(kind="train")
    assert rec.status == "interrupted" and rec.reason == "terminated (signal 15) at step 5"
    run_dir = reg.runs_dir / rec.id
    ckpt = load_checkpoint(latest_checkpoint(run_dir))
    assert (ckpt["step"], ckpt["reason"], ckpt["data"]["next_micro_batch"]) == (5, "interrupt", 10)
    assert ckpt["losses"] == reference["losses"][:5]
    assert not (run_dir / "adapter").exists()
    reg.close()

    proc = cli("resume", rec.id, "--study", str(study))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (
        f"{rec.id}: adapter runs/{rec.id}/adapter; checkpoints runs/{rec.id}/checkpoints; "
        f"metrics runs/{rec.id}/metrics.jsonl" in " ".join(proc.stdout.split())
    )
    rec = Registry(study).get(rec.id)
    assert rec.status == "completed" and rec.reason is None
    assert rec.summary["resumes"][0]["from_step"] == 5 and rec.summary["steps"] == STEPS
    events = [r for r in rows(run_dir) if r.get("event") == "resume"]
    assert events and events[0]["from_step"] == 5
    _assert_same_as_reference(run_dir, reference)


def test_resume_from_the_older_periodic_checkpoint_retrains_step_5_exactly(reference, interrupted, tmp_path, capsys):
    """What a hard kill (SIGKILL, power loss) after step 5 leaves: the periodic checkpoint of step 4
    and a metrics row for step 5; the resume trains step 5 again and ends exactly as the reference.
    (That a killed process is found stale is tested in tests/registry.) The run failed with a recorded
    gloo message, as a distributed run whose rank was killed does: resuming it crashed with Rich's
    MarkupError on "[/__w/...]"; the reason is printed as written."""
    study = shutil.copytree(interrupted, tmp_path / "s")
    run_dir = train_dir(study)
    assert [p.name for p in list_checkpoints(run_dir)] == ["step-000004", "step-000005"]
    gloo = (
        "RankFailed: rank 1 was killed by signal 9 (SIGKILL) without reporting an error; rank 0 then failed: "
        "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed "
        "by peer [127.0.0.1]:20363 [/bold]"
    )
    Registry(study).finish(run_dir.name, "failed", reason=gloo)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(["resume", run_dir.name, "--study", str(study), "--checkpoint", "step-000004"])
    out = capsys.readouterr()
    assert exit_.value.code == 0, out.out + out.err
    assert f"(failed: {gloo}) from step-000004" in " ".join(out.out.split())
    # the progress starts at the checkpoint's step; the 4 steps done before are not counted as done now
    # (a resume printed "train: 4/8 (50%) | 1173433.48 it/s" and then a rate over steps it never trained)
    assert f"train: 4/{STEPS}" not in out.out and f"train: 5/{STEPS}" in out.out
    rec = Registry(study).get(run_dir.name)
    assert rec.status == "completed" and rec.summary["resumes"][-1]["from_step"] == 4
    assert [r["step"] for r in rows(run_dir) if "loss" in r].count(5) == 2  # step 5 trained again
    _assert_same_as_reference(run_dir, reference)


def test_ctrl_c_in_process_stops_after_the_step_and_resumes_exactly(reference, tiny_base, tmp_path, monkeypatch):
    """Ctrl-C (SIGINT) during training: the step finishes, a checkpoint is written, the run is
    interrupted with its step; a second Ctrl-C in the same step stops at once (same boundary here)."""
    import os
    import signal

    import tuneproof.training.loop as loop
    from tuneproof.context import StudyContext
    from tuneproof.recipes.train import run_train

    original = loop.train

    def train(*args, **kwargs):
        def progress(step, total, loss):
            if step == 3:
                os.kill(os.getpid(), signal.SIGINT)
                os.kill(os.getpid(), signal.SIGINT)

        kwargs["progress"] = progress
        return original(*args, **kwargs)

    study = make_study(tmp_path / "s", tiny_base)
    ctx = StudyContext.open(study)
    # Ctrl-C in a terminal: Python's own handler, also when pytest runs as a background job (SIGINT ignored)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with monkeypatch.context() as m:
            m.setattr(loop, "train", train)
            with pytest.raises(KeyboardInterrupt):
                run_train(ctx)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers restored
    finally:
        signal.signal(signal.SIGINT, previous)
    (rec,) = ctx.registry.list(kind="train")
    assert rec.status == "interrupted" and rec.reason == "interrupted by Ctrl-C at step 3"
    run_dir = ctx.registry.runs_dir / rec.id
    assert [p.name for p in list_checkpoints(run_dir)] == ["step-000002", "step-000003"]
    with pytest.raises(SystemExit) as exit_:
        main(["resume", rec.id, "--study", str(study)])
    assert exit_.value.code == 0
    _assert_same_as_reference(run_dir, reference)


def test_ctrl_c_inside_a_window_stops_at_once_and_the_resume_trains_that_step_again(
    reference, tiny_base, tmp_path, monkeypatch
):
    """Ctrl-C during a micro-batch's forward/backward (a CPU step of the quickstart took 49 s): the process
    stops within the operator, not at the end of the step; the window's gradients are dropped, the last
    finished step is checkpointed, and the resume ends bit-identical to the uninterrupted run."""
    import os
    import signal
    import time

    import tuneproof.training.loop as loop
    from tuneproof.context import StudyContext
    from tuneproof.recipes.train import run_train

    original = loop._micro_loss
    calls: list[int] = []
    stamps: dict[str, float] = {}

    def slow_micro_loss(*args, **kwargs):
        calls.append(1)
        if len(calls) == 7:  # the first micro-batch of step 4 (2 per window): a slow operator, Ctrl-C inside it
            stamps["signal"] = time.perf_counter()
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(60)  # what the rest of this step would cost: never waited for
        return original(*args, **kwargs)

    study = make_study(tmp_path / "s", tiny_base)
    ctx = StudyContext.open(study)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with monkeypatch.context() as m:
            m.setattr(loop, "_micro_loss", slow_micro_loss)
            with pytest.raises(KeyboardInterrupt):
                run_train(ctx)
        waited = time.perf_counter() - stamps["signal"]
    finally:
        signal.signal(signal.SIGINT, previous)
    assert waited < 10 and len(calls) == 7  # not the 60 s operator, and no other micro-batch ran
    (rec,) = ctx.registry.list(kind="train")
    assert rec.status == "interrupted" and rec.reason == "interrupted by Ctrl-C at step 3"
    run_dir = ctx.registry.runs_dir / rec.id
    assert [p.name for p in list_checkpoints(run_dir)] == ["step-000002", "step-000003"]
    with pytest.raises(SystemExit) as exit_:
        main(["resume", rec.id, "--study", str(study)])
    assert exit_.value.code == 0
    _assert_same_as_reference(run_dir, reference)


def test_an_ignored_sigint_stays_ignored_during_training(tiny_base, tmp_path):
    """A background job (SIGINT ignored by the shell): training keeps SIGINT ignored, so a stray
    SIGINT neither stops the run nor changes it; SIGTERM is still deferred to the step boundary."""
    import signal

    from tuneproof.training.loop import _StopRequest

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with _StopRequest() as stop:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) == stop._handle
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
