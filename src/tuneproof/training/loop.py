"""The training loop: one optimizer step per ``gradient_accumulation_steps`` micro-batches, with the
loss normalised per supervised token over the whole window (CASES C1), exact resumable
checkpoints (model/adapter, optimizer, scheduler, RNG states, data position; CASES C12) and a
refusal to continue on a NaN loss.

Engines: PyTorch + transformers (model, ``get_scheduler``) + PEFT (adapters). A checkpoint is one
dict (nanoGPT style) holding everything needed to resume and to explain the run.
"""

from __future__ import annotations

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

from tuneproof.data.preprocess import Encoded, collate
from tuneproof.errors import CheckFailed, TuneproofError
from tuneproof.training.loss import NORMALISATION, token_loss_sum

CKPT_FORMAT = 1


@dataclass
class LoopState:
    step: int = 0  # optimizer steps done


def total_steps(cfg, n_examples: int) -> int:
    """Optimizer steps of the budget: ``max_steps``, else ``ceil(epochs * n / (micro_batch * accumulation))``."""
    if cfg.max_steps:
        return cfg.max_steps
    per_step = cfg.micro_batch_size * cfg.gradient_accumulation_steps
    return max(1, math.ceil((cfg.epochs or 1) * n_examples / per_step))


def micro_batch_indices(n: int, micro_batch: int, seed: int, index: int) -> list[int]:
    """Example indices of global micro-batch number ``index``.

    The order is a permutation of ``range(n)`` per epoch, seeded with ``seed + epoch``, so it
    changes between epochs and is the same after a resume. The last micro-batch of an epoch may be
    short.
    """
    per_epoch = math.ceil(n / micro_batch)
    epoch, k = divmod(index, per_epoch)
    g = torch.Generator().manual_seed(seed * 1000003 + epoch)
    perm = torch.randperm(n, generator=g).tolist()
    return perm[k * micro_batch : (k + 1) * micro_batch]


def trainable_state(model) -> dict[str, torch.Tensor]:
    """Every tensor with ``requires_grad`` (LoRA matrices, modules_to_save, or all for full FT), on CPU."""
    return {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters() if p.requires_grad}


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def save_checkpoint(path: Path, payload: dict[str, Any]) -> Path:
    """``torch.save`` to a temp file and rename (atomic)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint`.

    Raises:
        TuneproofError: missing or unreadable file (names it).
    """
    if not path.is_file():
        raise TuneproofError(f"{path}: checkpoint file not found")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # noqa: BLE001
        raise TuneproofError(f"{path}: unreadable checkpoint ({type(err).__name__}: {err})") from None
    for key in ("format", "step", "trainable", "optimizer", "scheduler", "rng", "config"):
        if key not in ckpt:
            raise TuneproofError(f"{path}: checkpoint has no '{key}'", hint="it was not written by tuneproof or is damaged")
    return ckpt


def latest_checkpoint(run_dir: Path) -> Path | None:
    ckpts = sorted((run_dir / "checkpoints").glob("step-*.pt"))
    return ckpts[-1] if ckpts else None


def _micro_loss(model, batch: dict[str, torch.Tensor], autocast: Callable) -> tuple[torch.Tensor, int]:
    """Summed loss of one micro-batch and its supervised count (tokens, or examples for classification)."""
    labels = batch["labels"]
    with autocast():
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    if labels.dim() == 1:  # sequence classification: one target per example
        return F.cross_entropy(out.logits.float(), labels, reduction="sum"), int(labels.numel())
    return token_loss_sum(out.logits, labels), int((labels[:, 1:] != -100).sum())


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

    Returns:
        ``{"steps", "losses": [per-step loss], "tokens", "seconds", "normalisation"}``.

    Raises:
        CheckFailed: a NaN/inf loss, or a window with 0 supervised tokens.
    """
    from transformers import get_scheduler  # noqa: PLC0415

    n = len(train_set)
    steps = total_steps(cfg, n)
    accum = cfg.gradient_accumulation_steps
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise CheckFailed("no trainable parameters: the method froze everything", hint="check method.target_modules")
    optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    scheduler = get_scheduler(cfg.lr_scheduler, optimizer, num_warmup_steps=cfg.warmup_steps, num_training_steps=steps)
    losses: list[float] = []
    start_step = 0
    seed_everything(cfg.seed)
    if resume is not None:
        named = dict(model.named_parameters())
        for name, tensor in resume["trainable"].items():
            if name not in named:
                raise TuneproofError(f"checkpoint tensor '{name}' is not in the model", hint="the method or base model changed since the checkpoint")
            with torch.no_grad():
                named[name].copy_(tensor.to(named[name].device, named[name].dtype))
        optimizer.load_state_dict(resume["optimizer"])
        scheduler.load_state_dict(resume["scheduler"])
        set_rng_state(resume["rng"])
        start_step = int(resume["step"])
        losses = list(resume.get("losses", []))

    def checkpoint(step: int) -> Path | None:
        if run is None:
            return None
        payload = {
            "format": CKPT_FORMAT, "step": step, "trainable": trainable_state(model),
            "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": rng_state(),
            "config": config or {}, "losses": losses, "total_steps": steps, **(extra or {}),
        }
        path = save_checkpoint(run.dir / "checkpoints" / f"step-{step:06d}.pt", payload)
        for old in sorted((run.dir / "checkpoints").glob("step-*.pt"))[:-2]:
            old.unlink()
        return path

    model.train()
    t0 = time.perf_counter()
    tokens_seen = 0
    step = start_step
    try:
        while step < steps:
            if stop_after is not None and step >= stop_after:
                raise KeyboardInterrupt(f"stop_after={stop_after}")
            ts = time.perf_counter()
            batches = []
            for j in range(accum):
                idx = micro_batch_indices(n, cfg.micro_batch_size, cfg.seed, step * accum + j)
                batches.append({k: v.to(device) for k, v in collate([train_set[i] for i in idx], pad_id).items()})
            window = sum(int((b["labels"][:, 1:] != -100).sum()) if b["labels"].dim() == 2 else b["labels"].numel() for b in batches)
            if window == 0:
                raise CheckFailed(f"step {step + 1}: 0 supervised tokens in the accumulation window")
            total = 0.0
            for b in batches:
                loss_sum, _ = _micro_loss(model, b, autocast)
                # divide by the window's token count, not per micro-batch: per-token mean over the window (C1)
                (loss_sum / window).backward()
                total += loss_sum.item()
                tokens_seen += int(b["attention_mask"].sum())
            loss = total / window
            if not math.isfinite(loss):
                raise CheckFailed(f"step {step + 1}: loss is {loss}", hint="lower training.learning_rate or check the data; the run is invalid")
            grad_norm = None
            if cfg.max_grad_norm:
                grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            losses.append(loss)
            if run is not None:
                run.metric(step=step, loss=round(loss, 6), lr=scheduler.get_last_lr()[0], grad_norm=grad_norm,
                           supervised_tokens=window, step_seconds=round(time.perf_counter() - ts, 4))
                run.summary["last_step"] = step
                if step % cfg.checkpoint_every == 0 or step == steps:
                    checkpoint(step)
            if progress:
                progress(step, steps, loss)
    except KeyboardInterrupt:
        if run is not None and step > start_step:
            checkpoint(step)
            run.summary["last_step"] = step
        raise
    return {"steps": step, "total_steps": steps, "losses": losses, "tokens": tokens_seen,
            "seconds": time.perf_counter() - t0, "normalisation": NORMALISATION}
