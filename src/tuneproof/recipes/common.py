"""Pieces shared by the recipes: recording a run's inputs (config, environment, data and processor
identity), the library drift since a train run, what ``training.speedups: auto`` may try here.

Evaluating into a run lives in :mod:`tuneproof.evaluation.recording`; loading a train run's model
after checking its base, tokenizer and weights in :mod:`tuneproof.evaluation.trained_run`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tuneproof.context import StudyContext
from tuneproof.evaluation.trained_run import TOKENIZER_FILE
from tuneproof.io import sha256_json
from tuneproof.models.device import bf16_base_rule, detect_device
from tuneproof.preflight.envinfo import environment_snapshot, library_drift
from tuneproof.registry import Run
from tuneproof.training.speedups import static_rules
from tuneproof.ui import console


def record_inputs(ctx: StudyContext, run: Run, *, with_data: bool = True) -> dict[str, Any]:
    """Write ``config.json``, ``env.json`` and ``data.json`` (and ``tokenizer_identity.json``, what
    ``eval`` and ``export`` compare the tokenizer with) into the run and index the hashes. Returns the indexed
    fields and ``env`` (the snapshot written)."""
    run.write_json("config.json", ctx.config)
    env = environment_snapshot()
    env["device_choice"] = ctx.device_choice
    run.write_json("env.json", env)
    fields: dict[str, Any] = {"config_hash": sha256_json(ctx.config)}
    if with_data:
        fp = ctx.data_fingerprint()
        run.write_json("data.json", fp)
        run.write_json(TOKENIZER_FILE, ctx.tokenizer_identity)
        fields["data_fingerprint"] = fp["hash"]
    run.set(**fields)
    return {**fields, "env": env}


def note_library_drift(ctx: StudyContext, run: Run, train_run_id: str, env: dict[str, Any]) -> dict[str, dict]:
    """Warn, one line per library, when torch, transformers, tokenizers or peft differ from the versions the train
    run ``train_run_id`` recorded in its ``env.json`` (:func:`tuneproof.preflight.envinfo.library_drift`; ``env``:
    this run's snapshot), and record them in ``run``'s summary as ``library_drift``
    (``{"train_run", "libraries": {library: {"train", "now"}}}``). Returns the libraries that differ."""
    drift = library_drift(ctx.registry.run_json(train_run_id, "env.json"), env)
    for name, v in drift.items():
        console.print(
            f"[yellow]warning[/]: {name} {v['now']} here, {v['train']} when {train_run_id} was trained: "
            "what the saved model computes may differ"
        )
    if drift:
        run.update_summary(library_drift={"train_run": train_run_id, "libraries": drift})
    return drift


def say(msg: str) -> None:
    console.print(msg)


def run_dir(ctx: StudyContext, run_id: str) -> Path:
    return ctx.registry.runs_dir / ctx.registry.get(run_id).id


def speedup_rules(ctx: StudyContext, model, world_size: int = 1) -> dict[str, tuple[bool, str]] | None:
    """What ``training.speedups: auto`` may try on this machine for this study
    (:func:`tuneproof.training.speedups.static_rules`): the device, the attention implementation of
    ``model``, the method, the world size. None unless the study says ``auto``."""
    if ctx.study.training.speedups != "auto":
        return None
    choice = ctx.device_choice
    config = getattr(model, "config", None)
    return static_rules(
        device_type=choice["torch_device"],
        bf16_base=bf16_base_rule(choice.get("dtype"), detect_device()),
        attention=getattr(config, "_attn_implementation", None),
        method_kind=ctx.study.method.kind,
        token_labels=ctx.head.token_labels,
        world_size=world_size,
    )
