"""Benchmark: peak memory of one training step with the frozen base weights held in bf16
(``training.bf16_base_weights``) vs in fp32, both under bf16 autocast; docs/PROTOCOL.md step 5.

Run by hand:  python benchmarks/bf16_base.py [--max-length 512] [--micro-batch 4] [--loss full_sequence]

Real SmolLM2-135M-Instruct (alias smollm2-135m-instruct) + LoRA r16 on q/k/v/o, bf16 autocast on
the CPU (needs native bf16: AVX512-BF16 or AMX, as tuneproof requires for the key); SNIPS training
texts packed to exactly ``--max-length`` tokens so every row is full. Each mode runs in its own
fresh process (the CPU high-water mark is per process; glibc's mmap threshold fixed, ``MALLOC_ENV``) and measures one
whole step (forward, loss, backward, AdamW step) after one warm-up step, with
``tuneproof.training.memory.measure_step_peak``: ``peak`` is the process's peak resident set during the step (the
weights included), ``step peak`` what the step added over the resident set before it. In the bf16 process,
``tuneproof.training.speedups.check_bf16_base`` first proves loss and LoRA gradients equal to fp32
frozen weights on the same micro-batch (it casts the model), and its numbers are printed.
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

    from tuneproof.training.loss import token_loss_sum
    from tuneproof.training.memory import measure_step_peak
    from tuneproof.training.speedups import check_bf16_base

    _, tok, model = smollm2_lora()
    batch = full_rows(tok, [e.text for e in snips_examples()[:400]], micro_batch, max_length, loss)

    def autocast():
        return torch.autocast(device_type="cpu", dtype=torch.bfloat16)

    def loss_sum(m, b):
        with autocast():
            return token_loss_sum(
                m(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits, b["labels"]
            ), 0

    out = {"mode": mode}
    if mode == "bf16":
        check = check_bf16_base(model, batch, loss_sum)
        out["check"] = {
            k: check[k]
            for k in ("passed", "loss_fp32", "loss_bf16", "loss_rel_diff", "grad_rel_l2", "grad_cosine", "tensors")
        }
        out["cast"] = check["cast"]
        out["check_memory"] = check["memory"]
    frozen = [p for p in model.parameters() if not p.requires_grad]
    out["frozen_dtypes"] = sorted({str(p.dtype) for p in frozen})
    out["trainable_dtypes"] = sorted({str(p.dtype) for p in model.parameters() if p.requires_grad})
    out["frozen_bytes"] = sum(p.numel() * p.element_size() for p in frozen)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    count = int((batch["labels"][:, 1:] != -100).sum())

    def step():
        loss, _ = loss_sum(model, batch)
        (loss / count).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # warm-up: optimizer state allocated, kernels chosen
    m = measure_step_peak(step)
    out.update(
        peak_gib=m["peak_bytes"] / 2**30,
        step_peak_gib=m["step_peak_bytes"] / 2**30,
        baseline_gib=m["baseline_bytes"] / 2**30,
        seconds=m["seconds"],
        method=m["method"],
    )
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
    for mode in ("fp32", "bf16"):
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
        res[mode] = r = json.loads(proc.stdout.strip().splitlines()[-1])
        print(
            f"{mode} frozen: peak {r['peak_gib']:.3f} GiB, step peak "
            f"{r['step_peak_gib']:.3f} GiB (resident before the step "
            f"{r['baseline_gib']:.3f} GiB); frozen weights "
            f"{r['frozen_bytes'] / 2**20:.1f} MiB {r['frozen_dtypes']}, trained "
            f"{r['trainable_dtypes']} ({r['method']})" + (f"\n  check {r['check']}" if "check" in r else "")
        )
    drop = res["fp32"]["peak_gib"] - res["bf16"]["peak_gib"]
    saved = (res["fp32"]["frozen_bytes"] - res["bf16"]["frozen_bytes"]) / 2**30
    print(
        f"max_length {a.max_length}, micro-batch {a.micro_batch}, {a.loss}: "
        f"peak {drop:.3f} GiB lower with bf16 frozen weights "
        f"({100 * drop / res['fp32']['peak_gib']:.1f}%; the frozen weights alone hold {saved:.3f} GiB less); step peak "
        f"{res['fp32']['step_peak_gib']:.3f} -> {res['bf16']['step_peak_gib']:.3f} GiB"
    )


if __name__ == "__main__":
    main()
