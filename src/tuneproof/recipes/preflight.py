"""Recipe ``preflight``: the initial-check phase that fails before the rental hours are spent
(docs/PROTOCOL.md steps 4, 5 and 6). One registry run of kind ``preflight``; every check below is a
dict ``{"name", "passed", "numbers", "message", "details"}`` stored in ``runs/<id>/preflight.json``
and summarised in the run summary. Any failed check fails the run (exit 3) after the report is
written; ``train`` refuses to start without a passed preflight for the same resolved config (keys
that cannot change what it measured left out, :mod:`tuneproof.preflight.scope`), data fingerprint
and platform (:func:`require_preflight`). This module runs the checks in the order of the one table
:data:`tuneproof.preflight.checks.CHECKS` (what applies when, for which modality, what is skipped after a
failure); each one lives in the ``tuneproof.preflight`` module named after it in brackets.

Checks, in order (config key or option behind each):

1. ``environment`` [environment]: :func:`~tuneproof.preflight.envinfo.environment_snapshot` compared
   with the ``env.json`` of the latest completed baseline or train run; a platform change is flagged
   with the checks to redo (a flag, not a failure: the baseline is what must be redone).
2. ``backend`` [backend]: dtype for ``training.precision`` on the detected device, with the reason
   (docs/CASES.md C9); extensions named by the config (``training.extensions``: not in the study schema yet,
   so none by default) installed and built for this backend.
3. ``training data`` [training_data]: the train split through the trainer's exact preprocessing; no
   hard fault (what ``train`` refuses); token lengths p50/p95/max after truncation
   (``training.max_length``).
4. ``target modules`` [targets]: matches per pattern of ``method.target_modules`` (zero matches
   fails, docs/CASES.md C5), per tower on encoder-decoder and multimodal models (a pattern matching in several
   towers is a warning); ``trainable parameters``: trainable/total and ``method.modules_to_save``;
   ``embedding size``: embedding rows vs the tokenizer, added tokens trained and saved.
4b. ``bf16 base weights`` [precision] (only with ``training.bf16_base_weights: true``): loss and
   trained gradients with the frozen weights in bf16 vs fp32 on the configured micro-batch, within
   stated tolerances, and the peak memory with each; the later checks then run with bf16 frozen
   weights (``gradient accumulation`` and ``precision``, which compute in fp32 without autocast, run
   just before it, on the fp32 weights).
5. ``update check`` [update_check]: the model built exactly as ``train`` builds it
   (``StudyContext.build_model``), real optimizer steps on a real train micro-batch under the
   configured precision: every trainable tensor changed, every frozen tensor bitwise unchanged (docs/CASES.md C7);
   the model is restored.
5b. ``qlora storage`` and ``qlora step`` [qlora] (only with ``method.kind: qlora``): the 4-bit
   storage dtype is shardable when ``distributed.strategy`` is fsdp (this single process shards
   nothing: a warning; ``train --nproc-per-node N`` refuses); one real step on the probe micro-batch
   has a finite, non-zero loss and LoRA gradient norm (the silent loss 0.0 / grad NaN failure).
6. ``step memory`` [step_memory]: complete steps (forward, loss, backward, clipping, AdamW step) at
   the configured micro-batch (``training.micro_batch_size``) at the p95 train length and at
   ``training.max_length``: estimate next to the measured peak (docs/CASES.md C8); fails when either exceeds
   the budget (``--memory-budget``, default the device's memory, or RAM on CPU).
   ``max micro-batch`` [step_memory] (``--find-max-micro-batch``): the largest micro-batch whose
   measured peak fits the budget at the p95 length.
   ``eval memory`` [eval_memory]: one evaluation batch at ``eval.batch_size`` (the longest prompts,
   generation with the KV cache for ``eval.max_new_tokens`` new tokens; or the classification
   forward pass), measured the same way; fails when its peak exceeds the budget, naming
   ``eval.batch_size``.
7. ``gradient accumulation`` [accumulation]: ``max(2, training.gradient_accumulation_steps)`` real
   micro-batches vs their concatenation: same loss and gradients, per-token normalisation stored
   (docs/CASES.md C1); when an epoch's micro-batches are not a multiple of the accumulation, the short last window
   of the epoch (the micro-batches training puts there) vs its concatenation too (docs/CASES.md C18).
8. ``precision`` [precision]: the chosen dtype alone vs fp32 on one real micro-batch (loss and
   gradient direction within stated tolerances; fp32 is the reference and needs no comparison).
9. ``activation checkpointing`` [activation_checkpointing]: gradients equal with and without it
   (``training.activation_checkpointing`` flipped on a second model built the same way), with the
   change in step time and memory.
9b. ``eval batch size`` [eval_batch]: greedy outputs of a length-spread sample of evaluation
    examples at batch size 1 and at ``eval.batch_size`` are identical; fails naming the first
    differing example (docs/CASES.md C22).
9c. ``packing`` [packing] (only with ``training.packing: true``): per-token losses of packed rows of
    the shortest training examples equal those of each example alone, and the same rows with the
    neighbours visible differ (docs/CASES.md C23).
9d. ``chunked loss`` [chunked_loss] (only with ``training.chunked_loss: true``): the check train
    runs before it uses the chunked loss, on the first micro-batch (packed when packing is on): loss
    and gradients equal the full-logits loss; a classification head fails it naming the key.
10. ``configured combination`` [smoke]: two real optimizer steps of ``training.loop.train`` with
    every configured option together (micro-batch, accumulation, checkpointing, precision); losses
    finite, every trainable tensor changed, frozen ones bitwise unchanged.
11. ``smoke pass`` [smoke, reload]: those steps, an evaluation of ``SMOKE_EVAL_EXAMPLES``
    evaluation examples by the study's procedure (``evaluation.predict.predict``), the adapter
    saved with ``save_pretrained`` into ``runs/<id>/smoke/``, reloaded onto the base in a fresh
    process (``python -m tuneproof.preflight.reload reload``) that predicts the same examples:
    identical predictions and next-token logits within ``RELOAD_LOGIT_ATOL`` (fp32).
12. ``throughput`` [smoke]: tokens/s and s/step at the configured micro-batch (from the smoke steps
    after the first), the time of the configured budget (``training.max_steps`` or ``epochs``) and
    of one evaluation (``eval.max_examples``); stored as ``s_per_step``, ``tokens_per_s``,
    ``eval_s_per_example``, ``budget_seconds`` (read by ``tuneproof plan``).

An image classifier measures ``step memory``, ``eval memory`` and ``eval batch size`` on images
(:mod:`tuneproof.preflight.image_checks`) and has no ``embedding size``. Every check's record is a
:func:`~tuneproof.preflight.report.check_result` collected by a
:class:`~tuneproof.preflight.report.PreflightReport`. Checks 10 to 12 are skipped
when ``step memory`` failed (the configured steps would not fit), and every check after a failed
``backend`` or ``target modules`` (no model to check); a check that raises is recorded as failed
with the error and its traceback, and the others still run.

Probes (update check, accumulation, precision, checkpointing) use micro-batches of
:data:`PROBE_MICRO_BATCH` real train examples (the first of the training order) to stay cheap;
the step memory, combination and smoke steps use the configured micro-batch.
"""

from __future__ import annotations

import contextlib
import time
import traceback
from pathlib import Path
from typing import Any

from tuneproof.context import StudyContext
from tuneproof.errors import CheckFailed, TuneproofError
from tuneproof.io import fault_cause, read_json, sha256_json
from tuneproof.preflight import bench as checks_run
from tuneproof.preflight.accumulation import training_micro_batch
from tuneproof.preflight.backend import check_backend
from tuneproof.preflight.bench import Bench
from tuneproof.preflight.checks import BY_NAME, CHECKS, PROBE_MICRO_BATCH, model_stage, skippable
from tuneproof.preflight.envinfo import environment_snapshot, platform_key
from tuneproof.preflight.environment import check_environment, default_memory_budget
from tuneproof.preflight.eval_memory import eval_batch_rate
from tuneproof.preflight.report import PreflightReport, check_result, error_message, print_header, to_gib
from tuneproof.preflight.scope import describe_changes, preflight_changes
from tuneproof.preflight.smoke import SMOKE_CHECKS, check_smoke
from tuneproof.preflight.step_memory import print_memory_plain
from tuneproof.preflight.targets import check_target_modules
from tuneproof.recipes.common import record_inputs, speedup_rules
from tuneproof.training.budget import budget as step_budget
from tuneproof.training.compiled import first_micro_batch, prove_compile, record_of, remove_compile
from tuneproof.training.loop import _micro_loss, seed_everything
from tuneproof.training.speedups import resolve_auto
from tuneproof.ui import capped, console, heartbeat, user_text

PREFLIGHT_FILE = "preflight.json"


# --------------------------------------------------------------------------- the recipe
def run_preflight(ctx: StudyContext, *, memory_budget: int | None = None, find_max_micro_batch: bool = False) -> str:
    """Run every preflight check as a registry run of kind ``preflight``; returns its id.

    Args:
        memory_budget: bytes one training step may use (``--memory-budget``, see
            :func:`tuneproof.preflight.environment.parse_memory`);
            default: the GPU's memory, or the physical RAM on CPU.
        find_max_micro_batch: also search the largest micro-batch under the budget.

    Raises:
        CheckFailed: any check failed (exit 3); ``preflight.json`` is written first and the run is
            recorded failed with the first failure as its reason.
    """
    t_start = time.perf_counter()
    with ctx.registry.run("preflight") as run, heartbeat("preflight", "environment") as beat:
        print_header(f"preflight {run.id}: one row per check (every number: runs/{run.id}/{PREFLIGHT_FILE})")
        rep = PreflightReport(beat)
        snapshot = environment_snapshot()
        rep.run("environment", lambda: check_environment(ctx, snapshot))
        backend, choice = check_backend(ctx)
        rep.add(backend)
        if backend["passed"]:
            record_inputs(ctx, run)
        else:  # ctx.device_choice would refuse: record the inputs without it
            run.write_json("config.json", ctx.config)
            run.write_json("env.json", {**snapshot, "device_choice": choice})
            fp = ctx.data_fingerprint()
            run.write_json("data.json", fp)
            run.set(config_hash=sha256_json(ctx.config), data_fingerprint=fp["hash"])
        if memory_budget:
            budget, budget_source = memory_budget, "--memory-budget"
        else:
            budget, budget_source = default_memory_budget(choice, snapshot)
        state: dict[str, Any] = {}
        study = ctx.study
        try:
            _model_checks(ctx, run, rep, choice, budget, budget_source, find_max_micro_batch, state)
        finally:
            state.pop("model", None)
            ctx.study = study  # training.speedups: auto ran the checks on its resolution; the study stays as written
        seconds = time.perf_counter() - t_start
        _write(ctx, run, rep, snapshot, platform_key(snapshot), choice, budget, budget_source, seconds)
        if state.get("speedups_auto"):
            run.update_summary(speedups_auto=state["speedups_auto"])
        if state.get("compile"):  # counted in the plan: the compile seconds come before the first step
            compile_s = state["compile"]["compile_seconds"]
            extra = {"compile_seconds": compile_s}
            if run.summary.get("budget_seconds") is not None:
                extra["budget_seconds"] = round(run.summary["budget_seconds"] + compile_s, 1)
            run.update_summary(**extra)
        _print_end(rep, run.id, seconds)
        if rep.failed:
            first = rep.failed[0]
            raise CheckFailed(
                f"preflight {run.id}: {len(rep.failed)} of {len(rep.checks)} checks failed; "
                f"{first['name']}: {first['message']}",
                hint=f"see {run.path(PREFLIGHT_FILE)}; fix the study file and run `tuneproof preflight` again",
            )
        return run.id


def _model_checks(
    ctx: StudyContext,
    run,
    rep: PreflightReport,
    choice: dict[str, Any],
    budget: int,
    budget_source: str,
    find_max: bool,
    state: dict[str, Any],
) -> None:
    """Checks 3 to 12 (those after the backend), in the order of :data:`tuneproof.preflight.checks.CHECKS`;
    a check that cannot run is listed as skipped, with why."""
    options = frozenset(["--find-max-micro-batch"] if find_max else [])
    later = skippable(ctx.study)

    def skip_rest(why: str) -> None:
        seen = {c["name"] for c in rep.checks}
        for name in later:
            if name not in seen:
                rep.skip(name, why)

    if not rep.checks[-1]["passed"]:
        return skip_rest("the backend cannot run this configuration")
    cfg = ctx.study.training
    modality = ctx.modality.name
    encoded = ctx.pipeline.encode_all(ctx.split("train"))
    training_data = getattr(checks_run, BY_NAME["training data"].run[modality])
    data_check = rep.run("training data", lambda: training_data(ctx, encoded))
    usable = [e for e in encoded if not e.faults]
    if not usable:
        return skip_rest("no usable train example")
    seed_everything(cfg.seed)  # initialisation follows training.seed, as in run_train
    model = report = failure = None
    try:
        model, report = ctx.build_model()
    except CheckFailed as err:  # a target pattern that matches nothing (docs/CASES.md C5)
        failure = str(err).splitlines()[0]
    state["model"] = model
    for c in check_target_modules(
        ctx, model, report, failure, embedding_size=modality in BY_NAME["embedding size"].run
    ):
        rep.add(c)
    if model is None:
        return skip_rest("the model could not be built (target modules)")
    run.write_json("method.json", report)
    _, _, autocast = ctx.torch_setup()
    pad = getattr(ctx.tokenizer, "pad_token_id", 0) or 0  # an image processor has no pad token (and needs none)
    probe = training_micro_batch(usable, min(PROBE_MICRO_BATCH, len(usable)), cfg.seed, 0, pad)
    if cfg.speedups == "auto":  # resolved here; every later check runs on what auto turned on
        if rep.beat is not None:
            rep.beat.update("training.speedups auto: checking each speed-up on real steps")
        _resolve_auto(ctx, rep, model, usable, pad, autocast, state)
    bench = Bench(ctx, model, usable, probe, pad, data_check, choice, budget, budget_source, autocast)
    # with training.bf16_base_weights every check after `bf16 base weights` sees the frozen weights as
    # training will hold them; the rows that need fp32 weights run before it (CHECKS' `before`)
    for check in model_stage(ctx.study, modality, options):
        fn = getattr(checks_run, check.run[modality])
        rep.run(check.name, lambda fn=fn: fn(bench))
        if check.speedup and "speedups_auto" in state and not rep.get(check.name)["passed"]:
            _auto_left_off(ctx, rep, state, check.name, check.speedup)
    for check in CHECKS:
        if modality in check.skipped_for:
            rep.skip(check.name, check.skipped_for[modality])
    if not rep.get("step memory")["passed"]:  # the configured micro-batch does not fit: its steps would not fit
        return skip_rest("the configured micro-batch does not fit the memory budget (step memory)")
    if ctx.study.training.compile:  # after the other checks (they compare eager passes); the smoke pass runs compiled
        rep.run("compile", lambda: _check_compile(ctx, model, usable, pad, autocast, state))
    _smoke(ctx, run, rep, model, usable, skip_rest)


def _resolve_auto(ctx: StudyContext, rep: PreflightReport, model, usable: list, pad: int, autocast, state: dict):
    """``training.speedups: auto``: each applicable speed-up's own check on the study's micro-batches
    (:func:`tuneproof.training.speedups.resolve_auto`; bf16 frozen weights by their own check below, compile
    by its check before the smoke pass); ``ctx.study`` holds the resolution until the preflight ends."""
    device, _, _ = ctx.torch_setup()
    resolved, record = resolve_auto(
        model,
        usable,
        ctx.study.training,
        pad_id=pad,
        device=device,
        loss_fn=lambda m, b: _micro_loss(m, b, autocast),
        fp32_loss_fn=lambda m, b: _micro_loss(m, b, contextlib.nullcontext),
        rules=speedup_rules(ctx, model),
        try_bf16=False,
    )
    state["speedups_auto"] = record
    ctx.study = ctx.study.model_copy(update={"training": resolved})
    rep.add(check_result("speedups auto", True, _auto_message(record), _auto_numbers(record)))
    return resolved


def _auto_message(record: dict[str, Any]) -> str:
    used = ", ".join(record["used"]) or "none"
    off = "; ".join(f"{k} off: {d['reason']}" for k, d in record["decisions"].items() if not d["used"])
    return f"used: {used}" + (f"; {off}" if off else "")


def _auto_numbers(record: dict[str, Any]) -> dict[str, str]:
    """The ``speedups auto`` row's numbers: the speed-ups used and those left off, comma-separated (``none``)."""
    off = [k for k, d in record["decisions"].items() if not d["used"]]
    return {"used": ",".join(record["used"]) or "none", "off": ",".join(off) or "none"}


def _auto_left_off(ctx: StudyContext, rep: PreflightReport, state: dict, check: str, key: str):
    """Under auto a failed speed-up check leaves the speed-up off (its check is listed as passed, saying so)."""
    c = rep.get(check)
    c["passed"] = True
    c["message"] = f"training.speedups auto left {key} off: {c['message']}"
    record = state["speedups_auto"]
    record["decisions"][key] = {"used": False, "reason": f"check failed: {c['message']}"}
    _turn_off(ctx, record, key)
    auto = rep.get("speedups auto")
    auto["message"], auto["numbers"] = _auto_message(record), _auto_numbers(record)
    return ctx.study.training


def _turn_off(ctx: StudyContext, record: dict[str, Any], key: str) -> None:
    """Take ``key`` out of what auto resolved to (the record and the preflight's resolved study)."""
    record["used"] = [k for k in record["used"] if k != key]
    training = ctx.study.training.model_copy(update={key: False, "speedups": list(record["used"])})
    ctx.study = ctx.study.model_copy(update={"training": training})


def _check_compile(ctx: StudyContext, model, usable: list, pad: int, autocast, state: dict) -> dict[str, Any]:
    """``training.compile``: compiled vs eager on the first micro-batch, compile seconds and break-even
    (:func:`tuneproof.training.compiled.prove_compile`); under auto left off when it fails or does not pay."""
    cfg = ctx.study.training
    device, _, _ = ctx.torch_setup()
    batch = first_micro_batch(usable[: cfg.micro_batch_size], pad, device)
    plan = step_budget(cfg, len(usable))
    check = prove_compile(
        model,
        batch,
        lambda m, b: _micro_loss(m, b, autocast, cfg.chunked_loss),
        low_precision=autocast is not contextlib.nullcontext,
        planned_micro_batches=plan["total_steps"] * cfg.gradient_accumulation_steps,
        device=device,
    )
    numbers = record_of(check)
    if "speedups_auto" in state and (not check["passed"] or not check["pays"]):
        if check["passed"]:
            remove_compile(check["compiled"])
        why = check["message"] if not check["passed"] else f"does not pay within the planned budget: {check['message']}"
        record = state["speedups_auto"]
        record["decisions"]["compile"] = {"used": False, "reason": why}
        _turn_off(ctx, record, "compile")
        return check_result("compile", True, f"training.speedups auto left compile off: {why}", numbers)
    if check["passed"]:
        state["compile"] = numbers
    return check_result("compile", check["passed"], check["message"], numbers)


def _smoke(ctx: StudyContext, run, rep: PreflightReport, model, usable: list, skip_rest) -> None:
    if rep.beat is not None:
        rep.beat.update("smoke pass: training steps, an evaluation, a reload in a fresh process")
    try:
        check_smoke(ctx, run, model, usable, rep)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as err:  # noqa: BLE001 - the first smoke check not yet recorded fails with the error
        if fault_cause(err):  # disk full / read-only: the run fails with it
            raise
        seen = {c["name"] for c in rep.checks}
        name = next(n for n in SMOKE_CHECKS if n not in seen)
        rep.add(check_result(name, False, error_message(err), details={"traceback": traceback.format_exc()}))
        skip_rest(f"{name} stopped")


# --------------------------------------------------------------------------- the run record and the screen
def _write(
    ctx: StudyContext,
    run,
    rep: PreflightReport,
    snapshot: dict[str, Any],
    key: str,
    choice: dict[str, Any],
    budget: int,
    budget_source: str,
    seconds: float,
) -> None:
    """``preflight.json`` (every check in full) and the run summary (each check's verdict and the key numbers)."""

    def num(name: str, field: str) -> Any:
        c = rep.get(name)
        return (c or {}).get("numbers", {}).get(field)

    passed = not rep.failed
    run.write_json(
        PREFLIGHT_FILE,
        {
            "run": run.id,
            "passed": passed,
            "failed": [c["name"] for c in rep.failed],
            "platform_key": key,
            "dtype": choice,
            "budget_bytes": budget,
            "budget_source": budget_source,
            "seconds": round(seconds, 2),
            "checks": rep.checks,
        },
    )
    mem = rep.get("step memory")
    memory = {
        k: v for k, v in (mem or {}).get("numbers", {}).items() if k.endswith(("_gib", "_measured_over_estimate"))
    }
    memory.update(
        {f"eval_{k}": v for k, v in (rep.get("eval memory") or {}).get("numbers", {}).items() if k.endswith("_gib")}
    )
    mem_details = (mem or {}).get("details")
    acc = rep.get("gradient accumulation")
    run.update_summary(
        passed=passed,
        failed=[c["name"] for c in rep.failed],
        checks=[{"name": c["name"], "passed": c["passed"], "message": c["message"][:400]} for c in rep.checks],
        platform_key=key,
        dtype=choice.get("dtype"),
        dtype_reason=choice.get("reason"),
        s_per_step=num("throughput", "s_per_step"),
        tokens_per_s=num("throughput", "tokens_per_s"),
        eval_s_per_example=num("throughput", "eval_s_per_example"),
        budget_seconds=num("throughput", "budget_seconds"),
        eval_seconds_estimate=num("throughput", "eval_seconds_estimate"),
        total_steps=num("throughput", "total_steps"),
        reload_seconds=num("smoke pass", "reload_seconds"),
        memory=memory,
        budget_gib=to_gib(budget),
        memory_breakdown=mem_details.get("breakdown") if isinstance(mem_details, dict) else None,
        max_micro_batch=num("max micro-batch", "max_micro_batch"),
        loss_normalisation=(acc or {}).get("normalisation"),
        trainable=num("trainable parameters", "trainable"),
        total_params=num("trainable parameters", "total"),
        preflight_seconds=round(seconds, 1),
        **eval_batch_rate(rep.get("eval memory")),
    )


def _print_end(rep: PreflightReport, run_id: str, seconds: float) -> None:
    """Below the table printed row by row: the step memory in plain words, each failed check's whole
    message, and the verdict."""
    print_memory_plain(rep.get("step memory"))
    for c in rep.failed:
        console.print(f"[red]{c['name']} failed[/]: {user_text(c['message'], limit=None)}", soft_wrap=True)
    took = f"preflight {run_id} ({seconds:.0f} s, {len(rep.checks)} checks)"
    if rep.failed:
        console.print(f"[red]{took} failed: {capped([c['name'] for c in rep.failed])}[/]")
    else:
        console.print(f"[green]{took} passed[/]: `tuneproof train` may start on this config, data and platform")


# --------------------------------------------------------------------------- the gate of `train`
def require_preflight(ctx: StudyContext, override: str | None) -> str | None:
    """The preflight a train run stands on: a completed preflight that matches the current resolved
    config, data fingerprint and platform key. Config keys that cannot change what the preflight
    measured (:data:`tuneproof.preflight.scope.EXEMPT`: every key whose role in :mod:`tuneproof.study` is
    neither ``trains`` nor ``decodes``, e.g. ``training.max_steps``/``epochs``, ``checkpoint_every``, the
    scoring settings of ``eval``, ``name``, ``hypothesis``) are left out of the match. When none matches
    (a variant ``train --from r0004 --set method.r=16``, an edited study file), the preflight runs now,
    inline, as the data check does: one line says why (the keys that changed, with both values), that it
    runs and about how long it takes (the latest preflight's duration), and one line when it passed and
    how long it took. Returns the preflight run id, or None when ``override`` (``--skip-preflight
    "reason"``) is given; ``run_train`` records the override.

    Raises:
        CheckFailed: the inline preflight failed (exit 3; names it, its first failed check and what to do).
        TuneproofError: an empty override reason (exit 2).
    """
    if override is not None:
        if not override.strip():
            raise TuneproofError(
                "--skip-preflight needs a reason, e.g. "
                '--skip-preflight "preflight r0004 passed on this machine yesterday"'
            )
        console.print(
            f"[yellow]warning[/]: training without a matching preflight; recorded override: {user_text(override)}",
            soft_wrap=True,
        )
        return None
    matched, why, done = matching_preflight(ctx)
    if matched is not None:
        console.print(f"[dim]preflight {matched} passed for this config, data and platform[/]")
        return matched
    cmd = "tuneproof preflight" + (f" --study {ctx.study_dir}" if Path.cwd().resolve() != ctx.study_dir else "")
    timed = [r for r in done if r.ended is not None and r.ended >= r.created]
    took = (
        f"about {_seconds(timed[-1].ended - timed[-1].created)} (preflight {timed[-1].id} took that)"
        if timed
        else "its time is not known yet (no earlier preflight in this study)"
    )
    console.print(
        f"[yellow]no preflight for this configuration[/] ({user_text(why)}): running `{cmd}` now, {took}",
        soft_wrap=True,
    )
    t0 = time.perf_counter()
    try:
        run_id = run_preflight(ctx)
    except CheckFailed as err:
        raise CheckFailed(
            f"train refused: the preflight run now failed: {err.message}",
            hint="fix what it names and train again (the preflight runs again), or "
            '`tuneproof train --skip-preflight "REASON"` (the override is recorded in the run)',
        ) from None
    console.print(f"preflight {run_id} passed in {_seconds(time.perf_counter() - t0)}; training goes on")
    return run_id


def matching_preflight(ctx: StudyContext) -> tuple[str | None, str, list]:
    """``(run id, "", done)`` of the latest completed single-process preflight matching the resolved
    config (:func:`tuneproof.preflight.scope.preflight_changes`), data fingerprint and platform key,
    or ``(None, why, done)``: why none matches, e.g. ``"the latest passed preflight r0004 was for
    another configuration: config method.r: 4 -> 16 changed"``. ``done``: the completed
    single-process preflights, oldest first."""
    config = ctx.config
    data_fp = ctx.data_fingerprint()["hash"]
    key = platform_key(environment_snapshot())
    passed = ctx.registry.list(kind="preflight", status="completed")
    # `preflight --nproc-per-node N` checks the distributed step only: it never stands for this preflight
    done = [r for r in passed if not r.summary.get("distributed")]
    distributed = [r for r in passed if r.summary.get("distributed")]

    def changes_of(rec) -> list[dict[str, Any]] | None:
        path = ctx.registry.runs_dir / rec.id / "config.json"
        if not path.exists():
            return None
        recorded = read_json(path)
        auto_used = (rec.summary.get("speedups_auto") or {}).get("used")
        return preflight_changes(recorded if isinstance(recorded, dict) else {}, config, auto_used)

    for rec in reversed(done):
        if rec.data_fingerprint == data_fp and rec.summary.get("platform_key") == key and changes_of(rec) == []:
            return rec.id, "", done
    if not done:
        why = "no preflight has passed in this study" + (
            f"; only the distributed preflight {distributed[-1].id} (`tuneproof preflight --nproc-per-node N`), "
            "which checks the distributed step and does not replace the single-process `tuneproof preflight`"
            if distributed
            else ""
        )
    else:
        last = done[-1]
        diffs = []
        changes = changes_of(last)
        if changes is None:
            diffs.append("the resolved config (its config.json is missing)")
        elif changes:
            diffs.append(f"config {describe_changes(changes)}")
        if last.data_fingerprint != data_fp:
            diffs.append("the data fingerprint")
        if last.summary.get("platform_key") != key:
            diffs.append(f"the platform ({last.summary.get('platform_key')} -> {key})")
        why = (
            f"the latest passed preflight {last.id} was for another configuration: "
            f"{'; '.join(diffs) or 'unknown'} changed"
        )
    return None, why, done


def _seconds(s: float) -> str:
    """``"48 s"``, ``"3 min 05 s"``."""
    s = int(round(s))
    return f"{s} s" if s < 60 else f"{s // 60} min {s % 60:02d} s"
