"""Set-up shared by the benchmarks that run the real SmolLM2-135M-Instruct + LoRA on SNIPS
(train_step, speedups, chunked_loss, bf16_base, memory_estimate). Run as scripts, the benchmarks
import it from their own folder (``python benchmarks/X.py`` puts ``benchmarks/`` on ``sys.path``).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

#: LoRA r16 on the attention projections, the configuration every benchmark measures
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
#: the system prompt of the SNIPS studies (tuneproof's extraction template)
SNIPS_SYSTEM = "Reply with JSON only: the intent and the slots of the request."
#: glibc raises its mmap threshold (up to 32 MiB) each time a large block is freed, so after a
#: warm-up step the freed activations stay resident in the heap and the next step's high-water
#: mark is mostly the warm-up's (measured: 4.22 GiB instead of 2.95 GiB for one step at 4 x 512).
#: A fixed threshold (mallopt(3) M_MMAP_THRESHOLD / M_TRIM_THRESHOLD, set through glibc's
#: environment tunables) returns every block above 128 KiB to the system when it is freed.
#: Benchmarks that read the resident high-water mark run their children with it.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}


def smollm2_lora(dropout: float = 0.0):
    """``(ref, tokenizer, model)``: SmolLM2-135M-Instruct from the local cache (alias
    ``smollm2-135m-instruct``) wrapped in LoRA r16 / alpha 32 on :data:`TARGETS`, the LoRA
    initialised under ``torch.manual_seed(0)``."""
    import torch
    from peft import LoraConfig, get_peft_model  # noqa: I001

    from tuneproof.modalities import detect_kind
    from tuneproof.modalities.text import CAUSAL_LM
    from tuneproof.models.base import (
        load_model,
        load_tokenizer,
        resolve_base,
    )  # first: tuneproof quiets bitsandbytes' logger
    from tuneproof.study import ModelSpec

    ref = resolve_base(ModelSpec(base="smollm2-135m-instruct"), detect_kind)
    tok = load_tokenizer(ref)
    model = load_model(ref, CAUSAL_LM)
    torch.manual_seed(0)
    return (
        ref,
        tok,
        get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=TARGETS, lora_dropout=dropout)),
    )


def snips_examples() -> list:
    """Every SNIPS example (all splits), found as the quickstart finds its data."""
    from tuneproof.data.locate import find_data_root
    from tuneproof.data.sources import load_snips

    return load_snips(find_data_root(None, "snips") / "snips")[0]


def full_rows(tok, texts: list[str], micro_batch: int, length: int, loss: str) -> dict:
    """A micro-batch of ``micro_batch`` full rows of ``length`` tokens cut from ``texts`` joined
    (every position real, no padding): ``input_ids``, ``attention_mask``, ``labels``, all
    ``[micro_batch, length]``; ``loss="answer_only"`` supervises the last quarter of each row,
    like an answer, ``full_sequence`` every position."""
    import torch

    ids = tok(" ".join(texts), add_special_tokens=False)["input_ids"]
    rows = torch.tensor(ids[: micro_batch * length]).view(micro_batch, length)
    labels = rows.clone()
    if loss == "answer_only":
        labels[:, : length * 3 // 4] = -100
    return {"input_ids": rows, "attention_mask": torch.ones_like(rows), "labels": labels}
