"""Size one complete training step (PROTOCOL.md step 5, CASES C8).

"A model that fits while loading can overflow during this step." Reading memory between steps
shows the weights (about 4 bytes per fp32 parameter); the step itself also holds gradients,
optimizer states and activations. This module gives

* :func:`memory_between_steps` -- bytes held by parameters, gradients and optimizer state now;
* :func:`estimate_step_memory` -- a stated breakdown of one step's memory before running it;
* :func:`measure_step_peak` -- the measured peak of one whole step (forward, loss, backward,
  ``optimizer.step()``), counters reset first;
* :func:`find_max_micro_batch` -- the largest micro-batch whose measured peak fits a budget.

Sizes are bytes; ``*_gib`` fields are GiB (2**30 bytes).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import threading
import time
from typing import Any, Callable

import torch
from torch import nn

from tuneproof.errors import TuneproofError

GIB = 1 << 30
BYTES_PER_ELEMENT = {"fp32": 4, "bf16": 2, "fp16": 2}
#: Optimizer state tensors per trainable element (torch.optim: AdamW/Adam keep exp_avg and
#: exp_avg_sq; SGD with momentum keeps momentum_buffer), each in the parameter's dtype.
OPTIMIZER_STATES = {"adamw": 2, "adam": 2, "sgd": 0, "sgd-momentum": 1}
ACTIVATION_SOURCE = (
    "Korthikanti et al. 2022, 'Reducing Activation Recomputation in Large Transformer Models' "
    "(arXiv:2205.05198), sec. 4.1: activations per layer = s*b*h*(34 + 5*a*s/h) bytes for 16-bit "
    "activations (attention 11sbh + 5as^2b, MLP 19sbh, layer norms 4sbh); checkpointing keeps 2sbh per layer"
)


#: Activation elements kept per token per layer by a Llama-style block: ``GATED_H*h + GATED_I*i``.
GATED_H, GATED_I = 15, 4
GATED_ACTIVATION_SOURCE = (
    "counted for transformers' LlamaDecoderLayer under autograd (issue 15): MLP gate, up, silu(gate) and their "
    "product saved for backward (4i); attention: two RMSNorm inputs and outputs, q/k/v, their RoPE outputs, "
    "k/v repeated to all heads for SDPA, SDPA output and its transposed copy, residuals (about 15h); measured "
    "on CPU fp32 (SDPA, LoRA r16 on q/k/v/o; 8 layers h 256 i 688, 1024 and 2048 tokens): 26 KiB per token per layer, "
    "(15h + 4i) x 4 bytes = 25.8 KiB"
)


def _gated_mlp(model: nn.Module) -> bool:
    """Whether the decoder blocks use a gated MLP (a module with ``gate_proj`` and ``up_proj``: Llama, Mistral, Qwen2/3, Gemma)."""
    for module in model.modules():
        if hasattr(module, "gate_proj") and hasattr(module, "up_proj"):
            return True
    return False


# --------------------------------------------------------------------------- between steps
def memory_between_steps(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, Any]:
    """Bytes held right now by parameters, their ``.grad`` and the optimizer state (tensor storage).

    Computed from tensor sizes (``numel * element_size``), the same on CPU and GPU; on CUDA
    ``torch.cuda.memory_allocated`` is added for comparison. CASES C8: a freshly loaded fp32
    model reads ``bytes_per_parameter == 4``.

    Returns:
        ``{"passed": True (a reading, not a check), "parameters", "parameter_bytes", "bytes_per_parameter",
        "gradient_bytes", "optimizer_state_bytes", "total_bytes", "total_gib", "cuda_allocated_bytes"}``.
    """
    n = pbytes = gbytes = 0
    for p in model.parameters():
        n += p.numel()
        pbytes += p.numel() * p.element_size()
        if p.grad is not None:
            gbytes += p.grad.numel() * p.grad.element_size()
    obytes = 0
    if optimizer is not None:
        for state in optimizer.state.values():
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    obytes += v.numel() * v.element_size()
    total = pbytes + gbytes + obytes
    cuda = None
    p0 = next(model.parameters(), None)
    if p0 is not None and p0.device.type == "cuda":
        cuda = int(torch.cuda.memory_allocated(p0.device))
    return {
        "passed": True,
        "parameters": n,
        "parameter_bytes": pbytes,
        "bytes_per_parameter": pbytes / n if n else 0.0,
        "gradient_bytes": gbytes,
        "optimizer_state_bytes": obytes,
        "total_bytes": total,
        "total_gib": total / GIB,
        "cuda_allocated_bytes": cuda,
    }


# --------------------------------------------------------------------------- estimate
def _cfg(config: Any, *names: str) -> int | None:
    for name in names:
        v = getattr(config, name, None)
        if isinstance(v, int):
            return v
    return None


def estimate_step_memory(
    model: nn.Module,
    micro_batch: int,
    seq_len: int,
    precision: str,
    optimizer: str = "adamw",
    *,
    activation_checkpointing: bool = False,
    attention_scores_stored: bool | None = None,
    trainable_dtype: str | None = None,
    weights_dtype: str | None = None,
    budget_bytes: int | None = None,
) -> dict[str, Any]:
    """Estimate the memory of one training step (bytes), part by part.

    Parts (``e`` = bytes per element of ``precision``, the compute/activation dtype; ``ew`` = of
    ``weights_dtype``; ``et`` = of ``trainable_dtype``):

    * weights: frozen elements * ``ew`` + trainable elements * ``et``;
    * autocast weight copies: when weights are stored wider than they are computed in
      (``weights_dtype="fp32"``, ``precision="bf16"``: mixed precision with ``torch.autocast``),
      autocast caches a ``precision`` copy of each weight it casts: all elements * ``e`` (an upper
      bound: norms and embeddings are not cast);
    * gradients: trainable elements * ``et`` (only trained tensors get a ``.grad``);
    * optimizer states: ``OPTIMIZER_STATES[optimizer]`` * trainable * ``et``; torch's AdamW keeps
      ``exp_avg`` and ``exp_avg_sq`` in the parameter's dtype: 2 * 4 bytes per fp32 element;
    * optimizer step temporary: 1 * trainable * ``et`` for AdamW/Adam (the foreach implementation
      materialises ``sqrt(exp_avg_sq)``), 0 otherwise;
    * activations, per layer, after Korthikanti et al. 2022 (see :data:`ACTIVATION_SOURCE`):
      ``s*b*h*(15 + 19*i/(4h)) + 5*a*s^2*b`` in 16-bit units, scaled by ``e/2`` (``i``: MLP
      intermediate size; for ``i = 4h`` this is the paper's ``34sbh + 5as^2b``). The ``5as^2b``
      attention-score term is dropped when the scores are not stored (SDPA / flash kernels); with
      activation checkpointing each layer keeps its input (``2sbh`` scaled) and one layer is
      recomputed at a time. LoRA does not reduce this term: the frozen base is still backpropagated
      through. The formula is for GPT-style blocks; treat it as a rough guide for other shapes;
      Llama-style blocks (a gated MLP: ``gate_proj``/``up_proj``, RoPE, grouped KV heads) keep more:
      ``GATED_H*h + GATED_I*i`` elements per token per layer (:data:`GATED_ACTIVATION_SOURCE`);
    * logits (models with an output embedding, i.e. causal LMs): ``s*b*V`` elements held as logits
      (``e``), their fp32 copy in ``token_loss_sum`` (4, only when ``e != 4``), and at the peak of the
      backward pass (inside the log-softmax backward) three fp32 buffers more: the saved log-softmax
      (4), its incoming gradient (4) and the gradient it produces (4).

    ``total_bytes`` is the sum of all parts, as if all were live at once: a planning bound (the
    true peak lies between the largest part and this sum; at the first step the optimizer states
    are created after activations are freed). Measure with :func:`measure_step_peak`.

    Args:
        model: the model (parameters may sit on the ``meta`` device); its ``config`` must give
            ``hidden_size``, ``num_hidden_layers``, ``num_attention_heads`` (and ``vocab_size`` /
            ``intermediate_size`` when present).
        micro_batch: examples per forward/backward pass (``b``).
        seq_len: tokens per example (``s``), the representative padded length.
        precision: ``"fp32"``, ``"bf16"`` or ``"fp16"`` (resolve ``auto`` with ``backend.choose_dtype``).
        optimizer: one of :data:`OPTIMIZER_STATES`.
        activation_checkpointing: count checkpointed activations.
        attention_scores_stored: None: inferred from ``config._attn_implementation`` (``eager`` stores them).
        trainable_dtype: dtype of trained tensors when it differs (e.g. ``"fp32"`` for PEFT adapters,
            which PEFT keeps in fp32 by default, ``autocast_adapter_dtype=True``); default ``weights_dtype``.
        weights_dtype: dtype the weights are stored in; default ``precision`` (weights loaded in the
            compute dtype). ``"fp32"`` with ``precision="bf16"`` describes autocast mixed precision.
        budget_bytes: when given, ``passed`` is ``total_bytes <= budget_bytes``.

    Returns:
        ``{"passed", "message", "precision", "optimizer", "micro_batch", "seq_len", "parameters",
        "trainable_parameters", "bytes_per_weight", "weights_bytes", "weights_dtype", "trainable_dtype",
        "autocast_weight_copies_bytes", "gradients_bytes",
        "optimizer_states_bytes", "optimizer_states_count", "optimizer_step_temporary_bytes",
        "activations_bytes", "logits_bytes", "total_bytes", "total_gib", "budget_bytes",
        "activation_checkpointing", "attention_scores_stored", "formula", "source"}``.

    Raises:
        TuneproofError: unknown precision or optimizer, or a config without the needed sizes.
    """
    if precision not in BYTES_PER_ELEMENT:
        raise TuneproofError(
            f"estimate_step_memory: precision {precision!r} is not one of {', '.join(BYTES_PER_ELEMENT)}",
            hint="resolve 'auto' with tuneproof.preflight.backend.choose_dtype first",
        )
    if optimizer not in OPTIMIZER_STATES:
        raise TuneproofError(f"estimate_step_memory: optimizer {optimizer!r} is not one of {', '.join(OPTIMIZER_STATES)}")
    wdtype = weights_dtype or precision
    tdtype = trainable_dtype or wdtype
    for key, value in (("weights_dtype", wdtype), ("trainable_dtype", tdtype)):
        if value not in BYTES_PER_ELEMENT:
            raise TuneproofError(f"estimate_step_memory: {key} {value!r} is not one of {', '.join(BYTES_PER_ELEMENT)}")
    e, ew, et = BYTES_PER_ELEMENT[precision], BYTES_PER_ELEMENT[wdtype], BYTES_PER_ELEMENT[tdtype]
    total_n = trainable_n = 0
    for p in model.parameters():
        total_n += p.numel()
        if p.requires_grad:
            trainable_n += p.numel()
    weights = (total_n - trainable_n) * ew + trainable_n * et
    autocast_copies = total_n * e if ew != e else 0
    grads = trainable_n * et
    n_states = OPTIMIZER_STATES[optimizer]
    states = n_states * trainable_n * et
    temp = trainable_n * et if optimizer in ("adam", "adamw") else 0

    config = getattr(model, "config", None)
    h = _cfg(config, "hidden_size", "n_embd", "d_model")
    layers = _cfg(config, "num_hidden_layers", "n_layer", "num_layers")
    heads = _cfg(config, "num_attention_heads", "n_head", "num_heads")
    if h is None or layers is None or heads is None:
        raise TuneproofError(
            f"estimate_step_memory: {type(model).__name__}.config lacks hidden_size/num_hidden_layers/num_attention_heads",
            hint="the activation estimate needs them; pass a transformers model",
        )
    inter = _cfg(config, "intermediate_size", "n_inner") or 4 * h
    vocab = _cfg(config, "vocab_size") or 0
    if attention_scores_stored is None:
        attention_scores_stored = getattr(config, "_attn_implementation", "eager") in (None, "eager")
    s, b = seq_len, micro_batch
    scale = e / 2.0
    gated = _gated_mlp(model)
    if gated:  # Llama-style block (SwiGLU, RoPE, grouped KV): see GATED_ACTIVATION_SOURCE
        per_layer_units = 2 * s * b * (GATED_H * h + GATED_I * inter) + (5 * heads * s * s * b if attention_scores_stored else 0)
    else:
        per_layer_units = s * b * h * (15 + 19 * inter / (4 * h)) + (5 * heads * s * s * b if attention_scores_stored else 0)
    if activation_checkpointing:
        activations = int(scale * (layers * 2 * s * b * h + per_layer_units))
    else:
        activations = int(scale * layers * per_layer_units)
    try:
        has_lm_head = model.get_output_embeddings() is not None  # type: ignore[operator]
    except (AttributeError, NotImplementedError, TypeError):
        has_lm_head = False
    logits = s * b * vocab * (e + (4 if e != 4 else 0) + 4 + 4 + 4) if has_lm_head and vocab else 0
    total = weights + autocast_copies + grads + states + temp + activations + logits
    passed = budget_bytes is None or total <= budget_bytes
    parts = (
        f"weights {weights / GIB:.3f} + autocast copies {autocast_copies / GIB:.3f} + grads {grads / GIB:.3f} + {n_states} optimizer states {states / GIB:.3f} + "
        f"step temp {temp / GIB:.3f} + activations {activations / GIB:.3f} + logits {logits / GIB:.3f} = {total / GIB:.3f} GiB"
    )
    message = parts if budget_bytes is None else (
        f"{parts} {'fits' if passed else 'exceeds'} the budget {budget_bytes / GIB:.3f} GiB"
        + ("" if passed else "; lower training.micro_batch_size, raise gradient_accumulation_steps, or enable activation_checkpointing")
    )
    return {
        "passed": passed,
        "message": message,
        "precision": precision,
        "optimizer": optimizer,
        "micro_batch": micro_batch,
        "seq_len": seq_len,
        "parameters": total_n,
        "trainable_parameters": trainable_n,
        "bytes_per_weight": ew,
        "weights_bytes": weights,
        "weights_dtype": wdtype,
        "trainable_dtype": tdtype,
        "autocast_weight_copies_bytes": autocast_copies,
        "gradients_bytes": grads,
        "optimizer_states_bytes": states,
        "optimizer_states_count": n_states,
        "optimizer_step_temporary_bytes": temp,
        "activations_bytes": activations,
        "logits_bytes": logits,
        "total_bytes": total,
        "total_gib": total / GIB,
        "budget_bytes": budget_bytes,
        "activation_checkpointing": activation_checkpointing,
        "attention_scores_stored": attention_scores_stored,
        "formula": "per layer (16-bit units) s*b*h*(15 + 19*i/(4h)) + 5*a*s^2*b, times e/2; checkpointed: 2sbh per layer + one layer",
        "source": ACTIVATION_SOURCE,
    }


# --------------------------------------------------------------------------- measurement
def _proc_status() -> dict[str, int]:
    out = {}
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    key, value = line.split(":", 1)
                    out[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out


def _rss_bytes() -> int | None:
    st = _proc_status()
    if "VmRSS" in st:
        return st["VmRSS"]
    try:
        import psutil  # optional

        return int(psutil.Process().memory_info().rss)
    except Exception:
        return None


def _reset_rss_peak() -> bool:
    """Reset the kernel's peak-RSS counter (VmHWM) of this process: ``echo 5 > /proc/self/clear_refs`` (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


@functools.lru_cache(maxsize=1)
def _libc() -> Any:
    name = ctypes.util.find_library("c")  # runs ldconfig once; cached
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def _release_freed_memory() -> None:
    gc.collect()
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)  # glibc: give freed heap pages back so RSS reflects live memory


class _Sampler(threading.Thread):
    def __init__(self, interval_s: float = 0.001):
        super().__init__(daemon=True)
        self.interval_s, self.peak, self._stop_event = interval_s, _rss_bytes() or 0, threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.peak = max(self.peak, _rss_bytes() or 0)
            time.sleep(self.interval_s)

    def stop(self) -> int:
        self._stop_event.set()
        self.join()
        return max(self.peak, _rss_bytes() or 0)


def _device_of(device: Any) -> torch.device:
    if isinstance(device, torch.device):
        return device
    kind = getattr(device, "type", device)  # a DeviceInfo or a string
    if isinstance(kind, str) and kind.startswith(("cuda", "rocm")):
        return torch.device(kind.replace("rocm", "cuda"))
    return torch.device("cpu")


def measure_step_peak(step_fn: Callable[[], Any], device: Any = "cpu") -> dict[str, Any]:
    """Run ``step_fn()`` once in this process and measure its memory peak.

    ``step_fn`` should be one whole step (forward, loss, backward, ``optimizer.step()``).

    What is measured:

    * CUDA/ROCm: ``torch.cuda.reset_peak_memory_stats`` before, then ``max_memory_allocated`` (bytes
      held by tensors, the peak over the whole step, weights included) and
      ``max_memory_reserved`` (the caching allocator's reserve); ``baseline_bytes`` is
      ``memory_allocated`` before the step.
    * CPU (Linux): the process's resident set. Freed heap is returned first (``gc.collect``,
      glibc ``malloc_trim``), ``baseline_bytes`` is VmRSS, the kernel's peak counter is reset
      (``/proc/self/clear_refs``), and ``peak_bytes`` is VmHWM after the step: an exact kernel
      high-water mark, but of the whole process (interpreter, libraries, any other thread), so
      ``step_peak_bytes = peak - baseline`` is the number to read, and pages the allocator kept
      from earlier work can make it smaller than the tensors allocated. Where ``clear_refs`` is
      not writable, RSS is sampled every 1 ms by a thread (``approximate`` is True).
      Running the step in a forked child was rejected: a child forked after OpenMP has started
      deadlocks in torch's CPU kernels, and a spawned child must reload the model.

    The step's effects (updated weights, optimizer state) stay; snapshot first if needed.

    Args:
        step_fn: callable without arguments.
        device: ``"cpu"``, ``"cuda"``, a ``torch.device`` or a ``backend.DeviceInfo``.

    Returns:
        ``{"passed": True (a measurement; the budget is judged by the caller), "device", "method",
        "baseline_bytes", "peak_bytes", "step_peak_bytes", "after_bytes", "reserved_peak_bytes"
        (CUDA, else None), "seconds", "approximate"}``.

    Raises:
        Whatever ``step_fn`` raises (e.g. ``torch.OutOfMemoryError``), after the sampler is stopped.
    """
    dev = _device_of(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        gc.collect()
        torch.cuda.empty_cache()
        baseline = int(torch.cuda.memory_allocated(dev))
        torch.cuda.reset_peak_memory_stats(dev)
        t0 = time.perf_counter()
        step_fn()
        torch.cuda.synchronize(dev)
        seconds = time.perf_counter() - t0
        peak = int(torch.cuda.max_memory_allocated(dev))
        return {
            "passed": True,
            "device": str(dev),
            "method": "torch.cuda.max_memory_allocated after reset_peak_memory_stats (tensor bytes, whole step)",
            "baseline_bytes": baseline,
            "peak_bytes": peak,
            "step_peak_bytes": peak - baseline,
            "after_bytes": int(torch.cuda.memory_allocated(dev)),
            "reserved_peak_bytes": int(torch.cuda.max_memory_reserved(dev)),
            "seconds": seconds,
            "approximate": False,
        }
    _release_freed_memory()
    baseline = _rss_bytes()
    exact = _reset_rss_peak() and "VmHWM" in _proc_status()
    sampler = None if exact else _Sampler()
    if sampler is not None:
        sampler.start()
    t0 = time.perf_counter()
    try:
        step_fn()
    finally:
        seconds = time.perf_counter() - t0
        sampled = sampler.stop() if sampler is not None else None
    peak = _proc_status().get("VmHWM") if exact else sampled
    after = _rss_bytes()
    return {
        "passed": True,
        "device": "cpu",
        "method": (
            "process VmHWM after resetting it via /proc/self/clear_refs (resident bytes, whole process)"
            if exact
            else "process RSS sampled every 1 ms (approximate)"
        ),
        "baseline_bytes": baseline,
        "peak_bytes": peak,
        "step_peak_bytes": (peak - baseline) if (peak is not None and baseline is not None) else None,
        "after_bytes": after,
        "reserved_peak_bytes": None,
        "seconds": seconds,
        "approximate": not exact,
    }


def side_by_side(estimate: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any]:
    """The measured peak next to the estimate's breakdown (CASES C8), for the preflight report.

    Returns:
        ``{"rows": [[part, bytes]...], "estimate_total_bytes", "measured_peak_bytes",
        "measured_step_peak_bytes", "measured_over_estimate", "device", "method", "note"}``.
        ``measured_over_estimate`` uses ``peak_bytes`` on CUDA (weights included in both) and is
        None on CPU, whose peak includes the interpreter.
    """
    parts = ("weights_bytes", "autocast_weight_copies_bytes", "gradients_bytes", "optimizer_states_bytes", "optimizer_step_temporary_bytes", "activations_bytes", "logits_bytes")
    rows = [[p.removesuffix("_bytes"), int(estimate[p])] for p in parts]
    cuda = str(measured.get("device", "")).startswith("cuda")
    peak = measured.get("peak_bytes")
    ratio = (peak / estimate["total_bytes"]) if (cuda and peak and estimate.get("total_bytes")) else None
    return {
        "rows": rows,
        "estimate_total_bytes": int(estimate["total_bytes"]),
        "measured_peak_bytes": peak,
        "measured_step_peak_bytes": measured.get("step_peak_bytes"),
        "measured_over_estimate": ratio,
        "device": measured.get("device"),
        "method": measured.get("method"),
        "note": (
            "estimate total = sum of parts (all live at once); measured = peak of one whole step"
            + ("" if cuda else "; CPU peak is the process RSS, compare step_peak_bytes with the parts created in the step")
        ),
    }


# --------------------------------------------------------------------------- search
def _is_oom(err: BaseException) -> bool:
    oom_types = tuple(t for t in (getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None)) if t)
    if isinstance(err, MemoryError) or (oom_types and isinstance(err, oom_types)):
        return True
    return isinstance(err, RuntimeError) and "out of memory" in str(err).lower()


def find_max_micro_batch(
    try_fn: Callable[[int], Any], budget_bytes: int, start: int = 1, limit: int = 1024
) -> dict[str, Any]:
    """Largest micro-batch in ``[start, limit]`` whose measured peak fits ``budget_bytes``.

    Doubles from ``start`` until a try exceeds the budget or runs out of memory, then bisects
    between the last fit and the first miss. Assumes the peak grows with the micro-batch.

    Args:
        try_fn: ``micro_batch -> peak bytes`` (an int, or a :func:`measure_step_peak` dict whose
            ``peak_bytes`` is used); an out-of-memory error (``torch.OutOfMemoryError``,
            ``MemoryError``, ``RuntimeError`` "out of memory") counts as a miss; other errors propagate.
        budget_bytes: the memory allowed for one step, bytes.
        start, limit: smallest and largest micro-batch to try.

    Returns:
        ``{"passed": a micro-batch fits, "message", "max_micro_batch" (0 when none fits),
        "peak_bytes" (of that micro-batch), "budget_bytes", "limit", "tries": [{"micro_batch",
        "peak_bytes", "fits", "oom"}]}``.
    """
    if start < 1 or limit < start:
        raise TuneproofError(f"find_max_micro_batch: need 1 <= start <= limit, got start={start}, limit={limit}")
    tries: list[dict[str, Any]] = []
    peaks: dict[int, int | None] = {}

    def fits(mb: int) -> bool:
        oom = False
        try:
            out = try_fn(mb)
            peak = int(out["peak_bytes"] if isinstance(out, dict) else out)
        except Exception as err:  # noqa: BLE001 - only out-of-memory is swallowed
            if not _is_oom(err):
                raise
            oom, peak = True, None
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        ok = (not oom) and peak is not None and peak <= budget_bytes
        peaks[mb] = peak
        tries.append({"micro_batch": mb, "peak_bytes": peak, "fits": ok, "oom": oom})
        return ok

    good, bad, mb = 0, None, start
    while mb <= limit:
        if fits(mb):
            good, mb = mb, mb * 2
        else:
            bad = mb
            break
    if good == 0:
        return {
            "passed": False,
            "message": f"micro-batch {start} does not fit in {budget_bytes / GIB:.3f} GiB"
            + (" (out of memory)" if tries and tries[0]["oom"] else f" (peak {tries[0]['peak_bytes'] / GIB:.3f} GiB)"),
            "max_micro_batch": 0,
            "peak_bytes": None,
            "budget_bytes": budget_bytes,
            "limit": limit,
            "tries": tries,
        }
    if bad is None:
        bad = limit + 1
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return {
        "passed": True,
        "message": f"largest micro-batch that fits {budget_bytes / GIB:.3f} GiB: {good} (peak {peaks[good] / GIB:.3f} GiB, {len(tries)} tries)",
        "max_micro_batch": good,
        "peak_bytes": peaks[good],
        "budget_bytes": budget_bytes,
        "limit": limit,
        "tries": tries,
    }


__all__ = [
    "ACTIVATION_SOURCE",
    "BYTES_PER_ELEMENT",
    "OPTIMIZER_STATES",
    "estimate_step_memory",
    "find_max_micro_batch",
    "measure_step_peak",
    "memory_between_steps",
    "side_by_side",
]
