"""Export of a generative (causal LM) LoRA run: an invalid run is refused unless --force, a forced
export is recorded everywhere, greedy predictions are reproduced exactly in a fresh process, and a
base whose weights changed since training is refused at export (docs/CASES.md C13)."""

from __future__ import annotations

import pytest

from deliver_tiny import build_llama_base, make_ext_study
from tuneproof.cli import main
from tuneproof.context import StudyContext
from tuneproof.io import read_json, read_jsonl, sha256_file
from tuneproof.registry import Registry

pytestmark = (
    pytest.mark.slow
)  # an export verified in a fresh process, and the CLI in another: left out of the inner loop (`pytest -m "not slow"`)


def _exit_code(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as e:
        main(argv)
    return e.value.code


def test_forced_export_of_an_invalid_generative_run(tmp_path, capsys):
    from tuneproof.recipes.train import run_train

    base = build_llama_base(tmp_path / "llama")
    study = make_ext_study(tmp_path / "study", base)
    ctx = StudyContext.open(study)
    train_id = run_train(ctx)
    ctx.registry.invalidate(train_id, "wrong split used")
    ctx.registry.close()

    assert _exit_code(["export", train_id, "--study", str(study)]) == 2
    out = capsys.readouterr().out
    assert f"train run {train_id} is invalid (wrong split used (was completed))" in out and "--force" in out
    assert not (study / "exports").exists() and [r.kind for r in Registry(study).list()] == [
        "data-check",
        "baseline",
        "train",
    ]

    assert _exit_code(["export", train_id, "--study", str(study), "--force", "--verify-examples", "3"]) == 0
    bundle = study / "exports" / train_id
    man = read_json(bundle / "manifest.json")
    assert man["forced"] == {"status": "invalid", "reason": "wrong split used (was completed)"}
    assert "Exported with --force: the train run is invalid" in (bundle / "README.md").read_text()
    exp = Registry(study).latest("export")
    assert exp.parent == train_id and exp.summary["forced"]["status"] == "invalid" and exp.summary["verified"] is True
    assert f"forced export of the invalid run {train_id}" in (study / "runs" / exp.id / "log.txt").read_text()
    assert (
        "exported with --force although the run is invalid (wrong split used (was completed))" in man["limits"]["notes"]
    )
    assert man["eval_run"] is None and man["comparison"] is None  # no eval: examples come from the eval split

    stored = read_jsonl(bundle / "verify" / "examples.jsonl")
    assert len(stored) == 3 and all(s["prompt"].startswith("<|user|> Extract JSON ") for s in stored)
    assert all(len(s["next_token"]) == 5 and isinstance(s["prediction"], str) for s in stored)
    report = read_json(study / "runs" / exp.id / "verify.json")
    assert (
        report["passed"]
        and report["predictions"]["identical"] == 3
        and report["predictions"]["max_abs_logit_diff"] == 0.0
    )
    assert [e["prediction"] for e in report["examples"]] == [s["prediction"] for s in stored]
    meta = (bundle / "README.md").read_text().split("---\n")[1]
    assert "library_name: peft" in meta and "pipeline_tag: text-generation" in meta

    # the CLI command, in a fresh process, on the delivered bundle
    assert _exit_code(["verify", str(bundle)]) == 0
    assert "verified" in capsys.readouterr().out

    # docs/CASES.md C13 at export time: the base changed since training -> refused, naming both hashes
    from safetensors.torch import load_file, save_file

    old_sha = read_json(study / "runs" / train_id / "summary.json")["base"]["weight_sha256"]["model.safetensors"]
    t = load_file(str(base / "model.safetensors"))
    k = sorted(t)[-1]
    t[k] = t[k] * 1.01
    save_file(t, str(base / "model.safetensors"), metadata={"format": "pt"})
    assert _exit_code(["export", train_id, "--study", str(study), "--force", "--out", str(tmp_path / "again")]) == 3
    out = capsys.readouterr().out.replace("\n", "")
    assert f"weight file model.safetensors: sha256 {old_sha} -> {sha256_file(base / 'model.safetensors')}" in out
    assert not (tmp_path / "again").exists()
