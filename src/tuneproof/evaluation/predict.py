"""The study's one evaluation procedure on a list of examples, as its modality predicts
(:meth:`tuneproof.modalities.modality.Modality.predict`: generation for a causal LM, the classifier's
argmax for a classification head or an image classifier), with a progress bar."""

from __future__ import annotations

from tuneproof.context import StudyContext
from tuneproof.data.examples import Example
from tuneproof.evaluation.outputs import also_record
from tuneproof.ui import progress_bar


def predict(ctx: StudyContext, model, examples: list[Example], what: str, on_progress=None) -> list[str]:
    """Predictions for ``examples`` by the study's one evaluation procedure, with a progress bar named ``what``;
    ``on_progress(k)`` (optional) is also called with the number of examples finished after each batch."""
    device, _, autocast = ctx.torch_setup()
    with progress_bar(what, len(examples)) as bar:
        advance = bar if on_progress is None else also_record(bar, on_progress)
        return ctx.modality.predict(ctx, model, examples, device=device, autocast=autocast, progress=advance)
