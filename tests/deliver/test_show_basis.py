"""`show --fixed/--regressed` select by the same per-example rule as `compare`'s paired counts."""

from __future__ import annotations

import json

from tuneproof.context import StudyContext
from tuneproof.recipes.show import run_show


def test_show_matches_the_compare_counts(cls_study, capsys):
    d, ids = cls_study["dir"], cls_study["ids"]
    cmp = json.loads((d / "runs" / ids["compare"] / "compare.json").read_text())
    entry = next(iter(cmp["candidates"].values()))
    ctx = StudyContext.open(d)
    try:
        assert run_show(ctx, ids["eval"], regressed=True, against=ids["baseline"]) == entry["counts"]["broken"]
        assert run_show(ctx, ids["eval"], fixed=True, against=ids["baseline"]) == entry["counts"]["fixed"]
    finally:
        ctx.registry.close()
    assert (
        "fixed / regressed by the success metric's rule: an example passes "
        "when its predicted class is the reference class" in capsys.readouterr().out
    )
