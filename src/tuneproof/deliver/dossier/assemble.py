"""Every section of the dossier, in order: :func:`collect`."""

from __future__ import annotations

from typing import Any

from tuneproof.deliver.dossier.comparisons import _comparisons
from tuneproof.deliver.dossier.data_check import _data_check
from tuneproof.deliver.dossier.delivery import _exports, _plan, _rental
from tuneproof.deliver.dossier.environment import _environment
from tuneproof.deliver.dossier.eval_sets import _eval_sets
from tuneproof.deliver.dossier.evidence import _Evidence, missing_evidence
from tuneproof.deliver.dossier.hypothesis import _hypothesis
from tuneproof.deliver.dossier.preflight import _preflight
from tuneproof.deliver.dossier.runs import _baseline, _lineage, _runs
from tuneproof.deliver.dossier.sealed_test import _test_log
from tuneproof.deliver.dossier.training import _training
from tuneproof.deliver.dossier.verdict import _limits, _summary, _verdict


def collect(ctx, *, plots: bool = True, use_edited: str | None = None) -> dict[str, Any]:
    """Every section of the dossier (see :mod:`tuneproof.deliver.dossier`); ``plots`` draws the figures;
    ``use_edited`` (the reason of ``--use-edited-hypothesis``) judges against the study file's
    hypothesis instead of the frozen one. ``"incomplete"``: :func:`missing_evidence` (then the first
    screen and the Verdict section say ``INCOMPLETE: ...`` instead of a verdict)."""
    ev = _Evidence(ctx, use_edited)
    modality = ctx.modality  # what applies: token lengths and the loop's normalisation to text, the rate's unit
    sections = [
        ("summary", "Summary", _summary(ev)),
        ("hypothesis", "Hypothesis and guards", _hypothesis(ev)),
        ("baseline", "Baseline", _baseline(ev)),
        ("runs", "Runs (all of them)", _runs(ev)),
        ("lineage", "Variants (lineage)", _lineage(ev)),
        ("data-check", "Data check", _data_check(ev, plots, modality)),
        ("preflight", "Preflight", _preflight(ev, plots, modality)),
        ("training", "Training", _training(ev, plots, modality)),
        ("comparisons", "Comparisons with the baseline", _comparisons(ev, plots)),
        *(  # eval.sets: what must not get worse outside the task (only in a study that has sets)
            [("eval-sets", "Evaluation sets (outside the task)", _eval_sets(ev))] if ctx.study.eval.sets else []
        ),
        ("test-log", "Test split access log", _test_log(ev)),
        ("verdict", "Verdict", _verdict(ev)),
        ("limits", "Limits observed", _limits(ev)),
        ("exports", "Exports", _exports(ev)),
        ("plan", "Rental plan", _plan(ev)),
        ("rental", "Rental", _rental(ev)),
        ("environment", "Environment", _environment(ev)),
    ]
    return {
        "title": f"Dossier: {ctx.study.name}",
        "sections": [{"id": i, "title": t, "blocks": b} for i, t, b in sections],
        "incomplete": missing_evidence(ev),
    }
