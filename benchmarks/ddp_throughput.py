"""Training throughput: one process vs DDP vs FSDP2 at world size 2, CPU (gloo), same global batch (run by hand).

    python benchmarks/ddp_throughput.py [--seconds 30] [--repeats 3] [--threads 1] [--hidden 256] [--layers 4]
                                        [--modes single,ddp,fsdp] [--dir DIR] [--out FILE.json]

Builds a random Llama (``--hidden``, ``--layers``; word-level tokenizer of the tiny test study, no
download) and a 64-example extraction study, then runs ``tuneproof train`` in new processes:

- ``single``: world size 1, micro-batch 8 x accumulation 2 (global batch 16);
- ``ddp`` / ``fsdp``: ``--nproc-per-node 2``, micro-batch 4 x accumulation 2 x 2 ranks (global batch 16),
  ``distributed.strategy`` ddp or fsdp (FSDP2 ``fully_shard``);

every process with ``--threads`` intra-op threads (``OMP_NUM_THREADS``, default 1: on a shared
machine more threads than free cores spin and wait, which says nothing about the distribution).

Length: a calibration run of each mode (8 steps, not counted: it is also the warm-up of the page cache
and of torch's kernels) gives its seconds per step; every counted run then takes the same number of
steps, enough for the *fastest* mode's training loop to last ``--seconds`` (default 30), so every mode's
loop lasts at least that long and every mode trains on the same examples per step. Rounds: ``--repeats``
rounds, each running every mode once, the order rotated by one each round, so drifting load on a shared
machine hits every mode alike. Reported per mode: the loop's tokens/s (``summary.json``: tokens of the
global batch, padding included, over the training loop's seconds; model load, launch and saving
excluded), median and min-max over the rounds, the loop and command seconds; per round the ratio of
each mode to ``single`` (their median and min-max); the largest per-step loss difference to ``single``
(the same examples each step: equal within fp32 tolerance). On a CPU the two ranks share the machine's
cores: with one thread per process world size 2 uses twice the cores of world size 1, so the ratio
is the gain from a second core minus the cost of the collectives, not a GPU's scaling.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
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


MODES = {"single": (1, 8, "ddp"), "ddp": (2, 4, "ddp"), "fsdp": (2, 4, "fsdp")}  # nproc, micro-batch, strategy


def run_mode(root: Path, base: Path, mode: str, steps: int, threads: int, tag: str) -> dict:
    nproc, micro, strategy = MODES[mode]
    return train(study(root / f"{mode}-{tag}", base, steps, micro, strategy), nproc, threads)


def spread(values: list[float]) -> dict:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
        "n": len(values),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30.0, help="least loop seconds of every counted run")
    ap.add_argument("--repeats", type=int, default=3, help="rounds; each runs every mode once")
    ap.add_argument("--modes", default="single,ddp,fsdp")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of every process")
    ap.add_argument("--out", type=Path, default=None, help="also write the figures as JSON")
    a = ap.parse_args()
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    if "single" not in modes or any(m not in MODES for m in modes):
        raise SystemExit(f"--modes: a comma list of {', '.join(MODES)} including single")
    root = a.dir or Path(tempfile.mkdtemp(prefix="tuneproof-ddp-bench-"))
    cores = os.cpu_count() or 2
    load0 = os.getloadavg()
    base = build(root, a.hidden, a.layers)
    calib = {m: run_mode(root, base, m, 8, a.threads, "calibration") for m in modes}
    s_per_step = {m: r["train_seconds"] / 8 for m, r in calib.items()}
    steps = max(8, math.ceil(a.seconds / min(s_per_step.values())))
    print(
        "calibration (8 steps, not counted): "
        + ", ".join(f"{m} {v:.3f} s/step" for m, v in s_per_step.items())
        + f" -> {steps} steps per counted run",
        flush=True,
    )
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for r in range(a.repeats):
        order = modes[r % len(modes) :] + modes[: r % len(modes)]
        for m in order:
            out = run_mode(root, base, m, steps, a.threads, f"r{r}")
            runs[m].append(out)
            print(
                f"round {r + 1} {m}: {out['tokens_per_s']:.0f} tokens/s, loop {out['train_seconds']:.1f} s, "
                f"command {out['wall_s']} s",
                flush=True,
            )
    load1 = os.getloadavg()
    ref = runs["single"]
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {
            "cores": cores,
            "load_average_before": [round(x, 2) for x in load0],
            "load_average_after": [round(x, 2) for x in load1],
        },
        "model": {"hidden": a.hidden, "layers": a.layers, "lora": "r=4 on q/v", "examples": 64},
        "threads_per_process": a.threads,
        "steps_per_run": steps,
        "global_batch": 16,
        "repeats": a.repeats,
        "modes": {},
    }
    for m in modes:
        tps = [x["tokens_per_s"] for x in runs[m]]
        ratio = [x["tokens_per_s"] / y["tokens_per_s"] for x, y in zip(runs[m], ref)]
        diff = max((abs(p - q) for x, y in zip(runs[m], ref) for p, q in zip(x["losses"], y["losses"])), default=0.0)
        result["modes"][m] = {
            "processes": MODES[m][0],
            "tokens_per_s": spread(tps),
            "loop_seconds": spread([x["train_seconds"] for x in runs[m]]),
            "command_seconds": spread([x["wall_s"] for x in runs[m]]),
            "ratio_to_single": spread(ratio),
            "largest_loss_difference_to_single": diff,
        }
    print(
        f"random Llama hidden {a.hidden}, {a.layers} layers, LoRA r=4 on q/v, {steps} steps per run, global batch 16, "
        f"{a.threads} thread(s) per process, {cores} CPU cores, load average before {load0[0]:.2f}, "
        f"after {load1[0]:.2f}; {a.repeats} rounds, modes rotated"
    )
    for m, v in result["modes"].items():
        t, q = v["tokens_per_s"], v["ratio_to_single"]
        print(
            f"{m:6s} ({v['processes']} process{'es' if v['processes'] > 1 else ''}): tokens/s median {t['median']:.0f} "
            f"[{t['min']:.0f}-{t['max']:.0f}], x{q['median']:.2f} [{q['min']:.2f}-{q['max']:.2f}] of single; "
            f"loop {v['loop_seconds']['median']:.1f} s; "
            f"largest loss difference {v['largest_loss_difference_to_single']:.1e}"
        )
    if a.out:
        a.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
