"""The fresh-process reload of the smoke pass (and of distributed training's save-and-verify): the
saved adapter (or full model) is loaded onto the base in a new Python process that predicts the same
examples, so what was saved is all that is needed to reproduce the model.

Child entry point: ``python -m tuneproof.preflight.reload reload SPEC OUT`` (started by
:func:`reload_in_fresh_process`; it dies with its parent, :func:`tuneproof.procs.die_with_parent`).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

from tuneproof import procs
from tuneproof.context import StudyContext
from tuneproof.data.examples import Example
from tuneproof.errors import TuneproofError
from tuneproof.evaluation.predict import predict
from tuneproof.io import read_json, write_json
from tuneproof.models.base import BaseModelRef, load_model
from tuneproof.models.method import load_adapter_onto

RELOAD_TIMEOUT_S = 1800  # the fresh-process reload (imports, model load, generation)


def load_saved(ctx: StudyContext, payload: Path, payload_kind: str):
    """The model saved in ``payload``: the full model (``payload_kind`` ``"model"``), or the base held
    as in training (qlora: 4-bit; ``training.bf16_base_weights``: bf16) with the adapter as saved, on the
    study's device."""
    device, _, _ = ctx.torch_setup()
    labels = ctx.head_labels
    if payload_kind == "model":
        ref = BaseModelRef(
            ctx.base.name,
            payload,
            ctx.base.revision,
            ctx.model_kind,
            "preflight-smoke",
            trust_remote_code=ctx.base.trust_remote_code,
        )
        return load_model(ref, ctx.head, labels=labels, saved=True).to(device)
    base = load_model(ctx.base, ctx.head, labels=labels, quantization=ctx.quantization)
    return load_adapter_onto(base, payload, ctx.base_weights).to(device)


def reload_in_fresh_process(
    ctx: StudyContext, smoke_dir: Path, payload: Path, payload_kind: str, examples: list
) -> dict[str, Any]:
    """Load base + saved adapter (or the saved full model) in a new Python process and predict ``examples``.

    Returns the child's ``{"predictions", "scores", "load_seconds", "predict_seconds"}`` plus
    ``"seconds"`` (wall-clock of the whole child process: start, imports, load, prediction).

    Raises:
        TuneproofError: the child failed (its last lines of output are shown).
    """
    spec = {
        "study_dir": str(ctx.study_dir),
        "data_root": str(ctx.data_root) if ctx.data_root else None,
        "config": ctx.config,
        # the parent's device and dtype, as checked there: the child reproduces that model, it does not
        # choose again (a CPU without native bf16 refuses training.bf16_base_weights; tests pin the choice)
        "device_choice": ctx.device_choice,
        "payload": str(payload),
        "payload_kind": payload_kind,
        "examples": [
            {
                "id": e.id,
                "text": e.text,
                "label": e.label,
                "target": e.target,
                **({"image": e.meta["image"]} if e.meta.get("image") else {}),
                **({"context": e.context} if e.context else {}),
            }
            for e in examples
        ],
    }
    spec_path, out_path = smoke_dir / "reload_spec.json", smoke_dir / "reload_outputs.json"
    write_json(spec_path, spec)
    if out_path.exists():
        out_path.unlink()
    env = dict(os.environ, TUNEPROOF_PARENT_PID=str(os.getpid()), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "tuneproof.preflight.reload", "reload", str(spec_path), str(out_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=RELOAD_TIMEOUT_S,
        check=False,
    )
    seconds = time.perf_counter() - t0
    if not out_path.exists():
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
        raise TuneproofError(f"the reload process exited with code {proc.returncode} without output:\n{tail}")
    out = read_json(out_path)
    if out.get("error"):
        raise TuneproofError(f"the reload process failed: {out['error']}")
    out["seconds"] = seconds
    return out


def reload_main(argv: list[str]) -> int:
    """``python -m tuneproof.preflight.reload reload SPEC OUT``: the child of :func:`reload_in_fresh_process`.
    Writes ``OUT`` (the predictions and :meth:`~tuneproof.modalities.base.Modality.scores`, or the error);
    returns 0, or 2 for a wrong command line."""
    procs.die_with_parent()  # a killed preflight leaves no orphaned reload process
    if len(argv) != 3 or argv[0] != "reload":
        sys.stderr.write("usage: python -m tuneproof.preflight.reload reload SPEC OUT\n")
        return 2
    warnings.filterwarnings("ignore")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    spec, out = read_json(argv[1]), Path(argv[2])
    try:
        ctx = StudyContext.open(spec["study_dir"], spec.get("data_root"), config=spec["config"])
        if spec.get("device_choice"):
            ctx.device_choice = spec["device_choice"]  # the parent's choice (reload_in_fresh_process)
        t0 = time.perf_counter()
        model = load_saved(ctx, Path(spec["payload"]), spec["payload_kind"])
        t1 = time.perf_counter()
        examples = [
            Example(
                id=e["id"],
                text=e["text"],
                label=e["label"],
                target=e["target"],
                meta={"image": e["image"]} if e.get("image") else {},
                context=e.get("context") or [],
            )
            for e in spec["examples"]
        ]
        preds = predict(ctx, model, examples, "reload")
        scores = ctx.modality.scores(ctx, model, examples)
        write_json(
            out,
            {
                "predictions": preds,
                "scores": scores,
                "load_seconds": t1 - t0,
                "predict_seconds": time.perf_counter() - t1,
            },
        )
    except Exception as err:  # noqa: BLE001 - reported to the parent
        write_json(out, {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()})
    return 0


if __name__ == "__main__":
    sys.exit(reload_main(sys.argv[1:]))
