"""Shared steps of the remote-copy tests: a tiny study with ``storage.remote``, the CLI in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

#: train in a new process that sends itself SIGNAL after step AT (tests/training/tiny_study.py's SELF_SIGNAL)
from tiny_study import (
    SELF_SIGNAL,  # noqa: E402
    cli_env,
    make_study,
)


def remote_study(folder: Path, base: Path, uri: str | None, **storage) -> Path:
    """The tiny study (data check and baseline done) whose study file names ``storage.remote: uri``."""
    study = make_study(folder, base)
    cfg = yaml.safe_load((study / "tuneproof.yaml").read_text())
    if uri is not None:
        cfg["storage"] = {"remote": uri, **storage}
    (study / "tuneproof.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return study


def run(*args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """``tuneproof ARGS`` in a new process (the test's environment: S3 endpoint, SFTP key)."""
    return subprocess.run(
        [sys.executable, "-c", "from tuneproof.cli import main; main()", *args],
        capture_output=True,
        text=True,
        env={**cli_env(), **(env or {})},
        timeout=timeout,
    )


def train_signalled(study: Path, at_step: int, signal_name: str) -> subprocess.CompletedProcess:
    """``tuneproof train`` that sends itself ``signal_name`` after step ``at_step``."""
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
        ],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=300,
    )


def manifest_of(folder: Path) -> dict:
    """The newest manifest of a file:// remote copy in ``folder``."""
    names = sorted(p.name for p in (folder / "manifests").glob("m-*.json"))
    return json.loads((folder / "manifests" / names[-1]).read_text())


def out(proc: subprocess.CompletedProcess) -> str:
    """stdout + stderr on one line (Rich wraps at the terminal width)."""
    return " ".join((proc.stdout + proc.stderr).split())
