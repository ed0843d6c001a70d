"""No verdict from missing evidence (issue 22): a report whose comparison lost the baseline's or the
candidate's outputs says INCOMPLETE on its first screen and exits 3; compare never judges an
interrupted or incomplete evaluation, even with --allow-different-procedure."""

from __future__ import annotations

import shutil

import pytest

from tuneproof.cli import main


def _cli(*args: str) -> int:
    with pytest.raises(SystemExit) as e:
        main(list(args))
    return e.value.code


def _copy(cls_study, tmp_path):
    d = tmp_path / "study"
    shutil.copytree(cls_study["dir"], d)
    return d


def _first_screen(d) -> str:
    return (d / "dossier.md").read_text().split("## Hypothesis and guards")[0]


@pytest.mark.fault("missing evidence: run folder deleted before report")
@pytest.mark.parametrize("role", ["baseline", "candidate"])
def test_a_report_without_the_outputs_its_verdict_rests_on_says_incomplete(cls_study, tmp_path, capsys, role):
    d = _copy(cls_study, tmp_path)
    rid = cls_study["ids"]["baseline" if role == "baseline" else "eval"]
    assert _cli("report", "--study", str(d)) == 0
    assert _first_screen(d).startswith('# Dossier: tiny-cls\n\n<a id="summary"></a>\n\n## Summary\n\n**verdict (')
    shutil.rmtree(d / "runs" / rid)
    capsys.readouterr()
    assert _cli("report", "--study", str(d)) == 3
    out = " ".join(capsys.readouterr().out.split())
    assert f"error: INCOMPLETE: {d / 'runs' / rid / 'outputs.jsonl'}: {role} {rid}'s outputs are missing; " in out
    assert f"{d / 'dossier.md'} was written and says INCOMPLETE instead of a verdict" in out
    screen = _first_screen(d)
    assert f"## Summary\n\n**INCOMPLETE: {role} {rid}'s outputs are missing (runs/{rid}/outputs.jsonl)**" in screen
    assert "INCONCLUSIVE" not in screen and "verdict (" not in screen
    verdict = (d / "dossier.md").read_text().split("## Verdict\n\n")[1]
    assert verdict.startswith(f"**INCOMPLETE: {role} {rid}'s outputs are missing")
