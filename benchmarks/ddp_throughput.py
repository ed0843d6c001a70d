"""Training throughput at world size 1 and 2 on CPU (gloo), the same global batch (run by hand).

    python benchmarks/ddp_throughput.py [--steps 8] [--hidden 256] [--layers 4] [--strategy ddp] [--dir DIR]

Builds a random Llama (``--hidden``, ``--layers``; word-level tokenizer of the tiny test study, no
download) and a 64-example extraction study, then runs ``tuneproof train`` twice in new processes:

- world size 1: micro-batch 8 x accumulation 2 (global batch 16);
- world size 2: ``--nproc-per-node 2``, micro-batch 4 x accumulation 2 x 2 ranks (global batch 16);

each process with ``--threads`` intra-op threads (``OMP_NUM_THREADS``, default 1: on a shared
machine more threads than free cores spin and wait, which says nothing about the distribution).

Prints per run the loop's tokens/s (``summary.json``: tokens of the global batch, padding included,
over the training loop's seconds, model load and saving excluded), the wall time of the whole
command, the per-step losses (equal within fp32 tolerance: same examples per step), and the ratio
world 2 / world 1. On a CPU the two processes share the same cores, so the ratio shows the cost of
the collectives and of a process per rank, not a speed-up; with one thread per process, world size 2
uses twice the cores of world size 1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "tests" / "training"))


def build(folder: Path, hidden: int, layers: int) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tiny_study import build_base

    base = build_base(folder / "base")  # the tokenizer (and a tiny model we replace)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(base)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=hidden * 4,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        num_key_value_heads=max(1, hidden // 128),
        max_position_embeddings=128,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    for f in base.glob("model*.safetensors"):
        f.unlink()
    LlamaForCausalLM(cfg).save_pretrained(base, safe_serialization=True)
    return base


def study(folder: Path, base: Path, steps: int, micro: int, strategy: str) -> Path:
    import yaml

    from tiny_study import make_study

    s = make_study(
        folder,
        base,
        n_train=64,
        prepare=False,
        max_steps=steps,
        micro_batch_size=micro,
        gradient_accumulation_steps=2,
        checkpoint_every=10**6,
        warmup_steps=0,
    )
    cfg = yaml.safe_load((s / "tuneproof.yaml").read_text())
    cfg["method"]["dropout"] = 0.0
    cfg["distributed"] = {"strategy": strategy, "backend": "gloo"}
    (s / "tuneproof.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return s


def train(s: Path, nproc: int, threads: int) -> dict:
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(threads),
        CUDA_VISIBLE_DEVICES="",
        HF_HUB_OFFLINE="1",
        PYTHONPATH=str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    cmd = [
        sys.executable,
        "-c",
        "from tuneproof.cli import main; main()",
        "train",
        "--study",
        str(s),
        "--skip-preflight",
        "benchmark",
        "--skip-data-check",
        "benchmark",
        "--skip-baseline",
        "benchmark",
    ]
    if nproc > 1:
        cmd += ["--nproc-per-node", str(nproc)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(proc.stdout[-2000:] + proc.stderr[-2000:])
    run_dir = next(
        p
        for p in (s / "runs").iterdir()
        if (p / "summary.json").exists() and json.loads((p / "summary.json").read_text()).get("kind") == "train"
    )
    summ = json.loads((run_dir / "summary.json").read_text())
    losses = [json.loads(x)["loss"] for x in (run_dir / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
    return {
        "tokens_per_s": summ["tokens_per_s"],
        "train_seconds": summ["train_seconds"],
        "wall_s": round(wall, 1),
        "losses": losses,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--strategy", choices=["ddp", "fsdp"], default="ddp")
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of every process")
    a = ap.parse_args()
    root = a.dir or Path(tempfile.mkdtemp(prefix="tuneproof-ddp-bench-"))
    cores = os.cpu_count() or 2
    load0 = os.getloadavg()
    base = build(root, a.hidden, a.layers)
    one = train(study(root / "w1", base, a.steps, 8, a.strategy), 1, a.threads)
    two = train(study(root / "w2", base, a.steps, 4, a.strategy), 2, a.threads)
    diff = max(abs(x - y) for x, y in zip(one["losses"], two["losses"]))
    print(
        f"random Llama hidden {a.hidden}, {a.layers} layers, LoRA r=4 on q/v, {a.steps} steps, global batch 16, "
        f"{a.threads} thread(s) per process, {cores} CPU cores, load average "
        f"before {load0[0]:.2f}, after {os.getloadavg()[0]:.2f}"
    )
    print(
        f"world size 1: {one['tokens_per_s']:.0f} tokens/s (loop {one['train_seconds']} s, command {one['wall_s']} s)"
    )
    print(
        f"world size 2 ({a.strategy}, gloo): {two['tokens_per_s']:.0f} tokens/s (loop "
        f"{two['train_seconds']} s, command {two['wall_s']} s)"
    )
    print(
        f"ratio world 2 / world 1: x{two['tokens_per_s'] / one['tokens_per_s']:.2f}; largest per-step loss "
        f"difference {diff:.1e}"
    )


if __name__ == "__main__":
    main()
