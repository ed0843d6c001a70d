"""The candidate against each control (issue 32 item 1): a planted study where a 5-shot prompt beats the candidate
while the candidate beats the bare base model. ``hypothesis.success.against: strongest`` judges against the control
chosen when the hypothesis was frozen (the verdict fails, naming it); ``against: baseline`` passes and still shows
the control. Outputs are written by hand: no model."""

from __future__ import annotations

import json

import pytest
import yaml

from tuneproof import hypothesis as hyp
from tuneproof.context import StudyContext, parse_study
from tuneproof.errors import TuneproofError
from tuneproof.evaluation.compare import mcnemar_exact
from tuneproof.evaluation.controls import control_lines, latest_plain_baseline, strongest_control
from tuneproof.evaluation.fingerprint import diff_fingerprints, eval_fingerprint
from tuneproof.io import read_json, write_json, write_jsonl
from tuneproof.recipes.compare import run_compare
from tuneproof.recipes.quickstart import beat_line
from tuneproof.recipes.report import build_markdown
from tuneproof.registry import Registry

REF = json.dumps({"intent": "A", "slots": {"x": "1"}})
N = 40
PARTS = {"eval_ids": "i", "prompt": "p", "decoding": "d", "metrics": "m", "tokenizer": "t"}


def _cfg(against: str | None) -> dict:
    success = {"metric": "field_f1", "min_gain": 0.1, **({"against": against} if against else {})}
    return {
        "name": "controls",
        "model": {"base": "smollm2-135m-instruct"},
        "hypothesis": {
            "behaviour": "extract",
            "task": "extraction",
            "success": success,
            "guards": [{"metric": "json_valid_rate", "max_drop": 1.0}],
            "required_fields": ["intent"],
        },
        "data": {"sources": [{"path": "d.jsonl", "format": "jsonl"}]},
        "eval": {"bootstrap_iterations": 200},
    }


def _run(reg: Registry, kind: str, right: int, *, parent=None, shots: int | None = None, parts=None) -> str:
    """An evaluation whose first ``right`` examples are answered right, the rest with invalid JSON."""
    with reg.run(kind, parent=parent) as r:
        preds = [REF if i < right else "no json" for i in range(N)]
        write_jsonl(
            r.path("outputs.jsonl"),
            [
                {"id": f"e{i:02d}", "category": "A", "input": "t", "reference": REF, "prediction": p}
                for i, p in enumerate(preds)
            ],
        )
        fp_parts = dict(parts or PARTS) | ({"control": f"few-shot {shots}"} if shots else {})
        write_json(
            r.path("eval.json"),
            {"fingerprint": {"hash": json.dumps(fp_parts), "parts": fp_parts}, "metrics": {"field_f1": right / N}},
        )
        if shots:
            r.update_summary(control="few_shot", few_shot=shots)
        return r.id


def _planted(tmp_path, against: str | None):
    """baseline 0/40 right, a 5-shot control 36/40, the candidate 24/40 (a subset of the control's)."""
    d = tmp_path / "study"
    d.mkdir()
    (d / "tuneproof.yaml").write_text(yaml.safe_dump(_cfg(against)))
    reg = Registry(d)
    base = _run(reg, "baseline", 0)
    ctrl = _run(reg, "baseline", 36, shots=5)
    study = parse_study(_cfg(against))
    chosen = strongest_control(reg, "field_f1", {"parts": PARTS}) if against == "strongest" else None
    with reg.run("train") as t:
        write_json(t.path("config.json"), _cfg(against))
        hyp.freeze(d, study, t.id, against=chosen)
    cand = _run(reg, "eval", 24, parent=t.id)
    return d, reg, base, ctrl, cand


def test_against_strongest_fails_when_the_few_shot_prompt_beats_the_candidate(tmp_path, capsys):
    d, reg, base, ctrl, cand = _planted(tmp_path, "strongest")
    frozen = read_json(d / hyp.FROZEN_FILE)
    assert frozen["against"]["run"] == ctrl and frozen["against"]["value"] == 0.9
    assert [c["run"] for c in frozen["against"]["considered"]] == [base, ctrl]
    assert frozen["hypothesis"]["success"]["against"] == "strongest"
    # a stronger control evaluated after the freeze is shown, never judged against
    later = _run(reg, "baseline", 40, shots=8)
    reg.close()
    cid = run_compare(StudyContext.open(d), [cand])
    cj = read_json(d / "runs" / cid / "compare.json")
    c = cj["candidates"][cand]
    assert cj["baseline"] == base and cj["judged_control"]["run"] == ctrl
    assert [x["run"] for x in cj["controls"]] == [base, ctrl, later]
    assert c["overall_vs_baseline"]["verdict"] == "pass"  # 24 fixed, none broken against the bare base
    assert cj["verdict"] == "fail" and c["overall"]["verdict"] == "fail"
    vs = c["controls"][ctrl]
    assert vs["counts"]["fixed"] == 0 and vs["counts"]["broken"] == 12
    assert vs["mcnemar"]["p_value"] == pytest.approx(mcnemar_exact(0, 12))
    # field F1 (micro over slot/value pairs, invalid JSON recalls nothing): 2 r / (1 + r) at recall r
    assert vs["success"]["delta"] == pytest.approx(0.75 - 1.8 / 1.9) and vs["success"]["verdict"] == "fail"
    assert vs["success"]["ci"][1] < 0.1
    assert c["controls"][base]["success"]["delta"] == pytest.approx(0.75)
    assert c["controls"][later]["counts"]["broken"] == 16
    success = next(v for v in c["verdicts"] if v["kind"] == "success")
    assert success["against"] == ctrl and success["verdict"] == "fail"
    reason = c["control_reason"]
    assert f"beats the baseline {base}" in reason and f"does not beat the 5-shot prompt {ctrl}" in reason
    assert c["overall"]["detail"].startswith(reason)
    out = capsys.readouterr().out
    assert "5-shot prompt" in out and f"success judged against {ctrl}" in out


def test_against_baseline_passes_and_still_shows_the_control(tmp_path):
    d, reg, base, ctrl, cand = _planted(tmp_path, None)
    assert "against" not in read_json(d / hyp.FROZEN_FILE)
    reg.close()
    cid = run_compare(StudyContext.open(d), [cand])
    cj = read_json(d / "runs" / cid / "compare.json")
    c = cj["candidates"][cand]
    assert cj["verdict"] == "pass" and cj["judged_control"]["run"] == base
    assert c.get("control_reason") is None and "overall_vs_baseline" not in c
    assert c["controls"][ctrl]["success"]["verdict"] == "fail"
    lines = control_lines(c)
    assert any(f"5-shot prompt {ctrl}" in line and "success fail" in line for line in lines)
    assert any(f"success judged against {base} (*): hypothesis.success.against: baseline" in line for line in lines)


def test_a_hypothesis_frozen_before_the_key_keeps_its_hash():
    cfg = _cfg(None)
    view = hyp.hypothesis_view(parse_study(cfg))
    assert "against" not in view["success"]
    # the hash the code before issue 32 gave this hypothesis
    assert hyp.view_hash(view) == "f06ee38ecda8f7dab512e9a8f8720ee59809af4b4b4c639ed2e662a0845b8a09"
    assert hyp.view_hash(hyp.hypothesis_view(parse_study(_cfg("baseline")))) == hyp.view_hash(view)
    strongest = hyp.hypothesis_view(parse_study(_cfg("strongest")))
    assert strongest["success"]["against"] == "strongest" and hyp.view_hash(strongest) != hyp.view_hash(view)
    assert hyp.changes(view, strongest) == [
        {"key": "hypothesis.success.against", "old": "(absent)", "new": "strongest"}
    ]


def test_the_control_part_is_no_different_procedure_but_any_other_part_is():
    ids, tok = ["a", "b"], {"vocab_sha256": "x"}
    plain = eval_fingerprint(ids, {}, "extraction", [], tok)
    control = eval_fingerprint(ids, {}, "extraction", [], tok, control={"kind": "few_shot", "k": 3, "shots": ["s"]})
    assert plain["hash"] == eval_fingerprint(ids, {}, "extraction", [], tok, control=None)["hash"]
    assert diff_fingerprints(plain, control) == ["control"]
    assert diff_fingerprints(plain, control, controls=True) == []
    other = eval_fingerprint(ids, {"prompt": {"template": "Q: {text}"}}, "extraction", [], tok)
    assert diff_fingerprints(other, control, controls=True) == ["prompt"]


def test_compare_pairs_a_candidate_with_a_control_but_refuses_another_procedure(tmp_path):
    d = tmp_path / "study"
    d.mkdir()
    (d / "tuneproof.yaml").write_text(yaml.safe_dump(_cfg(None)))
    reg = Registry(d)
    _run(reg, "baseline", 0)
    ctrl = _run(reg, "baseline", 30, shots=2)
    cand = _run(reg, "eval", 20)
    odd = _run(reg, "eval", 20, parts=PARTS | {"prompt": "another"})
    assert latest_plain_baseline(reg).id != ctrl
    reg.close()
    ctx = StudyContext.open(d)
    cid = run_compare(ctx, [cand], against=ctrl)
    c = read_json(d / "runs" / cid / "compare.json")["candidates"][cand]
    assert not any("DIFFERENT PROCEDURE" in n for n in c["notes"])
    assert c["metrics"]["field_f1"]["delta"] == pytest.approx(2 * 0.5 / 1.5 - 2 * 0.75 / 1.75)
    with pytest.raises(TuneproofError) as err:
        run_compare(ctx, [odd], against=ctrl)
    assert "differs: prompt" in err.value.message
    # against the plain baseline, the control with another procedure than the candidate's is left out, said so
    cid = run_compare(ctx, [odd], allow_different_procedure=True)
    c = read_json(d / "runs" / cid / "compare.json")["candidates"][odd]
    assert ctrl not in c["controls"] and any(f"control {ctrl}" in n and "not compared" in n for n in c["notes"])


def test_the_dossier_first_screen_says_the_control_decided_the_verdict(tmp_path):
    d, reg, base, ctrl, cand = _planted(tmp_path, "strongest")
    reg.close()
    run_compare(StudyContext.open(d), [cand])
    md = build_markdown(StudyContext.open(d))
    first = md.split("## Summary")[1].split("\n## ")[0]
    assert "verdict (frozen hypothesis): FAIL (the candidate beats the baseline" in first
    assert f"does not beat the 5-shot prompt {ctrl}" in first
    assert f"- 5-shot prompt {ctrl}: field_f1 0.947 -> 0.750, delta -0.197" in first
    assert "success fail (the control the success criterion was judged against)" in first
    assert f"- success judged against {ctrl}: hypothesis.success.against: strongest" in first
    assert f"baseline (the base model, the study's prompt) {base}: field_f1 0.000 -> 0.750" in first
    assert f"over the strongest control (5-shot prompt {ctrl}, chosen when the hypothesis was frozen)" in first
    section = md.split("## Comparisons with the baseline")[1].split("\n## ")[0]
    assert f"| 5-shot prompt | {ctrl} (judged against) | 0.947 | 0.750 | -0.197 |" in section
    assert f"the success criterion was judged against {ctrl}: hypothesis.success.against: strongest" in section
    baseline = md.split("## Baseline")[1].split("\n## ")[0]
    assert f"control {ctrl}: 5-shot prompt" in baseline


def test_the_quickstart_line_says_whether_lora_beat_the_few_shot_prompt(tmp_path):
    d, reg, base, ctrl, cand = _planted(tmp_path, None)
    reg.close()
    cid = run_compare(StudyContext.open(d), [cand])
    entry = read_json(d / "runs" / cid / "compare.json")["candidates"][cand]
    line = beat_line(entry, ctrl)
    assert line.startswith(f"LoRA did not beat the 5-shot prompt {ctrl}: field_f1 0.947 -> 0.750, paired delta -0.197")
    assert "(95% CI [-0." in line and "gain required 0.100" in line
    assert beat_line(entry, "r0099").startswith("few-shot control r0099: not compared")


def test_a_comparison_against_a_control_named_with_against_is_no_verdict_and_said_so(tmp_path):
    d, reg, base, ctrl, cand = _planted(tmp_path, None)
    reg.close()
    first = run_compare(StudyContext.open(d), [cand], against=ctrl)
    md = build_markdown(StudyContext.open(d))
    summary = md.split("## Summary")[1].split("\n## ")[0]
    assert f"comparison {first}: {cand} vs {ctrl} (5-shot prompt, a control named with --against)" in summary
    assert "verdict: none yet" in summary  # only a comparison with the baseline gives the verdict


def test_the_bundle_claims_recompute_the_verdict_against_the_frozen_control(tmp_path):
    import shutil

    from tuneproof.deliver.claims import CONTROL_OUTPUTS, _against_control
    from tuneproof.io import read_jsonl
    from tuneproof.recipes.export import _judged_control

    d, reg, base, ctrl, cand = _planted(tmp_path, "strongest")
    reg.close()
    ctx = StudyContext.open(d)
    cid = run_compare(ctx, [cand])
    entry = read_json(d / "runs" / cid / "compare.json")["candidates"][cand]
    control = _judged_control(entry)  # what export records in the manifest's scoring
    assert control == {"run": ctrl, "label": "5-shot prompt", "noise": None}
    bundle = tmp_path / "bundle"
    (bundle / "results").mkdir(parents=True)
    view = hyp.resolve(d, ctx.study, ctx.registry).primary
    cand_rows = read_jsonl(d / "runs" / cand / "outputs.jsonl")
    args = (control, cand_rows, ctx.task, view, ctx.study.eval, None)
    plain = (entry["verdicts_vs_baseline"], entry["overall_vs_baseline"])
    # without the control's outputs the claims check keeps the baseline's pass: it differs from the claimed fail
    assert _against_control(bundle, *args, *plain, base)[1]["verdict"] == "pass"
    shutil.copy2(d / "runs" / ctrl / "outputs.jsonl", bundle / CONTROL_OUTPUTS)
    verdicts, overall = _against_control(bundle, *args, *plain, base)
    assert overall == entry["overall"] and overall["verdict"] == "fail"
    assert verdicts == entry["verdicts"]
