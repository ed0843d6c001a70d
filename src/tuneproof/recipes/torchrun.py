"""Training and preflight past one process, under torchrun: the launcher side, the worker each rank
runs, and the save check (docs/PROTOCOL.md step 6; docs/CASES.md C1, C10, C11, C24).

Recipes (features; the study keys ``distributed.strategy``, ``distributed.backend``, ``distributed.timeout_s``):
- ``tuneproof train --nproc-per-node N [--nnodes M --node-rank K --rdzv-endpoint H:P]``
  (:func:`run_train_distributed`): :func:`tuneproof.recipes.train.run_train` on every rank, DDP or FSDP2
  (:mod:`tuneproof.training.parallel`); ``tuneproof resume`` of such a run (:func:`launch_ranks`);
- ``tuneproof preflight --nproc-per-node N`` (:func:`run_preflight_distributed`): the launch checks,
  then the checks of :mod:`tuneproof.preflight.distributed_step` (shares, DDP weights agree after 2 steps,
  FSDP2 gradients equal the single-process reference, FSDP units, per-rank peak memory), recorded in
  ``distributed_preflight.json`` and the summary; a failed check fails the run (exit 3). It does not
  replace ``tuneproof preflight`` (the single-process preflight ``train`` requires).

Engines, none home-made: ``torch.distributed.run`` (torchrun) starts the processes; the process
group, wrappers and collectives are :mod:`tuneproof.training.parallel`'s.

Who writes what. The process the user started (the launcher) checks the launch (bad input: one line,
nothing launched), creates the run, records its inputs and ``launch.json`` (torchrun command, world
layout), starts torchrun and records how the run ended: a failure on any rank marks the run failed
naming the rank and its error (``runs/<id>/rank-N.error.json``, written by the rank itself); a
collective that waits longer than ``distributed.timeout_s`` fails with a message naming the ranks that
did not answer. Inside, rank 0 alone writes the run folder (metrics, checkpoints, adapter, summary)
and the progress bar; every rank logs to ``runs/<id>/rank-N.log`` (ranks > 0 send their whole
stdout/stderr there). After training every rank takes part in gathering the adapter whole, and rank 0
checks it in a fresh process (:func:`save_and_verify`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tuneproof import procs
from tuneproof.context import StudyContext
from tuneproof.errors import CheckFailed, TuneproofError
from tuneproof.io import read_json, write_json
from tuneproof.models.build import save_trained
from tuneproof.preflight.distributed_step import RESULT, run_checks
from tuneproof.preflight.qlora import check_quant_storage
from tuneproof.preflight.reload import RELOAD_LOGIT_ATOL, reload_in_fresh_process
from tuneproof.recipes.common import record_inputs
from tuneproof.recipes.train import TrainOptions, record_start, run_train
from tuneproof.registry import Registry, Run
from tuneproof.study import STUDY_FILE, turn_off
from tuneproof.tracking import attach
from tuneproof.training.budget import micro_batches_per_epoch, optimizer_steps_per_epoch
from tuneproof.training.parallel import World, block_classes, init_world, resolve_backend
from tuneproof.training.resume_state import load_checkpoint
from tuneproof.ui import console, table, user_text

WORKER_MODULE = "tuneproof.recipes.torchrun"


class RankFailed(TuneproofError):
    """A rank of a distributed run failed (its error, or a timeout in a collective)."""

    exit_code = 1


class HealthOnRank(CheckFailed):
    """A training health rule (:mod:`tuneproof.training.health`) fired on a rank: the run is invalid."""

    def __init__(self, message: str, *, reason: str):
        self.reason = reason
        super().__init__(message, hint="the run is invalid; see runs/<id>/summary.json 'health'")


# --------------------------------------------------------------------------- launch checks (launcher side)
def devices_present() -> tuple[str, int]:
    """``("cuda", n GPUs)`` when CUDA GPUs are visible, else ``("cpu", os.cpu_count())``."""
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return "cuda", torch.cuda.device_count()
    return "cpu", os.cpu_count() or 1


def check_launch(ctx, nproc: int, nnodes: int = 1) -> dict[str, Any]:
    """Everything that can be wrong before torchrun starts; returns the world layout.

    Rules: ``nproc`` at most the GPUs present (CUDA) or the CPU cores (``os.cpu_count()``, gloo on
    CPU: one process per core); ``distributed.backend`` runnable here (nccl needs CUDA; FSDP2 on GPUs
    needs nccl); FSDP needs a model class with a known decoder block type (checked on the meta
    device, no weights read); the global batch (micro-batch x accumulation x world size) must not
    exceed the training set.

    Returns:
        ``{"world_size", "nproc_per_node", "nnodes", "backend", "strategy", "device", "devices_present",
        "global_batch", "n_train", "optimizer_steps_per_epoch", "micro_batches_per_process_per_epoch",
        "fsdp_units"}``.

    Raises:
        TuneproofError: one line naming the option or study key and what to do.
    """
    where = ctx.study_dir / STUDY_FILE
    d, t = ctx.study.distributed, ctx.study.training
    if nproc < 1 or nnodes < 1:
        raise TuneproofError(f"--nproc-per-node {nproc} / --nnodes {nnodes}: both must be >= 1")
    kind, present = devices_present()
    if nproc > present:
        what = (
            f"{present} CUDA GPU(s)" if kind == "cuda" else f"{present} CPU cores (one gloo process per core at most)"
        )
        raise TuneproofError(
            f"--nproc-per-node {nproc}: this machine has {what}", hint=f"use --nproc-per-node {present} or fewer"
        )
    backend = resolve_backend(d.backend, kind == "cuda")
    if backend == "nccl" and kind != "cuda":
        raise TuneproofError(
            f"{where}: distributed.backend nccl needs CUDA GPUs and this machine has none",
            hint="set distributed.backend: gloo (or auto)",
        )
    if d.strategy == "fsdp" and kind == "cuda" and backend != "nccl":
        raise TuneproofError(
            f"{where}: distributed.strategy fsdp on GPUs needs "
            "distributed.backend nccl (gloo has no GPU reduce-scatter)",
            hint="set distributed.backend: nccl (or auto), or distributed.strategy: ddp",
        )
    world = nproc * nnodes
    if t.bf16_base_weights and world > 1:  # the rank's loop would refuse it after the launch: refuse before
        raise TuneproofError(
            f"{where}: training.bf16_base_weights is not yet checked under "
            "DDP/FSDP (the cast would follow the wrapper)",
            hint=f"{turn_off(t, 'bf16_base_weights')} for a distributed run",
        )
    if t.chunked_loss and world > 1:  # the same: the rank's speed-up check refuses it only after the launch
        raise TuneproofError(
            f"{where}: training.chunked_loss is not yet checked under DDP/FSDP (it calls the decoder past the wrapper)",
            hint=f"{turn_off(t, 'chunked_loss')} for a distributed run",
        )
    if (
        ctx.study.method.kind == "qlora"
    ):  # a 4-bit base sharded by FSDP needs a float storage dtype (preflight/qlora.py)
        q = ctx.quantization
        c = check_quant_storage(
            q["bnb_4bit_quant_storage"], q["bnb_4bit_compute_dtype"], sharded=d.strategy == "fsdp" and world > 1
        )
        if not c["passed"]:
            raise TuneproofError(
                f"{where}: {c['message']}",
                hint="QLoRA under FSDP: bnb_4bit_quant_storage = the compute dtype "
                "(training.precision), or distributed.strategy: ddp",
            )
    units: list[str] = []
    if d.strategy == "fsdp":
        units = block_classes(meta_model(ctx))
    n = len(ctx.split("train"))
    global_batch = t.micro_batch_size * t.gradient_accumulation_steps * world
    if global_batch > n:
        raise TuneproofError(
            f"{where}: global batch {t.micro_batch_size} (training.micro_batch_size) x {t.gradient_accumulation_steps} "
            f"(gradient_accumulation_steps) x {world} processes = {global_batch} exceeds the {n} training examples",
            hint="lower training.micro_batch_size or gradient_accumulation_steps, or use fewer processes",
        )
    per_process = micro_batches_per_epoch(n, t.micro_batch_size, world)
    return {
        "world_size": world,
        "nproc_per_node": nproc,
        "nnodes": nnodes,
        "backend": backend,
        "strategy": d.strategy,
        "device": kind,
        "devices_present": present,
        "timeout_s": d.timeout_s,
        "global_batch": global_batch,
        "n_train": n,
        "micro_batches_per_process_per_epoch": per_process,
        "optimizer_steps_per_epoch": optimizer_steps_per_epoch(
            n, t.micro_batch_size, t.gradient_accumulation_steps, world
        ),
        "fsdp_units": units,
    }


def meta_model(ctx):
    """The study's model class (the Auto class of its head, :attr:`tuneproof.models.heads.Head.auto_class`)
    built on the meta device from the base's ``config.json``: no weights read, no memory.

    Raises:
        TuneproofError: transformers has no model class of that kind for this config (names the
            base, the kind and ``distributed.strategy``).
    """
    import transformers  # noqa: PLC0415 - only the FSDP launch check builds a model class

    remote = ctx.base.trust_remote_code
    cfg = transformers.AutoConfig.from_pretrained(ctx.base.path, trust_remote_code=remote)
    auto = getattr(transformers, ctx.head.auto_class)
    try:
        with torch.device("meta"):
            return auto.from_config(cfg, trust_remote_code=remote)
    except ValueError as err:  # transformers: "Unrecognized configuration class ... for this kind of AutoModel"
        raise TuneproofError(
            f"distributed.strategy fsdp: {ctx.base.path} has no {ctx.head.auto_class} model class for its config "
            f"(model.kind {ctx.model_kind}): {str(err).splitlines()[0]}",
            hint="check model.kind, or use distributed.strategy: ddp",
        ) from err


def torchrun_command(
    nproc: int, nnodes: int, node_rank: int, rdzv_endpoint: str | None, worker_args: list[str]
) -> list[str]:
    """The ``python -m torch.distributed.run`` command line: ``--standalone`` on one node without an
    endpoint (a free local port), else static rendezvous at ``rdzv_endpoint`` with ``--node-rank``."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--nnodes",
        str(nnodes),
        "--max-restarts",
        "0",
    ]
    if nnodes == 1 and not rdzv_endpoint:
        cmd.append("--standalone")
    else:
        if not rdzv_endpoint:
            raise TuneproofError(f"--nnodes {nnodes}: every node needs --rdzv-endpoint HOST:PORT (node 0's address)")
        cmd += ["--node-rank", str(node_rank), "--rdzv-endpoint", rdzv_endpoint]
    return cmd + ["-m", WORKER_MODULE, *worker_args]


def launch(cmd: list[str], run_dir: Path | None) -> int:
    """Run torchrun and wait. Its own stderr (and every rank's) goes to ``runs/<id>/launcher.log``;
    rank 0's stdout (the progress bar) reaches the terminal. Ctrl-C/SIGTERM here sends one SIGTERM to
    torchrun, which hands it to every rank (they stop at the step boundary with a checkpoint).
    Returns torchrun's exit code.

    torchrun dies with this process (``kill -9`` of it included) and each rank with torchrun: torchrun is
    started through :func:`tuneproof.procs.exec_dying_with_parent` and each rank's first act is
    :func:`tuneproof.procs.die_with_parent` (:func:`worker_main`); torchrun's pid is recorded in the run
    folder (``proc-torchrun.json``, :func:`tuneproof.procs.record`) beside each rank's."""
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE=os.environ.get("HF_HUB_OFFLINE", "1"))
    wrapped, env = procs.dying_with_parent(cmd, env)  # with this tuneproof first on PYTHONPATH, for the ranks too
    log = open(run_dir / "launcher.log", "ab") if run_dir is not None else None  # noqa: SIM115
    try:
        proc = subprocess.Popen(wrapped, env=env, stderr=log, start_new_session=True)  # noqa: S603
        if run_dir is not None:
            procs.record(run_dir, "torchrun", proc.pid)  # the wrapper's pid is torchrun's after exec
        try:
            return proc.wait()
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
    finally:
        if log is not None:
            log.close()


#: one failure in torchrun's ChildFailedError report (torch.distributed.elastic.multiprocessing.errors):
#: "time      : 2026-12-02_05:29:35", a host line, "rank      : 1 (local_rank: 1)", then
#: "exitcode  : -9 (pid: 4242)  (SIGKILL)"; the one after "Root Cause (first observed failure):" is its root cause
_TORCHRUN_FAILURE = re.compile(
    r"(?:time\s*:\s*(\S+)[ \t]*\n(?:[ \t]*host\s*:[^\n]*\n)?\s*)?"
    r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)\)[ \t]*(?:\((\w+)\))?"
)
_ROOT_CAUSE = "Root Cause (first observed failure)"

#: exits by these signals are how torchrun (or a user) stops the survivors of a failure
_STOP_EXITS = (-signal.SIGTERM, -signal.SIGINT)


def torchrun_failures(log_text: str) -> dict[int, dict[str, Any]]:
    """The ranks torchrun's elastic agent saw fail, from the ChildFailedError report it writes to
    its stderr (``runs/<id>/launcher.log``): ``{rank: {"exitcode", "pid", "signal", "time", "root"}}``;
    ``exitcode`` is negative for a rank killed by a signal (-9: SIGKILL), ``signal`` its name (None
    otherwise), ``time`` when the agent saw it (``YYYY-MM-DD_HH:MM:SS``, whole seconds; None if the report
    has none), ``root`` True for the report's root cause (its first observed failure). The agent adds
    the survivors it stopped after the first failure (SIGTERM, SIGKILL after its grace period)."""
    out: dict[int, dict[str, Any]] = {}
    root_at = log_text.rfind(_ROOT_CAUSE)
    for m in _TORCHRUN_FAILURE.finditer(log_text):
        code = int(m.group(3))
        out[int(m.group(2))] = {
            "exitcode": code,
            "pid": int(m.group(4)),
            "signal": m.group(5) if code < 0 else None,
            "time": m.group(1),
            "root": root_at >= 0 and m.start() > root_at,
        }
    return out


def _how(f: dict[str, Any]) -> str:
    """``was killed by signal 9 (SIGKILL)`` or ``exited with code 3``, from a :func:`torchrun_failures` entry."""
    if f["exitcode"] < 0:
        return f"was killed by signal {-f['exitcode']}" + (f" ({f['signal']})" if f["signal"] else "")
    return f"exited with code {f['exitcode']}"


def _silent_causes(died: dict[int, dict[str, Any]], failures: dict[int, dict[str, Any]]) -> list[int]:
    """The ranks among ``died`` (no error file) that caused the failure, not ranks stopped because of it:
    torchrun's root cause, or a death by another signal than SIGTERM/SIGINT seen in the same second as the
    first failure (a SIGKILL seen later is the agent's own after its grace period). Sorted root first."""
    times = [f["time"] for f in failures.values() if f["time"]]
    first = min(times) if times else None

    def cause(f: dict[str, Any]) -> bool:
        if f["root"]:
            return True
        return f["exitcode"] not in _STOP_EXITS and (first is None or f["time"] is None or f["time"] <= first)

    return sorted((r for r, f in died.items() if cause(f)), key=lambda r: (not died[r]["root"], r))


def rank_failure(run_dir: Path, world_size: int, timeout_s: float, log_offset: int = 0) -> tuple[str, str]:
    """Why a distributed run ended badly, from the ranks' ``rank-N.error.json`` files and torchrun's own
    report of the ranks that failed (:func:`torchrun_failures` on ``launcher.log`` from ``log_offset``,
    where this launch's output starts).

    Returns:
        ``(kind, message)``: kind ``health`` (a health rule fired on a rank), ``interrupted`` (every rank that
        wrote stopped on a signal or ``stop_after``), ``check`` (the first rank to fail was refused by a check:
        CheckFailed, exit 3: "rank N refused: ..."; its hint: :func:`rank_hint`), ``timeout`` (a rank waited
        ``timeout_s`` in a collective; the ranks that wrote nothing are named as hung) or ``failed``: a rank that
        died without a word (killed by a signal, an exit without a Python error: torchrun's report names it and
        its exit code; the survivors' errors follow from it), else the first rank to fail by time, its error
        type and message, and its log; the ranks torchrun stopped after it without a word (SIGTERM) follow it,
        never as its cause.
    """
    errors = []
    for r in range(world_size):
        p = run_dir / f"rank-{r}.error.json"
        if p.is_file():
            with contextlib.suppress(ValueError, OSError):
                errors.append(json.loads(p.read_text(encoding="utf-8")))
    silent = [r for r in range(world_size) if r not in {e["rank"] for e in errors}]
    launcher_log = ""
    with contextlib.suppress(OSError):
        with open(run_dir / "launcher.log", "rb") as f:
            f.seek(log_offset)
            launcher_log = f.read().decode("utf-8", errors="replace")
    failures = torchrun_failures(launcher_log)
    died = {r: f for r, f in failures.items() if r in silent}
    real = [e for e in errors if e["type"] not in ("KeyboardInterrupt", "Terminated")]
    causes = _silent_causes(died, failures)
    if died and (causes or not errors):
        # the causes first, then the ranks torchrun stopped (ended by SIGTERM/SIGINT last)
        order = causes + sorted(
            (k for k in died if k not in causes), key=lambda k: (died[k]["exitcode"] in _STOP_EXITS, k)
        )
        r, f = order[0], died[order[0]]
        after = []
        if real:
            first = min(real, key=lambda e: e["time"])
            after.append(f"rank {first['rank']} then failed: {first['type']}: {first['message']}")
        after += [f"rank {k} {_how(died[k])}" for k in order[1:]]
        return "failed", (
            f"rank {r} {_how(f)} without reporting an error (torchrun: exit code {f['exitcode']}, pid {f['pid']})"
            + "".join(f"; {x}" for x in after)
            + f" (logs: {run_dir / f'rank-{r}.log'}, {run_dir / 'launcher.log'})"
        )
    if not errors:
        lines = [x for x in launcher_log.splitlines() if x.strip()]
        tail = ("; last launcher line: " + lines[-1][:300]) if lines else ""
        return "failed", f"torchrun failed before any rank reported an error (see {run_dir / 'launcher.log'}){tail}"
    if all(e["type"] in ("KeyboardInterrupt", "Terminated") for e in errors):
        first = min(errors, key=lambda e: e["time"])
        return "interrupted", first["message"] or "interrupted"
    real = [e for e in errors if e["type"] not in ("KeyboardInterrupt", "Terminated")]
    first = min(real, key=lambda e: e["time"])
    if first["type"] == "HealthFault":
        return "health", f"rank {first['rank']}: {first['message']}"
    if first.get("timeout"):
        hung = (
            f"rank {', '.join(map(str, silent))} did not answer (hung or killed)" if silent else "a rank did not answer"
        )
        return "timeout", (
            f"rank {first['rank']} waited {timeout_s:g} s (distributed.timeout_s) in a collective and gave up: {hung}; "
            f"see {run_dir}/rank-N.log"
        )
    log = run_dir / f"rank-{first['rank']}.log"
    stopped = "".join(f"; rank {k} {_how(died[k])} after it" for k in sorted(died))
    if first.get("exit_code") == CheckFailed.exit_code:  # raised again as CheckFailed: its type is not repeated
        return "check", f"rank {first['rank']} refused: {first['message']}{stopped} (log: {log})"
    return "failed", f"rank {first['rank']} failed: {first['type']}: {first['message']}{stopped} (log: {log})"


def rank_hint(run_dir: Path, message: str) -> str | None:
    """The hint recorded by the rank that ``message`` (of :func:`rank_failure`) names, if it recorded one."""
    m = re.match(r"rank (\d+) ", message)
    with contextlib.suppress(ValueError, OSError, AttributeError):
        return json.loads((run_dir / f"rank-{m.group(1)}.error.json").read_text(encoding="utf-8")).get("hint")
    return None


# --------------------------------------------------------------------------- the two launches
def run_train_distributed(
    ctx: StudyContext,
    *,
    nproc: int,
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
    name: str | None = None,
    preflight_override: str | None = None,
    stop_after: int | None = None,
    order: dict | None = None,
) -> str:
    """``tuneproof train --nproc-per-node N``: check the launch (nothing is created when refused), create
    the run, record its inputs, and run :func:`~tuneproof.recipes.train.run_train` on every rank under torchrun.
    On a node other than node 0 (``node_rank > 0``) no run is created: its ranks join node 0's run.
    ``order``: the protocol gates the caller checked (:func:`~tuneproof.recipes.protocol.require_order`),
    recorded in the summary.

    Raises:
        TuneproofError: a launch that cannot work (one line, nothing launched).
        RankFailed: a rank failed (named with its error) or a collective timed out.
    """
    layout = check_launch(ctx, nproc, nnodes)
    launch_opts = {"nproc": nproc, "nnodes": nnodes, "node_rank": node_rank, "rdzv_endpoint": rdzv_endpoint}
    if node_rank > 0:
        launch_ranks(ctx, None, layout, launch_opts)
        return "(joined node 0's run)"
    try:
        with ctx.registry.run("train", name=name) as run:
            record_start(ctx, run)
            if preflight_override:
                run.update_summary(preflight_override=preflight_override)
            if order:
                run.update_summary(**order)
            launch_ranks(ctx, run, layout, launch_opts, stop_after=stop_after)
            return run.id
    except HealthOnRank as fault:  # a diverged or stalled run is invalid, not failed
        ctx.registry.invalidate(run.id, fault.reason)
        raise


def launch_ranks(
    ctx: StudyContext,
    run,
    layout: dict[str, Any],
    opts: dict[str, Any],
    *,
    resume_path: Path | None = None,
    stop_after: int | None = None,
) -> None:
    """Start torchrun with one rank of this recipe per process, wait, and turn a bad end into an error:
    ``KeyboardInterrupt`` (interrupted: the ranks stopped at a step boundary with a checkpoint),
    :class:`HealthOnRank` (a health rule fired on a rank: the run is invalid) or :class:`RankFailed`
    naming the rank."""
    worker = ["train", "--study", str(ctx.study_dir)] + (["--data", str(ctx.data_root)] if ctx.data_root else [])
    if run is not None:
        worker += ["--run-id", run.id]
    if resume_path is not None:
        worker += ["--resume", str(resume_path)]
    if stop_after is not None:
        worker += ["--stop-after", str(stop_after)]
    cmd = torchrun_command(opts["nproc"], opts["nnodes"], opts["node_rank"], opts["rdzv_endpoint"], worker)
    if run is None:
        rc = launch(cmd, None)
        if rc:
            raise RankFailed(
                f"torchrun exited with code {rc} on node {opts['node_rank']}",
                hint="see node 0's run folder and this node's output",
            )
        return
    for old in run.dir.glob("rank-*.error.json"):  # a previous attempt's (resume)
        old.unlink()
    run.write_json("launch.json", {"command": cmd, "layout": layout, **opts})
    run.update_summary(
        world_size=layout["world_size"],
        strategy=layout["strategy"],
        backend=layout["backend"],
        global_batch=layout["global_batch"],
        optimizer_steps_per_epoch=layout["optimizer_steps_per_epoch"],
        micro_batches_per_process_per_epoch=layout["micro_batches_per_process_per_epoch"],
    )
    console.print(
        f"[bold]{run.id}[/] launching {layout['world_size']} processes ({layout['strategy']}, {layout['backend']}): "
        f"global batch {layout['global_batch']}, {layout['optimizer_steps_per_epoch']} optimizer steps per epoch; "
        f"rank logs in {user_text(run.dir)}/rank-N.log",
        soft_wrap=True,
    )
    log = run.dir / "launcher.log"
    offset = log.stat().st_size if log.exists() else 0  # a resume appends: this launch's report starts here
    try:
        rc = launch(cmd, run.dir)
    finally:
        run.summary = dict(ctx.registry.get(run.id).summary)  # what rank 0 recorded (last_step, losses...)
    if rc == 0:
        return
    kind, message = rank_failure(run.dir, layout["world_size"], layout["timeout_s"], offset)
    if kind == "interrupted":
        raise KeyboardInterrupt(message)
    if kind == "health":
        h = run.summary.get("health") or {}
        raise HealthOnRank(message, reason=f"step {h['step']}: {h['rule']}: {h['detail']}" if h else message)
    if kind == "check":
        raise CheckFailed(message, hint=rank_hint(run.dir, message))
    raise RankFailed(message)


def run_preflight_distributed(
    ctx: StudyContext, *, nproc: int, nnodes: int = 1, node_rank: int = 0, rdzv_endpoint: str | None = None
) -> str:
    """``tuneproof preflight --nproc-per-node N``: the distributed checks on the real world size, before the
    rental hours of a multi-GPU run are spent (see the module docstring); returns the run id.

    Raises:
        TuneproofError: a launch that cannot work (nothing launched).
        RankFailed: a rank failed or a collective timed out (the run is failed, the rank named).
        CheckFailed: a check failed (exit 3).
    """
    layout = check_launch(ctx, nproc, nnodes)
    worker = ["preflight", "--study", str(ctx.study_dir)] + (["--data", str(ctx.data_root)] if ctx.data_root else [])
    if node_rank > 0:
        rc = launch(torchrun_command(nproc, nnodes, node_rank, rdzv_endpoint, worker), None)
        if rc:
            raise RankFailed(f"torchrun exited with code {rc} on node {node_rank}", hint="see node 0's run folder")
        return "(joined node 0's preflight)"
    with ctx.registry.run("preflight", name="distributed") as run:
        record_inputs(ctx, run)
        cmd = torchrun_command(nproc, nnodes, node_rank, rdzv_endpoint, worker + ["--run-id", run.id])
        run.write_json(
            "launch.json",
            {
                "command": cmd,
                "layout": layout,
                "nproc": nproc,
                "nnodes": nnodes,
                "node_rank": node_rank,
                "rdzv_endpoint": rdzv_endpoint,
            },
        )
        run.update_summary(
            distributed=True,
            world_size=layout["world_size"],
            strategy=layout["strategy"],
            backend=layout["backend"],
            launch=" ".join(cmd),
        )
        console.print(
            f"[bold]{run.id}[/] distributed preflight on {layout['world_size']} processes ({layout['backend']})"
        )
        rc = launch(cmd, run.dir)
        if rc != 0:
            kind, message = rank_failure(run.dir, layout["world_size"], layout["timeout_s"])
            if kind == "interrupted":
                raise KeyboardInterrupt(message)
            if kind == "check":
                raise CheckFailed(message, hint=rank_hint(run.dir, message))
            raise RankFailed(message)
        checks = read_json(run.dir / RESULT)["checks"]
        console.print(
            table(
                f"distributed preflight {run.id}",
                ["check", "result", "details"],
                [[c["name"], "pass" if c["passed"] else "FAIL", user_text(c["message"])] for c in checks],
            )
        )
        failed = [c for c in checks if not c["passed"]]
        run.update_summary(passed=not failed, checks={c["name"]: c["passed"] for c in checks})
        if failed:
            raise CheckFailed(
                f"distributed preflight: {len(failed)} check(s) failed: {failed[0]['name']}: {failed[0]['message']}",
                hint=f"see {run.dir / RESULT}",
            )
        return run.id


# --------------------------------------------------------------------------- inside each rank
def save_and_verify(
    ctx, run, model, world: World, n_examples: int = 4, frozen_before: dict | None = None
) -> dict[str, Any] | None:
    """Save the trained adapter (or full model) once, whole, and check it (docs/CASES.md C24).

    Every rank takes part in gathering the whole tensors (``get_model_state_dict(full_state_dict=True,
    cpu_offload=True)``) and in the trained model's forward on ``n_examples`` evaluation prompts
    (collective under FSDP2); rank 0 writes the PEFT folder from the gathered tensors, then checks:
    every saved tensor has the full shape of the parameter it stores; no ``lora_B`` is all zeros; a
    fresh single process loads base + saved adapter and its top-5 next-token logits on the same
    prompts equal the trained model's (ids equal, values within ``RELOAD_LOGIT_ATOL``); with
    ``frozen_before`` (:func:`~tuneproof.training.parallel.param_signature` before training), no frozen
    weight changed. The result is ``runs/<id>/save_check.json`` and the ``save_check`` summary entry.

    Returns:
        The check on rank 0, None on the other ranks.

    Raises:
        CheckFailed: a tensor of the wrong shape, an all-zero ``lora_B``, or different logits.
    """
    from safetensors import safe_open  # noqa: PLC0415 - safetensors loads only when save_and_verify() runs

    full = world.full_state(model)  # rank 0: whole tensors; others: {}
    examples = ctx.eval_examples()[:n_examples]
    fsdp = world.strategy == "fsdp"
    scores = ctx.modality.scores(ctx, world.wrapped if fsdp else model, examples) if (fsdp or world.is_main) else None
    if not world.is_main:
        return None
    kind = ctx.study.method.kind
    if kind == "full":
        names = {n for n, _ in model.named_parameters()}
        state = {k: v for k, v in full.items() if k in names or k in dict(model.named_buffers())}
    else:
        state = full
    folder = save_trained(model, run.dir, kind, ctx.tokenizer, ctx.base.identity(), state_dict=state)
    file = folder / ("model.safetensors" if kind == "full" else "adapter_model.safetensors")
    problems: list[str] = []
    saved_shapes: dict[str, list[int]] = {}
    zero_b: list[str] = []
    n_b = 0
    with safe_open(str(file), framework="pt") as fh:
        for key in fh.keys():  # noqa: SIM118
            t = fh.get_tensor(key)
            saved_shapes[key] = list(t.shape)
            if "lora_B" in key:
                n_b += 1
                if not bool(t.any()):
                    zero_b.append(key)
    expected = {k.replace(".default", ""): list(v.shape) for k, v in full.items()}
    for key, shape in saved_shapes.items():
        want = expected.get(key) or expected.get(key.replace("base_model.model.", "", 1))
        if want is None:
            want = next((s for k, s in expected.items() if k.endswith(key) or key.endswith(k)), None)
        if want is not None and shape != want:
            problems.append(f"{key}: saved shape {shape}, the parameter is {want}")
        if 0 in shape:
            problems.append(f"{key}: empty tensor {shape}")
    frozen_changed: list[str] = []
    if frozen_before:
        for name, (s0, q0) in frozen_before.items():
            t = full.get(name)
            if t is None:
                continue
            t = t.double()
            s1, q1 = float(t.sum()), float((t * t).sum())
            if abs(s1 - s0) > 1e-9 * max(1.0, abs(s0)) or abs(q1 - q0) > 1e-9 * max(1.0, q0):
                frozen_changed.append(name)
        if frozen_changed:
            problems.append(f"{len(frozen_changed)} frozen tensors changed in training (e.g. {frozen_changed[0]})")
    if zero_b:
        problems.append(f"{len(zero_b)} of {n_b} lora_B tensors are all zeros (e.g. {zero_b[0]})")
    child = reload_in_fresh_process(
        ctx, run.path("save-check"), folder, "model" if kind == "full" else "adapter", examples
    )
    worst, ids_equal = 0.0, True
    for mine, theirs in zip(scores, child["scores"]):
        ids_equal &= [i for i, _ in mine] == [i for i, _ in theirs]
        worst = max(worst, max(abs(a[1] - b[1]) for a, b in zip(mine, theirs)))
    if not ids_equal or worst > RELOAD_LOGIT_ATOL:
        problems.append(
            f"reloaded in a fresh process, the logits differ from the trained model's (max |diff| {worst:.2e}, "
            f"top-5 ids {'equal' if ids_equal else 'differ'})"
        )
    check = {
        "passed": not problems,
        "problems": problems,
        "file": str(file.name),
        "tensors": len(saved_shapes),
        "lora_B": n_b,
        "lora_B_all_zero": len(zero_b),
        "examples": len(examples),
        "max_abs_logit_diff": worst,
        "top5_ids_equal": ids_equal,
        "atol": RELOAD_LOGIT_ATOL,
        "frozen_checked": len(frozen_before or {}),
        "frozen_changed": len(frozen_changed),
        "world_size": world.world_size,
        "strategy": world.strategy,
        "reload_seconds": round(child["seconds"], 2),
        "shapes": saved_shapes,
    }
    run.write_json("save_check.json", check)
    run.update_summary(save_check={k: v for k, v in check.items() if k != "shapes"})
    world.log(
        f"save check: {'passed' if check['passed'] else 'FAILED'}: "
        f"{len(saved_shapes)} tensors, max |logit diff| {worst:.2e}"
    )
    if problems:
        raise CheckFailed(
            f"the saved {'model' if kind == 'full' else 'adapter'} is not the trained one: {problems[0]}",
            hint=f"see {run.path('save_check.json')}",
        )
    return check


def _is_timeout(err: BaseException) -> bool:
    text = f"{type(err).__name__} {err}".lower()
    return "timed out" in text or "timeout" in text or "deadline" in text


def write_error(run_dir: Path, rank: int, err: BaseException) -> None:
    """``runs/<id>/rank-N.error.json``: what this rank died of (read by the launcher)."""
    first = str(err).strip().splitlines()[0] if str(err).strip() else ""
    write_json(
        run_dir / f"rank-{rank}.error.json",
        {
            "rank": rank,
            "type": type(err).__name__,
            "message": first[:500],
            "timeout": _is_timeout(err),
            "time": time.time(),
            # a check that refused (CheckFailed, exit 3) stays one after the launch, with its hint
            "exit_code": getattr(err, "exit_code", None),
            "hint": getattr(err, "hint", None),
            "traceback": "".join(traceback.format_exception(type(err), err, err.__traceback__))[-4000:],
        },
    )


def _open_log(world: World, run_dir: Path) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    world.log_path = run_dir / f"rank-{world.rank}.log"
    world._log = open(world.log_path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115
    if world.rank != 0:  # ranks > 0: the whole output goes to the log, the terminal shows rank 0 only
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(world._log.fileno(), 1)
        os.dup2(world._log.fileno(), 2)


def worker_main(argv: list[str] | None = None) -> int:
    """``python -m tuneproof.recipes.torchrun train|preflight --study DIR --run-id ID [--data D] [--resume CKPT]
    [--stop-after K]``: one rank of ``tuneproof train`` (or of the distributed preflight,
    :mod:`tuneproof.preflight.distributed_step`) under torchrun, started by the launcher."""
    ap = argparse.ArgumentParser(prog=WORKER_MODULE)
    ap.add_argument("command", choices=["train", "preflight"])
    ap.add_argument("--study", required=True)
    ap.add_argument("--data")
    ap.add_argument("--run-id", dest="run")
    ap.add_argument("--resume")
    ap.add_argument("--stop-after", type=int)
    args = ap.parse_args(argv)
    procs.die_with_parent()  # the launcher killed (kill -9 included) kills torchrun, and torchrun this rank
    warnings.filterwarnings("ignore")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    study_dir = Path(args.study).resolve()
    rank = int(os.environ.get("RANK", "0"))
    run_dir: Path | None = (study_dir / "runs" / args.run) if args.run else None
    world = None
    run = None
    try:
        config = json.loads((run_dir / "config.json").read_text(encoding="utf-8")) if run_dir is not None else None
        ctx = StudyContext.open(study_dir, args.data, config=config)
        world = init_world(ctx.study.distributed)
        run_id = world.broadcast(args.run)  # nodes other than node 0 learn the run id here
        run_dir = study_dir / "runs" / run_id
        if config is None:
            ctx = StudyContext.open(study_dir, args.data)
        _open_log(world, run_dir)
        with contextlib.suppress(OSError):  # resume refuses while a process of the run lives
            procs.record(run_dir, f"rank-{world.rank}")
        world.log(
            f"start: world size {world.world_size}, local rank {world.local_rank}, backend {world.backend}, "
            f"strategy {world.strategy}, pid {os.getpid()}"
        )
        if world.is_main:
            reg = Registry(study_dir)
            attach(reg, ctx.study, study_dir, ctx.config)  # each step goes to the tracker run the launcher opened
            run = Run(reg, reg.get(run_id))
            run.summary = dict(reg.get(run_id).summary)
        resume = None
        if args.resume:
            resume = world.broadcast(load_checkpoint(Path(args.resume)) if world.is_main else None)
        if args.command == "preflight":
            checks = run_checks(ctx, world, run)
            if run is not None:
                run.write_json(RESULT, {"checks": checks, "world_size": world.world_size, "backend": world.backend})
            world.log("end: preflight checks done")
            return 0

        def save_ranks(run, model, frozen_before):
            return save_and_verify(ctx, run, model, world, frozen_before=frozen_before)

        run_train(
            ctx,
            TrainOptions(stop_after=args.stop_after),
            run=run,
            resume_from=resume,
            world=world,
            save_ranks=save_ranks,
        )
        world.log("end: completed")
        # leave together: no rank tears its process group down while rank 0 still saves and checks the adapter
        with contextlib.suppress(Exception):
            dist.barrier()
        return 0
    except BaseException as err:
        if run is not None:  # rank 0: persist what the loop kept in memory (last_step) for the launcher's record
            with contextlib.suppress(Exception):
                run.update_summary()
        if run_dir is not None:
            with contextlib.suppress(Exception):
                write_error(run_dir, rank, err)
        if world is not None:
            world.log(f"error: {type(err).__name__}: {err}\n{traceback.format_exc()}")
        if isinstance(err, KeyboardInterrupt):
            return 130
        if isinstance(err, TuneproofError):
            sys.stderr.write(f"rank {rank}: error: {err}\n")
            return err.exit_code
        raise
    finally:
        if dist.is_available() and dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(worker_main())
