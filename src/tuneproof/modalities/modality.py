"""The interface every modality implements: what differs between text and image inputs, in one place.

A modality is chosen once, from the model kind (:func:`tuneproof.modalities.modality_for`); the
study context, recipes, deliver and preflight ask it and never branch on the kind themselves.
Parts, in the order each modality module has them:

1. the processor and the pipeline (tokenizer + ``TextPipeline``, image processor + ``ImagePipeline``),
   the training encoding and the collate of a micro-batch;
2. identity: the processor's identity (in the data and evaluation fingerprints) and the vocabulary record;
3. the data check: the input of the text duplicate finder and the input audit;
4. prediction: the study's evaluation procedure (one answer or label per example) and the
   per-example scores compared by the smoke pass and the fresh-process reload;
5. the ``data inspect`` view;
6. export and verify: the bundle's extras, the processor check and the reproduction of the stored predictions;
7. declarative tuples for the higher layers: the dossier sections that apply and the preflight checks that run.

Methods that read a study take ``ctx``, a :class:`tuneproof.context.StudyContext` (not imported:
the context imports this package); methods of the bundle side read only the manifest.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuneproof.data.examples import Example
from tuneproof.models.heads import Head

#: dossier / screen sections a modality may declare (``Modality.dossier_sections``)
TOKEN_LENGTHS = "token lengths"  # token length table and plot of the data check
SUGGESTED_MAX_LENGTH = "suggested max_length"
TEXT_CHECKS = "text checks"  # data-check lines on the texts: duplicates, empty texts, 0 supervised tokens, max_length
#: how the data-check lines of :data:`TEXT_CHECKS` begin
TEXT_CHECK_LINES = (
    "duplicates",
    "empty texts",
    "texts with different labels",
    "encoding faults",
    "longer than max_length",
)
LOSS_NORMALISATION = "loss normalisation"  # the training loop's per-token normalisation
IMAGE_FORM = "image form"  # per-class image sizes, modes and the model input

Progress = Callable[[int], None] | None


class Modality:
    """Base of the modalities. Subclasses set the class attributes and implement every method."""

    name: str = ""  # "text", "image"
    unit: str = ""  # what the training rate counts: "tokens" (text) or "images"
    logit: str = ""  # what the smoke pass and the reload compare: "next-token" or "class" logits
    heads: tuple[Head, ...] = ()  # the model kinds (``model.kind``) this modality serves
    source_formats: tuple[str, ...] = ()  # the ``data.sources[].format`` values its examples come from
    dossier_sections: tuple[str, ...] = ()  # sections of the dossier and the screens that apply (names above)
    smoke_eval_note: str = ""  # what the smoke evaluation's rate is, said after "measured on N smoke examples"

    @property
    def model_kinds(self) -> tuple[str, ...]:
        """The ``model.kind`` values of :attr:`heads`."""
        return tuple(h.kind for h in self.heads)

    def head(self, model_kind: str) -> Head:
        """The head of ``model_kind`` (one of :attr:`model_kinds`)."""
        return next(h for h in self.heads if h.kind == model_kind)

    # 1. processor, pipeline, collate
    def load_processor(self, base) -> Any:
        """The processor of the base (a :class:`tuneproof.models.base_model.BaseModelRef`): tokenizer
        or image processor."""
        raise NotImplementedError

    def pipeline(self, ctx) -> Any:
        """The study's one preprocessing pipeline (``ctx.tokenizer``, the study's settings, its labels)."""
        raise NotImplementedError

    def encode_for_training(self, pipeline, examples: list[Example]) -> list:
        """The train split as the trainer encodes it (images: with the train-time transforms)."""
        raise NotImplementedError

    def units(self, encoded) -> int:
        """What one encoded example adds to the training rate (its tokens, or 1 image)."""
        raise NotImplementedError

    def collate(self, batch: list, pad_id: int) -> dict:
        """One micro-batch of encoded examples as the model's input tensors (``labels`` included)."""
        raise NotImplementedError

    # 2. identity
    def processor_identity(self, ctx) -> dict[str, Any]:
        """The processor's identity, part of the data and evaluation fingerprints."""
        raise NotImplementedError

    def vocabulary_record(self, base_path: str | Path, processor) -> dict[str, Any] | None:
        """The base's vocabulary before resizing and the added tokens (docs/CASES.md C6 kind), or None
        without a vocabulary."""
        raise NotImplementedError

    # 3. data check
    def duplicate_input(self, splits: dict[str, list[Example]]) -> dict[str, list[Example]]:
        """What the text duplicate finder (:func:`tuneproof.data.dedup.find_duplicates`) reads."""
        raise NotImplementedError

    def audit(self, task, splits: dict[str, list[Example]], cfg, pipeline) -> dict[str, Any]:
        """The task kind's audit (:meth:`tuneproof.tasks.task.Task.audit`) plus this modality's audit of the inputs."""
        raise NotImplementedError

    # 4. prediction
    def predict(
        self,
        ctx,
        model,
        examples: list[Example],
        *,
        device,
        autocast,
        progress: Progress = None,
        batch_size: int | None = None,
        token_progress: Progress = None,
        raw_out: list[str] | None = None,
        sort_by_length: bool = True,
    ) -> list[str]:
        """One prediction per example, in their order, by the study's evaluation procedure;
        ``batch_size`` replaces ``eval.batch_size`` when given; ``sort_by_length`` False batches the
        examples in their given order (an ``eval.repeat`` repeat: other batches, other padding) where the
        modality sorts. ``progress(k)``: ``k`` examples finished (after each batch); ``token_progress(k)``:
        ``k`` more generated-token slots (one per row of the batch at each decoding step), for a modality
        whose :meth:`progress_tokens` is not None; ``raw_out`` (when given) gets the raw outputs a prediction
        was parsed from (a generation before ``eval.answer_from``), where the modality has any."""
        raise NotImplementedError

    def progress_tokens(self, ctx, examples: list[Example]) -> int | None:
        """The generated-token slots predicting ``examples`` takes at most (``examples x
        eval.max_new_tokens`` for generation), the unit its progress moves in; None: progress moves
        per example (a classifier answers a whole batch at once)."""
        return None

    def eval_inputs(self, ctx, examples: list[Example]) -> list[str]:
        """What the model reads at evaluation, one string per example in their order: the inference
        prompt of a generative head, the input text of a text classifier, the image path of an image."""
        raise NotImplementedError

    def scores(self, ctx, model, examples: list[Example]) -> list[list]:
        """Per example ``[[index, logit], ...]`` (fp32 floats) under the study's device and autocast
        (``ctx.torch_setup()``), the model left in eval mode: what the smoke pass and the reloads compare."""
        raise NotImplementedError

    # 5. data inspect
    def inspect(self, ctx, examples: list[Example], n: int, split: str, html_path: Path | None) -> Path | None:
        """Show ``n`` examples per category after the trainer's preprocessing; write HTML to
        ``html_path`` when given (and return it)."""
        raise NotImplementedError

    # 6. export and verify
    def bundle_extras(self, ctx, chosen: list[dict[str, Any]], bundle: Path) -> dict[str, Any]:
        """Complete the stored examples for the bundle in ``bundle``; returns the keys added to ``procedure``."""
        raise NotImplementedError

    def verify_processor(self, manifest: dict[str, Any], processor) -> tuple[str, list[str], str]:
        """``(check name, problems, detail)``: the bundle's recorded processor against ``processor``."""
        raise NotImplementedError

    def reproduce(
        self,
        model,
        processor,
        examples: list[dict[str, Any]],
        procedure: dict[str, Any],
        root: Path,
        *,
        device,
        autocast,
    ) -> list[dict[str, Any]]:
        """The stored examples predicted again by the stored procedure: ``prediction`` and the logits compared."""
        raise NotImplementedError
