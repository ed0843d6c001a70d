"""The verdict follows the hypothesis fixed before training (docs/PROTOCOL.md step 1): frozen
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
        {
            "metric": "per_class_recall",
            "max_drop": 0.5,
            "floor": None,
            "classes": None,
            "min_support": 1,
            "correction": "auto",
        }
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
        "Judged against the frozen hypothesis; the hypothesis was frozen with "
        f"the first train run {cls_bundle['ids']['train']}" in card
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


# --------------------------------------------------------------------------- the seal (docs/PROTOCOL.md step 1)
def _tamper(d, *, rehash: bool) -> tuple[str, str]:
    """``success.min_gain`` set to -1 in the frozen file (its stored hash recomputed when ``rehash``);
    returns (the sha256 the first train run recorded, the sha256 of the edited file)."""
    from tuneproof.io import sha256_file

    path = d / hyp.FROZEN_FILE
    rec = json.loads(path.read_text())
    rec["hypothesis"]["success"]["min_gain"] = -1
    if rehash:
        rec["hash"] = sha256_json(rec["hypothesis"])
    recorded = sha256_file(path)
    path.write_text(json.dumps(rec, indent=2))
    return recorded, sha256_file(path)


def test_the_first_train_run_records_the_sha256_of_the_frozen_file(cls_study):
    from tuneproof.io import sha256_file

    d, train = cls_study["dir"], cls_study["ids"]["train"]
    ctx = StudyContext.open(d)
    assert ctx.registry.get(train).summary[hyp.SEAL_KEY] == sha256_file(d / hyp.FROZEN_FILE)
    run_json = json.loads((d / "runs" / train / "run.json").read_text())
    assert run_json["summary"][hyp.SEAL_KEY] == sha256_file(d / hyp.FROZEN_FILE)
    assert hyp.resolve(d, ctx.study, ctx.registry).file_sha256 == sha256_file(d / hyp.FROZEN_FILE)
    cj = _latest_compare(d)
    assert cj["hypothesis"]["frozen_file_sha256"] == sha256_file(d / hyp.FROZEN_FILE)


@pytest.mark.fault("tampering: frozen hypothesis edited")
@pytest.mark.parametrize("rehash", [False, True], ids=["stored-hash-kept", "stored-hash-recomputed"])
def test_an_edited_frozen_hypothesis_is_refused_by_every_command_that_judges(cls_study, tmp_path, capsys, rehash):
    d = _copy(cls_study, tmp_path)
    ids = cls_study["ids"]
    before = {r.id for r in StudyContext.open(d).registry.list()}
    recorded, found = _tamper(d, rehash=rehash)
    assert recorded != found
    capsys.readouterr()
    for args in (
        ("compare", ids["eval"]),
        ("report",),
        ("test", ids["train"]),
        ("export", ids["train"], "--verify-examples", "2", "--out", str(tmp_path / "bundle")),
    ):
        assert _cli(*args, "--study", str(d)) == 3, args
        out = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
        assert f"{d / hyp.FROZEN_FILE}: sha256 {found} differs from the sha256 {recorded} recorded by the " in out
        assert f"first train run {ids['train']} when it froze the hypothesis" in out, args
        assert "restore it from a backup or version control" in out
    ctx = StudyContext.open(d)
    assert [r.kind for r in ctx.registry.list() if r.id not in before] == []  # nothing judged, nothing read
    assert not (tmp_path / "bundle").exists() and ctx.registry.test_accesses() == []
    md = (d / "dossier.md").read_text()
    assert "## Summary\n\n**INCOMPLETE: the frozen hypothesis hypothesis.frozen.json was edited after the first " in md
    assert f"(sha256 {found[:12]}, recorded {recorded[:12]})" in md and "PASS" not in md.split("## Hypothesis")[0]


@pytest.mark.fault("tampering: frozen hypothesis edited")
def test_a_study_frozen_before_the_seal_checks_the_files_own_hash(cls_study, tmp_path, capsys):
    from tuneproof.registry import Registry

    d = _copy(cls_study, tmp_path)
    ids = cls_study["ids"]
    reg = Registry(d)  # a study frozen before this change: the first train run recorded no sha256
    summary = dict(reg.get(ids["train"]).summary)
    del summary[hyp.SEAL_KEY]
    reg._update(ids["train"], summary=json.dumps(summary))
    reg._conn.execute("DELETE FROM meta WHERE key = ?", (hyp.SEAL_META,))  # nor the index's copy of it
    reg.close()
    assert _cli("compare", ids["eval"], "--study", str(d)) == 0  # untouched: works as before
    stored = json.loads((d / hyp.FROZEN_FILE).read_text())["hash"]
    _tamper(d, rehash=False)
    content = sha256_json(json.loads((d / hyp.FROZEN_FILE).read_text())["hypothesis"])
    capsys.readouterr()
    assert _cli("compare", ids["eval"], "--study", str(d)) == 3
    out = " ".join(capsys.readouterr().out.split())
    assert f"{d / hyp.FROZEN_FILE}: its stored hash {stored} does not match its content (sha256 {content} " in out


@pytest.mark.fault("tampering: frozen hypothesis unreadable or deleted")
@pytest.mark.parametrize("damage", ["truncated", "deleted"])
def test_an_unreadable_or_deleted_frozen_hypothesis_is_refused(cls_study, tmp_path, capsys, damage):
    from tuneproof.io import sha256_file

    d = _copy(cls_study, tmp_path)
    ids = cls_study["ids"]
    path = d / hyp.FROZEN_FILE
    recorded = sha256_file(path)
    if damage == "deleted":
        path.unlink()
        want = f"{path}: the frozen hypothesis is missing; the sha256 {recorded} recorded by the first train run"
        head = "**INCOMPLETE: the frozen hypothesis hypothesis.frozen.json is missing**"
    else:
        path.write_bytes(path.read_bytes()[:40])
        want = f"{path}: sha256 {sha256_file(path)} differs from the sha256 {recorded} recorded by the first train"
        head = "**INCOMPLETE: the frozen hypothesis hypothesis.frozen.json was edited after the first train run"
    capsys.readouterr()
    for args in (("compare", ids["eval"]), ("report",)):
        assert _cli(*args, "--study", str(d)) == 3
        assert want in " ".join(capsys.readouterr().out.split())
    assert head in (d / "dossier.md").read_text().split("## Hypothesis")[0]


def _train_runs(d) -> list[str]:
    from tuneproof.registry import Registry

    reg = Registry(d)
    try:
        return [r.id for r in reg.list(kind="train")]
    finally:
        reg.close()


@pytest.mark.fault("re-freezing: the freezing run invalidated, the frozen file deleted, the hypothesis loosened")
def test_the_seal_outlives_the_frozen_file_and_the_run_that_froze_it(cls_study, tmp_path, capsys):
    """Issue 33 item 4: invalidate the run that froze the hypothesis, delete hypothesis.frozen.json, loosen the
    hypothesis, train again: train exited 0 and froze the loosened one. It is refused (exit 3) before any run,
    naming what happened and how to start a new study; the seal is also kept in the registry index, so a rebuild
    without the freezing run's folder still refuses."""
    from tuneproof.io import sha256_file
    from tuneproof.registry import Registry

    d = _copy(cls_study, tmp_path)
    train = cls_study["ids"]["train"]
    path = d / hyp.FROZEN_FILE
    sealed = sha256_file(path)
    reg = Registry(d)
    assert json.loads(reg.meta(hyp.SEAL_META)) == {"run": train, "sha256": sealed}  # the index keeps the seal
    reg.close()
    assert _cli("invalidate", train, "--why", "to loosen the guard", "--study", str(d)) == 0
    path.unlink()
    _edit(d, max_drop=0.9)  # the hypothesis loosened
    before = _train_runs(d)
    capsys.readouterr()
    assert _cli("train", "--study", str(d)) == 3
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith(
        f"error: train refused: the hypothesis was frozen by train run {train}, now invalid: to loosen the guard "
        f"(was completed), and {path}: the frozen hypothesis is missing; the sha256 {sealed} recorded by the first "
        f"train run {train}; a study freezes its hypothesis once: invalidating that run or deleting the file does "
        "not unfreeze it"
    ), out
    assert f"restore {hyp.FROZEN_FILE} (sha256 {sealed[:12]}...)" in out and "`tuneproof init NEW_FOLDER`" in out
    assert "Traceback" not in out
    assert not path.exists() and _train_runs(d) == before  # nothing frozen again, no train run started

    # the freezing run's folder gone too and the index rebuilt: the seal the index kept is carried over
    shutil.rmtree(d / "runs" / train)
    assert _cli("registry", "rebuild", "--study", str(d)) == 0
    capsys.readouterr()
    assert _cli("train", "--study", str(d)) == 3
    out = " ".join(capsys.readouterr().out.split())
    assert f"train refused: the hypothesis was frozen by train run {train} (no longer in the registry), and " in out
    assert not path.exists()


def test_an_edited_frozen_hypothesis_refuses_train_too(cls_study, tmp_path, capsys):
    d = _copy(cls_study, tmp_path)
    path = d / hyp.FROZEN_FILE
    rec = json.loads(path.read_text())
    rec["hypothesis"]["success"]["min_gain"] = -1.0
    rec["hash"] = sha256_json(rec["hypothesis"])  # rehashed: only the seal tells
    path.write_text(json.dumps(rec))
    before = _train_runs(d)
    capsys.readouterr()
    assert _cli("train", "--study", str(d)) == 3
    out = " ".join(capsys.readouterr().out.split())
    assert (
        f"error: train refused: the hypothesis was frozen by train run {cls_study['ids']['train']}, and {path}: "
        "sha256 " in out
    )
    assert _train_runs(d) == before
