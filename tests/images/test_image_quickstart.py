"""`tuneproof quickstart --task image-classification --fast`: real digits from scikit-learn, the
seeded ViT from a config, every protocol step including the preflight and the verified export."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_image_quickstart_fast_runs_every_step(tmp_path):
    from tuneproof.recipes.quickstart import run_quickstart
    from tuneproof.registry import Registry

    out = run_quickstart(tmp_path / "qs", task="image-classification", fast=True)
    assert list(out["runs"]) == ["data-check", "baseline", "preflight", "train", "eval", "compare", "export", "report"]
    reg = Registry(tmp_path / "qs")
    assert all(
        reg.get(out["runs"][k]).status == "completed" for k in ("data-check", "baseline", "preflight", "train", "eval")
    )
    counts = {p.name: len(list(p.glob("*.png"))) for p in (tmp_path / "qs" / "images").iterdir() if p.is_dir()}
    assert sum(counts.values()) == 1797 and sorted(counts) == [str(d) for d in range(10)]
    assert reg.get(out["runs"]["train"]).summary["budget"]["total_steps"] == 20
    man = json.loads((tmp_path / "qs" / "exports" / out["runs"]["train"] / "manifest.json").read_text())
    assert man["procedure"]["model_kind"] == "image-classification" and man["labels"] == [str(d) for d in range(10)]
    assert (tmp_path / "qs" / "dossier.md").is_file()


@pytest.mark.slow
def test_the_quickstart_run_again_after_ctrl_c_resumes_its_study(tmp_path, monkeypatch, capsys):
    """After Ctrl-C, "run the command again" was refused ("already holds a study"): it resumes the same
    study, keeping the steps that completed and running the rest; another study in the folder is refused."""
    import tuneproof.recipes.quickstart as qs
    from tuneproof.errors import TuneproofError
    from tuneproof.registry import Registry

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(qs, "run_eval", ctrl_c)  # Ctrl-C as the eval starts
        with pytest.raises(KeyboardInterrupt):
            qs.run_quickstart(tmp_path / "qs", task="image-classification", fast=True)
    first = {r.kind: r.id for r in Registry(tmp_path / "qs").list()}
    assert set(first) == {"data-check", "baseline", "preflight", "train"}
    capsys.readouterr()
    out = qs.run_quickstart(tmp_path / "qs", task="image-classification", fast=True)
    screen = " ".join(capsys.readouterr().out.split())
    assert "tuneproof quickstart --task image-classification resumed in" in screen
    for kind in ("data-check", "baseline", "preflight", "train"):
        assert out["runs"][kind] == first[kind] and f"{kind}: {first[kind]} completed before, kept" in screen
    reg = Registry(tmp_path / "qs")
    assert [r.kind for r in reg.list()].count("train") == 1
    assert reg.get(out["runs"]["eval"]).parent == first["train"]
    assert all(reg.get(out["runs"][k]).status == "completed" for k in ("eval", "compare", "export"))
    # other options are another study: refused, naming the file, nothing run
    with pytest.raises(TuneproofError, match="tuneproof.yaml is not the study this quickstart writes"):
        qs.run_quickstart(tmp_path / "qs", task="image-classification", fast=False)


def test_an_overloaded_machine_is_said():
    from tuneproof.procs import overload_line

    assert overload_line(load=10.24, cores=2) == (
        "this machine is overloaded: load average 10.2 over the last minute on 2 cores; "
        "every step takes longer than on an idle machine"
    )
    assert overload_line(load=1.5, cores=2) is None and overload_line(load=2.0, cores=2) is None
