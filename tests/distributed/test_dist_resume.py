"""Exact resume of an FSDP2 run on 2 gloo processes (docs/PROTOCOL.md step 7): stopped after step 3 of 6 with
its checkpoint, resumed under torchrun with the same world size, it gives per-step losses equal to
the uninterrupted distributed run (LoRA dropout 0.1: each rank gets back its own RNG states); a
resume with another world size is refused before anything is written."""

from __future__ import annotations

import pytest

from dist_helpers import SKIP, dist_study, run_cli
from tiny_study import adapter_tensors
from tuneproof.context import StudyContext
from tuneproof.recipes.torchrun import run_train_distributed
from tuneproof.registry import Registry
from tuneproof.training.resume_state import latest_checkpoint, load_checkpoint

pytestmark = pytest.mark.slow  # torchrun on 2 gloo processes: left out of the inner loop (`pytest -m "not slow"`)

STEPS = 6


def _study(folder, base):
    return dist_study(
        folder,
        base,
        strategy="fsdp",
        dropout=0.1,
        max_steps=STEPS,
        micro_batch_size=2,
        gradient_accumulation_steps=2,
        checkpoint_every=2,
    )


def test_fsdp_resume_same_world_size_is_exact_and_other_world_size_refused(tiny_base, tmp_path):
    ref = _study(tmp_path / "ref", tiny_base)
    proc = run_cli("train", "--study", str(ref), "--skip-preflight", "resume test", *SKIP, "--nproc-per-node", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (ref_rec,) = Registry(ref).list(kind="train")
    ref_dir = Registry(ref).runs_dir / ref_rec.id
    want = load_checkpoint(latest_checkpoint(ref_dir))["losses"]
    assert len(want) == STEPS

    study = _study(tmp_path / "s", tiny_base)
    ctx = StudyContext.open(study)
    with pytest.raises(KeyboardInterrupt, match=r"stop_after=3"):
        run_train_distributed(
            ctx, nproc=2, stop_after=3, order={"data_check_override": "test", "baseline_override": "test"}
        )
    (rec,) = Registry(study).list(kind="train")
    assert rec.status == "interrupted" and rec.reason == "interrupted (stop_after=3) at step 3"
    run_dir = Registry(study).runs_dir / rec.id
    ckpt = load_checkpoint(latest_checkpoint(run_dir))
    assert (ckpt["step"], ckpt["reason"], ckpt["data"]["world_size"], len(ckpt["rng_ranks"])) == (3, "interrupt", 2, 2)
    assert ckpt["losses"] == want[:3]

    one = run_cli("resume", rec.id, "--study", str(study))  # one process: refused, nothing written
    assert one.returncode == 2 and "was trained by 2 process(es); this resume asks for 1" in " ".join(
        one.stdout.split()
    )
    assert Registry(study).get(rec.id).status == "interrupted"

    two = run_cli("resume", rec.id, "--study", str(study), "--nproc-per-node", "2")
    assert two.returncode == 0, two.stdout + two.stderr
    assert Registry(study).get(rec.id).status == "completed"
    final = load_checkpoint(latest_checkpoint(run_dir))
    assert final["step"] == STEPS
    assert final["losses"] == want  # bit-identical floats, every step
    got, ref_adapter = adapter_tensors(run_dir), adapter_tensors(ref_dir)
    assert sorted(got) == sorted(ref_adapter) and len(got) == 8
    for name, tensor in ref_adapter.items():
        assert (got[name] == tensor).all(), name
