"""What is trained: full fine-tuning, LoRA on the named target modules (PEFT), or QLoRA (LoRA on a
base loaded in 4-bit by bitsandbytes, prepared with ``peft.prepare_model_for_kbit_training``).

Every target pattern must match at least one module (CASES C5); the match report, trainable and
total parameter counts and modules_to_save are returned so each run records them.
"""

from __future__ import annotations

from typing import Any

from tuneproof.errors import CheckFailed


def apply_method(model, method, kind: str, quantization: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
    """Wrap ``model`` for the study's method and report what is trained.

    Args:
        model: a transformers model (``method.kind: qlora``: loaded with ``quantization``,
            :func:`tuneproof.models.base.load_model`).
        method: the study's ``method`` section.
        kind: ``causal-lm`` or ``sequence-classification``.
        quantization: qlora: the :func:`tuneproof.models.quant.quantization_record` it was loaded with.

    Returns:
        ``(model, report)``; report has ``method``, ``targets`` (per pattern: count and modules),
        ``trainable``, ``total`` (parameters; a 4-bit weight counts its packed storage elements),
        ``modules_to_save``; qlora adds ``quantization`` (the record) and ``quantized``
        (:func:`tuneproof.models.quant.quantized_modules`).

    Raises:
        CheckFailed: a target pattern that matches no module (names the pattern and the counts).
        TuneproofError: qlora on a model that was not loaded in 4-bit.
    """
    from tuneproof.preflight.targets import match_target_modules, trainable_summary  # noqa: PLC0415

    report: dict[str, Any] = {"method": method.kind}
    if method.kind == "full":
        for p in model.parameters():
            p.requires_grad_(True)
        report.update(trainable_summary(model))
        return model, report
    from peft import LoraConfig, TaskType, get_peft_model  # noqa: PLC0415

    if method.kind == "qlora":
        from peft import prepare_model_for_kbit_training  # noqa: PLC0415

        from tuneproof.errors import TuneproofError  # noqa: PLC0415
        from tuneproof.models.quant import quantized_modules  # noqa: PLC0415

        if not getattr(model, "is_loaded_in_4bit", False) or not quantization:
            raise TuneproofError("method.kind: qlora needs the base loaded in 4-bit (load_model(..., quantization=record))")
        # freezes the base, casts 16-bit non-quantized weights (norms, embeddings) to fp32; activation
        # checkpointing stays as the trainer set it (non-reentrant, before this call)
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        report["quantization"] = dict(quantization)
        report["quantized"] = quantized_modules(model)

    match = match_target_modules(model, method.target_modules)
    report["targets"] = match
    if not match["passed"]:
        raise CheckFailed(match["message"], hint="use module names of this model (see `tuneproof preflight`)")
    modules_to_save = list(method.modules_to_save)
    if kind == "image-classification" and not modules_to_save:
        head = "classifier" if hasattr(model, "classifier") else None
        raise CheckFailed("the image classifier's new head would stay at its random initialisation: method.modules_to_save is empty",
                          hint=f"set method.modules_to_save: [{head or 'the head module name'}] (CASES C6)")
    # image classifiers have no PEFT task type: the PeftModel passes pixel_values through
    task_type = {"sequence-classification": TaskType.SEQ_CLS, "image-classification": None}.get(kind, TaskType.CAUSAL_LM)
    cfg = LoraConfig(
        r=method.r, lora_alpha=method.alpha, lora_dropout=method.dropout, target_modules=list(method.target_modules),
        modules_to_save=modules_to_save or None, task_type=task_type,
    )
    model = get_peft_model(model, cfg)
    summary = trainable_summary(model)
    report.update(summary)
    report["modules_to_save"] = sorted(set(model.peft_config["default"].modules_to_save or []))
    return model, report
