"""What runs each model check of the preflight's table (:data:`tuneproof.preflight.checks.CHECKS`): the
:class:`Bench` the checks on a built model share, and for each ``model`` row a function ``fn(bench) -> check
record`` that calls its module's ``check_*`` function. The table names these functions (and the functions the
recipe calls for the ``start`` and ``end`` rows, imported here) by their names in this module, so that the
table itself loads without torch (the dossier reads its plain names and units)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tuneproof.context import StudyContext
from tuneproof.data.image_pipeline import collate_images
from tuneproof.preflight import image_checks
from tuneproof.preflight.accumulation import accumulation_probes, check_accumulation_window
from tuneproof.preflight.activation_checkpointing import check_study_checkpointing
from tuneproof.preflight.backend import check_backend
from tuneproof.preflight.checks import PROBE_MICRO_BATCH
from tuneproof.preflight.chunked_loss import check_study_chunked_loss
from tuneproof.preflight.environment import check_environment
from tuneproof.preflight.eval_batch import check_study_eval_batch
from tuneproof.preflight.eval_memory import check_eval_memory, evaluated_batch_size
from tuneproof.preflight.packing import check_study_packing
from tuneproof.preflight.precision import check_bf16_base_weights, check_precision
from tuneproof.preflight.qlora import check_qlora_step, check_qlora_storage
from tuneproof.preflight.report import check_result
from tuneproof.preflight.smoke import check_smoke
from tuneproof.preflight.step_memory import check_max_micro_batch, check_step_memory
from tuneproof.preflight.targets import check_target_modules
from tuneproof.preflight.training_data import check_image_training_data, check_text_training_data
from tuneproof.preflight.update_check import check_update_step
from tuneproof.training.compiled import prove_compile
from tuneproof.training.speedups import resolve_auto

__all__ = [  # the start and end rows' functions, named by the table
    "check_backend",
    "check_environment",
    "check_image_training_data",
    "check_smoke",
    "check_target_modules",
    "check_text_training_data",
    "prove_compile",
    "resolve_auto",
]


@dataclass
class Bench:
    """What the ``model`` checks share: the study context, the model built as ``train`` builds it, the usable
    encoded train examples, the probe micro-batch (:data:`PROBE_MICRO_BATCH` examples), the pad id (0 for
    images), the ``training data`` record, the device choice (``{"dtype", "reason", ...}``), the memory
    budget in bytes and where it came from, and the autocast context of the chosen precision.
    ``ctx.study`` is read at run time: under ``training.speedups: auto`` it holds what auto resolved to."""

    ctx: StudyContext
    model: Any
    usable: list
    probe: dict
    pad: int
    data_check: dict[str, Any]
    choice: dict[str, Any]
    budget: int
    budget_source: str
    autocast: Callable


# --------------------------------------------------------------------------- what runs each model check
def _training(b: Bench):
    return b.ctx.study.training


def accumulation(b: Bench) -> dict[str, Any]:
    cfg = _training(b)
    windows, last = accumulation_probes(b.usable, cfg, b.pad, PROBE_MICRO_BATCH)
    return check_accumulation_window(b.model, windows, cfg.gradient_accumulation_steps, last)


def precision(b: Bench) -> dict[str, Any]:
    return check_precision(b.model, b.probe, b.choice, b.autocast)


def bf16_base_weights(b: Bench) -> dict[str, Any]:
    return check_bf16_base_weights(b.ctx, b.model, b.usable, b.pad, b.autocast)


def update(b: Bench) -> dict[str, Any]:
    return check_update_step(b.model, b.probe, b.autocast, _training(b))  # the run's own optimizer (issue 33 item 11)


def qlora_storage(b: Bench) -> dict[str, Any]:
    return check_qlora_storage(b.ctx)


def qlora_step(b: Bench) -> dict[str, Any]:
    return check_qlora_step(b.model, b.probe, b.autocast)


def step_lengths(b: Bench) -> list[int]:
    """The token lengths the text step memory is measured at: the p95 train length after truncation and
    ``training.max_length`` (one length when they are equal)."""
    cfg = _training(b)
    p95 = b.data_check["numbers"].get("p95") or cfg.max_length
    return sorted({min(p95, cfg.max_length), cfg.max_length})


def text_step_memory(b: Bench) -> dict[str, Any]:
    dtype = b.choice["dtype"]
    return check_step_memory(b.model, b.ctx, b.usable, step_lengths(b), dtype, b.budget, b.budget_source, b.autocast)


def _device(b: Bench):
    return b.ctx.torch_setup()[0]


def image_step_memory(b: Bench) -> dict[str, Any]:
    batch = collate_images(b.usable[: _training(b).micro_batch_size])
    on_device = {k: v.to(_device(b)) for k, v in batch.items()}
    return check_result("step memory", **image_checks.check_image_step_memory(b.model, on_device, b.budget, b.autocast))


def text_eval_memory(b: Bench) -> dict[str, Any]:
    return check_eval_memory(b.model, b.ctx, b.budget, b.budget_source, b.autocast)


def image_eval_memory(b: Bench) -> dict[str, Any]:
    evals = b.ctx.eval_examples()
    images = collate_images(b.ctx.pipeline.encode_all(evals[: b.ctx.study.eval.batch_size]))
    on_device = {k: v.to(_device(b)) for k, v in images.items()}
    return check_result("eval memory", **image_checks.check_image_eval_memory(b.model, on_device, b.budget, b.autocast))


def max_micro_batch(b: Bench) -> dict[str, Any]:
    dtype = b.choice["dtype"]
    return check_max_micro_batch(b.model, b.ctx, b.usable, step_lengths(b)[0], dtype, b.budget, b.autocast)


def checkpointing(b: Bench) -> dict[str, Any]:
    return check_study_checkpointing(b.ctx, b.model, b.probe)


def text_eval_batch(b: Bench) -> dict[str, Any]:
    return check_study_eval_batch(b.ctx, b.model)


def image_eval_batch(b: Bench) -> dict[str, Any]:
    evals = b.ctx.eval_examples()
    size = evaluated_batch_size(b.ctx.study.eval.batch_size, len(evals))
    sample = evals[: max(2, min(len(evals), 2 * size))]
    return check_result(
        "eval batch size",
        **image_checks.check_image_eval_batch(
            b.model, b.ctx.pipeline, sample, b.ctx.labels, size, _device(b), b.autocast
        ),
    )


def packing(b: Bench) -> dict[str, Any]:
    return check_study_packing(b.model, b.usable, _training(b), b.pad)


def chunked_loss(b: Bench) -> dict[str, Any]:
    return check_study_chunked_loss(b.model, b.usable, _training(b), b.pad)
