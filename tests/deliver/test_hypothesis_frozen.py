"""The verdict follows the hypothesis fixed before training (PROTOCOL.md step 1, issue 17): frozen
with the first train run, judged against by compare / test / report / export, an edit shown key by
key with both verdicts, the edited one alone only with --use-edited-hypothesis REASON (recorded)."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from tuneproof import hypothesis as hyp
from tuneproof.cli import main
from tuneproof.context import StudyContext
from tuneproof.io import sha256_json


def _cli(*args: str) -> int:
    with pytest.raises(SystemExit) as e:
        main(list(args))
    return e.value.code


def _copy(cls_study, tmp_path):
    d = tmp_path / "study"
    shutil.copytree(cls_study["dir"], d)
    return d


def _edit(d, **guard0):
    cfg = yaml.safe_load((d / "tuneproof.yaml").read_text())
    cfg["hypothesis"]["guards"][0].update(guard0)
    (d / "tuneproof.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))


def _latest_compare(d) -> dict:
    ctx = StudyContext.open(d)
    rec = ctx.registry.latest("compare")
    return json.loads((d / "runs" / rec.id / "compare.json").read_text())


def test_first_train_run_freezes_the_hypothesis_with_its_hash(cls_study):
    d, train = cls_study["dir"], cls_study["ids"]["train"]
    rec = json.loads((d / hyp.FROZEN_FILE).read_text())
    assert rec["run"] == train and rec["schema_version"] >= 1
    assert (
        rec["hash"] == sha256_json(rec["hypothesis"]) == hyp.view_hash(hyp.hypothesis_view(StudyContext.open(d).study))
    )
    assert rec["hypothesis"]["guards"] == [
        {"metric": "per_class_recall", "max_drop": 0.5, "floor": None, "classes": None, "min_support": 1}
    ]
    assert rec["hypothesis"]["format"] == {
        "json_schema": None,
        "regex": None,
        "grammar": None,
        "allow_fenced_json": False,
    }
    # a second freeze (another train run) never replaces the record
    ctx = StudyContext.open(d)
    assert hyp.freeze(d, ctx.study.model_copy(update={"name": "other"}), "r9999")["run"] == train


def test_edited_guard_floor_is_judged_with_the_frozen_one_and_both_verdicts_shown(cls_study, tmp_path, capsys):
    d = _copy(cls_study, tmp_path)
    before = _latest_compare(d)
    assert before["verdict"] != "fail"  # the frozen hypothesis holds on this study (max drop 0.5)
    _edit(d, floor=1.01)  # after training: a floor no class can reach
    capsys.readouterr()
    assert (
        _cli("compare", cls_study["ids"]["eval"], "--study", str(d)) == 0
    )  # judged with the frozen one: not a failure
    out = capsys.readouterr().out
    assert "differs from the one frozen with the first train run " + cls_study["ids"]["train"] in out
    assert "hypothesis.guards[0].floor: null -> 1.01" in out
    assert "judged against the FROZEN hypothesis" in out and "overall (edited hypothesis): fail" in out
    cj = _latest_compare(d)
    assert cj["verdict"] == before["verdict"] and cj["verdict_edited"] == "fail"
    h = cj["hypothesis"]
    assert h["judged_against"] == "frozen" and h["changes"] == [
        {"key": "hypothesis.guards[0].floor", "old": None, "new": 1.01}
    ]
    assert h["use_edited_reason"] is None and h["frozen_hash"] == json.loads((d / hyp.FROZEN_FILE).read_text())["hash"]
    cand = next(iter(cj["candidates"].values()))
    assert cand["alternative"]["hypothesis"] == "edited" and cand["alternative"]["overall"]["verdict"] == "fail"
    assert "below floor 1.01" in next(v for v in cand["alternative"]["verdicts"] if v["kind"] == "guard")["detail"]
    # the dossier judges against the frozen one too, shows the change and the edited verdict
    assert _cli("report", "--study", str(d)) == 0
    md = (d / "dossier.md").read_text()
    assert "| hypothesis.guards[0].floor | null | 1.01 |" in md
    assert f"({cand['judged_against']} hypothesis)" in md and "with the edited hypothesis instead: fail" in md
    assert f"## Verdict\n\n**{before['verdict'].upper()}:" in md


def test_use_edited_hypothesis_needs_a_reason_and_records_it(cls_study, tmp_path, capsys):
    d = _copy(cls_study, tmp_path)
    before = _latest_compare(d)["verdict"]
    _edit(d, floor=1.01)
    assert _cli("compare", cls_study["ids"]["eval"], "--study", str(d), "--use-edited-hypothesis", "  ") == 2
    assert "--use-edited-hypothesis needs a reason" in capsys.readouterr().out
    reason = "floor agreed with the product owner on 2026-12-01"
    assert (
        _cli("compare", cls_study["ids"]["eval"], "--study", str(d), "--use-edited-hypothesis", reason) == 3
    )  # edited: fail
    cj = _latest_compare(d)
    assert cj["verdict"] == "fail" and cj["verdict_frozen"] == before
    assert cj["hypothesis"]["judged_against"] == "edited" and cj["hypothesis"]["use_edited_reason"] == reason
    uses = hyp.overrides(d)
    assert [(u["command"], u["reason"]) for u in uses] == [("compare", reason)]
    assert _cli("report", "--study", str(d), "--use-edited-hypothesis", reason) == 0
    md = (d / "dossier.md").read_text()
    assert f"this dossier judges against the EDITED hypothesis (--use-edited-hypothesis): {reason}" in md
    assert "--use-edited-hypothesis was used 2 time(s):" in md and f"compare {uses[0]['run']}: {reason}" in md
    assert "## Verdict\n\n**FAIL:" in md and f"with the frozen hypothesis instead: {before}" in md


def test_export_manifest_and_card_follow_the_frozen_hypothesis(cls_study, tmp_path):
    from tuneproof.deliver.card import _hypothesis_lines
    from tuneproof.recipes.export import _comparison

    d = _copy(cls_study, tmp_path)
    before = _latest_compare(d)
    _edit(d, floor=1.01)
    ctx = StudyContext.open(d)
    crec = ctx.registry.latest("compare")
    entry = next(iter(before["candidates"].values()))
    j = hyp.resolve(d, ctx.study, ctx.registry)
    comp = _comparison(crec, before, entry, j)
    assert (
        comp["judged_against"] == "frozen" and comp["verdict"] == before["verdict"] and comp["verdict_edited"] == "fail"
    )
    card = "\n".join(_hypothesis_lines({**j.to_json(), "frozen": j.frozen}, comp))
    assert "Judged against the frozen hypothesis" in card and "- `hypothesis.guards[0].floor`: None -> 1.01" in card
    assert "Verdict with the edited hypothesis: **fail**" in card
    j2 = hyp.resolve(d, ctx.study, ctx.registry, "agreed floor")
    comp2 = _comparison(crec, before, entry, j2)
    assert comp2["verdict"] == "fail" and comp2["verdict_frozen"] == before["verdict"]
    assert "at the user's request (--use-edited-hypothesis): agreed floor" in "\n".join(
        _hypothesis_lines(j2.to_json(), comp2)
    )


def test_changing_the_task_after_training_is_refused(cls_study, tmp_path):
    d = _copy(cls_study, tmp_path)
    ctx = StudyContext.open(d)
    study = ctx.study.model_copy(deep=True)
    object.__setattr__(study.hypothesis, "task", "format")
    with pytest.raises(Exception, match="hypothesis.task changed from 'classification' to 'format'"):
        hyp.resolve(d, study, ctx.registry)


def test_exported_bundle_states_the_frozen_hypothesis(cls_bundle):
    man = json.loads((cls_bundle["bundle"] / "manifest.json").read_text())
    frozen = json.loads((cls_bundle["dir"] / hyp.FROZEN_FILE).read_text())
    h = man["hypothesis"]
    assert (
        h["judged_against"] == "frozen"
        and h["frozen_hash"] == frozen["hash"]
        and h["frozen_run"] == cls_bundle["ids"]["train"]
    )
    assert h["changed"] is False and h["use_edited_reason"] is None and h["frozen"] == frozen["hypothesis"]
    assert man["comparison"]["judged_against"] == "frozen"
    card = (cls_bundle["bundle"] / "README.md").read_text()
    assert (
        f"Judged against the frozen hypothesis; the hypothesis was frozen with the first train run {cls_bundle['ids']['train']}"
        in card
    )


def test_test_split_read_records_the_hypothesis_it_was_scored_with(cls_study, tmp_path):
    d = _copy(cls_study, tmp_path)
    _edit(d, floor=0.9)
    train = cls_study["ids"]["train"]
    assert _cli("test", train, "--study", str(d)) == 0
    ctx = StudyContext.open(d)
    rec = ctx.registry.latest("test")
    assert rec.summary["judged_against"] == "frozen"
    assert rec.summary["hypothesis"]["changes"] == [{"key": "hypothesis.guards[0].floor", "old": None, "new": 0.9}]
    assert ctx.registry.test_accesses()[-1]["result"]["judged_against"] == "frozen"
    assert _cli("test", train, "--study", str(d), "--use-edited-hypothesis", "floor set by the review") == 0
    ctx = StudyContext.open(d)
    assert ctx.registry.latest("test").summary["judged_against"] == "edited"
    assert ctx.registry.test_accesses()[-1]["result"]["use_edited_reason"] == "floor set by the review"
    assert [(u["command"], u["reason"]) for u in hyp.overrides(d)] == [("test", "floor set by the review")]
    from tuneproof.recipes.report import build_markdown

    assert "(scored with the EDITED hypothesis: floor set by the review)" in build_markdown(StudyContext.open(d))
