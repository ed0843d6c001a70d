"""The base model a run started from is bound by hashes (docs/CASES.md C13): the sha256 of its
weight files and config.json are recorded at train start (``runs/<id>/base.json`` and every
checkpoint); resume, eval and export refuse a base that changed since, naming both hashes, even
with ``model.revision`` pinned (the revision alone cannot see a changed local file). The hashes of
large files are cached by path, size, mtime and ctime; ``--rehash`` recomputes them."""

from __future__ import annotations

import hashlib
import shutil

import pytest
import yaml

from tiny_study import make_study, prepare_study
from tuneproof.cli import main
from tuneproof.io import read_json, sha256_file, sha256_file_cached
from tuneproof.models.identity import combined_weights_hash


def _run(capsys, *argv) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_:
        main(list(argv))
    return exit_.value.code, " ".join(capsys.readouterr().out.split())


def _perturb(base):
    from safetensors.torch import load_file, save_file

    path = base / "model.safetensors"
    good = path.read_bytes()
    tensors = load_file(str(path))
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 1e-3  # same shapes, other weights
    save_file(tensors, str(path), metadata={"format": "pt"})
    return lambda: path.write_bytes(good)


def test_changed_base_weights_or_config_are_refused_by_resume_eval_and_export(tiny_base, tmp_path, capsys):
    from tuneproof.context import StudyContext
    from tuneproof.recipes.train import TrainOptions, run_train

    base = shutil.copytree(tiny_base, tmp_path / "base")
    study = make_study(tmp_path / "s", base, prepare=False)
    cfg = yaml.safe_load((study / "tuneproof.yaml").read_text())
    cfg["model"]["revision"] = "pinned-rev-1"  # pinned: the revision check alone passes
    (study / "tuneproof.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    prepare_study(study)  # data check and baseline of the pinned base
    ctx = StudyContext.open(study)
    with pytest.raises(KeyboardInterrupt):
        run_train(ctx, TrainOptions(stop_after=3))
    (rec,) = ctx.registry.list(kind="train")
    ctx.registry.close()
    recorded = read_json(study / "runs" / rec.id / "base.json")
    w_before = sha256_file(base / "model.safetensors")
    assert recorded["weight_files"] == {"model.safetensors": w_before}
    assert recorded["config_sha256"] == sha256_file(base / "config.json") and recorded["revision"] == "pinned-rev-1"

    # weights changed between interrupt and resume
    restore = _perturb(base)
    w_after = sha256_file(base / "model.safetensors")
    code, out = _run(capsys, "resume", rec.id, "--study", str(study))
    assert code == 2
    assert f"the base model {base} changed since the checkpoint of {rec.id}" in out
    assert f"weight file model.safetensors: sha256 {w_before} -> {w_after}" in out
    assert (
        f"combined weights sha256 {combined_weights_hash({'model.safetensors': w_before})} -> "
        f"{combined_weights_hash({'model.safetensors': w_after})}"
    ) in out
    restore()

    # config.json changed (weights equal)
    cfg_path = base / "config.json"
    good_cfg = cfg_path.read_text()
    cfg_path.write_text(good_cfg.replace("{", '{\n  "tuneproof_test_note": 1,', 1))
    code, out = _run(capsys, "resume", rec.id, "--study", str(study))
    assert code == 2
    assert (f"config.json sha256 {hashlib.sha256(good_cfg.encode()).hexdigest()} -> {sha256_file(cfg_path)}") in out
    cfg_path.write_text(good_cfg)

    # the original base: the resume completes
    code, out = _run(capsys, "resume", rec.id, "--study", str(study))
    assert code == 0, out

    # a completed run: eval and export refuse the changed base (exit 3, a failed protocol check)
    restore = _perturb(base)
    code, out = _run(capsys, "eval", rec.id, "--study", str(study))
    assert code == 3
    assert (
        f"differs from the one run {rec.id} was trained on: weight file "
        f"model.safetensors: sha256 {w_before} -> {w_after}" in out
    )
    code, out = _run(capsys, "export", rec.id, "--study", str(study))
    assert code == 3 and f"weight file model.safetensors: sha256 {w_before} -> {w_after}" in out
    restore()
    assert not (study / "exports").exists() or not any((study / "exports").iterdir())


def test_hash_cache_reuses_by_path_size_mtime_and_rehash_recomputes(tmp_path, monkeypatch):
    import os

    import tuneproof.io as io

    monkeypatch.setenv("TUNEPROOF_HASH_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("TUNEPROOF_REHASH", raising=False)
    f = tmp_path / "w.safetensors"
    f.write_bytes(b"x" * 5000)
    calls = []
    real = io.sha256_file
    monkeypatch.setattr(io, "sha256_file", lambda p, *a: calls.append(p) or real(p, *a))
    want = hashlib.sha256(b"x" * 5000).hexdigest()
    assert sha256_file_cached(f, min_bytes=0) == want and len(calls) == 1
    assert sha256_file_cached(f, min_bytes=0) == want and len(calls) == 1  # from the cache: the file was not read
    assert len(list((tmp_path / "cache").glob("*.json"))) == 1
    # same size, other bytes, mtime set back: ctime still differs, so the file is read again
    st = f.stat()
    f.write_bytes(b"y" * 5000)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert sha256_file_cached(f, min_bytes=0) == hashlib.sha256(b"y" * 5000).hexdigest() and len(calls) == 2
    # --rehash: recomputed although cached
    monkeypatch.setenv("TUNEPROOF_REHASH", "1")
    assert sha256_file_cached(f, min_bytes=0) == hashlib.sha256(b"y" * 5000).hexdigest() and len(calls) == 3
    # a damaged cache entry is ignored
    monkeypatch.delenv("TUNEPROOF_REHASH")
    for e in (tmp_path / "cache").glob("*.json"):
        e.write_text("{not json")
    assert sha256_file_cached(f, min_bytes=0) == hashlib.sha256(b"y" * 5000).hexdigest() and len(calls) == 4


def test_rehash_flag_sets_the_switch(monkeypatch, tmp_path, capsys):
    import os

    monkeypatch.delenv("TUNEPROOF_REHASH", raising=False)
    code, _ = _run(capsys, "--rehash", "runs", "--study", str(tmp_path))
    assert code == 0 and os.environ.get("TUNEPROOF_REHASH") == "1"
    monkeypatch.delenv("TUNEPROOF_REHASH")
