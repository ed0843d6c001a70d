"""The dossier: every section from the recorded evidence, failed and invalid runs with their
reasons, "not run yet" for missing parts, one self-contained HTML page with the plots and every
user text escaped."""

from __future__ import annotations

import base64
import re

from deliver_tiny import HOSTILE, NEG
from tuneproof.context import StudyContext
from tuneproof.recipes.report import build_markdown

SECTIONS = ["Summary", "Hypothesis and guards", "Baseline", "Runs (all of them)", "Variants (lineage)", "Data check", "Preflight",
            "Training", "Comparisons with the baseline", "Test split access log", "Verdict", "Limits observed", "Exports",
            "Rental plan", "Environment"]


def test_parts_not_run_say_so(cls_bundle):
    md = build_markdown(StudyContext.open(cls_bundle["dir"]))
    assert [line[3:] for line in md.splitlines() if line.startswith("## ")] == SECTIONS
    assert "## Data check\n\nr0001: completed; passed: true; hard faults: 0" in md  # run inline by the baseline (protocol order)
    assert "## Preflight\n\nnot run yet (`tuneproof preflight`)" in md
    assert "## Rental plan\n\nnot run yet (`tuneproof plan --days 7 --hourly-rate 2.5`)" in md
    assert "the reserved test split has not been read." in md
    assert "no variants yet: 1 train run(s)" in md
    assert "every run completed." in md


def test_markdown_holds_every_run_and_the_evidence(dossier_study):
    md, v, t = dossier_study["md"], dossier_study["variant"], dossier_study["train"]
    assert [line[3:] for line in md.splitlines() if line.startswith("## ")] == SECTIONS
    assert "not run yet" not in md.split("## Exports")[0]  # every part before exports was run
    assert f"{dossier_study['failed']} (train) failed: RuntimeError: CUDA out of memory while allocating 2.00 GiB" in md
    assert f"{v} (train) invalid: evaluated on the wrong split (was completed)" in md
    assert f"`- {v} [invalid] method.r: 4 -> 8" in md  # lineage with the change the variant made
    assert "| train | 5.000 | 7.000 | 8 | 0.000 |" in md and "suggested max_length: 8 (configured: 16)" in md
    assert "| update check | true | 4 of 4 LoRA tensors changed |" in md and "| throughput.s_per_step | 0.500 |" in md
    assert "the test split was read 2 times" in md and f"| {t} |" in md
    assert "| experiment |" in md and "variants of the configured budget that fit:" in md
    assert re.search(r"\| accuracy \| 0\.\d{3} \| 0\.\d{3} \| -?0\.\d{3} \| \[-?\d\.\d{3}, -?\d\.\d{3}\] \|", md)
    assert NEG not in md and "| \\<i>neg\\</i>& | 0.833 | 0.333 | -0.500 |" in md  # a '<' that could open a tag is escaped
    assert "typical failure:" in md and "## Verdict\n\n**" in md
    assert "exports/" + t in md and "| libraries.torch |" in md


def test_html_is_self_contained_escaped_and_has_the_plots(dossier_study):
    page = dossier_study["html"]
    assert "<script" not in page.lower() and "http://" not in page and "https://" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; &lt;b&gt;bold&lt;/b&gt;" in page
    assert HOSTILE not in page and NEG not in page and "&lt;i&gt;neg&lt;/i&gt;&amp;" in page
    imgs = re.findall(r'<img alt="([^"]*)" src="data:image/png;base64,([A-Za-z0-9+/=]+)">', page)
    assert len(imgs) == page.count("<img") == 6
    for _, data in imgs:
        assert base64.b64decode(data)[:8] == b"\x89PNG\r\n\x1a\n"
    alts = " | ".join(a for a, _ in imgs)
    for what in ("training loss curves", "per-class recall", "confusion matrix of the baseline", "confusion matrix of the candidate",
                 "token lengths per split", "step memory and throughput"):
        assert what in alts
