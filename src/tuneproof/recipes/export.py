"""Recipe ``export``: the trained adapter (or full model) bound to its exact base model.

Features: one folder ``exports/<run>/`` built in a temp folder and renamed into place (never a
half bundle) with the adapter in the standard PEFT layout (its config carries the base
revision), the tokenizer, and ``manifest.json`` (schema-versioned): base model id/path,
revision, sha256 of every base weight file, tokenizer identity, resolved config, data and
evaluation fingerprints, and the comparison verdict when one exists.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from tuneproof.context import StudyContext
from tuneproof.errors import TuneproofError
from tuneproof.io import read_json, write_json
from tuneproof.models.base import weight_hashes
from tuneproof.recipes.common import run_json
from tuneproof.ui import console


def run_export(ctx: StudyContext, train_run: str, *, force: bool = False, out_dir: Path | None = None) -> str:
    """Export a completed train run; returns the export run id."""
    rec = ctx.registry.get(train_run)
    if rec.kind != "train":
        raise TuneproofError(f"run {rec.id} is a {rec.kind} run; export takes a train run")
    if rec.status != "completed" and not force:
        raise TuneproofError(f"train run {rec.id} is {rec.status}" + (f" ({rec.reason})" if rec.reason else ""),
                             hint="export a completed run, or pass --force (recorded in the manifest)")
    src = ctx.registry.runs_dir / rec.id
    payload = src / ("adapter" if (src / "adapter").exists() else "model")
    if not payload.exists():
        raise TuneproofError(f"{src}: the run saved neither adapter/ nor model/")
    dest = Path(out_dir) if out_dir else ctx.study_dir / "exports" / rec.id
    if dest.exists():
        raise TuneproofError(f"{dest} already exists", hint="remove it or pass another --out")
    with ctx.registry.run("export", parent=rec.id) as run:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
        try:
            shutil.copytree(payload, tmp / payload.name)
            evals = [r for r in ctx.registry.list(kind="eval", status="completed") if r.parent == rec.id]
            compares = [r for r in ctx.registry.list(kind="compare", status="completed")
                        if evals and evals[-1].id in (r.summary.get("candidates") or [])]
            base = ctx.base.identity()
            base["weight_sha256_loaded"] = weight_hashes(Path(ctx.base.path))
            manifest = {
                "run": rec.id, "status": rec.status, "forced": bool(force and rec.status != "completed"),
                "kind": "adapter" if payload.name == "adapter" else "full-model",
                "base_model": base, "tokenizer": ctx.tokenizer_identity,
                "config": read_json(src / "config.json") if (src / "config.json").exists() else ctx.config,
                "data_fingerprint": rec.data_fingerprint,
                "eval_run": evals[-1].id if evals else None,
                "eval_fingerprint": evals[-1].eval_fingerprint if evals else None,
                "metrics": evals[-1].summary.get("metrics") if evals else None,
                "comparison": run_json(ctx, compares[-1].id, "compare.json") if compares else None,
                "environment": run_json(ctx, rec.id, "env.json"),
            }
            write_json(tmp / "manifest.json", manifest)
            os.replace(tmp, dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        run.update_summary(bundle=str(dest), train_run=rec.id)
        console.print(f"[bold]{run.id}[/] exported {rec.id} to {dest}")
        return run.id
