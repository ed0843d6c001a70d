"""``tuneproof resume`` refuses, with a clear message and exit code 2, and writes nothing, when the
run cannot be continued exactly: completed or invalid run, study file / run config / data / base
model changed since the checkpoint, checkpoint missing, damaged or incomplete, unknown run."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import yaml

from tiny_study import train_dir
from tuneproof.cli import main
from tuneproof.registry import Registry


def _files(study) -> dict[str, str]:
    """Every file of the study except the SQLite index (whose pages change when it is read) and its
    mirror runs/<id>/run.json (the status it records is checked by ``unchanged``)."""
    return {
        str(p.relative_to(study)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(study.rglob("*"))
        if p.is_file() and "tuneproof.sqlite" not in p.name and p.name != "run.json"
    }


def _resume(capsys, study, *extra) -> str:
    run_id = train_dir(study).name
    with pytest.raises(SystemExit) as exit_:
        main(["resume", run_id, "--study", str(study), *extra])
    out = capsys.readouterr().out
    assert exit_.value.code == 2, out
    return " ".join(out.split())


def _edit(path, old: str, new: str):
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    return lambda: path.write_text(text)


def test_resume_refuses_and_overwrites_nothing(interrupted, tiny_base, tmp_path, capsys):
    study = shutil.copytree(interrupted, tmp_path / "s")
    reg = Registry(study)
    (rec,) = reg.list(kind="train")
    run_dir = reg.runs_dir / rec.id
    ckpts = run_dir / "checkpoints"
    before = _files(study)

    def unchanged():
        r = Registry(study).get(rec.id)
        assert (r.status, r.reason) == ("interrupted", "terminated (signal 15) at step 5")
        assert _files(study) == before

    # the study file changed since the checkpoint (a run made from the study file)
    undo = _edit(study / "tuneproof.yaml", "learning_rate: 0.01", "learning_rate: 0.02")
    out = _resume(capsys, study)
    assert f"tuneproof.yaml changed since the checkpoint of {rec.id}: training.learning_rate: 0.01 -> 0.02" in out
    assert "revert the change, or train a variant" in out
    undo()
    unchanged()

    # the run's recorded config was edited
    undo = _edit(run_dir / "config.json", '"r": 4', '"r": 8')
    out = _resume(capsys, study)
    assert "config.json differs from the config of step-000005: method.r: 4 -> 8" in out
    undo()
    unchanged()

    # the data changed (same ids, one text edited)
    undo = _edit(study / "data" / "train.jsonl", '"text": "alpha ', '"text": "omega ')
    out = _resume(capsys, study)
    assert f"the data changed since the checkpoint of {rec.id}: fingerprint" in out
    undo()
    unchanged()

    # the base model's revision changed
    marker = tiny_base / ".tuneproof_revision"
    marker.write_text("another-revision\n")
    try:
        out = _resume(capsys, study)
    finally:
        marker.unlink()
    assert (
        f"the base model changed since the checkpoint of {rec.id}: revision sha256:" in out
        and "-> another-revision" in out
    )
    unchanged()

    # the latest checkpoint is damaged (truncated): its sha256 differs from the one recorded when
    # it was written; named with both hashes and the way out
    latest = ckpts / "step-000005"
    tensors, state, index = latest / "tensors.safetensors", latest / "state.json", ckpts / "index.json"
    good, good_state, good_index = tensors.read_bytes(), state.read_bytes(), index.read_bytes()
    recorded = json.loads(good_index)["checkpoints"]["step-000005"]["files"]["tensors.safetensors"]
    tensors.write_bytes(good[: len(good) // 2])
    out = _resume(capsys, study)
    found = hashlib.sha256(good[: len(good) // 2]).hexdigest()
    assert (
        f"step-000005/tensors.safetensors: sha256 {found} differs from {recorded} recorded when it was written" in out
    )
    assert "resume from an older one with --fallback" in out
    assert len(tensors.read_bytes()) == len(good) // 2  # not overwritten

    def reindex():  # a damaged file whose hash was recorded as is: the loader itself must refuse it
        idx = json.loads(good_index)
        idx["checkpoints"]["step-000005"]["files"] = {
            f: hashlib.sha256((latest / f).read_bytes()).hexdigest() for f in ("state.json", "tensors.safetensors")
        }
        index.write_text(json.dumps(idx))

    reindex()
    out = _resume(capsys, study)
    assert (
        "step-000005/tensors.safetensors: unreadable checkpoint" in out
        and "resume from an older one with --checkpoint" in out
    )
    tensors.write_bytes(good)
    index.write_bytes(good_index)
    unchanged()

    # a checkpoint missing a part
    ckpt = json.loads(good_state)
    del ckpt["optimizer"]
    state.write_text(json.dumps(ckpt))
    reindex()
    out = _resume(capsys, study)
    assert "step-000005: checkpoint has no 'optimizer'" in out
    state.write_bytes(good_state)
    index.write_bytes(good_index)
    unchanged()

    # a named checkpoint that does not exist; then no checkpoint at all
    out = _resume(capsys, study, "--checkpoint", "step-000003")
    assert "step-000003: checkpoint not found" in out and "step-000004, step-000005" in out
    shutil.move(ckpts, tmp_path / "moved")
    out = _resume(capsys, study)
    assert "no checkpoint (step-*) to resume from" in out
    shutil.move(tmp_path / "moved", ckpts)
    unchanged()

    # an unknown run
    with pytest.raises(SystemExit) as exit_:
        main(["resume", "r0042", "--study", str(study)])
    assert exit_.value.code == 2 and "run 'r0042' does not exist" in capsys.readouterr().out
    unchanged()

    # a completed run, then an invalid one
    reg.finish(rec.id, "completed")
    out = _resume(capsys, study)
    assert f"run {rec.id} is completed: there is nothing to resume" in out and f"train --from {rec.id}" in out
    reg.invalidate(rec.id, "wrong split used")
    out = _resume(capsys, study)
    assert f"run {rec.id} is invalid (wrong split used (was completed)): an invalid run is not continued" in out
    assert _files(study) == before


def test_variant_run_is_checked_against_its_own_config_not_the_study_file(interrupted, tmp_path, capsys):
    """A variant's config differs from the study file by design: only its recorded config counts."""
    study = shutil.copytree(interrupted, tmp_path / "s")
    run_dir = train_dir(study)
    (run_dir / "variant.json").write_text("{}")
    cfg = yaml.safe_load((study / "tuneproof.yaml").read_text())
    cfg["training"]["learning_rate"] = 0.03
    (study / "tuneproof.yaml").write_text(yaml.safe_dump(cfg))
    # passes the config check, then stops on the data check (proving the study file was not compared)
    (study / "data" / "train.jsonl").write_text(
        (study / "data" / "train.jsonl").read_text().replace('"text": "alpha ', '"text": "omega ', 1)
    )
    out = _resume(capsys, study)
    assert "the data changed since the checkpoint" in out
