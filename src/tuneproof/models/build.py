"""The model a run trains, built the same way by ``train``, ``preflight`` and the distributed
checks: the base loaded (4-bit for QLoRA), activation checkpointing applied, the method wrapped
around it; the trained adapter or model saved into its run folder; and that saved model loaded
back (:func:`load_trained_model`: the one loader of ``eval``, ``test``, ``export``, the preflight's
fresh-process reload and a bundle's verification).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from tuneproof.models.base_model import BaseModelRef, load_model
from tuneproof.models.heads import Head
from tuneproof.models.method import apply_method, load_adapter_onto


def build_model(
    base: BaseModelRef,
    head: Head,
    method,
    *,
    device,
    labels: list[str] | None = None,
    quantization: dict[str, Any] | None = None,
    activation_checkpointing: bool = False,
):
    """Base model + method on ``device``, activation checkpointing applied.

    Args:
        base: the resolved base (:func:`tuneproof.models.base_model.resolve_base`).
        head: the model kind's :class:`~tuneproof.models.heads.Head`.
        method: the study's ``method`` section.
        device: the ``torch.device`` the model is moved to.
        labels: the labels of a classification head, else None.
        quantization: qlora: the :func:`tuneproof.models.quant.quantization_record` the base is loaded with.
        activation_checkpointing: ``training.activation_checkpointing``.

    Returns:
        ``(model, report)``: report as :func:`tuneproof.models.method.apply_method`'s.

    Raises:
        CheckFailed: a target pattern that matches no module, a new head (``head.new_head``) not in modules_to_save.
    """
    model = load_model(base, head, labels=labels, quantization=quantization)  # qlora: 4-bit base
    if activation_checkpointing:
        # non-reentrant checkpointing: gradients reach LoRA weights without input grads (docs/CASES.md C7)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    model, report = apply_method(model, method, head, quantization=quantization)
    return model.to(device), report


def save_trained(
    model, run_dir: Path, method_kind: str, tokenizer, base_identity: dict[str, Any], state_dict: dict | None = None
) -> Path:
    """Save the adapter (PEFT layout, revision in its config) into ``run_dir/adapter``, or the full model
    (``method_kind: full``) into ``run_dir/model``, with the tokenizer beside it.
    ``state_dict``: whole tensors gathered from the ranks (distributed runs); default the model's own.
    Returns the folder written."""
    kw = {"state_dict": state_dict} if state_dict is not None else {}
    if method_kind == "full":
        model.save_pretrained(run_dir / "model", safe_serialization=True, **kw)
        tokenizer.save_pretrained(run_dir / "model")
        return run_dir / "model"
    model.peft_config["default"].revision = base_identity["revision"]
    model.save_pretrained(run_dir / "adapter", safe_serialization=True, **kw)
    tokenizer.save_pretrained(run_dir / "adapter")
    return run_dir / "adapter"


def load_trained_model(
    base: BaseModelRef,
    head: Head,
    folder: Path,
    *,
    labels: list[str] | None = None,
    quantization: dict[str, Any] | None = None,
    base_weights: str = "fp32",
    source: str = "run",
):
    """A trained model loaded back from ``folder`` (not moved to a device).

    ``folder`` holding a ``config.json`` is a full fine-tune's saved model (every tensor must match,
    ``load_model(..., saved=True)``); otherwise it is an adapter, loaded onto ``base`` held as in
    training: 4-bit with ``quantization`` (qlora: the record the run trained with, which the caller
    reads from where the run recorded it) and the base's weights in ``base_weights`` (``fp32`` or
    ``bf16``, :func:`tuneproof.models.method.load_adapter_onto`).

    Args:
        source: what the saved model's :class:`BaseModelRef` says it comes from (``run``, ``preflight-smoke``).

    Raises:
        TuneproofError / CheckFailed: as :func:`~tuneproof.models.base_model.load_model` and
            :func:`~tuneproof.models.method.load_adapter_onto`.
    """
    folder = Path(folder)
    if (folder / "config.json").exists():  # full fine-tuning
        ref = replace(base, path=folder, kind=head.kind, source=source, weight_sha256={})
        return load_model(ref, head, labels=labels, saved=True)
    model = load_model(base, head, labels=labels, quantization=quantization)
    return load_adapter_onto(model, folder, base_weights)
