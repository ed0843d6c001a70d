"""The preflight (steps 4-6 of PROTOCOL.md): its checks under their display names and units, memory
and throughput tables, the automatic speed-ups."""

from __future__ import annotations

import re
from typing import Any

from tuneproof.deliver.dossier.blocks import NOT_RUN, _fig, _fmt, _paragraph, _table, flatten
from tuneproof.deliver.dossier.evidence import _Evidence
from tuneproof.deliver.plots import memory_throughput
from tuneproof.modalities.modality import (
    Modality,
)
from tuneproof.preflight.checks import PREFLIGHT_NAMES  # each check's row names its numbers
from tuneproof.preflight.report import headline

_MEM = re.compile(r"(peak|memory|mem_|_mem|bytes|gib|mib)", re.I)


_THR = re.compile(r"(tokens_per_s|s_per_step|examples_per_s|steps_per_s|throughput)", re.I)


def _gib(key: str, v: float) -> float | None:
    k = key.lower()
    if "gib" in k or k.endswith("_gb"):
        return v
    if "mib" in k or k.endswith("_mb"):
        return v / 1024
    if "bytes" in k or k.endswith("_b") or v > 1e5:
        return v / 2**30
    return None


_STEP_MEM = re.compile(
    r"^L(\d+)_(estimate|peak|step_peak|estimate_in_step|allocated_step_peak)_gib$|^L(\d+)_(measured_over_estimate)$"
)


def _plain(key: str, rate: str = "tokens") -> tuple[str, str, float | None]:
    """``(plain name, unit, factor)`` of a dotted preflight key; ``factor`` converts bytes to GiB;
    ``rate``: what the training throughput counts (``Modality.unit``)."""
    last = key.split(".")[-1]
    if last in PREFLIGHT_NAMES:
        name, unit = PREFLIGHT_NAMES[last]
        unit = f"{rate}/s" if unit == "tokens/s" else unit
        ctx = key.split(".")[:-1]
        if ctx and ctx[0] not in ("memory", "throughput", "smoke"):
            name += f" ({' '.join(ctx)})"
        elif len(ctx) > 1:
            name += f" ({' '.join(ctx[1:])})"
        return name, unit, 1 / 2**30 if last.endswith("_bytes") else None
    words = key.replace(".", " ").replace("_", " ")
    for suffix, unit, factor in (
        (" bytes", "GiB", 1 / 2**30),
        (" gib", "GiB", None),
        (" seconds", "s", None),
        (" per s", "/s", None),
    ):
        if words.endswith(suffix):
            return words[: -len(suffix)].strip(), unit, factor
    return words, "", None


def _label(key: str, unit: bool = False, rate: str = "tokens") -> str:
    """A plot label for a preflight key: its plain name (with the unit when ``unit``; ``rate`` as in :func:`_plain`)."""
    m = _STEP_MEM.match(key.split(".")[-1])
    if m:
        what = {
            "estimate": "step total, estimate",
            "peak": "step total, measured",
            "estimate_in_step": "step adds, estimate",
            "step_peak": "step adds, measured",
            "allocated_step_peak": "step's tensors, measured",
            "measured_over_estimate": "measured / estimate",
        }[m.group(2) or m.group(4)]
        return f"L{m.group(1) or m.group(3)}: {what}"
    name, u, _ = _plain(key, rate)
    return f"{name} ({u})" if unit and u else name


def preflight_tables(summary: dict, rate: str = "tokens") -> tuple[list[list], list[list]]:
    """The preflight summary as two tables: step memory per sequence length ``[length, estimate,
    measured peak, in-step estimate, in-step measured, the step's tensors measured, measured /
    estimate]`` (GiB, 2 decimals; the ratio of the step's tensors to the in-step estimate) and every
    other number ``[plain name, value, unit]``; raw keys such as ``memory.L37_estimate_in_step_gib``
    become "the step adds, estimate" at length 37; ``rate``: what the throughput counts (``Modality.unit``)."""
    memory = summary.get("memory") if isinstance(summary.get("memory"), dict) else {}
    by_len: dict[int, dict[str, float]] = {}
    for k, v in memory.items():
        m = _STEP_MEM.match(str(k))
        if m and isinstance(v, (int, float)):
            by_len.setdefault(int(m.group(1) or m.group(3)), {})[m.group(2) or m.group(4)] = float(v)
    mem_rows = [
        [
            length,
            *(
                f"{d[k]:.2f}" if k in d else "-"
                for k in (
                    "estimate",
                    "peak",
                    "estimate_in_step",
                    "step_peak",
                    "allocated_step_peak",
                    "measured_over_estimate",
                )
            ),
        ]
        for length, d in sorted(by_len.items())
    ]
    # speedups_auto has its own table (speedups_auto_rows): its reasons are longer than the cut below
    apart = ("checks", "passed", "failed", "memory_breakdown", "speedups_auto")
    rest = {k: v for k, v in summary.items() if k not in apart}
    rest["memory"] = {k: v for k, v in memory.items() if not _STEP_MEM.match(str(k))}
    rows = []
    for k, v in flatten(rest, depth=4):
        if isinstance(v, str) and len(v) >= 200 or v is None:
            continue
        name, unit, factor = _plain(k, rate)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            val = v * factor if factor else v
            shown = (
                f"{val:.2f}"
                if unit == "GiB"
                else (
                    f"{val:,}"
                    if isinstance(val, int)
                    else _fmt(float(val), 1 if abs(val) >= 100 else 3 if abs(val) >= 0.01 or val == 0 else 5)
                )
            )
        else:
            shown = _fmt(v)
        rows.append([name, shown, unit])
    return mem_rows, rows


def speedups_auto_rows(record: Any) -> list[list[str]]:
    """What ``training.speedups: auto`` resolved to (a run summary's ``speedups_auto``, written by
    :func:`tuneproof.training.speedups.resolve_auto`) as ``[speed-up, "used" | "off", reason]``, one row
    per speed-up in the order auto tried them, the reason whole; ``[]`` for a run without auto."""
    decisions = record.get("decisions") if isinstance(record, dict) else None
    if not isinstance(decisions, dict):
        return []
    return [
        [str(name), "used" if d.get("used") else "off", str(d.get("reason") or "")]
        for name, d in decisions.items()
        if isinstance(d, dict)
    ]


def _auto_blocks(run_id: str, record: Any) -> list[dict]:
    """The table of :func:`speedups_auto_rows` under a line naming the run it was resolved in."""
    rows = speedups_auto_rows(record)
    if not rows:
        return []
    return [
        _paragraph(f"{run_id}: training.speedups auto, each speed-up used or left off and why:"),
        _table(["speed-up", "auto", "why"], rows),
    ]


def _preflight(ev: _Evidence, plots: bool, modality: Modality) -> list[dict]:
    r = ev.latest("preflight", any_status=True)
    if not r:
        return [_paragraph(f"{NOT_RUN} (`tuneproof preflight`)")]
    s = r.summary
    blocks = [
        _paragraph(
            f"{r.id}: {r.status}"
            + (f" ({r.reason})" if r.reason else "")
            + (f"; passed: {_fmt(s.get('passed'))}" if "passed" in s else "")
        )
    ]
    checks = s.get("checks")
    rows = []

    def line(name: str, c: dict) -> list:  # the number that matters, as on the preflight's screen
        message = c.get("detail") or c.get("message") or ""
        passed = c.get("passed", c.get("status"))
        return [name, _fmt(passed), headline({"name": name, "passed": passed, "message": message, **c})]

    if isinstance(checks, list):
        rows = [line(c.get("name", "?"), c) for c in checks if isinstance(c, dict)]
    elif isinstance(checks, dict):
        for name, c in checks.items():
            rows.append(line(name, c) if isinstance(c, dict) else [name, _fmt(c), ""])
    if rows:
        blocks.append(_paragraph(f"each check's whole message and numbers: runs/{r.id}/preflight.json"))
        blocks.append(_table(["check", "passed", "the number that matters"], rows))
    mem_rows, rows = preflight_tables(s, modality.unit)
    if mem_rows:
        blocks.append(
            _paragraph(
                "step memory at the configured micro-batch, estimate next to measured (GiB; measured: process resident "
                "set on a CPU, peak allocated on a GPU):"
            )
        )
        blocks.append(
            _table(
                [
                    "sequence length (tokens)",
                    "step total, estimate",
                    "step total, measured peak",
                    "the step adds, estimate",
                    "the step adds, measured",
                    "the step's tensors, measured",
                    "measured / estimate (tensors vs the step's parts)",
                ],
                mem_rows,
            )
        )
    bd = s.get("memory_breakdown") if isinstance(s.get("memory_breakdown"), dict) else None
    if bd and bd.get("rows") and bd.get("lengths"):
        blocks.append(
            _paragraph(
                "step memory estimate itemised, MiB (2**20 bytes), micro-batch "
                f"{bd.get('micro_batch')}; then the measured "
                "step (its tensors: the CPU allocator's count or CUDA's peak "
                "allocated; the process: resident set on a CPU):"
            )
        )
        blocks.append(
            _table(
                ["part", *(f"length {n}" for n in bd["lengths"])],
                [
                    [str(r[0]), *("-" if v is None else _fmt(v) for v in r[1:])]
                    for r in bd["rows"]
                    if isinstance(r, list) and r
                ],
            )
        )
    if rows:
        blocks.append(_table(["quantity", "value", "unit"], rows[:40]))
    blocks += _auto_blocks(r.id, s.get("speedups_auto"))
    if plots:
        nums = [
            (k, float(v))
            for k, v in flatten(s, depth=4)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
        ]
        mem = {
            _label(k): g
            for k, v in nums
            if _MEM.search(k) and not _THR.search(k) and "budget" not in k.lower()
            for g in [_gib(k, v)]
            if g is not None
        }
        thr = {_label(k, unit=True, rate=modality.unit): v for k, v in nums if _THR.search(k)}
        blocks += _fig(memory_throughput(mem, thr), "step memory and throughput (preflight)")
    return blocks
