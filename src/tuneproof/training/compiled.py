"""``training.compile``: ``torch.compile`` of the decoder, the module that holds nearly all of a
training step's forward and backward (docs/speedups.md). The decoder is compiled in place
(``nn.Module.compile``, ``dynamic=True``: micro-batches of other lengths reuse the graph instead of
compiling again), so the plain loss and the chunked loss (which calls the decoder directly,
:func:`tuneproof.training.loss.chunked_token_loss_sum`) both go through it; the optimizer step stays eager.

Used only after :func:`prove_compile` found the loss and the trained tensors' gradients of the first
real micro-batch equal to eager mode's within the stated tolerances; its compile seconds (both graphs:
without and with dropout) and the per-micro-batch times are recorded, with the break-even point.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from tuneproof.data.image_pipeline import collate_images
from tuneproof.data.preprocess import collate
from tuneproof.errors import CheckFailed

#: Compiled vs eager on one micro-batch, dropout off. fp32 compute: the loss within 1e-5 (relative)
#: and the gradients (all trained tensors as one vector) within 1e-4 relative L2 error, room for
#: Inductor's fused and reordered fp32 reductions (about 1e-7 relative each). Not yet measured with
#: Inductor on a real model (docs/benchmarks-compile.md); with the eager backend the compiled graph
#: computes exactly what eager mode does (0 and 0 on the test's model), and a graph that scales one
#: activation by 1.01 is off by 8.6e-5 (loss) and 5.1e-3 (gradients), outside both limits
#: (tests/training/test_speedups_auto.py). 16-bit compute: Inductor keeps some intermediates in fp32
#: where eager rounds them to 16 bits, so the tolerances are those of the bf16 frozen-weights check
#: (tuneproof.training.speedups: 1e-2 and 0.1).
COMPILE_TOLERANCES = {
    "fp32": {"loss_rtol": 1e-5, "grad_rel_l2": 1e-4},
    "16-bit": {"loss_rtol": 1e-2, "grad_rel_l2": 0.1},
}


def compile_target(model):
    """The module ``training.compile`` compiles: the causal LM's decoder (PEFT-wrapped or not), else the
    model's own base (a classifier)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = base.get_decoder() if hasattr(base, "get_decoder") else None
    return decoder if isinstance(decoder, torch.nn.Module) else base


def apply_compile(model, backend: str = "inductor") -> torch.nn.Module:
    """Compile :func:`compile_target` in place with ``backend`` (tests use ``aot_eager``: the same traced
    forward and backward graphs without generating kernels); returns it (the graph is built at its first call)."""
    target = compile_target(model)
    target.compile(dynamic=True, backend=backend)
    return target


def remove_compile(target: torch.nn.Module) -> None:
    """Back to eager mode (undoes ``nn.Module.compile``)."""
    target._compiled_call_impl = None


def first_micro_batch(examples: list, pad_id: int, device) -> dict[str, torch.Tensor]:
    """The check's micro-batch on ``device``: token sequences padded (``collate``), images stacked."""
    batch = collate(examples, pad_id) if hasattr(examples[0], "input_ids") else collate_images(examples)
    return {k: v.to(device) for k, v in batch.items()}


def _grad_vector(params: list) -> torch.Tensor:
    return torch.cat(
        [(p.grad if p.grad is not None else torch.zeros_like(p)).detach().float().reshape(-1).cpu() for p in params]
    )


def prove_compile(
    model,
    batch: dict,
    loss_fn,
    *,
    low_precision: bool,
    planned_micro_batches: int,
    device: Any = "cpu",
    backend: str = "inductor",
) -> dict[str, Any]:
    """Check ``training.compile`` on one real micro-batch and measure what it costs and saves.

    Steps: eager forward + backward without dropout (the reference; a warm-up before it), compile
    (:func:`apply_compile`), the same compiled (its first call builds the graph: timed), compared;
    then with dropout (``model.train()``): eager twice and compiled three times (the first builds the
    training graph), timed. Gradients are cleared after; the RNG state is put back.

    Args:
        loss_fn: ``model, batch -> (summed loss, V)``, the loop's loss under its autocast.
        low_precision: the compute dtype is bf16/fp16 (the wider tolerances of
            :data:`COMPILE_TOLERANCES`).
        planned_micro_batches: micro-batches the run will compute (steps x accumulation): the budget
            the compile seconds must be paid back in.
        backend: ``torch.compile``'s backend (:func:`apply_compile`).

    Returns:
        ``{"passed", "pays", "loss_eager", "loss_compiled", "loss_rel_diff", "grad_rel_l2", "tensors",
        "compile_seconds" (both graphs, beyond a compiled micro-batch), "eager_s_per_micro_batch",
        "compiled_s_per_micro_batch", "speedup" (eager / compiled), "break_even_micro_batches" (None:
        never), "planned_micro_batches", "tolerance", "target" (the compiled module's class),
        "message", "compiled" (the module, for :func:`remove_compile`)}``. When the check fails the
        module is back in eager mode.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    count = max(int((batch["labels"] != -100).sum()) if batch["labels"].dim() == 2 else batch["labels"].numel(), 1)
    tol = COMPILE_TOLERANCES["16-bit" if low_precision else "fp32"]
    was_training = model.training
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None

    def step() -> float:
        model.zero_grad(set_to_none=True)
        loss, _ = loss_fn(model, batch)
        (loss / count).backward()
        if str(device).startswith("cuda"):
            torch.cuda.synchronize()
        return float(loss.detach()) / count

    def timed() -> tuple[float, float]:
        t = time.perf_counter()
        value = step()
        return value, time.perf_counter() - t

    target = None
    try:
        model.eval()
        step()  # warm-up
        l_eager = step()
        g_eager = _grad_vector(params)
        target = apply_compile(model, backend)
        l_comp, first_eval = timed()
        g_comp = _grad_vector(params)
        model.train()
        eager_times = [timed()[1] for _ in range(2)]
        first_train = timed()[1]
        comp_times = [timed()[1] for _ in range(2)]
    except Exception:
        if target is not None:
            remove_compile(target)
        raise
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)
        torch.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
    finite = math.isfinite(l_comp) and bool(torch.isfinite(g_comp).all())
    rel = abs(l_comp - l_eager) / max(abs(l_eager), 1e-12)
    ref = float(g_eager.norm())
    rel_l2 = float((g_comp - g_eager).norm()) / ref if ref > 0 else float("inf")
    passed = finite and rel <= tol["loss_rtol"] and rel_l2 <= tol["grad_rel_l2"]
    eager, compiled = min(eager_times), min(comp_times)
    compile_s = max(first_eval - compiled, 0.0) + max(first_train - compiled, 0.0)
    saving = eager - compiled
    break_even = math.ceil(compile_s / saving) if saving > 0 else None
    pays = break_even is not None and break_even <= planned_micro_batches
    numbers = (
        f"loss rel. diff {rel:.1e} (<= {tol['loss_rtol']:g}), gradients rel. L2 {rel_l2:.1e} "
        f"(<= {tol['grad_rel_l2']:g}) over {len(params)} tensors"
    )
    cost = (
        f"compile {compile_s:.1f} s, {eager:.3f} -> {compiled:.3f} s per micro-batch, break-even "
        + (f"{break_even} micro-batches" if break_even is not None else "never (no faster)")
        + f" of {planned_micro_batches} planned"
    )
    if not passed:
        remove_compile(target)
    message = (
        f"compiled equals eager: {numbers}; {cost}"
        if passed
        else f"compiled differs from eager: {numbers}; leave training.compile off"
    )
    return {
        "passed": passed,
        "pays": pays,
        "loss_eager": l_eager,
        "loss_compiled": l_comp,
        "loss_rel_diff": rel,
        "grad_rel_l2": rel_l2,
        "tensors": len(params),
        "compile_seconds": round(compile_s, 3),
        "eager_s_per_micro_batch": round(eager, 5),
        "compiled_s_per_micro_batch": round(compiled, 5),
        "speedup": round(eager / compiled, 4) if compiled > 0 else None,
        "break_even_micro_batches": break_even,
        "planned_micro_batches": planned_micro_batches,
        "tolerance": tol,
        "target": type(target).__name__,
        "message": message,
        "compiled": target,
    }


def record_of(check: dict[str, Any]) -> dict[str, Any]:
    """What a run's summary keeps of :func:`prove_compile` (its numbers, not the module)."""
    return {k: v for k, v in check.items() if k not in ("compiled", "message", "passed")}


def require_compile(check: dict[str, Any]) -> None:
    """Raise when ``training.compile`` was asked for explicitly and its check failed.

    Raises:
        CheckFailed: naming the numbers and the key.
    """
    if not check["passed"]:
        raise CheckFailed(f"training.compile: {check['message']}", hint="set training.compile: false")
