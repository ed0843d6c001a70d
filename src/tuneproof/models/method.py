"""What is trained: full fine-tuning, LoRA on the named target modules (PEFT), or QLoRA (LoRA on a
base loaded in 4-bit by bitsandbytes, prepared with ``peft.prepare_model_for_kbit_training``).

Every target pattern must match at least one module (docs/CASES.md C5); the match report, trainable and
total parameter counts and modules_to_save are returned so each run records them.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from tuneproof.errors import CheckFailed, TuneproofError
from tuneproof.models.base_model import unmatched_keys
from tuneproof.models.heads import Head
from tuneproof.models.quant import quantized_modules
from tuneproof.models.targets import match_target_modules, trainable_summary


def apply_method(model, method, head: Head, quantization: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
    """Wrap ``model`` for the study's method and report what is trained.

    Args:
        model: a transformers model (``method.kind: qlora``: loaded with ``quantization``,
            :func:`tuneproof.models.base_model.load_model`).
        method: the study's ``method`` section.
        head: the model kind's :class:`~tuneproof.models.heads.Head` (PEFT task type, a new head to train).
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
    report: dict[str, Any] = {"method": method.kind}
    if method.kind == "full":
        for p in model.parameters():
            p.requires_grad_(True)
        report.update(trainable_summary(model))
        return model, report
    from peft import LoraConfig, TaskType, get_peft_model  # noqa: PLC0415 - peft loads only when apply_method() runs

    if method.kind == "qlora":
        from peft import prepare_model_for_kbit_training  # noqa: PLC0415 - peft loads only when apply_method() runs

        if not getattr(model, "is_loaded_in_4bit", False) or not quantization:
            raise TuneproofError(
                "method.kind: qlora needs the base loaded in 4-bit (load_model(..., quantization=record))"
            )
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
    if head.new_head and not modules_to_save:
        name = "classifier" if hasattr(model, "classifier") else None
        raise CheckFailed(
            f"the {head.new_head}'s new head would stay at its random initialisation: method.modules_to_save is empty",
            hint=f"set method.modules_to_save: [{name or 'the head module name'}] (CASES C6)",
        )
    # a head without a PEFT task type: the PeftModel passes the inputs through
    task_type = getattr(TaskType, head.peft_task_type) if head.peft_task_type else None
    cfg = LoraConfig(
        r=method.r,
        lora_alpha=method.alpha,
        lora_dropout=method.dropout,
        target_modules=list(method.target_modules),
        modules_to_save=modules_to_save or None,
        task_type=task_type,
    )
    model = get_peft_model(model, cfg)
    summary = trainable_summary(model)
    report.update(summary)
    report["modules_to_save"] = sorted(set(model.peft_config["default"].modules_to_save or []))
    return model, report


# ---------------------------------------- bf16 base weights (docs/PROTOCOL.md step 5, tests/training/test_bf16_base.py)
def cast_frozen_to_bf16(model) -> dict[str, Any]:
    """Hold every frozen floating-point parameter of ``model`` in bf16, in place; trained ones
    (``requires_grad``: LoRA A/B, modules_to_save copies) stay as they are (fp32 master weights,
    so the optimizer states stay fp32 too). Call it after PEFT wrapped the model and before the
    optimizer is built. Tied weights stay tied (the ``Parameter`` objects are kept, only their
    storage is replaced); buffers (rotary frequencies) are left alone.

    Returns:
        ``{"cast_tensors", "cast_elements", "bytes_saved" (bytes: 4 - 2 per fp32 element cast),
        "trainable_tensors", "trainable_dtypes" (sorted dtype names of the trained tensors)}``.
    """
    import torch  # noqa: PLC0415 - torch loads only when cast_frozen_to_bf16() runs

    seen: set[int] = set()
    tensors = elements = saved = 0
    trainable: list[str] = []
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        if p.requires_grad:
            trainable.append(str(p.dtype).removeprefix("torch."))
            continue
        if not p.is_floating_point() or p.dtype == torch.bfloat16:
            continue
        saved += p.numel() * (p.element_size() - 2)
        p.data = p.data.to(torch.bfloat16)
        tensors += 1
        elements += p.numel()
    return {
        "cast_tensors": tensors,
        "cast_elements": elements,
        "bytes_saved": saved,
        "trainable_tensors": len(trainable),
        "trainable_dtypes": sorted(set(trainable)),
    }


#: parameter-name parts of a PEFT adapter's own tensors (LoRA matrices, trained copies of modules_to_save)
ADAPTER_PARAM_MARKERS = ("lora_", ".modules_to_save.")


def base_weights_dtype(model) -> str:
    """The dtype the frozen floating-point base parameters of ``model`` are held in (``fp32``,
    ``bf16``, ``fp16``; ``mixed`` when they differ, ``none`` when nothing is frozen), as evaluation
    records it. An adapter's own tensors (:data:`ADAPTER_PARAM_MARKERS`; frozen too once loaded for
    inference) are not base weights and are left out."""
    names = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}
    found = {
        names.get(str(p.dtype), str(p.dtype))
        for n, p in model.named_parameters()
        if not p.requires_grad and p.is_floating_point() and not any(m in n for m in ADAPTER_PARAM_MARKERS)
    }
    return found.pop() if len(found) == 1 else ("none" if not found else "mixed")


def _with_adapter_name(key: str, adapter: str) -> str:
    """A saved adapter key as the model holds it: the adapter name before the tensor's own name
    (``...lm_head.modules_to_save.weight`` -> ``...lm_head.modules_to_save.default.weight``)."""
    head, _, last = key.rpartition(".")
    return f"{head}.{adapter}.{last}" if head else key


def _file_tensor_names(adapter_dir) -> list[str]:
    """The sorted tensor names of ``adapter_dir/adapter_model.safetensors`` (header only; [] without it)."""
    from safetensors import safe_open  # noqa: PLC0415 - safetensors loads only when _file_tensor_names() runs

    path = Path(adapter_dir) / "adapter_model.safetensors"
    if not path.is_file():
        return []
    with safe_open(str(path), framework="pt") as f:
        return sorted(f.keys())


def load_adapter_onto(base, adapter_dir, base_weights: str = "fp32"):
    """``PeftModel.from_pretrained(base, adapter_dir)`` for inference (every parameter frozen),
    with the base's weights held in ``base_weights`` as in training: ``bf16`` casts the base's
    weights (:func:`cast_frozen_to_bf16`) while the adapter's (LoRA A/B, modules_to_save) stay in
    fp32, the dtype they were trained and saved in; ``fp32`` leaves everything fp32.

    Every tensor of the file must load into the model and every adapter tensor of the model must come
    from the file: ``from_pretrained`` does not return PEFT's load result (and only warns of missing
    keys), so the adapter is loaded once more with ``PeftModel.load_adapter``, which returns it.

    Raises:
        TuneproofError: ``base_weights`` is neither ``fp32`` nor ``bf16``.
        CheckFailed: unmatched keys (:func:`tuneproof.models.base_model.unmatched_keys` names them).
    """
    from peft import PeftModel  # noqa: PLC0415 - peft loads only when load_adapter_onto() runs

    if base_weights not in ("fp32", "bf16"):
        raise TuneproofError(f"base weights dtype {base_weights!r} is not fp32 or bf16")
    # is_trainable=True marks exactly the adapter's tensors trainable, so a bf16 cast leaves them fp32
    trainable = base_weights == "bf16"
    try:
        with warnings.catch_warnings():  # PEFT's missing-key warning: the load result below names them
            warnings.filterwarnings("ignore", message="Found missing adapter keys")
            model = PeftModel.from_pretrained(base, adapter_dir, is_trainable=trainable)
    except KeyError as err:  # PEFT looks up each module saved whole (modules_to_save) by name
        found = _file_tensor_names(adapter_dir)
        raise CheckFailed(
            f"the adapter {adapter_dir} does not match the model: the tensor {err.args[0]} is not in the file "
            f"(its {len(found)} tensors: {', '.join(found[:2])}{' ...' if len(found) > 2 else ''})",
            hint="the adapter's tensor names must be those PEFT saved for this base model",
        ) from None
    adapter = model.active_adapter
    result = model.load_adapter(adapter_dir, adapter, is_trainable=trainable)
    # PEFT lists a module saved whole (modules_to_save: embed_tokens, lm_head) as unexpected although it loaded
    # it into "<module>.modules_to_save.<adapter>.<tensor>": a file key is matched when that parameter exists
    held = set(model.state_dict())
    unexpected = [k for k in result.unexpected_keys if _with_adapter_name(k, adapter) not in held]
    problem = unmatched_keys(f"the adapter {adapter_dir}", list(result.missing_keys), unexpected)
    if problem:
        raise CheckFailed(problem, hint="the adapter's tensor names must be those PEFT saved for this base model")
    if not trainable:
        return model.eval()
    cast_frozen_to_bf16(model)
    model.requires_grad_(False)
    return model.eval()


def cast_base_for_inference(model, base_weights: str):
    """A bare base model (no adapter: the baseline, ``--base`` reads) held in ``base_weights``:
    ``bf16`` casts every floating-point weight (all are frozen here). Returns the model."""
    if base_weights == "bf16":
        model.requires_grad_(False)
        cast_frozen_to_bf16(model)
    return model
