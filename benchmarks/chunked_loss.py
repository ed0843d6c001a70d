"""Benchmark: peak memory of one training step with the chunked causal-LM loss vs the reference
(full ``[batch, seq, vocab]`` logits), docs/PROTOCOL.md step 5. Target: at least 25 % lower at max_length 512.

Run by hand:  python benchmarks/chunked_loss.py [--max-length 512] [--micro-batch 4] [--loss full_sequence]

Real SmolLM2-135M-Instruct (alias smollm2-135m-instruct, vocabulary 49,152) + LoRA r16 on
q/k/v/o, fp32 on the CPU; SNIPS training texts packed to exactly ``--max-length`` tokens so every
row is full. Each mode runs in its own fresh process (the CPU high-water mark is per process) and
measures one whole step (forward, loss, backward, AdamW step) with
``tuneproof.training.memory.measure_step_peak`` (glibc's mmap threshold fixed, ``MALLOC_ENV``); before that,
``check_chunked_loss`` proves the two losses and gradients equal on the same micro-batch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from common import MALLOC_ENV, full_rows, smollm2_lora, snips_examples  # benchmarks/common.py


def _one(mode: str, max_length: int, micro_batch: int, loss: str) -> dict:
    import torch

    from tuneproof.training.loss import check_chunked_loss, chunked_token_loss_sum, token_loss_sum
    from tuneproof.training.memory import measure_step_peak

    _, tok, model = smollm2_lora()
    batch = full_rows(tok, [e.text for e in snips_examples()[:400]], micro_batch, max_length, loss)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    out = {"mode": mode}
    if mode == "chunked":
        check = check_chunked_loss(model, batch)
        out["check"] = {k: check[k] for k in ("passed", "loss_rel_diff", "grad_max_rel_diff", "tensors")}

    def step():
        if mode == "chunked":
            loss = chunked_token_loss_sum(model, batch["input_ids"], batch["attention_mask"], batch["labels"])
        else:
            loss = token_loss_sum(
                model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits, batch["labels"]
            )
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # warm-up: optimizer state allocated, kernels chosen
    m = measure_step_peak(step)
    out.update(step_peak_gib=m["step_peak_bytes"] / 2**30, method=m["method"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--loss", choices=["full_sequence", "answer_only"], default="full_sequence")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(_one(a.child, a.max_length, a.micro_batch, a.loss)))
        return
    res = {}
    for mode in ("reference", "chunked"):
        proc = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                mode,
                "--max-length",
                str(a.max_length),
                "--micro-batch",
                str(a.micro_batch),
                "--loss",
                a.loss,
            ],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, **MALLOC_ENV},
        )
        res[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(
            f"{mode:9s}: step peak {res[mode]['step_peak_gib']:.3f} GiB ({res[mode]['method']})"
            + (f"; check {res[mode]['check']}" if "check" in res[mode] else "")
        )
    drop = 1 - res["chunked"]["step_peak_gib"] / res["reference"]["step_peak_gib"]
    print(
        f"max_length {a.max_length}, micro-batch {a.micro_batch}, {a.loss}: peak step "
        f"memory {100 * drop:.1f}% lower with the chunked loss"
    )


if __name__ == "__main__":
    main()
