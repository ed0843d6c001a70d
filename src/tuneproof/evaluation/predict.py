"""The study's one evaluation procedure on a list of examples, as its modality predicts
(:meth:`tuneproof.modalities.modality.Modality.predict`: generation for a causal LM, the classifier's
argmax for a classification head or an image classifier), with a progress bar."""

from __future__ import annotations

from tuneproof.context import StudyContext
from tuneproof.data.examples import Example
from tuneproof.evaluation.outputs import also_record
from tuneproof.ui import progress_bar


def predict(
    ctx: StudyContext,
    model,
    examples: list[Example],
    what: str,
    on_progress=None,
    raw_out: list[str] | None = None,
    sort_by_length: bool = True,
) -> list[str]:
    """Predictions for ``examples`` by the study's one evaluation procedure, with a progress bar named ``what``;
    ``on_progress(k)`` (optional) is also called with the number of examples finished after each batch;
    ``raw_out`` (optional) gets the raw generations the predictions were parsed from (``eval.answer_from``);
    ``sort_by_length`` False batches ``examples`` in their order (the repeats of ``eval.repeat``).

    Generation moves its bar per generated-token slot (:meth:`~tuneproof.modalities.modality.Modality.progress_tokens`:
    ``examples x eval.max_new_tokens``, one per row at each decoding step), so a batch of 16 that
    decodes for minutes shows its position and an ETA, not "0/16 ETA ?"; a classifier moves per example."""
    device, _, autocast = ctx.torch_setup()
    tokens = ctx.modality.progress_tokens(ctx, examples)
    if tokens is None:
        with progress_bar(what, len(examples)) as bar:
            advance = bar if on_progress is None else also_record(bar, on_progress)
            return ctx.modality.predict(
                ctx,
                model,
                examples,
                device=device,
                autocast=autocast,
                progress=advance,
                raw_out=raw_out,
                sort_by_length=sort_by_length,
            )
    per = ctx.study.eval.max_new_tokens
    with progress_bar(f"{what} ({len(examples)} examples, tokens of at most {per} each)", tokens) as bar:
        return ctx.modality.predict(
            ctx,
            model,
            examples,
            device=device,
            autocast=autocast,
            progress=on_progress,
            token_progress=bar,
            raw_out=raw_out,
            sort_by_length=sort_by_length,
        )
