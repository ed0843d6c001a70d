"""The training loop: one optimizer step per ``gradient_accumulation_steps`` micro-batches (fewer for
the last window of an epoch: a window never crosses an epoch boundary, docs/CASES.md C18), with the loss
normalised per supervised token over the whole window (docs/CASES.md C1), a step budget set by
``training.max_steps`` or ``training.epochs`` (exclusive; :func:`budget`), exact resumable
checkpoints (model/adapter, optimizer, scheduler, RNG states, data position; docs/CASES.md C12) and a
health check on every optimizer step (:mod:`tuneproof.training.health`: a non-finite loss, gradient
norm or trainable tensor, an exploded tensor, a zero gradient or a uniform-prediction loss stops
the run, which is then invalid; docs/CASES.md C19).

Engines: PyTorch + transformers (model, ``get_scheduler``) + PEFT (adapters). A checkpoint is one
dict (nanoGPT style) holding everything needed to resume and to explain the run, stored by
:mod:`tuneproof.training.resume_state` as safetensors + JSON (loading it runs no code, docs/CASES.md C21):

    format, step (global optimizer steps done), total_steps, trainable (every tensor with
    requires_grad: LoRA matrices, modules_to_save, or all weights for full fine-tuning),
    optimizer, scheduler, rng (python, numpy, torch, cuda), data (n_examples, micro_batch,
    accumulation, seed, next micro-batch index, epoch, steps_per_epoch, the ordering rule), losses,
    tokens_seen, examples_seen, budget (:func:`budget`), config (resolved study), reason (interval | interrupt | final),
    plus ``extra`` (data_fingerprint, base_revision).

Interruption: in one process, a SIGINT/SIGTERM that arrives during the forward/backward passes of
an accumulation window stops at once: that window's gradients are dropped (the weights are still
those after the last finished step), the checkpoint of that step is written and the signal re-raised,
so Ctrl-C waits for one operator, not for a whole step (a CPU step of the quickstart took 49 s);
the resume trains the dropped step again, exactly. Elsewhere (during the update, a checkpoint
write, under torchrun, where the ranks must stop at the same step) the first signal asks the loop
to stop at the end of the current optimizer step; it then writes a checkpoint and re-raises the
signal (the registry marks the run interrupted with its last step). A second signal stops at once; a checkpoint is still
written if the weights are between two steps (RNG states from the start of the step), otherwise
the last periodic checkpoint stands. The RNG states saved are the ones at the step boundary, so a
resumed run draws exactly the dropout masks the uninterrupted run would have drawn.
"""

from __future__ import annotations

import contextlib
import random
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F

from tuneproof import clock
from tuneproof.data.preprocess import Encoded, collate, collate_packed
from tuneproof.errors import CheckFailed, Stopped, Terminated, TuneproofError
from tuneproof.models.method import base_weights_dtype
from tuneproof.study import turn_off
from tuneproof.training import micro_batch
from tuneproof.training.budget import budget
from tuneproof.training.compiled import first_micro_batch, prove_compile, record_of, remove_compile, require_compile
from tuneproof.training.data_order import (
    GROUP_MEGABATCH,
    epoch_micro_batches,
    micro_batch_at,
    window_at,
    window_position,
)
from tuneproof.training.health import HealthFault, HealthMonitor
from tuneproof.training.health import grad_norm as health_grad_norm
from tuneproof.training.loss import (
    backbone_and_head,
    chunked_token_loss_sum,
    supervised_count,
    token_loss_sum,
)
from tuneproof.training.parallel import normalisation, share_report
from tuneproof.training.resume_state import CKPT_FORMAT, restore_state, rng_state, save_checkpoint, trainable_state
from tuneproof.training.speedups import (
    LENGTH_GROUPING_EXAMPLES,
    check_chunked_on_batch,
    check_length_grouping,
    packing_capacity,
    padding_report,
    prove_bf16_base,
    prove_packing,
    resolve_auto,
)

DATA_ORDER_RULE = (
    "DistributedSampler(shuffle=True, seed=training.seed, set_epoch(epoch)), world_size 1; "
    "accumulation windows within an epoch, the last one holding what is left"
)


def micro_batch_indices(n: int, micro_batch: int, seed: int, index: int) -> list[int]:
    """Example indices of global micro-batch number ``index`` (single process).

    The order is a permutation of ``range(n)`` per epoch seeded with ``seed + epoch``
    (:mod:`tuneproof.training.data_order`, ``DistributedSampler`` semantics), so it changes
    between epochs and is the same after a resume. The last micro-batch of an epoch may be short.
    """
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

    def __init__(self, now: Callable[[], bool] | None = None) -> None:
        self.signum: int | None = None
        self.old: dict[int, Any] = {}
        self.now = now  # True while a stop may happen at once (the forward/backward of a window, one process)

    def __enter__(self) -> _StopRequest:
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
        for sig, old in self.old.items():
            signal.signal(sig, old)
        self.old.clear()

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:  # second signal: stop now
            self.reraise(signum, frame)
        self.signum = signum
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        if self.now is not None and self.now():
            sys.stderr.write(
                f"\n{name}: stopping now; the step in progress is dropped, the last finished one is kept\n"
            )
            self.reraise(signum, frame)
        sys.stderr.write(f"\n{name}: stopping after this step with a checkpoint (send it again to stop now)\n")

    def reraise(self, signum: int, frame=None) -> None:
        """Hand the signal to the handler that was installed before training (raises)."""
        old = self.old.get(signum)
        if callable(old):
            old(signum, frame)
        raise KeyboardInterrupt(f"signal {signum}")


def _micro_loss(
    model, batch: dict[str, torch.Tensor], autocast: Callable, chunked: bool = False
) -> tuple[torch.Tensor, int]:
    """Summed loss of one micro-batch and ``V``, the model's output size (``logits.shape[-1]``:
    vocabulary rows, or classes for classification; the health check's ``ln(V)``). ``chunked``:
    the causal-LM loss without the full logits (:func:`tuneproof.training.loss.chunked_token_loss_sum`)."""
    labels = batch["labels"]
    if chunked and labels.dim() == 2:  # the causal-LM loss over supervised positions, without the full logits
        inputs = micro_batch.model_inputs(batch)
        with autocast():
            loss = chunked_token_loss_sum(
                model,
                inputs["input_ids"],
                inputs.get("attention_mask"),
                labels,
                position_ids=inputs.get("position_ids"),
            )
        return loss, int(backbone_and_head(model)[1].weight.shape[0])
    out = micro_batch.logits(model, batch, autocast)
    if labels.dim() == 1:  # sequence or image classification: one target per example
        return F.cross_entropy(out.float(), labels, reduction="sum"), int(out.shape[-1])
    return token_loss_sum(out, labels), int(out.shape[-1])


def _record_fault(run, fault: HealthFault, row: dict[str, Any]) -> None:
    """Log the step that broke a health rule (its numbers, the rule) and the rule in the summary."""
    if run is None:
        return
    run.metric(**row, **fault.numbers, health=fault.rule)
    run.note(f"health: {fault.reason}")
    run.update_summary(health=fault.record(), last_step=fault.step - 1)


class RunLog(Protocol):
    """What the loop records into, on the process that writes (rank 0 under torchrun): the run folder
    (checkpoints go to ``dir / "checkpoints"``), its summary, one metrics row per step and notes.
    The recipe passes its registry run; training knows no registry."""

    dir: Path
    summary: dict[str, Any]

    def metric(self, **row: Any) -> None: ...

    def note(self, message: str) -> None: ...

    def update_summary(self, **values: Any) -> None: ...


@dataclass
class LoopState:
    """Where the loop is: what a checkpoint records and a resume restores."""

    step: int = 0  # optimizer steps done
    losses: list[float] = field(default_factory=list)  # per-step loss
    tokens_seen: int = 0
    examples_seen: int = 0  # example passes (forward/backward of one example) so far
    boundary_rng: dict[str, Any] | None = None  # RNG states at the start of the current step
    in_update: bool = False  # True while the weights are between two steps (not checkpointable)
    in_window: bool = False  # True during the forward/backward passes of a window (weights untouched yet)

    @classmethod
    def resumed(cls, ckpt: dict[str, Any]) -> LoopState:
        return cls(
            step=int(ckpt["step"]),
            losses=list(ckpt["losses"]),
            tokens_seen=int(ckpt.get("tokens_seen", 0)),
            examples_seen=int(ckpt.get("examples_seen", 0)),
        )


@dataclass
class Layout:
    """How the micro-batches are laid out and their loss computed (the speed-ups, docs/PROTOCOL.md step 5); never what
    is computed."""

    pad_id: int
    device: torch.device
    chunked: bool  # training.chunked_loss
    grouping: bool  # training.length_grouping
    packing: bool  # training.packing
    capacity: int  # row capacity of a packed micro-batch, tokens
    lengths: list[int] | None  # example lengths, when length-grouped

    def batches(self, train_set: list[Encoded], window_idx: list[list[int]]) -> list[dict[str, torch.Tensor]]:
        """The window's micro-batches on the device (packed rows, or padded to their longest example)."""
        out = []
        for idx in window_idx:
            examples = [train_set[i] for i in idx]
            if self.packing:
                batch = collate_packed(examples, self.pad_id, self.capacity)
            else:
                batch = collate(examples, self.pad_id)
            out.append({k: v.to(self.device) for k, v in batch.items()})
        return out


def use_speedups(
    model,
    train_set: list[Encoded],
    cfg,
    *,
    pad_id: int,
    device,
    autocast: Callable,
    run: RunLog | None,
    world_size: int,
    rank: int,
    rules: dict[str, tuple[bool, str]] | None = None,
    planned_micro_batches: int = 0,
) -> Layout:
    """Prove each configured speed-up on real training examples before it is used (docs/PROTOCOL.md step 5) and record
    the proof, the padding share and the layout in ``run``'s summary; returns the layout.

    ``training.speedups: auto`` is resolved first (:func:`tuneproof.training.speedups.resolve_auto` with
    ``rules``, :func:`tuneproof.training.speedups.static_rules`): what it turns on is then proved here like an
    explicit key; what it leaves off, and why, goes to the summary's ``speedups_auto``. Under auto a
    compiled step that fails its check, or does not pay back its compile seconds within
    ``planned_micro_batches``, is left off instead of stopping the run.

    Raises:
        CheckFailed: a speed-up set explicitly does not compute the same here, or is not yet checked under DDP/FSDP.
    """
    auto = getattr(cfg, "speedups", None) == "auto"
    auto_record: dict[str, Any] | None = None
    if auto:
        cfg, auto_record = resolve_auto(
            model,
            train_set,
            cfg,
            pad_id=pad_id,
            device=device,
            loss_fn=lambda m, b: _micro_loss(m, b, autocast),
            fp32_loss_fn=lambda m, b: _micro_loss(m, b, contextlib.nullcontext),
            rules=rules,
            world_size=world_size,
            rank=rank,
        )
    chunked = bool(getattr(cfg, "chunked_loss", False))
    grouping, packing = bool(getattr(cfg, "length_grouping", False)), bool(getattr(cfg, "packing", False))
    capacity = packing_capacity(cfg)
    if chunked:
        if world_size > 1:
            raise CheckFailed(
                "training.chunked_loss is not yet checked under DDP/FSDP (it calls the decoder past the wrapper)",
                hint=f"{turn_off(cfg, 'chunked_loss')} for a distributed run",
            )
        # on the layout training uses: packed rows when packing is on (the decoder then gets position ids);
        # under auto resolve_auto ran this very check on the same micro-batch and layout
        proved = ((auto_record or {}).get("decisions") or {}).get("chunked_loss", {}).get("proof")
        check = (
            {"passed": True, **proved}
            if proved
            else check_chunked_on_batch(
                model, train_set[: cfg.micro_batch_size], pad_id, device, capacity if packing else None
            )
        )
        if not check["passed"]:
            raise CheckFailed(f"training.chunked_loss: {check['message']}", hint=turn_off(cfg, "chunked_loss"))
        if run is not None:
            proof = {k: check[k] for k in ("loss_rel_diff", "grad_max_rel_diff", "tensors")}
            run.update_summary(speedups={"chunked_loss": proof})
    lengths = [len(e.input_ids) for e in train_set] if grouping else None
    grouping_check: dict[str, Any] = {}
    if grouping:  # an example's loss does not depend on its batch mates (then grouping changes only the order)
        first = epoch_micro_batches(len(train_set), cfg.micro_batch_size, cfg.seed, 0, world_size=world_size, rank=rank)
        check = check_length_grouping(
            model,
            [train_set[i] for i in first[0][:LENGTH_GROUPING_EXAMPLES]],
            pad_id,
            device,
            lambda m, b: _micro_loss(m, b, contextlib.nullcontext),
        )
        if not check["passed"]:
            raise CheckFailed(f"training.length_grouping: {check['message']}", hint=turn_off(cfg, "length_grouping"))
        grouping_check = {k: check[k] for k in ("loss_rel_diff", "grad_max_rel_diff", "tensors")}
    if packing:  # per-token losses packed == alone
        packed_check = prove_packing(model, train_set, cfg, pad_id, device)
        if run is not None:
            run.update_summary(speedups={**(run.summary.get("speedups") or {}), "packing": packed_check})
    if getattr(cfg, "bf16_base_weights", False):  # frozen weights in bf16
        if world_size > 1:
            raise CheckFailed(
                "training.bf16_base_weights is not yet checked under DDP/FSDP (the cast would follow the wrapper)",
                hint=f"{turn_off(cfg, 'bf16_base_weights')} for a distributed run",
            )
        if base_weights_dtype(model) == "bf16":  # cast and checked by the caller (the preflight's smoke pass)
            bf16_record: dict[str, Any] = {"cast_before_the_loop": True}
        else:
            bf16_record = prove_bf16_base(
                model, train_set, cfg, pad_id, device, lambda m, b: _micro_loss(m, b, autocast, chunked)
            )
        if run is not None:
            run.update_summary(speedups={**(run.summary.get("speedups") or {}), "bf16_base_weights": bf16_record})
    if run is not None and train_set and hasattr(train_set[0], "input_ids"):  # token sequences (images have no padding)
        pad = padding_report(train_set, cfg, world_size, rank)
        run.update_summary(padding=pad)
        if packing and pad["after"] > pad["before"]:  # rows too short to hold two examples: packing adds padding
            run.note(
                f"training.packing raised the padding share from {pad['before']:.1%} to {pad['after']:.1%} "
                f"with rows of {capacity} tokens: raise training.packing_length, or use training.length_grouping"
            )
        if grouping:
            grouped = {"padding_before": pad["before"], "padding_after": pad["after"], **grouping_check}
            run.update_summary(speedups={**(run.summary.get("speedups") or {}), "length_grouping": grouped})
    if getattr(cfg, "compile", False):
        _use_compile(
            model,
            train_set,
            cfg,
            pad_id,
            device,
            autocast,
            chunked,
            world_size,
            planned_micro_batches,
            run,
            auto_record,
        )
    if run is not None and auto_record is not None:
        run.update_summary(speedups_auto=auto_record)
        used = ", ".join(auto_record["used"]) or "none"
        run.note(
            f"training.speedups auto: {used}; "
            + "; ".join(f"{k} off: {d['reason']}" for k, d in auto_record["decisions"].items() if not d["used"])
        )
    return Layout(pad_id, device, chunked, grouping, packing, capacity, lengths)


def _use_compile(
    model, train_set, cfg, pad_id, device, autocast, chunked, world_size, planned, run, auto_record
) -> None:
    """``training.compile`` (:mod:`tuneproof.training.compiled`): checked on the first micro-batch, then kept
    compiled; under auto (``auto_record``) left off, with the reason, when it fails or does not pay."""
    if world_size > 1:
        raise CheckFailed(
            "training.compile is not yet checked under DDP/FSDP",
            hint=f"{turn_off(cfg, 'compile')} for a distributed run",
        )
    batch = first_micro_batch(train_set[: cfg.micro_batch_size], pad_id, device)
    check = prove_compile(
        model,
        batch,
        lambda m, b: _micro_loss(m, b, autocast, chunked),
        low_precision=autocast is not contextlib.nullcontext,
        planned_micro_batches=planned,
        device=device,
    )
    if auto_record is not None and (not check["passed"] or not check["pays"]):
        if check["passed"]:
            remove_compile(check["compiled"])
        reason = (
            check["message"] if not check["passed"] else f"does not pay within the planned budget: {check['message']}"
        )
        auto_record["decisions"]["compile"] = {"used": False, "reason": reason, **record_of(check)}
        auto_record["used"] = [k for k in auto_record["used"] if k != "compile"]
        return
    require_compile(check)
    if auto_record is not None:
        auto_record["decisions"]["compile"] = {"used": True, "reason": check["message"]}
    if run is not None:
        run.update_summary(speedups={**(run.summary.get("speedups") or {}), "compile": record_of(check)})


def data_order_rule(world_size: int, grouping: bool) -> str:
    """The data order a run reads, as its checkpoints record it (a resume must read the same)."""
    rule = DATA_ORDER_RULE if world_size == 1 else DATA_ORDER_RULE.replace("world_size 1", f"world_size {world_size}")
    if grouping:
        rule += (
            f"; length-grouped (megabatches of {GROUP_MEGABATCH} micro-batches sorted by length, micro-batches "
            "shuffled with seed + epoch)"
        )
    return rule


def check_resume(ckpt: dict[str, Any], *, total_steps: int, order_rule: str, n_examples: int, world_size: int) -> None:
    """Refuse a checkpoint this run would not continue exactly.

    Raises:
        TuneproofError: another step budget, data order, number of examples or world size.
    """
    if int(ckpt.get("total_steps", total_steps)) != total_steps:
        raise TuneproofError(
            f"the checkpoint's budget is {ckpt['total_steps']} steps, this run's {total_steps}",
            hint="the config or the training data changed since the checkpoint",
        )
    if ckpt["data"].get("order") != order_rule:
        raise TuneproofError(
            f"the checkpoint's data order is '{ckpt['data'].get('order')}', this run's '{order_rule}'",
            hint="a resume would not see the data the run would have seen; train again",
        )
    if int(ckpt["data"]["n_examples"]) != n_examples:
        raise TuneproofError(
            f"the checkpoint was trained on {ckpt['data']['n_examples']} examples, this run has {n_examples}",
            hint="the training data changed since the checkpoint",
        )
    if int(ckpt["data"].get("world_size", 1)) != world_size:
        raise TuneproofError(
            f"the checkpoint was trained by {ckpt['data'].get('world_size', 1)} processes, this run has {world_size}",
            hint="resume with the same --nproc-per-node x --nnodes (the data order depends on the world size)",
        )


class Checkpoints:
    """The run's resumable checkpoints: one dict each (nanoGPT style) with the trained tensors, optimizer,
    scheduler, RNG states, data position, losses and config, stored under ``run.dir / "checkpoints"``
    (:func:`tuneproof.training.resume_state.save_checkpoint`). Under torchrun every rank takes part
    (whole tensors and every rank's RNG states are gathered) and rank 0 writes; without a run or a world
    (unit tests) nothing is saved."""

    def __init__(
        self,
        run: RunLog | None,
        world,
        model,
        optimizer,
        scheduler,
        *,
        cfg,
        plan: dict[str, Any],
        order_rule: str,
        n_examples: int,
        config: dict[str, Any] | None,
        extra: dict[str, Any] | None,
        saved_step: int,
    ) -> None:
        self.run, self.world, self.model, self.optimizer, self.scheduler = run, world, model, optimizer, scheduler
        self.cfg, self.plan, self.order_rule, self.n = cfg, plan, order_rule, n_examples
        self.config, self.extra = config, extra
        self.saved_step = saved_step  # the step of the last checkpoint (or of the resumed one)

    @property
    def active(self) -> bool:
        return self.run is not None or self.world is not None

    def due(self, step: int) -> bool:
        """A periodic checkpoint (``training.checkpoint_every``) or the final one is due after ``step``."""
        return self.active and (step % self.cfg.checkpoint_every == 0 or step == self.plan["total_steps"])

    def save(self, state: LoopState, reason: str) -> Path | None:
        """Checkpoint at ``state.step`` with the RNG states of that step boundary; ``reason``: interval,
        interrupt or final. Returns the folder written (None on ranks other than 0, or when inactive)."""
        self.saved_step = state.step
        if not self.active:
            return None
        cfg, ws, rng = self.cfg, self.world.world_size if self.world is not None else 1, state.boundary_rng
        extra_world: dict[str, Any] = {}
        if self.world is not None:  # collectives: every rank takes part, rank 0 (run is not None) writes
            world = self.world
            trainable, optim = world.trainable_state(self.model), world.optimizer_state(self.model, self.optimizer)
            extra_world = {
                "rng_ranks": world.gather(rng),
                "world": {"world_size": ws, "strategy": world.strategy, "backend": world.backend},
            }
            if self.run is None:
                return None
        else:
            trainable, optim = trainable_state(self.model), self.optimizer.state_dict()
        # where the next step reads
        pos = window_position(self.n, cfg.micro_batch_size, cfg.gradient_accumulation_steps, state.step, ws)
        payload = {
            "format": CKPT_FORMAT,
            "step": state.step,
            "total_steps": self.plan["total_steps"],
            "trainable": trainable,
            "optimizer": optim,
            "scheduler": self.scheduler.state_dict(),
            "rng": rng,
            **extra_world,
            "data": {
                "n_examples": self.n,
                "micro_batch": cfg.micro_batch_size,
                "accumulation": cfg.gradient_accumulation_steps,
                "seed": cfg.seed,
                "next_micro_batch": pos["first_micro_batch"],
                "epoch": pos["epoch"],
                "steps_per_epoch": self.plan["steps_per_epoch"],
                "order": self.order_rule,
                "world_size": ws,
            },
            "losses": list(state.losses),
            "tokens_seen": state.tokens_seen,
            "examples_seen": state.examples_seen,
            "budget": self.plan,
            "config": self.config or {},
            "reason": reason,
            "saved_at": time.time(),
            **(self.extra or {}),
        }
        # safetensors + JSON, sha256 indexed, 2 kept
        return save_checkpoint(self.run.dir / "checkpoints", state.step, payload)

    def on_signal(self, state: LoopState) -> None:
        """A stop that could not wait for the step boundary (a second signal): checkpoint if the weights are
        between two steps, else note where the last checkpoint stands; ``last_step`` in the summary."""
        run = self.run
        if self.world is not None:  # a checkpoint is collective: the ranks cannot meet here; the last one stands
            if state.step > self.saved_step:
                run.note(
                    f"stopped at once (second signal) after step {state.step}: "
                    f"the last checkpoint is step {self.saved_step}"
                )
        elif state.step > self.saved_step and not state.in_update:
            self.save(state, "interrupt")
        elif state.in_update:
            run.note(
                f"stopped inside the update of step {state.step + 1}: no checkpoint written; "
                f"the last one is step {self.saved_step}"
            )
        run.summary["last_step"] = state.step


def backward_window(
    fwd, batches: list[dict[str, torch.Tensor]], window: int, *, autocast: Callable, chunked: bool, world=None
) -> tuple[float, int, int]:
    """Forward and backward of every micro-batch of one accumulation window (gradients summed in ``.grad``).

    Args:
        fwd: the module the forward goes through (the model, or its DDP/FSDP2 wrapper).
        window: supervised tokens of the whole window (of every rank under torchrun).

    Returns:
        ``(summed loss of this rank's window, tokens read, V)`` (``V``: the model's output size).
    """
    ws = world.world_size if world is not None else 1
    total, tokens, vocab = 0.0, 0, 0
    for j, b in enumerate(batches):
        with world.no_sync(last=j == len(batches) - 1) if world is not None else contextlib.nullcontext():
            loss_sum, vocab = _micro_loss(fwd, b, autocast, chunked)
            # divide by the window's token count, not per micro-batch: per-token mean over the window
            # (docs/CASES.md C1);
            # a short last window of an epoch is divided by its own count, so it equals its concatenation;
            # x world size: DDP/FSDP average gradients over ranks, the global window already counts them all
            (loss_sum * ws / window).backward()
        total += loss_sum.item()
        tokens += int(b["attention_mask"].sum()) if "attention_mask" in b else int(b["labels"].numel())
    return total, tokens, vocab


def build_optimizer(model: torch.nn.Module, cfg) -> torch.optim.Optimizer:
    """The optimizer a run steps: ``torch.optim.AdamW`` over the model's ``requires_grad`` tensors
    (``lr = cfg.learning_rate``, decoupled ``weight_decay = cfg.weight_decay``, Loshchilov and Hutter
    2019). The training loop, the preflight's update check and step-memory check all build it here,
    so the update check proves what this optimizer does (and whatever tensors it holds).

    Raises:
        CheckFailed: no tensor requires a gradient (the method froze everything).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise CheckFailed("no trainable parameters: the method froze everything", hint="check method.target_modules")
    return torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)


def train(
    model,
    train_set: list[Encoded],
    cfg,
    *,
    pad_id: int,
    device: torch.device,
    autocast: Callable,
    run: RunLog | None = None,
    config: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    resume: dict[str, Any] | None = None,
    stop_after: int | None = None,
    progress: Callable[[int, int, float], None] | None = None,
    world=None,
    speedup_rules: dict[str, tuple[bool, str]] | None = None,
) -> dict[str, Any]:
    """Train ``model`` in place.

    Args:
        model: a transformers model (optionally PEFT-wrapped) already on ``device``.
        train_set: encoded examples (see :mod:`tuneproof.data.preprocess`).
        cfg: the study's ``training`` section.
        autocast: a zero-argument context manager factory (``torch.autocast`` for bf16/fp16, or a null context).
        run: where the run is recorded (:class:`RunLog`: metrics.jsonl, summary, checkpoints); None in unit tests.
        config / extra: stored in checkpoints (resolved config; data fingerprint, base revision...).
        resume: a checkpoint dict to continue from (global step, schedule, optimizer moments, RNG, data position).
        stop_after: stop (as if interrupted, saving a checkpoint) after this many global steps; tests use it.
        progress: callback ``(step, total, loss)``.
        world: a :class:`tuneproof.training.parallel.World` under torchrun (``world.wrapped`` runs the
            forward/backward; every rank calls ``train``, rank 0 alone gets ``run``), else None.
        speedup_rules: :func:`tuneproof.training.speedups.static_rules` for ``training.speedups: auto``
            (None: packing, bf16 frozen weights and compile stay off under auto).

    Returns:
        ``{"steps", "total_steps", "losses": [per-step loss], "tokens", "examples" (example passes,
        the run's whole count when resumed), "budget" (:func:`budget`), "seconds", "normalisation"}``.

    Raises:
        HealthFault: a health rule fired (:mod:`tuneproof.training.health`: non-finite loss, gradient
            norm or tensor, exploded tensor, zero gradient, uniform-prediction loss); the run is invalid.
        CheckFailed: a window with 0 supervised tokens.
    """
    from transformers import get_scheduler  # noqa: PLC0415 - transformers loads only when train() runs

    n = len(train_set)
    ws, rank = (world.world_size, world.rank) if world is not None else (1, 0)
    fwd = world.wrapped if world is not None else model  # DDP wrapper / FSDP2 module / the model
    plan = budget(cfg, n, ws)
    steps = plan["total_steps"]
    optimizer = build_optimizer(model, cfg)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    # a .grad left from before (a backward before a tensor was frozen, an earlier caller) would be
    # added to the first window's gradient and, on a tensor the optimizer holds, stepped: clear them all
    model.zero_grad(set_to_none=True)
    scheduler = get_scheduler(cfg.lr_scheduler, optimizer, num_warmup_steps=cfg.warmup_steps, num_training_steps=steps)
    layout = use_speedups(
        model,
        train_set,
        cfg,
        pad_id=pad_id,
        device=device,
        autocast=autocast,
        run=run,
        world_size=ws,
        rank=rank,
        rules=speedup_rules,
        planned_micro_batches=steps * cfg.gradient_accumulation_steps,
    )
    seed_everything(cfg.seed)
    order_rule = data_order_rule(ws, layout.grouping)
    state = LoopState()
    if resume is not None:
        check_resume(resume, total_steps=steps, order_rule=order_rule, n_examples=n, world_size=ws)
        if world is not None:
            world.restore(model, optimizer, scheduler, resume)
        else:
            restore_state(model, optimizer, scheduler, resume)
        state = LoopState.resumed(resume)
    checkpoints = Checkpoints(
        run,
        world,
        model,
        optimizer,
        scheduler,
        cfg=cfg,
        plan=plan,
        order_rule=order_rule,
        n_examples=n,
        config=config,
        extra=extra,
        saved_step=state.step,
    )
    read: list[int] = []  # what this rank reads in the first epoch (docs/CASES.md C10, gathered at the end)
    # FSDP2: the health rules look at this rank's shard of each tensor (DTensor.to_local)
    health = HealthMonitor(
        [
            (name, p.to_local() if hasattr(p, "to_local") else p)
            for name, p in model.named_parameters()
            if p.requires_grad
        ]
    )
    model.train()
    t0 = time.perf_counter()
    state.boundary_rng = rng_state()
    # one process: a signal during a window's passes stops at once (the ranks of torchrun stop at one step)
    stop = _StopRequest(now=(lambda: state.in_window) if world is None else None)
    try:
        with stop:
            while state.step < steps:
                step = state.step
                rule_stop = clock.stop_reason()  # the rental's reserve reached (tuneproof.recipes.rental)
                stopping = (
                    stop.signum is not None or (stop_after is not None and step >= stop_after) or rule_stop is not None
                )
                ts = time.perf_counter()
                # the window of this step: `accumulation` micro-batches, or what is left of the epoch
                # (docs/CASES.md C18)
                window_idx = window_at(
                    n,
                    cfg.micro_batch_size,
                    cfg.gradient_accumulation_steps,
                    cfg.seed,
                    step,
                    world_size=ws,
                    rank=rank,
                    lengths=layout.lengths,
                )
                batches = layout.batches(train_set, window_idx)
                window = sum(supervised_count(b) for b in batches)
                if (
                    world is not None
                ):  # the global window: supervised tokens of every rank; a stop on any rank stops all
                    if step < plan["steps_per_epoch"]:
                        read.extend(i for idx in window_idx for i in idx)
                    window_f, stops = world.sum(window, float(stopping))
                    window, stopping = int(window_f), stops > 0
                if stopping:  # at the step boundary: checkpoint, then hand the signal on
                    if step > checkpoints.saved_step:
                        checkpoints.save(state, "interrupt")
                    if stop.signum is not None:
                        stop.reraise(stop.signum)
                    if rule_stop is not None:
                        raise Stopped(rule_stop)
                    raise KeyboardInterrupt(
                        f"stop_after={stop_after}"
                        if stop_after is not None and step >= stop_after
                        else "stopped with another rank"
                    )
                if window == 0:
                    raise CheckFailed(f"step {step + 1}: 0 supervised tokens in the accumulation window")
                state.in_window = True
                try:
                    total, step_tokens, vocab = backward_window(
                        fwd, batches, window, autocast=autocast, chunked=layout.chunked, world=world
                    )
                finally:
                    state.in_window = False
                step_examples = sum(len(idx) for idx in window_idx)
                if world is not None:
                    total, step_tokens_f, step_examples_f = world.sum(total, step_tokens, step_examples)
                    step_tokens, step_examples = int(step_tokens_f), int(step_examples_f)
                loss = total / window
                lr = optimizer.param_groups[0]["lr"]  # the learning rate this step uses
                grad_norm = health_grad_norm(params, cfg.max_grad_norm)  # before clipping; clipped in place if set
                row = {
                    "step": step + 1,
                    "epoch": step // plan["steps_per_epoch"],
                    "loss": round(loss, 6),
                    "lr": lr,
                    "grad_norm": grad_norm,
                    "supervised_tokens": window,
                    "micro_batches": len(batches),
                    "examples": step_examples,
                }
                try:  # the health rules before and after the update (docs/CASES.md C19)
                    health.before_update(step + 1, loss, grad_norm, vocab)
                    state.in_update = True
                    optimizer.step()
                    row["max_abs"] = health.after_update(step + 1)
                except HealthFault as fault:
                    _record_fault(run, fault, row)
                    raise
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                state.step += 1
                state.losses.append(loss)
                state.tokens_seen += step_tokens
                state.examples_seen += row["examples"]
                state.boundary_rng = rng_state()
                state.in_update = False
                if run is not None:
                    run.metric(**row, step_seconds=round(time.perf_counter() - ts, 4))
                    run.summary["last_step"] = state.step
                if checkpoints.due(state.step):
                    checkpoints.save(state, "final" if state.step == steps else "interval")
                if progress:
                    progress(state.step, steps, loss)
    except (KeyboardInterrupt, Terminated):
        if run is not None:
            checkpoints.on_signal(state)
        raise
    shares = share_report(world, read, n) if world is not None and read else None
    return {
        "steps": state.step,
        "total_steps": steps,
        "losses": state.losses,
        "tokens": state.tokens_seen,
        "examples": state.examples_seen,
        "budget": plan,
        "seconds": time.perf_counter() - t0,
        "normalisation": normalisation(world),
        "world_size": ws,
        "shares": shares,
    }
