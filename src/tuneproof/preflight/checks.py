"""The preflight's checks, in order: one row per check (:data:`CHECKS`).

Each :class:`Check` row says what the check is called (its row in the preflight's table and its key in
``preflight.json``), the module that holds its logic, when it applies (a study setting or a command-line
option), what runs it for each modality (or why a modality has none), and the plain names and units of the
numbers it puts in the run summary (shown by the dossier, :data:`PREFLIGHT_NAMES`). The recipe
(:mod:`tuneproof.recipes.preflight`) runs the rows in this order, lists the rows that cannot run as
skipped, with why, and the tests take the expected order from here (:func:`planned`).

Stages (the recipe's control flow; a row's place in the table is its place in the report):

- ``start``: environment, backend, training data, the model build (target modules, trainable parameters,
  embedding size) and ``training.speedups: auto``: run by the recipe itself, since each decides whether
  anything after it can run (no backend, no usable example, no model);
- ``model``: the checks on the built model, each ``run(bench)`` with the :class:`Bench` they share;
  a row with ``before`` set runs just before that row when that row applies (``gradient accumulation`` and
  ``precision`` compute in fp32 without autocast, so with ``training.bf16_base_weights`` they run on the
  fp32 weights before ``bf16 base weights`` casts them);
- ``end``: compile and the smoke pass (run only when ``step memory`` passed: the configured steps fit).

Adding a check: its module in ``tuneproof/preflight/`` with a ``check_*`` function and its test in
``tests/preflight/``, and one row here (a ``model`` row runs from the table alone).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from tuneproof.modalities import MODALITIES
from tuneproof.study import Study

PROBE_MICRO_BATCH = 1  # examples per micro-batch of the probes (update, accumulation, precision, checkpointing)
MODALITY_NAMES = tuple(m.name for m in MODALITIES)


def _always(study: Study) -> bool:
    return True


@dataclass(frozen=True)
class Check:
    """One preflight check.

    Attributes:
        name: its row in the table and its key in ``preflight.json``.
        module: the ``tuneproof.preflight`` module (or other unit) that holds its logic.
        stage: ``start``, ``model`` or ``end`` (see the module docstring).
        applies: whether the study runs it (default: always); read on the study as resolved.
        option: the ``tuneproof preflight`` option that turns it on (None: no option needed).
        run: modality name -> the name, in :mod:`tuneproof.preflight.bench`, of the function that runs it:
            ``fn(bench) -> check record`` for ``model`` rows; for ``start`` and ``end`` rows the module's
            function the recipe calls, with its own arguments. A modality absent here does not run the check.
        skipped_for: modality name -> why the check does not apply there (listed as skipped, with why).
        before: run just before this other check when that one applies (``model`` rows).
        speedup: the ``training`` key whose speed-up it proves: under ``training.speedups: auto`` a failure
            leaves that speed-up off (the row is then listed as passed, saying so).
        listed_when_skipped: listed as skipped when an earlier failure stops the preflight (the rows an
            option or ``training.speedups: auto`` adds are not).
        numbers: run-summary key -> ``(plain name, unit)`` of the numbers it contributes (the dossier's names).
    """

    name: str
    module: str
    stage: str = "model"
    applies: Callable[[Study], bool] = _always
    option: str | None = None
    run: dict[str, str] = field(default_factory=dict)
    skipped_for: dict[str, str] = field(default_factory=dict)
    before: str | None = None
    speedup: str | None = None
    listed_when_skipped: bool = True
    numbers: dict[str, tuple[str, str]] = field(default_factory=dict)


def _both(fn: str) -> dict[str, str]:
    return dict.fromkeys(MODALITY_NAMES, fn)


_NO_EMBEDDINGS = "an image classifier has no token embeddings"

# --------------------------------------------------------------------------- the table
#: every preflight check, in the order of the report
CHECKS: tuple[Check, ...] = (
    Check(
        "environment",
        "environment",
        "start",
        run=_both("check_environment"),
        numbers={"platform_key": ("platform", "")},
    ),
    Check(
        "backend",
        "backend",
        "start",
        run=_both("check_backend"),
        numbers={"dtype": ("training precision", ""), "dtype_reason": ("why this precision", "")},
    ),
    Check(
        "training data",
        "training_data",
        "start",
        run={"text": "check_text_training_data", "image": "check_image_training_data"},
    ),
    Check("target modules", "targets", "start", run=_both("check_target_modules")),
    Check(
        "trainable parameters",
        "targets",
        "start",
        run=_both("check_target_modules"),
        numbers={
            "trainable": ("trainable parameters", "parameters"),
            "total_params": ("parameters in total", "parameters"),
        },
    ),
    Check(
        "embedding size",
        "targets",
        "start",
        run={"text": "check_target_modules"},
        skipped_for={"image": _NO_EMBEDDINGS},
    ),
    Check(
        "speedups auto",
        "tuneproof.training.speedups",
        "start",
        applies=lambda s: s.training.speedups == "auto",
        run=_both("resolve_auto"),
        listed_when_skipped=False,
    ),
    Check(
        "bf16 base weights",
        "precision",
        applies=lambda s: s.training.bf16_base_weights,
        run=_both("bf16_base_weights"),
        speedup="bf16_base_weights",
    ),
    Check("update check", "update_check", run=_both("update")),
    Check("qlora storage", "qlora", applies=lambda s: s.method.kind == "qlora", run=_both("qlora_storage")),
    Check("qlora step", "qlora", applies=lambda s: s.method.kind == "qlora", run=_both("qlora_step")),
    Check(
        "step memory",
        "step_memory",
        run={"text": "text_step_memory", "image": "image_step_memory"},
        numbers={"budget_gib": ("memory budget", "GiB"), "peak_bytes": ("measured peak memory", "GiB")},
    ),
    Check(
        "eval memory",
        "eval_memory",
        run={"text": "text_eval_memory", "image": "image_eval_memory"},
        numbers={
            "eval_batch_s_per_example": ("evaluation time per example, one batch at eval.batch_size", "s"),
            "eval_batch_size": ("evaluation batch size", "examples"),
            "eval_batch_procedure": ("evaluation procedure timed", ""),
            "eval_peak_gib": ("evaluation batch, measured peak", "GiB"),
            "eval_batch_peak_gib": ("evaluation batch adds, measured", "GiB"),
            "eval_kv_cache_estimate_gib": ("evaluation KV cache, estimate", "GiB"),
            "eval_budget_gib": ("evaluation memory budget", "GiB"),
        },
    ),
    Check(
        "max micro-batch",
        "step_memory",
        option="--find-max-micro-batch",
        run={"text": "max_micro_batch"},
        listed_when_skipped=False,
        numbers={"max_micro_batch": ("largest micro-batch that fits the budget", "examples")},
    ),
    Check(
        "gradient accumulation",
        "accumulation",
        run=_both("accumulation"),
        before="bf16 base weights",
        numbers={"loss_normalisation": ("loss normalisation", "")},
    ),
    Check("precision", "precision", run=_both("precision"), before="bf16 base weights"),
    Check("activation checkpointing", "activation_checkpointing", run=_both("checkpointing")),
    # docs/CASES.md C22: outputs do not depend on eval.batch_size
    Check("eval batch size", "eval_batch", run={"text": "text_eval_batch", "image": "image_eval_batch"}),
    # docs/CASES.md C23: packed rows give each example's own per-token losses
    Check("packing", "packing", applies=lambda s: s.training.packing, run={"text": "packing"}),
    # the check train runs before it uses the chunked loss, here before the hours are spent
    Check("chunked loss", "chunked_loss", applies=lambda s: s.training.chunked_loss, run={"text": "chunked_loss"}),
    Check(
        "compile",
        "tuneproof.training.compiled",
        "end",
        applies=lambda s: s.training.compile,
        run=_both("prove_compile"),
        listed_when_skipped=False,
    ),
    Check("configured combination", "smoke", "end", run=_both("check_smoke")),
    Check(
        "smoke pass",
        "smoke",
        "end",
        run=_both("check_smoke"),
        numbers={
            "reload_seconds": ("checkpoint save and reload", "s"),
            "eval_seconds": ("evaluation time", "s"),
            "n_eval": ("examples evaluated", "examples"),
        },
    ),
    Check(
        "throughput",
        "smoke",
        "end",
        run=_both("check_smoke"),
        numbers={
            "s_per_step": ("time per optimizer step", "s"),
            "tokens_per_s": ("training throughput", "tokens/s"),
            "eval_s_per_example": ("evaluation time per example (smoke pass)", "s"),
            "budget_seconds": ("time for the step budget", "s"),
            "eval_seconds_estimate": ("evaluation of the split, estimate", "s"),
            "total_steps": ("optimizer steps in the budget", "steps"),
        },
    ),
)

BY_NAME: dict[str, Check] = {c.name: c for c in CHECKS}

#: plain names and units of the preflight run summary's numbers (key: the last part of a dotted key): each
#: check's own, and the preflight's duration
PREFLIGHT_NAMES: dict[str, tuple[str, str]] = {
    **{k: v for c in CHECKS for k, v in c.numbers.items()},
    "preflight_seconds": ("preflight duration", "s"),
}


def applies(check: Check, study: Study, options: frozenset[str] = frozenset()) -> bool:
    """Whether ``study`` (with the ``tuneproof preflight`` ``options`` given) runs ``check`` at all."""
    return (check.option is None or check.option in options) and bool(check.applies(study))


def skippable(study: Study, after: str = "backend") -> list[str]:
    """The checks after ``after`` that an early stop lists as skipped (whatever the modality), in order."""
    names = [c.name for c in CHECKS]
    rest = CHECKS[names.index(after) + 1 :]
    return [c.name for c in rest if c.listed_when_skipped and applies(c, study)]


def model_stage(study: Study, modality: str, options: frozenset[str] = frozenset()) -> Iterator[Check]:
    """The ``model`` rows that ``study`` runs on ``modality``, in the order they run (a row with ``before``
    just before that row when that row applies; once)."""
    rows = [c for c in CHECKS if c.stage == "model" and applies(c, study, options) and modality in c.run]
    done: set[str] = set()
    for row in rows:
        for early in rows:
            if early.before == row.name and early.name not in done:
                done.add(early.name)
                yield early
        if row.name not in done:
            done.add(row.name)
            yield row


def planned(study: Study, modality: str, options: frozenset[str] = frozenset()) -> list[str]:
    """The names of the checks a preflight of ``study`` on ``modality`` records, in order, when every check
    passes: the ``start`` rows, the ``model`` rows (:func:`model_stage`), the rows ``modality`` skips, then the
    ``end`` rows."""
    start = [c.name for c in CHECKS if c.stage == "start" and applies(c, study, options) and modality in c.run]
    model = [c.name for c in model_stage(study, modality, options)]
    skips = [c.name for c in CHECKS if modality in c.skipped_for]
    end = [c.name for c in CHECKS if c.stage == "end" and applies(c, study, options)]
    return start + model + skips + end
