"""A complete study on CPU in under a second per training run: a tiny random Llama and a tiny
word-level fast tokenizer (with a chat template and an end-of-turn token) saved to a local folder,
and a small JSONL extraction dataset. Nothing is downloaded.

Used by tests/training and tests/registry (the latter puts this folder on ``sys.path``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import yaml

WORDS = "alpha beta gamma delta omega sun moon star rain snow wind cold warm red blue green".split()
INTENTS = ["Weather", "Color", "Sky"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)


def _examples(n: int, offset: int) -> list[dict]:
    out = []
    for i in range(n):
        k = i + offset
        words = [WORDS[(k * 7 + j * 3) % len(WORDS)] for j in range(3 + k % 4)]
        intent = INTENTS[k % len(INTENTS)]
        slots = {"thing": words[0]} if k % 2 else {}
        out.append(
            {"id": f"ex{k:03d}", "text": " ".join(words), "target": json.dumps({"intent": intent, "slots": slots})}
        )
    return out


def build_base(folder: Path) -> Path:
    """Write the tiny Llama + tokenizer into ``folder`` (config.json, model.safetensors, tokenizer)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    specials = ["[PAD]", "[UNK]", "<|end|>", "<|user|>", "<|assistant|>", "<|system|>"]
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    corpus = [e["text"] + " " + e["target"] for e in _examples(64, 0)] + [" ".join(WORDS), "Extract JSON"]
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
    torch.manual_seed(0)
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
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def study_config(base: Path, **training) -> dict:
    """The resolved-config-like study mapping (paths relative to the study folder)."""
    t = {
        "seed": 3,
        "max_steps": 8,
        "micro_batch_size": 4,
        "gradient_accumulation_steps": 2,
        "learning_rate": 0.01,
        "lr_scheduler": "linear",
        "warmup_steps": 2,
        "precision": "fp32",
        "max_length": 48,
        "checkpoint_every": 2,
    }
    t.update(training)
    return {
        "schema_version": 1,
        "name": "tiny",
        "hypothesis": {
            "behaviour": "answer in JSON",
            "task": "extraction",
            "success": {"metric": "field_f1", "min_gain": 0.0},
            "guards": [{"metric": "json_valid_rate", "max_drop": 0.0}],
            "required_fields": ["intent", "slots"],
        },
        "data": {
            "sources": [
                {"path": "data/train.jsonl", "format": "jsonl", "split": "train"},
                {"path": "data/validation.jsonl", "format": "jsonl", "split": "validation"},
                {"path": "data/test.jsonl", "format": "jsonl", "split": "test"},
            ],
            "fields": {"text": "text", "target": "target", "id": "id"},
        },
        "model": {"base": str(base)},
        "method": {"kind": "lora", "r": 4, "alpha": 8, "dropout": 0.1, "target_modules": ["q_proj", "v_proj"]},
        "training": t,
        "eval": {
            "split": "validation",
            "max_new_tokens": 8,
            "batch_size": 4,
            "bootstrap_iterations": 100,
            "prompt": {"system": None, "template": "Extract JSON {text}"},
        },
    }


def make_study(folder: Path, base: Path, *, n_train: int = 24, prepare: bool = True, **training) -> Path:
    """A study folder: tuneproof.yaml + data/{train,validation,test}.jsonl; with ``prepare`` (the
    default) the protocol steps before training are run in order: data check, then baseline
    (runs r0001 and r0002), so ``train`` may start (docs/PROTOCOL.md steps 2 and 3)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "data").mkdir(exist_ok=True)
    for name, n, off in (("train", n_train, 0), ("validation", 6, 100), ("test", 4, 200)):
        rows = _examples(n, off)
        (folder / "data" / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "tuneproof.yaml").write_text(yaml.safe_dump(study_config(base, **training), sort_keys=False))
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


def train_runs(study: Path) -> list:
    """The train runs of ``study`` in order (the study also holds its data check and baseline)."""
    from tuneproof.registry import Registry

    reg = Registry(study)
    try:
        return reg.list(kind="train")
    finally:
        reg.close()


def train_dir(study: Path) -> Path:
    """The folder of the study's only train run."""
    (rec,) = train_runs(study)
    return study / "runs" / rec.id


def losses_by_step(run_dir: Path) -> dict[int, float]:
    """step -> loss from metrics.jsonl; the last row of a step wins (a step can be logged by a
    process that was killed before its checkpoint, then again by the resume)."""
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "loss" in row and "step" in row:
            out[row["step"]] = row["loss"]
    return out


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def adapter_tensors(run_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "adapter" / "adapter_model.safetensors"))


SELF_SIGNAL = textwrap.dedent(
    """
    import os, signal, sys
    import tuneproof.training.loop as L
    from tuneproof.cli import main
    AT, SIG = int(sys.argv[1]), getattr(signal, sys.argv[2])
    orig = L.train
    def train(*a, **kw):
        inner = kw.get("progress")
        def progress(step, total, loss):
            if inner:
                inner(step, total, loss)
            if step == AT:
                os.kill(os.getpid(), SIG)
        kw["progress"] = progress
        return orig(*a, **kw)
    L.train = train
    main(sys.argv[3:])
    """
)


def cli_env() -> dict:
    env = dict(os.environ)
    env.update(
        {
            "CUDA_VISIBLE_DEVICES": "",
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "COLUMNS": "200",
            "OMP_NUM_THREADS": "1",
        }
    )
    return env


def train_with_signal(study: Path, at_step: int, signal_name: str, *args: str) -> subprocess.CompletedProcess:
    """``tuneproof train`` in a new process that sends itself ``signal_name`` after step ``at_step``."""
    return subprocess.run(
        [
            sys.executable,
            "-c",
            SELF_SIGNAL,
            str(at_step),
            signal_name,
            "train",
            "--study",
            str(study),
            "--skip-preflight",
            "tiny test study",
            *args,
        ],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=300,
    )


def cli(*args: str) -> subprocess.CompletedProcess:
    """The ``tuneproof`` command line in a new process."""
    return subprocess.run(
        [sys.executable, "-c", "from tuneproof.cli import main; main()", *args],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=300,
    )


def build_wide_base(folder: Path, tiny_base: Path) -> Path:
    """The tiny Llama's tokenizer on a Llama of hidden 64 (4 heads, 4 KV heads, MLP 128, 2 layers): every
    linear layer's sizes are multiples of 64, bitsandbytes' 4-bit block size, as in real models (QLoRA tests)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(tiny_base)
    tok.save_pretrained(folder)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=128,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(cfg).save_pretrained(folder, safe_serialization=True)
    return folder


class LoopRun:
    """What ``tuneproof.training.loop.train`` uses of a registry run: summary updates and notes kept in
    memory, metrics dropped, ``dir`` for its checkpoints."""

    def __init__(self, folder: Path | None):
        self.summary: dict = {}
        self.notes: list[str] = []
        self.dir = folder

    def update_summary(self, **kw) -> None:
        self.summary.update(kw)

    def metric(self, **kw) -> None:
        pass

    def note(self, text: str) -> None:
        self.notes.append(text)
