"""The dossier's words (issue 33 item 21): an interrupted baseline is said to be interrupted, never
"not run yet"; the HTML page renders the dossier's code spans as <code>, never literal backticks."""

from __future__ import annotations

import pytest

from deliver_tiny import make_cls_study
from tuneproof.context import StudyContext
from tuneproof.deliver.dossier.evidence import _Evidence
from tuneproof.deliver.dossier.render import to_html, to_markdown
from tuneproof.deliver.dossier.runs import _baseline


def test_an_interrupted_baseline_is_said_interrupted_and_html_shows_code_not_backticks(tmp_path, bert_base):
    d = make_cls_study(tmp_path / "s", bert_base)
    ctx = StudyContext.open(d)
    assert _baseline(_Evidence(ctx)) == [{"type": "p", "text": "not run yet (`tuneproof baseline`)"}]
    with pytest.raises(KeyboardInterrupt), ctx.registry.run("baseline") as run:
        raise KeyboardInterrupt
    rec = ctx.registry.get(run.id)
    assert rec.status == "interrupted"
    blocks = _baseline(_Evidence(ctx))
    assert blocks == [
        {
            "type": "p",
            "text": f"not completed: the baseline {run.id} was interrupted ({rec.reason}); "
            "run `tuneproof baseline` again",
        }
    ]
    doc = {"title": "Dossier: tiny", "sections": [{"id": "baseline", "title": "Baseline", "blocks": blocks}]}
    page = to_html(doc)
    assert "<code>tuneproof baseline</code>" in page and "`" not in page
    assert "run `tuneproof baseline` again" in to_markdown(doc)  # Markdown renders the span itself
