"""The dossier's headline is the verdict of the hypothesis for the delivered (or best passed) candidate against the
baseline it names, never the last ``compare`` (issue 33 item 1); a run whose evidence is gone is INCOMPLETE, never
its numbers as if present (issue 33 item 5)."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest

from tuneproof.cli import main
from tuneproof.deliver.headline import choose, other_comparisons, stale_comparisons

pytestmark = pytest.mark.filterwarnings("ignore")


def _cli(*args: str) -> int:
    with pytest.raises(SystemExit) as e:
        main(list(args))
    return e.value.code


def _first_screen(d) -> str:
    return (d / "dossier.md").read_text().split("## Hypothesis and guards")[0]


def _verdict_line(d) -> str:
    return next(line for line in _first_screen(d).splitlines() if line.startswith("**verdict ("))


# --------------------------------------------------------------------------- which comparison is the verdict
def _rec(rid, kind, parent=None, status="completed", **summary):
    return SimpleNamespace(id=rid, kind=kind, parent=parent, status=status, reason=None, summary=summary)


def _entry(verdict, delta):
    return {"overall": {"verdict": verdict}, "verdicts": [{"kind": "success", "delta": delta}]}


def _study(*extra):
    runs = [
        _rec("r0001", "baseline"),
        _rec("r0002", "train", baseline_run="r0001"),
        _rec("r0003", "eval", "r0002"),
        _rec("r0004", "train", baseline_run="r0001"),
        _rec("r0005", "eval", "r0004"),
        _rec("r0006", "compare", baseline="r0001", candidates=["r0003", "r0005"]),
        *extra,
    ]
    files = {
        ("r0006", "compare.json"): {
            "baseline": "r0001",
            "candidates": {"r0003": _entry("pass", 0.10), "r0005": _entry("pass", 0.20)},
        },
        ("r0008", "compare.json"): {"baseline": "r0003", "candidates": {"r0005": _entry("pass", 0.0)}},
    }
    return runs, lambda rid, name: files.get((rid, name))


def test_the_headline_is_the_delivered_candidate_then_the_best_passed_never_candidate_vs_candidate():
    cvc = _rec("r0008", "compare", baseline="r0003", candidates=["r0005"])  # compare r0005 --against r0003, last
    runs, read = _study(cvc)
    h = choose(runs, read)
    assert (h.compare.id, h.cid, h.baseline, h.basis) == ("r0006", "r0005", "r0001", "best passed")
    assert h.says == "r0005 (the best candidate that passed) vs baseline r0001 (r0006)"
    assert [(c.id, ref, cands) for c, ref, cands in other_comparisons(runs, read)] == [("r0008", "r0003", ["r0005"])]
    # r0002 exported: its candidate is the headline, though r0005 gained more
    runs, read = _study(cvc, _rec("r0009", "export", "r0002"))
    h = choose(runs, read)
    assert (h.cid, h.basis, h.train, h.export) == ("r0003", "delivered", "r0002", "r0009")
    assert h.says == "r0003 (the delivered candidate: export r0009 of r0002) vs baseline r0001 (r0006)"
    # nothing passed: the latest comparison with the baseline, its first candidate
    runs, read = _study(cvc)
    h = choose(runs, read, passed=lambda e: False)
    assert (h.compare.id, h.cid, h.basis) == ("r0006", "r0003", "latest")
    # the best candidate invalidated since: the other one; both: no verdict, the comparison listed as resting on them
    runs, read = _study(cvc)
    runs[4].status, runs[4].reason = "invalid", "outputs edited by hand"
    assert choose(runs, read).cid == "r0003"
    runs[2].status = "invalid"
    assert choose(runs, read) is None
    assert stale_comparisons(runs, read) == [
        "comparison r0006: candidate r0003 is invalid (no reason)",
        "comparison r0006: candidate r0005 is invalid (outputs edited by hand)",
    ]
    # only candidates compared with each other: no verdict
    runs = [r for r in _study(cvc)[0] if r.id != "r0006"]
    assert choose(runs, read) is None


@pytest.mark.fault("verdict: the last compare is candidate vs candidate")
def test_a_candidate_vs_candidate_compare_leaves_the_headline_and_the_claims_alone(cls_bundle, tmp_path, capsys):
    """The issue's case: after `compare r0008 --against r0005` the first screen read "r0008 vs baseline r0005",
    delta 0.000, another candidate than the one exported."""
    from tuneproof.context import StudyContext
    from tuneproof.recipes.export import _comparison_of

    d = tmp_path / "study"
    shutil.copytree(cls_bundle["dir"], d)
    ids = cls_bundle["ids"]
    ev, base, comp, export, train = ids["eval"], ids["baseline"], ids["compare"], cls_bundle["export"], ids["train"]
    assert _cli("report", "--study", str(d)) == 0
    before = _verdict_line(d)
    assert before.endswith(
        f"; {ev} (the delivered candidate: export {export} of {train}) vs baseline {base} ({comp})**"
    )
    capsys.readouterr()
    assert _cli("compare", ev, "--against", ev, "--study", str(d)) == 0  # the candidate against a candidate
    out = " ".join(capsys.readouterr().out.split())
    assert f"{ev} vs candidate {ev} on 12 paired examples" in out
    assert f"note: {ev} (eval run) is not a baseline: this compares two candidates" in out
    ctx = StudyContext.open(d)
    cvc = ctx.registry.latest("compare").id
    assert json.loads((d / "runs" / cvc / "compare.json").read_text())["baseline_kind"] == "eval"
    assert _comparison_of(ctx, ev)[0].id == comp  # the bundle's claims stay the comparison with the baseline
    ctx.registry.close()
    assert _cli("report", "--study", str(d)) == 0
    assert _verdict_line(d) == before
    screen = _first_screen(d)
    assert (
        f"- comparison {cvc}: {ev} vs {ev} (eval run, not a baseline): candidates compared with each other, "
        "not a verdict of the hypothesis" in screen
    )
    md = (d / "dossier.md").read_text()
    assert f"**{ev} vs baseline {base} ({comp}); the verdict**" in md
    assert f"**{ev} vs candidate {ev} ({cvc}; eval run {ev} is not a baseline: not the verdict)**" in md
    verdict = md.split("## Verdict\n\n")[1]
    assert (
        f"({ev} (the delivered candidate: export {export} of {train}) vs baseline {base} ({comp});"
        in (verdict.splitlines()[0])
    )


# --------------------------------------------------------------------------- missing evidence
def _with_test_run(cls_study, tmp_path):
    """A copy of the study with a completed test run (its outputs and eval.json as `test` writes them) and its read
    of the test split logged."""
    from tuneproof.registry import Registry

    d = tmp_path / "study"
    shutil.copytree(cls_study["dir"], d)
    reg = Registry(d)
    with reg.run("test", parent=cls_study["ids"]["train"]) as run:
        (run.dir / "outputs.jsonl").write_text('{"id": "c200"}\n')
        run.write_json("eval.json", {"n": 1, "metrics": {"accuracy": 0.875}})
        run.update_summary(metrics={"accuracy": 0.875, "macro_f1": 0.861})
        reg.log_test_access(run.id, cls_study["ids"]["train"], {"metrics": {"accuracy": 0.875, "macro_f1": 0.861}})
    reg.close()
    return d, run.id


@pytest.mark.fault("missing evidence: a test run's folder deleted before report")
def test_a_deleted_test_run_folder_is_incomplete_and_its_metrics_are_not_shown(cls_study, tmp_path, capsys):
    d, rid = _with_test_run(cls_study, tmp_path)
    assert _cli("report", "--study", str(d)) == 0
    assert "accuracy 0.875" in (d / "dossier.md").read_text().split("## Test split access log")[1]
    shutil.rmtree(d / "runs" / rid)
    capsys.readouterr()
    assert _cli("report", "--study", str(d)) == 3
    out = " ".join(capsys.readouterr().out.split())
    assert f"error: INCOMPLETE: {d / 'runs' / rid}: test run {rid}'s folder is missing; what the run recorded is " in (
        out
    )
    assert f"restore the run folder runs/{rid} from a copy, or mark it invalid (`tuneproof invalidate {rid}" in out
    md = (d / "dossier.md").read_text()
    assert (
        _first_screen(d)
        .split("## Summary\n\n")[1]
        .startswith(f"**INCOMPLETE: test run {rid}'s folder is missing (runs/{rid})**")
    )
    log = md.split("## Test split access log")[1].split("\n## ")[0]
    assert f"INCOMPLETE: test run {rid}'s folder is missing (runs/{rid})" in log
    assert "0.875" not in log and "0.861" not in log  # never its numbers as if present
    runs = md.split("## Runs (all of them)")[1].split("\n## ")[0]
    assert "0.875" not in runs and f"INCOMPLETE: test run {rid}'s folder is missing" in runs
    # the run marked invalid (the user's acknowledgement): no longer evidence, the dossier is complete again
    assert _cli("invalidate", rid, "--why", "folder lost", "--study", str(d)) == 0
    assert _cli("report", "--study", str(d)) == 0


@pytest.mark.fault("missing evidence: an evidence file of a completed run deleted")
def test_any_completed_run_without_its_evidence_file_is_incomplete(cls_study, tmp_path, capsys):
    d, rid = _with_test_run(cls_study, tmp_path)
    (d / "runs" / rid / "eval.json").unlink()
    capsys.readouterr()
    assert _cli("report", "--study", str(d)) == 3
    out = " ".join(capsys.readouterr().out.split())
    assert f"error: INCOMPLETE: {d / 'runs' / rid / 'eval.json'}: test run {rid}'s evidence is missing;" in out
    assert f"**INCOMPLETE: test run {rid}'s evidence is missing (runs/{rid}/eval.json)**" in _first_screen(d)


@pytest.mark.fault("missing evidence: the evaluation behind an export deleted")
def test_export_refuses_a_train_run_whose_evaluation_folder_is_gone(cls_study, tmp_path, capsys):
    d = tmp_path / "study"
    shutil.copytree(cls_study["dir"], d)
    ev = cls_study["ids"]["eval"]
    shutil.rmtree(d / "runs" / ev)
    capsys.readouterr()
    assert _cli("export", cls_study["ids"]["train"], "--study", str(d), "--out", str(tmp_path / "b")) == 3
    out = " ".join(capsys.readouterr().out.split())
    assert f"error: {ev} is incomplete: {d / 'runs' / ev} has no eval.json, outputs.jsonl; evaluate again" in out
    assert not (tmp_path / "b").exists()
