"""What a model kind (``model.kind``) means for loading, adapting and evaluating a base: the
transformers Auto class, the classification head (none, or one output per study label), whether
the inputs are tokens, whether the labels are per token and the predictions generated, the PEFT
task type, and how a ``config.json`` is recognised as one.

The modalities declare the heads of the kinds they serve (:mod:`tuneproof.modalities`); this layer
loads whatever head it is given and never names a kind itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Head:
    """One model kind.

    Attributes:
        kind: the ``model.kind`` value (``causal-lm``, ``sequence-classification`` ...).
        auto_class: the ``transformers`` Auto class the base is loaded with.
        peft_task_type: the PEFT ``TaskType`` name of a LoRA adapter, None to pass the inputs through.
        what: the head named in messages (``"sequence classification"``), "" without a classification head.
        labels_from: where the labels come from, named when they are missing; None: no classification head.
        new_head: when the base's own head is replaced by a randomly initialised one
            (``ignore_mismatched_sizes``), the model named in the refusal of a LoRA run that would not
            train it (``method.modules_to_save``, docs/CASES.md C6), e.g. ``"image classifier"``; else "".
        token_inputs: the inputs are token ids: the pad token id falls back to eos and the embedding
            matrix gets one row per token of the saved tokenizer.
        architectures: substrings of ``config.json``'s ``architectures`` that name this kind.
        model_types: ``config.json`` ``model_type`` values read as this kind.
        pipeline_tag: the Hugging Face Hub's task of a model of this kind (a model card's ``pipeline_tag``).
        generative: predictions are decoded text (greedy or sampled generation, the KV cache, what
            ``eval.backend: vllm`` serves); False: the argmax of a classification head.
        token_labels: the training labels are per token (the causal-LM loss, which packing and the
            chunked loss apply to); False: one class index per example.
        adapter_effect: the smoke pass measures how far a LoRA adapter moves the logits (the
            scores again with the adapter disabled); False where it is not measured.
    """

    kind: str
    auto_class: str
    peft_task_type: str | None = None
    what: str = ""
    labels_from: str | None = None
    new_head: str = ""
    token_inputs: bool = True
    architectures: tuple[str, ...] = ()
    model_types: frozenset[str] = field(default_factory=frozenset)
    pipeline_tag: str | None = None
    generative: bool = False
    token_labels: bool = False
    adapter_effect: bool = True

    def matches(self, config: dict[str, Any]) -> bool:
        """Whether ``config`` (a model's ``config.json``) names this kind."""
        archs = " ".join(config.get("architectures") or [])
        return any(a in archs for a in self.architectures) or config.get("model_type") in self.model_types


def kind_from_config(config: dict[str, Any], heads: tuple[Head, ...], default: Head) -> str:
    """The kind of the first of ``heads`` (in their order) that ``config`` matches, else ``default``'s."""
    return next((h.kind for h in heads if h.matches(config)), default.kind)
