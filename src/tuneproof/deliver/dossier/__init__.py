"""The dossier: every piece of evidence of a study, collected once and rendered twice (Markdown for
the terminal, one self-contained HTML page with plots).

:func:`collect` reads the registry and the run folders (never the data, never a model) and
returns ``{"title", "sections": [{"id", "title", "blocks"}]}``; a block is one of

- ``{"type": "p", "text"}``, ``{"type": "strong", "text"}``, ``{"type": "list", "items"}``,
- ``{"type": "table", "cols", "rows"}``, ``{"type": "pre", "text"}``,
- ``{"type": "figure", "png": bytes, "caption"}``,
- ``{"type": "details", "summary", "blocks"}``: blocks folded under a one-line summary
  (``<details>`` in HTML and in GitHub Markdown).

The first section ("Summary") is the first screen: it stands alone (hypothesis, verdict with its
intervals, or ``INCOMPLETE: ...`` naming the evidence a verdict would need that is missing or broken, what the candidate
changed against the baseline, runs that did not complete and why, limits, test-split reads) and links every section
below it. Its verdict is the frozen hypothesis judged for the delivered (or best passed) candidate against the
baseline it names (:mod:`tuneproof.deliver.headline`), whatever ``compare`` ran last; a comparison of two candidates
is listed as such. A completed run whose folder or evidence file is gone (``evidence.RUN_EVIDENCE``: a deleted test
run) makes the dossier INCOMPLETE, and its recorded numbers are not shown.

:func:`to_markdown` and :func:`to_html` render that structure; every string is escaped by the
renderer (``tuneproof.ui.markdown_text`` / ``html_text``: control characters as visible escapes such
as ``\\x1b``, Markdown and HTML syntax neutralised), so text from the user's data can never become
markup. A part whose command was not run says "not run yet" and names the command.

One concern per module: ``blocks`` (block shapes, value formats), ``evidence`` (the run files one build
reads; what a verdict would need), ``verdict`` (the first screen, the verdict, the limits), one module per
protocol step (``hypothesis``, ``runs``, ``data_check``, ``preflight``, ``training``, ``comparisons``,
``sealed_test``, ``delivery``, ``environment``), ``assemble`` (:func:`collect`: the sections in order) and
``render`` (Markdown and HTML).
"""

from __future__ import annotations

from tuneproof.deliver.dossier.assemble import collect
from tuneproof.deliver.dossier.blocks import NOT_RUN, flatten
from tuneproof.deliver.dossier.comparisons import (
    FOLD_CLASSES_OVER,
    FOLD_HEATMAP_OVER,
    TOP_CONFUSIONS,
    per_class_blocks,
    top_confusions,
)
from tuneproof.deliver.dossier.data_check import DUPLICATES_LISTED
from tuneproof.deliver.dossier.evidence import missing_evidence
from tuneproof.deliver.dossier.preflight import PREFLIGHT_NAMES, preflight_tables, speedups_auto_rows
from tuneproof.deliver.dossier.render import CSS, TEXT_LIMIT, first_screen, to_html, to_markdown
from tuneproof.deliver.dossier.verdict import criteria_table

__all__ = [
    "CSS",
    "DUPLICATES_LISTED",
    "FOLD_CLASSES_OVER",
    "FOLD_HEATMAP_OVER",
    "NOT_RUN",
    "PREFLIGHT_NAMES",
    "TEXT_LIMIT",
    "TOP_CONFUSIONS",
    "collect",
    "criteria_table",
    "first_screen",
    "flatten",
    "missing_evidence",
    "per_class_blocks",
    "preflight_tables",
    "speedups_auto_rows",
    "to_html",
    "to_markdown",
    "top_confusions",
]
