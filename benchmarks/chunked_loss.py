"""Benchmark: peak memory of one training step with the chunked causal-LM loss vs the reference
(full ``[batch, seq, vocab]`` logits), issue 15 item 3. Target: at least 25 % lower at max_length 512.

Run by hand:  python benchmarks/chunked_loss.py [--max-length 512] [--micro-batch 4] [--loss full_sequence]

Real SmolLM2-135M-Instruct (alias smollm2-135m-instruct, vocabulary 49,152) + LoRA r16 on
q/k/v/o, fp32 on the CPU; SNIPS training texts packed to exactly ``--max-length`` tokens so every
row is full. Each mode runs in its own fresh process (the CPU high-water mark is per process) and
measures one whole step (forward, loss, backward, AdamW step) with
``tuneproof.preflight.memory.measure_step_peak`` (glibc's mmap threshold fixed, ``MALLOC_ENV``); before that, ``check_chunked_loss`` proves the
two losses and gradients equal on the same micro-batch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

#: glibc raises its mmap threshold (up to 32 MiB) each time a large block is freed, so after the
#: warm-up step the freed activations stay resident in the heap and the next step's high-water mark
#: is mostly the warm-up's: the reference measured 4.22 GiB that way, 2.95 GiB with the threshold
#: fixed. A fixed threshold (mallopt(3) M_MMAP_THRESHOLD / M_TRIM_THRESHOLD, set through glibc's
#: environment tunables) returns every block above 128 KiB to the system when it is freed.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}


def _one(mode: str, max_length: int, micro_batch: int, loss: str) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model

    from tuneproof.data.locate import find_data_root
    from tuneproof.data.sources import load_snips
    from tuneproof.models.base import load_model, load_tokenizer, resolve_base
    from tuneproof.preflight.memory import measure_step_peak
    from tuneproof.study import ModelSpec
    from tuneproof.training.loss import check_chunked_loss, chunked_token_loss_sum, token_loss_sum

    torch.manual_seed(0)
    ref = resolve_base(ModelSpec(base="smollm2-135m-instruct"))
    tok = load_tokenizer(ref)
    model = get_peft_model(load_model(ref, "causal-lm"), LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], lora_dropout=0.0))
    examples, _ = load_snips(find_data_root(None, "snips") / "snips")
    ids = tok(" ".join(e.text for e in examples[:400]), add_special_tokens=False)["input_ids"]
    rows = torch.tensor(ids[: micro_batch * max_length]).view(micro_batch, max_length)
    labels = rows.clone()
    if loss == "answer_only":
        labels[:, : max_length * 3 // 4] = -100  # the last quarter of each row supervised, like an answer
    batch = {"input_ids": rows, "attention_mask": torch.ones_like(rows), "labels": labels}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    out = {"mode": mode}
    if mode == "chunked":
        check = check_chunked_loss(model, batch)
        out["check"] = {k: check[k] for k in ("passed", "loss_rel_diff", "grad_max_rel_diff", "tensors")}

    def step():
        if mode == "chunked":
            l = chunked_token_loss_sum(model, batch["input_ids"], batch["attention_mask"], batch["labels"])
        else:
            l = token_loss_sum(model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits, batch["labels"])
        l.backward()
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
        proc = subprocess.run([sys.executable, __file__, "--child", mode, "--max-length", str(a.max_length),
                               "--micro-batch", str(a.micro_batch), "--loss", a.loss], capture_output=True, text=True, check=True,
                              env={**os.environ, **MALLOC_ENV})
        res[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{mode:9s}: step peak {res[mode]['step_peak_gib']:.3f} GiB ({res[mode]['method']})"
              + (f"; check {res[mode]['check']}" if "check" in res[mode] else ""))
    drop = 1 - res["chunked"]["step_peak_gib"] / res["reference"]["step_peak_gib"]
    print(f"max_length {a.max_length}, micro-batch {a.micro_batch}, {a.loss}: peak step memory {100 * drop:.1f}% lower with the chunked loss")


if __name__ == "__main__":
    main()
