"""``tuneproof resume`` in a copy of a study whose original folder was moved away: the copy's own
checkpoint is loaded and the continued run is written into the copy (tuneproof.registry: paths a run
records inside its study are read in the folder as it is now)."""

from __future__ import annotations

import shutil

from tiny_study import cli
from tuneproof.registry import Registry


def test_resume_in_a_copied_study_uses_the_copys_checkpoint_and_folder(interrupted, tmp_path):
    a = shutil.copytree(interrupted, tmp_path / "a" / "s")
    b = shutil.copytree(a, tmp_path / "b" / "s")
    a.rename(a.with_name("gone"))
    gone = a.with_name("gone")
    (rec,) = Registry(b).list(kind="train")
    proc = cli("resume", rec.id, "--study", str(b))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = " ".join(proc.stdout.split())
    assert f"resume {rec.id} (interrupted: terminated (signal 15) at step 5) from step-000005: step 5 of 8" in out
    assert str(a) not in proc.stdout + proc.stderr
    done = Registry(b).get(rec.id)
    assert (done.status, done.summary["resumes"][0]["checkpoint"]) == ("completed", "step-000005")
    assert (b / "runs" / rec.id / "adapter" / "adapter_model.safetensors").is_file()
    assert not (gone / "runs" / rec.id / "adapter").exists()  # nothing written into the other folder
    assert Registry(gone).get(rec.id).status == "interrupted"
