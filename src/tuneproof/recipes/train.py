"""Recipe ``train``: fine-tune the base model with the study's method and record the run.

Features (config key that turns each on):
- LoRA (``method.kind: lora``; r, alpha, dropout, target_modules, modules_to_save), QLoRA
  (``method.kind: qlora``: the base loaded in 4-bit by bitsandbytes, the quant config recorded in
  ``method.json``, ``base.json`` and the summary, :mod:`tuneproof.models.quant`) or full
  fine-tuning (``method.kind: full``); every target pattern must match (docs/CASES.md C5);
- answer-only loss with the end-of-turn token supervised (``training.loss``); hard data faults
  (0 supervised tokens, boundary inside a token, prefix mismatch) stop the run before any compute;
- the step budget from ``training.max_steps`` or ``training.epochs`` (exclusive; neither: 1 epoch), recorded
  in the summary as ``budget`` with the key that set it and the steps per epoch;
- gradient accumulation normalised per token over the window (``training.gradient_accumulation_steps``,
  docs/CASES.md C1); a window never crosses an epoch boundary (the last one of an epoch holds what is left,
  docs/CASES.md C18);
- precision (``training.precision``; dtype and reason recorded, docs/CASES.md C9), activation checkpointing
  (``training.activation_checkpointing``); frozen base weights in bf16 (``training.bf16_base_weights``,
  LoRA only: cast after PEFT wrapped the model, once the loop's check passed; ``base_weights`` in the summary);
- checkpoints every ``training.checkpoint_every`` steps and at interruption (Ctrl-C/SIGTERM),
  resumable with ``tuneproof resume``;
- a health check on every optimizer step (``training/health.py``): a non-finite loss, gradient norm or
  trainable tensor, an exploded tensor, a zero gradient for several steps or a loss pinned at the
  uniform-prediction value marks the run invalid, with the rule and the step (docs/CASES.md C19);
- protocol order (:mod:`tuneproof.recipes.protocol`): refuses unless the data check of the current
  data passed (run inline when there is none) and a completed baseline has the current evaluation
  fingerprint; ``--skip-data-check REASON`` / ``--skip-baseline REASON`` override, recorded in the run;
- past one process (``tuneproof train --nproc-per-node N [--nnodes M --node-rank K --rdzv-endpoint H:P]``):
  the same recipe under torchrun, DDP or FSDP2 (``distributed.strategy``, ``distributed.backend``,
  ``distributed.timeout_s``); checks before launch, rank 0 writes, a rank's failure named, the saved
  adapter gathered whole and checked in a fresh process (:mod:`tuneproof.recipes.torchrun`, docs/CASES.md C10, C11,
  docs/CASES.md C24);
- the sha256 of the saved adapter (or full model) files in the summary (``trained_weights``): ``eval`` and
  ``test`` refuse other files and record what they loaded, ``export`` refuses files that differ from the
  evaluated ones (tests/faults/test_faults_evidence.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tuneproof.context import StudyContext
from tuneproof.data.preprocess import raise_on_faults
from tuneproof.evaluation.controls import choose_against
from tuneproof.hypothesis import FROZEN_FILE, freeze_and_seal
from tuneproof.models.build import save_trained
from tuneproof.models.identity import base_hashes, trained_weights_record
from tuneproof.models.method import base_weights_dtype
from tuneproof.recipes.common import record_inputs, speedup_rules
from tuneproof.recipes.protocol import require_order
from tuneproof.training import loop  # loop.train looked up at call time: tests wrap it
from tuneproof.training.budget import budget, warmup_finding
from tuneproof.training.health import HealthFault
from tuneproof.training.parallel import World, param_signature, wrap
from tuneproof.ui import Heartbeat, console, heartbeat, progress_bar, user_text


def record_start(ctx: StudyContext, run) -> dict[str, Any]:
    """A new train run's inputs: config, environment, data fingerprint, ``base.json`` (the base's
    hashes at train start) and the hypothesis frozen by the first train run, its file's sha256 in that
    run's summary (``hypothesis_sha256``). Returns the base hashes."""
    base = base_hashes(ctx.base)  # at train start; resume, eval, export and verify compare with it
    if ctx.quantization:  # qlora: the unquantized files above, loaded with this 4-bit config
        base["quantization"] = ctx.quantization
    record_inputs(ctx, run)
    run.write_json("base.json", base)
    # docs/PROTOCOL.md step 1: the first train run fixes (and seals) it, with the control success.against names
    against = None if (ctx.study_dir / FROZEN_FILE).exists() else choose_against(ctx)
    freeze_and_seal(ctx.study_dir, ctx.study, run, against=against)
    return base


@dataclass
class TrainOptions:
    """How a train run is started and recorded (every field optional; the defaults are a plain ``tuneproof train``)."""

    parent: str | None = None  # the train run this one is a variant of (``train --from``)
    name: str | None = None  # the run's name in the registry
    stop_after: int | None = None  # stop as if interrupted (with a checkpoint) after this many optimizer steps (tests)
    preflight_override: str | None = None  # ``--skip-preflight REASON``, recorded in the summary
    data_check_override: str | None = None  # ``--skip-data-check REASON`` (when the gates are checked here)
    baseline_override: str | None = None  # ``--skip-baseline REASON`` (when the gates are checked here)
    order: dict | None = None  # :func:`~tuneproof.recipes.protocol.require_order`'s result when the caller checked it
    on_start: Callable | None = None  # ``on_start(run)`` once the run's inputs are recorded (variants: their diff)


def speedups_line(run_id: str, summary: dict[str, Any]) -> str | None:
    """One terminal line: the speed-ups the loop used (each checked before the loop, ``summary["speedups"]``) and,
    under ``training.speedups: auto`` (``summary["speedups_auto"]``), those it left off; None when none was used
    or considered. The reasons stay in the summary and the dossier (``tuneproof report``)."""
    auto = summary.get("speedups_auto")
    if isinstance(auto, dict):
        off = [k for k, d in (auto.get("decisions") or {}).items() if not d.get("used")]
        return (
            f"speed-ups (training.speedups auto): used {', '.join(auto.get('used') or []) or 'none'}; "
            f"off: {', '.join(off) or 'none'} (why each: runs/{run_id}/summary.json speedups_auto, the dossier)"
        )
    used = list(summary.get("speedups") or {})
    if not used:
        return None
    return f"speed-ups: {', '.join(used)}, each checked before the loop (runs/{run_id}/summary.json speedups)"


def run_train(
    ctx: StudyContext,
    options: TrainOptions | None = None,
    *,
    run=None,
    resume_from: dict | None = None,
    world: World | None = None,
    save_ranks: Callable | None = None,
) -> str | None:
    """Train once; returns the run id (None on a rank other than 0).

    Args:
        options: :class:`TrainOptions`. Without ``options.order`` the protocol gates are checked here
            (:func:`~tuneproof.recipes.protocol.require_order`; the CLI checks them before the preflight gate).
        run / resume_from: continue the checkpoint ``resume_from`` inside the existing ``run`` (the protocol
            gates were passed when that run started).
        world / save_ranks: one rank under torchrun (:func:`tuneproof.recipes.torchrun.worker_main`); rank 0
            gets ``run``, the other ranks None; the launcher checked the gates and recorded the inputs. After
            training every rank calls ``save_ranks(run, model, frozen_before)`` (the collective save and check,
            :func:`tuneproof.recipes.torchrun.save_and_verify`) instead of saving the model here.

    Raises:
        CheckFailed: the data check failed or no baseline matches (exit 3; no train run is started),
            a hard data fault, a target pattern that matches nothing, a failed health check (run invalid).
    """
    opts = options or TrainOptions()
    order = opts.order
    if order is None and run is None and world is None:  # the protocol gates, unless the caller checked them
        order = require_order(
            ctx, data_check_override=opts.data_check_override, baseline_override=opts.baseline_override
        )
    elif order is None:  # resumed or a rank: the gates were passed when the run started
        order = {}

    def body(run) -> str | None:  # off a terminal, rank 0 says what it does every 30 s (ui.heartbeat)
        with (
            heartbeat("train", "hashing the base model")
            if run is not None
            else contextlib.nullcontext(Heartbeat("train")) as beat
        ):
            return phases(run, beat)

    def phases(run, beat: Heartbeat) -> str | None:
        if resume_from is None and world is None:
            base = record_start(ctx, run)
        else:
            base = base_hashes(ctx.base)
        if opts.on_start is not None:
            opts.on_start(run)
        if opts.preflight_override:
            run.update_summary(preflight_override=opts.preflight_override)
        if order:
            run.update_summary(**order)
        beat.update("encoding the train split")
        train_set = ctx.split("train")
        # images: the train-time transforms (data.image.horizontal_flip) apply to the train split only
        encoded = ctx.modality.encode_for_training(ctx.pipeline, train_set)
        raise_on_faults(encoded, "train")
        loop.seed_everything(ctx.study.training.seed)  # initialisation (LoRA matrices, new heads) follows training.seed
        beat.update("loading and adapting the base model")
        model, report = ctx.build_model()
        frozen_before = None
        if world is not None:
            frozen_before = param_signature(model)
            wrap(model, world)
        if run is not None:
            run.write_json("method.json", report)
            targets = report.get("targets") or {}
            if (
                len([t for t in targets.get("towers") or {} if t != "model"]) > 1
            ):  # encoder-decoder / multimodal: matches per tower
                console.print(f"[dim]{user_text(targets['message'])}[/]", soft_wrap=True)
            for w in targets.get("warnings", []):  # one pattern adapting several towers (docs/CASES.md C5 kind)
                console.print(f"[yellow]warning[/]: {user_text(w)}", soft_wrap=True)
                run.note(f"warning: {w}")
        device, _, autocast = ctx.torch_setup()
        cfg = ctx.study.training
        ws = world.world_size if world is not None else 1
        if run is not None:
            console.print(
                f"[bold]{run.id}[/] {ctx.study.method.kind} on {len(encoded)} examples; "
                f"trainable {report.get('trainable', 0):,} of {report.get('total', 0):,} parameters; device {device}, "
                f"dtype {ctx.device_choice['dtype']} ({user_text(ctx.device_choice['reason'])})"
                + (f"; {ws} processes, {world.strategy}" if world is not None else ""),
                soft_wrap=True,  # one line in a log (80 columns off a terminal cut it before "fp32")
            )
        plan = budget(cfg, len(encoded), ws)
        steps = plan["total_steps"]
        if run is not None:
            run.update_summary(
                budget=plan
            )  # which key set the budget (training.max_steps, training.epochs or the default)
            source = (
                f"{plan['key']}: {plan['value']:g}"
                if plan["key"] != "default"
                else f"{plan['value']:g} epoch, the default (neither training.max_steps nor training.epochs is set)"
            )
            console.print(
                f"budget: {steps} optimizer steps from {source}; {plan['steps_per_epoch']} steps per epoch "
                f"of {plan['examples_per_epoch']} examples" + (f" per process ({ws} processes)" if ws > 1 else ""),
                soft_wrap=True,
            )
            warm = warmup_finding(cfg, steps)
            if warm:  # before compute: warmup covering the run means the configured LR is never used
                console.print(f"[yellow]warning[/]: {user_text(warm)}", soft_wrap=True)
                run.note(f"warning: {warm}")
        extra = {"data_fingerprint": ctx.data_fingerprint()["hash"], "base_revision": ctx.base.revision, "base": base}
        beat.update("training")
        with (
            progress_bar("train", steps, start=int(resume_from["step"]) if resume_from is not None else 0)
            if run is not None
            else contextlib.nullcontext(lambda *a, **k: None)
        ) as advance:
            result = loop.train(
                model,
                encoded,
                cfg,
                pad_id=getattr(ctx.tokenizer, "pad_token_id", 0),
                device=device,
                autocast=autocast,
                run=run,
                config=ctx.config,
                extra=extra,
                resume=resume_from,
                stop_after=opts.stop_after,
                progress=lambda s, t, loss: advance(1, f"loss {loss:.4f}"),
                world=world,
                speedup_rules=speedup_rules(ctx, model, ws),
            )
        if run is not None:
            line = speedups_line(run.id, run.summary)
            if line:
                console.print(line, soft_wrap=True)
        beat.update("saving the trained weights")
        if world is not None:
            save_ranks(run, model, frozen_before)
            if run is None:
                return None
        else:
            save_trained(model, run.dir, ctx.study.method.kind, ctx.tokenizer, ctx.base.identity())
        saved = run.dir / ("model" if ctx.study.method.kind == "full" else "adapter")
        run.update_summary(
            # the sha256 of the saved adapter (or model) files: eval records what it loads, export compares
            trained_weights=trained_weights_record(saved),
            steps=result["steps"],
            example_passes=result["examples"],
            final_loss=result["losses"][-1] if result["losses"] else None,
            first_loss=result["losses"][0] if result["losses"] else None,
            train_seconds=round(result["seconds"], 6),
            tokens_per_s=round(result["tokens"] / max(result["seconds"], 1e-9), 1),
            loss_normalisation=result["normalisation"],
            trainable=report.get("trainable"),
            total_params=report.get("total"),
            dtype=ctx.device_choice["dtype"],
            base_weights=base_weights_dtype(model),  # the frozen weights' dtype: bf16 with training.bf16_base_weights
            base={
                **ctx.base.identity(),
                "weights_sha256": base["weights_sha256"],
                "config_sha256": base["config_sha256"],
                **({"quantization": ctx.quantization} if ctx.quantization else {}),
            },
            **({"quantization": ctx.quantization} if ctx.quantization else {}),
            world_size=result["world_size"],
            **({"shares": result["shares"]} if result.get("shares") else {}),
        )
        return run.id

    if run is not None or world is not None:
        return body(run)
    try:
        with ctx.registry.run("train", parent=opts.parent, name=opts.name) as run:
            return body(run)
    except HealthFault as fault:  # a diverged or stalled run is invalid, not failed (summary["health"] says why)
        ctx.registry.invalidate(run.id, fault.reason)
        raise
