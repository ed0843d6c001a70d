"""Backend checks: compute dtype for the device, and extensions built for the right chain
(PROTOCOL.md step 6: "the CUDA chain on NVIDIA, the ROCm chain on AMD").

Precision rules (:func:`choose_dtype`, CASES C9):

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
* ``training.bf16_base_weights`` (frozen base weights stored in bf16, issue 15): only where bf16
  is native by the rules above (a CPU that emulates bf16 would convert every weight on every use)
  and only with bf16 compute (``training.precision: bf16``, or ``auto`` where it resolves to bf16):
  under fp32 compute a bf16 weight meets fp32 activations, under fp16 autocast it would be
  rounded again to fp16's narrower range. Refused otherwise, naming the key (:func:`bf16_base_rule`).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from importlib import metadata
from typing import Any, Callable

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
    import torch

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(index)
        cap = tuple(torch.cuda.get_device_capability(index))
        if getattr(torch.version, "hip", None):
            arch = getattr(props, "gcnArchName", None) or ""
            return DeviceInfo("rocm", props.name, cap, arch.startswith(ROCM_BF16_ARCHS), arch or None, int(props.total_memory))
        try:
            native = bool(torch.cuda.is_bf16_supported(including_emulation=False))
        except TypeError:  # torch < 2.3 has no including_emulation
            native = cap >= (8, 0)
        return DeviceInfo("cuda", props.name, cap, native, None, int(props.total_memory))
    from tuneproof.preflight.envinfo import _cpu_model

    return DeviceInfo("cpu", _cpu_model(), None, _cpu_bf16_native())


def _bf16_native(device: DeviceInfo) -> tuple[bool, str]:
    if device.type == "cuda":
        if device.capability is not None:
            cap = f"{device.capability[0]}.{device.capability[1]}"
            if tuple(device.capability) >= (8, 0):
                return True, f"{device.name} has compute capability {cap} >= 8.0: native bf16"
            return False, f"{device.name} has compute capability {cap} < 8.0: bf16 is only emulated there (slow, not native)"
        return device.bf16_supported, f"{device.name}: bf16 {'native' if device.bf16_supported else 'not native'} (capability unknown)"
    if device.type == "rocm":
        arch = device.arch or "unknown arch"
        native = device.bf16_supported or bool(device.arch and device.arch.startswith(ROCM_BF16_ARCHS))
        return native, f"{device.name} ({arch}): bf16 {'native' if native else 'not native (needs gfx908/MI100 or later, or RDNA3)'}"
    native = device.bf16_supported
    return native, f"CPU {device.name}: bf16 {'native (AVX512-BF16/AMX)' if native else 'emulated through fp32 (no AVX512-BF16/AMX), slower than fp32'}"


BF16_BASE_KEY = "training.bf16_base_weights"


def bf16_base_rule(dtype: str | None, device: DeviceInfo) -> tuple[bool, str]:
    """Whether frozen base weights may be held in bf16 (``training.bf16_base_weights``) with the
    resolved compute ``dtype`` on ``device``: bf16 native there (:func:`_bf16_native`, the same rule
    as ``auto``) and bf16 compute. Returns ``(allowed, why)``; ``why`` names the key and what to set."""
    native, why = _bf16_native(device)
    if not native:
        return False, (f"{BF16_BASE_KEY}: bf16 is not native here ({why}); frozen weights held in bf16 would be converted "
                       "on every use; set training.bf16_base_weights: false, or run on a device with native bf16")
    if dtype != "bf16":
        return False, (f"{BF16_BASE_KEY}: the compute dtype is {dtype} (training.precision resolved to it), and bf16 frozen "
                       "weights need bf16 compute under autocast; set training.precision: bf16, or training.bf16_base_weights: false")
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
            reason = f"auto: {why}; fp32 chosen" + (" (fp16 is possible but only when asked for: it needs loss scaling)" if device.type != "cpu" else "")
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
    return {"requested": requested, "dtype": dtype, "reason": reason, "passed": passed, "message": message, "device": device.as_dict(),
            "base_weights": "bf16" if (bf16_base_weights and passed) else "fp32", "hint": hint}


# --------------------------------------------------------------------------- extensions
#: Extension name -> (distribution name, import name, install hint).
EXTENSIONS = {
    "flash-attn": ("flash-attn", "flash_attn", "pip install flash-attn --no-build-isolation (ROCm: build ROCm/flash-attention)"),
    "bitsandbytes": ("bitsandbytes", "bitsandbytes", "pip install bitsandbytes (ROCm: a ROCm build of bitsandbytes)"),
    "deepspeed": ("deepspeed", "deepspeed", "pip install deepspeed (built against the installed torch)"),
}

_CUDA_MARKERS = (b"libcudart.so", b"libc10_cuda.so", b"libcublas", b"libtorch_cuda.so")
_ROCM_MARKERS = (b"libamdhip64.so", b"libc10_hip.so", b"librocblas", b"libhipblas", b"libtorch_hip.so")
_SCAN_BYTES = 8 << 20  # ELF dynamic sections sit near the start; read at most 8 MiB per library


def _normalise_ext(name: str) -> str:
    key = name.lower().replace("_", "-")
    if key not in EXTENSIONS:
        raise TuneproofError(f"unknown extension {name!r}", hint=f"known: {', '.join(EXTENSIONS)}")
    return key


def scan_binary(path: str | os.PathLike) -> set[str]:
    """Backends a compiled library links against, from the library names in its first 8 MiB.

    Returns a subset of ``{"cuda", "rocm"}`` (empty when neither runtime is named).
    """
    try:
        with open(path, "rb") as fh:
            blob = fh.read(_SCAN_BYTES)
    except OSError:
        return set()
    found = set()
    if any(m in blob for m in _CUDA_MARKERS):
        found.add("cuda")
    if any(m in blob for m in _ROCM_MARKERS):
        found.add("rocm")
    return found


def _deepspeed_torch_info(dist: metadata.Distribution) -> dict[str, Any] | None:
    for f in dist.files or []:
        if str(f).replace("\\", "/").endswith("deepspeed/git_version_info_installed.py"):
            try:
                tree = ast.parse(f.read_text() or "")
            except (OSError, SyntaxError):
                return None
            for node in tree.body:
                if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "torch_info" for t in node.targets):
                    try:
                        return ast.literal_eval(node.value)
                    except ValueError:
                        return None
    return None


def inspect_extension(name: str) -> dict[str, Any]:
    """What is installed for extension ``name`` and which backend it was built for, without importing it.

    Evidence, in order: the version's local tag (``+cu121`` / ``+rocm6.1``), the build record of
    DeepSpeed (``git_version_info_installed.torch_info``: ``cuda_version`` / ``hip_version``), and
    the runtime libraries named inside its compiled ``.so`` files (``libcudart``/``libc10_cuda``
    vs ``libamdhip64``/``libc10_hip``).

    Returns:
        ``{"name", "installed": bool, "version", "built_for": sorted list of "cuda"/"rocm"
        (empty: pure Python or unknown), "evidence": [str]}``.
    """
    key = _normalise_ext(name)
    dist_name = EXTENSIONS[key][0]
    dist = None
    for candidate in dict.fromkeys((dist_name, dist_name.replace("-", "_"))):
        try:
            dist = metadata.distribution(candidate)
            break
        except metadata.PackageNotFoundError:
            continue
    if dist is None:
        return {"name": key, "installed": False, "version": None, "built_for": [], "evidence": []}
    version = dist.version
    built: set[str] = set()
    evidence: list[str] = []
    local = version.split("+", 1)[1].lower() if "+" in version else ""
    if local.startswith("cu"):
        built.add("cuda")
        evidence.append(f"version tag +{local}")
    elif local.startswith("rocm") or local.startswith("hip"):
        built.add("rocm")
        evidence.append(f"version tag +{local}")
    if key == "deepspeed":
        info = _deepspeed_torch_info(dist)
        if info:
            if info.get("hip_version") not in (None, "0.0", 0, "0"):
                built.add("rocm")
                evidence.append(f"deepspeed built with hip {info.get('hip_version')}")
            elif info.get("cuda_version") not in (None, "0.0", 0, "0"):
                built.add("cuda")
                evidence.append(f"deepspeed built with cuda {info.get('cuda_version')}")
    libs = [f for f in dist.files or [] if str(f).endswith(".so") or ".so." in str(f)]
    for f in libs[:40]:
        found = scan_binary(f.locate())
        if found:
            built |= found
            evidence.append(f"{f} links {'+'.join(sorted(found))}")
    return {"name": key, "installed": True, "version": version, "built_for": sorted(built), "evidence": evidence[:10]}


def _try_import(module: str, timeout_s: float = 120.0) -> str | None:
    """Import ``module`` in a fresh interpreter; the last line of the error, or None when it imports."""
    try:
        out = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return f"import {module} took more than {timeout_s:.0f} s"
    if out.returncode == 0:
        return None
    lines = [ln for ln in out.stderr.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else f"exit code {out.returncode}"


def check_extensions(
    device: DeviceInfo,
    wanted: list[str],
    *,
    try_import: bool = False,
    inspect: Callable[[str], dict[str, Any]] = inspect_extension,
) -> dict[str, Any]:
    """Check that each wanted extension is installed and built for ``device``'s backend.

    Args:
        device: the target device (:func:`detect_device`).
        wanted: names among ``"flash-attn"``, ``"bitsandbytes"``, ``"deepspeed"`` (``_`` or ``-``).
        try_import: also import each one in a fresh interpreter (catches an undefined symbol from a
            build against another torch); costs a few seconds per extension.
        inspect: ``name -> inspect_extension(name)``-shaped dict; injectable for tests.

    Fails when an extension is missing, was built only for the other GPU backend (CUDA vs ROCm),
    needs a GPU that is not there (flash-attn on CPU), or fails to import.

    Returns:
        ``{"passed", "message", "backend": device.type, "extensions": {name: {"installed", "version",
        "built_for", "evidence", "passed", "message"}}}``.

    Raises:
        TuneproofError: an unknown extension name.
    """
    results: dict[str, Any] = {}
    problems: list[str] = []
    for raw in wanted:
        key = _normalise_ext(raw)
        info = dict(inspect(key))
        hint = EXTENSIONS[key][2]
        built = set(info.get("built_for") or [])
        msg = ""
        if not info.get("installed"):
            msg = f"{key} is not installed; {hint}"
        elif device.type == "cpu" and key == "flash-attn":
            msg = f"{key} {info.get('version')} needs a CUDA or ROCm GPU; this run is on CPU: drop it or use attn_implementation='sdpa'"
        elif device.type in ("cuda", "rocm") and built and device.type not in built:
            other = "ROCm" if device.type == "cuda" else "CUDA"
            msg = (
                f"{key} {info.get('version')} was built for {other} but the device is {device.type.upper()} "
                f"({device.name}); install the {device.type.upper()} build: {hint}"
            )
        elif try_import:
            err = _try_import(EXTENSIONS[key][1])
            if err:
                msg = f"{key} {info.get('version')} is installed but does not import: {err}"
        info["passed"] = not msg
        info["message"] = msg or f"{key} {info.get('version')} ok" + (f" (built for {', '.join(sorted(built))})" if built else "")
        if msg:
            problems.append(msg)
        results[key] = info
    message = "; ".join(problems) if problems else (f"extensions ok on {device.type}: {', '.join(results)}" if results else "no extensions wanted")
    return {"passed": not problems, "message": message, "backend": device.type, "extensions": results}
