"""Preflight check ``backend``: the compute dtype for ``training.precision`` on the detected device
(:mod:`tuneproof.models.device`), extensions built for the right chain (docs/PROTOCOL.md step 6: the CUDA
stack on NVIDIA, the ROCm stack on AMD), and ``eval.backend`` runnable here (:func:`check_backend`).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Callable
from importlib import metadata
from typing import Any

from tuneproof import procs
from tuneproof.context import StudyContext
from tuneproof.errors import TuneproofError
from tuneproof.evaluation.backends import check_backend_available
from tuneproof.models.device import DeviceInfo, choose_dtype, detect_device
from tuneproof.models.quant import require_4bit_device
from tuneproof.preflight.report import check_result
from tuneproof.study import STUDY_FILE

# --------------------------------------------------------------------------- extensions
#: Extension name -> (distribution name, import name, install hint).
EXTENSIONS = {
    "flash-attn": (
        "flash-attn",
        "flash_attn",
        "pip install flash-attn --no-build-isolation (ROCm: build ROCm/flash-attention)",
    ),
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
        cmd, env = procs.dying_with_parent([sys.executable, "-c", f"import {module}"])  # kill -9 of us: it dies
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False, env=env)
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
            msg = (
                f"{key} {info.get('version')} needs a CUDA or ROCm GPU; this run is on "
                "CPU: drop it or use attn_implementation='sdpa'"
            )
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
        info["message"] = msg or f"{key} {info.get('version')} ok" + (
            f" (built for {', '.join(sorted(built))})" if built else ""
        )
        if msg:
            problems.append(msg)
        results[key] = info
    message = (
        "; ".join(problems)
        if problems
        else (f"extensions ok on {device.type}: {', '.join(results)}" if results else "no extensions wanted")
    )
    return {"passed": not problems, "message": message, "backend": device.type, "extensions": results}


# --------------------------------------------------------------------------- the preflight's check
def check_backend(ctx: StudyContext) -> tuple[dict[str, Any], dict[str, Any]]:
    """The preflight's ``backend`` check: dtype for ``training.precision`` on this device (docs/CASES.md C9), the
    extensions the config wants (bitsandbytes for qlora, built for this backend and importable; a tiny
    4-bit layer run on the device), and ``eval.backend`` (vllm: installed, a CUDA GPU, a causal LM;
    else failed with the two-line error that ``baseline``/``eval``/``test`` give,
    :func:`tuneproof.evaluation.backends.check_backend_available`).

    Returns:
        ``(check, choice)``: the check record and the dtype choice of :func:`choose_dtype`.
    """
    device = detect_device()
    choice = choose_dtype(ctx.study.training.precision, device, bf16_base_weights=ctx.study.training.bf16_base_weights)
    wanted = list(getattr(ctx.study.training, "extensions", None) or [])
    # the 4-bit base: bitsandbytes built for this backend, and it imports
    if ctx.study.method.kind == "qlora" and "bitsandbytes" not in wanted:
        wanted.append("bitsandbytes")
    ext = check_extensions(device, wanted, try_import=ctx.study.method.kind == "qlora")
    numbers = {
        "device": device.type,
        "device_name": device.name,
        "capability": list(device.capability) if device.capability else None,
        "bf16_native": device.bf16_supported,
        "requested": choice["requested"],
        "dtype": choice["dtype"],
        "extensions": wanted,
    }
    passed = bool(choice["passed"] and ext["passed"])
    message = f"{choice['message']}; {ext['message']}"
    if ctx.study.method.kind == "qlora" and ext["passed"]:  # a tiny NF4 layer forward + backward on this device
        try:
            numbers["qlora_device"] = require_4bit_device("cuda" if device.type in ("cuda", "rocm") else "cpu")
            message += f"; bitsandbytes 4-bit layers run on {numbers['qlora_device']}"
        except TuneproofError as err:
            passed, message = False, f"{message}; {err.message} -> {err.hint}"
    numbers["eval_backend"] = ctx.study.eval.backend
    if ctx.study.eval.backend != "transformers":  # baseline/eval/test would refuse it here: so does the preflight
        try:
            check_backend_available(ctx.study.eval, ctx.model_kind, ctx.study_dir / STUDY_FILE)
            message += f"; eval.backend {ctx.study.eval.backend} can run here"
        except TuneproofError as err:
            passed, message = False, f"{message}; {err.message} -> {err.hint}"
    return check_result("backend", passed, message, numbers, {"dtype": choice, "extensions": ext}), choice
