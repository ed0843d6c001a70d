"""Benchmark: tuneproof's training step vs a plain PyTorch + PEFT loop vs transformers' Trainer
(the reference for every speed-up of docs/PROTOCOL.md step 5).

Run by hand:  TUNEPROOF_DATA=/work/shared/data python benchmarks/train_step.py [--steps 6] [--micro-batch 8]
              [--modes tuneproof,plain,trainer,tuneproof+length_grouping,tuneproof+packing]

One process, real SmolLM2-135M-Instruct (alias smollm2-135m-instruct) + LoRA r16 on q/k/v/o, fp32
on the CPU, SNIPS training examples encoded by tuneproof's own preprocessing (chat template, answer
-only labels, max_length 128). Every mode starts from the same LoRA initialisation (seed 0) and
trains on *identical* micro-batches: the ones ``tuneproof.training.loop.train`` reads for steps
0..N-1 (``training.data_order.window_at``, accumulation 1):

- ``tuneproof``: ``training.loop.train`` itself (per-micro-batch loss sum / window tokens,
  backward, gradient-norm health check, clipping, AdamW step, scheduler), no registry run;
- ``plain``: the textbook loop: ``model(**batch).loss.backward(); clip; opt.step(); zero_grad``;
- ``trainer``: ``transformers.Trainer`` fed the same collated micro-batches in the same order;
- ``tuneproof+length_grouping`` / ``tuneproof+packing``: the same examples (the union of the
  micro-batches above) with ``training.length_grouping`` / ``training.packing`` on; tokens/s
  compares real (non-padding) tokens, so fewer padded positions show as a higher rate.

Step 1 of each mode is a warm-up and not counted; s/step is the median of the others. tokens/s
counts prompt + supervised tokens (attention mask), never padding. Ratios are relative to
``tuneproof``. On a shared CPU the numbers move by tens of percent between runs: compare the
modes of one run, not runs.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from pathlib import Path

import torch

from common import SNIPS_SYSTEM, smollm2_lora, snips_examples  # benchmarks/common.py (puts src/ on sys.path)
from tuneproof.data.preprocess import TextPipeline, collate  # noqa: E402
from tuneproof.modalities import detect_kind  # noqa: E402
from tuneproof.models.base import load_tokenizer, resolve_base  # noqa: E402
from tuneproof.study import ModelSpec, Prompt, Training  # noqa: E402
from tuneproof.training.data_order import window_at  # noqa: E402


def _tuneproof(model, encoded, cfg, pad_id) -> list[float]:
    from tuneproof.training.loop import train  # noqa: PLC0415

    stamps = [time.perf_counter()]
    train(
        model,
        encoded,
        cfg,
        pad_id=pad_id,
        device=torch.device("cpu"),
        autocast=contextlib.nullcontext,
        progress=lambda step, total, loss: stamps.append(time.perf_counter()),
    )
    return [b - a for a, b in zip(stamps, stamps[1:])]


def _plain(model, batches, lr) -> list[float]:
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    model.train()
    times = []
    for b in batches:
        t = time.perf_counter()
        loss = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t)
    return times


def _trainer(model, batches, lr, tmp: Path) -> list[float]:
    from torch.utils.data import SequentialSampler  # noqa: PLC0415
    from transformers import Trainer, TrainerCallback, TrainingArguments  # noqa: PLC0415

    class Pre(torch.utils.data.Dataset):  # one item = one already collated micro-batch, in order
        def __len__(self):
            return len(batches)

        def __getitem__(self, i):
            return batches[i]

    class InOrder(Trainer):
        def _get_train_sampler(self, *args, **kwargs):
            return SequentialSampler(self.train_dataset)

    stamps: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            stamps.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            stamps[-1] = time.perf_counter() - stamps[-1]

    args = TrainingArguments(
        output_dir=str(tmp),
        max_steps=len(batches),
        per_device_train_batch_size=1,
        learning_rate=lr,
        lr_scheduler_type="linear",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        save_strategy="no",
        report_to=[],
        logging_strategy="no",
        use_cpu=True,
        dataloader_num_workers=0,
        remove_unused_columns=False,
        disable_tqdm=True,
        seed=0,
    )
    InOrder(
        model=model, args=args, train_dataset=Pre(), data_collator=lambda items: items[0], callbacks=[Clock()]
    ).train()
    return stamps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6, help="optimizer steps per mode (the first is a warm-up)")
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--modes", default="tuneproof,plain,trainer")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    import tempfile  # noqa: PLC0415

    ref = resolve_base(ModelSpec(base="smollm2-135m-instruct"), detect_kind)
    tok = load_tokenizer(ref)
    train_ex = [e for e in snips_examples() if e.split == "train"][:2000]
    pipe = TextPipeline(tok, Prompt(system=SNIPS_SYSTEM), 128)
    encoded = pipe.encode_all(train_ex)
    cfg = Training(max_steps=a.steps, micro_batch_size=a.micro_batch, learning_rate=2e-4, seed=0)
    # the micro-batches tuneproof reads for steps 0..N-1: every mode gets exactly these
    idx = [window_at(len(encoded), a.micro_batch, 1, cfg.seed, s)[0] for s in range(a.steps)]
    batches = [collate([encoded[i] for i in ix], tok.pad_token_id) for ix in idx]
    subset = [encoded[i] for ix in idx for i in ix]  # the same examples, for the grouping/packing modes
    real = [int(b["attention_mask"].sum()) for b in batches]
    padded = sum(b["attention_mask"].numel() for b in batches)
    print(
        f"SmolLM2-135M-Instruct + LoRA r16 q/k/v/o, fp32 CPU, torch threads {torch.get_num_threads()}, "
        f"{a.steps} steps x micro-batch {a.micro_batch} (first step not counted); "
        f"real tokens {sum(real)}, padded positions {padded - sum(real)} ("
        f"{100 * (1 - sum(real) / padded):.1f}% padding)"
    )
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in a.modes.split(","):
            model = smollm2_lora()[2]  # every mode from the same LoRA initialisation
            if mode == "tuneproof":
                times, tokens = _tuneproof(model, encoded, cfg, tok.pad_token_id), real
            elif mode.startswith("tuneproof+"):
                key = mode.split("+", 1)[1]
                # the same examples as a training set of exactly steps x micro-batch: one epoch of it
                c = cfg.model_copy(update={key: True, "max_steps": None, "epochs": 1.0})
                times = _tuneproof(model, subset, c, tok.pad_token_id)
                lens = [len(e.input_ids) for e in subset] if key == "length_grouping" else None
                tokens = [
                    sum(
                        len(subset[i].input_ids)
                        for i in window_at(len(subset), a.micro_batch, 1, 0, s, lengths=lens)[0]
                    )
                    for s in range(len(times))
                ]
            elif mode == "plain":
                times, tokens = _plain(model, batches, cfg.learning_rate), real
            elif mode == "trainer":
                times, tokens = _trainer(model, batches, cfg.learning_rate, Path(tmp)), real
            else:
                raise SystemExit(f"unknown mode {mode}")
            med = statistics.median(times[1:])
            res[mode] = (med, sum(tokens[1:]) / sum(times[1:]), len(times))
            print(f"{mode:28s} {med:7.3f} s/step  {res[mode][1]:8.1f} tokens/s  ({len(times)} steps)", flush=True)
            del model
    ref_tps = res.get("tuneproof", next(iter(res.values())))[1]
    print("ratios (tokens/s, vs tuneproof):")
    for mode, (med, tps, n) in res.items():
        print(
            f"{mode:28s} {med:7.3f} s/step  {tps:8.1f} tokens/s  x"
            f"{tps / ref_tps:.2f} tokens/s vs tuneproof  ({n} steps)"
        )


if __name__ == "__main__":
    main()
