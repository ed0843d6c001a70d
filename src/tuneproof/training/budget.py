"""The step budget of a run: micro-batches and optimizer steps per epoch, and the optimizer steps
``training.max_steps`` or ``training.epochs`` ask for. Pure arithmetic (no torch), so commands that
only plan (`tuneproof plan`) stay light; :mod:`tuneproof.training.data_order` decides which
examples each step reads.
"""

from __future__ import annotations

import math
from typing import Any

from tuneproof.errors import TuneproofError
from tuneproof.study import DEFAULT_EPOCHS


def check_shape(n: int, micro_batch: int, world_size: int, rank: int) -> None:
    if n < 1:
        raise ValueError(f"n must be >= 1 (got {n})")
    if micro_batch < 1:
        raise ValueError(f"micro_batch must be >= 1 (got {micro_batch})")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")


def micro_batches_per_epoch(n: int, micro_batch: int, world_size: int = 1) -> int:
    """Micro-batches per process per epoch: ``ceil(ceil(n / world_size) / micro_batch)``."""
    check_shape(n, micro_batch, world_size, 0)
    return math.ceil(math.ceil(n / world_size) / micro_batch)


def optimizer_steps_per_epoch(n: int, micro_batch: int, accumulation: int, world_size: int = 1) -> int:
    """Optimizer steps per epoch: ``ceil(micro_batches_per_epoch / accumulation)`` (the last window
    of the epoch may hold fewer than ``accumulation`` micro-batches; windows never cross epochs).

    Raises:
        ValueError: ``accumulation < 1`` (and as :func:`micro_batches_per_epoch`).
    """
    if accumulation < 1:
        raise ValueError(f"accumulation must be >= 1 (got {accumulation})")
    return math.ceil(micro_batches_per_epoch(n, micro_batch, world_size) / accumulation)


def budget(cfg, n_examples: int, world_size: int = 1) -> dict[str, Any]:
    """The step budget of a run and which key set it (docs/CASES.md C18: epochs are epochs).

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
    if cfg.max_steps is not None and cfg.epochs is not None:
        raise TuneproofError(
            f"training.max_steps ({cfg.max_steps}) and training.epochs ({cfg.epochs:g}) are both set",
            hint="the step budget comes from one of them; remove the other",
        )
    per_epoch = optimizer_steps_per_epoch(n_examples, cfg.micro_batch_size, cfg.gradient_accumulation_steps, world_size)
    if cfg.max_steps is not None:
        key, value, steps = "training.max_steps", cfg.max_steps, cfg.max_steps
    else:
        key, value = ("training.epochs", cfg.epochs) if cfg.epochs is not None else ("default", DEFAULT_EPOCHS)
        steps = max(1, math.ceil(round(value * per_epoch, 9)))
    return {
        "key": key,
        "value": value,
        "total_steps": steps,
        "steps_per_epoch": per_epoch,
        "micro_batches_per_epoch": micro_batches_per_epoch(n_examples, cfg.micro_batch_size, world_size),
        "examples_per_epoch": math.ceil(n_examples / world_size),
    }


def total_steps(cfg, n_examples: int, world_size: int = 1) -> int:
    """Optimizer steps of the budget (:func:`budget`; per process with ``world_size`` processes)."""
    return budget(cfg, n_examples, world_size)["total_steps"]


#: warmup longer than this fraction of the run's optimizer steps is a finding (most of the run at a reduced LR)
WARMUP_MOST = 0.5


def warmup_finding(cfg, steps: int) -> str | None:
    """A warning when ``training.warmup_steps`` covers all or most of a run of ``steps`` optimizer steps.

    ``transformers.get_scheduler`` warms up linearly: optimizer step ``k`` (1-based) uses
    ``lr * (k - 1) / warmup_steps`` while ``k <= warmup_steps`` (transformers' ``get_linear_schedule_with_warmup``),
    so step 1 updates at lr 0 (a no-op) and the last step reaches ``min(1, (steps - 1) / warmup_steps)`` of
    ``training.learning_rate``. ``lr_scheduler: constant`` ignores ``warmup_steps`` (also a finding).

    Returns:
        One line naming ``training.warmup_steps``, the optimizer steps and the peak LR fraction reached, or None
        (no warmup, or warmup at most :data:`WARMUP_MOST` of the run).
    """
    warm = cfg.warmup_steps
    if warm <= 0:
        return None
    if cfg.lr_scheduler == "constant":
        return (
            f"training.warmup_steps {warm} is ignored by lr_scheduler constant (no warmup happens); "
            "set training.lr_scheduler: constant_with_warmup, or training.warmup_steps: 0"
        )
    if warm <= WARMUP_MOST * steps:
        return None
    peak = min(1.0, (steps - 1) / warm)
    lr = cfg.learning_rate
    whole = warm >= steps
    return (
        f"training.warmup_steps {warm} covers {'all' if whole else 'most'} of the run's {steps} optimizer steps: "
        + (
            f"the learning rate peaks at {peak:.0%} of training.learning_rate ({peak * lr:.3g} of {lr:g}) and never "
            "reaches it"
            if whole
            else f"{warm} of {steps} steps at a reduced learning rate"
        )
        + "; step 1 updates at lr 0 (a no-op update, warmup starts at 0); "
        f"set training.warmup_steps to {steps // 10}{' or less' if steps >= 10 else ''} (about 10% of the run) "
        "or raise the budget"
    )
