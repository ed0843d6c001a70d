"""Nothing forged (docs/PROTOCOL.md step 2): per-example outputs are bound to their run by a sha256 recorded when
the run wrote them (compare, show, report and export refuse an edited file, naming it), and an
export bundle's claims (metrics, verdict, final loss) are recomputed by ``verify`` from the
outputs and log the bundle ships; a claim that does not match is named by its manifest field.
The manifest's own hash sits beside it in ``manifest.sha256``."""

from __future__ import annotations

import json
import shutil

import pytest

from tuneproof.cli import main
from tuneproof.deliver.bundle import write_manifest_sha
from tuneproof.deliver.bundle_verification import verify_bundle
from tuneproof.io import read_json, sha256_file
from tuneproof.registry import Registry


def _run(capsys, *argv) -> tuple[int, str]:
    with pytest.raises(SystemExit) as e:
        main(list(argv))
    return e.value.code, " ".join(capsys.readouterr().out.split())


def test_edited_baseline_outputs_are_refused_by_compare_show_report_and_export(cls_study, tmp_path, capsys):
    study = tmp_path / "s"
    shutil.copytree(cls_study["dir"], study, ignore=shutil.ignore_patterns("exports"))
    ids = cls_study["ids"]
    reg = Registry(study)
    base_rec, eval_rec = reg.get(ids["baseline"]), reg.get(ids["eval"])
    path = study / "runs" / base_rec.id / "outputs.jsonl"
    recorded = base_rec.summary["outputs_sha256"]
    assert recorded == sha256_file(path) and eval_rec.summary["outputs_sha256"] == sha256_file(
        study / "runs" / eval_rec.id / "outputs.jsonl"
    )
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    rows[0]["prediction"] = rows[0]["reference"]  # one baseline answer made right by hand
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    found = sha256_file(path)
    n_runs = len(reg.list())
    exported = {r.id for r in reg.list(kind="export")}  # the session's shared bundle may have exported already
    reg.close()
    msg = f"{path}: sha256 {found} differs from {recorded} recorded when run {base_rec.id} wrote it"

    code, out = _run(capsys, "compare", ids["eval"], "--against", ids["baseline"], "--study", str(study))
    assert code == 2 and msg in out
    assert len(Registry(study).list()) == n_runs  # refused before a compare run was made
    code, out = _run(capsys, "show", ids["eval"], "--regressed", "--against", ids["baseline"], "--study", str(study))
    assert code == 2 and msg in out
    code, out = _run(capsys, "report", "--study", str(study))
    assert code == 2 and msg in out and not (study / "dossier.md").exists()
    code, out = _run(capsys, "export", ids["train"], "--study", str(study), "--out", str(tmp_path / "bundle"))
    assert code == 2 and msg in out and not (tmp_path / "bundle").exists()
    exp = [r for r in Registry(study).list(kind="export") if r.id not in exported]
    assert [r.status for r in exp] == ["failed"]  # the export run is not left completed
    # the eval's own outputs are checked too (show without a baseline)
    ev = study / "runs" / eval_rec.id / "outputs.jsonl"
    ev.write_text(ev.read_text().replace('"prediction": "pos"', '"prediction": "x"', 1))
    code, out = _run(capsys, "show", ids["eval"], "--study", str(study))
    assert code == 2 and f"{ev}: sha256 " in out and f"recorded when run {eval_rec.id} wrote it" in out


@pytest.fixture()
def bundle(cls_bundle, tmp_path):
    dest = tmp_path / "bundle"
    shutil.copytree(cls_bundle["bundle"], dest)
    return dest


def _forge(bundle, edit, *, rehash: bool = True) -> dict:
    man = read_json(bundle / "manifest.json")
    edit(man)
    (bundle / "manifest.json").write_text(json.dumps(man, indent=2))
    if rehash:  # a careful forger updates the manifest's own hash too
        write_manifest_sha(bundle)
    return man


def _claims(report) -> list[str]:
    (check,) = [c for c in report["checks"] if c["name"] == "claims"]
    assert not check["passed"] and not report["passed"]
    assert report["checks"][-1]["name"] == "claims"  # nothing after it ran (the model was not loaded)
    return check["problems"]


def test_the_bundle_ships_the_evidence_and_its_claims_hold(cls_bundle):
    b = cls_bundle["bundle"]
    man = read_json(b / "manifest.json")
    assert (b / "manifest.sha256").read_text() == f"{sha256_file(b / 'manifest.json')}  manifest.json\n"
    assert man["files"]["results/outputs.jsonl"] == sha256_file(b / "results" / "outputs.jsonl")
    reg = Registry(cls_bundle["dir"])
    assert (
        sha256_file(b / "results" / "baseline_outputs.jsonl")
        == reg.get(cls_bundle["ids"]["baseline"]).summary["outputs_sha256"]
    )
    report = read_json(cls_bundle["dir"] / "runs" / cls_bundle["export"] / "verify.json")
    claims = [c for c in report["checks"] if c["name"] == "claims"][0]
    assert claims["passed"] and claims["problems"] == []


def test_edited_verdict_is_named(bundle, capsys):
    old = read_json(bundle / "manifest.json")["comparison"]["verdict"]
    new = "fail" if old != "fail" else "pass"
    _forge(bundle, lambda m: m["comparison"].__setitem__("verdict", new))
    problems = _claims(verify_bundle(bundle))
    assert problems == [f"comparison.verdict: manifest claims {new!r}, recomputed {old!r}"]
    code, out = _run(capsys, "verify", str(bundle))  # the command, in a fresh process
    assert (
        code == 3
        and "check 'claims' failed" in out
        and f"comparison.verdict: manifest claims {new!r}, recomputed {old!r}" in out
    )


def test_edited_metric_is_named(bundle):
    man = read_json(bundle / "manifest.json")
    acc = man["metrics"]["accuracy"]
    _forge(bundle, lambda m: m["metrics"].__setitem__("accuracy", acc + 0.25))
    assert _claims(verify_bundle(bundle)) == [f"metrics.accuracy: manifest claims {acc + 0.25!r}, recomputed {acc!r}"]
    # a claimed delta of the comparison too
    _forge(
        bundle,
        lambda m: (
            m["metrics"].__setitem__("accuracy", acc),
            m["comparison"]["metrics"]["accuracy"].__setitem__("delta", 0.99),
        ),
    )
    problems = _claims(verify_bundle(bundle))
    assert len(problems) == 1 and problems[0].startswith(
        "comparison.metrics.accuracy.delta: manifest claims 0.99, recomputed "
    )


def test_edited_final_loss_is_named(bundle):
    man = read_json(bundle / "manifest.json")
    loss = man["train"]["final_loss"]
    _forge(bundle, lambda m: m["train"].__setitem__("final_loss", loss / 2))
    problems = _claims(verify_bundle(bundle))
    assert problems[0].startswith(f"train.final_loss: manifest claims {loss / 2!r}, recomputed ")
    assert (
        f"train.final_loss: manifest claims {loss / 2!r}, recomputed {loss!r}" in problems
    )  # vs results/train_summary.json


def test_edited_manifest_without_its_hash_is_named_first(bundle):
    want = sha256_file(bundle / "manifest.json")
    _forge(bundle, lambda m: m["comparison"].__setitem__("verdict", "pass"), rehash=False)
    report = verify_bundle(bundle)
    assert [c["name"] for c in report["checks"]] == ["manifest"] and not report["passed"]
    assert report["checks"][0]["problems"] == [
        f"manifest.json: sha256 {sha256_file(bundle / 'manifest.json')} differs from {want} in manifest.sha256"
    ]


def test_candidate_trained_on_another_base_than_the_baseline_is_refused(cls_study, tmp_path, capsys):
    """docs/CASES.md C13's kind at compare time: the baseline's base.json and the candidate's train run's differ."""
    from tuneproof.io import write_json

    study = tmp_path / "s"
    shutil.copytree(cls_study["dir"], study, ignore=shutil.ignore_patterns("exports"))
    ids = cls_study["ids"]
    b = read_json(study / "runs" / ids["baseline"] / "base.json")
    t = read_json(study / "runs" / ids["train"] / "base.json")
    assert b["weights_sha256"] == t["weights_sha256"] and b["config_sha256"] == t["config_sha256"]
    assert b["weight_files"] == {"model.safetensors": sha256_file(cls_study["base"] / "model.safetensors")}
    other = "0" * 64
    write_json(study / "runs" / ids["baseline"] / "base.json", {**b, "weights_sha256": other})
    code, out = _run(capsys, "compare", ids["eval"], "--against", ids["baseline"], "--study", str(study))
    assert code == 2
    assert (
        f"baseline {ids['baseline']} evaluated another base model than the "
        f"one {ids['train']} (candidate {ids['eval']}) "
        f"was trained on: combined weights sha256 {other} vs {t['weights_sha256']}"
    ) in out


def test_edited_limits_are_named(bundle):
    man = read_json(bundle / "manifest.json")
    assert "limits" in man and man["limits"]["test_set"]
    _forge(
        bundle,
        lambda m: (
            m["limits"].__setitem__("broken", [])
            if m["limits"]["broken"]
            else m["limits"].__setitem__("broken", ["c999"])
        ),
    )
    problems = _claims(verify_bundle(bundle))
    assert len(problems) == 1 and problems[0].startswith("limits.broken: manifest claims ")


def test_an_invalidated_run_with_edited_outputs_no_longer_blocks_the_dossier(cls_study, tmp_path, capsys):
    """The way out the refusal names: invalidate the tampered run; the dossier is written and lists it."""
    study = tmp_path / "s"
    shutil.copytree(cls_study["dir"], study, ignore=shutil.ignore_patterns("exports"))
    ids = cls_study["ids"]
    path = study / "runs" / Registry(study).get(ids["eval"]).id / "outputs.jsonl"
    path.write_text(path.read_text().replace('"prediction": "pos"', '"prediction": "x"', 1))
    code, out = _run(capsys, "report", "--study", str(study))
    assert code == 2 and "tuneproof invalidate" in out
    assert _run(capsys, "invalidate", ids["eval"], "--why", "outputs edited by hand", "--study", str(study))[0] == 0
    code, out = _run(capsys, "report", "--study", str(study))
    assert code == 0, out
    assert "outputs edited by hand" in (study / "dossier.md").read_text()


def test_claims_recount_the_pairs_on_the_success_metrics_rule_as_compare_did(cls_bundle, monkeypatch):
    """compare counts fixed / broken on the success metric's per-example rule; verify
    must recount them on the same rule. It recounted them on exact match, so a real extraction
    quickstart (field F1 >= 0.5 per example) failed its own export: 'fixed: manifest claims 12,
    recomputed 3'."""
    import tuneproof.deliver.claims as claims_mod
    from tuneproof.deliver.claims import check_claims

    seen = []
    real = claims_mod.paired_compare

    def spy(*args, **kwargs):
        seen.append(kwargs.get("hypothesis"))
        return real(*args, **kwargs)

    monkeypatch.setattr(claims_mod, "paired_compare", spy)
    b = cls_bundle["bundle"]
    man = read_json(b / "manifest.json")
    assert check_claims(b, man) == []
    metric = man["scoring"]["comparison"]["view"]["success"]["metric"]
    assert metric == "macro_f1"
    assert seen and all(h is not None and h.success.metric == metric for h in seen)
