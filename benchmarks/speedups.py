"""Benchmark: tokens/s of tuneproof's training step with each speed-up, modes interleaved step by
step so a shared CPU's drifting load hits every mode alike (docs/PROTOCOL.md step 5).

Run by hand:  TUNEPROOF_DATA=/work/shared/data python benchmarks/speedups.py [--steps 24] [--micro-batch 8]
              [--modes reference,length_grouping,packing,chunked_loss,length_grouping+chunked_loss,packing+chunked_loss]

Real SmolLM2-135M-Instruct (alias smollm2-135m-instruct) + LoRA r16 on q/k/v/o, fp32 on the CPU,
SNIPS training examples through tuneproof's preprocessing (chat template, answer-only labels,
max_length 128). Every mode holds its own copy of the model from the same LoRA initialisation
(seed 0) and trains on the *same* ``steps x micro-batch`` examples, one epoch of them:

- ``reference``: the seeded shuffled micro-batches ``training.loop.train`` reads (``window_at``),
  right-padded to the longest example (``collate``);
- ``length_grouping``: the same examples in the length-grouped order (``training.length_grouping``);
- ``packing``: the reference micro-batches, each packed into one row (``collate_packed`` at the
  default ``training.packing_length``, micro-batch x max_length);
- ``chunked_loss``: the reference micro-batches, the loss over supervised positions only
  (``training.chunked_loss``: the output head runs on the answer tokens, not on every position);
- ``A+B``: both.

Each step is ``_micro_loss`` (the loop's own function) -> ``(sum / tokens).backward()`` -> clip ->
AdamW step, the same as ``training.loop.train`` with accumulation 1. Round ``s`` runs step ``s``
of every mode, in an order rotated by one each round. tokens/s = real (prompt + supervised)
tokens of the epoch / the mode's summed step time, the first round not counted (warm-up). Every
mode sees the same real tokens, so its ratio to ``reference`` is a ratio of times. The per-token
loss of the whole epoch at the initial weights is computed first in every layout and printed
against the reference's: it must be the same (nothing but the layout changed).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
import time
from pathlib import Path

import torch

from common import SNIPS_SYSTEM, smollm2_lora, snips_examples  # benchmarks/common.py (puts src/ on sys.path)
from tuneproof.data.preprocess import TextPipeline, collate, collate_packed  # noqa: E402
from tuneproof.study import Prompt  # noqa: E402
from tuneproof.training.data_order import window_at  # noqa: E402
from tuneproof.training.loop import _micro_loss  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--steps",
        type=int,
        default=24,
        help="steps per mode (one epoch of steps x micro-batch examples; the first is a warm-up)",
    )
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument(
        "--modes",
        default="reference,length_grouping,packing,chunked_loss,length_grouping+chunked_loss,packing+chunked_loss",
    )
    ap.add_argument("--packing-length", type=int, default=0, help="tokens per packed row (0: micro-batch x max-length)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    _, tok, base = smollm2_lora()
    pool = [e for e in snips_examples() if e.split == "train"][:4000]
    pipe = TextPipeline(tok, Prompt(system=SNIPS_SYSTEM), a.max_length)
    enc_pool = pipe.encode_all(pool)
    n = a.steps * a.micro_batch
    g = torch.Generator().manual_seed(0)
    subset = [enc_pool[i] for i in torch.randperm(len(enc_pool), generator=g)[:n].tolist()]
    lengths = [len(e.input_ids) for e in subset]
    pad = tok.pad_token_id

    def batches_for(mode: str) -> list[dict]:
        grouped = "length_grouping" in mode
        out = []
        for s in range(a.steps):
            idx = window_at(n, a.micro_batch, 1, 0, s, lengths=lengths if grouped else None)[0]
            ex = [subset[i] for i in idx]
            out.append(
                collate_packed(ex, pad, a.packing_length or a.micro_batch * a.max_length)
                if "packing" in mode
                else collate(ex, pad)
            )
        return out

    modes = a.modes.split(",")
    # nothing else changed: at the initial weights, every layout gives the epoch the same per-token loss
    same = {}
    with torch.no_grad():
        for m in modes:
            total = tokens = 0.0
            for b in batches_for(m):
                loss_sum, _ = _micro_loss(base, b, contextlib.nullcontext, "chunked_loss" in m)
                total += float(loss_sum)
                tokens += int((b["labels"][:, 1:] != -100).sum())
            same[m] = total / tokens
    print(
        "per-token loss of the epoch at the initial weights: "
        + ", ".join(f"{m} {v:.7f} (diff {v - same[modes[0]]:+.1e})" for m, v in same.items()),
        flush=True,
    )
    state = {}
    for m in modes:
        model = copy.deepcopy(base)
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        state[m] = {
            "model": model,
            "params": params,
            "opt": torch.optim.AdamW(params, lr=2e-4, weight_decay=0.0),
            "batches": batches_for(m),
            "times": [],
            "losses": [],
        }
    del base
    real = sum(lengths)
    for m in modes:
        bs = state[m]["batches"]
        pos = sum(int(b["input_ids"].numel()) for b in bs)
        state[m]["positions"] = pos
        print(
            f"{m:32s} positions {pos:6d}  padding {100 * (1 - real / pos):5.1f} %  "
            f"rows {sum(b['input_ids'].shape[0] for b in bs)}"
        )
    print(
        "SmolLM2-135M-Instruct + LoRA r16 q/k/v/o, fp32 CPU, torch threads "
        f"{torch.get_num_threads()}, {a.steps} steps x "
        f"micro-batch {a.micro_batch}, {real} real tokens; rounds interleaved",
        flush=True,
    )
    for s in range(a.steps):
        order = modes[s % len(modes) :] + modes[: s % len(modes)]
        for m in order:
            st = state[m]
            b = st["batches"][s]
            t = time.perf_counter()
            loss_sum, _ = _micro_loss(st["model"], b, contextlib.nullcontext, "chunked_loss" in m)
            tokens = int((b["labels"][:, 1:] != -100).sum())
            (loss_sum / tokens).backward()
            torch.nn.utils.clip_grad_norm_(st["params"], 1.0)
            st["opt"].step()
            st["opt"].zero_grad(set_to_none=True)
            st["times"].append(time.perf_counter() - t)
            st["losses"].append(float(loss_sum.detach()) / tokens)
        if s == 0 or (s + 1) % 6 == 0:
            print(f"round {s + 1}/{a.steps} done", flush=True)
    res = {}
    for m in modes:
        st = state[m]
        real_counted = sum(int(b["attention_mask"].sum()) for b in st["batches"][1:])
        tt = sum(st["times"][1:])
        res[m] = {
            "s_per_step_median": statistics.median(st["times"][1:]),
            "tokens_per_s": real_counted / tt,
            "padding_share": 1 - real / st["positions"],
            "loss_step1": st["losses"][0],
            "loss_mean": statistics.fmean(st["losses"]),
            "time_s": tt,
            "epoch_loss_at_init": same[m],
            "epoch_loss_at_init_diff": same[m] - same[modes[0]],
        }
    ref_tps = res[modes[0]]["tokens_per_s"]
    print(f"{'mode':32s} {'s/step':>7s} {'tokens/s':>9s} {'ratio':>6s} {'padding':>8s} {'loss step 1':>12s}")
    for m, r in res.items():
        r["ratio_vs_reference"] = r["tokens_per_s"] / ref_tps
        print(
            f"{m:32s} {r['s_per_step_median']:7.3f} {r['tokens_per_s']:9.1f} x{r['ratio_vs_reference']:5.2f} "
            f"{100 * r['padding_share']:7.1f}% {r['loss_step1']:12.6f}"
        )
    if a.json:
        a.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()}, "results": res}, indent=1))


if __name__ == "__main__":
    main()
