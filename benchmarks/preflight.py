"""Benchmark of ``tuneproof preflight`` on the default SmolLM2 extraction study (run by hand).

    python benchmarks/preflight.py [--data ../shared/data] [--dir DIR] [--fast] [--doc docs/benchmarks-preflight.md]

Writes the study of ``tuneproof init DIR --task extraction`` (``--fast``: the ``quickstart --fast``
study instead), runs ``tuneproof preflight --study DIR --data DATA`` in a new process and prints

- the wall time of the whole command (process start, imports, data, every check) and its CPU
  time (user + system of the command and of its fresh-process reload child, from
  ``resource.getrusage(RUSAGE_CHILDREN)``; CPU time is steadier than wall time on a shared machine),
  the load average before and after, and the wall time of each check;
- per representative length: the memory estimate (sum of parts, ``estimate_step_memory``), the
  measured peak (``measure_step_peak``), and the estimate's error against it. The comparable pair
  is the step's tensors at their peak (``allocated_step_peak_bytes``: torch's CPU allocator, or
  CUDA's peak allocated) against the estimate's step part (``memory.in_step_bytes``), with their
  ratio; the process's resident set (interpreter and glibc's heap included) and what the step adds
  to it are printed too (``docs/benchmarks-preflight.md``, 2026-12-01: why they differ).

With ``--doc`` a section with the numbers is appended to that Markdown file (docs/benchmarks-preflight.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

GIB = 2**30


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def write_study(directory: Path, fast: bool) -> None:
    from tuneproof.recipes.quickstart import write_quickstart_study  # noqa: PLC0415

    write_quickstart_study(directory, fast=fast)  # fast=False: the extraction template as `tuneproof init` writes it


def memory_rows(checks: dict) -> list[dict]:
    rows = []
    for r in (checks.get("step memory") or {}).get("details", {}).get("rows", []):
        if "measured" not in r:
            continue
        est, m = r["estimate"], r["measured"]
        cuda = str(m.get("device", "")).startswith("cuda")
        in_step = r["estimate_in_step_bytes"]
        row = {
            "length": r["length"],
            "micro_batch": est["micro_batch"],
            "estimate_total": est["total_bytes"],
            "estimate_in_step": in_step,
            "peak": m["peak_bytes"],
            "step_peak": m["step_peak_bytes"],
            "seconds": m["seconds"],
            "device": m.get("device"),
            "parts": {
                k: est[k]
                for k in (
                    "weights_bytes",
                    "gradients_bytes",
                    "optimizer_states_bytes",
                    "optimizer_step_temporary_bytes",
                    "activations_bytes",
                    "logits_bytes",
                )
            },
        }
        row["error_total_vs_peak"] = (
            (est["total_bytes"] - m["peak_bytes"]) / m["peak_bytes"] if m["peak_bytes"] else None
        )
        row["error_in_step_vs_step_peak"] = (
            (in_step - m["step_peak_bytes"]) / m["step_peak_bytes"] if m.get("step_peak_bytes") else None
        )
        row["compared"] = "total vs peak allocated" if cuda else "in-step parts vs step peak (RSS)"
        row["tensors"] = m.get("allocated_step_peak_bytes")  # the step's tensors at their peak (CPU allocator / CUDA)
        row["tensors_over_estimate"] = r.get("measured_over_estimate")  # over the estimate's step part (in_step_bytes)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(REPO.parent / "shared" / "data"), help="data root holding snips/")
    p.add_argument("--dir", default=None, help="study folder (default: a temporary one)")
    p.add_argument("--fast", action="store_true", help="the quickstart --fast study instead of the default one")
    p.add_argument("--doc", default=None, help="write the results to this Markdown file")
    a = p.parse_args(argv)

    study = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix="tuneproof-pf-bench-")) / "study"
    study.mkdir(parents=True, exist_ok=True)
    write_study(study, a.fast)
    load_before = os.getloadavg()
    cpu0, t0 = children_cpu(), time.perf_counter()
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", COLUMNS="160")
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from tuneproof.cli import main; main()",
            "preflight",
            "--study",
            str(study),
            "--data",
            a.data,
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    wall, cpu = time.perf_counter() - t0, children_cpu() - cpu0
    load_after = os.getloadavg()
    if proc.returncode not in (0, 3):
        print(proc.stdout[-3000:], proc.stderr[-3000:])
        return proc.returncode

    result = collect(study, a.fast, proc.returncode, wall, cpu, load_before, load_after)
    print_result(result)
    if a.doc:
        append_doc(Path(a.doc), result)
        print(f"appended to {a.doc}")
    return 0


def collect(study: Path, fast: bool, exit_code: int, wall: float, cpu: float, load_before, load_after) -> dict:
    """The numbers of the latest preflight run of ``study`` (see the module docstring)."""
    import torch  # noqa: PLC0415

    from tuneproof.registry import Registry  # noqa: PLC0415

    reg = Registry(study)
    rec = max([r for r in reg.list(kind="preflight")], key=lambda r: r.seq)
    report = json.loads((study / "runs" / rec.id / "preflight.json").read_text())
    checks = {c["name"]: c for c in report["checks"]}
    return {
        "study": "quickstart --fast" if fast else "default extraction template (tuneproof init --task extraction)",
        "run": rec.id,
        "status": rec.status,
        "exit_code": exit_code,
        "wall_seconds": round(wall, 1),
        "cpu_seconds": round(cpu, 1),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in load_after],
        "cores": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, torch {torch.__version__}",
        "checks": [(c["name"], c["passed"], c.get("seconds")) for c in report["checks"]],
        "smoke": (checks.get("smoke pass") or {}).get("details") or {},
        "memory": memory_rows(checks),
        "throughput": (checks.get("throughput") or {}).get("numbers", {}),
        "config": json.loads((study / "runs" / rec.id / "config.json").read_text())["training"],
    }


def print_result(r: dict) -> None:
    print(
        f"preflight {r['run']}: {r['status']} (exit {r['exit_code']}) in "
        f"{r['wall_seconds']:.1f} s wall, {r['cpu_seconds']:.1f} s CPU; "
        f"load average {r['load_before'][0]:.1f} before, {r['load_after'][0]:.1f} after, on {r['cores']} cores"
    )
    for name, ok, secs in r["checks"]:
        print(f"  {name:26s} {str(ok):5s} {secs:7.1f} s")
    for m in r["memory"]:
        e2 = m["error_in_step_vs_step_peak"]
        print(
            f"  memory L{m['length']} x{m['micro_batch']}: estimate {m['estimate_total'] / GIB:.3f} GiB (in-step parts "
            f"{m['estimate_in_step'] / GIB:.3f}), measured peak {m['peak'] / GIB:.3f} GiB (step adds "
            f"{(m['step_peak'] or 0) / GIB:.3f}); error total/peak {m['error_total_vs_peak']:+.1%}, in-step/step-peak "
            + (f"{e2:+.1%}" if e2 is not None else "n/a")
            + (
                f"; the step's tensors {m['tensors'] / GIB:.3f} GiB, x"
                f"{m['tensors_over_estimate']:.3f} of the estimate's step part"
                if m.get("tensors") and m.get("tensors_over_estimate")
                else ""
            )
        )
    th = r["throughput"]
    if th:
        print(
            f"  throughput: {th.get('s_per_step')} s/step, {th.get('tokens_per_s')} "
            f"tokens/s, budget {th.get('total_steps')} steps "
            f"= {th.get('budget_seconds')} s; eval {th.get('eval_s_per_example')} s/example x {th.get('eval_examples')}"
        )


HEADER = """# Benchmark: `tuneproof preflight`

Run by hand, not in the tests; each run appends a section below:

```
python benchmarks/preflight.py --doc docs/benchmarks-preflight.md          # the default SmolLM2 extraction study
python benchmarks/preflight.py --fast --doc docs/benchmarks-preflight.md   # the quickstart --fast study
```

The time is the whole command `tuneproof preflight --study DIR --data ../shared/data` (process start
to exit), CPU time includes its fresh-process reload child. On CPU the measured memory peak is the
resident set of the whole process (interpreter, libraries, tokenizer, the copies the preflight keeps
to restore the model), so the total-vs-peak error mostly measures that overhead; the comparable pair
is what one step adds to the resident memory against the estimate's parts a step allocates once the
optimizer states exist (gradients, optimizer temporary, activations, logits).
"""


def append_doc(path: Path, r: dict) -> None:
    """Append one run's section to the Markdown file ``path`` (created with :data:`HEADER` if missing)."""
    # the run itself adds up to 2 to the load (torch's 2 threads): other jobs show as load before it, or above cores + 1
    # after
    shared = r["load_before"][0] > 1.0 or r["load_after"][0] > (r["cores"] or 1) + 1
    cfg = r["config"]
    lines = [
        "",
        f"## {r['date']}: {r['study']}",
        "",
        f"{r['machine']}, CPU only. SmolLM2-135M-Instruct + LoRA on SNIPS "
        f"extraction, micro-batch {cfg['micro_batch_size']}, "
        f"accumulation {cfg['gradient_accumulation_steps']}, max_length "
        f"{cfg['max_length']}, precision {cfg['precision']}, "
        f"activation checkpointing {'on' if cfg['activation_checkpointing'] else 'off'}, {cfg['max_steps']} steps.",
        "",
        f"**{r['wall_seconds']:.0f} s wall**, {r['cpu_seconds']:.0f} s CPU; run "
        f"{r['run']} {r['status']} (exit {r['exit_code']}). "
        f"Load average {r['load_before'][0]:.1f} before, {r['load_after'][0]:.1f} after, on {r['cores']} cores"
        + (
            ": **the machine was shared with other jobs** (other engineers' test suites); under contention torch's "
            "2 OpenMP threads wait on each other in every small kernel, so "
            "generation and small probes slow down far more "
            "than the load average suggests."
            if shared
            else " (quiet machine)."
        ),
        "",
        "| check | passed | wall seconds |",
        "|---|---|---:|",
    ]
    lines += [f"| {n} | {ok} | {s:.1f} |" for n, ok, s in r["checks"]]
    sm = r.get("smoke") or {}
    if sm.get("child_load_seconds") is not None:
        lines += [
            "",
            f"Fresh-process reload: {sm['child_load_seconds']:.1f} s to import and load base + adapter, "
            f"{sm['child_predict_seconds']:.1f} s to predict the 2 smoke examples again.",
        ]
    if r["memory"]:
        lines += [
            "",
            "| length x micro-batch | estimate (sum of parts) | estimate, the "
            "step's part | measured: the step's tensors | "
            "tensors / the step's part | measured peak (RSS) | measured step increment (RSS) | error: total vs peak |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for m in r["memory"]:
            t, q = m.get("tensors"), m.get("tensors_over_estimate")
            lines.append(
                f"| {m['length']} x {m['micro_batch']} | {m['estimate_total'] / GIB:.3f} GiB | "
                f"{m['estimate_in_step'] / GIB:.3f} GiB | "
                + (f"{t / GIB:.3f} GiB | {q:.3f} | " if t and q else "- | - | ")
                + f"{m['peak'] / GIB:.3f} GiB | {(m['step_peak'] or 0) / GIB:.3f} "
                f"GiB | {m['error_total_vs_peak']:+.0%} |"
            )
        parts = r["memory"][0]["parts"]
        lines += [
            "",
            "Estimate parts at the first length (GiB): "
            + ", ".join(f"{k.removesuffix('_bytes').replace('_', ' ')} {v / GIB:.3f}" for k, v in parts.items())
            + ".",
        ]
    th = r["throughput"]
    if th:
        lines += [
            "",
            f"Throughput measured by the preflight: {th.get('s_per_step')} s "
            f"per optimizer step, {th.get('tokens_per_s')} "
            f"tokens/s at micro-batch {th.get('micro_batch')} x {th.get('accumulation')}; the configured budget of "
            f"{th.get('total_steps')} steps {th.get('budget_seconds')} s; "
            f"evaluation {th.get('eval_s_per_example')} s per "
            f"example (measured on 2), {th.get('eval_seconds_estimate')} s for {th.get('eval_examples')} examples.",
        ]
    text = path.read_text() if path.exists() else HEADER
    path.write_text(text.rstrip("\n") + "\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
