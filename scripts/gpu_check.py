"""Preflight checks that need a real GPU; prints one JSON document on stdout.

Run from the repository root on the GPU machine:  python scripts/gpu_check.py [--quick]
Without a GPU it runs a tiny CPU dry run of the same code (to check the script itself).

Sections (each records its own error instead of stopping the script):
  env          environment_snapshot + platform_key
  backend      detect_device, choose_dtype for auto/bf16/fp16, check_extensions (no import)
  memory_fp32  / memory_bf16 / memory_autocast_bf16 (fp32 weights, bf16 autocast, as the trainer runs):
               one full AdamW step of a small random Llama (no download):
               memory between steps, estimate vs measured peak (steps 1 and 2), docs/CASES.md C8 inequality
  max_micro_batch  find_max_micro_batch with a 4 GiB budget on the bf16 model
  checkpointing    LoRA + reentrant checkpointing with the remedy: same grads, memory, time (docs/CASES.md C7)
  update_check     LoRA update check on the device (docs/CASES.md C7)

With ``--all`` (issue-sized: under 8 minutes on one GPU; never in CI) also, and it writes the document to
``docs/gpu-check-<device>.json`` (``--out PATH`` to choose; the CPU dry run writes to a temporary file
unless ``--out`` is given, so a dry run never lands in docs/):
  train_step       bf16 LoRA training step of a random Llama at SmolLM2-135M's shape: tuneproof's loop
                   (training.loop.train) vs a plain PEFT loop vs transformers' Trainer, the same micro-batches,
                   s/step and tokens/s (first step not counted)
  speedups_auto    training.speedups: auto on this device: static_rules, what resolve_auto chose and why, and
                   training.compile's check (compile seconds, eager vs compiled s/micro-batch, break-even)
  chunked_memory   peak of a bf16 LoRA forward + backward at 4 x 512 tokens with the full logits vs the chunked loss
  qlora            scripts/gpu_qlora_check.py in a child process (QLoRA vs bf16 LoRA peak), its JSON
  eval_batch       the eval batch-invariance check (docs/CASES.md C22) of greedy generation under bf16 autocast
  vllm             vLLM's greedy outputs vs transformers' on the same random model, when vllm imports
  nccl_world1      an nccl process group of world size 1 (gloo in the dry run): init, all_reduce, barrier

The memory estimate vs the measured peak is the ``memory_*`` sections above (always run).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
warnings.filterwarnings("ignore")

import torch  # noqa: E402

from tuneproof.models.device import choose_dtype, detect_device  # noqa: E402
from tuneproof.preflight.activation_checkpointing import check_activation_checkpointing  # noqa: E402
from tuneproof.preflight.backend import check_extensions  # noqa: E402
from tuneproof.preflight.envinfo import environment_snapshot, platform_key  # noqa: E402
from tuneproof.preflight.memory import (  # noqa: E402
    GIB,
    estimate_step_memory,
    find_max_micro_batch,
    memory_between_steps,
    side_by_side,
)
from tuneproof.preflight.update_check import check_update  # noqa: E402
from tuneproof.training.loss import token_loss_sum  # noqa: E402
from tuneproof.training.memory import measure_step_peak  # noqa: E402

QUICK = "--quick" in sys.argv
ALL = "--all" in sys.argv
OUT_PATH = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else None
DRY = not torch.cuda.is_available()
DEV = torch.device("cpu") if DRY else torch.device("cuda", 0)
out: dict = {"started": time.time()}


def section(name):
    def wrap(fn):
        t0 = time.perf_counter()
        try:
            out[name] = fn()
        except Exception as err:  # noqa: BLE001 - recorded, the script goes on
            out[name] = {"error": repr(err), "traceback": traceback.format_exc()[-2000:]}
        finally:
            torch.cuda.empty_cache()
        if isinstance(out[name], dict):
            out[name]["section_seconds"] = round(time.perf_counter() - t0, 2)
        return fn

    return wrap


def llama(hidden, inter, layers, heads, vocab, dtype=torch.float32):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        vocab_size=vocab,
        max_position_embeddings=4096,
    )
    return LlamaForCausalLM(cfg).to(device=DEV, dtype=dtype)


@section("env")
def _env():
    s = environment_snapshot()
    return {"platform_key": platform_key(s), "snapshot": s}


@section("backend")
def _backend():
    d = detect_device()
    return {
        "device": d.as_dict(),
        "dtype": {r: choose_dtype(r, d) for r in ("auto", "bf16", "fp16", "fp32")},
        "extensions": check_extensions(d, ["flash-attn", "bitsandbytes", "deepspeed"]),
        "torch_is_bf16_supported_with_emulation": None if DRY else torch.cuda.is_bf16_supported(),
    }


def memory_probe(dtype, precision, autocast=False):
    hidden, inter, layers, heads, vocab = (512, 1408, 4, 8, 32000) if QUICK else (1024, 2816, 8, 16, 32000)
    b, s = 4, 512
    if DRY:
        hidden, inter, layers, heads, vocab, b, s = 64, 176, 2, 4, 1000, 2, 64
    model = llama(hidden, inter, layers, heads, vocab, dtype)
    model.train()
    n = sum(p.numel() for p in model.parameters())
    between_load = memory_between_steps(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
    ids = torch.randint(0, vocab, (b, s), device=DEV)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(DEV.type, dtype=torch.bfloat16, enabled=autocast):
            logits = model(input_ids=ids).logits
        loss = token_loss_sum(logits, ids) / (b * (s - 1))
        loss.backward()
        opt.step()

    est = estimate_step_memory(model, b, s, precision, weights_dtype="fp32" if autocast else None, device=DEV.type)
    m1 = measure_step_peak(step, DEV)
    between_steps = memory_between_steps(model, opt)
    m2 = measure_step_peak(step, DEV)
    lower = est["weights_bytes"] + est["gradients_bytes"] + est["optimizer_states_bytes"]
    result = {
        "parameters": n,
        "config": {
            "hidden": hidden,
            "intermediate": inter,
            "layers": layers,
            "heads": heads,
            "vocab": vocab,
            "micro_batch": b,
            "seq_len": s,
        },
        "between_load": between_load,
        "between_steps": between_steps,
        "estimate": est,
        "measured_step1": m1,
        "measured_step2": m2,
        "side_by_side_step1": side_by_side(est, m1),
        "side_by_side_step2": side_by_side(est, m2),
        "c8_peak_ge_weights_grads_states": {
            "lower_bound_bytes": lower,
            "step1": m1["peak_bytes"] >= lower,
            "step2": m2["peak_bytes"] >= lower,
        },
        "peak_over_estimate_gib": {
            "estimate": est["total_gib"],
            "step1": m1["peak_bytes"] / GIB,
            "step2": m2["peak_bytes"] / GIB,
        },
    }
    del model, opt
    return result


@section("memory_fp32")
def _mem32():
    return memory_probe(torch.float32, "fp32")


@section("memory_bf16")
def _mem16():
    return memory_probe(torch.bfloat16, "bf16")


@section("memory_autocast_bf16")
def _mem_mixed():
    return memory_probe(torch.float32, "bf16", autocast=True)


@section("max_micro_batch")
def _maxmb():
    vocab, s, budget = (1000, 64, 2 * GIB) if DRY else (32000, 512, 4 * GIB)
    model = llama(64, 176, 2, 4, vocab, torch.bfloat16) if DRY else llama(512, 1408, 4, 8, vocab, torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def try_fn(mb):
        ids = torch.randint(0, vocab, (mb, s), device=DEV)

        def step():
            opt.zero_grad(set_to_none=True)
            token_loss_sum(model(input_ids=ids).logits, ids).div(mb * (s - 1)).backward()
            opt.step()

        try:
            return measure_step_peak(step, DEV)
        finally:
            opt.zero_grad(set_to_none=True)

    r = find_max_micro_batch(try_fn, budget_bytes=budget, start=1, limit=8 if DRY else 64)
    r["estimate_at_max"] = estimate_step_memory(model, max(r["max_micro_batch"], 1), s, "bf16", device=DEV.type)[
        "total_bytes"
    ]
    return r


def lora_factory(checkpointing):
    from peft import LoraConfig, get_peft_model

    base = llama(32, 64, 2, 4, 128) if DRY else llama(256, 704, 4, 4, 4096)
    model = get_peft_model(
        base, LoraConfig(r=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.1, init_lora_weights="gaussian")
    )
    if checkpointing:
        base.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True}) if hasattr(
            base, "activation_checkpointing_enable"
        ) else base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
        model.enable_input_require_grads()
    return model


def lm_batch(vocab=128 if DRY else 4096, b=2 if DRY else 8, s=16 if DRY else 256):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (b, s), generator=g)
    labels = ids.clone()
    labels[:, : s // 2] = -100
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


@section("checkpointing")
def _ckpt():
    return check_activation_checkpointing(lora_factory, lm_batch(), rtol=1e-4, atol=1e-5)


@section("update_check")
def _update():
    r = check_update(lora_factory(True), lm_batch())
    r.pop("grad_norms", None)
    r.pop("update_norms", None)
    return r


if ALL:
    import gpu_check_all  # noqa: E402  (scripts/gpu_check_all.py: the --all sections)

    gpu_check_all.run(out, section, llama, DEV, DRY)

out["dry_run_on_cpu"] = DRY
out["seconds"] = round(time.time() - out.pop("started"), 1)
text = json.dumps(out, indent=1, default=str)
print(text)
if ALL:
    from pathlib import Path  # noqa: E402

    target = Path(OUT_PATH) if OUT_PATH else gpu_check_all.default_path(DRY)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text + "\n", encoding="utf-8")
    print(f"wrote {target}", file=sys.stderr)
