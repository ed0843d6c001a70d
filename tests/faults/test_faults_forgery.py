"""Forgery the hashes do not cover (docs/CASES.md, faults of the input): a checkpoint's ``state.json`` whose step was
edited, with ``index.json`` rehashed to match, is refused by ``resume`` in one line naming what says otherwise (the
folder name, the safetensors metadata, the losses, the scheduler, the optimizer, the data position, the run's
metrics); ``--fallback`` continues from the older checkpoint and completes the run exactly. ``run.json`` edits: see
docs/CONTRACTS.md (what the run record authenticates)."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from tuneproof.cli import main
from tuneproof.registry import Registry

pytestmark = pytest.mark.filterwarnings("ignore")


def cli(args, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(args)
    out = capsys.readouterr()
    return exit_.value.code, out.out + out.err


def _rehash(ckpts, name):
    idx = json.loads((ckpts / "index.json").read_text())
    entry = idx["checkpoints"][name]
    entry["files"] = {f: hashlib.sha256((ckpts / name / f).read_bytes()).hexdigest() for f in entry["files"]}
    (ckpts / "index.json").write_text(json.dumps(idx))


def _forge_step(ckpts, step):
    state = json.loads((ckpts / "step-000004" / "state.json").read_text())
    state["step"] = step
    (ckpts / "step-000004" / "state.json").write_text(json.dumps(state))
    _rehash(ckpts, "step-000004")


def _rename(ckpts, step):  # the folder and its index entry renamed too, the step edited to match
    _forge_step(ckpts, step)
    new = f"step-{step:06d}"
    (ckpts / "step-000004").rename(ckpts / new)
    idx = json.loads((ckpts / "index.json").read_text())
    idx["checkpoints"][new] = {**idx["checkpoints"].pop("step-000004"), "step": step}
    (ckpts / "index.json").write_text(json.dumps(idx))
    return new


def _metrics_loss(run_dir, step, loss):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        if r.get("step") == step and "loss" in r:
            r["loss"] = loss
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.fault("forgery: a checkpoint's step edited, its hashes recomputed")
@pytest.mark.parametrize("forgery", ["step", "renamed", "metrics"])
def test_an_edited_checkpoint_step_is_refused_and_fallback_completes_the_run(evaluated, tmp_path, capsys, forgery):
    """The evaluated study's train run (4 steps, checkpoints step-000002 and step-000004), recorded interrupted."""
    from tiny_study import losses_by_step

    study = tmp_path / "s"
    shutil.copytree(evaluated["dir"], study)
    run = evaluated["train"]
    run_dir = study / "runs" / run
    ckpts = run_dir / "checkpoints"
    losses = losses_by_step(run_dir)
    Registry(study).finish(run, "interrupted", "terminated (signal 15)")
    if forgery == "step":  # resume would retrain steps 3-4 from step 4's weights and "complete"
        _forge_step(ckpts, 2)
        folder, said = "step-000004", "step 2, but its folder name step-000004 says step 4"
    elif forgery == "renamed":
        folder = _rename(ckpts, 3)
        said = "step 3, but the metadata of tensors.safetensors says step 4"
    else:  # the run's own log disagrees with the checkpoint's last loss
        folder = "step-000004"
        _metrics_loss(run_dir, 4, 1.5)
        metrics = run_dir / "metrics.jsonl"
        said = f"loss {round(losses[4], 6)} at step 4, but the run's metrics ({metrics}) logged 1.5"
    code, out = cli(["resume", run, "--study", str(study)], capsys)
    assert code == 2, out
    assert out.startswith(f"error: {ckpts / folder / 'state.json'}: {said}\n"), out
    assert "--fallback" in out and "Traceback" not in out and len(out.strip().splitlines()) == 2
    assert Registry(study).get(run).status == "interrupted"  # nothing continued

    if forgery == "metrics":
        return
    code, out = cli(["resume", run, "--study", str(study), "--fallback"], capsys)
    assert code == 0, out
    rec = Registry(study).get(run)
    assert rec.status == "completed" and rec.summary["steps"] == 4
    assert rec.summary["resumes"][-1]["from_step"] == 2 and folder in rec.summary["resumes"][-1]["skipped"][0]
    assert losses_by_step(run_dir) == losses  # steps 3 and 4 retrained bit for bit


def _edit_record(run_dir, **fields):
    path = run_dir / "run.json"
    rec = json.loads(path.read_text())
    before = {k: rec[k] for k in fields}
    rec.update(fields)
    path.write_text(json.dumps(rec, indent=2))
    return path, before


@pytest.mark.fault("forgery: run.json edited by hand")
def test_an_edited_run_json_is_refused_where_it_is_relied_on_and_listed_invalid_on_rebuild(evaluated, tmp_path, capsys):
    study = tmp_path / "s"
    shutil.copytree(evaluated["dir"], study)
    train, ev = evaluated["train"], evaluated["eval"]
    path, before = _edit_record(study / "runs" / ev, created=1.0)  # a timestamp moved back
    code, out = cli(["compare", ev, "--study", str(study)], capsys)
    assert code == 3, out
    out = " ".join(out.split())
    assert (
        f"error: {path}: edited after it was written (created 1.0 in the file, {before['created']} in the index)" in out
    )
    assert "Traceback" not in out and Registry(study).list(kind="compare") == []

    tpath, _ = _edit_record(study / "runs" / train, ended=None)
    code, out = cli(["export", train, "--study", str(study), "--out", str(tmp_path / "b")], capsys)
    assert code == 3 and f"error: {tpath}: edited after it was written (ended null in the file, " in " ".join(
        out.split()
    )
    assert not (tmp_path / "b").exists() and Registry(study).list(kind="export") == []

    # the index lost: rebuilt from the folders, the edited records are kept but listed invalid with the reason
    stored = json.loads(path.read_text())["record_sha256"]
    (study / "tuneproof.sqlite").unlink()
    reg = Registry(study)
    rec = reg.get(ev)
    assert (rec.status, rec.reason) == (
        "invalid",
        f"run.json edited after it was written (record_sha256 {stored[:16]} does not match its fields); "
        "recorded as completed",
    )
    assert reg.get(train).status == "invalid" and reg.get("r0002").status == "completed"  # the baseline untouched


# a whole run.json that disagrees with the index is named, not rewritten from it (issue 33 item 14):
# tests/registry/test_record_hash.py
