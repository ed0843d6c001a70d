"""Distributed preflight: a short smoke on the real world size (``tuneproof preflight --nproc-per-node N``).

Runs inside each rank under torchrun (:func:`tuneproof.recipes.torchrun.worker_main`, command
``preflight``), through the real training loop (:func:`tuneproof.training.loop.train`):

1. shares: every rank's ``DistributedSampler`` share of epoch 0, gathered; disjoint (apart from the
   sampler's padding repeats) and covering the training set (docs/CASES.md C10);
2. DDP: 2 optimizer steps of the study's configuration; the trainable weights of every rank are then
   the same bits (sha256 over the tensors, gathered);
3. FSDP2: one optimizer step with ``fully_shard`` per decoder block + root; the whole gradients at the
   optimizer step (``DTensor.full_tensor``) equal those of one process running the loop on the
   concatenated window (the union of the ranks' micro-batches), within ``GRAD_RTOL`` of the largest
   reference gradient. LoRA dropout is set to 0 for this check (each process draws its own masks),
   and gradient clipping is off (the gradients are compared before it);
4. FSDP units: :func:`tuneproof.preflight.fsdp.mixed_units` names the units mixing frozen and LoRA
   weights (FSDP2: per-parameter sharding, remedy applied; docs/CASES.md C11);
5. per-rank peak memory: CUDA ``max_memory_allocated`` on GPUs, else the process's peak RSS
   (``resource.getrusage``, KiB on Linux).

Rank 0 writes ``runs/<id>/distributed_preflight.json``; the launcher reads it.
"""

from __future__ import annotations

import copy
import hashlib
import resource
import sys
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from tuneproof.data.preprocess import raise_on_faults
from tuneproof.preflight.fsdp import mixed_units
from tuneproof.training.data_order import epoch_order, window_at
from tuneproof.training.loop import seed_everything, train
from tuneproof.training.parallel import block_classes, share_report, wrap

GRAD_RTOL = 1e-5  # fp32: max |g_fsdp - g_ref| / max |g_ref|
RESULT = "distributed_preflight.json"


def _check(name: str, passed: bool, message: str, **numbers: Any) -> dict[str, Any]:
    return {"name": name, "passed": passed, "message": message, "numbers": numbers}


def peak_memory_bytes() -> tuple[int, str]:
    """This process's peak memory: CUDA ``max_memory_allocated`` (bytes) on a GPU, else the peak RSS."""
    if torch.cuda.is_available():
        return int(torch.cuda.max_memory_allocated()), "cuda max_memory_allocated"
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(kib * (1 if sys.platform == "darwin" else 1024)), "peak RSS (getrusage)"


def _digest(model) -> str:
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        if p.requires_grad:
            h.update(name.encode())
            h.update(p.detach().to("cpu").contiguous().numpy().tobytes())
    return h.hexdigest()


class _GradCapture:
    """Whole gradients at the first ``optimizer.step`` (a global optimizer step pre-hook)."""

    def __init__(self, model, gather: bool) -> None:
        self.model, self.gather, self.grads = model, gather, None

    def __enter__(self):
        def hook(optimizer, args, kwargs):  # noqa: ARG001
            if self.grads is None:
                self.grads = {}
                for n, p in self.model.named_parameters():
                    if p.requires_grad and p.grad is not None:
                        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                        self.grads[n] = g.detach().to("cpu", copy=True)

        self.handle = register_optimizer_step_pre_hook(hook)
        return self

    def __exit__(self, *exc) -> None:
        self.handle.remove()


def run_checks(ctx, world, run) -> list[dict[str, Any]] | None:
    """The checks of the module docstring on this rank; rank 0 returns them (others None).

    Raises:
        TuneproofError: the data has hard faults or the model cannot be built (as ``train``).
    """
    cfg = ctx.study.training
    encoded = ctx.pipeline.encode_all(ctx.split("train"))
    raise_on_faults(encoded, "train")
    n = len(encoded)
    device, _, autocast = ctx.torch_setup()
    pad = ctx.tokenizer.pad_token_id
    checks: list[dict[str, Any]] = []

    # 1. shares of epoch 0
    shares = share_report(
        world, epoch_order(n, world_size=world.world_size, rank=world.rank, seed=cfg.seed, epoch=0), n
    )
    checks.append(
        _check(
            "shares",
            shares["disjoint"] and shares["epoch_complete"],
            f"{world.world_size} shares of {shares['per_rank'][0]} examples, "
            f"{'disjoint' if shares['disjoint'] else 'OVERLAPPING'}, cover {shares['covered']} of {n}"
            + (
                f" ({shares['padding_repeats']} repeated to even the shares, as DistributedSampler does)"
                if shares["padding_repeats"]
                else ""
            ),
            **shares,
        )
    )

    # 2. DDP: 2 steps of the configured loop, then the ranks' trainable weights
    smoke = cfg.model_copy(
        update={
            "max_steps": 2,
            "epochs": None,
            "warmup_steps": 0,
            "lr_scheduler": "constant",
            "checkpoint_every": 10**9,
        }
    )
    seed_everything(cfg.seed)
    model, _ = ctx.build_model()
    ddp_world = copy.copy(world)
    ddp_world.strategy = "ddp"
    wrap(model, ddp_world)
    result = train(model, encoded, smoke, pad_id=pad, device=device, autocast=autocast, world=ddp_world)
    digests = world.gather(_digest(model))
    same = len(set(digests)) == 1
    checks.append(
        _check(
            "ddp weights agree",
            same,
            f"after {result['steps']} DDP steps the trainable weights of the {world.world_size} ranks are "
            + ("the same bits" if same else f"DIFFERENT ({len(set(digests))} distinct)"),
            losses=[round(x, 6) for x in result["losses"]],
            sha256=digests[0][:16],
        )
    )
    del model, ddp_world

    # 3. FSDP2: one step, whole gradients vs one process on the concatenated window
    method = ctx.study.method
    dropout = method.dropout
    method.dropout = 0.0
    try:
        step1 = smoke.model_copy(update={"max_steps": 1, "max_grad_norm": None})
        seed_everything(cfg.seed)
        model, _ = ctx.build_model()
        blocks = block_classes(model)
        units = mixed_units(model, blocks, fsdp_version=2)
        checks.append(
            _check(
                "fsdp units", bool(units["passed"]), units["message"], units=units["units"], mixed=len(units["mixed"])
            )
        )
        fsdp_world = copy.copy(world)
        fsdp_world.strategy = "fsdp"
        wrap(model, fsdp_world)
        with _GradCapture(model, gather=True) as cap:
            train(model, encoded, step1, pad_id=pad, device=device, autocast=autocast, world=fsdp_world)
        mine = [
            i
            for idx in window_at(
                n,
                cfg.micro_batch_size,
                cfg.gradient_accumulation_steps,
                cfg.seed,
                0,
                world_size=world.world_size,
                rank=world.rank,
            )
            for i in idx
        ]
        union = [i for part in world.gather(mine) for i in part]
        del model
        if world.is_main:
            seed_everything(cfg.seed)
            ref, _ = ctx.build_model()
            ref_cfg = step1.model_copy(update={"micro_batch_size": len(union), "gradient_accumulation_steps": 1})
            with _GradCapture(ref, gather=False) as rcap:
                train(ref, [encoded[i] for i in union], ref_cfg, pad_id=pad, device=device, autocast=autocast)
            worst, scale = 0.0, 0.0
            missing = sorted(set(rcap.grads) ^ set(cap.grads))
            for name, g in rcap.grads.items():
                if name in cap.grads:
                    worst = max(worst, float((cap.grads[name].float() - g.float()).abs().max()))
                    scale = max(scale, float(g.abs().max()))
            rel = worst / scale if scale else float("inf")
            ok = not missing and rel <= GRAD_RTOL
            checks.append(
                _check(
                    "fsdp2 gradients",
                    ok,
                    f"FSDP2 step gradients vs one process on the concatenated window of {len(union)} examples: "
                    f"max |diff| {worst:.2e} = {rel:.2e} of the largest gradient (limit {GRAD_RTOL:g})"
                    + (f"; tensors only on one side: {missing[:2]}" if missing else ""),
                    max_abs_diff=worst,
                    relative=rel,
                    tensors=len(rcap.grads),
                    examples=len(union),
                )
            )
    finally:
        method.dropout = dropout

    # 4. per-rank peak memory
    peaks = world.gather(peak_memory_bytes())
    checks.append(
        _check(
            "per-rank peak memory",
            True,
            ", ".join(f"rank {r}: {b / 2**20:.0f} MiB" for r, (b, _) in enumerate(peaks)) + f" ({peaks[0][1]})",
            bytes=[b for b, _ in peaks],
            source=peaks[0][1],
        )
    )
    return checks if world.is_main else None
