"""Training past one process: DDP or FSDP2 under torchrun (protocol step 6; CASES C1, C10, C11, C24).

Engines, none home-made: ``torch.distributed.run`` (torchrun) starts the processes;
``torch.distributed`` gives the process group and the collectives (``all_reduce``,
``all_gather_object``, ``broadcast_object_list``); ``DistributedDataParallel`` or FSDP2
(``torch.distributed.fsdp.fully_shard``, one unit per decoder block + the root) wrap the model;
``torch.distributed.checkpoint.state_dict`` (``get_model_state_dict`` / ``get_optimizer_state_dict``
with ``full_state_dict=True, cpu_offload=True``) gathers whole tensors for saving.

Who writes what. The process the user started (the launcher) checks the launch (bad input: one line,
nothing launched), creates the run, records its inputs and ``launch.json`` (torchrun command, world
layout), starts torchrun and records how the run ended: a failure on any rank marks the run failed
naming the rank and its error (``runs/<id>/rank-N.error.json``, written by the rank itself); a
collective that waits longer than ``distributed.timeout_s`` fails with a message naming the ranks that
did not answer. Inside, rank 0 alone writes the run folder (metrics, checkpoints, adapter, summary)
and the progress bar; every rank logs to ``runs/<id>/rank-N.log`` (ranks > 0 send their whole
stdout/stderr there).

Numbers every rank agrees on. Each rank reads its ``DistributedSampler`` share
(:mod:`tuneproof.training.data_order`, ``set_epoch`` each epoch); an optimizer step consumes the
global batch ``micro_batch_size x gradient_accumulation_steps x world_size``. The supervised token
count of the window is all-reduced (SUM) before the backward pass, so every rank divides its summed
token loss by the *global* count; DDP and FSDP2 then average the gradients over ranks, so the loss is
multiplied by the world size first: the result is the gradient of the per-token mean over the global
window, equal to one process on the concatenated batch (C1 across ranks).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tuneproof.errors import CheckFailed, TuneproofError

WORKER_MODULE = "tuneproof.training.ddp"
LOGIT_ATOL = 1e-4  # fp32 logits of the trained model vs the reloaded adapter (fresh process)


class RankFailed(TuneproofError):
    """A rank of a distributed run failed (its error, or a timeout in a collective)."""

    exit_code = 1


class HealthOnRank(CheckFailed):
    """A training health rule (:mod:`tuneproof.training.health`) fired on a rank: the run is invalid."""

    def __init__(self, message: str, *, reason: str):
        self.reason = reason
        super().__init__(message, hint="the run is invalid; see runs/<id>/summary.json 'health'")


# --------------------------------------------------------------------------- launch checks (launcher side)
def resolve_backend(backend: str, cuda: bool) -> str:
    """``auto`` -> ``nccl`` on CUDA GPUs, ``gloo`` on CPU; an explicit choice is kept."""
    return ("nccl" if cuda else "gloo") if backend == "auto" else backend


def block_classes(model) -> list[str]:
    """Decoder-block class names of a transformers model (its ``_no_split_modules``, the blocks
    accelerate and transformers never split across devices) that occur in ``model``; PEFT wrappers
    are looked through. These are the FSDP2 units (one ``fully_shard`` per block, then the root).

    Raises:
        TuneproofError: the model class declares no block type, or none of its blocks is present.
    """
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    declared = list(getattr(inner, "_no_split_modules", None) or [])
    present = {type(m).__name__ for m in inner.modules()}
    found = [c for c in declared if c in present]
    if not found:
        raise TuneproofError(f"distributed.strategy fsdp: the model class {type(inner).__name__} declares no decoder block type "
                             f"(_no_split_modules: {declared or 'none'}), so FSDP has no units to shard",
                             hint="use distributed.strategy: ddp for this model")
    return found


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
    from tuneproof.study import STUDY_FILE  # noqa: PLC0415
    from tuneproof.training.data_order import micro_batches_per_epoch, optimizer_steps_per_epoch  # noqa: PLC0415

    where = ctx.study_dir / STUDY_FILE
    d, t = ctx.study.distributed, ctx.study.training
    if nproc < 1 or nnodes < 1:
        raise TuneproofError(f"--nproc-per-node {nproc} / --nnodes {nnodes}: both must be >= 1")
    kind, present = devices_present()
    if nproc > present:
        what = f"{present} CUDA GPU(s)" if kind == "cuda" else f"{present} CPU cores (one gloo process per core at most)"
        raise TuneproofError(f"--nproc-per-node {nproc}: this machine has {what}", hint=f"use --nproc-per-node {present} or fewer")
    backend = resolve_backend(d.backend, kind == "cuda")
    if backend == "nccl" and kind != "cuda":
        raise TuneproofError(f"{where}: distributed.backend nccl needs CUDA GPUs and this machine has none",
                             hint="set distributed.backend: gloo (or auto)")
    if d.strategy == "fsdp" and kind == "cuda" and backend != "nccl":
        raise TuneproofError(f"{where}: distributed.strategy fsdp on GPUs needs distributed.backend nccl (gloo has no GPU reduce-scatter)",
                             hint="set distributed.backend: nccl (or auto), or distributed.strategy: ddp")
    world = nproc * nnodes
    if t.bf16_base_weights and world > 1:  # the rank's loop would refuse it after the launch: refuse before
        raise TuneproofError(f"{where}: training.bf16_base_weights is not yet checked under DDP/FSDP (the cast would follow the wrapper)",
                             hint="set training.bf16_base_weights: false for a distributed run")
    if ctx.study.method.kind == "qlora":  # a 4-bit base sharded by FSDP needs a float storage dtype (preflight/qlora.py)
        from tuneproof.preflight.qlora import check_quant_storage  # noqa: PLC0415

        q = ctx.quantization
        c = check_quant_storage(q["bnb_4bit_quant_storage"], q["bnb_4bit_compute_dtype"], sharded=d.strategy == "fsdp" and world > 1)
        if not c["passed"]:
            raise TuneproofError(f"{where}: {c['message']}", hint="QLoRA under FSDP: bnb_4bit_quant_storage = the compute dtype "
                                                                   "(training.precision), or distributed.strategy: ddp")
    units: list[str] = []
    if d.strategy == "fsdp":
        units = block_classes(meta_model(ctx))
    n = len(ctx.split("train"))
    global_batch = t.micro_batch_size * t.gradient_accumulation_steps * world
    if global_batch > n:
        raise TuneproofError(f"{where}: global batch {t.micro_batch_size} (training.micro_batch_size) x {t.gradient_accumulation_steps} "
                             f"(gradient_accumulation_steps) x {world} processes = {global_batch} exceeds the {n} training examples",
                             hint="lower training.micro_batch_size or gradient_accumulation_steps, or use fewer processes")
    per_process = micro_batches_per_epoch(n, t.micro_batch_size, world)
    return {"world_size": world, "nproc_per_node": nproc, "nnodes": nnodes, "backend": backend, "strategy": d.strategy,
            "device": kind, "devices_present": present, "timeout_s": d.timeout_s, "global_batch": global_batch, "n_train": n,
            "micro_batches_per_process_per_epoch": per_process,
            "optimizer_steps_per_epoch": optimizer_steps_per_epoch(n, t.micro_batch_size, t.gradient_accumulation_steps, world),
            "fsdp_units": units}


def meta_model(ctx):
    """The study's model class built on the meta device (no weights read, no memory), with the method applied."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification  # noqa: PLC0415

    cfg = AutoConfig.from_pretrained(ctx.base.path)
    auto = AutoModelForSequenceClassification if ctx.model_kind == "sequence-classification" else AutoModelForCausalLM
    with torch.device("meta"):
        return auto.from_config(cfg)


def torchrun_command(nproc: int, nnodes: int, node_rank: int, rdzv_endpoint: str | None, worker_args: list[str]) -> list[str]:
    """The ``python -m torch.distributed.run`` command line: ``--standalone`` on one node without an
    endpoint (a free local port), else static rendezvous at ``rdzv_endpoint`` with ``--node-rank``."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--nnodes", str(nnodes), "--max-restarts", "0"]
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
    Returns torchrun's exit code."""
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE=os.environ.get("HF_HUB_OFFLINE", "1"))
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    log = open(run_dir / "launcher.log", "ab") if run_dir is not None else None  # noqa: SIM115
    try:
        proc = subprocess.Popen(cmd, env=env, stderr=log, start_new_session=True)  # noqa: S603
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


def rank_failure(run_dir: Path, world_size: int, timeout_s: float) -> tuple[str, str]:
    """Why a distributed run ended badly, from the ranks' ``rank-N.error.json`` files.

    Returns:
        ``(kind, message)``: kind ``health`` (a health rule fired on a rank), ``interrupted`` (every rank that wrote stopped on a signal or
        ``stop_after``), ``timeout`` (a rank waited ``timeout_s`` in a collective; the ranks that wrote
        nothing are named as hung) or ``failed`` (the first rank to fail by time, its error type and
        message, and its log).
    """
    errors = []
    for r in range(world_size):
        p = run_dir / f"rank-{r}.error.json"
        if p.is_file():
            with contextlib.suppress(ValueError, OSError):
                errors.append(json.loads(p.read_text(encoding="utf-8")))
    silent = [r for r in range(world_size) if r not in {e["rank"] for e in errors}]
    if not errors:
        tail = ""
        with contextlib.suppress(OSError):
            lines = [x for x in (run_dir / "launcher.log").read_text(encoding="utf-8", errors="replace").splitlines() if x.strip()]
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
        hung = f"rank {', '.join(map(str, silent))} did not answer (hung or killed)" if silent else "a rank did not answer"
        return "timeout", (f"rank {first['rank']} waited {timeout_s:g} s (distributed.timeout_s) in a collective and gave up: {hung}; "
                           f"see {run_dir}/rank-N.log")
    return "failed", f"rank {first['rank']} failed: {first['type']}: {first['message']} (log: {run_dir / ('rank-%d.log' % first['rank'])})"


# --------------------------------------------------------------------------- inside each rank
@dataclass
class World:
    """This process's place in the distributed run, and the few collectives the loop needs.

    ``wrapped`` is the module the forward/backward goes through: the ``DistributedDataParallel``
    wrapper, or the model itself after FSDP2's in-place ``fully_shard``.
    """

    rank: int
    world_size: int
    local_rank: int
    backend: str
    strategy: str
    timeout_s: float
    wrapped: Any = None
    log_path: Path | None = None
    _log: Any = field(default=None, repr=False)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def comm_device(self) -> torch.device:
        return torch.device("cuda", self.local_rank) if self.backend == "nccl" else torch.device("cpu")

    def sum(self, *values: float) -> list[float]:
        """All-reduce (SUM over ranks) of a few numbers, in float64; every rank gets the totals."""
        import torch.distributed as dist  # noqa: PLC0415

        t = torch.tensor(values, dtype=torch.float64, device=self.comm_device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return [float(v) for v in t.cpu()]

    def gather(self, obj: Any) -> list[Any]:
        """``all_gather_object``: one entry per rank, in rank order."""
        import torch.distributed as dist  # noqa: PLC0415

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (``broadcast_object_list``)."""
        import torch.distributed as dist  # noqa: PLC0415

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        import torch.distributed as dist  # noqa: PLC0415

        dist.barrier()

    def no_sync(self, last: bool):
        """DDP: skip the gradient all-reduce on all but the last micro-batch of a window (same result,
        less traffic). FSDP2 reduces every micro-batch (correct either way)."""
        if self.strategy == "ddp" and not last and hasattr(self.wrapped, "no_sync"):
            return self.wrapped.no_sync()
        return contextlib.nullcontext()

    # ----------------------------------------------------------------- whole tensors for saving
    def full_state(self, model) -> dict[str, torch.Tensor]:
        """Every tensor of the model, whole (un-sharded), on CPU; only rank 0 gets them (the others an
        empty dict). Collective under FSDP2: every rank must call it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict  # noqa: PLC0415

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def trainable_state(self, model) -> dict[str, torch.Tensor]:
        """The trainable tensors (names as in one process), whole, on CPU; rank 0 only."""
        names = {n for n, p in model.named_parameters() if p.requires_grad}
        full = self.full_state(model)
        return {k: v for k, v in full.items() if k in names}

    def optimizer_state(self, model, optimizer) -> dict[str, Any]:
        """The optimizer state to checkpoint: DDP's replicas agree, so the local ``state_dict()``;
        FSDP2's moments are sharded, so the whole state keyed by parameter name (rank 0 only)."""
        if self.strategy != "fsdp":
            return optimizer.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict  # noqa: PLC0415

        return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def restore(self, model, optimizer, scheduler, ckpt: dict[str, Any]) -> None:
        """Load a checkpoint written by a run of the same world size: weights and optimizer (FSDP2:
        ``set_model_state_dict``/``set_optimizer_state_dict`` shard the whole tensors), scheduler, and
        this rank's own RNG states."""
        from tuneproof.training.loop import restore_state, set_rng_state  # noqa: PLC0415

        if self.strategy != "fsdp":
            restore_state(model, optimizer, scheduler, ckpt)
        else:
            from torch.distributed.checkpoint.state_dict import (  # noqa: PLC0415
                StateDictOptions, set_model_state_dict, set_optimizer_state_dict)

            opts = StateDictOptions(full_state_dict=True, strict=False)
            set_model_state_dict(model, ckpt["trainable"], options=opts)
            set_optimizer_state_dict(model, optimizer, ckpt["optimizer"], options=StateDictOptions(full_state_dict=True))
            scheduler.load_state_dict(ckpt["scheduler"])
        set_rng_state(ckpt["rng_ranks"][self.rank])

    # ----------------------------------------------------------------- logs
    def log(self, message: str) -> None:
        """One line in ``runs/<id>/rank-N.log``."""
        if self._log is not None:
            self._log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} rank {self.rank}: {message}\n")
            self._log.flush()


def share_report(world: World, read: list[int], n: int) -> dict[str, Any] | None:
    """What the ranks actually read in the first epoch (C10), gathered on every rank: the example
    indices of each rank, whether they are disjoint (apart from the repeats ``DistributedSampler``
    adds to even out the shares: ``ceil(n / world_size) * world_size - n`` of them) and whether
    together they cover all ``n`` examples (only once a whole epoch was read).

    Returns:
        ``{"per_rank": [count...], "overlap": k, "padding_repeats": p, "disjoint": bool,
        "covered": m, "n": n, "epoch_complete": bool}``.
    """
    shares = world.gather(sorted(set(read)))
    sets = [set(x) for x in shares]
    total = sum(len(x) for x in sets)
    union = set().union(*sets)
    pad = math.ceil(n / world.world_size) * world.world_size - n
    overlap = total - len(union)
    complete = len(union) == n
    return {"per_rank": [len(x) for x in sets], "overlap": overlap, "padding_repeats": pad, "disjoint": overlap <= pad,
            "covered": len(union), "n": n, "epoch_complete": complete}


def param_signature(model) -> dict[str, tuple[float, float]]:
    """Per frozen parameter: (float64 sum, float64 sum of squares), to tell after training that the
    frozen weights did not change (C11) without keeping a copy of them. Call before wrapping."""
    out = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not p.requires_grad:
                t = p.detach().double()
                out[name] = (float(t.sum()), float((t * t).sum()))
    return out


def normalisation(world: World | None) -> str:
    """The loss normalisation a run used, with its world size (recorded in the summary)."""
    from tuneproof.training.loss import NORMALISATION  # noqa: PLC0415

    if world is None or world.world_size == 1:
        return NORMALISATION
    return (f"per-token mean over the global accumulation window: sum of token losses / supervised tokens, both summed over "
            f"{world.world_size} processes (all_reduce); backward of loss x {world.world_size} because {world.strategy.upper()} "
            f"averages gradients over the {world.world_size} ranks")


def wrap(model, world: World):
    """Wrap ``model`` (already on its device) for ``world.strategy``; sets and returns ``world.wrapped``.

    ddp: ``DistributedDataParallel`` (rank 0's weights broadcast at construction). fsdp: FSDP2
    ``fully_shard`` on each decoder block (:func:`block_classes`), then on the root; parameters are
    sharded one by one, so blocks mixing frozen base weights and LoRA weights are fine (C11).
    """
    if world.strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel  # noqa: PLC0415

        ids = [world.local_rank] if world.backend == "nccl" else None
        world.wrapped = DistributedDataParallel(model, device_ids=ids)
        return world.wrapped
    from torch.distributed.fsdp import fully_shard  # noqa: PLC0415

    names = set(block_classes(model))
    units = [m for m in model.modules() if type(m).__name__ in names]
    for m in units:
        fully_shard(m)
    fully_shard(model)
    world.wrapped = model
    world.log(f"FSDP2: {len(units)} block units ({', '.join(sorted(names))}) + root")
    return model


def save_and_verify(ctx, run, model, world: World, n_examples: int = 4, frozen_before: dict | None = None) -> dict[str, Any] | None:
    """Save the trained adapter (or full model) once, whole, and check it (C24).

    Every rank takes part in gathering the whole tensors (``get_model_state_dict(full_state_dict=True,
    cpu_offload=True)``) and in the trained model's forward on ``n_examples`` evaluation prompts
    (collective under FSDP2); rank 0 writes the PEFT folder from the gathered tensors, then checks:
    every saved tensor has the full shape of the parameter it stores; no ``lora_B`` is all zeros; a
    fresh single process loads base + saved adapter and its top-5 next-token logits on the same
    prompts equal the trained model's (ids equal, values within ``LOGIT_ATOL``); with
    ``frozen_before`` (:func:`param_signature` before training), no frozen weight changed. The result is
    ``runs/<id>/save_check.json`` and the ``save_check`` summary entry.

    Returns:
        The check on rank 0, None on the other ranks.

    Raises:
        CheckFailed: a tensor of the wrong shape, an all-zero ``lora_B``, or different logits.
    """
    from safetensors import safe_open  # noqa: PLC0415

    from tuneproof.evaluation.scores import logit_scores  # noqa: PLC0415
    from tuneproof.preflight.reload import reload_in_fresh_process  # noqa: PLC0415
    from tuneproof.models.build import save_trained  # noqa: PLC0415

    full = world.full_state(model)  # rank 0: whole tensors; others: {}
    examples = ctx.eval_examples()[:n_examples]
    scores = logit_scores(ctx, world.wrapped if world.strategy == "fsdp" else model, examples) if (world.strategy == "fsdp" or world.is_main) else None
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
    child = reload_in_fresh_process(ctx, run.path("save-check"), folder, "model" if kind == "full" else "adapter", examples)
    worst, ids_equal = 0.0, True
    for mine, theirs in zip(scores, child["scores"]):
        ids_equal &= [i for i, _ in mine] == [i for i, _ in theirs]
        worst = max(worst, max(abs(a[1] - b[1]) for a, b in zip(mine, theirs)))
    if not ids_equal or worst > LOGIT_ATOL:
        problems.append(f"reloaded in a fresh process, the logits differ from the trained model's (max |diff| {worst:.2e}, "
                        f"top-5 ids {'equal' if ids_equal else 'differ'})")
    check = {"passed": not problems, "problems": problems, "file": str(file.name), "tensors": len(saved_shapes),
             "lora_B": n_b, "lora_B_all_zero": len(zero_b), "examples": len(examples), "max_abs_logit_diff": worst,
             "top5_ids_equal": ids_equal, "atol": LOGIT_ATOL, "frozen_checked": len(frozen_before or {}),
             "frozen_changed": len(frozen_changed), "world_size": world.world_size, "strategy": world.strategy,
             "reload_seconds": round(child["seconds"], 2), "shapes": saved_shapes}
    run.write_json("save_check.json", check)
    run.update_summary(save_check={k: v for k, v in check.items() if k != "shapes"})
    world.log(f"save check: {'passed' if check['passed'] else 'FAILED'}: {len(saved_shapes)} tensors, max |logit diff| {worst:.2e}")
    if problems:
        raise CheckFailed(f"the saved {'model' if kind == 'full' else 'adapter'} is not the trained one: {problems[0]}",
                          hint=f"see {run.path('save_check.json')}")
    return check


def init_world(distributed_cfg, run_dir_for: Any = None) -> World:
    """``init_process_group`` from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_*), with
    ``distributed.timeout_s``; on nccl the process's GPU is ``cuda:LOCAL_RANK``."""
    import torch.distributed as dist  # noqa: PLC0415

    rank, ws, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))
    cuda = torch.cuda.is_available()
    backend = resolve_backend(distributed_cfg.backend, cuda)
    if backend == "nccl":
        torch.cuda.set_device(local)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=distributed_cfg.timeout_s))
    return World(rank, ws, local, backend, distributed_cfg.strategy, distributed_cfg.timeout_s)


def _is_timeout(err: BaseException) -> bool:
    text = f"{type(err).__name__} {err}".lower()
    return "timed out" in text or "timeout" in text or "deadline" in text


def write_error(run_dir: Path, rank: int, err: BaseException) -> None:
    """``runs/<id>/rank-N.error.json``: what this rank died of (read by the launcher)."""
    from tuneproof.io import write_json  # noqa: PLC0415

    first = str(err).strip().splitlines()[0] if str(err).strip() else ""
    write_json(run_dir / f"rank-{rank}.error.json", {
        "rank": rank, "type": type(err).__name__, "message": first[:500], "timeout": _is_timeout(err), "time": time.time(),
        "traceback": "".join(traceback.format_exception(type(err), err, err.__traceback__))[-4000:]})


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
    """``python -m tuneproof.training.ddp train|preflight --study DIR --run-id ID [--data D] [--resume CKPT]
    [--stop-after K]``: one rank of ``tuneproof train`` (or of the distributed preflight,
    :mod:`tuneproof.preflight.distributed`) under torchrun, started by the launcher."""
    import argparse  # noqa: PLC0415
    import logging  # noqa: PLC0415
    import warnings  # noqa: PLC0415

    ap = argparse.ArgumentParser(prog=WORKER_MODULE)
    ap.add_argument("command", choices=["train", "preflight"])
    ap.add_argument("--study", required=True)
    ap.add_argument("--data")
    ap.add_argument("--run-id", dest="run")
    ap.add_argument("--resume")
    ap.add_argument("--stop-after", type=int)
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    import torch.distributed as dist  # noqa: PLC0415

    from tuneproof.context import StudyContext  # noqa: PLC0415
    from tuneproof.registry import Registry, Run  # noqa: PLC0415

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
        world.log(f"start: world size {world.world_size}, local rank {world.local_rank}, backend {world.backend}, "
                  f"strategy {world.strategy}, pid {os.getpid()}")
        if world.is_main:
            reg = Registry(study_dir)
            run = Run(reg, reg.get(run_id))
            run.summary = dict(reg.get(run_id).summary)
        resume = None
        if args.resume:
            from tuneproof.training.loop import load_checkpoint  # noqa: PLC0415

            resume = world.broadcast(load_checkpoint(Path(args.resume)) if world.is_main else None)
        if args.command == "preflight":
            from tuneproof.preflight.distributed import RESULT, run_checks  # noqa: PLC0415

            checks = run_checks(ctx, world, run)
            if run is not None:
                run.write_json(RESULT, {"checks": checks, "world_size": world.world_size, "backend": world.backend})
            world.log("end: preflight checks done")
            return 0
        from tuneproof.recipes.train import run_train  # noqa: PLC0415

        run_train(ctx, run=run, world=world, resume_from=resume, stop_after=args.stop_after)
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
