"""``tuneproof preflight --nproc-per-node 2`` (docs/PROTOCOL.md step 6): the distributed smoke on 2 gloo
processes: shares checked, DDP ranks agree on the trainable weights after 2 steps, FSDP2 step
gradients equal one process on the concatenated window, FSDP units reported, per-rank peak memory,
the torchrun command and the world layout recorded."""

from __future__ import annotations

import json

import pytest

from dist_helpers import dist_study, run_cli
from tuneproof.registry import Registry

pytestmark = pytest.mark.slow  # torchrun on 2 gloo processes: left out of the inner loop (`pytest -m "not slow"`)


def test_distributed_preflight_passes_with_its_numbers(tiny_base, tmp_path):
    study = dist_study(
        tmp_path / "s", tiny_base, strategy="fsdp", dropout=0.1, micro_batch_size=2, gradient_accumulation_steps=2
    )
    proc = run_cli("preflight", "--study", str(study), "--nproc-per-node", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (rec,) = Registry(study).list(kind="preflight")
    assert rec.status == "completed" and rec.summary["passed"] and rec.summary["distributed"]
    assert "platform_key" not in rec.summary  # never taken for the single-process preflight that `train` requires
    run_dir = Registry(study).runs_dir / rec.id
    checks = {c["name"]: c for c in json.loads((run_dir / "distributed_preflight.json").read_text())["checks"]}
    assert sorted(checks) == ["ddp weights agree", "fsdp units", "fsdp2 gradients", "per-rank peak memory", "shares"]
    assert all(c["passed"] for c in checks.values())
    assert checks["shares"]["numbers"]["per_rank"] == [12, 12] and checks["shares"]["numbers"]["covered"] == 24
    assert len(checks["ddp weights agree"]["numbers"]["losses"]) == 2
    g = checks["fsdp2 gradients"]["numbers"]
    assert g["examples"] == 8 and g["tensors"] == 8 and g["relative"] <= 1e-5
    assert checks["fsdp units"]["numbers"] == {
        "units": 3,
        "mixed": 2,
    }  # 2 decoder blocks mix frozen + LoRA; remedy: FSDP2
    mem = checks["per-rank peak memory"]["numbers"]
    assert len(mem["bytes"]) == 2 and all(b > 2**20 for b in mem["bytes"])
    launch = json.loads((run_dir / "launch.json").read_text())
    assert launch["command"][1:7] == ["-m", "torch.distributed.run", "--nproc-per-node", "2", "--nnodes", "1"]
    assert "--standalone" in launch["command"] and launch["layout"]["world_size"] == 2
    assert (run_dir / "rank-1.log").is_file()
