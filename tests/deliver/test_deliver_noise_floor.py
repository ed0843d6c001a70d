"""Issue 32 item 2 on the deliverable: when the noise floor measured by ``eval.repeat`` decides the verdict (a gain
above min_gain but not above the floor), the compare screen, ``compare.json`` and the dossier's first screen say so,
with the threshold that applied and the per-example flips."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from tuneproof.cli import main
from tuneproof.evaluation import recording

pytestmark = pytest.mark.filterwarnings("ignore")


def _cli(*args: str) -> int:
    with pytest.raises(SystemExit) as e:
        main(list(args))
    return e.value.code


def test_a_floor_above_the_gain_decides_the_verdict_on_the_first_screen(cls_study, tmp_path, capsys, monkeypatch):
    d = tmp_path / "study"
    shutil.copytree(cls_study["dir"], d)
    ids = cls_study["ids"]
    cfg = yaml.safe_load((d / "tuneproof.yaml").read_text())
    cfg["eval"]["repeat"] = 3  # a budget key: the frozen hypothesis and the evaluation fingerprint stay as they were
    (d / "tuneproof.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    real = recording.noise_record

    def planted(*args, **kw):  # the classifier's argmax does not move on a CPU: plant a spread of 0.9 on macro-F1
        rec = real(*args, **kw)
        assert rec["metrics"]["macro_f1"]["spread"] == 0.0  # measured first
        v = rec["metrics"]["macro_f1"]["values"][0]
        rec["metrics"]["macro_f1"] = {"values": [v, v + 0.9, v], "spread": 0.9, "floor": 0.9}
        return rec

    monkeypatch.setattr(recording, "noise_record", planted)
    assert _cli("baseline", "--study", str(d), "--skip-data-check", "noise floor test") == 0
    runs = sorted(p.name for p in (d / "runs").iterdir())
    base = runs[-1]
    assert json.loads((d / "runs" / base / "noise.json").read_text())["metrics"]["macro_f1"]["spread"] == 0.9
    assert _cli("invalidate", ids["baseline"], "--why", "replaced by a repeated baseline", "--study", str(d)) == 0
    capsys.readouterr()
    assert _cli("compare", ids["eval"], "--against", base, "--study", str(d)) == 3  # verdict fail
    out = " ".join(capsys.readouterr().out.split())
    assert "success threshold: noise floor 0.9 (3 repeats of the baseline) > min_gain 0" in out
    assert "WARNING: the noise floor decided the verdict: fail against the noise floor 0.9" in out
    assert f"per-example flips between repeats: baseline {base} 0 (3 repeats)" in out
    comp = sorted(p.name for p in (d / "runs").iterdir())[-1]
    entry = json.loads((d / "runs" / comp / "compare.json").read_text())["candidates"][ids["eval"]]
    succ = entry["verdicts"][0]
    assert succ["verdict"] == "fail" and succ["decided_by_noise_floor"] is True and succ["threshold"] == 0.9
    assert succ["verdict_min_gain"] in ("pass", "inconclusive")

    assert _cli("report", "--study", str(d)) == 0
    first = (d / "dossier.md").read_text().split("## Hypothesis and guards")[0]
    assert "the noise floor decided the verdict: fail against the noise floor 0.9 (3 repeats of the baseline)" in first
    assert "success threshold: noise floor 0.9 (3 repeats of the baseline) > min_gain 0" in first
    assert f"per-example flips between repeats: baseline {base} 0 (3 repeats)" in first
    section = (d / "dossier.md").read_text().split('<a id="baseline"></a>')[1].split("<a id=")[0]
    assert "for 3 repeats (eval.repeat)." in section
    assert f"noise floor over 3 repeats (max - min of each metric; runs/{base}/noise.json): " in section
    assert "accuracy 0, macro-F1 0.9" in section and "per-example flips 0" in section

    # the bundle claims the verdict judged above the floor, and its verification recomputes it the same way
    capsys.readouterr()
    code = _cli("export", ids["train"], "--study", str(d), "--out", str(tmp_path / "bundle"))
    out = capsys.readouterr()
    assert code == 0, out.out + out.err
    man = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    assert man["comparison"]["compare_run"] == comp and man["comparison"]["verdict"] == "fail"
    assert man["comparison"]["verdicts"][0]["decided_by_noise_floor"] is True
    assert man["scoring"]["comparison"]["noise"]["baseline"]["floors"]["macro_f1"] == 0.9
