"""The study's one evaluation procedure on a list of examples: generation for a causal LM, the
classifier's argmax for a classification head or an image classifier, with a progress bar."""

from __future__ import annotations

from tuneproof.context import StudyContext
from tuneproof.data.examples import Example
from tuneproof.evaluation.generate import classify, classify_images, generate
from tuneproof.evaluation.outputs import also_record
from tuneproof.ui import progress_bar


def predict(ctx: StudyContext, model, examples: list[Example], what: str, on_progress=None) -> list[str]:
    """Predictions for ``examples`` by the study's one evaluation procedure, with a progress bar named ``what``;
    ``on_progress(k)`` (optional) is also called with the number of examples finished after each batch."""
    device, _, autocast = ctx.torch_setup()
    with progress_bar(what, len(examples)) as bar:
        advance = bar if on_progress is None else also_record(bar, on_progress)
        if ctx.is_image:
            return classify_images(
                model,
                ctx.pipeline,
                examples,
                ctx.labels,
                batch_size=ctx.study.eval.batch_size,
                device=device,
                autocast=autocast,
                progress=advance,
            )
        if ctx.model_kind == "sequence-classification":
            return classify(
                model,
                ctx.tokenizer,
                examples,
                ctx.labels,
                max_length=ctx.study.training.max_length,
                batch_size=ctx.study.eval.batch_size,
                device=device,
                autocast=autocast,
                progress=advance,
            )
        return generate(
            model,
            ctx.tokenizer,
            ctx.pipeline,
            examples,
            ctx.study.eval,
            device=device,
            autocast=autocast,
            progress=advance,
        )
