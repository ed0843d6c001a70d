"""Preflight check ``environment`` and the memory budget the later checks are judged on.

The environment of this run (:func:`~tuneproof.preflight.envinfo.environment_snapshot`) is compared
with the ``env.json`` of the latest completed baseline or train run: a platform change is flagged
with the checks to redo (a flag, not a failure: the baseline is what must be redone). The memory
budget is ``--memory-budget`` (:func:`parse_memory`), else the device's memory, else the physical RAM.
"""

from __future__ import annotations

import re
from typing import Any

from tuneproof.context import StudyContext
from tuneproof.errors import TuneproofError
from tuneproof.io import read_json
from tuneproof.preflight.envinfo import compare_environments, platform_key
from tuneproof.preflight.report import check_result

_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
}


def check_environment(ctx: StudyContext, snapshot: dict[str, Any]) -> dict[str, Any]:
    """This environment (``snapshot``), compared with the latest completed baseline or train run's ``env.json``."""
    key = platform_key(snapshot)
    numbers: dict[str, Any] = {
        "platform": key,
        "python": snapshot.get("python"),
        "torch": snapshot.get("torch"),
        "backend": snapshot.get("backend"),
        "compared_with": None,
    }
    refs = [r for r in ctx.registry.list(status="completed") if r.kind in ("baseline", "train")]
    ref = next((r for r in reversed(refs) if (ctx.registry.runs_dir / r.id / "env.json").exists()), None)
    if ref is None:
        return check_result(
            "environment", True, f"{key}; no baseline or train run to compare with yet", numbers, {"snapshot": snapshot}
        )
    recorded = read_json(ctx.registry.runs_dir / ref.id / "env.json")
    cmp = compare_environments(recorded, snapshot)
    numbers.update(
        compared_with=ref.id, changes=len(cmp["changes"]), same_platform=cmp["same_platform"], redo=sorted(cmp["redo"])
    )
    warning = None
    if not cmp["same_platform"]:
        warning = (
            f"the platform changed since {ref.kind} {ref.id} ({cmp['platform_a']} -> {cmp['platform_b']}): "
            f"redo {', '.join(sorted(cmp['redo']))} before comparing with it"
        )
    elif cmp["changes"]:
        warning = f"environment changed since {ref.kind} {ref.id}: redo {', '.join(sorted(cmp['redo']))}"
    return check_result(
        "environment",
        True,
        f"vs {ref.kind} {ref.id}: {cmp['message']}",
        numbers,
        {"snapshot": snapshot, "comparison": cmp},
        warning=warning,
    )


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
            raise TuneproofError(
                f"--memory-budget {text!r}: not a memory size",
                hint="write e.g. 80GiB, 512MiB or 16GB (GB = 10**9 bytes, GiB = 2**30)",
            )
        value = int(float(m.group(1)) * _UNITS[unit])
    if value <= 0:
        raise TuneproofError(f"--memory-budget {text!r}: must be more than 0 bytes")
    return value


def default_memory_budget(choice: dict[str, Any], snapshot: dict[str, Any]) -> tuple[int, str]:
    """``(bytes, source)`` of the budget without ``--memory-budget``: the device memory of the dtype
    ``choice`` (:func:`~tuneproof.models.device.choose_dtype`), else the physical RAM of ``snapshot``
    (a CPU run), else 2**62 ("none known")."""
    device = choice.get("device") or {}
    if device.get("total_memory_bytes"):
        return int(device["total_memory_bytes"]), f"device memory of {device.get('name')}"
    ram = snapshot.get("ram_bytes")
    if ram:
        return int(ram), "physical RAM (CPU run)"
    return 2**62, "none known"
