"""Recipe ``train``: fine-tune the base model with the study's method and record the run.

Features (config key that turns each on):
- LoRA (``method.kind: lora``; r, alpha, dropout, target_modules, modules_to_save) or full
  fine-tuning (``method.kind: full``); every target pattern must match (CASES C5);
- answer-only loss with the end-of-turn token supervised (``training.loss``); hard data faults
  (0 supervised tokens, boundary inside a token, prefix mismatch) stop the run before any compute;
- the step budget from ``training.max_steps`` or ``training.epochs`` (exclusive; neither: 1 epoch), recorded
  in the summary as ``budget`` with the key that set it and the steps per epoch;
- gradient accumulation normalised per token over the window (``training.gradient_accumulation_steps``, C1);
  a window never crosses an epoch boundary (the last one of an epoch holds what is left, C18);
- precision (``training.precision``; dtype and reason recorded, C9), activation checkpointing
  (``training.activation_checkpointing``);
- checkpoints every ``training.checkpoint_every`` steps and at interruption (Ctrl-C/SIGTERM),
  resumable with ``tuneproof resume``;
- a health check on every optimizer step (``training/health.py``): a non-finite loss, gradient norm or
  trainable tensor, an exploded tensor, a zero gradient for several steps or a loss pinned at the
  uniform-prediction value marks the run invalid, with the rule and the step (C19);
- protocol order (:mod:`tuneproof.recipes.protocol`): refuses unless the data check of the current
  data passed (run inline when there is none) and a completed baseline has the current evaluation
  fingerprint; ``--skip-data-check REASON`` / ``--skip-baseline REASON`` override, recorded in the run.
"""

from __future__ import annotations

from typing import Any

from tuneproof.context import StudyContext
from tuneproof.data.preprocess import raise_on_faults
from tuneproof.hypothesis import freeze
from tuneproof.recipes.common import record_inputs
from tuneproof.ui import console, progress_bar


def build_model(ctx: StudyContext):
    """Base model + method on the device, activation checkpointing applied. Returns ``(model, report)``."""
    from tuneproof.models.base import load_model  # noqa: PLC0415
    from tuneproof.models.method import apply_method  # noqa: PLC0415

    device, _, _ = ctx.torch_setup()
    labels = ctx.labels if ctx.model_kind == "sequence-classification" else None
    model = load_model(ctx.base, ctx.model_kind, labels=labels)
    if ctx.study.training.activation_checkpointing:
        # non-reentrant checkpointing: gradients reach LoRA weights without input grads (CASES C7)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    model, report = apply_method(model, ctx.study.method, ctx.model_kind)
    from tuneproof.deliver.identity import vocabulary_record  # noqa: PLC0415

    report["vocabulary"] = vocabulary_record(ctx.base.path, ctx.tokenizer)  # base rows before resizing, added tokens (C6 kind)
    return model.to(device), report


def save_trained(model, run, method_kind: str, tokenizer, base_identity: dict[str, Any]) -> None:
    """Save the adapter (PEFT layout, revision in its config) or the full model into the run folder."""
    if method_kind == "full":
        model.save_pretrained(run.path("model"), safe_serialization=True)
        tokenizer.save_pretrained(run.path("model"))
        return
    model.peft_config["default"].revision = base_identity["revision"]
    model.save_pretrained(run.path("adapter"), safe_serialization=True)
    tokenizer.save_pretrained(run.path("adapter"))


def run_train(ctx: StudyContext, *, parent: str | None = None, name: str | None = None, resume_from: dict | None = None,
              run=None, stop_after: int | None = None, preflight_override: str | None = None, on_start=None,
              data_check_override: str | None = None, baseline_override: str | None = None, order: dict | None = None) -> str:
    """Train once; returns the run id. ``resume_from`` continues a checkpoint inside an existing ``run``
    (the protocol gates were passed when that run started). ``on_start(run)`` is called once the
    run's inputs are recorded (variants record their diff there). ``order``: the result of
    :func:`~tuneproof.recipes.protocol.require_order` when the caller already checked it (the CLI
    checks it before the preflight gate); otherwise it is checked here.

    Raises:
        CheckFailed: the data check failed or no baseline matches (exit 3; no train run is started),
            a hard data fault, a target pattern that matches nothing, a failed health check (run invalid).
    """
    from tuneproof.recipes.protocol import require_order  # noqa: PLC0415
    from tuneproof.training.health import HealthFault  # noqa: PLC0415
    from tuneproof.training.loop import seed_everything, train  # noqa: PLC0415

    if order is None:
        order = require_order(ctx, data_check_override=data_check_override, baseline_override=baseline_override) if run is None else {}

    def body(run) -> str:
        from tuneproof.deliver.identity import base_hashes  # noqa: PLC0415

        base = base_hashes(ctx.base)  # at train start; resume, eval, export and verify compare with it
        if resume_from is None:
            record_inputs(ctx, run)
            run.write_json("base.json", base)
            freeze(ctx.study_dir, ctx.study, run.id)  # protocol step 1: the first train run fixes the hypothesis
        if on_start is not None:
            on_start(run)
        if preflight_override:
            run.update_summary(preflight_override=preflight_override)
        if order:
            run.update_summary(**order)
        train_set = ctx.split("train")
        encoded = ctx.pipeline.encode_all(train_set)
        raise_on_faults(encoded, "train")
        seed_everything(ctx.study.training.seed)  # initialisation (LoRA matrices, new heads) follows training.seed
        model, report = build_model(ctx)
        run.write_json("method.json", report)
        for w in (report.get("targets") or {}).get("warnings", []):  # one pattern adapting several towers (C5 kind)
            console.print(f"[yellow]warning[/]: {w}", soft_wrap=True)
            run.note(f"warning: {w}")
        device, _, autocast = ctx.torch_setup()
        cfg = ctx.study.training
        console.print(f"[bold]{run.id}[/] {ctx.study.method.kind} on {len(encoded)} examples; "
                      f"trainable {report.get('trainable', 0):,} of {report.get('total', 0):,} parameters; device {device}, "
                      f"dtype {ctx.device_choice['dtype']} ({ctx.device_choice['reason']})")
        from tuneproof.training.loop import budget  # noqa: PLC0415

        plan = budget(cfg, len(encoded))
        steps = plan["total_steps"]
        run.update_summary(budget=plan)  # which key set the budget (training.max_steps, training.epochs or the default)
        source = (f"{plan['key']}: {plan['value']:g}" if plan["key"] != "default"
                  else f"{plan['value']:g} epoch, the default (neither training.max_steps nor training.epochs is set)")
        console.print(f"budget: {steps} optimizer steps from {source}; {plan['steps_per_epoch']} steps per epoch "
                      f"of {plan['examples_per_epoch']} examples")
        extra = {"data_fingerprint": ctx.data_fingerprint()["hash"], "base_revision": ctx.base.revision, "base": base}
        with progress_bar("train", steps) as advance:
            if resume_from is not None:
                advance(int(resume_from["step"]))
            result = train(model, encoded, cfg, pad_id=ctx.tokenizer.pad_token_id, device=device, autocast=autocast,
                           run=run, config=ctx.config, extra=extra, resume=resume_from, stop_after=stop_after,
                           progress=lambda s, t, loss: advance(1, f"loss {loss:.4f}"))
        save_trained(model, run, ctx.study.method.kind, ctx.tokenizer, ctx.base.identity())
        run.update_summary(
            steps=result["steps"], example_passes=result["examples"], final_loss=result["losses"][-1] if result["losses"] else None,
            first_loss=result["losses"][0] if result["losses"] else None, train_seconds=round(result["seconds"], 2),
            tokens_per_s=round(result["tokens"] / max(result["seconds"], 1e-9), 1), loss_normalisation=result["normalisation"],
            trainable=report.get("trainable"), total_params=report.get("total"), dtype=ctx.device_choice["dtype"],
            base={**ctx.base.identity(), "weights_sha256": base["weights_sha256"], "config_sha256": base["config_sha256"]},
        )
        return run.id

    if run is not None:
        return body(run)
    try:
        with ctx.registry.run("train", parent=parent, name=name) as run:
            return body(run)
    except HealthFault as fault:  # a diverged or stalled run is invalid, not failed (summary["health"] says why)
        ctx.registry.invalidate(run.id, fault.reason)
        raise
