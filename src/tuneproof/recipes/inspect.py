"""Recipe ``data inspect``: ``-n K`` representative examples per category (K in total when the
examples have no category; the longest is one of them) after the exact preprocessing of the
trainer, token by token, in the terminal or as one HTML page.

Features: supervised tokens and, for causal LMs, the token each supervised position is scored
against (docs/CASES.md C2 kind); for sequence classification the class index and name the head is
trained on; the training prefix vs the inference prompt with a character diff when they differ
(docs/CASES.md C3 kind); truncation marked."""

from __future__ import annotations

from pathlib import Path

from tuneproof.context import StudyContext
from tuneproof.data.inspect import LEGEND_CAUSAL, LEGEND_CLS, choose_examples, render_html, render_rich, token_rows
from tuneproof.io import atomic_write_text
from tuneproof.ui import console


def run_inspect(ctx: StudyContext, n: int = 3, split: str = "train", html_path: Path | None = None) -> Path | None:
    """Show ``n`` examples per category of ``split``; write HTML to ``html_path`` when given."""
    examples = ctx.split(split)
    if ctx.is_image:
        return _inspect_images(ctx, examples, n, split, html_path)
    encoded = ctx.pipeline.encode_all(examples)
    classes = ctx.pipeline.labels
    chosen = choose_examples(examples, encoded, n, seed=ctx.study.data.split.seed)
    if html_path is not None:
        items = [(encoded[i], token_rows(encoded[i], ctx.tokenizer)) for i in chosen]
        atomic_write_text(html_path, render_html(items, f"{ctx.study.name}: {split} after preprocessing", classes))
        console.print(f"wrote {html_path}")
        return html_path
    console.print(LEGEND_CLS if classes is not None else LEGEND_CAUSAL, soft_wrap=True, markup=False)
    console.print()
    for i in chosen:
        console.print(render_rich(encoded[i], ctx.tokenizer, classes), soft_wrap=True)
        console.print()
    return None


def _inspect_images(ctx: StudyContext, examples, n: int, split: str, html_path: Path | None) -> Path | None:
    """Per class: the original image and the tensor the model receives (train split: with the train-time flip)."""
    from tuneproof.data import image_inspect  # noqa: PLC0415 - imports PIL

    encoded = ctx.pipeline.encode_all(examples, train=split == "train")
    chosen = choose_examples(examples, encoded, n, seed=ctx.study.data.split.seed)
    classes = ctx.pipeline.labels
    if html_path is not None:
        items = [(examples[i], encoded[i], ctx.pipeline.image(examples[i], train=split == "train")[0]) for i in chosen]
        atomic_write_text(
            html_path, image_inspect.render_html(items, f"{ctx.study.name}: {split} after preprocessing", classes)
        )
        console.print(f"wrote {html_path}")
        return html_path
    for i in chosen:
        for line in image_inspect.describe(examples[i], encoded[i], classes):
            console.print(line, markup=False, soft_wrap=True)
        console.print()
    return None
