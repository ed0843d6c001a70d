"""Tiny local studies for the deliverable tests: a 2-label classifier (tiny random BERT + LoRA +
modules_to_save [classifier], docs/CASES.md C6) and a JSON extraction study (tiny random Llama with a
word-level chat tokenizer). Everything is built here; nothing is downloaded.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

GOOD = "good great fine nice superb happy lovely".split()
BAD = "bad awful poor sad ugly terrible grim".split()
FILL = "the movie was very quite really a film plot cast".split()
HOSTILE = "<script>alert('x')</script> & <b>bold</b>"  # user text that must be escaped in HTML
NEG = "<i>neg</i>&"  # a class name with markup: shown in tables and plots, must be escaped


def _cls_rows(n: int, offset: int, hostile: bool = False) -> list[dict]:
    rows = []
    for i in range(n):
        k = i + offset
        pos = k % 2 == 0
        words = [FILL[(k * 3 + j) % len(FILL)] for j in range(2 + k % 3)] + [(GOOD if pos else BAD)[k % 7]]
        rows.append({"id": f"c{k:03d}", "text": " ".join(words), "label": "pos" if pos else NEG})
    if hostile:
        rows[0]["text"] = HOSTILE + " " + rows[0]["text"]
    return rows


def build_bert_base(folder: Path) -> Path:
    """A tiny random BERT encoder (2 layers, hidden 32) + a WordPiece tokenizer from a vocab file."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    vocab = [
        "[PAD]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
        "<",
        ">",
        "/",
        "'",
        "(",
        ")",
        "&",
        "script",
        "alert",
        "x",
        "b",
        "bold",
    ]
    vocab += sorted(set(GOOD + BAD + FILL))
    tok = BertTokenizer(vocab={w: i for i, w in enumerate(vocab)})
    tok.save_pretrained(folder)
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        initializer_range=0.3,
    )
    BertModel(cfg).save_pretrained(folder, safe_serialization=True)
    return folder


def cls_config(base: Path) -> dict:
    return {
        "schema_version": 1,
        "name": "tiny-cls",
        "hypothesis": {
            "behaviour": "tell positive from negative reviews " + HOSTILE,
            "task": "classification",
            "success": {"metric": "macro_f1", "min_gain": 0.0},
            "guards": [{"metric": "per_class_recall", "max_drop": 0.5}],
        },
        "data": {
            "sources": [
                {"path": f"data/{s}.jsonl", "format": "jsonl", "split": s} for s in ("train", "validation", "test")
            ],
            "fields": {"text": "text", "label": "label", "id": "id"},
        },
        "model": {"base": str(base), "kind": "sequence-classification"},
        "method": {
            "kind": "lora",
            "r": 4,
            "alpha": 8,
            "dropout": 0.0,
            "target_modules": ["query", "value"],
            "modules_to_save": ["classifier"],
        },
        "training": {
            "seed": 1,
            "max_steps": 12,
            "micro_batch_size": 8,
            "learning_rate": 0.05,
            "precision": "fp32",
            "max_length": 16,
            "checkpoint_every": 12,
            "warmup_steps": 0,
        },
        "eval": {"split": "validation", "batch_size": 16, "bootstrap_iterations": 100},
    }


def make_cls_study(folder: Path, base: Path) -> Path:
    (folder / "data").mkdir(parents=True, exist_ok=True)
    for name, n, off in (("train", 32, 0), ("validation", 12, 100), ("test", 6, 200)):
        rows = _cls_rows(n, off, hostile=name == "validation")
        (folder / "data" / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "tuneproof.yaml").write_text(yaml.safe_dump(cls_config(base), sort_keys=False))
    return folder


# ------------------------------------------------------------------ tiny extraction study (causal LM)
WORDS = "alpha beta gamma delta omega sun moon star rain snow".split()
INTENTS = ["Weather", "Color"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)


def _ext_rows(n: int, offset: int) -> list[dict]:
    out = []
    for i in range(n):
        k = i + offset
        words = [WORDS[(k * 7 + j * 3) % len(WORDS)] for j in range(2 + k % 3)]
        out.append(
            {
                "id": f"e{k:03d}",
                "text": " ".join(words),
                "label": INTENTS[k % 2],
                "target": json.dumps({"intent": INTENTS[k % 2], "slots": {"thing": words[0]} if k % 2 else {}}),
            }
        )
    return out


def build_llama_base(folder: Path, seed: int = 0) -> Path:
    """A tiny random Llama (2 layers, hidden 32) + a word-level fast tokenizer with a chat template."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    specials = ["[PAD]", "[UNK]", "<|end|>", "<|user|>", "<|assistant|>", "<|system|>"]
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    corpus = [r["text"] + " " + r["target"] for r in _ext_rows(40, 0)] + [" ".join(WORDS), "Extract JSON"]
    tok.train_from_iterator(corpus, trainers.WordLevelTrainer(special_tokens=specials))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        eos_token="<|end|>",
        additional_special_tokens=["<|user|>", "<|assistant|>", "<|system|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(cfg).save_pretrained(folder, safe_serialization=True)
    return folder


def ext_config(base: Path) -> dict:
    return {
        "schema_version": 1,
        "name": "tiny-ext",
        "hypothesis": {
            "behaviour": "answer in JSON",
            "task": "extraction",
            "success": {"metric": "field_f1", "min_gain": 0.0},
            "guards": [{"metric": "json_valid_rate", "max_drop": 0.0}],
            "required_fields": ["intent", "slots"],
        },
        "data": {
            "sources": [
                {"path": f"data/{s}.jsonl", "format": "jsonl", "split": s} for s in ("train", "validation", "test")
            ],
            "fields": {"text": "text", "target": "target", "label": "label", "id": "id"},
        },
        "model": {"base": str(base)},
        "method": {"kind": "lora", "r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
        "training": {
            "seed": 3,
            "max_steps": 3,
            "micro_batch_size": 4,
            "learning_rate": 0.01,
            "precision": "fp32",
            "max_length": 48,
            "checkpoint_every": 3,
        },
        "eval": {
            "split": "validation",
            "max_new_tokens": 6,
            "batch_size": 4,
            "bootstrap_iterations": 100,
            "prompt": {"system": None, "template": "Extract JSON {text}"},
        },
    }


def make_ext_study(folder: Path, base: Path, *, prepare: bool = True) -> Path:
    """The extraction study; with ``prepare`` its data check and baseline are run (in that order), so
    ``train`` may start (docs/PROTOCOL.md steps 2 and 3)."""
    (folder / "data").mkdir(parents=True, exist_ok=True)
    for name, n, off in (("train", 16, 0), ("validation", 4, 100), ("test", 4, 200)):
        rows = _ext_rows(n, off)
        (folder / "data" / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "tuneproof.yaml").write_text(yaml.safe_dump(ext_config(base), sort_keys=False))
    if prepare:
        prepare_study(folder)
    return folder


def prepare_study(folder: Path) -> dict[str, str]:
    """Run ``data check`` then ``baseline`` on the study in ``folder`` (in this process); returns their run ids."""
    from tuneproof.context import StudyContext
    from tuneproof.recipes.baseline import run_baseline
    from tuneproof.recipes.data_check import run_data_check

    ctx = StudyContext.open(folder)
    try:
        return {"data-check": run_data_check(ctx), "baseline": run_baseline(ctx)}
    finally:
        ctx.registry.close()
