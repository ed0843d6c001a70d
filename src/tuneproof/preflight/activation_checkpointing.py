"""Activation checkpointing checked on its own (docs/PROTOCOL.md step 5; docs/CASES.md C7).

"Activation checkpointing trades extra compute for fewer stored activations" -- and must not
change the gradients. :func:`check_activation_checkpointing` builds the model twice (without and
with checkpointing), runs the same forward and backward on the same batch with the same RNG
seed, and compares loss and every gradient. It reports the step time and the measured memory
peak of forward + backward for each, so the trade is visible.
"""

from __future__ import annotations

import copy
import gc
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from tuneproof.context import StudyContext
from tuneproof.models.method import cast_frozen_to_bf16
from tuneproof.preflight.report import check_result
from tuneproof.preflight.update_check import LossFn, batch_loss, diagnose_gradient_flow, forked_rng, model_device
from tuneproof.training.loop import seed_everything
from tuneproof.training.memory import measure_step_peak


def _fingerprint(model: nn.Module) -> dict[str, tuple[float, float]]:
    out = {}
    with torch.no_grad():
        for n, p in model.named_parameters():
            t = p.detach().double()
            out[n] = (float(t.sum()), float((t * t).sum()))
    return out


def _run(model: nn.Module, batch: dict, loss_fn: LossFn, seed: int, measure_memory: bool) -> dict[str, Any]:
    device = model_device(model)
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    model.train()

    def fwd_bwd() -> float:
        for _, p in trainable:
            p.grad = None
        with forked_rng(device):
            torch.manual_seed(seed)
            loss = loss_fn(model, batch)
            if loss.requires_grad:
                loss.backward()
        return float(loss.detach().float())

    loss = fwd_bwd()  # warm-up run; its gradients are compared
    grads = {n: (None if p.grad is None else p.grad.detach().float().cpu().clone()) for n, p in trainable}
    for _, p in trainable:
        p.grad = None
    if measure_memory:
        measured = measure_step_peak(fwd_bwd, device)
    else:
        t0 = time.perf_counter()
        fwd_bwd()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        measured = {
            "seconds": time.perf_counter() - t0,
            "peak_bytes": None,
            "step_peak_bytes": None,
            "method": None,
            "approximate": None,
        }
    for _, p in trainable:
        p.grad = None
    return {
        "loss": loss,
        "grads": grads,
        "fingerprint": _fingerprint(model),
        "diagnosis": diagnose_gradient_flow(model),
        "seconds": measured["seconds"],
        "peak_bytes": measured.get("peak_bytes"),
        "step_peak_bytes": measured.get("step_peak_bytes"),
        "allocated_step_peak_bytes": measured.get("allocated_step_peak_bytes"),
        "method": measured.get("method"),
        "approximate": measured.get("approximate"),
    }


def check_activation_checkpointing(
    model_factory: Callable[[bool], nn.Module],
    batch: dict,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    *,
    loss_fn: LossFn | None = None,
    measure_memory: bool = True,
    seed: int = 0,
) -> dict[str, Any]:
    """Gradients with and without activation checkpointing are equal; time and memory of each.

    Args:
        model_factory: ``factory(checkpointing: bool) -> model`` returning the model as it will
            train, with identical weights each call (same seed / same checkpoint), with activation
            checkpointing configured (and any remedy such as ``enable_input_require_grads``)
            when ``checkpointing`` is True. The two models are built one after the other.
        batch: one micro-batch (docs/CONTRACTS.md batch format).
        rtol, atol: ``torch.allclose`` tolerances per gradient tensor and on the loss. Recomputation
            repeats the same kernels, so on one device results are usually bitwise equal; the
            defaults leave room for non-deterministic GPU reductions.
        loss_fn: ``(model, batch) -> scalar loss``; default ``update_check.batch_loss``.
        measure_memory: measure the peak of forward + backward with ``training.memory.measure_step_peak``:
            the memory saved is the difference of the step's tensors at their peak (torch's CPU
            allocator, or CUDA's peak allocated), the same at every run; the process's resident set
            (approximate: glibc's heap and the interpreter share it) only when that count is missing.
        seed: torch RNG seed of both runs (dropout draws the same masks).

    Fails when the weights differ between the two builds, a trainable tensor gets a gradient
    without checkpointing but none with it (the docs/CASES.md C7 fault, with cause and remedy), the factory did
    not switch checkpointing as asked, or loss/gradients differ beyond tolerance.

    Returns:
        ``{"passed", "message", "rtol", "atol", "loss_without", "loss_with", "grad_tensors",
        "grad_max_abs_diff", "grad_mismatches": [names], "missing_with_checkpointing": [names],
        "weights_identical", "without": {"seconds", "peak_bytes", "step_peak_bytes",
        "allocated_step_peak_bytes", "method"}, "with": {...}, "memory_saved_bytes" (the step's
        tensors without - with, else step_peak without - with, or None), "time_ratio"
        (seconds with / without), "approximate", "diagnosis"}``. Seconds are wall-clock of one
        forward + backward; bytes as in ``measure_step_peak``.
    """
    loss_fn = loss_fn or batch_loss
    runs = {}
    for flag in (False, True):
        model = model_factory(flag)
        runs[flag] = _run(model, batch, loss_fn, seed, measure_memory)
        del model
        gc.collect()
    off, on = runs[False], runs[True]
    problems = []
    if not on["diagnosis"]["activation_checkpointing"]:
        problems.append("model_factory(True) returned a model without activation checkpointing enabled")
    if off["diagnosis"]["activation_checkpointing"]:
        problems.append("model_factory(False) returned a model with activation checkpointing enabled")
    weights_identical = off["fingerprint"] == on["fingerprint"]
    if not weights_identical:
        problems.append(
            "the two models built by model_factory have different weights; seed the factory or load the same checkpoint"
        )
    missing = [n for n, g in on["grads"].items() if g is None and off["grads"].get(n) is not None]
    if missing:
        d = on["diagnosis"]
        cause = f"; cause: {d['cause']}; remedy: {d['remedy']}" if d["cause"] else ""
        problems.append(
            f"with checkpointing {len(missing)} of {len(on['grads'])} trainable "
            f"tensors get no gradient: {', '.join(missing[:5])}{cause}"
        )
    mismatches, max_diff = [], 0.0
    for n, a in off["grads"].items():
        b = on["grads"].get(n)
        if a is None or b is None:
            continue
        max_diff = max(max_diff, float((a - b).abs().max()) if a.numel() else 0.0)
        if not torch.allclose(a, b, rtol=rtol, atol=atol):
            mismatches.append(n)
    if mismatches:
        problems.append(
            f"{len(mismatches)} gradient tensors differ beyond rtol={rtol:g}, atol={atol:g} "
            f"(max abs diff {max_diff:.2e}): {', '.join(mismatches[:5])}"
        )
    loss_ok = abs(off["loss"] - on["loss"]) <= atol + rtol * abs(off["loss"])
    if not loss_ok:
        problems.append(f"loss differs: {off['loss']:.8g} without, {on['loss']:.8g} with checkpointing")
    saved = None
    tensors = off.get("allocated_step_peak_bytes") is not None and on.get("allocated_step_peak_bytes") is not None
    if (
        tensors
    ):  # the step's tensors (CPU allocator / CUDA peak allocated): the same at every run, unlike the resident set
        saved = off["allocated_step_peak_bytes"] - on["allocated_step_peak_bytes"]
    elif off["step_peak_bytes"] is not None and on["step_peak_bytes"] is not None:
        saved = off["step_peak_bytes"] - on["step_peak_bytes"]
    time_ratio = on["seconds"] / off["seconds"] if off["seconds"] else None
    approximate = not tensors and bool(off.get("approximate") or (off.get("method") or "").startswith("process"))
    if problems:
        message = "activation checkpointing check failed: " + "; ".join(problems)
    else:
        mem = f", forward+backward peak {saved / 2**20:+.1f} MiB saved" if saved is not None else ""
        message = (
            "gradients equal with and without activation checkpointing ("
            f"{len(off['grads'])} tensors, max abs diff {max_diff:.2e}); "
            f"time x{time_ratio:.2f}{mem}"
            + (" (CPU memory reading is approximate)" if approximate and saved is not None else "")
        )

    def public(r: dict[str, Any]) -> dict[str, Any]:
        return {
            k: r.get(k) for k in ("seconds", "peak_bytes", "step_peak_bytes", "allocated_step_peak_bytes", "method")
        }

    return {
        "passed": not problems,
        "message": message,
        "rtol": rtol,
        "atol": atol,
        "loss_without": off["loss"],
        "loss_with": on["loss"],
        "grad_tensors": len(off["grads"]),
        "grad_max_abs_diff": max_diff,
        "grad_mismatches": mismatches,
        "missing_with_checkpointing": missing,
        "weights_identical": weights_identical,
        "without": public(off),
        "with": public(on),
        "memory_saved_bytes": saved,
        "time_ratio": time_ratio,
        "approximate": approximate,
        "diagnosis": on["diagnosis"],
    }


def check_study_checkpointing(ctx: StudyContext, model, batch: dict) -> dict[str, Any]:
    """The preflight's ``activation checkpointing`` check: :func:`check_activation_checkpointing` on
    the configured ``model`` and one built the same way with ``training.activation_checkpointing``
    flipped (same seed, cached base, tokenizer and device choice), on the probe micro-batch ``batch``."""
    configured = ctx.study.training.activation_checkpointing

    def factory(flag: bool):
        if flag == configured:
            return model
        other = copy.copy(ctx)  # same cached base, tokenizer, device choice; only the flag differs
        other.study = ctx.study.model_copy(deep=True)
        other.study.training.activation_checkpointing = flag
        seed_everything(ctx.study.training.seed)  # the same initialisation as the configured model
        built, _ = other.build_model()
        if ctx.study.training.bf16_base_weights:  # held as the configured model's (cast by the bf16 base weights check)
            cast_frozen_to_bf16(built)
        return built

    r = check_activation_checkpointing(factory, batch)
    saved = r["memory_saved_bytes"]
    numbers = {
        "configured": configured,
        "grad_max_abs_diff": r["grad_max_abs_diff"],
        "rtol": r["rtol"],
        "atol": r["atol"],
        "time_ratio": round(r["time_ratio"], 3) if r["time_ratio"] else None,
        "seconds_without": round(r["without"]["seconds"], 3),
        "seconds_with": round(r["with"]["seconds"], 3),
        "memory_saved_mib": round(saved / 2**20, 1) if saved is not None else None,
        "approximate": r["approximate"],
    }
    return check_result(
        "activation checkpointing",
        bool(r["passed"]),
        r["message"] + f" (configured: {'on' if configured else 'off'})",
        numbers,
        {k: v for k, v in r.items() if k != "diagnosis"} | {"diagnosis": r["diagnosis"]},
    )
