"""Helpers of the distributed tests: a tiny study set for a given world layout, the CLI in a new
process (torchrun starts under it), per-step metrics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from tiny_study import cli_env, make_study

SRC = Path(__file__).resolve().parents[2] / "src"
SKIP = (
    "--skip-data-check",
    "tiny test study",
    "--skip-baseline",
    "tiny test study",
)  # the protocol gates are tested elsewhere


def dist_study(
    folder: Path, base: Path, *, strategy: str = "ddp", dropout: float = 0.0, timeout_s: float = 120, **training
) -> Path:
    """The tiny study (24 train examples) with ``distributed`` keys and LoRA dropout set."""
    study = make_study(
        folder, base, prepare=False, **training
    )  # the protocol gates are skipped (SKIP), tested elsewhere
    cfg = yaml.safe_load((study / "tuneproof.yaml").read_text())
    cfg["method"]["dropout"] = dropout
    cfg["distributed"] = {"strategy": strategy, "backend": "gloo", "timeout_s": timeout_s}
    (study / "tuneproof.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return study


def run_cli(*args: str, extra_path: Path | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """``tuneproof ARGS`` in a new process (and torchrun's ranks under it); ``extra_path`` goes first on
    PYTHONPATH (a sitecustomize.py there is imported by every process, ranks included)."""
    env = cli_env()
    parts = (
        ([str(extra_path)] if extra_path else []) + [str(SRC)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return subprocess.run(
        [sys.executable, "-c", "from tuneproof.cli import main; main()", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def metrics(run_dir: Path) -> dict[int, dict]:
    """step -> metrics row (the last row of a step wins)."""
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "step" in row and "loss" in row:
            out[row["step"]] = row
    return out


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())
