"""The training loop: one optimizer step per ``gradient_accumulation_steps`` micro-batches (fewer for
the last window of an epoch: a window never crosses an epoch boundary, CASES C18), with the loss
normalised per supervised token over the whole window (CASES C1), a step budget set by
``training.max_steps`` or ``training.epochs`` (exclusive; :func:`budget`), exact resumable
checkpoints (model/adapter, optimizer, scheduler, RNG states, data position; CASES C12) and a
health check on every optimizer step (:mod:`tuneproof.training.health`: a non-finite loss, gradient
norm or trainable tensor, an exploded tensor, a zero gradient or a uniform-prediction loss stops
the run, which is then invalid; CASES C19).

Engines: PyTorch + transformers (model, ``get_scheduler``) + PEFT (adapters). A checkpoint is one
dict (nanoGPT style) holding everything needed to resume and to explain the run, stored by
:mod:`tuneproof.training.resume_state` as safetensors + JSON (loading it runs no code, CASES C21):

    format, step (global optimizer steps done), total_steps, trainable (every tensor with
    requires_grad: LoRA matrices, modules_to_save, or all weights for full fine-tuning),
    optimizer, scheduler, rng (python, numpy, torch, cuda), data (n_examples, micro_batch,
    accumulation, seed, next micro-batch index, epoch, steps_per_epoch, the ordering rule), losses,
    tokens_seen, examples_seen, budget (:func:`budget`), config (resolved study), reason (interval | interrupt | final), plus ``extra``
    (data_fingerprint, base_revision).

Interruption: the first SIGINT/SIGTERM during training asks the loop to stop at the end of the
current optimizer step; it then writes a checkpoint and re-raises the signal (the registry marks
the run interrupted with its last step). A second signal stops at once; a checkpoint is still
written if the weights are between two steps (RNG states from the start of the step), otherwise
the last periodic checkpoint stands. The RNG states saved are the ones at the step boundary, so a
resumed run draws exactly the dropout masks the uninterrupted run would have drawn.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from tuneproof.data.preprocess import Encoded, collate, collate_packed
from tuneproof.errors import CheckFailed, TuneproofError
from tuneproof.training.resume_state import (CKPT_FORMAT, CKPT_KEYS, latest_checkpoint, list_checkpoints,  # noqa: F401 (re-exported)
                                           load_checkpoint, restore_state, rng_state, save_checkpoint, set_rng_state,
                                           trainable_state)
from tuneproof.training.health import HealthFault, HealthMonitor
from tuneproof.training.health import grad_norm as health_grad_norm
from tuneproof.training.parallel import normalisation, share_report
from tuneproof.training.loss import NORMALISATION, backbone_and_head, check_chunked_loss, chunked_token_loss_sum, supervised_count, token_loss_sum  # noqa: F401 (NORMALISATION: re-exported)


@dataclass
class LoopState:
    step: int = 0  # optimizer steps done


def budget(cfg, n_examples: int, world_size: int = 1) -> dict[str, Any]:
    """The step budget of a run and which key set it (issue 10: epochs are epochs).

    ``training.max_steps`` and ``training.epochs`` are exclusive; with neither, the budget is
    :data:`tuneproof.study.DEFAULT_EPOCHS` epoch. An epoch is ``steps_per_epoch`` optimizer steps:
    ``ceil(micro-batches per epoch / accumulation)``, its last window holding only the micro-batches
    left (:func:`tuneproof.training.data_order.window_at`); ``epochs: e`` is ``ceil(e * steps_per_epoch)`` steps.

    Returns:
        ``{"key": "training.max_steps" | "training.epochs" | "default", "value", "total_steps",
        "steps_per_epoch", "micro_batches_per_epoch", "examples_per_epoch"}`` (per process).

    Raises:
        TuneproofError: both keys set (a config built without validation, e.g. ``model_copy``).
    """
    from tuneproof.study import DEFAULT_EPOCHS  # noqa: PLC0415
    from tuneproof.training.data_order import micro_batches_per_epoch, optimizer_steps_per_epoch  # noqa: PLC0415

    if cfg.max_steps is not None and cfg.epochs is not None:
        raise TuneproofError(f"training.max_steps ({cfg.max_steps}) and training.epochs ({cfg.epochs:g}) are both set",
                             hint="the step budget comes from one of them; remove the other")
    per_epoch = optimizer_steps_per_epoch(n_examples, cfg.micro_batch_size, cfg.gradient_accumulation_steps, world_size)
    if cfg.max_steps is not None:
        key, value, steps = "training.max_steps", cfg.max_steps, cfg.max_steps
    else:
        key, value = ("training.epochs", cfg.epochs) if cfg.epochs is not None else ("default", DEFAULT_EPOCHS)
        steps = max(1, math.ceil(round(value * per_epoch, 9)))
    return {"key": key, "value": value, "total_steps": steps, "steps_per_epoch": per_epoch,
            "micro_batches_per_epoch": micro_batches_per_epoch(n_examples, cfg.micro_batch_size, world_size),
            "examples_per_epoch": math.ceil(n_examples / world_size)}


def total_steps(cfg, n_examples: int, world_size: int = 1) -> int:
    """Optimizer steps of the budget (:func:`budget`; per process with ``world_size`` processes)."""
    return budget(cfg, n_examples, world_size)["total_steps"]


DATA_ORDER_RULE = ("DistributedSampler(shuffle=True, seed=training.seed, set_epoch(epoch)), world_size 1; "
                   "accumulation windows within an epoch, the last one holding what is left")


def micro_batch_indices(n: int, micro_batch: int, seed: int, index: int) -> list[int]:
    """Example indices of global micro-batch number ``index`` (single process).

    The order is a permutation of ``range(n)`` per epoch seeded with ``seed + epoch``
    (:mod:`tuneproof.training.data_order`, ``DistributedSampler`` semantics), so it changes
    between epochs and is the same after a resume. The last micro-batch of an epoch may be short.
    """
    from tuneproof.training.data_order import micro_batch_at  # noqa: PLC0415

    return micro_batch_at(n, micro_batch, seed, index)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class _StopRequest:
    """Defers SIGINT/SIGTERM to the end of the current optimizer step (see the module docstring).

    Installed only in the main thread; elsewhere signals keep their handlers. A SIGINT that the
    process inherited as ignored (a background job started by a shell) stays ignored.
    """

    SIGNALS = ("SIGINT", "SIGTERM")

    def __init__(self) -> None:
        self.signum: int | None = None
        self.old: dict[int, Any] = {}

    def __enter__(self) -> "_StopRequest":
        import signal  # noqa: PLC0415

        for name in self.SIGNALS:
            sig = getattr(signal, name)
            if sig == signal.SIGINT and signal.getsignal(sig) is signal.SIG_IGN:
                continue  # a background job (SIGINT ignored, POSIX job control): keep ignoring it
            try:
                self.old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread
                break
        return self

    def __exit__(self, *exc) -> None:
        import signal  # noqa: PLC0415

        for sig, old in self.old.items():
            signal.signal(sig, old)
        self.old.clear()

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:  # second signal: stop now
            self.reraise(signum, frame)
        self.signum = signum
        import sys  # noqa: PLC0415

        import signal  # noqa: PLC0415

        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        sys.stderr.write(f"\n{name}: stopping after this step with a checkpoint (send it again to stop now)\n")

    def reraise(self, signum: int, frame=None) -> None:
        """Hand the signal to the handler that was installed before training (raises)."""
        old = self.old.get(signum)
        if callable(old):
            old(signum, frame)
        raise KeyboardInterrupt(f"signal {signum}")


def _micro_loss(model, batch: dict[str, torch.Tensor], autocast: Callable, chunked: bool = False) -> tuple[torch.Tensor, int]:
    """Summed loss of one micro-batch and ``V``, the model's output size (``logits.shape[-1]``:
    vocabulary rows, or classes for classification; the health check's ``ln(V)``). ``chunked``:
    the causal-LM loss without the full logits (:func:`tuneproof.training.loss.chunked_token_loss_sum`)."""
    labels = batch["labels"]
    if "position_ids" in batch and chunked and labels.dim() == 2:  # packed rows, loss over supervised positions only
        with autocast():
            loss = chunked_token_loss_sum(model, batch["input_ids"], None, labels, position_ids=batch["position_ids"])
        return loss, int(backbone_and_head(model)[1].weight.shape[0])
    if "position_ids" in batch:  # packed rows: the model's own mask builder separates the examples (no mask, no cache)
        with autocast():
            out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False)
        return token_loss_sum(out.logits, labels), int(out.logits.shape[-1])
    if chunked and labels.dim() == 2:
        with autocast():
            loss = chunked_token_loss_sum(model, batch["input_ids"], batch["attention_mask"], labels)
        return loss, int(backbone_and_head(model)[1].weight.shape[0])
    with autocast():
        out = model(**{k: v for k, v in batch.items() if k != "labels"})  # input_ids + attention_mask, or pixel_values
    if labels.dim() == 1:  # sequence or image classification: one target per example
        return F.cross_entropy(out.logits.float(), labels, reduction="sum"), int(out.logits.shape[-1])
    return token_loss_sum(out.logits, labels), int(out.logits.shape[-1])


def _check_speedup(model, examples: list, pad_id: int, device, capacity: int | None = None) -> dict[str, Any]:
    """:func:`tuneproof.training.loss.check_chunked_loss` on one real micro-batch, dropout off;
    ``capacity``: the micro-batch packed into rows of that many tokens (``training.packing``)."""
    if capacity is not None and (examples[0].class_index is not None or not examples[0].labels):
        return {"passed": False, "message": "the chunked loss applies to causal LMs (token labels), not to a classification head"}
    batch = {k: v.to(device) for k, v in (collate_packed(examples, pad_id, capacity) if capacity is not None else collate(examples, pad_id)).items()}
    if batch["labels"].dim() != 2:
        return {"passed": False, "message": "the chunked loss applies to causal LMs (token labels), not to a classification head"}
    was_training = model.training
    model.eval()  # the same function twice: dropout masks must not differ
    try:
        return check_chunked_loss(model, batch)
    finally:
        model.train(was_training)


def _record_fault(run, fault: HealthFault, row: dict[str, Any]) -> None:
    """Log the step that broke a health rule (its numbers, the rule) and the rule in the summary."""
    if run is None:
        return
    run.metric(**row, **fault.numbers, health=fault.rule)
    run.note(f"health: {fault.reason}")
    run.update_summary(health=fault.record(), last_step=fault.step - 1)


def train(
    model,
    train_set: list[Encoded],
    cfg,
    *,
    pad_id: int,
    device: torch.device,
    autocast: Callable,
    run=None,
    config: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    resume: dict[str, Any] | None = None,
    stop_after: int | None = None,
    progress: Callable[[int, int, float], None] | None = None,
    world=None,
) -> dict[str, Any]:
    """Train ``model`` in place.

    Args:
        model: a transformers model (optionally PEFT-wrapped) already on ``device``.
        train_set: encoded examples (see :mod:`tuneproof.data.preprocess`).
        cfg: the study's ``training`` section.
        autocast: a zero-argument context manager factory (``torch.autocast`` for bf16/fp16, or a null context).
        run: the registry run (metrics.jsonl, checkpoints); None in unit tests.
        config / extra: stored in checkpoints (resolved config; data fingerprint, base revision...).
        resume: a checkpoint dict to continue from (global step, schedule, optimizer moments, RNG, data position).
        stop_after: stop (as if interrupted, saving a checkpoint) after this many global steps; tests use it.
        progress: callback ``(step, total, loss)``.
        world: a :class:`tuneproof.training.parallel.World` under torchrun (``world.wrapped`` runs the
            forward/backward; every rank calls ``train``, rank 0 alone gets ``run``), else None.

    Returns:
        ``{"steps", "total_steps", "losses": [per-step loss], "tokens", "examples" (example passes,
        the run's whole count when resumed), "budget" (:func:`budget`), "seconds", "normalisation"}``.

    Raises:
        HealthFault: a health rule fired (:mod:`tuneproof.training.health`: non-finite loss, gradient
            norm or tensor, exploded tensor, zero gradient, uniform-prediction loss); the run is invalid.
        CheckFailed: a window with 0 supervised tokens.
    """
    from transformers import get_scheduler  # noqa: PLC0415

    from tuneproof.training.data_order import GROUP_MEGABATCH, window_at, window_position  # noqa: PLC0415

    n = len(train_set)
    ws, rank = (world.world_size, world.rank) if world is not None else (1, 0)
    fwd = world.wrapped if world is not None else model  # DDP wrapper / FSDP2 module / the model
    plan = budget(cfg, n, ws)
    steps = plan["total_steps"]
    accum = cfg.gradient_accumulation_steps
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise CheckFailed("no trainable parameters: the method froze everything", hint="check method.target_modules")
    optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    scheduler = get_scheduler(cfg.lr_scheduler, optimizer, num_warmup_steps=cfg.warmup_steps, num_training_steps=steps)
    losses: list[float] = []
    start_step = 0
    tokens_seen = 0
    examples_seen = 0  # example passes (forward/backward of one example) so far
    from tuneproof.training.speedups import packing_capacity, padding_report, prove_packing  # noqa: PLC0415

    chunked = bool(getattr(cfg, "chunked_loss", False))
    grouping, packing = bool(getattr(cfg, "length_grouping", False)), bool(getattr(cfg, "packing", False))
    capacity = packing_capacity(cfg)
    if chunked:  # a speed-up is used only after it is proven equal on a real micro-batch (issue 15)
        if ws > 1:
            raise CheckFailed("training.chunked_loss is not yet checked under DDP/FSDP (it calls the decoder past the wrapper)",
                              hint="set training.chunked_loss: false for a distributed run")
        # on the layout training uses: packed rows when packing is on (the decoder then gets position ids)
        check = _check_speedup(model, train_set[: cfg.micro_batch_size], pad_id, device, capacity if packing else None)
        if not check["passed"]:
            raise CheckFailed(f"training.chunked_loss: {check['message']}", hint="set training.chunked_loss: false")
        if run is not None:
            run.update_summary(speedups={"chunked_loss": {k: check[k] for k in ("loss_rel_diff", "grad_max_rel_diff", "tensors")}})
    lengths = [len(e.input_ids) for e in train_set] if grouping else None
    if packing:  # proven on real examples before it is used (per-token losses packed == alone)
        packed_check = prove_packing(model, train_set, cfg, pad_id, device)
        if run is not None:
            run.update_summary(speedups={**(run.summary.get("speedups") or {}), "packing": packed_check})
    if getattr(cfg, "bf16_base_weights", False):  # frozen weights in bf16, after they are proven to compute the same (issue 15)
        from tuneproof.models.method import base_weights_dtype  # noqa: PLC0415
        from tuneproof.training.speedups import prove_bf16_base  # noqa: PLC0415

        if ws > 1:
            raise CheckFailed("training.bf16_base_weights is not yet checked under DDP/FSDP (the cast would follow the wrapper)",
                              hint="set training.bf16_base_weights: false for a distributed run")
        if base_weights_dtype(model) == "bf16":  # cast and checked by the caller (the preflight's smoke pass)
            bf16_record: dict[str, Any] = {"cast_before_the_loop": True}
        else:
            bf16_record = prove_bf16_base(model, train_set, cfg, pad_id, device,
                                          lambda m, b: _micro_loss(m, b, autocast, chunked))
        if run is not None:
            run.update_summary(speedups={**(run.summary.get("speedups") or {}), "bf16_base_weights": bf16_record})
    if run is not None and train_set and hasattr(train_set[0], "input_ids"):  # token sequences (images have no padding)
        pad = padding_report(train_set, cfg, ws, rank)
        run.update_summary(padding=pad)
        if packing and pad["after"] > pad["before"]:  # rows too short to hold two examples: packing adds padding
            run.note(f"training.packing raised the padding share from {pad['before']:.1%} to {pad['after']:.1%} with rows of "
                     f"{capacity} tokens: raise training.packing_length, or use training.length_grouping")
        if grouping:
            run.update_summary(speedups={**(run.summary.get("speedups") or {}), "length_grouping": {"padding_before": pad["before"], "padding_after": pad["after"]}})
    seed_everything(cfg.seed)
    order_rule = DATA_ORDER_RULE if ws == 1 else DATA_ORDER_RULE.replace("world_size 1", f"world_size {ws}")
    if grouping:
        order_rule += f"; length-grouped (megabatches of {GROUP_MEGABATCH} micro-batches sorted by length, micro-batches shuffled with seed + epoch)"
    if resume is not None:
        if int(resume.get("total_steps", steps)) != steps:
            raise TuneproofError(f"the checkpoint's budget is {resume['total_steps']} steps, this run's {steps}",
                                 hint="the config or the training data changed since the checkpoint")
        if resume["data"].get("order") != order_rule:
            raise TuneproofError(f"the checkpoint's data order is '{resume['data'].get('order')}', this run's '{order_rule}'",
                                 hint="a resume would not see the data the run would have seen; train again")
        if int(resume["data"]["n_examples"]) != n:
            raise TuneproofError(f"the checkpoint was trained on {resume['data']['n_examples']} examples, this run has {n}",
                                 hint="the training data changed since the checkpoint")
        if int(resume["data"].get("world_size", 1)) != ws:
            raise TuneproofError(f"the checkpoint was trained by {resume['data'].get('world_size', 1)} processes, this run has {ws}",
                                 hint="resume with the same --nproc-per-node x --nnodes (the data order depends on the world size)")
        if world is not None:
            world.restore(model, optimizer, scheduler, resume)
        else:
            restore_state(model, optimizer, scheduler, resume)
        start_step = int(resume["step"])
        losses = list(resume["losses"])
        tokens_seen = int(resume.get("tokens_seen", 0))
        examples_seen = int(resume.get("examples_seen", 0))

    def checkpoint(step: int, rng: dict[str, Any], reason: str) -> Path | None:
        if run is None and world is None:
            return None
        extra_world: dict[str, Any] = {}
        if world is not None:  # collectives: every rank takes part, rank 0 (run is not None) writes
            trainable, optim = world.trainable_state(model), world.optimizer_state(model, optimizer)
            extra_world = {"rng_ranks": world.gather(rng), "world": {"world_size": ws, "strategy": world.strategy, "backend": world.backend}}
            if run is None:
                return None
        else:
            trainable, optim = trainable_state(model), optimizer.state_dict()
        pos = window_position(n, cfg.micro_batch_size, accum, step, ws)  # where the next step reads
        payload = {
            "format": CKPT_FORMAT, "step": step, "total_steps": steps, "trainable": trainable,
            "optimizer": optim, "scheduler": scheduler.state_dict(), "rng": rng, **extra_world,
            "data": {"n_examples": n, "micro_batch": cfg.micro_batch_size, "accumulation": accum, "seed": cfg.seed,
                     "next_micro_batch": pos["first_micro_batch"], "epoch": pos["epoch"],
                     "steps_per_epoch": plan["steps_per_epoch"], "order": order_rule, "world_size": ws},
            "losses": list(losses), "tokens_seen": tokens_seen, "examples_seen": examples_seen, "budget": plan,
            "config": config or {}, "reason": reason,
            "saved_at": time.time(), **(extra or {}),
        }
        return save_checkpoint(run.dir / "checkpoints", step, payload)  # safetensors + JSON, sha256 indexed, 2 kept

    read: list[int] = []  # what this rank reads in the first epoch (C10, gathered at the end)
    # FSDP2: the health rules look at this rank's shard of each tensor (DTensor.to_local)
    health = HealthMonitor([(name, p.to_local() if hasattr(p, "to_local") else p) for name, p in model.named_parameters() if p.requires_grad])
    model.train()
    t0 = time.perf_counter()
    step = start_step
    saved_step = start_step
    boundary_rng = rng_state()  # RNG states at the start of the current step
    in_update = False  # True while the weights are between two steps (not checkpointable)
    stop = _StopRequest()
    try:
        with stop:
            while step < steps:
                stopping = stop.signum is not None or (stop_after is not None and step >= stop_after)
                ts = time.perf_counter()
                # the window of this step: `accumulation` micro-batches, or what is left of the epoch (C18)
                window_idx = window_at(n, cfg.micro_batch_size, accum, cfg.seed, step, world_size=ws, rank=rank, lengths=lengths)
                batches = [{k: v.to(device) for k, v in (collate_packed([train_set[i] for i in idx], pad_id, capacity) if packing
                                                         else collate([train_set[i] for i in idx], pad_id)).items()} for idx in window_idx]
                window = sum(supervised_count(b) for b in batches)
                if world is not None:  # the global window: supervised tokens of every rank; a stop on any rank stops all
                    if step < plan["steps_per_epoch"]:
                        read.extend(i for idx in window_idx for i in idx)
                    window_f, stops = world.sum(window, float(stopping))
                    window, stopping = int(window_f), stops > 0
                if stopping:
                    if step > saved_step:
                        checkpoint(step, boundary_rng, "interrupt")
                        saved_step = step
                    if stop.signum is not None:
                        stop.reraise(stop.signum)
                    raise KeyboardInterrupt(f"stop_after={stop_after}" if stop_after is not None and step >= stop_after else "stopped with another rank")
                if window == 0:
                    raise CheckFailed(f"step {step + 1}: 0 supervised tokens in the accumulation window")
                total = 0.0
                step_tokens = 0
                for j, b in enumerate(batches):
                    with (world.no_sync(last=j == len(batches) - 1) if world is not None else contextlib.nullcontext()):
                        loss_sum, outputs = _micro_loss(fwd, b, autocast, chunked)
                        # divide by the window's token count, not per micro-batch: per-token mean over the window (C1);
                        # a short last window of an epoch is divided by its own count, so it equals its concatenation;
                        # x world size: DDP/FSDP average gradients over ranks, the global window already counts them all
                        (loss_sum * ws / window).backward()
                    total += loss_sum.item()
                    step_tokens += int(b["attention_mask"].sum()) if "attention_mask" in b else int(b["labels"].numel())
                step_examples = sum(len(idx) for idx in window_idx)
                if world is not None:
                    total, step_tokens_f, step_examples_f = world.sum(total, step_tokens, step_examples)
                    step_tokens, step_examples = int(step_tokens_f), int(step_examples_f)
                loss = total / window
                lr = optimizer.param_groups[0]["lr"]  # the learning rate this step uses
                grad_norm = health_grad_norm(params, cfg.max_grad_norm)  # before clipping; clipped in place if set
                row = {"step": step + 1, "epoch": step // plan["steps_per_epoch"], "loss": round(loss, 6), "lr": lr,
                       "grad_norm": grad_norm, "supervised_tokens": window, "micro_batches": len(batches),
                       "examples": step_examples}
                try:
                    health.before_update(step + 1, loss, grad_norm, outputs)
                    in_update = True
                    optimizer.step()
                    row["max_abs"] = health.after_update(step + 1)
                except HealthFault as fault:
                    _record_fault(run, fault, row)
                    raise
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                step += 1
                losses.append(loss)
                tokens_seen += step_tokens
                examples_seen += row["examples"]
                boundary_rng = rng_state()
                in_update = False
                if run is not None:
                    run.metric(**row, step_seconds=round(time.perf_counter() - ts, 4))
                    run.summary["last_step"] = step
                if (run is not None or world is not None) and (step % cfg.checkpoint_every == 0 or step == steps):
                    checkpoint(step, boundary_rng, "final" if step == steps else "interval")
                    saved_step = step
                if progress:
                    progress(step, steps, loss)
    except BaseException as err:
        from tuneproof.registry import Terminated  # noqa: PLC0415

        if isinstance(err, (KeyboardInterrupt, Terminated)) and run is not None:
            if world is not None:  # a checkpoint is collective: the ranks cannot meet here; the last one stands
                if step > saved_step:
                    run.note(f"stopped at once (second signal) after step {step}: the last checkpoint is step {saved_step}")
            elif step > saved_step and not in_update:
                checkpoint(step, boundary_rng, "interrupt")
            elif in_update:
                run.note(f"stopped inside the update of step {step + 1}: no checkpoint written; the last one is step {saved_step}")
            run.summary["last_step"] = step
        raise
    shares = share_report(world, read, n) if world is not None and read else None
    return {"steps": step, "total_steps": steps, "losses": losses, "tokens": tokens_seen, "examples": examples_seen,
            "budget": plan, "seconds": time.perf_counter() - t0, "normalisation": normalisation(world), "world_size": ws,
            "shares": shares}
