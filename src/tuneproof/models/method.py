"""What is trained: full fine-tuning, or LoRA on the named target modules (PEFT).

Every target pattern must match at least one module (CASES C5); the match report, trainable and
total parameter counts and modules_to_save are returned so each run records them.
"""

from __future__ import annotations

from typing import Any

from tuneproof.errors import CheckFailed


def apply_method(model, method, kind: str) -> tuple[Any, dict[str, Any]]:
    """Wrap ``model`` for the study's method and report what is trained.

    Args:
        model: a transformers model.
        method: the study's ``method`` section.
        kind: ``causal-lm`` or ``sequence-classification``.

    Returns:
        ``(model, report)``; report has ``method``, ``targets`` (per pattern: count and modules),
        ``trainable``, ``total`` (parameters), ``modules_to_save``.

    Raises:
        CheckFailed: a target pattern that matches no module (names the pattern and the counts).
    """
    from tuneproof.preflight.targets import match_target_modules, trainable_summary  # noqa: PLC0415

    report: dict[str, Any] = {"method": method.kind}
    if method.kind == "full":
        for p in model.parameters():
            p.requires_grad_(True)
        report.update(trainable_summary(model))
        return model, report
    from peft import LoraConfig, TaskType, get_peft_model  # noqa: PLC0415

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
