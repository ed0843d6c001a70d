"""Recipe ``data inspect``: a few representative examples per category (and the longest) after the
exact preprocessing of the trainer, token by token, in the terminal or as one HTML page."""

from __future__ import annotations

from pathlib import Path

from tuneproof.context import StudyContext
from tuneproof.data.inspect import choose_examples, render_html, render_rich, token_rows
from tuneproof.io import atomic_write_text
from tuneproof.ui import console


def run_inspect(ctx: StudyContext, n: int = 3, split: str = "train", html_path: Path | None = None) -> Path | None:
    """Show ``n`` examples per category of ``split``; write HTML to ``html_path`` when given."""
    examples = ctx.split(split)
    encoded = ctx.pipeline.encode_all(examples)
    chosen = choose_examples(examples, encoded, n, seed=ctx.study.data.split.seed)
    if html_path is not None:
        items = [(encoded[i], token_rows(encoded[i], ctx.tokenizer)) for i in chosen]
        atomic_write_text(html_path, render_html(items, f"{ctx.study.name}: {split} after preprocessing"))
        console.print(f"wrote {html_path}")
        return html_path
    for i in chosen:
        console.print(render_rich(encoded[i], ctx.tokenizer))
        console.print()
    return None
