"""Training past one process, inside each rank: the process group, the DDP or FSDP2 wrapper, the
gradient share, and the loss normalisation they need (docs/CASES.md C1, C10, C11).

Engines, none home-made: ``torch.distributed`` gives the process group and the collectives
(``all_reduce``, ``all_gather_object``, ``broadcast_object_list``); ``DistributedDataParallel`` or
FSDP2 (``torch.distributed.fsdp.fully_shard``, one unit per decoder block + the root) wrap the model;
``torch.distributed.checkpoint.state_dict`` (``get_model_state_dict`` / ``get_optimizer_state_dict``
with ``full_state_dict=True, cpu_offload=True``) gathers whole tensors for saving. The launch under
torchrun, the worker entry and the save check are the recipe layer's (:mod:`tuneproof.recipes.torchrun`).

Numbers every rank agrees on. Each rank reads its ``DistributedSampler`` share
(:mod:`tuneproof.training.data_order`, ``set_epoch`` each epoch); an optimizer step consumes the
global batch ``micro_batch_size x gradient_accumulation_steps x world_size``. The supervised token
count of the window is all-reduced (SUM) before the backward pass, so every rank divides its summed
token loss by the *global* count; DDP and FSDP2 then average the gradients over ranks, so the loss is
multiplied by the world size first: the result is the gradient of the per-token mean over the global
window, equal to one process on the concatenated batch (docs/CASES.md C1 across ranks).
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from tuneproof.errors import TuneproofError
from tuneproof.training.loss import NORMALISATION
from tuneproof.training.resume_state import restore_state, set_rng_state


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
        raise TuneproofError(
            f"distributed.strategy fsdp: the model class {type(inner).__name__} declares no decoder block type "
            f"(_no_split_modules: {declared or 'none'}), so FSDP has no units to shard",
            hint="use distributed.strategy: ddp for this model",
        )
    return found


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
        t = torch.tensor(values, dtype=torch.float64, device=self.comm_device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return [float(v) for v in t.cpu()]

    def gather(self, obj: Any) -> list[Any]:
        """``all_gather_object``: one entry per rank, in rank order."""
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (``broadcast_object_list``)."""
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
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
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict  # noqa: PLC0415 - torch.distributed.checkpoint.state_dict loads only when full_state() runs

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
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict  # noqa: PLC0415 - torch.distributed.checkpoint.state_dict loads only when optimizer_state() runs

        return get_optimizer_state_dict(
            model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )

    def restore(self, model, optimizer, scheduler, ckpt: dict[str, Any]) -> None:
        """Load a checkpoint written by a run of the same world size: weights and optimizer (FSDP2:
        ``set_model_state_dict``/``set_optimizer_state_dict`` shard the whole tensors), scheduler, and
        this rank's own RNG states."""
        if self.strategy != "fsdp":
            restore_state(model, optimizer, scheduler, ckpt)
        else:
            from torch.distributed.checkpoint.state_dict import (  # noqa: PLC0415 - torch.distributed.checkpoint.state_dict loads only when restore() runs
                StateDictOptions,
                set_model_state_dict,
                set_optimizer_state_dict,
            )

            opts = StateDictOptions(full_state_dict=True, strict=False)
            set_model_state_dict(model, ckpt["trainable"], options=opts)
            set_optimizer_state_dict(
                model, optimizer, ckpt["optimizer"], options=StateDictOptions(full_state_dict=True)
            )
            scheduler.load_state_dict(ckpt["scheduler"])
        set_rng_state(ckpt["rng_ranks"][self.rank])

    # ----------------------------------------------------------------- logs
    def log(self, message: str) -> None:
        """One line in ``runs/<id>/rank-N.log``."""
        if self._log is not None:
            self._log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} rank {self.rank}: {message}\n")
            self._log.flush()


def share_report(world: World, read: list[int], n: int) -> dict[str, Any] | None:
    """What the ranks actually read in the first epoch (docs/CASES.md C10), gathered on every rank: the example
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
    return {
        "per_rank": [len(x) for x in sets],
        "overlap": overlap,
        "padding_repeats": pad,
        "disjoint": overlap <= pad,
        "covered": len(union),
        "n": n,
        "epoch_complete": complete,
    }


def param_signature(model) -> dict[str, tuple[float, float]]:
    """Per frozen parameter: (float64 sum, float64 sum of squares), to tell after training that the
    frozen weights did not change (docs/CASES.md C11) without keeping a copy of them. Call before wrapping."""
    out = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not p.requires_grad:
                t = p.detach().double()
                out[name] = (float(t.sum()), float((t * t).sum()))
    return out


def normalisation(world: World | None) -> str:
    """The loss normalisation a run used, with its world size (recorded in the summary)."""
    if world is None or world.world_size == 1:
        return NORMALISATION
    return (
        "per-token mean over the global accumulation window: sum of token "
        "losses / supervised tokens, both summed over "
        f"{world.world_size} processes (all_reduce); backward of loss x "
        f"{world.world_size} because {world.strategy.upper()} "
        f"averages gradients over the {world.world_size} ranks"
    )


def wrap(model, world: World):
    """Wrap ``model`` (already on its device) for ``world.strategy``; sets and returns ``world.wrapped``.

    ddp: ``DistributedDataParallel`` (rank 0's weights broadcast at construction). fsdp: FSDP2
    ``fully_shard`` on each decoder block (:func:`block_classes`), then on the root; parameters are
    sharded one by one, so blocks mixing frozen base weights and LoRA weights are fine (docs/CASES.md C11).
    """
    if world.strategy == "ddp":
        ids = [world.local_rank] if world.backend == "nccl" else None
        world.wrapped = DistributedDataParallel(model, device_ids=ids)
        return world.wrapped
    from torch.distributed.fsdp import fully_shard  # noqa: PLC0415 - torch.distributed.fsdp loads only when wrap() runs

    names = set(block_classes(model))
    units = [m for m in model.modules() if type(m).__name__ in names]
    for m in units:
        fully_shard(m)
    fully_shard(model)
    world.wrapped = model
    world.log(f"FSDP2: {len(units)} block units ({', '.join(sorted(names))}) + root")
    return model


def init_world(distributed_cfg) -> World:
    """``init_process_group`` from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_*), with
    ``distributed.timeout_s``; on nccl the process's GPU is ``cuda:LOCAL_RANK``."""
    rank, ws, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))
    cuda = torch.cuda.is_available()
    backend = resolve_backend(distributed_cfg.backend, cuda)
    if backend == "nccl":
        torch.cuda.set_device(local)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=distributed_cfg.timeout_s))
    return World(rank, ws, local, backend, distributed_cfg.strategy, distributed_cfg.timeout_s)
