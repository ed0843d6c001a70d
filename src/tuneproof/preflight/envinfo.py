"""The execution environment, recorded and compared (docs/PROTOCOL.md step 6).

"Record the versions actually used; an environment with the same name is not the same
execution." :func:`environment_snapshot` records the interpreter, the machine, the torch build
(CUDA or ROCm), the accelerators and the version of every library that changes what a run
computes. :func:`compare_environments` says whether two snapshots are the same platform and,
when they are not, which checks must be redone ("a change of platform means redoing the
start-up and quality checks").

Library versions come from ``importlib.metadata`` (the installed distribution's metadata); no
library is imported to learn its version. ``torch`` is imported because the build facts
(``torch.version.cuda``, ``torch.version.hip``, cuDNN, the device list) exist only at runtime.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata
from typing import Any

from tuneproof.models.device import cpu_model

#: Distributions recorded by :func:`environment_snapshot` (``None`` when not installed).
LIBRARIES = (
    "torch",
    "transformers",
    "peft",
    "accelerate",
    "datasets",
    "safetensors",
    "tokenizers",
    "numpy",
    "scikit-learn",
    "datasketch",
    "bitsandbytes",
    "flash-attn",
    "deepspeed",
    "tuneproof",
)

#: Snapshot fields that define the platform; a change in any of them means redoing preflight and baseline.
PLATFORM_FIELDS = ("backend", "devices", "torch", "cuda", "hip", "cudnn", "driver")

#: Which checks a library version change invalidates (besides preflight, which any change invalidates).
#: tokenizers/transformers: tokenisation and generation may change -> data inspection and baseline;
#: datasketch: MinHash signatures -> duplicate detection; numpy/scikit-learn: metric code -> evaluation.
LIBRARY_REDO = {
    "transformers": ("preflight", "data", "baseline"),
    "tokenizers": ("preflight", "data", "baseline"),
    "peft": ("preflight",),
    "accelerate": ("preflight",),
    "safetensors": ("preflight",),
    "bitsandbytes": ("preflight", "baseline"),
    "flash-attn": ("preflight", "baseline"),
    "deepspeed": ("preflight",),
    "datasets": ("data",),
    "datasketch": ("data",),
    "numpy": ("evaluation",),
    "scikit-learn": ("evaluation",),
}


#: Libraries whose version at train a judging command (eval, test, export) compares with its own: they decide what a
#: saved adapter and its tokenizer compute (loading, tokenisation, generation).
DRIFT_LIBRARIES = ("torch", "transformers", "tokenizers", "peft")


def library_drift(recorded: dict[str, Any] | None, now: dict[str, Any], names=DRIFT_LIBRARIES) -> dict[str, dict]:
    """The libraries of ``names`` whose version differs between two :func:`environment_snapshot`
    (``recorded``: a train run's ``env.json``; ``now``: this run's).

    Returns:
        ``{library: {"train": version, "now": version}}`` (None for a library not installed on one side); empty
        when ``recorded`` is None or holds no ``libraries`` (runs recorded without them are not compared).
    """
    rec = (recorded or {}).get("libraries") or {}
    cur = now.get("libraries") or {}
    if not rec:
        return {}
    return {n: {"train": rec.get(n), "now": cur.get(n)} for n in names if rec.get(n) != cur.get(n)}


def package_version(name: str) -> str | None:
    """Installed version of distribution ``name`` (``-``/``_`` variants tried), or ``None``."""
    for candidate in dict.fromkeys((name, name.replace("-", "_"), name.replace("_", "-"))):
        try:
            return metadata.version(candidate)
        except metadata.PackageNotFoundError:
            continue
    return None


def _ram_bytes() -> int | None:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        try:
            import psutil  # noqa: PLC0415 (optional dependency)

            return int(psutil.virtual_memory().total)
        except Exception:  # noqa: BLE001 (psutil missing or failing: no reading)
            return None


def _run_quiet(cmd: list[str]) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def _driver_version(backend: str) -> str | None:
    if backend == "cuda":
        out = _run_quiet(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        return out.splitlines()[0].strip() if out else None
    if backend == "rocm":
        out = _run_quiet(["rocm-smi", "--showdriverversion"])
        if out:
            for line in out.splitlines():
                if "version" in line.lower() and ":" in line:
                    return line.split(":", 1)[1].strip()
    return None


def _devices(torch: Any) -> list[dict[str, Any]]:
    devices = []
    if not torch.cuda.is_available():
        return devices
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        devices.append(
            {
                "index": i,
                "name": props.name,
                "capability": list(torch.cuda.get_device_capability(i)),
                "arch": getattr(props, "gcnArchName", None),
                "total_memory_bytes": int(props.total_memory),
            }
        )
    return devices


def environment_snapshot() -> dict[str, Any]:
    """Record the environment this process runs in. JSON-safe.

    Returns:
        ``{"python", "platform", "cpu": {"model", "logical_cores", "usable_cores"}, "ram_bytes",
        "backend": "cuda"|"rocm"|"cpu", "torch", "cuda", "hip", "cudnn", "driver",
        "devices": [{"index", "name", "capability": [major, minor], "arch", "total_memory_bytes"}],
        "libraries": {name: version or None}}``. ``cuda``/``hip`` are ``torch.version.cuda`` /
        ``torch.version.hip`` (the toolkit torch was built with, ``None`` for the other backend and
        for CPU builds); ``cudnn`` is ``torch.backends.cudnn.version()`` (an int such as 91002, or
        ``None``); ``driver`` comes from ``nvidia-smi`` / ``rocm-smi`` when present, else ``None``.
        ``ram_bytes`` is physical memory in bytes.

    Raises nothing for a missing tool or library: the field is ``None``.
    """
    import torch  # noqa: PLC0415 (lazy: `tuneproof env` without torch still reports the rest)

    hip = getattr(torch.version, "hip", None)
    cuda = getattr(torch.version, "cuda", None)
    devices = _devices(torch)
    backend = "cpu" if not devices else ("rocm" if hip else "cuda")
    try:
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception:  # noqa: BLE001 (a broken cuDNN install is reported as absent)
        cudnn = None
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count()
    return {
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "executable": sys.executable,
        "platform": platform.platform(),
        "cpu": {"model": cpu_model(), "logical_cores": os.cpu_count(), "usable_cores": usable},
        "ram_bytes": _ram_bytes(),
        "backend": backend,
        "torch": torch.__version__,
        "cuda": cuda,
        "hip": hip,
        "cudnn": cudnn,
        "driver": _driver_version(backend),
        "devices": devices,
        "libraries": {name: package_version(name) for name in LIBRARIES},
    }


def platform_key(snapshot: dict[str, Any]) -> str:
    """One line naming the platform: backend, device(s), torch and toolkit versions.

    Example: ``"cuda | 1x NVIDIA H200 (9.0) | torch 2.5.1 | cuda 12.4"``; CPU:
    ``"cpu | Intel(R) Xeon(R) ... | torch 2.5.1+cpu"``. Two runs with different keys are on
    different platforms (docs/PROTOCOL.md step 6).
    """
    backend = snapshot.get("backend", "cpu")
    devices = snapshot.get("devices") or []
    if devices:
        names: dict[str, int] = {}
        for d in devices:
            cap = d.get("capability")
            label = d.get("name", "?") + (f" ({cap[0]}.{cap[1]})" if cap else "")
            names[label] = names.get(label, 0) + 1
        device = ", ".join(f"{n}x {label}" for label, n in names.items())
    else:
        device = (snapshot.get("cpu") or {}).get("model", "?")
    parts = [backend, device, f"torch {snapshot.get('torch')}"]
    if snapshot.get("cuda"):
        parts.append(f"cuda {snapshot['cuda']}")
    if snapshot.get("hip"):
        parts.append(f"hip {snapshot['hip']}")
    return " | ".join(parts)


def compare_environments(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Compare two :func:`environment_snapshot` records (``a``: recorded, ``b``: now).

    Rule (docs/PROTOCOL.md step 6): a change of backend, device, device count, torch, CUDA/HIP, cuDNN or
    driver is a platform change -> redo ``preflight`` and ``baseline``. A library version change
    is named, with the checks it invalidates from :data:`LIBRARY_REDO`. A Python change -> preflight.
    CPU model and RAM are reported but invalidate nothing on a GPU backend (they matter on CPU runs,
    where they are part of the platform key).

    Returns:
        ``{"passed": no change that invalidates a check, "same_platform": bool, "platform_a",
        "platform_b", "changes": [{"field", "a", "b"}], "redo": {check: [reasons]}, "message"}``.
    """
    changes: list[dict[str, Any]] = []
    redo: dict[str, list[str]] = {}

    def add(field: str, va: Any, vb: Any, checks: tuple[str, ...]) -> None:
        changes.append({"field": field, "a": va, "b": vb})
        for check in checks:
            redo.setdefault(check, []).append(f"{field}: {va} -> {vb}")

    def device_view(s: dict[str, Any]) -> list[tuple]:
        return [
            (d.get("name"), tuple(d.get("capability") or ()), d.get("total_memory_bytes"))
            for d in s.get("devices") or []
        ]

    key_a, key_b = platform_key(a), platform_key(b)
    for field in PLATFORM_FIELDS:
        va, vb = (device_view(a), device_view(b)) if field == "devices" else (a.get(field), b.get(field))
        if va != vb:
            shown = (platform_key(a), platform_key(b)) if field == "devices" else (va, vb)
            add(field, *shown, ("preflight", "baseline"))
    if a.get("backend") == "cpu" == b.get("backend") and (a.get("cpu") or {}).get("model") != (b.get("cpu") or {}).get(
        "model"
    ):
        add(
            "cpu.model", (a.get("cpu") or {}).get("model"), (b.get("cpu") or {}).get("model"), ("preflight", "baseline")
        )
    if a.get("python") != b.get("python"):
        add("python", a.get("python"), b.get("python"), ("preflight",))
    libs_a, libs_b = a.get("libraries") or {}, b.get("libraries") or {}
    for name in sorted(set(libs_a) | set(libs_b)):
        if name == "torch":  # already a platform field
            continue
        if libs_a.get(name) != libs_b.get(name):
            add(f"libraries.{name}", libs_a.get(name), libs_b.get(name), LIBRARY_REDO.get(name, ("preflight",)))
    same_platform = not any(c["field"] in PLATFORM_FIELDS or c["field"] == "cpu.model" for c in changes)
    if not changes:
        message = f"same environment ({key_b})"
    else:
        head = "same platform" if same_platform else f"platform changed: {key_a} -> {key_b}"
        what = "; ".join(f"{c['field']} {c['a']} -> {c['b']}" for c in changes[:8])
        message = f"{head}; changed: {what}; redo: {', '.join(redo)}"
    return {
        "passed": not changes,
        "same_platform": same_platform,
        "platform_a": key_a,
        "platform_b": key_b,
        "changes": changes,
        "redo": redo,
        "message": message,
    }
