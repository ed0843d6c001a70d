"""Recipe ``data inspect``: ``-n K`` representative examples per category (K in total when the
examples have no category; the longest is one of them) after the exact preprocessing of the
trainer, in the terminal or as one HTML page, as the study's modality shows it
(:meth:`tuneproof.modalities.modality.Modality.inspect`): text token by token, an image next to the
tensor the model receives.

Features: supervised tokens and, for causal LMs, the token each supervised position is scored
against (docs/CASES.md C2 kind); for sequence classification the class index and name the head is
trained on; the training prefix vs the inference prompt with a character diff when they differ
(docs/CASES.md C3 kind); truncation marked."""

from __future__ import annotations

from pathlib import Path

from tuneproof.context import StudyContext


def run_inspect(ctx: StudyContext, n: int = 3, split: str = "train", html_path: Path | None = None) -> Path | None:
    """Show ``n`` examples per category of ``split``; write HTML to ``html_path`` when given (and return it)."""
    return ctx.modality.inspect(ctx, ctx.split(split), n, split, html_path)
