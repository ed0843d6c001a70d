"""No verdict from missing evidence (docs/PROTOCOL.md step 7): a report whose comparison lost the baseline's or the
candidate's outputs says INCOMPLETE on its first screen and exits 3; compare never judges an
interrupted or incomplete evaluation, even with --allow-different-procedure."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

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


KILL_AT = """
import os, signal, sys
import tuneproof.evaluation.outputs as O
from tuneproof.cli import main
AT = int(sys.argv[1])
O.PROGRESS_EVERY_S = 0.0
orig = O.EvalProgress.flush
def flush(self):
    orig(self)
    if self.done >= AT:
        os.kill(os.getpid(), signal.SIGKILL)
O.EvalProgress.flush = flush
main(sys.argv[2:])
"""


def _env() -> dict:
    import tuneproof

    src = str(Path(tuneproof.__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": src, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


@pytest.mark.fault("missing evidence: eval killed mid-run, then compare")
def test_an_eval_killed_mid_run_is_never_judged(cls_study, tmp_path, capsys):
    import yaml

    from tuneproof.context import StudyContext

    d = _copy(cls_study, tmp_path)
    cfg = yaml.safe_load((d / "tuneproof.yaml").read_text())
    cfg["eval"]["batch_size"] = 4  # 12 validation examples: 3 batches
    (d / "tuneproof.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    before = {r.id for r in StudyContext.open(d).registry.list()}
    proc = subprocess.run(
        [sys.executable, "-c", KILL_AT, "4", "eval", cls_study["ids"]["train"], "--study", str(d)],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=600,
    )
    assert proc.returncode == -9, proc.stdout + proc.stderr
    ctx = StudyContext.open(d)  # the dead process's run is marked interrupted
    (killed,) = [r for r in ctx.registry.list() if r.id not in before]
    assert killed.kind == "eval" and killed.status == "interrupted"
    ctx.registry.close()
    capsys.readouterr()
    for extra in ((), ("--allow-different-procedure",)):
        assert _cli("compare", killed.id, "--study", str(d), *extra) == 3
        out = " ".join(capsys.readouterr().out.split())
        assert f"error: {killed.id} was interrupted at example 4 of 12 (" in out and "); evaluate again" in out
        assert f"-> `tuneproof eval {cls_study['ids']['train']}` evaluates again" in out
        assert "evaluated differently" not in out
    assert [r.kind for r in StudyContext.open(d).registry.list() if r.id not in before] == ["eval"]  # no compare run


@pytest.mark.fault("missing evidence: eval.json of a completed eval deleted")
def test_a_completed_eval_without_its_eval_json_is_never_judged(cls_study, tmp_path, capsys):
    d = _copy(cls_study, tmp_path)
    rid = cls_study["ids"]["eval"]
    (d / "runs" / rid / "eval.json").unlink()
    capsys.readouterr()
    assert _cli("compare", rid, "--study", str(d), "--allow-different-procedure") == 3
    out = " ".join(capsys.readouterr().out.split())
    assert f"error: {rid} is incomplete: {d / 'runs' / rid} has no eval.json; evaluate again" in out
