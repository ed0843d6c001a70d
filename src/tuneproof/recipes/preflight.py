"""Recipe ``preflight``: the initial-check phase that fails before the rental hours are spent
(PROTOCOL.md steps 4, 5 and 6). One registry run of kind ``preflight``; every check below is a
dict ``{"name", "passed", "numbers", "message", "details"}`` stored in ``runs/<id>/preflight.json``
and summarised in the run summary. Any failed check fails the run (exit 3) after the report is
written; ``train`` refuses to start without a passed preflight for the same resolved config (keys
that cannot change what it measured left out, :mod:`tuneproof.preflight.scope`), data fingerprint
and platform (:func:`require_preflight`).

Checks, in order (config key or option behind each):

1. ``environment``: :func:`~tuneproof.preflight.envinfo.environment_snapshot` compared with the
   ``env.json`` of the latest completed baseline or train run; a platform change is flagged with
   the checks to redo (a flag, not a failure: the baseline is what must be redone).
2. ``backend``: dtype for ``training.precision`` on the detected device, with the reason (CASES
   C9); extensions named by the config (``training.extensions``: not in the study schema yet, so
   none by default) installed and built for this backend.
3. ``training data``: the train split through the trainer's exact preprocessing; no hard fault
   (what ``train`` refuses); token lengths p50/p95/max after truncation (``training.max_length``).
4. ``target modules``: matches per pattern of ``method.target_modules`` (zero matches fails, C5),
   per tower on encoder-decoder and multimodal models (a pattern matching in several towers is a warning);
   ``trainable parameters``: trainable/total and ``method.modules_to_save``; ``embedding size``:
   embedding rows vs the tokenizer, added tokens trained and saved.
4b. ``bf16 base weights`` (only with ``training.bf16_base_weights: true``): loss and trained
   gradients with the frozen weights in bf16 vs fp32 on the configured micro-batch, within stated
   tolerances, and the peak memory with each; the later checks then run with bf16 frozen weights
   (``gradient accumulation`` and ``precision``, which compute in fp32 without autocast, run
   just before it, on the fp32 weights).
5. ``update check``: the model built exactly as ``train`` builds it (``StudyContext.build_model``),
   real optimizer steps on a real train micro-batch under the configured precision: every
   trainable tensor changed, every frozen tensor bitwise unchanged (C7); the model is restored.
5b. ``qlora storage`` and ``qlora step`` (only with ``method.kind: qlora``,
   :mod:`tuneproof.preflight.qlora`): the 4-bit storage dtype is shardable when
   ``distributed.strategy`` is fsdp (this single process shards nothing: a warning; ``train
   --nproc-per-node N`` refuses); one real step on the probe micro-batch has a finite, non-zero
   loss and LoRA gradient norm (the silent loss 0.0 / grad NaN failure).
6. ``step memory``: complete steps (forward, loss, backward, clipping, AdamW step) at the
   configured micro-batch (``training.micro_batch_size``) at the p95 train length and at
   ``training.max_length``: estimate next to the measured peak (C8); fails when either exceeds
   the budget (``--memory-budget``, default the device's memory, or RAM on CPU).
   ``max micro-batch`` (``--find-max-micro-batch``): the largest micro-batch whose measured peak
   fits the budget at the p95 length.
   ``eval memory``: one evaluation batch at ``eval.batch_size`` (the longest prompts, generation
   with the KV cache for ``eval.max_new_tokens`` new tokens; or the classification forward pass),
   measured the same way; fails when its peak exceeds the budget, naming ``eval.batch_size``.
7. ``gradient accumulation``: ``max(2, training.gradient_accumulation_steps)`` real micro-batches
   vs their concatenation: same loss and gradients, per-token normalisation stored (C1); when an
   epoch's micro-batches are not a multiple of the accumulation, the short last window of the
   epoch (the micro-batches training puts there) vs its concatenation too (C18).
8. ``precision``: the chosen dtype alone vs fp32 on one real micro-batch (loss and gradient
   direction within stated tolerances; fp32 is the reference and needs no comparison).
9. ``activation checkpointing``: gradients equal with and without it
   (``training.activation_checkpointing`` flipped on a second model built the same way), with the
   change in step time and memory.
9b. ``eval batch size``: greedy outputs of a length-spread sample of evaluation examples at batch
    size 1 and at ``eval.batch_size`` are identical; fails naming the first differing example
    (CASES C22, :mod:`tuneproof.preflight.eval_batch`).
9c. ``packing`` (only with ``training.packing: true``): per-token losses of packed rows of the
    shortest training examples equal those of each example alone, and the same rows with the
    neighbours visible differ (CASES C23, :mod:`tuneproof.preflight.packing`).
9d. ``chunked loss`` (only with ``training.chunked_loss: true``): the check train runs before it uses
    the chunked loss, on the first micro-batch (packed when packing is on): loss and gradients equal
    the full-logits loss; a classification head fails it naming the key.
10. ``configured combination``: two real optimizer steps of ``training.loop.train`` with every
    configured option together (micro-batch, accumulation, checkpointing, precision); losses
    finite, every trainable tensor changed, frozen ones bitwise unchanged.
11. ``smoke pass``: those steps, an evaluation of :data:`SMOKE_EVAL_EXAMPLES` evaluation examples
    by the study's procedure (``recipes.common.predict``), the adapter saved with
    ``save_pretrained`` into ``runs/<id>/smoke/``, reloaded onto the base in a fresh process
    (``python -m tuneproof.recipes.preflight reload``) that predicts the same examples: identical
    predictions and next-token logits within :data:`LOGIT_ATOL` (fp32).
12. ``throughput``: tokens/s and s/step at the configured micro-batch (from the smoke steps after
    the first), the time of the configured budget (``training.max_steps`` or ``epochs``) and of one
    evaluation (``eval.max_examples``); stored as ``s_per_step``, ``tokens_per_s``,
    ``eval_s_per_example``, ``budget_seconds`` (read by ``tuneproof plan``).

Checks 10 to 12 are skipped when ``step memory`` failed (the configured steps would not fit), and
every check after a failed ``backend`` or ``target modules`` (no model to check); a check that
raises is recorded as failed with the error and its traceback, and the others still run.

Probes (update check, accumulation, precision, checkpointing) use micro-batches of
:data:`PROBE_MICRO_BATCH` real train examples (the first of the training order) to stay cheap;
the step memory, combination and smoke steps use the configured micro-batch.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from tuneproof.context import StudyContext
from tuneproof.errors import CheckFailed, TuneproofError
from tuneproof.io import fault_cause
from tuneproof.ui import console, table

PREFLIGHT_FILE = "preflight.json"
SMOKE_CHECKS = ("configured combination", "smoke pass", "throughput")
SMOKE_STEPS = 2  # optimizer steps of the smoke pass (also the configured-combination check)
SMOKE_EVAL_EXAMPLES = 2  # evaluation examples of the smoke pass (predicted, reloaded, predicted again)
PROBE_MICRO_BATCH = 1  # examples per micro-batch of the probes (update, accumulation, precision, checkpointing)
RELOAD_TIMEOUT_S = 1800  # the fresh-process reload (imports, model load, generation)
LOGIT_ATOL = 1e-4  # fp32 next-token logits after the reload (as tuneproof.deliver.verify.LOGIT_ATOL)
LOGIT_ATOL_LOW_PRECISION = 5e-2  # bf16/fp16 autocast: 2**-8 relative rounding of logits of magnitude ~10
#: Precision check: the loss in the chosen 16-bit dtype within 2% of fp32 and the gradient
#: direction (cosine over every trainable element) >= 0.98. bf16 keeps 8 significant bits
#: (relative rounding 2**-8 = 0.4% per operation); these bounds leave room for accumulation
#: over a few hundred operations while catching overflow, underflow and wrong casts.
PRECISION_LOSS_RTOL = 0.02
PRECISION_GRAD_COSINE = 0.98
FIND_MAX_FACTOR = 4  # --find-max-micro-batch tries at most 4x the largest micro-batch whose estimate fits
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
GIB = 2**30


# --------------------------------------------------------------------------- small helpers
def parse_memory(text: str | int) -> int:
    """Bytes from ``"80GiB"``, ``"512 MiB"``, ``"16GB"`` (10**9), ``"1.5g"`` (GiB) or a plain byte count.

    Raises:
        TuneproofError: not a positive size with a known unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB).
    """
    if isinstance(text, int):
        value = text
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
        unit = (m.group(2) if m else "").lower() or "b"
        if not m or unit not in _UNITS:
            raise TuneproofError(f"--memory-budget {text!r}: not a memory size",
                                 hint="write e.g. 80GiB, 512MiB or 16GB (GB = 10**9 bytes, GiB = 2**30)")
        value = int(float(m.group(1)) * _UNITS[unit])
    if value <= 0:
        raise TuneproofError(f"--memory-budget {text!r}: must be more than 0 bytes")
    return value


def _gib(n: int | float | None) -> float | None:
    return None if n is None else round(n / GIB, 4)


def _check(name: str, passed: bool | None, message: str, numbers: dict[str, Any] | None = None,
           details: Any = None, **extra: Any) -> dict[str, Any]:
    return {"name": name, "passed": passed, "numbers": numbers or {}, "message": message, "details": details, **extra}


def _same_bits(a, b) -> bool:
    import torch  # noqa: PLC0415

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8))


def _is_oom(err: BaseException) -> bool:
    import torch  # noqa: PLC0415

    oom = tuple(t for t in (getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None)) if t)
    return isinstance(err, MemoryError) or bool(oom and isinstance(err, oom)) or "out of memory" in str(err).lower()


def _cpu_copy(model) -> dict[str, Any]:
    return {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters()}


def _trainable(model) -> list:
    return [p for p in model.parameters() if p.requires_grad]


def _restore(model, snapshot: dict[str, Any]) -> None:
    import torch  # noqa: PLC0415

    with torch.no_grad():
        for n, p in model.named_parameters():
            if n in snapshot:
                p.copy_(snapshot[n].to(p.device))
            p.grad = None


class _Report:
    """The checks collected so far; each is printed as it is added."""

    def __init__(self) -> None:
        self.checks: list[dict[str, Any]] = []
        self._mark = time.perf_counter()

    def add(self, check: dict[str, Any]) -> dict[str, Any]:
        now = time.perf_counter()
        check.setdefault("seconds", round(now - self._mark, 2))  # wall-clock since the previous check
        self._mark = now
        self.checks.append(check)
        tag = {True: "[green]pass[/]", False: "[red]FAIL[/]", None: "[dim]skip[/]"}[check["passed"]]
        console.print(f"{tag} {check['name']}: {check['message']}", soft_wrap=True)
        if check.get("warning"):
            console.print(f"[yellow]warning[/] {check['warning']}", soft_wrap=True)
        return check

    def run(self, name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Run one check; an exception inside it is the check's failure (recorded with its traceback)."""
        try:
            return self.add(fn())
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as err:  # noqa: BLE001 - a crash of a check is its verdict
            if fault_cause(err):  # disk full / read-only: a fault of the machine, not of the check (the run fails with it)
                raise
            if _is_oom(err):
                import gc  # noqa: PLC0415

                gc.collect()
            msg = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
            return self.add(_check(name, False, f"error: {msg}", details={"traceback": traceback.format_exc()}))

    def skip(self, name: str, why: str) -> None:
        self.add(_check(name, None, f"skipped: {why}"))

    def get(self, name: str) -> dict[str, Any] | None:
        return next((c for c in self.checks if c["name"] == name), None)

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [c for c in self.checks if c["passed"] is False]


# --------------------------------------------------------------------------- batches
def _micro_batch(encoded: list, size: int, seed: int, index: int, pad_id: int) -> dict:
    """Micro-batch number ``index`` of the training order (``training.loop.micro_batch_indices``) at ``size``."""
    from tuneproof.data.preprocess import collate  # noqa: PLC0415
    from tuneproof.training.loop import micro_batch_indices  # noqa: PLC0415

    idx = micro_batch_indices(len(encoded), size, seed, index)
    return collate([encoded[i] for i in idx], pad_id)


def _last_window_probe(encoded: list, cfg, size: int, pad_id: int) -> list[dict] | None:
    """The short last accumulation window of epoch 0, or None when the epoch's windows are all full:
    its real micro-batches (the examples training puts there), each cut to its first ``size``
    examples to keep the probe cheap."""
    from tuneproof.data.preprocess import collate  # noqa: PLC0415
    from tuneproof.preflight.accumulation import last_window_micro_batches  # noqa: PLC0415
    from tuneproof.training.data_order import optimizer_steps_per_epoch, window_at  # noqa: PLC0415

    n, mb, accum = len(encoded), cfg.micro_batch_size, cfg.gradient_accumulation_steps
    if last_window_micro_batches(n, mb, accum) == accum:
        return None
    window = window_at(n, mb, accum, cfg.seed, optimizer_steps_per_epoch(n, mb, accum) - 1)
    return [collate([encoded[i] for i in idx[:size]], pad_id) for idx in window]


def _batch_at_length(encoded: list, micro_batch: int, length: int, pad_id: int) -> dict:
    """``micro_batch`` real examples padded/truncated to exactly ``length`` tokens (``[B, length]``).

    The examples whose length is closest to ``length`` from above come first (truncated to it),
    then the closest shorter ones (right-padded); the list is cycled when it is shorter than the
    micro-batch. Compute and memory of a step depend on the padded width, so this is the step of
    a micro-batch of that length.
    """
    import torch  # noqa: PLC0415

    from tuneproof.data.preprocess import collate  # noqa: PLC0415
    from tuneproof.data.preprocess import IGNORE_INDEX  # noqa: PLC0415

    ranked = sorted(encoded, key=lambda e: (len(e.input_ids) < length, abs(len(e.input_ids) - length), e.id))
    chosen = [ranked[i % len(ranked)] for i in range(micro_batch)]
    cut = [dataclasses.replace(e, input_ids=e.input_ids[:length], labels=e.labels[:length]) for e in chosen]
    batch = collate(cut, pad_id)
    width = batch["input_ids"].shape[1]
    if width < length:
        extra = length - width
        b = batch["input_ids"].shape[0]
        batch["input_ids"] = torch.cat([batch["input_ids"], torch.full((b, extra), pad_id, dtype=torch.long)], 1)
        batch["attention_mask"] = torch.cat([batch["attention_mask"], torch.zeros((b, extra), dtype=torch.long)], 1)
        if batch["labels"].dim() == 2:
            batch["labels"] = torch.cat([batch["labels"], torch.full((b, extra), IGNORE_INDEX, dtype=torch.long)], 1)
    return batch


# --------------------------------------------------------------------------- the checks
def check_environment(ctx: StudyContext, snapshot: dict[str, Any]) -> dict[str, Any]:
    """Check 1: this environment, compared with the latest completed baseline or train run's ``env.json``."""
    from tuneproof.io import read_json  # noqa: PLC0415
    from tuneproof.preflight.envinfo import compare_environments, platform_key  # noqa: PLC0415

    key = platform_key(snapshot)
    numbers: dict[str, Any] = {"platform": key, "python": snapshot.get("python"), "torch": snapshot.get("torch"),
                               "backend": snapshot.get("backend"), "compared_with": None}
    refs = [r for r in ctx.registry.list(status="completed") if r.kind in ("baseline", "train")]
    ref = next((r for r in reversed(refs) if (ctx.registry.runs_dir / r.id / "env.json").exists()), None)
    if ref is None:
        return _check("environment", True, f"{key}; no baseline or train run to compare with yet", numbers, {"snapshot": snapshot})
    recorded = read_json(ctx.registry.runs_dir / ref.id / "env.json")
    cmp = compare_environments(recorded, snapshot)
    numbers.update(compared_with=ref.id, changes=len(cmp["changes"]), same_platform=cmp["same_platform"],
                   redo=sorted(cmp["redo"]))
    warning = None
    if not cmp["same_platform"]:
        warning = (f"the platform changed since {ref.kind} {ref.id} ({cmp['platform_a']} -> {cmp['platform_b']}): "
                   f"redo {', '.join(sorted(cmp['redo']))} before comparing with it")
    elif cmp["changes"]:
        warning = f"environment changed since {ref.kind} {ref.id}: redo {', '.join(sorted(cmp['redo']))}"
    return _check("environment", True, f"vs {ref.kind} {ref.id}: {cmp['message']}", numbers,
                  {"snapshot": snapshot, "comparison": cmp}, warning=warning)


def check_backend(ctx: StudyContext) -> tuple[dict[str, Any], dict[str, Any]]:
    """Check 2: dtype for ``training.precision`` on this device (C9), the extensions the config wants, and
    ``eval.backend`` (vllm: installed, a CUDA GPU, a causal LM; else failed with the two-line error that
    ``baseline``/``eval``/``test`` give, :func:`tuneproof.evaluation.backends.check_backend_available`)."""
    from tuneproof.models.device import choose_dtype, detect_device  # noqa: PLC0415
    from tuneproof.preflight.backend import check_extensions  # noqa: PLC0415

    device = detect_device()
    choice = choose_dtype(ctx.study.training.precision, device, bf16_base_weights=ctx.study.training.bf16_base_weights)
    wanted = list(getattr(ctx.study.training, "extensions", None) or [])
    if ctx.study.method.kind == "qlora" and "bitsandbytes" not in wanted:  # the 4-bit base: built for this backend, imports
        wanted.append("bitsandbytes")
    ext = check_extensions(device, wanted, try_import=ctx.study.method.kind == "qlora")
    numbers = {"device": device.type, "device_name": device.name,
               "capability": list(device.capability) if device.capability else None, "bf16_native": device.bf16_supported,
               "requested": choice["requested"], "dtype": choice["dtype"], "extensions": wanted}
    passed = bool(choice["passed"] and ext["passed"])
    message = f"{choice['message']}; {ext['message']}"
    if ctx.study.method.kind == "qlora" and ext["passed"]:  # a tiny NF4 layer forward + backward on this device
        from tuneproof.models.quant import require_4bit_device  # noqa: PLC0415

        try:
            numbers["qlora_device"] = require_4bit_device("cuda" if device.type in ("cuda", "rocm") else "cpu")
            message += f"; bitsandbytes 4-bit layers run on {numbers['qlora_device']}"
        except TuneproofError as err:
            passed, message = False, f"{message}; {err.message} -> {err.hint}"
    numbers["eval_backend"] = ctx.study.eval.backend
    if ctx.study.eval.backend != "transformers":  # baseline/eval/test would refuse it here: so does the preflight
        from tuneproof.recipes.common import require_backend  # noqa: PLC0415

        try:
            require_backend(ctx)
            message += f"; eval.backend {ctx.study.eval.backend} can run here"
        except TuneproofError as err:
            passed, message = False, f"{message}; {err.message} -> {err.hint}"
    return _check("backend", passed, message, numbers, {"dtype": choice, "extensions": ext}), choice


def check_training_data(ctx: StudyContext, encoded: list) -> dict[str, Any]:
    """Check 3: the train split after the exact preprocessing: no hard fault, token lengths (after truncation)."""
    import numpy as np  # noqa: PLC0415

    bad = [e for e in encoded if e.faults]
    if ctx.is_image:
        shapes = sorted({tuple(e.pixel_values.shape) for e in encoded})
        numbers = {"examples": len(encoded), "faulty": len(bad), "tensor_shapes": [list(x) for x in shapes],
                   "flipped": sum(1 for e in encoded if e.flipped)}
        passed = bool(encoded) and not bad and len(shapes) == 1
        return _check("training data", passed, (f"{len(encoded)} train images, model input {list(shapes[0]) if shapes else '-'}"
                                                f", {numbers['flipped']} mirrored" if passed else f"{len(bad)} faulty images, "
                                                f"tensor shapes {shapes} (one shape needed: set data.image.resize)"), numbers,
                      {"faults": [{"id": e.id, "faults": e.faults} for e in bad[:50]]} if bad else None)
    lengths = [len(e.input_ids) for e in encoded]
    max_len = ctx.study.training.max_length
    numbers = {"examples": len(encoded), "faulty": len(bad), "max_length": max_len}
    if lengths:
        numbers.update(p50=int(math.ceil(np.percentile(lengths, 50))), p95=int(math.ceil(np.percentile(lengths, 95))),
                       max=max(lengths), truncated=sum(1 for e in encoded if e.truncated),
                       supervised_tokens=sum(e.n_supervised for e in encoded))
    if not encoded:
        return _check("training data", False, "the train split is empty", numbers)
    if bad:
        first = bad[0]
        return _check("training data", False,
                      f"{len(bad)} of {len(encoded)} train examples have hard faults (train refuses them); first {first.id}: {first.faults[0]}",
                      numbers, {"faults": [{"id": e.id, "faults": e.faults} for e in bad[:50]]})
    return _check("training data", True,
                  f"{len(encoded)} train examples, token lengths p50 {numbers['p50']}, p95 {numbers['p95']}, max {numbers['max']} "
                  f"(max_length {max_len}, {numbers['truncated']} truncated)", numbers)


def _target_checks(ctx: StudyContext, model, report: dict[str, Any] | None, failure: str | None) -> list[dict[str, Any]]:
    """Check 4: target modules, trainable parameters, embedding size."""
    from tuneproof.models.targets import match_target_modules, trainable_summary  # noqa: PLC0415
    from tuneproof.preflight.targets import check_embedding_size  # noqa: PLC0415

    method = ctx.study.method
    out = []
    if method.kind == "full":
        out.append(_check("target modules", True, "method.kind full: every parameter is trained, no target patterns", {"method": "full"}))
    else:
        match = (report or {}).get("targets")
        if match is None:  # build_model refused (C5): match on the plain base for the numbers
            from tuneproof.models.base import load_model  # noqa: PLC0415

            base = load_model(ctx.base, ctx.model_kind, labels=ctx.head_labels)
            match = match_target_modules(base, method.target_modules)
            del base
        numbers = {p: v["count"] for p, v in match["patterns"].items()}
        numbers["unmatched"] = match["unmatched"]
        extra = {"warning": "; ".join(match["warnings"])} if match.get("warnings") else {}
        out.append(_check("target modules", bool(match["passed"]) and failure is None, match["message"] if match["message"] else failure or "",
                          numbers, match, **extra))
    if model is None:
        return out
    summary = trainable_summary(model)
    mts = sorted((report or {}).get("modules_to_save") or []) if method.kind in ("lora", "qlora") else []
    out.append(_check("trainable parameters", bool(summary["passed"]),
                      summary["message"] + (f"; modules_to_save: {', '.join(mts)}" if mts else "; modules_to_save: none")
                      + (f"; LoRA r={method.r}, alpha={method.alpha:g}" if method.kind in ("lora", "qlora") else "")
                      + (f"; base in 4-bit {method.bnb_4bit_quant_type} (bitsandbytes)" if method.kind == "qlora" else ""),
                      {"trainable": summary["trainable"], "total": summary["total"], "percent": round(summary["percent"], 4),
                       "trainable_tensors": len(summary["trainable_tensors"]), "modules_to_save": mts},
                      {**{k: v for k, v in summary.items() if k != "trainable_tensors"}, "trainable_tensors": summary["trainable_tensors"]}))
    if ctx.is_image:  # no token embeddings to match against a vocabulary
        return out
    emb = check_embedding_size(model, ctx.tokenizer)
    out.append(_check("embedding size", bool(emb["passed"]), emb["message"],
                      {k: emb[k] for k in ("tokenizer_length", "input_embedding_rows", "output_embedding_rows", "added_tokens")}, emb))
    return out


def check_study_bf16_base(ctx: StudyContext, model, usable: list, pad: int, autocast) -> dict[str, Any]:
    """Check 4b (``training.bf16_base_weights``): on the configured micro-batch of real train
    examples, the loss and trained gradients with the frozen weights in bf16 equal those with them in
    fp32 within the stated tolerances (:func:`tuneproof.training.speedups.check_bf16_base`), with
    the peak memory of a forward + backward with each; when it passes the model keeps its bf16
    frozen weights for every later check, as training will (when it fails, they are put back in fp32)."""
    from tuneproof.data.preprocess import collate  # noqa: PLC0415
    from tuneproof.training.loop import _micro_loss  # noqa: PLC0415
    from tuneproof.training.speedups import check_bf16_base  # noqa: PLC0415

    cfg = ctx.study.training
    device, _, _ = ctx.torch_setup()
    batch = {k: v.to(device) for k, v in collate(usable[: cfg.micro_batch_size], pad).items()}
    r = check_bf16_base(model, batch, lambda m, b: _micro_loss(m, b, autocast, cfg.chunked_loss), device=device)
    mem = r["memory"]
    numbers = {"loss_fp32": round(r["loss_fp32"], 6), "loss_bf16": round(r["loss_bf16"], 6), "loss_rel_diff": r["loss_rel_diff"],
               "grad_rel_l2": r["grad_rel_l2"], "grad_cosine": r["grad_cosine"], "tensors": r["tensors"],
               "cast_tensors": r["cast"].get("cast_tensors"), "bytes_saved_mib": round(r["cast"].get("bytes_saved", 0) / 2**20, 2),
               "fp32_frozen_peak_gib": _gib(mem["fp32_frozen_peak_bytes"]), "bf16_frozen_peak_gib": _gib(mem["bf16_frozen_peak_bytes"]),
               **{f"limit_{k}": v for k, v in r["tolerance"].items()}}
    return _check("bf16 base weights", bool(r["passed"]), r["message"], numbers, r)


def check_update_step(model, batch: dict, autocast) -> dict[str, Any]:
    """Check 5: real optimizer steps on a real micro-batch change every trainable tensor and no frozen one (C7)."""
    from tuneproof.preflight.update_check import batch_loss, check_update  # noqa: PLC0415

    def loss_fn(m, b):
        with autocast():
            return batch_loss(m, b)

    r = check_update(model, batch, loss_fn=loss_fn)
    numbers = {"trainable_changed": r["trainable_changed"], "trainable_tensors": r["trainable_tensors"],
               "frozen_unchanged": r["frozen_unchanged"], "frozen_tensors": r["frozen_tensors"], "steps": r["steps"],
               "first_loss": round(r["losses"][0], 6) if r["losses"] else None, "supervised_tokens": r["supervised_tokens"],
               "micro_batch": int(batch["labels"].shape[0])}
    return _check("update check", bool(r["passed"]), r["message"], numbers, r)


class _Stepper:
    """Complete training steps as the loop takes them (forward, per-token loss, backward, clipping,
    AdamW step, grads freed), with the optimizer states created up front so every measured step
    holds them, as every step after the first of a run does. With ``training.chunked_loss`` the
    causal-LM loss is the chunked one, as ``training.loop`` computes it. ``restore()`` puts the
    trainable tensors back."""

    def __init__(self, model, cfg, autocast):
        import torch  # noqa: PLC0415

        self.model, self.cfg, self.autocast = model, cfg, autocast
        self.chunked = bool(getattr(cfg, "chunked_loss", False))
        self.params = _trainable(model)
        self.snapshot = {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters() if p.requires_grad}
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
        for p in self.params:  # create exp_avg / exp_avg_sq without a forward pass
            p.grad = torch.zeros_like(p)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def step(self, batch: dict) -> float:
        import torch  # noqa: PLC0415

        from tuneproof.preflight.update_check import loss_sum_and_count, model_device, to_device  # noqa: PLC0415
        from tuneproof.training.loss import chunked_token_loss_sum, supervised_token_count  # noqa: PLC0415

        self.model.train()
        if self.chunked and batch["labels"].dim() == 2:
            batch = to_device(batch, model_device(self.model))
            with self.autocast():
                total = chunked_token_loss_sum(self.model, batch["input_ids"], batch["attention_mask"], batch["labels"])
            count = supervised_token_count(batch["labels"])
        else:
            with self.autocast():
                total, count = loss_sum_and_count(self.model, batch)
        (total / max(count, 1)).backward()
        if self.cfg.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(total.detach()) / max(count, 1)

    def restore(self) -> None:
        _restore(self.model, self.snapshot)
        self.optimizer.state.clear()


def _estimate(model, micro_batch: int, length: int, dtype: str, checkpointing: bool, budget: int | None, *,
              bf16_base: bool = False, batch: dict | None = None, chunked_loss: bool = False, device: str = "cpu") -> dict[str, Any]:
    """``estimate_step_memory`` for this project's mixed precision: weights stay fp32 and bf16/fp16
    run under autocast (``StudyContext.torch_setup``), so frozen weights are counted at 4 bytes;
    with ``training.bf16_base_weights`` (``bf16_base``) they are held in bf16: 2 bytes per frozen
    element (trained tensors, their gradients and optimizer states stay fp32). ``batch``: the
    micro-batch the step will take (its padding and supervised tokens are counted); without it the
    batch is taken as padded, every position supervised. ``chunked_loss``: ``training.chunked_loss``."""
    from tuneproof.preflight.memory import estimate_step_memory  # noqa: PLC0415

    padded, supervised = True, None
    if batch is not None and "attention_mask" in batch:
        padded = bool((batch["attention_mask"] == 0).any())
        labels = batch.get("labels")
        if labels is not None and labels.dim() == 2:
            from tuneproof.training.loss import supervised_token_count  # noqa: PLC0415

            supervised = supervised_token_count(labels)
    est = estimate_step_memory(model, micro_batch, length, dtype, "adamw", activation_checkpointing=checkpointing,
                               trainable_dtype="fp32", weights_dtype="bf16" if bf16_base else None, budget_bytes=budget,
                               padded=padded, chunked_loss=chunked_loss, supervised_tokens=supervised, device=device)
    if bf16_base:
        est["weights_note"] = "frozen weights held in bf16 (training.bf16_base_weights): 2 bytes per frozen element"
    elif dtype != "fp32":  # the component counts frozen weights at the compute dtype; here they are stored in fp32
        frozen = est["parameters"] - est["trainable_parameters"] - est.get("packed_parameters", 0)  # a 4-bit base stays packed
        add = frozen * (4 - est["bytes_per_weight"])
        est["weights_bytes"] += add
        est["total_bytes"] += add
        est["peak_bytes"] += add
        est["total_gib"] = est["total_bytes"] / GIB
        est["passed"] = budget is None or est["total_bytes"] <= budget
        for part in est.get("parts", []):
            if part["part"] == "weights":
                part["bytes"], part["formula"] = est["weights_bytes"], part["formula"] + " (frozen stored in fp32: +2 bytes each)"
        est["weights_note"] = "frozen weights stored in fp32 under autocast (+2 bytes per frozen element vs the compute dtype)"
    return est


def _size(n: int | float | None) -> str:
    """Bytes as GiB (>= 1 GiB) or MiB, for messages."""
    if n is None:
        return "?"
    return f"{n / GIB:.3f} GiB" if abs(n) >= GIB else f"{n / 2**20:.1f} MiB"


def _parts(est: dict[str, Any]) -> str:
    """The estimate's breakdown, one line."""
    return (f"weights {_size(est['weights_bytes'])} + gradients {_size(est['gradients_bytes'])} + "
            f"{est['optimizer_states_count']} optimizer states {_size(est['optimizer_states_bytes'])} + step temporary "
            f"{_size(est['optimizer_step_temporary_bytes'])} + activations {_size(est['activations_bytes'])} + "
            f"logits {_size(est['logits_bytes'])}")


def in_step_bytes(est: dict[str, Any]) -> int:
    """:func:`tuneproof.preflight.memory.in_step_bytes`: the estimate's parts a step allocates."""
    from tuneproof.preflight.memory import in_step_bytes as parts_in_step  # noqa: PLC0415

    return parts_in_step(est)


def check_step_memory(model, ctx: StudyContext, encoded: list, lengths: list[int], dtype: str, budget: int,
                      budget_source: str, autocast) -> dict[str, Any]:
    """Check 6: complete steps at the configured micro-batch at each representative length (C8).

    Each length has its estimate (itemised, :func:`~tuneproof.preflight.memory.estimate_step_memory`)
    and its measured step (:func:`~tuneproof.preflight.memory.measure_step_peak`): the bytes the
    step's tensors hold at its peak (the CPU allocator's count, or CUDA's peak allocated) next to the
    in-step parts of the estimate, with their ratio, and the process peak (resident set on a CPU),
    which is what the budget is judged on, with the estimate's total."""
    from tuneproof.preflight.memory import measure_step_peak, side_by_side  # noqa: PLC0415

    cfg = ctx.study.training
    device, _, _ = ctx.torch_setup()
    mb = cfg.micro_batch_size
    chunked = bool(getattr(cfg, "chunked_loss", False))
    stepper = _Stepper(model, cfg, autocast)
    rows, problems, numbers = [], [], {"micro_batch": mb, "budget_gib": _gib(budget), "budget_source": budget_source}
    try:
        for length in lengths:
            batch = _batch_at_length(encoded, mb, length, ctx.tokenizer.pad_token_id)
            est = _estimate(model, mb, length, dtype, cfg.activation_checkpointing, budget, bf16_base=cfg.bf16_base_weights,
                            batch=batch, chunked_loss=chunked, device=device.type)
            row: dict[str, Any] = {"length": length, "estimate": est}
            try:
                measured = measure_step_peak(lambda b=batch: stepper.step(b), device)
            except Exception as err:  # noqa: BLE001
                if not _is_oom(err):
                    raise
                problems.append(f"length {length}: out of memory at micro-batch {mb} ({type(err).__name__}); the estimate was {_size(est['total_bytes'])}")
                rows.append(row)
                continue
            row["measured"] = measured
            row["side_by_side"] = side_by_side(est, measured)
            in_step = in_step_bytes(est)
            row["estimate_in_step_bytes"] = in_step  # the parts a step allocates once the optimizer states exist
            tensors = measured.get("allocated_step_peak_bytes")
            row["measured_over_estimate"] = round(tensors / in_step, 4) if tensors and in_step else None
            rows.append(row)
            tag = f"L{length}"
            numbers[f"{tag}_estimate_gib"] = _gib(est["total_bytes"])
            numbers[f"{tag}_peak_gib"] = _gib(measured["peak_bytes"])
            numbers[f"{tag}_step_peak_gib"] = _gib(measured["step_peak_bytes"])
            numbers[f"{tag}_estimate_in_step_gib"] = _gib(in_step)
            numbers[f"{tag}_allocated_step_peak_gib"] = _gib(tensors)
            numbers[f"{tag}_measured_over_estimate"] = row["measured_over_estimate"]
            numbers[f"{tag}_seconds"] = round(measured["seconds"], 3)
            over = []
            if est["total_bytes"] > budget:
                over.append(f"estimate {_size(est['total_bytes'])} ({_parts(est)})")
            if measured["peak_bytes"] is not None and measured["peak_bytes"] > budget:
                over.append(f"measured peak {_size(measured['peak_bytes'])}")
            if over:
                problems.append(f"length {length}: {' and '.join(over)} exceed{'s' if len(over) == 1 else ''} the budget {_size(budget)}")
    finally:
        stepper.restore()
    where = "process resident set (CPU)" if device.type == "cpu" else "peak allocated (CUDA)"

    def shown(r: dict[str, Any]) -> str:
        if "measured" not in r:
            return f"length {r['length']}: estimate {_size(r['estimate']['total_bytes'])}, out of memory"
        m, ratio = r["measured"], r.get("measured_over_estimate")
        tensors = (f"the step's tensors {_size(m.get('allocated_step_peak_bytes'))} vs {_size(r['estimate_in_step_bytes'])} estimated"
                   + (f" (x{ratio:.3f})" if ratio else "") + ", ") if m.get("allocated_step_peak_bytes") is not None else ""
        return (f"length {r['length']}: {tensors}whole step: estimate {_size(r['estimate']['total_bytes'])}, measured peak "
                f"{_size(m['peak_bytes'])} (the step adds {_size(m['step_peak_bytes'])}), {m['seconds']:.2f} s")

    if problems:
        message = ("; ".join(problems) + f" (micro-batch {mb}, {where}); lower training.micro_batch_size, raise "
                   "gradient_accumulation_steps or enable activation_checkpointing")
    else:
        message = f"micro-batch {mb}: {'; '.join(shown(r) for r in rows)} ({where}); fits {_size(budget)} ({budget_source})"
    details = {"rows": rows, "budget_bytes": budget, "budget_source": budget_source, "breakdown": memory_breakdown(rows)}
    return _check("step memory", not problems, message, numbers, details)


def memory_breakdown(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The step-memory estimate itemised per length, next to the measured step, for the screen,
    ``preflight.json`` and the dossier.

    Returns ``{"lengths": [L...], "micro_batch", "rows": [[part, MiB at each length...]...]}``:
    the estimate's parts (weights, gradients, optimizer states and temporary, each activation part,
    the loss / logits part), its total, its peak and the step's part of it
    (:func:`~tuneproof.preflight.memory.in_step_bytes`), then the measured step's tensors (allocator
    or CUDA peak allocated), measured / estimate (the step's part), the process peak and what the step adds to it.
    MiB = 2**20 bytes.
    """
    if not rows:
        return {"lengths": [], "micro_batch": None, "rows": []}
    mib = lambda n: None if n is None else round(n / 2**20, 3)  # noqa: E731
    names: list[str] = []
    for r in rows:
        for part in r["estimate"].get("parts", []):
            if part["part"] not in names:
                names.append(part["part"])
    names = sorted(names, key=lambda n, order=list(names): (n.startswith("loss:"), order.index(n)))  # the loss after every activation part
    table_rows = []
    for name in names:
        vals = [next((p["bytes"] for p in r["estimate"].get("parts", []) if p["part"] == name), 0) for r in rows]
        if any(vals):
            table_rows.append([name, *(mib(v) for v in vals)])
    table_rows.append(["forward end instead of the loss: KV cache k/v before repetition + last MLP product",
                       *(mib(r["estimate"].get("forward_end_extra_bytes")) for r in rows)])
    table_rows.append(["estimate, total (all parts at once)", *(mib(r["estimate"]["total_bytes"]) for r in rows)])
    table_rows.append(["estimate, the step's peak (weights + optimizer states + the step's part)", *(mib(r["estimate"].get("peak_bytes")) for r in rows)])
    table_rows.append(["estimate, the step's part: max(activations + max(loss, forward end), gradients + optimizer temporary)",
                       *(mib(in_step_bytes(r["estimate"])) for r in rows)])
    m = [r.get("measured") or {} for r in rows]
    table_rows.append(["measured: the step's tensors at the peak", *(mib(x.get("allocated_step_peak_bytes")) for x in m)])
    table_rows.append(["measured / estimate (the step's tensors / the step's part)", *(r.get("measured_over_estimate") for r in rows)])
    table_rows.append(["measured: process peak", *(mib(x.get("peak_bytes")) for x in m)])
    table_rows.append(["measured: the step adds to the process", *(mib(x.get("step_peak_bytes")) for x in m)])
    return {"lengths": [r["length"] for r in rows], "micro_batch": rows[0]["estimate"].get("micro_batch"), "rows": table_rows}


def print_memory_breakdown(check: dict[str, Any] | None) -> None:
    """The ``step memory`` check's breakdown as a table on the screen (MiB)."""
    bd = ((check or {}).get("details") or {}).get("breakdown") if isinstance((check or {}).get("details"), dict) else None
    if not bd or not bd.get("rows"):
        return
    cols = ["step memory, MiB"] + [f"length {L} x {bd['micro_batch']}" for L in bd["lengths"]]

    def cell(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float) and abs(v) < 10:
            return f"{v:.3f}"
        return f"{v:,.1f}" if isinstance(v, float) else f"{v:,}"

    console.print(table("step memory: the estimate itemised, next to the measured step", cols,
                        [[r[0], *(cell(v) for v in r[1:])] for r in bd["rows"]]))


def check_eval_memory(model, ctx: StudyContext, budget: int, budget_source: str, autocast) -> dict[str, Any]:
    """Check 6b: one evaluation batch at ``eval.batch_size`` (generation with the KV cache up to
    ``eval.max_new_tokens``, or the classification forward) fits the budget (:mod:`tuneproof.preflight.eval_memory`)."""
    from tuneproof.preflight.eval_memory import eval_memory_check, measure_eval_batch_peak  # noqa: PLC0415

    device, _, _ = ctx.torch_setup()
    ev, examples = ctx.study.eval, ctx.eval_examples()
    kind = ctx.model_kind
    texts = [e.text for e in examples] if kind == "sequence-classification" else [ctx.pipeline.prompt_text(e.text) for e in examples]
    try:
        measured = measure_eval_batch_peak(model, ctx.tokenizer, kind=kind, texts=texts, batch_size=ev.batch_size,
                                           max_new_tokens=ev.max_new_tokens, max_length=ctx.study.training.max_length,
                                           device=device, autocast=autocast)
    except Exception as err:  # noqa: BLE001
        if not _is_oom(err):
            raise
        return eval_memory_check(None, budget, budget_source, error=err, batch_size=ev.batch_size)
    return eval_memory_check(measured, budget, budget_source)


def check_max_micro_batch(model, ctx: StudyContext, encoded: list, length: int, dtype: str, budget: int, autocast) -> dict[str, Any]:
    """``--find-max-micro-batch``: the largest micro-batch whose measured step peak fits the budget at ``length``.

    The search is bounded by the train split's size and by :data:`FIND_MAX_FACTOR` times the
    largest micro-batch whose estimate (a planning upper bound) fits, so a CPU run does not try
    hundreds of examples per step.
    """
    from tuneproof.preflight.memory import find_max_micro_batch, measure_step_peak  # noqa: PLC0415

    cfg = ctx.study.training
    device, _, _ = ctx.torch_setup()
    est_fit = 0
    mb = 1
    while mb <= 1024 and _estimate(model, mb, length, dtype, cfg.activation_checkpointing, budget, bf16_base=cfg.bf16_base_weights,
                                   chunked_loss=bool(getattr(cfg, "chunked_loss", False)), device=device.type)["passed"]:
        est_fit, mb = mb, mb * 2
    limit = max(1, min(1024, len(encoded), FIND_MAX_FACTOR * max(est_fit, 1)))
    stepper = _Stepper(model, cfg, autocast)
    try:
        def try_fn(n: int) -> dict[str, Any]:
            batch = _batch_at_length(encoded, n, length, ctx.tokenizer.pad_token_id)
            return measure_step_peak(lambda: stepper.step(batch), device)

        r = find_max_micro_batch(try_fn, budget, start=1, limit=limit)
    finally:
        stepper.restore()
    numbers = {"max_micro_batch": r["max_micro_batch"], "length": length, "peak_gib": _gib(r["peak_bytes"]),
               "budget_gib": _gib(budget), "limit": limit, "tries": len(r["tries"]), "configured": cfg.micro_batch_size}
    message = r["message"] + f" at length {length} (searched up to {limit})"
    passed = bool(r["passed"]) and r["max_micro_batch"] >= cfg.micro_batch_size
    if r["passed"] and not passed:
        message += f"; the configured micro-batch {cfg.micro_batch_size} does not fit"
    return _check("max micro-batch", passed, message, numbers, r)


def check_accumulation_window(model, micro_batches: list[dict], configured: int, last_window: list[dict] | None = None) -> dict[str, Any]:
    """Check 7: accumulated real micro-batches equal their concatenation (C1), and so does the short
    last window of an epoch when there is one (C18); normalisation stored."""
    from tuneproof.preflight.accumulation import check_windows  # noqa: PLC0415

    r = check_windows(model, micro_batches, last_window)
    last = r["last_window"]
    numbers = {"micro_batches": r["micro_batches"], "configured_accumulation": configured,
               "last_window_micro_batches": last["micro_batches"] if last else None,
               "last_window_tokens": last["tokens_per_micro_batch"] if last else None,
               "tokens_per_micro_batch": r["tokens_per_micro_batch"], "loss_accumulated": round(r["loss_accumulated"], 6),
               "loss_concatenated": round(r["loss_concatenated"], 6), "loss_mean_of_means": round(r["loss_mean_of_means"], 6),
               "grad_max_abs_diff": r["grad_max_abs_diff"], "atol": r["atol"], "rtol": r["rtol"]}
    return _check("gradient accumulation", bool(r["passed"]), r["message"] + f"; normalisation: {r['normalisation']}",
                  numbers, r, normalisation=r["normalisation"])


def check_precision(model, batch: dict, choice: dict[str, Any], autocast) -> dict[str, Any]:
    """Check 8: the chosen dtype on its own: loss and gradients under autocast vs fp32 on one real micro-batch."""
    import contextlib  # noqa: PLC0415

    import torch  # noqa: PLC0415

    from tuneproof.preflight.update_check import batch_loss  # noqa: PLC0415

    dtype = choice["dtype"]
    if dtype == "fp32":
        return _check("precision", True, f"fp32 (the reference precision): nothing to compare; {choice['reason']}",
                      {"dtype": "fp32"})
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    was_training = model.training
    runs = {}
    try:
        model.eval()  # no dropout: both passes compute the same function
        for name, factory in (("fp32", contextlib.nullcontext), (dtype, autocast)):
            for _, p in params:
                p.grad = None
            with factory():
                loss = batch_loss(model, batch)
            loss.backward()
            grads = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().float().reshape(-1).cpu() for _, p in params])
            runs[name] = (float(loss.detach()), grads)
    finally:
        for _, p in params:
            p.grad = None
        model.train(was_training)
    (l32, g32), (llp, glp) = runs["fp32"], runs[dtype]
    finite = math.isfinite(llp) and bool(torch.isfinite(glp).all())
    rel = abs(llp - l32) / max(abs(l32), 1e-12)
    cos = float(torch.nn.functional.cosine_similarity(g32, glp, dim=0)) if finite else float("nan")
    passed = finite and rel <= PRECISION_LOSS_RTOL and cos >= PRECISION_GRAD_COSINE
    numbers = {"dtype": dtype, "loss_fp32": round(l32, 6), f"loss_{dtype}": round(llp, 6), "loss_rel_diff": rel,
               "grad_cosine": cos, "loss_rtol": PRECISION_LOSS_RTOL, "min_cosine": PRECISION_GRAD_COSINE}
    message = (f"{dtype} vs fp32 on {int(batch['input_ids'].shape[0])} examples: loss {llp:.5g} vs {l32:.5g} (rel. diff {rel:.2e}, "
               f"limit {PRECISION_LOSS_RTOL}), gradient cosine {cos:.5f} (min {PRECISION_GRAD_COSINE})")
    if not finite:
        message = f"{dtype}: non-finite loss or gradients ({llp}); set training.precision to fp32 or bf16"
    return _check("precision", passed, message, numbers)


def check_checkpointing(ctx: StudyContext, model, batch: dict) -> dict[str, Any]:
    """Check 9: activation checkpointing on its own; the configured model and one built with the flag flipped."""
    from tuneproof.preflight.checkpointing import check_activation_checkpointing  # noqa: PLC0415
    from tuneproof.training.loop import seed_everything  # noqa: PLC0415

    configured = ctx.study.training.activation_checkpointing

    def factory(flag: bool):
        if flag == configured:
            return model
        other = copy.copy(ctx)  # same cached base, tokenizer, device choice; only the flag differs
        other.study = ctx.study.model_copy(deep=True)
        other.study.training.activation_checkpointing = flag
        seed_everything(ctx.study.training.seed)  # the same initialisation as the configured model
        built, _ = other.build_model()
        if ctx.study.training.bf16_base_weights:  # held as the configured model's are (cast by the bf16 base weights check)
            from tuneproof.models.method import cast_frozen_to_bf16  # noqa: PLC0415

            cast_frozen_to_bf16(built)
        return built

    r = check_activation_checkpointing(factory, batch)
    saved = r["memory_saved_bytes"]
    numbers = {"configured": configured, "grad_max_abs_diff": r["grad_max_abs_diff"], "rtol": r["rtol"], "atol": r["atol"],
               "time_ratio": round(r["time_ratio"], 3) if r["time_ratio"] else None,
               "seconds_without": round(r["without"]["seconds"], 3), "seconds_with": round(r["with"]["seconds"], 3),
               "memory_saved_mib": round(saved / 2**20, 1) if saved is not None else None, "approximate": r["approximate"]}
    return _check("activation checkpointing", bool(r["passed"]), r["message"] + f" (configured: {'on' if configured else 'off'})",
                  numbers, {k: v for k, v in r.items() if k != "diagnosis"} | {"diagnosis": r["diagnosis"]})


# --------------------------------------------------------------------------- smoke pass
def _scores(ctx: StudyContext, model, examples: list) -> list[list]:
    """Per example: the 5 highest next-token logits after the prompt (``[[id, logit], ...]``), or the
    class logits for sequence classification, under the study's device and autocast."""
    import torch  # noqa: PLC0415

    device, _, autocast = ctx.torch_setup()
    model.eval()
    out = []
    with torch.inference_mode():
        for ex in examples:
            if ctx.is_image:
                from tuneproof.data.image_pipeline import collate_images  # noqa: PLC0415

                pixels = collate_images([ctx.pipeline.encode(ex)])["pixel_values"].to(device)
                with autocast():
                    logits = model(pixel_values=pixels).logits[0].float()
                out.append([[i, float(v)] for i, v in enumerate(logits.cpu())])
                continue
            if ctx.model_kind == "sequence-classification":
                enc = ctx.tokenizer(ex.text, truncation=True, max_length=ctx.study.training.max_length, return_tensors="pt")
                with autocast():
                    logits = model(**{k: v.to(device) for k, v in enc.items()}).logits[0].float()
                out.append([[i, float(v)] for i, v in enumerate(logits.cpu())])
                continue
            ids = torch.tensor([ctx.tokenizer(ctx.pipeline.prompt_text(ex.text), add_special_tokens=False)["input_ids"]], device=device)
            with autocast():
                last = model(input_ids=ids).logits[0, -1].float().cpu()
            top = torch.topk(last, min(5, last.numel()))
            out.append([[int(i), float(v)] for i, v in zip(top.indices, top.values)])
    return out


def _load_for_reload(ctx: StudyContext, payload: Path, payload_kind: str):
    from tuneproof.models.base import BaseModelRef, load_model  # noqa: PLC0415

    device, _, _ = ctx.torch_setup()
    labels = ctx.head_labels
    if payload_kind == "model":
        ref = BaseModelRef(ctx.base.name, payload, ctx.base.revision, ctx.model_kind, "preflight-smoke",
                           trust_remote_code=ctx.base.trust_remote_code)
        return load_model(ref, ctx.model_kind, labels=labels).to(device)
    from tuneproof.models.method import load_adapter_onto  # noqa: PLC0415

    # the base held as in training (qlora: 4-bit; training.bf16_base_weights: bf16), the adapter as saved
    return load_adapter_onto(load_model(ctx.base, ctx.model_kind, labels=labels, quantization=ctx.quantization), payload,
                             ctx.base_weights).to(device)


def reload_in_fresh_process(ctx: StudyContext, smoke_dir: Path, payload: Path, payload_kind: str, examples: list) -> dict[str, Any]:
    """Load base + saved adapter (or the saved full model) in a new Python process and predict ``examples``.

    Returns the child's ``{"predictions", "scores", "load_seconds", "predict_seconds"}`` plus
    ``"seconds"`` (wall-clock of the whole child process: start, imports, load, prediction).

    Raises:
        TuneproofError: the child failed (its last lines of output are shown).
    """
    from tuneproof.io import read_json, write_json  # noqa: PLC0415

    spec = {"study_dir": str(ctx.study_dir), "data_root": str(ctx.data_root) if ctx.data_root else None, "config": ctx.config,
            "payload": str(payload), "payload_kind": payload_kind,
            "examples": [{"id": e.id, "text": e.text, "label": e.label, "target": e.target,
                          **({"image": e.meta["image"]} if e.meta.get("image") else {})} for e in examples]}
    spec_path, out_path = smoke_dir / "reload_spec.json", smoke_dir / "reload_outputs.json"
    write_json(spec_path, spec)
    if out_path.exists():
        out_path.unlink()
    env = dict(os.environ, TUNEPROOF_PARENT_PID=str(os.getpid()), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "tuneproof.recipes.preflight", "reload", str(spec_path), str(out_path)],
                          capture_output=True, text=True, env=env, timeout=RELOAD_TIMEOUT_S, check=False)
    seconds = time.perf_counter() - t0
    if not out_path.exists():
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
        raise TuneproofError(f"the reload process exited with code {proc.returncode} without output:\n{tail}")
    out = read_json(out_path)
    if out.get("error"):
        raise TuneproofError(f"the reload process failed: {out['error']}")
    out["seconds"] = seconds
    return out


def _reload_main(argv: list[str]) -> int:
    """``python -m tuneproof.recipes.preflight reload SPEC OUT``: the child of :func:`reload_in_fresh_process`."""
    from tuneproof.procs import die_with_parent  # noqa: PLC0415

    die_with_parent()  # a killed preflight leaves no orphaned reload process
    import logging  # noqa: PLC0415
    import warnings  # noqa: PLC0415

    from tuneproof.data.examples import Example  # noqa: PLC0415
    from tuneproof.io import read_json, write_json  # noqa: PLC0415
    from tuneproof.recipes.common import predict  # noqa: PLC0415

    if len(argv) != 3 or argv[0] != "reload":
        sys.stderr.write("usage: python -m tuneproof.recipes.preflight reload SPEC OUT\n")
        return 2
    warnings.filterwarnings("ignore")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    spec, out = read_json(argv[1]), Path(argv[2])
    try:
        ctx = StudyContext.open(spec["study_dir"], spec.get("data_root"), config=spec["config"])
        t0 = time.perf_counter()
        model = _load_for_reload(ctx, Path(spec["payload"]), spec["payload_kind"])
        t1 = time.perf_counter()
        examples = [Example(id=e["id"], text=e["text"], label=e["label"], target=e["target"],
                            meta={"image": e["image"]} if e.get("image") else {}) for e in spec["examples"]]
        preds = predict(ctx, model, examples, "reload")
        scores = _scores(ctx, model, examples)
        write_json(out, {"predictions": preds, "scores": scores, "load_seconds": t1 - t0, "predict_seconds": time.perf_counter() - t1})
    except Exception as err:  # noqa: BLE001 - reported to the parent
        write_json(out, {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()})
    return 0


def check_smoke(ctx: StudyContext, run, model, encoded: list, report: _Report) -> dict[str, Any]:
    """Checks 10-12: two real steps of the training loop with the configured options, a small
    evaluation, save, reload in a fresh process, identical outputs; throughput from those steps.
    Adds the checks ``configured combination``, ``smoke pass`` and ``throughput`` to ``report``."""
    from tuneproof.recipes.common import predict  # noqa: PLC0415
    from tuneproof.training.data_order import window_at  # noqa: PLC0415
    from tuneproof.training.loop import total_steps, train  # noqa: PLC0415

    cfg = ctx.study.training
    device, _, autocast = ctx.torch_setup()
    # a copy of the config: 2 steps at the peak learning rate (with warmup the first step would use lr 0)
    scfg = cfg.model_copy(update={"max_steps": SMOKE_STEPS, "epochs": None, "warmup_steps": 0, "lr_scheduler": "constant"})
    before = _cpu_copy(model)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    frozen = [n for n in before if n not in trainable]
    marks = [time.perf_counter()]
    result = train(model, encoded, scfg, pad_id=getattr(ctx.tokenizer, "pad_token_id", 0) or 0, device=device, autocast=autocast,
                   progress=lambda s, t, loss: marks.append(time.perf_counter()))
    step_s = [b - a for a, b in zip(marks, marks[1:])]
    after = _cpu_copy(model)
    not_changed = sorted(n for n in trainable if _same_bits(before[n], after[n]))
    frozen_changed = [n for n in frozen if not _same_bits(before[n], after[n])]
    del before, after
    losses = result["losses"]
    finite = all(math.isfinite(x) for x in losses)
    combo_ok = finite and not not_changed and not frozen_changed and result["steps"] == SMOKE_STEPS
    combo_numbers = {"micro_batch": cfg.micro_batch_size, "accumulation": cfg.gradient_accumulation_steps,
                     "activation_checkpointing": cfg.activation_checkpointing, "dtype": ctx.device_choice["dtype"],
                     "steps": result["steps"], "losses": [round(x, 6) for x in losses],
                     "trainable_changed": len(trainable) - len(not_changed), "trainable_tensors": len(trainable),
                     "frozen_unchanged": len(frozen) - len(frozen_changed), "frozen_tensors": len(frozen)}
    combo_msg = (f"{result['steps']} steps of training.loop.train with micro-batch {cfg.micro_batch_size} x accumulation "
                 f"{cfg.gradient_accumulation_steps}, activation checkpointing {'on' if cfg.activation_checkpointing else 'off'}, "
                 f"{ctx.device_choice['dtype']}: losses {', '.join(f'{x:.4f}' for x in losses)}; "
                 f"{combo_numbers['trainable_changed']} of {len(trainable)} trainable tensors changed, "
                 f"{combo_numbers['frozen_unchanged']} of {len(frozen)} frozen bitwise unchanged")
    if not finite:
        combo_msg = f"non-finite loss in the configured combination ({losses}); " + combo_msg
    if not_changed:
        combo_msg += f"; not changed: {', '.join(not_changed[:5])}"
    if frozen_changed:
        combo_msg += f"; frozen tensors changed: {', '.join(frozen_changed[:5])}"
    report.add(_check("configured combination", combo_ok, combo_msg, combo_numbers,
                      {"not_changed": not_changed, "frozen_changed": frozen_changed, "normalisation": result["normalisation"]}))

    # evaluation on a small subset, by the study's procedure
    examples = ctx.eval_examples()[:SMOKE_EVAL_EXAMPLES]
    t0 = time.perf_counter()
    preds = predict(ctx, model, examples, "smoke eval")
    eval_s = time.perf_counter() - t0
    scores = _scores(ctx, model, examples)
    adapter_effect = None
    if ctx.study.method.kind in ("lora", "qlora") and ctx.model_kind != "sequence-classification":
        with model.disable_adapter():
            base_scores = _scores(ctx, model, examples)
        adapter_effect = max((abs(a[1] - b[1]) for s, bs in zip(scores, base_scores) for a, b in zip(s, bs)), default=0.0)
    # save: the adapter (PEFT layout) or the full model
    smoke = run.dir / "smoke"
    payload_kind = "model" if ctx.study.method.kind == "full" else "adapter"
    payload = smoke / payload_kind
    model.save_pretrained(payload, safe_serialization=True)
    saved_files = sorted(p.name for p in payload.iterdir())
    # reload in a fresh process and predict the same examples
    child = reload_in_fresh_process(ctx, smoke, payload, payload_kind, examples)
    mismatches = [{"id": e.id, "before": a, "after": b} for e, a, b in zip(examples, preds, child["predictions"])
                  if a != b]
    ids_differ = [e.id for e, s, c in zip(examples, scores, child["scores"]) if [i for i, _ in s] != [i for i, _ in c]]
    logit_diff = max((abs(a[1] - b[1]) for s, c in zip(scores, child["scores"]) for a, b in zip(s, c)), default=0.0)
    tol = LOGIT_ATOL if ctx.device_choice["dtype"] == "fp32" else LOGIT_ATOL_LOW_PRECISION
    smoke_ok = combo_ok and not mismatches and not ids_differ and logit_diff <= tol and len(child["predictions"]) == len(examples)
    numbers = {"steps": result["steps"], "eval_examples": len(examples), "eval_seconds": round(eval_s, 3),
               "identical_after_reload": len(examples) - len(mismatches), "max_abs_logit_diff": logit_diff, "logit_atol": tol,
               "adapter_effect_max_abs_logit": adapter_effect, "reload_seconds": round(child["seconds"], 2),
               "saved": f"runs/{run.id}/smoke/{payload_kind}"}
    msg = (f"{result['steps']} training steps; {len(examples)} evaluation examples predicted in {eval_s:.1f} s; "
           f"saved {payload_kind} ({len(saved_files)} files); reloaded in a fresh process in {child['seconds']:.1f} s: "
           f"{len(examples) - len(mismatches)} of {len(examples)} predictions identical, max |{'class' if ctx.is_image else 'next-token'} logit diff| "
           f"{logit_diff:.2e} (tolerance {tol:g})")
    if adapter_effect is not None:
        msg += f"; the adapter moves those logits by up to {adapter_effect:.2e}"
    if mismatches:
        msg += f"; differ after reload: {mismatches[0]['id']}: {mismatches[0]['before']!r} -> {mismatches[0]['after']!r}"
    if ids_differ:
        msg += f"; next-token ranking differs after reload for {', '.join(ids_differ[:3])}"
    smoke_check = report.add(_check("smoke pass", smoke_ok, msg, numbers,
                                    {"predictions": preds, "reloaded": child["predictions"], "scores": scores,
                                     "reloaded_scores": child["scores"], "mismatches": mismatches, "saved_files": saved_files,
                                     "child_load_seconds": child.get("load_seconds"), "child_predict_seconds": child.get("predict_seconds")}))

    # throughput: steps after the first (the first carries one-time allocation costs)
    n = len(encoded)
    accum = cfg.gradient_accumulation_steps

    def step_tokens(step: int) -> int:  # an image counts as one "token" (the rate is then images/s)
        return sum(len(getattr(encoded[i], "input_ids", [0])) for idx in window_at(n, cfg.micro_batch_size, accum, cfg.seed, step) for i in idx)

    timed = list(range(1, len(step_s))) or [0]
    secs = sum(step_s[i] for i in timed)
    s_per_step = secs / len(timed)
    tokens_per_s = sum(step_tokens(i) for i in timed) / max(secs, 1e-9)
    steps_total = total_steps(cfg, n)
    n_eval = len(ctx.eval_examples())
    eval_per_ex = eval_s / max(len(examples), 1)
    batch_rate = _eval_batch_rate(report)
    eval_basis = (f"measured on {len(examples)} smoke examples" if ctx.is_image else
                  f"measured on {len(examples)} smoke examples, an upper bound when the smoke model generates up to eval.max_new_tokens")
    if batch_rate:  # one full batch at eval.batch_size: the rate evaluation runs at (batching amortises the per-call cost)
        eval_per_ex = batch_rate["eval_batch_s_per_example"]
        eval_basis = (f"one batch of {batch_rate['eval_batch_size']} at eval.batch_size ({batch_rate['eval_batch_procedure']}), "
                      "timed by the eval memory check")
    tnum = {"s_per_step": round(s_per_step, 4), "tokens_per_s": round(tokens_per_s, 1), "micro_batch": cfg.micro_batch_size,
            "accumulation": accum, "total_steps": steps_total, "budget_seconds": round(steps_total * s_per_step, 1),
            "eval_s_per_example": round(eval_per_ex, 4), "eval_examples": n_eval,
            "eval_seconds_estimate": round(eval_per_ex * n_eval, 1), "step_seconds": [round(x, 3) for x in step_s]}
    report.add(_check(
        "throughput", True,
        f"{s_per_step:.2f} s/step, {tokens_per_s:.0f} {'images' if ctx.is_image else 'tokens'}/s at micro-batch {cfg.micro_batch_size} x {accum} "
        f"(timed on step{'s' if len(timed) > 1 else ''} {', '.join(str(i + 1) for i in timed)} of {len(step_s)}); the budget of "
        f"{steps_total} steps takes about {_hms(steps_total * s_per_step)}; one evaluation of {n_eval} examples about "
        f"{_hms(eval_per_ex * n_eval)} ({eval_per_ex:.3g} s per example, {eval_basis})", tnum))
    return smoke_check


def _hms(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h} h {m:02d} min" if h else (f"{m} min {s:02d} s" if m else f"{s} s")


# --------------------------------------------------------------------------- the recipe
def _default_budget(choice: dict[str, Any], snapshot: dict[str, Any]) -> tuple[int, str]:
    device = choice.get("device") or {}
    if device.get("total_memory_bytes"):
        return int(device["total_memory_bytes"]), f"device memory of {device.get('name')}"
    ram = snapshot.get("ram_bytes")
    if ram:
        return int(ram), "physical RAM (CPU run)"
    return 2**62, "none known"


def run_preflight(ctx: StudyContext, *, memory_budget: int | None = None, find_max_micro_batch: bool = False) -> str:
    """Run every preflight check as a registry run of kind ``preflight``; returns its id.

    Args:
        memory_budget: bytes one training step may use (``--memory-budget``, see :func:`parse_memory`);
            default: the GPU's memory, or the physical RAM on CPU.
        find_max_micro_batch: also search the largest micro-batch under the budget.

    Raises:
        CheckFailed: any check failed (exit 3); ``preflight.json`` is written first and the run is
            recorded failed with the first failure as its reason.
    """
    from tuneproof.preflight.envinfo import environment_snapshot, platform_key  # noqa: PLC0415

    t_start = time.perf_counter()
    with ctx.registry.run("preflight") as run:
        rep = _Report()
        snapshot = environment_snapshot()
        rep.run("environment", lambda: check_environment(ctx, snapshot))
        backend, choice = check_backend(ctx)
        rep.add(backend)
        if backend["passed"]:
            from tuneproof.recipes.common import record_inputs  # noqa: PLC0415

            record_inputs(ctx, run)
        else:  # ctx.device_choice would refuse: record the inputs without it
            from tuneproof.io import sha256_json  # noqa: PLC0415

            run.write_json("config.json", ctx.config)
            run.write_json("env.json", {**snapshot, "device_choice": choice})
            fp = ctx.data_fingerprint()
            run.write_json("data.json", fp)
            run.set(config_hash=sha256_json(ctx.config), data_fingerprint=fp["hash"])
        budget, budget_source = (memory_budget, "--memory-budget") if memory_budget else _default_budget(choice, snapshot)
        state: dict[str, Any] = {}
        try:
            _model_checks(ctx, run, rep, choice, budget, budget_source, find_max_micro_batch, state)
        finally:
            state.pop("model", None)
        seconds = time.perf_counter() - t_start
        _write(ctx, run, rep, snapshot, platform_key(snapshot), choice, budget, budget_source, seconds)
        _print_table(rep, run.id, seconds)
        if rep.failed:
            first = rep.failed[0]
            raise CheckFailed(f"preflight {run.id}: {len(rep.failed)} of {len(rep.checks)} checks failed; {first['name']}: {first['message']}",
                              hint=f"see {run.path(PREFLIGHT_FILE)}; fix the study file and run `tuneproof preflight` again")
        return run.id


def _model_checks(ctx: StudyContext, run, rep: _Report, choice: dict[str, Any], budget: int, budget_source: str,
                  find_max: bool, state: dict[str, Any]) -> None:
    """Checks 3 to 12 (those after the backend); a check that cannot run is listed as skipped, with why."""
    from tuneproof.preflight.eval_batch import check_study_eval_batch  # noqa: PLC0415
    from tuneproof.preflight.packing import check_study_packing  # noqa: PLC0415
    from tuneproof.training.loop import seed_everything  # noqa: PLC0415

    later = ["training data", "target modules", "trainable parameters", "embedding size",
             *(["bf16 base weights"] if ctx.study.training.bf16_base_weights else []), "update check", "step memory", "eval memory",
             "gradient accumulation", "precision", "activation checkpointing", "eval batch size", *SMOKE_CHECKS]
    if ctx.study.training.packing:
        later.insert(later.index("eval batch size") + 1, "packing")
    if ctx.study.training.chunked_loss:
        later.insert(later.index("eval batch size") + 1 + int(ctx.study.training.packing), "chunked loss")
    if ctx.study.method.kind == "qlora":
        later[later.index("update check") + 1:later.index("update check") + 1] = ["qlora storage", "qlora step"]

    def skip_rest(why: str) -> None:
        seen = {c["name"] for c in rep.checks}
        for name in later:
            if name not in seen:
                rep.skip(name, why)

    if not rep.checks[-1]["passed"]:
        return skip_rest("the backend cannot run this configuration")
    cfg = ctx.study.training
    encoded = ctx.pipeline.encode_all(ctx.split("train"))
    data_check = rep.run("training data", lambda: check_training_data(ctx, encoded))
    usable = [e for e in encoded if not e.faults]
    if not usable:
        return skip_rest("no usable train example")
    seed_everything(cfg.seed)  # initialisation follows training.seed, as in run_train
    model = report = failure = None
    try:
        model, report = ctx.build_model()
    except CheckFailed as err:  # a target pattern that matches nothing (C5)
        failure = str(err).splitlines()[0]
    state["model"] = model
    for c in _target_checks(ctx, model, report, failure):
        rep.add(c)
    if model is None:
        return skip_rest("the model could not be built (target modules)")
    run.write_json("method.json", report)
    _, _, autocast = ctx.torch_setup()
    pad = getattr(ctx.tokenizer, "pad_token_id", 0) or 0  # an image processor has no pad token (and needs none)
    probe = _micro_batch(usable, min(PROBE_MICRO_BATCH, len(usable)), cfg.seed, 0, pad)
    if cfg.bf16_base_weights:  # every later check sees the frozen weights as training will hold them
        # the precision and accumulation checks compare in fp32 compute (no autocast), which needs fp32
        # weights: before the cast (the accumulation rule, C1/C18, does not depend on the weights' dtype)
        windows, last = _accumulation_probes(usable, cfg, pad)
        rep.run("gradient accumulation", lambda: check_accumulation_window(model, windows, cfg.gradient_accumulation_steps, last))
        rep.run("precision", lambda: check_precision(model, probe, choice, autocast))
        rep.run("bf16 base weights", lambda: check_study_bf16_base(ctx, model, usable, pad, autocast))
    rep.run("update check", lambda: check_update_step(model, probe, autocast))
    if ctx.study.method.kind == "qlora":  # issue 15 item 4: storage shardable, loss / grad norm of a real step sane
        _qlora_checks(ctx, rep, model, probe, autocast)
    if ctx.is_image:
        _image_checks(ctx, rep, model, usable, probe, choice, budget, autocast)
    else:
        _text_checks(ctx, rep, model, usable, probe, pad, data_check, choice, budget, budget_source, find_max, autocast)
    if not rep.get("step memory")["passed"]:  # the configured micro-batch does not fit: its steps would run out of memory
        return skip_rest("the configured micro-batch does not fit the memory budget (step memory)")
    _smoke(ctx, run, rep, model, usable, skip_rest)


def _qlora_checks(ctx: StudyContext, rep: _Report, model, probe: dict, autocast) -> None:
    """``qlora storage`` (the 4-bit storage dtype vs FSDP, for ``distributed.strategy``; this single
    process shards nothing, ``tuneproof train --nproc-per-node N`` refuses a non-float storage under
    FSDP) and ``qlora step`` (loss and LoRA gradient norm of one real step finite and non-zero),
    rules in :mod:`tuneproof.preflight.qlora`."""
    from tuneproof.preflight.qlora import check_quant_storage, check_step_values, measure_step  # noqa: PLC0415

    q = ctx.quantization

    def storage() -> dict[str, Any]:
        fsdp = ctx.study.distributed.strategy == "fsdp"
        c = check_quant_storage(q["bnb_4bit_quant_storage"], q["bnb_4bit_compute_dtype"], sharded=False)
        extra = {}
        if fsdp:  # what `train --nproc-per-node N` would refuse, said now (a warning: this process shards nothing)
            under = check_quant_storage(q["bnb_4bit_quant_storage"], q["bnb_4bit_compute_dtype"], sharded=True)
            if not under["passed"]:
                extra["warning"] = f"distributed.strategy fsdp with N > 1 processes will be refused: {under['message']}"
        return _check(c["name"], c["passed"], c["message"], c["numbers"], {"quantization": q}, **extra)

    def step() -> dict[str, Any]:
        m = measure_step(model, probe, autocast)
        c = check_step_values(m["loss"], m["grad_norm"])
        return _check(c["name"], c["passed"], c["message"], {**c["numbers"], "tensors_with_grad": m["tensors_with_grad"]}, m)

    rep.run("qlora storage", storage)
    rep.run("qlora step", step)


def _accumulation_probes(usable: list, cfg, pad: int) -> tuple[list[dict], list[dict] | None]:
    """The micro-batches of the gradient accumulation check: ``max(2, accumulation)`` windows of
    real train examples, and the short last window of an epoch when there is one (C18)."""
    k = max(2, cfg.gradient_accumulation_steps)
    size = max(1, min(PROBE_MICRO_BATCH, len(usable) // k))
    return [_micro_batch(usable, size, cfg.seed, i, pad) for i in range(k)], _last_window_probe(usable, cfg, size, pad)


def _text_checks(ctx: StudyContext, rep: _Report, model, usable: list, probe: dict, pad: int, data_check: dict, choice: dict[str, Any],
                 budget: int, budget_source: str, find_max: bool, autocast) -> None:
    """A causal LM's or text classifier's checks after the update check (step memory at two lengths...)."""
    from tuneproof.preflight.eval_batch import check_study_eval_batch  # noqa: PLC0415
    from tuneproof.preflight.packing import check_study_packing  # noqa: PLC0415

    cfg = ctx.study.training
    lengths = sorted({min(data_check["numbers"].get("p95") or cfg.max_length, cfg.max_length), cfg.max_length})
    dtype = choice["dtype"]
    print_memory_breakdown(rep.run("step memory", lambda: check_step_memory(model, ctx, usable, lengths, dtype, budget, budget_source, autocast)))
    rep.run("eval memory", lambda: check_eval_memory(model, ctx, budget, budget_source, autocast))
    if find_max:
        rep.run("max micro-batch", lambda: check_max_micro_batch(model, ctx, usable, lengths[0], dtype, budget, autocast))
    if rep.get("gradient accumulation") is None:  # with training.bf16_base_weights it ran before the cast
        windows, last = _accumulation_probes(usable, cfg, pad)
        rep.run("gradient accumulation", lambda: check_accumulation_window(model, windows, cfg.gradient_accumulation_steps, last))
    if rep.get("precision") is None:  # with training.bf16_base_weights it ran before the cast
        rep.run("precision", lambda: check_precision(model, probe, choice, autocast))
    rep.run("activation checkpointing", lambda: check_checkpointing(ctx, model, probe))
    rep.run("eval batch size", lambda: check_study_eval_batch(ctx, model))  # C22: outputs do not depend on eval.batch_size
    if cfg.packing:  # C23: packed rows give each example's own per-token losses (issue 15)
        rep.run("packing", lambda: check_study_packing(model, usable, cfg, pad))
    if cfg.chunked_loss:  # the check train runs before using it, here before the hours are spent
        rep.run("chunked loss", lambda: check_study_chunked_loss(model, usable, cfg, pad))


def check_study_chunked_loss(model, encoded: list, cfg, pad_id: int) -> dict[str, Any]:
    """The preflight's "chunked loss" check (listed only with ``training.chunked_loss``): the check the
    train loop runs before it uses the chunked loss (:func:`tuneproof.training.loss.check_chunked_loss`
    on the first micro-batch of train examples, packed into rows when ``training.packing`` is on):
    summed loss and every trainable gradient equal to the full-logits loss. A classification head
    (no token labels) fails it, naming the key."""
    from tuneproof.training.loop import _check_speedup  # noqa: PLC0415
    from tuneproof.training.speedups import packing_capacity  # noqa: PLC0415

    device = next(model.parameters()).device
    res = _check_speedup(model, encoded[: cfg.micro_batch_size], pad_id, device, packing_capacity(cfg) if cfg.packing else None)
    numbers = {k: res[k] for k in ("loss_rel_diff", "grad_max_rel_diff", "tensors") if k in res}
    message = res["message"] if res["passed"] else f"training.chunked_loss: {res['message']}; set it to false"
    return _check("chunked loss", res["passed"], message, numbers)


def _smoke(ctx: StudyContext, run, rep: _Report, model, usable: list, skip_rest) -> None:
    try:
        check_smoke(ctx, run, model, usable, rep)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as err:  # noqa: BLE001 - the first smoke check not yet recorded fails with the error
        if fault_cause(err):  # disk full / read-only: the run fails with it
            raise
        seen = {c["name"] for c in rep.checks}
        name = next(n for n in SMOKE_CHECKS if n not in seen)
        text = str(err).strip().splitlines()[0] if str(err).strip() else ""
        rep.add(_check(name, False, f"error: {type(err).__name__}: {text}", details={"traceback": traceback.format_exc()}))
        skip_rest(f"{name} stopped")


def _image_checks(ctx: StudyContext, rep: _Report, model, usable: list, probe: dict, choice: dict[str, Any], budget: int,
                  autocast) -> None:
    """An image classifier's checks after the update check: step and eval memory on real images,
    accumulation, precision, activation checkpointing, C22 for a forward pass (the smoke pass follows,
    as for text)."""
    from tuneproof.data.image_pipeline import collate_images  # noqa: PLC0415
    from tuneproof.preflight import image_checks  # noqa: PLC0415

    cfg = ctx.study.training
    device, _, _ = ctx.torch_setup()
    step_batch = {k: v.to(device) for k, v in collate_images(usable[: cfg.micro_batch_size]).items()}
    rep.run("step memory", lambda: _check("step memory", **image_checks.check_image_step_memory(model, step_batch, budget, autocast)))
    evals = ctx.eval_examples()
    eval_batch = {k: v.to(device) for k, v in collate_images(ctx.pipeline.encode_all(evals[: ctx.study.eval.batch_size])).items()}
    rep.run("eval memory", lambda: _check("eval memory", **image_checks.check_image_eval_memory(model, eval_batch, budget, autocast)))
    if rep.get("gradient accumulation") is None:  # with training.bf16_base_weights it ran before the cast
        windows, last = _accumulation_probes(usable, cfg, 0)
        rep.run("gradient accumulation", lambda: check_accumulation_window(model, windows, cfg.gradient_accumulation_steps, last))
    if rep.get("precision") is None:  # with training.bf16_base_weights it ran before the cast
        rep.run("precision", lambda: check_precision(model, probe, choice, autocast))
    rep.run("activation checkpointing", lambda: check_checkpointing(ctx, model, probe))
    sample = evals[: max(2, min(len(evals), 2 * ctx.study.eval.batch_size))]
    rep.run("eval batch size", lambda: _check("eval batch size", **image_checks.check_image_eval_batch(
        model, ctx.pipeline, sample, ctx.labels, ctx.study.eval.batch_size, device, autocast)))
    rep.skip("embedding size", "an image classifier has no token embeddings")


def _write(ctx: StudyContext, run, rep: _Report, snapshot: dict[str, Any], key: str, choice: dict[str, Any], budget: int,
           budget_source: str, seconds: float) -> None:
    """``preflight.json`` (every check in full) and the run summary (each check's verdict and the key numbers)."""
    def num(name: str, field: str) -> Any:
        c = rep.get(name)
        return (c or {}).get("numbers", {}).get(field)

    passed = not rep.failed
    run.write_json(PREFLIGHT_FILE, {
        "run": run.id, "passed": passed, "failed": [c["name"] for c in rep.failed], "platform_key": key,
        "dtype": choice, "budget_bytes": budget, "budget_source": budget_source, "seconds": round(seconds, 2),
        "checks": rep.checks,
    })
    mem = rep.get("step memory")
    memory = {k: v for k, v in (mem or {}).get("numbers", {}).items() if k.endswith(("_gib", "_measured_over_estimate"))}
    memory.update({f"eval_{k}": v for k, v in (rep.get("eval memory") or {}).get("numbers", {}).items() if k.endswith("_gib")})
    acc = rep.get("gradient accumulation")
    run.update_summary(
        passed=passed, failed=[c["name"] for c in rep.failed],
        checks=[{"name": c["name"], "passed": c["passed"], "message": c["message"][:400]} for c in rep.checks],
        platform_key=key, dtype=choice.get("dtype"), dtype_reason=choice.get("reason"),
        s_per_step=num("throughput", "s_per_step"), tokens_per_s=num("throughput", "tokens_per_s"),
        eval_s_per_example=num("throughput", "eval_s_per_example"), budget_seconds=num("throughput", "budget_seconds"),
        eval_seconds_estimate=num("throughput", "eval_seconds_estimate"), total_steps=num("throughput", "total_steps"),
        reload_seconds=num("smoke pass", "reload_seconds"), memory=memory, budget_gib=_gib(budget),
        memory_breakdown=((mem or {}).get("details") or {}).get("breakdown") if isinstance((mem or {}).get("details"), dict) else None,
        max_micro_batch=num("max micro-batch", "max_micro_batch"),
        loss_normalisation=(acc or {}).get("normalisation"),
        trainable=num("trainable parameters", "trainable"), total_params=num("trainable parameters", "total"),
        preflight_seconds=round(seconds, 1), **_eval_batch_rate(rep),
    )


def _eval_batch_rate(rep: _Report) -> dict[str, Any]:
    """Seconds per example of the one evaluation batch ``eval memory`` timed at ``eval.batch_size``
    (the task kind's own procedure: a classifier's forward pass, or generation up to
    ``eval.max_new_tokens``), for ``tuneproof plan``; {} when it was not measured."""
    c = rep.get("eval memory") or {}
    m = (c.get("details") or {}).get("measured") if isinstance(c.get("details"), dict) else None
    if not m or not m.get("seconds") or not m.get("batch_size"):
        return {}
    what = "classifier forward pass" if m["kind"] == "sequence-classification" else f"generation of {m['new_tokens']} new tokens"
    return {"eval_batch_s_per_example": round(m["seconds"] / m["batch_size"], 5), "eval_batch_size": m["batch_size"],
            "eval_batch_procedure": what}


def _short(numbers: dict[str, Any], limit: int = 6) -> str:
    parts = []
    for k, v in list(numbers.items())[:limit]:
        if isinstance(v, float):
            v = f"{v:.4g}"
        elif isinstance(v, list):
            v = ",".join(str(round(x, 4) if isinstance(x, float) else x) for x in v[:4]) + ("..." if len(v) > 4 else "")
        parts.append(f"{k}={v}")
    return "; ".join(parts)


#: terminal width from which the preflight table shows each check's numbers (key=value, never cut)
NUMBERS_FROM_COLUMNS = 120


def _print_table(rep: _Report, run_id: str, seconds: float) -> None:
    from rich.markup import escape  # noqa: PLC0415

    rows = [[c["name"], {True: "[green]pass[/]", False: "[red]FAIL[/]", None: "[dim]skip[/]"}[c["passed"]], escape(_short(c["numbers"], 4)),
             escape(c["message"][:240] + ("..." if len(c["message"]) > 240 else ""))] for c in rep.checks]
    # a number folded across two lines reads as another number (trainable_tensors=24 / 0): the numbers
    # are whole or left out (narrow terminals, logs: they are in preflight.json)
    drop = ("numbers",) if console.width < NUMBERS_FROM_COLUMNS else ()
    if drop:
        rows = [[r[0], r[1], r[3]] for r in rows]
    console.print(table(f"preflight {run_id} ({seconds:.0f} s)", ["check", "result", "message"] if drop else ["check", "result", "numbers", "message"],
                        rows, keep=("check", "numbers")))
    if drop:
        console.print(f"[dim]each check's numbers: runs/{run_id}/preflight.json (a terminal of {NUMBERS_FROM_COLUMNS} columns shows them here)[/]")
    if rep.failed:
        console.print(f"[red]preflight failed: {', '.join(c['name'] for c in rep.failed)}[/]")
    else:
        console.print("[green]preflight passed[/]: `tuneproof train` may start on this config, data and platform")


# --------------------------------------------------------------------------- the gate of `train`
def require_preflight(ctx: StudyContext, override: str | None) -> str | None:
    """Refuse to train unless a completed preflight matches the current resolved config, data
    fingerprint and platform key. Config keys that cannot change what the preflight measured
    (:data:`tuneproof.preflight.scope.EXEMPT`: ``training.max_steps``/``epochs``,
    ``checkpoint_every``, scoring settings of ``eval``, ``name``, ``hypothesis``) are left out of
    the match. Returns the matching preflight run id, or None when ``override``
    (``--skip-preflight "reason"``) is given; ``run_train`` records the override.

    Raises:
        CheckFailed: no matching preflight (exit 3, a protocol step is missing; names the config
            keys that changed since the latest passed preflight, with both values, and the command to run).
        TuneproofError: an empty override reason (exit 2).
    """
    from tuneproof.io import read_json  # noqa: PLC0415
    from tuneproof.preflight.envinfo import environment_snapshot, platform_key  # noqa: PLC0415
    from tuneproof.preflight.scope import describe_changes, preflight_changes  # noqa: PLC0415

    if override is not None:
        if not override.strip():
            raise TuneproofError("--skip-preflight needs a reason, e.g. --skip-preflight \"preflight r0004 passed on this machine yesterday\"")
        console.print(f"[yellow]warning[/]: training without a matching preflight; recorded override: {override}")
        return None
    config = ctx.config
    data_fp = ctx.data_fingerprint()["hash"]
    key = platform_key(environment_snapshot())
    done = ctx.registry.list(kind="preflight", status="completed")

    def changes_of(rec) -> list[dict[str, Any]] | None:
        path = ctx.registry.runs_dir / rec.id / "config.json"
        if not path.exists():
            return None
        recorded = read_json(path)
        return preflight_changes(recorded if isinstance(recorded, dict) else {}, config)

    for rec in reversed(done):
        if rec.data_fingerprint == data_fp and rec.summary.get("platform_key") == key and changes_of(rec) == []:
            console.print(f"[dim]preflight {rec.id} passed for this config, data and platform[/]")
            return rec.id
    cmd = "tuneproof preflight" + (f" --study {ctx.study_dir}" if Path.cwd().resolve() != ctx.study_dir else "")
    if not done:
        why = "no preflight has passed in this study"
    else:
        last = done[-1]
        diffs = []
        changes = changes_of(last)
        if changes is None:
            diffs.append("the resolved config (its config.json is missing)")
        elif changes:
            diffs.append(f"config {describe_changes(changes)}")
        if last.data_fingerprint != data_fp:
            diffs.append("the data fingerprint")
        if last.summary.get("platform_key") != key:
            diffs.append(f"the platform ({last.summary.get('platform_key')} -> {key})")
        why = f"the latest passed preflight {last.id} was for another configuration: {'; '.join(diffs) or 'unknown'} changed"
    raise CheckFailed(f"train refused: {why}",
                      hint=f"run `{cmd}` first (a variant: `{cmd} --from RUN --set KEY=VALUE`), or `tuneproof train --skip-preflight \"REASON\"` "
                           "(the override is recorded in the run); changes of training.max_steps/epochs/checkpoint_every, "
                           "eval scoring settings, name or hypothesis keep a preflight valid")


if __name__ == "__main__":
    sys.exit(_reload_main(sys.argv[1:]))
