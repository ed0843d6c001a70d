"""Measure the memory peak of one step in this process (docs/CASES.md C8): CUDA's peak counters, or on a CPU
the process's resident set (kernel high-water mark) and the bytes torch's CPU allocator hands out.

Used by the training loop's bf16-base check (:mod:`tuneproof.training.speedups`) and by the
preflight's step-memory, activation-checkpointing and evaluation-memory checks, which compare it
with :func:`tuneproof.preflight.memory.estimate_step_memory`. Sizes are bytes.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import gc
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import torch


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
        import psutil  # noqa: PLC0415 (optional dependency)

        return int(psutil.Process().memory_info().rss)
    except Exception:  # noqa: BLE001 (psutil missing or failing: no reading)
        return None


def _reset_rss_peak() -> bool:
    """Reset the kernel's peak-RSS counter (VmHWM) of this process: ``echo 5 > /proc/self/clear_refs`` (Linux >=
    4.0)."""
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


ALLOCATED_METHOD = (
    "torch.profiler(profile_memory=True): running sum of the CPU allocator's allocation and free events during the "
    "step (c10 ProfiledCPUMemoryReporter), its maximum = bytes the step's tensors and kernel workspaces held at once "
    "beyond what existed before (the CPU counterpart of torch.cuda.max_memory_allocated - memory_allocated)"
)


def allocated_step_peak(step_fn: Callable[[], Any]) -> dict[str, Any]:
    """Run ``step_fn()`` once and count the bytes torch's CPU allocator hands out during it.

    Every CPU tensor storage (and every workspace a kernel takes through ``c10::alloc_cpu``) is
    allocated by c10's CPU allocator, which reports each allocation and each free to the profiler
    when ``torch.profiler.profile(profile_memory=True)`` is active (the ``[memory]`` events; the
    profiler's memory timeline is built from them:
    https://pytorch.org/docs/stable/profiler.html#torch.profiler._KinetoProfile.export_memory_timeline).
    Sorted by time, their running sum is the step's allocated bytes over those held before; its
    maximum is ``peak_bytes``. Unlike the resident set it does not depend on what glibc's malloc
    keeps or returns (freed pages kept from earlier work, the moving mmap threshold, other
    threads' arenas) nor on earlier steps in the same process: the same step gives the same number.
    Not counted: memory libraries take outside c10 (oneDNN/MKL scratch, OpenMP stacks, Python
    objects), and frees of blocks allocated before the step (the peak is then an upper bound).

    Returns:
        ``{"peak_bytes", "end_bytes" (net change after the step), "events", "method", "seconds"}``;
        ``peak_bytes`` is None when the profiler could not start (another profiler is active), the
        step having run anyway.
    """
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415 - torch.profiler loads only when allocated_step_peak() runs

    # kineto prints "STAGE"/"USDT" lines on stderr at every profiler start and stop; its logger's minimum
    # severity (read when kineto starts) 6 is above its last level (USDT = 5): silent. A value the user set is kept.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    prof = None
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        try:
            prof = stack.enter_context(profile(activities=[ProfilerActivity.CPU], profile_memory=True))
        except (RuntimeError, AssertionError):  # a profiler already runs in this thread
            prof = None
        t0 = time.perf_counter()
        step_fn()
        seconds = time.perf_counter() - t0
    results = getattr(getattr(prof, "profiler", None), "kineto_results", None) if prof is not None else None
    if results is None:
        return {"peak_bytes": None, "end_bytes": None, "events": 0, "method": None, "seconds": seconds}
    cpu = torch.autograd.DeviceType.CPU
    events = sorted(
        (e.start_ns(), k, int(e.nbytes()))
        for k, e in enumerate(results.events())
        if e.name() == "[memory]" and e.device_type() == cpu
    )
    running = peak = 0
    for _, _, nbytes in events:
        running += nbytes
        peak = max(peak, running)
    return {
        "peak_bytes": peak,
        "end_bytes": running,
        "events": len(events),
        "method": ALLOCATED_METHOD,
        "seconds": seconds,
    }


def _device_of(device: Any) -> torch.device:
    if isinstance(device, torch.device):
        return device
    kind = getattr(device, "type", device)  # a DeviceInfo or a string
    if isinstance(kind, str) and kind.startswith(("cuda", "rocm")):
        return torch.device(kind.replace("rocm", "cuda"))
    return torch.device("cpu")


def measure_step_peak(step_fn: Callable[[], Any], device: Any = "cpu", *, allocations: bool = True) -> dict[str, Any]:
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
    * CPU, with ``allocations`` (default): the bytes torch's CPU allocator holds for the step at its
      peak, over those held before (:func:`allocated_step_peak`): ``allocated_step_peak_bytes``.
      This is what the step's tensors need, the quantity
      :func:`~tuneproof.preflight.memory.estimate_step_memory` models, and unlike the resident set it
      is the same to the byte in a fresh process, after other steps and at the first step. The resident-set increment
      adds what glibc's malloc does with the freed blocks: 1.13-1.29 x the tensor bytes on a random 2-layer Llama,
      varying by up to 0.1 from run to run and with what ran before; 1.00-1.02 x with a fixed mmap threshold
      (``MALLOC_MMAP_THRESHOLD_=65536``: every block of 64 KiB or more mapped alone and returned at
      its free; by default glibc raises the threshold up to 32 MiB after the first large free and
      serves such blocks from its heaps, mallopt(3)); docs/benchmarks-preflight.md. The resident
      set stays the budget's measure on a CPU (what the kernel kills a process for). On CUDA
      ``allocated_step_peak_bytes`` is ``step_peak_bytes``.

    The step's effects (updated weights, optimizer state) stay; snapshot first if needed.

    Args:
        step_fn: callable without arguments.
        device: ``"cpu"``, ``"cuda"``, a ``torch.device`` or a ``backend.DeviceInfo``.

    Returns:
        ``{"passed": True (a measurement; the budget is judged by the caller), "device", "method",
        "baseline_bytes", "peak_bytes", "step_peak_bytes", "after_bytes", "reserved_peak_bytes"
        (CUDA, else None), "allocated_step_peak_bytes" (None on CPU without ``allocations`` or when
        the profiler could not start), "allocated_method", "seconds", "approximate"}``.

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
            "allocated_step_peak_bytes": peak - baseline,
            "allocated_method": "torch.cuda.max_memory_allocated - memory_allocated before the step",
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
    alloc: dict[str, Any] = {}
    try:
        if allocations:
            alloc = allocated_step_peak(step_fn)
        else:
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
        "allocated_step_peak_bytes": alloc.get("peak_bytes"),
        "allocated_method": alloc.get("method"),
        "seconds": alloc.get("seconds", seconds),
        "approximate": not exact,
    }
