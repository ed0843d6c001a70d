"""What is exported is what was evaluated (docs/PROTOCOL.md step 7): the sha256 of the saved adapter files is recorded
when ``train`` saves them and when ``eval`` loads them; ``eval`` refuses files that differ from what
training saved, ``export`` refuses files that differ from what the evaluation loaded (exit 3, one line
naming the file and both hashes), and a bundle whose own predictions differ from the evaluated ones
is not exported. Runs recorded before the hashes existed are exported with a warning."""

from __future__ import annotations

import json
import shutil

import pytest

from tuneproof.cli import main
from tuneproof.io import read_json, sha256_file
from tuneproof.models.identity import combined_weights_hash
from tuneproof.registry import Registry


def _run(capsys, *argv) -> tuple[int, str]:
    with pytest.raises(SystemExit) as e:
        main(list(argv))
    return e.value.code, " ".join(capsys.readouterr().out.split())


@pytest.fixture()
def study(evaluated, tmp_path):
    d = tmp_path / "s"
    shutil.copytree(evaluated["dir"], d)
    return d


def _recorded(study, run_id) -> dict:
    reg = Registry(study)
    try:
        return reg.get(run_id).summary.get("trained_weights")
    finally:
        reg.close()


def test_train_and_eval_record_the_sha256_of_the_adapter(evaluated):
    study, train, ev = evaluated["dir"], evaluated["train"], evaluated["eval"]
    adapter = study / "runs" / train / "adapter"
    files = {
        "adapter_config.json": sha256_file(adapter / "adapter_config.json"),
        "adapter_model.safetensors": sha256_file(adapter / "adapter_model.safetensors"),
    }
    want = {"folder": "adapter", "files": files, "sha256": combined_weights_hash(files)}
    assert _recorded(study, train) == want  # when training saved it
    assert _recorded(study, ev) == want  # when the evaluation loaded it


@pytest.mark.fault("tamper: adapter edited before export")
def test_a_deleted_lora_tensor_is_refused_by_export_and_eval_naming_the_file(evaluated, study, capsys):
    from safetensors.torch import load_file, save_file

    train, ev = evaluated["train"], evaluated["eval"]
    path = study / "runs" / train / "adapter" / "adapter_model.safetensors"
    before = sha256_file(path)
    tensors = load_file(str(path))
    gone = sorted(k for k in tensors if "lora_B" in k)[0]
    del tensors[gone]  # one LoRA tensor less: PEFT would load the rest and leave that layer untrained
    save_file(tensors, str(path), metadata={"format": "pt"})
    after = sha256_file(path)
    n_runs = len(Registry(study).list())

    code, out = _run(capsys, "export", train, "--study", str(study), "--verify-examples", "6")
    assert code == 3
    assert f"export refused: {path} has sha256 {after}, not the {before} eval run {ev} evaluated" in out
    assert not (study / "exports").exists()
    assert len(Registry(study).list()) == n_runs  # refused before an export run was made

    code, out = _run(capsys, "eval", train, "--study", str(study))
    assert code == 3
    assert f"eval refused: {path} has sha256 {after}, not the {before} train run {train} recorded" in out
    assert len(Registry(study).list()) == n_runs


@pytest.mark.fault("tamper: bundle predictions differ from the evaluated ones")
def test_a_bundle_that_predicts_otherwise_than_the_evaluation_is_not_exported(evaluated, study, capsys, monkeypatch):
    import tuneproof.recipes.export as export

    real = export.reproduce

    def drift(model, tokenizer, chosen, procedure, root=None):  # the bundle answers 4 of 6 stored examples otherwise
        out = real(model, tokenizer, chosen, procedure, root=root)
        for r in out[2:]:
            r["prediction"] = r["prediction"] + " x"
        return out

    monkeypatch.setattr(export, "reproduce", drift)
    code, out = _run(capsys, "export", evaluated["train"], "--study", str(study), "--verify-examples", "6")
    assert code == 3
    assert (
        f"the bundle's predictions differ from those of eval run {evaluated['eval']} on 4 of 6 stored examples" in out
    )
    assert "verified" not in out
    assert not (study / "exports").exists() or not any((study / "exports").iterdir())
    (exp,) = Registry(study).list(kind="export")
    assert exp.status == "failed"


def test_an_untouched_run_exports_with_the_evaluated_hash_and_an_older_run_with_a_warning(evaluated, study, capsys):
    train, ev = evaluated["train"], evaluated["eval"]
    code, out = _run(capsys, "export", train, "--study", str(study), "--verify-examples", "6")
    assert code == 0, out
    man = read_json(study / "exports" / train / "manifest.json")
    assert man["trained_weights"] == {**_recorded(study, ev), "checked_against": f"eval run {ev}"}
    assert man["reference"]["eval_predictions_agree"] == man["reference"]["n"] == 6

    # a run recorded before the hashes existed: exported, and the screen says it was not compared
    reg = Registry(study)
    for rid in (train, ev):
        summary = dict(reg.get(rid).summary)
        del summary["trained_weights"]
        reg._update(rid, summary=json.dumps(summary))
    reg.close()
    code, out = _run(capsys, "export", train, "--study", str(study), "--out", str(study / "old"))
    assert code == 0, out
    assert (
        f"warning: run {train} recorded no sha256 of its saved adapter (made before tuneproof recorded it): "
        "the exported files are not compared with the evaluated ones"
    ) in out
    assert read_json(study / "old" / "manifest.json")["trained_weights"]["checked_against"] is None


@pytest.mark.fault("environment: library versions differ from train's")
def test_library_versions_that_differ_from_train_are_warned_one_line_each_and_recorded(evaluated, study, capsys):
    from tuneproof.preflight.envinfo import package_version

    train = evaluated["train"]
    env_path = study / "runs" / train / "env.json"
    env = read_json(env_path)
    env["libraries"].update(transformers="4.0.0", peft="0.1.0")  # as if trained with other versions
    env_path.write_text(json.dumps(env))
    now = {"transformers": package_version("transformers"), "peft": package_version("peft")}
    drift = {
        "transformers": {"train": "4.0.0", "now": now["transformers"]},
        "peft": {"train": "0.1.0", "now": now["peft"]},
    }
    code, out = _run(capsys, "eval", train, "--study", str(study))
    assert code == 0, out
    assert f"warning: transformers {now['transformers']} here, 4.0.0 when {train} was trained: " in out
    assert f"warning: peft {now['peft']} here, 0.1.0 when {train} was trained: " in out
    assert "warning: torch" not in out and "warning: tokenizers" not in out
    reg = Registry(study)
    ev = reg.list(kind="eval")[-1]
    assert ev.summary["library_drift"] == {"train_run": train, "libraries": drift}
    code, out = _run(capsys, "export", train, "--study", str(study), "--verify-examples", "2")
    assert code == 0, out
    assert f"warning: transformers {now['transformers']} here, 4.0.0 when {train} was trained" in out
    assert Registry(study).list(kind="export")[-1].summary["library_drift"]["libraries"] == drift
