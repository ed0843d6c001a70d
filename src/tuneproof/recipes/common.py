"""Pieces shared by the recipes: recording a run's evidence, loading a trained model, evaluating."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tuneproof.context import StudyContext
from tuneproof.data.examples import Example
from tuneproof.errors import CheckFailed, TuneproofError
from tuneproof.evaluation.backends import (
    BackendCheckFailed,
    TransformersBackend,
    VllmBackend,
    backend_check_sample,
    check_backend_available,
    check_backends,
    check_summary,
    lora_rank,
)
from tuneproof.evaluation.fingerprint import study_eval_fingerprint
from tuneproof.evaluation.outputs import EvalProgress, also_record, read_outputs, record_outputs_hash
from tuneproof.evaluation.predict import predict
from tuneproof.evaluation.screen import screen_lines
from tuneproof.io import read_json, sha256_json, write_jsonl
from tuneproof.models.base import BaseModelRef, load_model
from tuneproof.models.device import bf16_base_rule, detect_device
from tuneproof.models.identity import compare_base, compare_tokenizer, compare_trained, trained_weights_record
from tuneproof.models.method import base_weights_dtype, load_adapter_onto
from tuneproof.preflight.envinfo import environment_snapshot, library_drift
from tuneproof.registry import Run
from tuneproof.study import STUDY_FILE
from tuneproof.tasks import get_task, task_config
from tuneproof.training.speedups import static_rules
from tuneproof.ui import console, progress_bar, user_text

TOKENIZER_FILE = "tokenizer_identity.json"


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


def served_paths(ctx: StudyContext, train_run_id: str | None) -> tuple[Path, Path | None]:
    """``(model folder, adapter folder or None)`` a serving backend loads for ``train_run_id``: the
    base and ``runs/<id>/adapter`` for a LoRA run, ``runs/<id>/model`` and None for full fine-tuning,
    the base and None for ``None`` (the base model itself)."""
    if train_run_id is None:
        return Path(ctx.base.path), None
    run_dir = ctx.registry.runs_dir / ctx.registry.get(train_run_id).id
    if (run_dir / "model" / "config.json").exists():
        return run_dir / "model", None
    return Path(ctx.base.path), run_dir / "adapter"


def require_backend(ctx: StudyContext) -> None:
    """Refuse an evaluation whose ``eval.backend`` cannot run here (before any run is created; exit 2,
    :func:`tuneproof.evaluation.backends.check_backend_available`)."""
    if ctx.study.eval.backend != "transformers":
        check_backend_available(ctx.study.eval, ctx.model_kind, ctx.study_dir / STUDY_FILE)


@contextlib.contextmanager
def evaluation_run(ctx: StudyContext, kind: str, *, parent: str | None = None) -> Iterator[Run]:
    """``ctx.registry.run(kind)`` for an evaluation-like run (baseline, eval, test): a refused backend
    check (:class:`~tuneproof.evaluation.backends.BackendCheckFailed`) leaves the run ``invalid`` with
    the check's one-line reason (not ``failed``), and is re-raised (exit 3)."""
    run = None
    try:
        with ctx.registry.run(kind, parent=parent) as run:
            yield run
    except BackendCheckFailed as fault:
        if run is not None:
            ctx.registry.invalidate(run.id, fault.reason)
        raise


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
    """The base model with the adapter (or full weights) of a completed train run, on the device;
    the base's weights in the dtype training held them in (:func:`trained_base_weights`)."""
    rec = ctx.registry.get(train_run_id)
    if rec.kind != "train":
        raise TuneproofError(f"run {rec.id} is a {rec.kind} run, not a train run")
    if rec.status not in ("completed",):
        raise TuneproofError(
            f"train run {rec.id} is {rec.status}" + (f" ({rec.reason})" if rec.reason else ""),
            hint=f"resume it (`tuneproof resume {rec.id}`) or pick a completed run",
        )
    run_dir = ctx.registry.runs_dir / rec.id
    check_base(ctx, rec.id)
    check_tokenizer(ctx, rec.id, f"loading train run {rec.id}")
    device, _, _ = ctx.torch_setup()
    model_dir = run_dir / "model"
    labels = ctx.head_labels
    if (model_dir / "config.json").exists():  # full fine-tuning
        ref = BaseModelRef(
            ctx.base.name,
            model_dir,
            ctx.base.revision,
            ctx.model_kind,
            "run",
            trust_remote_code=ctx.base.trust_remote_code,
        )
        return load_model(ref, ctx.head, labels=labels, saved=True).to(device)
    adapter = run_dir / "adapter"
    if not (adapter / "adapter_config.json").exists():
        raise TuneproofError(f"{adapter}: no adapter_config.json", hint="the train run saved no adapter")
    # qlora: the base in 4-bit with the config the run trained on (its summary), not the study's current one
    base = load_model(ctx.base, ctx.head, labels=labels, quantization=rec.summary.get("quantization"))
    # training.bf16_base_weights: the base's weights in bf16 as training held them, the adapter in fp32
    return load_adapter_onto(base, adapter, trained_base_weights(ctx, rec.id)).to(device)


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
    baseline = ctx.registry.get(base_id) if base_id else ctx.registry.latest("baseline")
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


def predict_served(
    ctx: StudyContext,
    run: Run,
    model,
    examples: list[Example],
    what: str,
    served: tuple[Path, Path | None],
    check_examples: list[Example] | None = None,
    on_progress=None,
) -> list[str]:
    """Predictions by ``eval.backend: vllm`` after its backend check passed
    (:func:`tuneproof.evaluation.backends.check_backends` on the seeded sample, against the
    transformers ``model``). The check's result goes to ``backend_check.json`` and the summary's
    ``backend_check``, the backend's identity to ``eval_backend``, before anything else. The sample is
    drawn from ``check_examples`` (default ``examples``; ``test`` checks on the evaluation split, so a
    refused check has not read the reserved test split).

    Raises:
        BackendCheckFailed: the check refused the backend (no prediction is made).
    """
    ev = ctx.study.eval
    device, _, autocast = ctx.torch_setup()
    model_path, adapter = served
    reference = TransformersBackend(model, ctx.tokenizer, ev, device=device, autocast=autocast, adapter_dir=adapter)
    candidate = VllmBackend(
        model_path,
        ctx.tokenizer,
        tokenizer_path=ctx.base.path,
        dtype=ctx.device_choice.get("dtype") or "auto",
        max_lora_rank=lora_rank(adapter),
        seed=ctx.study.training.seed,
        trust_remote_code=ctx.base.trust_remote_code,
    )
    sample = backend_check_sample(
        examples if check_examples is None else check_examples, ev.backend_check_examples, ev.seed
    )
    t0 = time.perf_counter()
    with progress_bar(f"{what}: backend check", len(sample)) as advance:
        result = check_backends(
            reference,
            candidate,
            [ctx.pipeline.prompt_text(e) for e in sample],
            [e.id for e in sample],
            max_new_tokens=ev.max_new_tokens,
            adapter_dir=adapter,
            min_agreement=ev.backend_check_min_agreement,
            between=reference.release,
        )
        advance(len(sample))
    run.write_json("backend_check.json", result)
    run.update_summary(
        eval_backend=candidate.identity(),
        backend_check=check_summary(result),
        backend_check_seconds=round(time.perf_counter() - t0, 6),
    )
    if not result["passed"]:
        raise BackendCheckFailed(result["reason"], run.id)
    console.print(f"[dim]{result['name']}: {user_text(result['message'])}[/]", soft_wrap=True)
    with progress_bar(what, len(examples)) as bar:
        advance = bar if on_progress is None else also_record(bar, on_progress)
        return candidate.generate(
            [ctx.pipeline.prompt_text(e) for e in examples], ev.max_new_tokens, adapter, progress=advance
        )


def evaluate_into(
    ctx: StudyContext,
    run: Run,
    model,
    examples: list[Example],
    what: str,
    *,
    required_fields: list[str] | None = None,
    eval_cfg: Any = None,
    served: tuple[Path, Path | None] | None = None,
    check_examples: list[Example] | None = None,
) -> dict[str, Any]:
    """Predict, score with the task's metrics, write ``outputs.jsonl`` and the run summary.

    ``required_fields`` / ``eval_cfg`` score with another definition than the study file's
    (``test`` scores with the hypothesis frozen before training); prediction always follows the study.
    ``served``: what a serving backend loads (:func:`served_paths`; default the base model); used
    with ``eval.backend: vllm``, whose check runs first on a sample of ``check_examples`` (default
    ``examples``; :func:`predict_served`)."""
    t0 = time.perf_counter()
    progress = EvalProgress(run.dir, len(examples))  # where a killed evaluation stopped (compare says so)
    try:
        if ctx.study.eval.backend == "vllm":
            served = served or served_paths(ctx, None)
            preds = predict_served(ctx, run, model, examples, what, served, check_examples, on_progress=progress)
        else:
            import transformers  # noqa: PLC0415 - transformers loads only when evaluate_into() runs

            run.update_summary(eval_backend={"name": "transformers", "version": transformers.__version__})
            preds = predict(ctx, model, examples, what, on_progress=progress)
    finally:
        progress.flush()
    seconds = time.perf_counter() - t0
    records = [
        {"id": e.id, "category": e.label, "input": e.text, "reference": e.target, "prediction": p}
        for e, p in zip(examples, preds)
    ]
    records, metrics = get_task(ctx.task).score(
        records, task_config(ctx, required_fields=required_fields, eval_cfg=eval_cfg)
    )
    write_jsonl(run.path("outputs.jsonl"), records)
    record_outputs_hash(run)  # compare/show/report/export refuse the file once its bytes change
    held = base_weights_dtype(model)  # what the evaluated model's base weights really were held in
    base_weights = held if held in ("fp32", "bf16") else "fp32"
    efp = study_eval_fingerprint(ctx, examples, base_weights=base_weights)
    run.write_json(
        "eval.json",
        {
            "fingerprint": efp,
            "split": ctx.study.eval.split,
            "n": len(examples),
            "metrics": metrics,
            "base_weights": base_weights,
        },
    )
    run.set(eval_fingerprint=efp["hash"])
    run.update_summary(
        metrics=headline(ctx.task, metrics),
        eval_seconds=round(seconds, 6),
        n_eval=len(examples),
        eval_examples_per_s=round(len(examples) / max(seconds, 1e-9), 3),
        base_weights=base_weights,
    )
    return metrics


def print_metrics(ctx: StudyContext, metrics: dict[str, Any]) -> None:
    """The evaluation's headline on screen: worst classes / fields with their numbers, then the
    averages with their names (:func:`tuneproof.evaluation.screen.screen_lines`)."""

    for line in screen_lines(get_task(ctx.task), metrics):
        console.print(user_text(line), soft_wrap=True)


def headline(task: str, metrics: dict[str, Any]) -> dict[str, float]:
    """The task's headline metrics (scalars only) for summaries and tables."""
    return get_task(task).summary_for(metrics)


def load_outputs(ctx: StudyContext, run_id: str) -> tuple[Any, list[dict]]:
    """``(record, outputs)`` of an evaluation-like run (baseline, eval, test).

    Raises:
        TuneproofError: the run has no ``outputs.jsonl``, or its sha256 differs from the one
            recorded when the run wrote it (names the file and both hashes).
        CheckFailed: the run's ``run.json`` was edited after it was written (:meth:`Registry.check_record`).
    """
    rec = ctx.registry.check_record(run_id)  # the outputs' sha256 comes from the record: an edited run.json is refused
    path = ctx.registry.runs_dir / rec.id / "outputs.jsonl"
    if not path.exists():
        raise TuneproofError(
            f"run {rec.id} ({rec.kind}, {rec.status}) has no per-example outputs ({path})",
            hint="compare needs baseline/eval runs; for a train run, run `tuneproof eval` first",
        )
    return rec, read_outputs(path, rec)


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
        token_labels=ctx.model_kind == "causal-lm",
        world_size=world_size,
    )
