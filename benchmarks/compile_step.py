"""Benchmark: ``training.compile`` (torch.compile of the decoder) on the quickstart's shape: compile
seconds, seconds per micro-batch eager vs compiled, tokens/s and the break-even point.

Run by hand:  TUNEPROOF_DATA=/work/shared/data python benchmarks/compile_step.py [--rounds 6] [--micro-batch 8]
              [--max-length 144] [--backend inductor] [--out FILE.json]

Real SmolLM2-135M-Instruct + LoRA r16 / alpha 32 / dropout 0.05 on q/k/v/o (the extraction template the
quickstart writes), fp32 on the CPU, SNIPS training examples through tuneproof's preprocessing at
max_length 144, micro-batch 8. First the check the loop runs (``training.compiled.prove_compile`` on the
first micro-batch: compiled vs eager loss and gradients, compile seconds of both graphs, the break-even
point); then ``--rounds`` rounds, each one eager and one compiled forward + backward of the same
micro-batch (the next SNIPS micro-batch each round, so lengths vary as in training and the dynamic
graph is reused), the order alternating per round so load drift hits both. tokens/s = real tokens of the
round's micro-batch / its seconds; the median over rounds and the min-max are printed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
from pathlib import Path

import torch

from common import SNIPS_SYSTEM, smollm2_lora, snips_examples  # benchmarks/common.py (puts src/ on sys.path)
from tuneproof.data.preprocess import TextPipeline, collate  # noqa: E402
from tuneproof.study import Prompt  # noqa: E402
from tuneproof.training.compiled import prove_compile  # noqa: E402
from tuneproof.training.loop import _micro_loss  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6, help="eager/compiled pairs after the check")
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--max-length", type=int, default=144)
    ap.add_argument("--planned-micro-batches", type=int, default=40, help="the quickstart: 40 steps x accumulation 1")
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    load = os.getloadavg()
    _, tok, model = smollm2_lora(dropout=0.05)
    pool = [e for e in snips_examples() if e.split == "train"][: a.micro_batch * (a.rounds + 1)]
    enc = TextPipeline(tok, Prompt(system=SNIPS_SYSTEM), a.max_length).encode_all(pool)
    pad = tok.pad_token_id
    batches = [collate(enc[i : i + a.micro_batch], pad) for i in range(0, len(enc), a.micro_batch)]

    def loss_fn(m, b):
        return _micro_loss(m, b, contextlib.nullcontext)

    t = time.perf_counter()
    check = prove_compile(
        model,
        batches[0],
        loss_fn,
        low_precision=False,
        planned_micro_batches=a.planned_micro_batches,
        backend=a.backend,
    )
    check_s = time.perf_counter() - t
    target = check.pop("compiled")
    compiled_impl = target._compiled_call_impl
    model.train()
    rows = {"eager": [], "compiled": []}
    for r, batch in enumerate(batches[1:]):
        tokens = int(batch["attention_mask"].sum())
        for mode in ("eager", "compiled") if r % 2 == 0 else ("compiled", "eager"):
            target._compiled_call_impl = compiled_impl if mode == "compiled" else None
            model.zero_grad(set_to_none=True)
            t = time.perf_counter()
            loss, _ = loss_fn(model, batch)
            loss.backward()
            rows[mode].append(tokens / (time.perf_counter() - t))
    out = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_average_at_start": [round(x, 2) for x in load],
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "shape": {"micro_batch": a.micro_batch, "max_length": a.max_length, "backend": a.backend},
        "check": check,
        "check_seconds": round(check_s, 1),
        "tokens_per_s": {
            m: {"median": round(statistics.median(v), 1), "min": round(min(v), 1), "max": round(max(v), 1)}
            for m, v in rows.items()
            if v
        },
    }
    text = json.dumps(out, indent=2, default=str)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
