"""The compute device and the compute dtype chosen for it (docs/CASES.md C9).

Precision rules (:func:`choose_dtype`, docs/CASES.md C9):

* CUDA: bf16 is native from compute capability 8.0 (Ampere) on. On 7.x (V100, T4) torch can
  *emulate* bf16 and ``torch.cuda.is_bf16_supported()`` returns True by default
  (``including_emulation=True``), which is why the capability, not that call, decides here.
  Source: NVIDIA CUDA C++ Programming Guide, "bfloat16 ... compute capability 8.0 and higher";
  ``torch.cuda.is_bf16_supported(including_emulation=False)``.
* ROCm: native bf16 matrix instructions on CDNA gfx908 (MI100) and later (gfx90a, gfx94x, gfx95x)
  and RDNA3/4 (gfx11xx, gfx12xx); not on gfx906/gfx900/RDNA2. Source: AMD ROCm documentation,
  "Data types and precision support". ``torch.cuda.is_bf16_supported()`` returns True on every
  ROCm device, so the architecture name decides.
* CPU: fp32 for ``auto`` (CPU runs are smoke tests and references). ``bf16`` explicitly
  requested is allowed: torch runs every op in bf16 on CPU, natively with AVX512-BF16/AMX,
  otherwise through fp32 conversion (correct but slower than fp32); the reason says which.
  ``fp16`` on CPU is refused: fp16 training needs loss scaling and several CPU kernels are
  missing or slow; use fp32 or bf16.
* ``auto``: bf16 where native, else fp32 (the study file's documented meaning of ``auto``;
  fp16 is never chosen silently because it changes the run: loss scaling, overflow).
* ``fp16`` on a GPU: allowed; the reason records that a gradient scaler is required.
* ``training.bf16_base_weights`` (frozen base weights stored in bf16, tests/training/test_bf16_base.py): only where bf16
  is native by the rules above (a CPU that emulates bf16 would convert every weight on every use)
  and only with bf16 compute (``training.precision: bf16``, or ``auto`` where it resolves to bf16):
  under fp32 compute a bf16 weight meets fp32 activations, under fp16 autocast it would be
  rounded again to fp16's narrower range. Refused otherwise, naming the key (:func:`bf16_base_rule`).
"""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass
from typing import Any

from tuneproof.errors import TuneproofError

PRECISIONS = ("auto", "fp32", "bf16", "fp16")

#: ROCm architectures (gcnArchName prefix) with native bf16 matrix instructions.
ROCM_BF16_ARCHS = ("gfx908", "gfx90a", "gfx940", "gfx941", "gfx942", "gfx950", "gfx11", "gfx12")


@dataclass(frozen=True)
class DeviceInfo:
    """The compute device as the dtype and extension checks see it.

    Attributes:
        type: ``"cpu"``, ``"cuda"`` (NVIDIA) or ``"rocm"`` (AMD through HIP).
        name: device name, e.g. ``"Tesla T4"`` or the CPU model.
        capability: CUDA compute capability ``(major, minor)``; ROCm: what torch reports; CPU: None.
        bf16_supported: bf16 runs natively, without emulation.
        arch: ROCm ``gcnArchName`` (e.g. ``"gfx90a:sramecc+:xnack-"``), else None.
        total_memory_bytes: device memory in bytes (GPU) or None.
    """

    type: str
    name: str
    capability: tuple[int, int] | None = None
    bf16_supported: bool = False
    arch: str | None = None
    total_memory_bytes: int | None = None

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["capability"] = list(self.capability) if self.capability else None
        return d


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (else :func:`platform.processor` or the machine type)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_bf16_native() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool({"avx512_bf16", "amx_bf16"} & flags)
    except OSError:
        pass
    return False


def detect_device(index: int = 0) -> DeviceInfo:
    """The device torch will use: GPU ``index`` when one is visible, else the CPU."""
    import torch  # noqa: PLC0415 - torch loads only when detect_device() runs

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(index)
        cap = tuple(torch.cuda.get_device_capability(index))
        if getattr(torch.version, "hip", None):
            arch = getattr(props, "gcnArchName", None) or ""
            return DeviceInfo(
                "rocm", props.name, cap, arch.startswith(ROCM_BF16_ARCHS), arch or None, int(props.total_memory)
            )
        try:
            native = bool(torch.cuda.is_bf16_supported(including_emulation=False))
        except TypeError:  # torch < 2.3 has no including_emulation
            native = cap >= (8, 0)
        return DeviceInfo("cuda", props.name, cap, native, None, int(props.total_memory))
    return DeviceInfo("cpu", cpu_model(), None, _cpu_bf16_native())


def _bf16_native(device: DeviceInfo) -> tuple[bool, str]:
    if device.type == "cuda":
        if device.capability is not None:
            cap = f"{device.capability[0]}.{device.capability[1]}"
            if tuple(device.capability) >= (8, 0):
                return True, f"{device.name} has compute capability {cap} >= 8.0: native bf16"
            return (
                False,
                f"{device.name} has compute capability {cap} < 8.0: bf16 is only emulated there (slow, not native)",
            )
        return (
            device.bf16_supported,
            f"{device.name}: bf16 {'native' if device.bf16_supported else 'not native'} (capability unknown)",
        )
    if device.type == "rocm":
        arch = device.arch or "unknown arch"
        native = device.bf16_supported or bool(device.arch and device.arch.startswith(ROCM_BF16_ARCHS))
        return (
            native,
            f"{device.name} ({arch}): bf16 "
            f"{'native' if native else 'not native (needs gfx908/MI100 or later, or RDNA3)'}",
        )
    native = device.bf16_supported
    return (
        native,
        f"CPU {device.name}: bf16 "
        f"{'native (AVX512-BF16/AMX)' if native else 'emulated through fp32 (no AVX512-BF16/AMX), slower than fp32'}",
    )


BF16_BASE_KEY = "training.bf16_base_weights"


def bf16_base_rule(dtype: str | None, device: DeviceInfo) -> tuple[bool, str]:
    """Whether frozen base weights may be held in bf16 (``training.bf16_base_weights``) with the
    resolved compute ``dtype`` on ``device``: bf16 native there (:func:`_bf16_native`, the same rule
    as ``auto``) and bf16 compute. Returns ``(allowed, why)``; ``why`` names the key and what to set."""
    native, why = _bf16_native(device)
    if not native:
        return False, (
            f"{BF16_BASE_KEY}: bf16 is not native here ({why}); frozen weights held in bf16 would be converted "
            "on every use; set training.bf16_base_weights: false, or run on a device with native bf16"
        )
    if dtype != "bf16":
        return False, (
            f"{BF16_BASE_KEY}: the compute dtype is {dtype} (training.precision resolved to it), and bf16 frozen "
            "weights need bf16 compute under autocast; set training.precision: "
            "bf16, or training.bf16_base_weights: false"
        )
    return True, f"{BF16_BASE_KEY}: frozen base weights in bf16 ({why})"


def choose_dtype(requested: str, device: DeviceInfo, *, bf16_base_weights: bool = False) -> dict[str, Any]:
    """Decide the compute dtype for ``requested`` precision on ``device`` (rules in the module doc).

    Args:
        requested: ``"auto"``, ``"fp32"``, ``"bf16"`` or ``"fp16"`` (``training.precision``).
        device: from :func:`detect_device`, or built by hand to check another machine (tests inject
            ``DeviceInfo("cuda", "Tesla T4", (7, 5))``).
        bf16_base_weights: ``training.bf16_base_weights``; refused where :func:`bf16_base_rule` says so.

    Returns:
        ``{"requested", "dtype": "fp32"|"bf16"|"fp16"|None, "reason", "passed", "message", "device",
        "base_weights": "fp32"|"bf16", "hint"}``; ``dtype`` is None and ``passed`` False when the
        request is refused; ``message`` then says what is refused and ``hint`` what to set instead.

    Raises:
        TuneproofError: ``requested`` is not one of :data:`PRECISIONS`.
    """
    if requested not in PRECISIONS:
        raise TuneproofError(
            f"training.precision: unknown precision {requested!r}", hint=f"use one of {', '.join(PRECISIONS)}"
        )
    native, why = _bf16_native(device)
    dtype: str | None
    passed = True
    message = ""
    if requested == "fp32":
        dtype, reason = "fp32", "fp32 requested; runs on every device"
    elif requested == "auto":
        if device.type != "cpu" and native:
            dtype, reason = "bf16", f"auto: {why}"
        else:
            dtype = "fp32"
            reason = f"auto: {why}; fp32 chosen" + (
                " (fp16 is possible but only when asked for: it needs loss scaling)" if device.type != "cpu" else ""
            )
    elif requested == "bf16":
        if native or device.type == "cpu":
            dtype, reason = "bf16", f"bf16 requested: {why}"
        else:
            dtype, passed, reason = None, False, f"bf16 requested: {why}"
            message = (
                f"refused: bf16 is not native on {device.name}; set training.precision to 'fp32' "
                "(safe), 'fp16' (needs loss scaling) or 'auto'"
            )
    else:  # fp16
        if device.type == "cpu":
            dtype, passed = None, False
            reason = "fp16 requested on CPU: fp16 training needs loss scaling and CPU fp16 kernels are missing or slow"
            message = "refused: fp16 is not supported on CPU; set training.precision to 'fp32' or 'bf16'"
        else:
            dtype, reason = "fp16", "fp16 requested: needs a gradient scaler (torch.amp.GradScaler) against underflow"
    hint = "set training.precision to auto or fp32"
    if passed:
        message = f"{dtype}: {reason}"
        if bf16_base_weights:
            allowed, why = bf16_base_rule(dtype, device)
            if allowed:
                message += f"; {why}"
            else:
                head, _, tail = why.partition("; set ")
                dtype, passed, message, hint = None, False, f"refused: {head}", "set " + tail
    return {
        "requested": requested,
        "dtype": dtype,
        "reason": reason,
        "passed": passed,
        "message": message,
        "device": device.as_dict(),
        "base_weights": "bf16" if (bf16_base_weights and passed) else "fp32",
        "hint": hint,
    }
