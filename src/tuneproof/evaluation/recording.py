"""An evaluation recorded into a run (``baseline``, ``eval``, ``test``): the backend refused before a run
exists, the predictions (transformers, or vLLM after its backend check), the task's scores,
``outputs.jsonl`` bound to the run by its sha256, the outputs on ``eval.sets`` bound the same way
(:mod:`tuneproof.evaluation.eval_sets`), ``eval.json`` with the evaluation fingerprint, the
summary's headline; what an evaluation prints; a recorded run's outputs read back.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tuneproof.context import StudyContext
from tuneproof.data.examples import Example
from tuneproof.errors import TuneproofError
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
from tuneproof.evaluation.eval_sets import evaluate_sets
from tuneproof.evaluation.fingerprint import study_eval_fingerprint
from tuneproof.evaluation.noise import (
    NOISE_JSON,
    noise_record,
    noise_summary,
    repeat_order,
    sampling_seed,
    seed_sampling,
)
from tuneproof.evaluation.outputs import EvalProgress, also_record, read_outputs, record_outputs_hash
from tuneproof.evaluation.predict import predict
from tuneproof.evaluation.screen import screen_lines
from tuneproof.io import read_json, sha256_file, write_jsonl
from tuneproof.models.method import base_weights_dtype
from tuneproof.registry import Run
from tuneproof.study import STUDY_FILE
from tuneproof.tasks import get_task, task_config
from tuneproof.ui import console, progress_bar, user_text


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
    :func:`tuneproof.evaluation.backends.check_backend_available`), or whose ``eval.sets`` cannot be read
    (exit 2, :func:`tuneproof.data.eval_sets.load_eval_sets`: a missing file, a row without its text column, an
    empty set, a guard that needs references on a set without them)."""
    ctx.eval_sets  # noqa: B018 - read and checked now, before a run exists
    if ctx.study.eval.backend != "transformers":
        check_backend_available(ctx.study.eval, ctx.head, ctx.study_dir / STUDY_FILE)


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


def predict_served(
    ctx: StudyContext,
    run: Run,
    model,
    examples: list[Example],
    what: str,
    served: tuple[Path, Path | None],
    check_examples: list[Example] | None = None,
    on_progress=None,
    raw_out: list[str] | None = None,
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
    stops = getattr(ctx.pipeline, "stop_ids", None)
    reference = TransformersBackend(
        model, ctx.tokenizer, ev, device=device, autocast=autocast, adapter_dir=adapter, stop_ids=stops
    )
    candidate = VllmBackend(
        model_path,
        ctx.tokenizer,
        tokenizer_path=ctx.base.path,
        dtype=ctx.device_choice.get("dtype") or "auto",
        max_lora_rank=lora_rank(adapter),
        seed=ctx.study.training.seed,
        trust_remote_code=ctx.base.trust_remote_code,
        stop_ids=stops,
        answer_from=ev.answer_from,
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
            [ctx.pipeline.prompt_text(e) for e in examples],
            ev.max_new_tokens,
            adapter,
            progress=advance,
            raw_out=raw_out,
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
    beat: Any = None,
) -> dict[str, Any]:
    """Predict, score with the task's metrics, write ``outputs.jsonl`` and the run summary; then generate each of
    ``eval.sets`` with the same model and procedure, once, after the split's first pass
    (:func:`tuneproof.evaluation.eval_sets.evaluate_sets`: ``sets/<name>/outputs.jsonl``, their sha256 in the summary,
    ``eval.json``'s ``sets``) before ``eval.json``.

    ``required_fields`` / ``eval_cfg`` score with another definition than the study file's
    (``test`` scores with the hypothesis frozen before training); prediction always follows the study.
    ``served``: what a serving backend loads (:func:`served_paths`; default the base model); used
    with ``eval.backend: vllm``, whose check runs first on a sample of ``check_examples`` (default
    ``examples``; :func:`predict_served`). ``beat``: the command's heartbeat (:func:`tuneproof.ui.heartbeat`),
    told ``repeat r of N`` with ``eval.repeat`` > 1.

    ``eval.repeat: N`` > 1 evaluates the model N times (:mod:`tuneproof.evaluation.noise`): repeat 1 as above (its
    outputs are the run's), repeats 2..N on a seeded permutation of the examples batched in that order (with
    ``eval.do_sample``, each repeat its own sampling seed); ``noise.json`` records each metric per repeat, its
    spread (the noise floor) and the per-example flips; ``eval.json`` then holds ``"repeats": N``. With N = 1 the
    run's files are exactly what they were before the key existed. An interruption in any repeat leaves the run
    interrupted (the registry's run context), never completed.
    (``eval.repeat`` > 1 with ``eval.backend: vllm`` is refused when the study file is read.)
    """
    ev = ctx.study.eval
    n_rep = ev.repeat if ev.backend == "transformers" else 1
    seeds = [sampling_seed(ev.seed, r) if ev.do_sample and n_rep > 1 else None for r in range(n_rep)]
    label = (lambda r: f"{what} (repeat {r + 1} of {n_rep})") if n_rep > 1 else (lambda r: what)
    t0 = time.perf_counter()
    # where a killed evaluation stopped (compare says so); eval.sets are generated after the split's first pass, in
    # the same count
    progress = EvalProgress(run.dir, len(examples) + sum(len(s.examples) for s in ctx.eval_sets), repeats=n_rep)
    if ev.backend == "vllm":
        served = served or served_paths(ctx, None)
    else:
        import transformers  # noqa: PLC0415 - transformers loads only when evaluate_into() runs

        run.update_summary(eval_backend={"name": "transformers", "version": transformers.__version__})

    def generate(items: list[Example], label: str, raw_out: list[str]) -> list[str]:
        """The study's one procedure on ``items`` (the split, then each of eval.sets)."""
        if ev.backend == "vllm":
            return predict_served(
                ctx, run, model, items, label, served, check_examples, on_progress=progress, raw_out=raw_out
            )
        return predict(ctx, model, items, label, on_progress=progress, raw_out=raw_out)

    raw: list[str] = []  # the generations before eval.answer_from parsed them (empty for a classifier)
    if beat is not None and n_rep > 1:
        beat.update(f"evaluating {len(examples)} examples, repeat 1 of {n_rep}")
    try:
        seed_sampling(seeds[0])
        preds = generate(examples, label(0), raw)
    finally:
        progress.flush()
    scoring = task_config(ctx, required_fields=required_fields, eval_cfg=eval_cfg, examples=examples)
    records, metrics = get_task(ctx.task).score(_rows(examples, preds, raw), scoring)
    try:  # eval.sets: the same model, prompt and decoding; outputs bound to the run like outputs.jsonl
        sets = evaluate_sets(ctx, run, generate, what)
    finally:
        progress.flush()
    noise = None
    if n_rep > 1:
        repeats = [(records, metrics)]
        orders = [repeat_order(len(examples), 0, ev.seed)]
        for r in range(1, n_rep):
            if beat is not None:
                beat.update(f"evaluating {len(examples)} examples, repeat {r + 1} of {n_rep}")
            order = repeat_order(len(examples), r, ev.seed)
            shuffled = [examples[i] for i in order]
            rep_progress = EvalProgress(run.dir, len(examples), repeat=r + 1, repeats=n_rep)
            raw_r: list[str] = []
            try:
                seed_sampling(seeds[r])
                got = predict(ctx, model, shuffled, label(r), rep_progress, raw_r, sort_by_length=False)
            finally:
                rep_progress.flush()
            back, raw_back = [""] * len(examples), [""] * len(raw_r)
            for k, i in enumerate(order):  # the canonical order again, so the repeats pair example by example
                back[i] = got[k]
                if raw_r:
                    raw_back[i] = raw_r[k]
            repeats.append(get_task(ctx.task).score(_rows(examples, back, raw_back), scoring))
            orders.append(order)
        device, _, _ = ctx.torch_setup()
        noise = noise_record(
            [m for _, m in repeats],
            [rows for rows, _ in repeats],
            orders=orders,
            seeds=seeds,
            device=str(getattr(device, "type", device)),
            do_sample=ev.do_sample,
        )
    seconds = time.perf_counter() - t0
    write_jsonl(run.path("outputs.jsonl"), records)
    record_outputs_hash(run)  # compare/show/report/export refuse the file once its bytes change
    if noise is not None:
        run.write_json(NOISE_JSON, noise)
        run.update_summary(
            eval_repeats=n_rep, noise_sha256=sha256_file(run.path(NOISE_JSON)), noise=noise_summary(noise)
        )
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
            **({"repeats": n_rep} if n_rep > 1 else {}),
            **({"sets": sets} if sets else {}),
        },
    )
    run.set(eval_fingerprint=efp["hash"])
    run.update_summary(
        metrics=headline(ctx.task, metrics),
        eval_seconds=round(seconds, 6),  # all repeats
        n_eval=len(examples),
        eval_examples_per_s=round(n_rep * len(examples) / max(seconds, 1e-9), 3),  # predictions per second
        base_weights=base_weights,
    )
    return metrics


def _rows(examples: list[Example], preds: list[str], raw: list[str]) -> list[dict[str, Any]]:
    """The rows of ``outputs.jsonl`` before scoring, one per example in their order (``raw`` when recorded)."""
    return [
        {"id": e.id, "category": e.label, "input": e.text, "reference": e.target, "prediction": p}
        | ({"raw": raw[k]} if len(raw) == len(preds) else {})
        for k, (e, p) in enumerate(zip(examples, preds))
    ]


def print_noise(ctx: StudyContext, run: Run) -> None:
    """One line of ``noise.json`` when the run repeated its evaluation: the spread over the repeats of each of
    the task's headline metrics (and the success metric), with its values, and the per-example flips, e.g.
    ``noise floor (3 repeats): accuracy 0.0167 (0.733, 0.75, 0.733); per-example flips 2
    (runs/r0002/noise.json)`` (every metric is in the file)."""
    path = run.path(NOISE_JSON)
    if not path.is_file():
        return
    noise = read_json(path)
    shown = list(headline(ctx.task, {k: v["values"][0] for k, v in noise["metrics"].items()}))
    success = ctx.study.hypothesis.success.metric  # the floor compare judges the gain above
    shown += [success] if success not in shown else []
    parts = [
        f"{k} {noise['metrics'][k]['spread']:.4g} ("
        + ", ".join(f"{x:.4g}" for x in noise["metrics"][k]["values"])
        + ")"
        for k in shown
        if k in noise["metrics"]
    ]
    console.print(
        user_text(
            f"noise floor ({noise['repeats']} repeats): " + "; ".join(parts) + f"; per-example flips "
            f"{noise['flips']['count']} (runs/{run.id}/{NOISE_JSON})"
        ),
        soft_wrap=True,
    )


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
