"""Recipe ``env``: what this machine is, as recorded in every run's ``env.json`` (docs/PROTOCOL.md step 6:
"record the versions actually used").

Features (option that turns each on):
- a table of :func:`tuneproof.preflight.envinfo.environment_snapshot`: Python, platform, CPU, RAM,
  backend, torch and its CUDA/ROCm build, cuDNN, driver, each device (name, compute capability,
  memory), the library versions, the platform key ``train`` compares with its preflight;
- ``--json``: the snapshot as JSON on stdout instead (the exact record, for scripts).
"""

from __future__ import annotations

from typing import Any

from tuneproof.preflight.envinfo import environment_snapshot, platform_key
from tuneproof.ui import console, print_json, table


def run_env(as_json: bool = False) -> dict[str, Any]:
    """Print the environment snapshot (table, or JSON with ``as_json``) and return it."""
    snap = environment_snapshot()
    snap["platform_key"] = platform_key(snap)
    if as_json:
        print_json(snap)
        return snap
    gib = 2**30
    cpu = snap.get("cpu") or {}
    rows = [
        ["platform key", snap["platform_key"]],
        ["python", f"{snap.get('python')} ({snap.get('python_implementation')}, {snap.get('executable')})"],
        ["platform", snap.get("platform")],
        ["cpu", f"{cpu.get('model')}; {cpu.get('logical_cores')} logical cores, {cpu.get('usable_cores')} usable"],
        ["ram", f"{snap['ram_bytes'] / gib:.1f} GiB" if snap.get("ram_bytes") else None],
        ["backend", snap.get("backend")],
        ["torch", snap.get("torch")],
        ["cuda (torch build)", snap.get("cuda") or "none"],
        ["hip (torch build)", snap.get("hip") or "none"],
        ["cudnn", snap.get("cudnn") or "none"],
        ["driver", snap.get("driver") or "none"],
    ]
    for d in snap.get("devices") or []:
        cap = d.get("capability")
        rows.append(
            [
                f"device {d.get('index')}",
                f"{d.get('name')}"
                + (f", capability {cap[0]}.{cap[1]}" if cap else "")
                + (f", {d['arch']}" if d.get("arch") else "")
                + (f", {d['total_memory_bytes'] / gib:.1f} GiB" if d.get("total_memory_bytes") else ""),
            ]
        )
    if not snap.get("devices"):
        rows.append(["devices", "none (CPU only)"])
    for name, version in (snap.get("libraries") or {}).items():
        if name == "torch":  # shown above with its build
            continue
        rows.append([name, version if version is not None else "not installed"])
    console.print(table("environment (recorded in every run as env.json)", ["field", "value"], rows))
    return snap
