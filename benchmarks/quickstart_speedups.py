"""Benchmark: the quickstart's training with ``training.speedups: auto`` vs ``off``, one process each.

Run by hand (one arm per process, so a whole-process timer can interleave them A B A B ...):

    TUNEPROOF_DATA=/work/shared/data python benchmarks/quickstart_speedups.py --speedups auto [--steps 6] [--out F]
    TUNEPROOF_DATA=/work/shared/data python benchmarks/quickstart_speedups.py --speedups off  [--steps 6] [--out F]

Writes the quickstart's study (the extraction template: SNIPS, SmolLM2-135M-Instruct + LoRA r16 on q/k/v/o,
micro-batch 8, max_length 144) into a temporary folder with ``training.speedups`` as asked and
``training.max_steps`` cut to ``--steps``, and runs ``tuneproof train`` on it in this process (the protocol
gates overridden, recorded as "benchmark"). Prints one JSON line: the loop's tokens/s and seconds (the
speed-up checks run before the loop and are not in them), the seconds of the whole train recipe (model load,
the checks, the loop, the save), what auto used and why, the padding share, the per-step losses.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import yaml

import common  # noqa: F401  (benchmarks/common.py: puts src/ on sys.path)
from tuneproof.context import StudyContext  # noqa: E402
from tuneproof.data.locate import find_data_root  # noqa: E402
from tuneproof.recipes.quickstart import write_quickstart_study  # noqa: E402
from tuneproof.recipes.train import TrainOptions, run_train  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--speedups", choices=["auto", "off"], required=True)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", type=Path, help="append the JSON line to this file")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        study = Path(tmp) / "study"
        path = write_quickstart_study(study, fast=False, speedups=a.speedups)
        raw = yaml.safe_load(path.read_text())
        raw["training"]["max_steps"] = a.steps
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
        ctx = StudyContext.open(study, find_data_root(None, "snips"))
        t = time.perf_counter()
        why = "benchmark"
        rid = run_train(ctx, TrainOptions(preflight_override=why, data_check_override=why, baseline_override=why))
        recipe_s = time.perf_counter() - t
        s = ctx.registry.get(rid).summary
        losses = [
            json.loads(x)["loss"] for x in (ctx.registry.runs_dir / rid / "metrics.jsonl").read_text().splitlines()
        ]
    row = {
        "speedups": a.speedups,
        "steps": a.steps,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "loop_tokens_per_s": s["tokens_per_s"],
        "loop_seconds": s["train_seconds"],
        "recipe_seconds": round(recipe_s, 1),
        "used": (s.get("speedups_auto") or {}).get("used", []),
        "decisions": {k: v["reason"] for k, v in ((s.get("speedups_auto") or {}).get("decisions") or {}).items()},
        "padding": s.get("padding"),
        "losses": losses,
    }
    line = json.dumps(row)
    print(line)
    if a.out:
        with a.out.open("a", encoding="utf-8") as fh:
            fh.write(line + "\n")


if __name__ == "__main__":
    main()
