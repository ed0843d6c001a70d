"""A completed train run's model, loaded for ``eval``, ``test`` and ``export`` after the checks that it is
the one recorded: the base model's weights (``runs/<id>/base.json``, docs/CASES.md C13), the tokenizer
(``tokenizer_identity.json`` of the run and of its baseline) and the trained weights' sha256; the base
held in the dtype and 4-bit configuration the run trained with
(:func:`tuneproof.models.build.load_trained_model`, the one loader of a saved model).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tuneproof.context import StudyContext
from tuneproof.errors import CheckFailed, TuneproofError
from tuneproof.evaluation.controls import latest_plain_baseline
from tuneproof.io import read_json
from tuneproof.models.build import load_trained_model
from tuneproof.models.identity import compare_base, compare_tokenizer, compare_trained, trained_weights_record

TOKENIZER_FILE = "tokenizer_identity.json"  # the processor identity a run records (record_inputs) and eval compares


def trained_base_weights(ctx: StudyContext, train_run_id: str) -> str:
    """The dtype the base weights of ``train_run_id`` were held in during training: its summary's
    ``base_weights``, else its recorded config's ``training.bf16_base_weights``; ``fp32`` for runs
    recorded before either existed. Evaluation loads the base in the same dtype."""
    rec = ctx.registry.get(train_run_id)
    if rec.summary.get("base_weights") in ("fp32", "bf16"):
        return rec.summary["base_weights"]
    cfg = ctx.registry.run_json(rec.id, "config.json") or {}
    return "bf16" if ((cfg.get("training") or {}).get("bf16_base_weights")) else "fp32"


def load_trained(ctx: StudyContext, train_run_id: str):
    """The base model with the adapter (or full weights) of a completed train run, on the device,
    by :func:`tuneproof.models.build.load_trained_model`: the base's weights in the dtype training
    held them in (:func:`trained_base_weights`), a QLoRA base in 4-bit with the configuration the run
    trained on (its summary's ``quantization``, not the study's current one).

    Raises:
        TuneproofError: not a train run, not completed, or no saved adapter.
        CheckFailed: the base or tokenizer differs from the recorded one (:func:`check_base`, :func:`check_tokenizer`).
    """
    rec = ctx.registry.get(train_run_id)
    if rec.kind != "train":
        raise TuneproofError(f"run {rec.id} is a {rec.kind} run, not a train run")
    if rec.status not in ("completed",):
        raise TuneproofError(
            f"train run {rec.id} is {rec.status}" + (f" ({rec.reason})" if rec.reason else ""),
            hint=f"resume it (`tuneproof resume {rec.id}`) or pick a completed run",
        )
    check_base(ctx, rec.id)
    check_tokenizer(ctx, rec.id, f"loading train run {rec.id}")
    device, _, _ = ctx.torch_setup()
    folder = trained_folder(ctx, rec.id)
    if folder.name == "adapter" and not (folder / "adapter_config.json").exists():
        raise TuneproofError(f"{folder}: no adapter_config.json", hint="the train run saved no adapter")
    model = load_trained_model(
        ctx.base,
        ctx.head,
        folder,
        labels=ctx.head_labels,
        quantization=rec.summary.get("quantization"),
        base_weights=trained_base_weights(ctx, rec.id),
        source="run",
    )
    return model.to(device)


def trained_folder(ctx: StudyContext, train_run_id: str) -> Path:
    """``runs/<id>/model`` for a full fine-tuning run (it holds ``config.json``), else ``runs/<id>/adapter``."""
    run_dir = ctx.registry.runs_dir / ctx.registry.get(train_run_id).id
    return run_dir / "model" if (run_dir / "model" / "config.json").exists() else run_dir / "adapter"


def check_trained_weights(
    ctx: StudyContext, train_run_id: str, command: str, recorded: dict[str, Any] | None = None, by: str = ""
) -> dict[str, Any]:
    """The sha256 of the adapter (or full model) ``train_run_id`` saved, as it is on disk now
    (:func:`tuneproof.models.identity.trained_weights_record`), checked against ``recorded`` (default:
    the train run's summary ``trained_weights``, recorded when it saved them; ``by`` names who recorded
    it). A run recorded before the hash existed is not compared (nothing recorded: the record is
    returned as found).

    Raises:
        CheckFailed: a file differs (exit 3): one line naming ``command``, the file and both hashes.
    """
    rec = ctx.registry.get(train_run_id)
    folder = trained_folder(ctx, rec.id)
    found = trained_weights_record(folder)
    if recorded is None:
        recorded, by = rec.summary.get("trained_weights"), f"train run {rec.id} recorded when it saved them"
    if recorded:
        diff = compare_trained(recorded, found)
        if diff:
            name, want, got = diff[0]
            more = f" ({len(diff) - 1} more file(s) differ)" if len(diff) > 1 else ""
            raise CheckFailed(
                f"{command} refused: {folder / name} has sha256 {got}, not the {want} {by}{more}",
                hint=f"restore the files train run {rec.id} saved, or train again",
            )
    return found


def check_base(ctx: StudyContext, train_run_id: str) -> None:
    """Refuse when the study's base model differs from the one ``train_run_id`` started from: the
    sha256 of its weight files and ``config.json`` recorded in ``runs/<id>/base.json`` (docs/CASES.md C13).

    Raises:
        CheckFailed: names the base folder, the run, and both hashes of each differing file.
    """
    rec = ctx.registry.get(train_run_id)
    path = ctx.registry.runs_dir / rec.id / "base.json"
    if not path.exists():  # a run trained before base.json was recorded
        return
    problems = compare_base(read_json(path), ctx.base)
    if problems:
        raise CheckFailed(
            f"the base model {ctx.base.path} differs from the one run {rec.id} was trained on: " + "; ".join(problems),
            hint="point model.base at the exact base the run was trained on "
            "(tuneproof --rehash ... if the hash cache is stale)",
        )


def check_tokenizer(ctx: StudyContext, train_run_id: str, command: str) -> None:
    """Refuse ``command`` (eval, test, export) when the study's tokenizer now differs from the one
    recorded by the train run and by the baseline it was trained against (its ``baseline_run``, else
    the latest completed baseline): class, vocabulary size and token -> id map, special and added
    tokens, chat template, the ids of the fixed probe text and of the study's probe sample
    (docs/CASES.md C13 kind). Runs recorded before ``tokenizer_identity.json`` existed are not compared.

    Raises:
        CheckFailed: names the run(s), each differing key with both values (exit 3).
    """
    rec = ctx.registry.get(train_run_id)
    base_id = rec.summary.get("baseline_run")
    baseline = ctx.registry.get(base_id) if base_id else latest_plain_baseline(ctx.registry)
    now = ctx.tokenizer_identity
    refs = []
    for r in (rec, baseline):
        path = ctx.registry.runs_dir / r.id / TOKENIZER_FILE if r is not None else None
        if path is not None and path.exists():
            problems = compare_tokenizer(read_json(path), now)
            if problems:
                refs.append((r, problems))
    if refs:
        named = " and ".join(f"{r.kind} run {r.id}" for r, _ in refs)
        raise CheckFailed(
            f"{command} refused: the tokenizer of {ctx.base.path} differs from the one recorded by {named}: "
            + "; ".join(refs[0][1]),
            hint="restore the tokenizer files the run was trained with, or run the "
            "baseline and train again with this tokenizer",
        )
