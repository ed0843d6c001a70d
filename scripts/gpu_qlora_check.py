"""QLoRA on a GPU (docs/PROTOCOL.md step 4): one training step of the same model as bf16 LoRA and as QLoRA
(4-bit NF4 base, double quantization, bf16 compute), through tuneproof's own loading and method code
(``models.base.load_model``, ``models.method.apply_method``, ``preflight.qlora``). Writes
``qlora-check.json`` into OUT_DIR and prints it. Downloads nothing.

Run from the repository root on the GPU machine (bitsandbytes installed: pip install '.[qlora]'):

    python scripts/gpu_qlora_check.py OUT_DIR [--smollm2]

Model: a random Llama (hidden 1024, 8 layers, vocab 32000, about 170M parameters) saved to OUT_DIR
first; ``--smollm2`` uses the SmolLM2-135M-Instruct conversion in tuneproof's model cache when it is
there (else the random Llama). Step: micro-batch 4 x 512 tokens, AdamW, LoRA r16 on q/k/v/o.
Recorded per variant: loss and LoRA gradient norm of the step (and the ``qlora step`` verdict),
peak memory of the step (``torch.cuda.max_memory_allocated``), memory between steps, 4-bit modules.
Without CUDA it runs a tiny version on the CPU (to check the script itself; bitsandbytes' CPU kernels).
Budget: well under 2 minutes on one GPU (two loads of a 170M model, two steps).
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
warnings.filterwarnings("ignore")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from tuneproof.modalities.text import CAUSAL_LM  # noqa: E402
from tuneproof.models.base import BaseModelRef, load_model  # noqa: E402
from tuneproof.models.method import apply_method  # noqa: E402
from tuneproof.models.quant import bitsandbytes_version, quantization_record  # noqa: E402
from tuneproof.preflight.memory import GIB, memory_between_steps  # noqa: E402
from tuneproof.preflight.qlora import check_step_values  # noqa: E402
from tuneproof.training.loss import supervised_token_count, token_loss_sum  # noqa: E402
from tuneproof.training.memory import measure_step_peak  # noqa: E402

CUDA = torch.cuda.is_available()
DEV = torch.device("cuda", 0) if CUDA else torch.device("cpu")


def base_folder(out: Path, smollm2: bool) -> tuple[Path, str]:
    if smollm2:
        from tuneproof.models.base import MODEL_CACHE, cache_ready  # noqa: PLC0415

        for d in sorted(MODEL_CACHE.glob("smollm2-135m-instruct-*")):
            if cache_ready(d):
                return d, f"SmolLM2-135M-Instruct (cache {d.name})"
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415

    hidden, inter, layers, heads, vocab = (1024, 2816, 8, 16, 32000) if CUDA else (64, 128, 2, 4, 512)
    folder = out / "random-llama"
    if not (folder / "config.json").is_file():
        torch.manual_seed(0)
        cfg = LlamaConfig(
            hidden_size=hidden,
            intermediate_size=inter,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=heads,
            vocab_size=vocab,
            max_position_embeddings=1024,
            tie_word_embeddings=False,
        )
        LlamaForCausalLM(cfg).save_pretrained(folder, safe_serialization=True)
    return folder, f"random Llama hidden {hidden} x {layers} layers, vocab {vocab}"


def one_step(folder: Path, kind: str) -> dict:
    method = SimpleNamespace(
        kind=kind,
        r=16,
        alpha=32,
        dropout=0.0,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        modules_to_save=[],
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_quant_storage="uint8",
    )
    ref = BaseModelRef(folder.name, folder, "local", "causal-lm", "local")
    quant = quantization_record(method, "bf16") if kind == "qlora" else None
    if CUDA:
        torch.cuda.reset_peak_memory_stats(DEV)
    t0 = time.perf_counter()
    # bf16 LoRA: bf16 weights; QLoRA: 4-bit linear layers, the rest fp32 (prepare_model_for_kbit_training), bf16
    # autocast
    model = load_model(ref, CAUSAL_LM, dtype=torch.bfloat16 if kind == "lora" else None, quantization=quant)
    model, report = apply_method(model, method, CAUSAL_LM, quantization=quant)
    model = model.to(DEV)
    load_s = time.perf_counter() - t0
    loaded = memory_between_steps(model)
    vocab = model.config.vocab_size
    b, s = (4, 512) if CUDA else (2, 32)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (b, s), generator=g).to(DEV)
    labels = ids.clone()
    labels[:, : s // 2] = -100  # answer-only: the second half supervised
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, weight_decay=0.0)
    seen: dict = {}

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(DEV.type, dtype=torch.bfloat16):
            logits = model(input_ids=ids).logits
        loss = token_loss_sum(logits, labels) / supervised_token_count(labels)
        loss.backward()
        grads = [p.grad.float() for p in model.parameters() if p.requires_grad and p.grad is not None]
        seen["loss"] = float(loss.detach().float())
        seen["grad_norm"] = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(x) for x in grads])))
        opt.step()

    peak = measure_step_peak(step, DEV)
    verdict = check_step_values(seen["loss"], seen["grad_norm"])
    out = {
        "kind": kind,
        "load_seconds": round(load_s, 2),
        "loss": seen["loss"],
        "grad_norm": seen["grad_norm"],
        "ln_vocab": math.log(vocab),
        "qlora_step_check": {k: verdict[k] for k in ("passed", "message")},
        "step_peak_gib": peak["peak_bytes"] / GIB,
        "step_reserved_peak_gib": (peak.get("reserved_peak_bytes") or 0) / GIB,
        "step_seconds": peak["seconds"],
        "between_steps_after_load_gib": loaded["total_gib"],
        "trainable": report.get("trainable"),
        "quantization": report.get("quantization"),
        "quantized": report.get("quantized"),
        "micro_batch": b,
        "seq_len": s,
    }
    del model, opt
    if CUDA:
        torch.cuda.empty_cache()
    return out


def main(argv: list[str]) -> dict:
    args = [a for a in argv if not a.startswith("--")]
    out = Path(args[0] if args else os.environ.get("OUT") or tempfile.mkdtemp(prefix="qlora-check-"))
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    result: dict = {
        "device": torch.cuda.get_device_name(0) if CUDA else "cpu (dry run of the script)",
        "torch": torch.__version__,
        "bitsandbytes": bitsandbytes_version(),
        "dry_run_on_cpu": not CUDA,
    }
    folder, what = base_folder(out, "--smollm2" in argv)
    result["model"] = what
    for kind in ("lora", "qlora"):
        try:
            result[kind] = one_step(folder, kind)
        except Exception as err:  # noqa: BLE001 - recorded, the other variant still runs
            result[kind] = {"error": repr(err), "traceback": traceback.format_exc()[-2000:]}
    lo, q = result.get("lora", {}), result.get("qlora", {})
    if "step_peak_gib" in lo and "step_peak_gib" in q:
        result["qlora_peak_over_bf16_lora"] = q["step_peak_gib"] / lo["step_peak_gib"]
        result["qlora_loss_minus_bf16_lora"] = q["loss"] - lo["loss"]
    result["seconds"] = round(time.time() - t0, 1)
    (out / "qlora-check.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    return result


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:]), indent=1, default=str))
