"""Recipe ``report``: the dossier, ``dossier.md`` (and with ``--html`` ``dossier.html``) in the study.

Sections: summary; hypothesis and guards (and whether they changed after the first train run);
baseline; every run including failed, interrupted and invalid ones with their reasons; variants as
a lineage with the change each made; the data check and preflight summaries; training (loss
curves); comparisons with 95% intervals, per class and per field; the test split's access log;
the verdict; the observed limits; exports; the rental plan; the environment. A part whose command
was not run says "not run yet" and names the command.

Features (option that turns each on):
- Markdown that reads in a terminal (always);
- ``--html``: one self-contained page (inline CSS, no script, plots as base64 PNG drawn with
  matplotlib: loss curves per run, per-class/per-field bars baseline vs candidate, confusion
  matrices, token lengths, step memory and throughput); every text goes through ``tuneproof.ui.html_text``.
Both files are written atomically. Reads recorded evidence only: no data, no model.

Evidence that is missing or broken (the baseline's or a candidate's outputs of the headline comparison, its
``compare.json``, a run it rests on that was invalidated since, a frozen hypothesis that is not the one sealed
before training, any completed run whose folder or evidence file is gone: a deleted test run) turns the headline
into ``INCOMPLETE: ...`` naming it; the dossier is still written and the command exits 3.
"""

from __future__ import annotations

from pathlib import Path

from tuneproof import hypothesis as hyp
from tuneproof.context import StudyContext
from tuneproof.deliver.dossier import collect, first_screen, to_html, to_markdown
from tuneproof.errors import CheckFailed
from tuneproof.evaluation.outputs import check_all
from tuneproof.io import atomic_write_text
from tuneproof.tracking import publish_dossier
from tuneproof.ui import console, heartbeat, user_text

MD_FILE = "dossier.md"
HTML_FILE = "dossier.html"


def build_markdown(ctx: StudyContext) -> str:
    """The dossier as Markdown (no plots are drawn)."""
    return to_markdown(collect(ctx, plots=False))


def run_report(ctx: StudyContext, *, html: bool = False, use_edited_hypothesis: str | None = None) -> Path:
    """Write ``dossier.md`` (and ``dossier.html`` when ``html``), print its first screen
    (:func:`tuneproof.deliver.dossier.first_screen`); returns the Markdown path.

    The verdicts follow the hypothesis frozen with the first train run; ``use_edited_hypothesis``
    (a reason) judges against the study file's instead, recorded in the dossier and
    ``hypothesis.overrides.jsonl``.

    Raises:
        CheckFailed: (exit 3, after the dossier is written, headed ``INCOMPLETE: ...``) evidence the
            verdict needs is missing, or the frozen hypothesis is not the one sealed before training
            (:func:`tuneproof.deliver.dossier.missing_evidence`; names the file, and both hashes for the seal).
        TuneproofError: per-example outputs edited since their run wrote them (``check_all``).
    """
    check_all(ctx.registry)  # a dossier is built only from per-example outputs as their runs recorded them

    if use_edited_hypothesis is not None:  # recorded first, so the dossier lists this use too
        try:
            judging = hyp.resolve(ctx.study_dir, ctx.study, ctx.registry, use_edited_hypothesis)
        except hyp.SealBroken:  # said in the dossier and by the refusal below
            judging = None
        if judging is not None:
            hyp.record_override(ctx.study_dir, judging, "report", None)
    with heartbeat("report", "reading the evidence" + (" and drawing the plots" if html else "")):
        d = collect(ctx, plots=html, use_edited=use_edited_hypothesis)
    path = ctx.study_dir / MD_FILE
    md = to_markdown(d)
    atomic_write_text(path, md)
    written = [path]
    if html:
        written.append(atomic_write_text(ctx.study_dir / HTML_FILE, to_html(d)))
    publish_dossier(ctx.study, ctx.study_dir, written)  # tracking.*: a copy of the dossier; never fails the report
    console.print(user_text(first_screen(md), limit=None), soft_wrap=True)  # the verdict on screen, not only a path
    gaps = d["incomplete"]
    if gaps:
        more = f" (and {len(gaps) - 1} more: see the dossier)" if len(gaps) > 1 else ""
        raise CheckFailed(
            f"INCOMPLETE: {gaps[0]['message']}{more}",
            hint=f"{gaps[0]['hint']}; {path} was written and says INCOMPLETE instead of a verdict",
        )
    return path
