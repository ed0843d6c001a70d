"""Checkpoints load without running code (docs/CASES.md C21) and are verified against the sha256 recorded
when they were written; ``resume --fallback`` continues from the newest valid older one."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import numpy as np
import pytest
import torch

from tiny_study import train_dir
from tuneproof.cli import main
from tuneproof.registry import Registry
from tuneproof.training.resume_state import (
    INDEX,
    decode,
    encode,
    list_checkpoints,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)


class Payload:
    """Unpickling this runs ``touch MARKER`` (what a planted ``step-*.pt`` can do)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _resume(capsys, study, run_id, *extra) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_:
        main(["resume", run_id, "--study", str(study), *extra])
    return exit_.value.code, " ".join(capsys.readouterr().out.split())


def test_c21_planted_pickle_checkpoint_is_refused_and_runs_nothing(interrupted, tmp_path, capsys):
    study = shutil.copytree(interrupted, tmp_path / "s")
    run_dir = train_dir(study)
    marker = tmp_path / "PAYLOAD_RAN"
    planted = run_dir / "checkpoints" / "step-999999.pt"
    torch.save(Payload(marker), planted)
    # the file is a real threat: the loader of format 1 (torch.load, weights_only=False) runs it
    probe = tmp_path / "probe.pt"
    torch.save(Payload(tmp_path / "PROBE_RAN"), probe)
    torch.load(probe, weights_only=False)
    assert (tmp_path / "PROBE_RAN").exists()

    # planted in the run's checkpoints/: it is the latest by step, refused without being loaded
    code, out = _resume(capsys, study, run_dir.name)
    assert code == 2
    assert f"{planted}: refused, a zip archive as written by torch.save (holds a pickle)" in out
    assert "unpickling a file can run code; nothing was loaded" in out
    assert not marker.exists()
    # passed with --checkpoint from elsewhere: same
    elsewhere = tmp_path / "shared" / "step-999999.pt"
    elsewhere.parent.mkdir()
    shutil.copy(planted, elsewhere)
    code, out = _resume(capsys, study, run_dir.name, "--checkpoint", str(elsewhere))
    assert code == 2 and f"{elsewhere}: refused" in out and not marker.exists()
    rec = Registry(study).get(run_dir.name)
    assert (rec.status, rec.reason) == ("interrupted", "terminated (signal 15) at step 5")  # nothing written
    # --fallback skips it (named) and continues from the newest valid checkpoint, step 5
    code, out = _resume(capsys, study, run_dir.name, "--fallback")
    assert code == 0, out
    assert "skipped step-999999.pt: " in out and not marker.exists()
    rec = Registry(study).get(run_dir.name)
    assert rec.status == "completed" and rec.summary["resumes"][-1]["from_step"] == 5
    assert rec.summary["resumes"][-1]["skipped"][0].startswith("step-999999.pt: ")


def test_flipped_byte_is_refused_naming_both_hashes_and_fallback_resumes_from_the_older(interrupted, tmp_path, capsys):
    study = shutil.copytree(interrupted, tmp_path / "s")
    run_dir = train_dir(study)
    ckpts = run_dir / "checkpoints"
    assert [p.name for p in list_checkpoints(run_dir)] == ["step-000004", "step-000005"]
    index = json.loads((ckpts / INDEX).read_text())
    losses5 = load_checkpoint(ckpts / "step-000005")["losses"]
    target = ckpts / "step-000005" / "tensors.safetensors"
    data = bytearray(target.read_bytes())
    data[len(data) - 7] ^= 0x01  # one bit of one weight
    target.write_bytes(bytes(data))
    recorded = index["checkpoints"]["step-000005"]["files"]["tensors.safetensors"]
    found = hashlib.sha256(bytes(data)).hexdigest()
    assert recorded != found

    code, out = _resume(capsys, study, run_dir.name)
    assert code == 2
    assert f"{target}: sha256 {found} differs from {recorded} recorded when it was written" in out
    assert "--fallback" in out
    assert Registry(study).get(run_dir.name).status == "interrupted"

    code, out = _resume(capsys, study, run_dir.name, "--fallback")
    assert code == 0, out
    assert f"skipped step-000005: {target}: sha256 {found} differs" in out
    rec = Registry(study).get(run_dir.name)
    assert rec.status == "completed" and rec.summary["resumes"][-1]["from_step"] == 4 and rec.summary["steps"] == 8
    final = load_checkpoint(list_checkpoints(run_dir)[-1])
    assert final["step"] == 8 and final["losses"][:5] == losses5  # step 5 retrained bit for bit


def test_checkpoint_round_trip_is_exact_and_indexed(tmp_path):
    """Every value type a checkpoint holds comes back equal (floats bit for bit), from a
    safetensors file and a JSON file, and the index holds both files' sha256."""
    torch.manual_seed(1)
    np.random.seed(2)
    np.random.rand(3)
    p = torch.nn.Parameter(torch.randn(3, 2))
    opt = torch.optim.AdamW([p], lr=0.1)
    p.grad = torch.randn(3, 2)
    opt.step()
    payload = {
        "step": 1,
        "total_steps": 2,
        "trainable": {"w": p.detach().clone()},
        "optimizer": opt.state_dict(),
        "scheduler": {"last_epoch": 1, "_last_lr": [0.1 / 3]},
        "rng": rng_state(),
        "data": {"n_examples": 3},
        "losses": [0.1 + 0.2],  # one per step (load_checkpoint cross-checks the step)
        "floats": [0.1 + 0.2, 1e-300, float("inf")],
        "config": {"a": [1, "x", None, True]},
    }
    folder = save_checkpoint(tmp_path / "checkpoints", 1, payload)
    assert sorted(f.name for f in folder.iterdir()) == ["state.json", "tensors.safetensors"]
    assert not [f for f in (tmp_path / "checkpoints").iterdir() if f.name.startswith(".")]
    idx = json.loads((tmp_path / "checkpoints" / INDEX).read_text())
    assert idx["checkpoints"]["step-000001"]["files"] == {
        f: hashlib.sha256((folder / f).read_bytes()).hexdigest() for f in ("state.json", "tensors.safetensors")
    }
    back = load_checkpoint(folder)
    cuda_like = [torch.get_rng_state(), torch.arange(16, dtype=torch.uint8)]  # shape of get_rng_state_all() on 2 GPUs
    tensors: dict = {}
    again = decode(json.loads(json.dumps(encode({"cuda": cuda_like}, tensors))), tensors, tmp_path)
    assert sorted(tensors) == ["cuda/0", "cuda/1"] and all(torch.equal(a, b) for a, b in zip(again["cuda"], cuda_like))
    assert back["floats"] == [0.30000000000000004, 1e-300, float("inf")] and back["config"] == payload["config"]
    assert back["losses"] == [0.30000000000000004]
    assert torch.equal(back["trainable"]["w"], payload["trainable"]["w"])
    s0, s1 = payload["optimizer"]["state"][0], back["optimizer"]["state"][0]  # int parameter keys kept
    assert all(torch.equal(s0[k], s1[k]) for k in ("step", "exp_avg", "exp_avg_sq"))
    assert back["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.999)
    assert back["scheduler"]["_last_lr"] == [0.1 / 3]
    expected = (torch.rand(4), np.random.rand(4), __import__("random").random())
    set_rng_state(back["rng"])  # restores the states saved before those draws
    assert torch.equal(torch.rand(4), expected[0]) and np.array_equal(np.random.rand(4), expected[1])
    assert __import__("random").random() == expected[2]
    # a second save of the same step replaces it; only the 2 newest are kept
    for step in (1, 2, 3):
        save_checkpoint(tmp_path / "checkpoints", step, payload)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000002", "step-000003"]
    assert sorted(json.loads((tmp_path / "checkpoints" / INDEX).read_text())["checkpoints"]) == [
        "step-000002",
        "step-000003",
    ]


def test_encode_refuses_objects_that_would_need_code(tmp_path):
    with pytest.raises(TypeError, match="checkpoint value at '/x' is a Payload"):
        encode({"x": Payload(tmp_path / "m")}, {})
    # markers are data: a dict that looks like a marker is stored as items, not interpreted
    tensors: dict = {}
    tricky = {"__tensor__": "nope"}
    assert decode(json.loads(json.dumps(encode({"d": tricky}, tensors))), tensors, tmp_path) == {"d": tricky}


def test_a_key_added_since_the_checkpoint_with_its_default_is_no_change(interrupted, tmp_path, capsys):
    """A checkpoint and config.json written before a study key existed (here model.trust_remote_code,
    default false) resume: both configs are compared with defaults filled."""
    study = shutil.copytree(interrupted, tmp_path / "s")
    run_dir = train_dir(study)
    ckpts = run_dir / "checkpoints"
    state = ckpts / "step-000005" / "state.json"
    ckpt = json.loads(state.read_text())
    del ckpt["config"]["model"]["trust_remote_code"]
    state.write_text(json.dumps(ckpt))
    idx = json.loads((ckpts / INDEX).read_text())
    idx["checkpoints"]["step-000005"]["files"]["state.json"] = hashlib.sha256(state.read_bytes()).hexdigest()
    (ckpts / INDEX).write_text(json.dumps(idx))
    cfg = json.loads((run_dir / "config.json").read_text())
    del cfg["model"]["trust_remote_code"]
    (run_dir / "config.json").write_text(json.dumps(cfg))
    code, out = _resume(capsys, study, run_dir.name)
    assert code == 0, out
    assert Registry(study).get(run_dir.name).status == "completed"
