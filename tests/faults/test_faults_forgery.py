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


@pytest.fixture(scope="module")
def trained(tiny_base, tmp_path_factory):
    """r0003: 8 steps, checkpoints step-000006 and step-000008 kept, then recorded interrupted."""
    from tiny_study import losses_by_step, make_study
    from tuneproof.context import StudyContext
    from tuneproof.recipes.train import run_train

    study = make_study(tmp_path_factory.mktemp("forgery") / "s", tiny_base)
    ctx = StudyContext.open(study)
    try:
        run = run_train(ctx)
        ctx.registry.finish(run, "interrupted", "terminated (signal 15)")
    finally:
        ctx.registry.close()
    return {"dir": study, "run": run, "losses": losses_by_step(study / "runs" / run)}


def _rehash(ckpts, name):
    idx = json.loads((ckpts / "index.json").read_text())
    entry = idx["checkpoints"][name]
    entry["files"] = {f: hashlib.sha256((ckpts / name / f).read_bytes()).hexdigest() for f in entry["files"]}
    (ckpts / "index.json").write_text(json.dumps(idx))


def _forge_step(ckpts, step):
    state = json.loads((ckpts / "step-000008" / "state.json").read_text())
    state["step"] = step
    (ckpts / "step-000008" / "state.json").write_text(json.dumps(state))
    _rehash(ckpts, "step-000008")


def _rename(ckpts, step):  # the folder and its index entry renamed too, the step edited to match
    _forge_step(ckpts, step)
    new = f"step-{step:06d}"
    (ckpts / "step-000008").rename(ckpts / new)
    idx = json.loads((ckpts / "index.json").read_text())
    idx["checkpoints"][new] = {**idx["checkpoints"].pop("step-000008"), "step": step}
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
def test_an_edited_checkpoint_step_is_refused_and_fallback_completes_the_run(trained, tmp_path, capsys, forgery):
    from tiny_study import losses_by_step

    study = tmp_path / "s"
    shutil.copytree(trained["dir"], study)
    run = trained["run"]
    run_dir = study / "runs" / run
    ckpts = run_dir / "checkpoints"
    if forgery == "step":  # resume would retrain steps 7-8 from step 8's weights and "complete"
        _forge_step(ckpts, 6)
        folder, said = "step-000008", "step 6, but its folder name step-000008 says step 8"
    elif forgery == "renamed":
        folder = _rename(ckpts, 7)
        said = "step 7, but the metadata of tensors.safetensors says step 8"
    else:  # the run's own log disagrees with the checkpoint's last loss
        folder = "step-000008"
        _metrics_loss(run_dir, 8, 1.5)
        metrics = run_dir / "metrics.jsonl"
        said = f"loss {round(trained['losses'][8], 6)} at step 8, but the run's metrics ({metrics}) logged 1.5"
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
    assert rec.status == "completed" and rec.summary["steps"] == 8
    assert rec.summary["resumes"][-1]["from_step"] == 6 and folder in rec.summary["resumes"][-1]["skipped"][0]
    assert losses_by_step(run_dir) == trained["losses"]  # steps 7 and 8 retrained bit for bit
