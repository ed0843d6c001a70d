"""Benchmark: the preflight's step-memory estimate against the measured step (issue 15 item 6; run by hand).

    python benchmarks/memory_estimate.py [--lengths 128,512] [--micro-batches 2,8] [--loss answer_only]
                                         [--chunked] [--dropout 0.05] [--rows padded|full] [--doc
                                         docs/benchmarks-preflight.md]

Real SmolLM2-135M-Instruct (alias ``smollm2-135m-instruct``, the local copy) + LoRA r16 (alpha 32) on
q/k/v/o, fp32 on the CPU. Each shape (length x micro-batch) runs in its own fresh process, which

- encodes SNIPS training examples with tuneproof's own preprocessing (chat template, ``--loss``
  answer_only or full_sequence) at ``max_length`` = the length;
- builds the micro-batch the preflight's ``step memory`` check builds at that length
  (``preflight.step_memory.batch_at_length``: the real examples nearest the length, right-padded to it),
  or with ``--rows full`` rows of real text tokens with no padding (the last quarter of each row
  supervised under answer_only);
- takes the preflight's estimate (``preflight.step_memory.step_memory_estimate``, itemised) and ``--steps``
  complete steps of the preflight's ``StepRunner`` (forward, loss, backward, clipping, AdamW step; ``--chunked``: the
  chunked loss, as ``training.chunked_loss: true`` trains), each measured by
  ``training.memory.measure_step_peak``: the peak of the bytes the step's tensors hold (torch's
  CPU allocator, counted through the profiler's memory events) and the process resident set.

It prints, per shape, the estimate's parts, its in-step sum (gradients + optimizer temporary +
activations + loss), the measured step's tensors, their ratio, and the resident-set figures; with
``--doc`` it appends the table to that Markdown file.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from common import SNIPS_SYSTEM, full_rows, smollm2_lora, snips_examples  # benchmarks/common.py (puts src/ on sys.path)

MIB = 2**20


def _child(length: int, micro_batch: int, loss: str, chunked: bool, dropout: float, rows: str, steps: int) -> dict:
    import torch

    from tuneproof.data.preprocess import IGNORE_INDEX, TextPipeline
    from tuneproof.preflight.memory import in_step_bytes
    from tuneproof.preflight.step_memory import StepRunner, batch_at_length, step_memory_estimate
    from tuneproof.study import Prompt, Training
    from tuneproof.training.memory import measure_step_peak

    _, tok, model = smollm2_lora(dropout)
    train = [e for e in snips_examples() if e.split == "train"][:3000]
    if rows == "full":
        batch = full_rows(tok, [e.text for e in train[:2000]], micro_batch, length, loss)
    else:
        pipe = TextPipeline(tok, Prompt(system=SNIPS_SYSTEM), length, loss=loss)
        encoded = [e for e in pipe.encode_all(train) if not e.faults]
        batch = batch_at_length(encoded, micro_batch, length, tok.pad_token_id)
    cfg = Training(micro_batch_size=micro_batch, max_length=length, loss=loss, chunked_loss=chunked, learning_rate=2e-4)
    est = step_memory_estimate(model, micro_batch, length, "fp32", False, None, batch=batch, chunked_loss=chunked)
    stepper = StepRunner(model, cfg, contextlib.nullcontext)
    measured = [measure_step_peak(lambda: stepper.step(batch)) for _ in range(steps)]
    in_step = in_step_bytes(est)
    return {
        "length": length,
        "micro_batch": micro_batch,
        "loss": loss,
        "chunked": chunked,
        "dropout": dropout,
        "rows": rows,
        "padded_positions": int((batch["attention_mask"] == 0).sum()),
        "supervised": int((batch["labels"][:, 1:] != IGNORE_INDEX).sum()),
        "parts": [[p["part"], p["bytes"]] for p in est["parts"]],
        "estimate_total": est["total_bytes"],
        "estimate_in_step": in_step,
        "forward_end_extra": est.get("forward_end_extra_bytes"),
        "measured": [
            {
                k: m[k]
                for k in ("allocated_step_peak_bytes", "step_peak_bytes", "peak_bytes", "baseline_bytes", "seconds")
            }
            for m in measured
        ],
        "ratio": [m["allocated_step_peak_bytes"] / in_step for m in measured],
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }


def run_all(a: argparse.Namespace) -> list[dict]:
    out = []
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    for length in (int(x) for x in a.lengths.split(",")):
        for mb in (int(x) for x in a.micro_batches.split(",")):
            cmd = [
                sys.executable,
                __file__,
                "--child",
                f"{length}x{mb}",
                "--loss",
                a.loss,
                "--dropout",
                str(a.dropout),
                "--rows",
                a.rows,
                "--steps",
                str(a.steps),
            ]
            if a.chunked:
                cmd.append("--chunked")
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
            if proc.returncode != 0:
                print(proc.stdout[-2000:], proc.stderr[-4000:], file=sys.stderr)
                raise SystemExit(f"shape {length}x{mb} failed (exit {proc.returncode})")
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            r["wall_seconds"] = round(time.perf_counter() - t0, 1)
            out.append(r)
            m = r["measured"][-1]
            print(
                f"length {length} x micro-batch {mb}: estimate in-step "
                f"{r['estimate_in_step'] / MIB:,.1f} MiB, measured step tensors "
                f"{m['allocated_step_peak_bytes'] / MIB:,.1f} MiB (x"
                f"{r['ratio'][-1]:.3f}; first step x{r['ratio'][0]:.3f}), "
                f"process peak {m['peak_bytes'] / MIB:,.1f} MiB (step adds "
                f"{m['step_peak_bytes'] / MIB:,.1f}), {r['wall_seconds']} s",
                flush=True,
            )
    return out


def table(results: list[dict]) -> str:
    """The Markdown table: parts (MiB) per shape, then the totals, the measured step and the ratio."""
    heads = [f"{r['length']} x {r['micro_batch']}" for r in results]
    names: list[str] = []
    for r in results:
        for name, _ in r["parts"]:
            if name not in names:
                names.append(name)
    lines = ["| MiB (2**20 bytes) | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(heads)]

    def row(label: str, vals: list) -> None:
        lines.append(f"| {label} | " + " | ".join("-" if v is None else v for v in vals) + " |")

    names = sorted(names, key=lambda n, order=list(names): (n.startswith("loss:"), order.index(n)))
    for name in names:
        vals = [dict(r["parts"]).get(name, 0) for r in results]
        if any(vals):
            row(name, [f"{v / MIB:,.1f}" for v in vals])
    two = all(len(r["measured"]) > 1 for r in results)
    last = lambda xs, f: f"{f(xs[-1])}; {f(xs[0])}" if two else f(xs[-1])  # noqa: E731
    when = " (last step; first step)" if two else ""
    if any(r.get("forward_end_extra") for r in results):
        row(
            "forward end instead of the loss: KV cache k/v before repetition + last MLP product",
            [f"{(r.get('forward_end_extra') or 0) / MIB:,.1f}" for r in results],
        )
    row("**estimate, total** (all parts at once)", [f"{r['estimate_total'] / MIB:,.1f}" for r in results])
    row(
        "**estimate, the step's part**: max(activations + max(loss, forward end), gradients + optimizer temporary)",
        [f"**{r['estimate_in_step'] / MIB:,.1f}**" for r in results],
    )
    row(
        "**measured: the step's tensors at the peak** (CPU allocator)" + when,
        [last(r["measured"], lambda m: f"**{m['allocated_step_peak_bytes'] / MIB:,.1f}**") for r in results],
    )
    row("**measured / estimate**" + when, [last(r["ratio"], lambda x: f"**{x:.3f}**") for r in results])
    row(
        "measured: process peak RSS" + when,
        [last(r["measured"], lambda m: f"{m['peak_bytes'] / MIB:,.1f}") for r in results],
    )
    row(
        "measured: RSS increment of the step" + when,
        [last(r["measured"], lambda m: f"{m['step_peak_bytes'] / MIB:,.1f}") for r in results],
    )
    row("padded positions / supervised tokens", [f"{r['padded_positions']} / {r['supervised']}" for r in results])
    row("seconds per step (profiled)", [f"{r['measured'][-1]['seconds']:.1f}" for r in results])
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="128,512")
    ap.add_argument("--micro-batches", default="2,8")
    ap.add_argument("--loss", choices=["answer_only", "full_sequence"], default="answer_only")
    ap.add_argument("--chunked", action="store_true", help="training.chunked_loss: true")
    ap.add_argument("--dropout", type=float, default=0.05, help="LoRA dropout (the study default 0.05)")
    ap.add_argument(
        "--rows",
        choices=["padded", "full"],
        default="padded",
        help="padded: the preflight's micro-batch at that length; full: rows of real text, no padding",
    )
    ap.add_argument(
        "--steps", type=int, default=1, help="measured steps per shape (the allocator count is the same at every step)"
    )
    ap.add_argument("--doc", default=None, help="append the table to this Markdown file")
    ap.add_argument("--json", default=None, help="write the raw results to this JSON file")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        length, mb = (int(x) for x in a.child.split("x"))
        print(json.dumps(_child(length, mb, a.loss, a.chunked, a.dropout, a.rows, a.steps)))
        return
    load = os.getloadavg()
    t0 = time.perf_counter()
    results = run_all(a)
    md = table(results)
    print(md)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    if a.doc:
        import torch  # noqa: PLC0415

        argv, skip = [], False
        for x in sys.argv[1:]:  # the command without --doc / --json and their values
            if skip or x in ("--doc", "--json"):
                skip = not skip and x in ("--doc", "--json")
                continue
            argv.append(x)
        cmd = "python benchmarks/memory_estimate.py " + " ".join(argv)
        head = (
            f"\n## {time.strftime('%Y-%m-%d %H:%M')} UTC: memory estimate vs measured step, {a.loss}"
            f"{', chunked loss' if a.chunked else ''}, LoRA dropout {a.dropout:g}, {a.rows} rows\n\n"
            f"`{cmd}`: {platform.machine()}, {os.cpu_count()} cores, Python "
            f"{platform.python_version()}, torch {torch.__version__}, CPU fp32, torch threads {results[0]['threads']}; "
            "SmolLM2-135M-Instruct + LoRA r16 on q/k/v/o; one fresh process per "
            f"shape; load average {load[0]:.1f} at the start; "
            f"{time.perf_counter() - t0:.0f} s in all.\n\n"
        )
        with open(a.doc, "a", encoding="utf-8") as fh:
            fh.write(head + md + "\n")
        print(f"appended to {a.doc}")


if __name__ == "__main__":
    main()
