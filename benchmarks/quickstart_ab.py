"""Benchmark report: two finished quickstarts side by side (``training.speedups: auto`` vs ``off``).

Run by hand on a quiet machine, back to back (docs/quickstart.md, "The quickstart with training.speedups: auto"):

    /usr/bin/time -v tuneproof quickstart --dir q-auto
    /usr/bin/time -v tuneproof quickstart --dir q-off --speedups off
    python benchmarks/quickstart_ab.py q-off q-auto [--out FILE.json]

Reads each study's records (nothing is trained or evaluated again): the train run's loop tokens/s and
seconds (tokens of the micro-batches, padding included, over the training loop's seconds), the whole
train recipe's seconds (run created -> ended: model load, the speed-up checks, the loop, the save),
what ``auto`` used, the padding share, the per-step losses; each study's own baseline -> candidate
deltas with their 95 % paired bootstrap intervals (``compare.json``). Then the two candidates against
each other on the same evaluation examples: :func:`tuneproof.evaluation.compare.paired_compare` with
the first study's candidate as "baseline" and the second's as "candidate" (the first study's eval
settings, bootstrap iterations and seed), so the delta of each metric and its interval say how far the
speed-ups moved the result. Prints one JSON object; ``--out`` also writes it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import common  # noqa: F401  (benchmarks/common.py: puts src/ on sys.path)
from tuneproof.context import StudyContext  # noqa: E402
from tuneproof.evaluation.compare import paired_compare  # noqa: E402
from tuneproof.io import read_json, read_jsonl  # noqa: E402
from tuneproof.tasks import task_config  # noqa: E402


def _latest(ctx: StudyContext, kind: str):
    runs = ctx.registry.list(kind=kind, status="completed")
    if not runs:
        raise SystemExit(f"{ctx.study_dir}: no completed {kind} run (run the quickstart there first)")
    return runs[-1]


def study_row(study: Path) -> tuple[dict, list[dict], StudyContext]:
    """One quickstart's figures and its candidate's evaluation outputs."""
    ctx = StudyContext.open(study, None)
    train, ev, cmp = _latest(ctx, "train"), _latest(ctx, "eval"), _latest(ctx, "compare")
    s = train.summary
    run_dir = ctx.registry.runs_dir
    losses = [json.loads(x)["loss"] for x in (run_dir / train.id / "metrics.jsonl").read_text().splitlines()]
    comp = (read_json(run_dir / cmp.id / "compare.json") or {})["candidates"][ev.id]
    grouping = (s.get("speedups") or {}).get("length_grouping") or {}
    row = {
        "study": str(study),
        "speedups": ctx.study.training.speedups,
        "auto_used": (s.get("speedups_auto") or {}).get("used"),
        "padding_before_after": [grouping.get("padding_before"), grouping.get("padding_after")],
        "loop_tokens_per_s": s.get("tokens_per_s"),
        "loop_seconds": s.get("train_seconds"),
        "train_recipe_seconds": round(train.ended - train.created, 1),
        "losses": losses,
        "vs_baseline": {k: {"cand": v["cand"], "delta": v["delta"], "ci": v["ci"]} for k, v in comp["metrics"].items()},
        "verdict": comp["overall"]["verdict"],
    }
    return row, read_jsonl(run_dir / ev.id / "outputs.jsonl"), ctx


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("first", type=Path, help="the reference quickstart's folder (speedups off)")
    ap.add_argument("second", type=Path, help="the other quickstart's folder (speedups auto)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    first, out_a, ctx = study_row(a.first)
    second, out_b, _ = study_row(a.second)
    if [r["id"] for r in out_a] != [r["id"] for r in out_b]:
        raise SystemExit("the two quickstarts evaluated different examples: compare them by their own intervals")
    ev = ctx.study.eval
    pair = paired_compare(
        out_a,
        out_b,
        ctx.task,
        required_fields=ctx.study.hypothesis.required_fields,
        eval_cfg=ev,
        iterations=ev.bootstrap_iterations,
        seed=ev.seed,
        labels=task_config(ctx).labels,
    )
    steps = min(len(first["losses"]), len(second["losses"]))
    report = {
        "first": first,
        "second": second,
        "loop_tokens_per_s_ratio": round(second["loop_tokens_per_s"] / first["loop_tokens_per_s"], 3),
        "train_recipe_seconds_ratio": round(second["train_recipe_seconds"] / first["train_recipe_seconds"], 3),
        "largest_step_loss_difference": max(abs(x - y) for x, y in zip(first["losses"][:steps], second["losses"])),
        "second_vs_first": {
            "n": pair["n"],
            "metrics": {
                k: {"first": v["base"], "second": v["cand"], "delta": v["delta"], "ci": v["ci"]}
                for k, v in pair["metrics"].items()
            },
            "counts_correct": pair.get("counts_correct"),
            "mcnemar_correct": pair.get("mcnemar_correct"),
        },
    }
    text = json.dumps(report, indent=1)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
