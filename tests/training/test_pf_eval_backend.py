"""The preflight's ``backend`` check covers ``eval.backend``: a study whose vLLM evaluation cannot run
here (no vllm, no CUDA GPU) fails the preflight with the same reason ``baseline``/``eval``/``test``
give, instead of passing and letting ``train`` spend its hours before the first evaluation refuses."""

from __future__ import annotations

import yaml

from tiny_study import make_study
from tuneproof.evaluation import backends as B


def _backend_check(study):
    from tuneproof.context import StudyContext
    from tuneproof.preflight.backend import check_backend

    ctx = StudyContext.open(study)
    try:
        return check_backend(ctx)[0]
    finally:
        ctx.registry.close()


def _with_backend(tmp_path, tiny_base, backend: str):
    study = make_study(tmp_path / "s", tiny_base, prepare=False)
    raw = yaml.safe_load((study / "tuneproof.yaml").read_text())
    raw.setdefault("eval", {})["backend"] = backend
    (study / "tuneproof.yaml").write_text(yaml.safe_dump(raw))
    return study


def test_vllm_not_installed_fails_the_backend_check(tiny_base, tmp_path, monkeypatch):
    monkeypatch.setattr(B, "vllm_installed", lambda: False)
    check = _backend_check(_with_backend(tmp_path, tiny_base, "vllm"))
    assert check["passed"] is False and check["numbers"]["eval_backend"] == "vllm"
    assert (
        f"{tmp_path / 's' / 'tuneproof.yaml'}: eval.backend: vllm, but the "
        "package vllm is not installed in this environment "
        "-> on a CUDA machine: pip install -e '.[vllm]'"
    ) in check["message"]


def test_vllm_without_cuda_fails_the_backend_check(tiny_base, tmp_path, monkeypatch):
    monkeypatch.setattr(B, "vllm_installed", lambda: True)
    monkeypatch.setattr(B, "cuda_available", lambda: False)
    check = _backend_check(_with_backend(tmp_path, tiny_base, "vllm"))
    assert check["passed"] is False
    assert (
        "eval.backend: vllm needs a CUDA GPU; none is visible here (torch.cuda.is_available() is False)"
        in check["message"]
    )


def test_vllm_where_it_runs_and_transformers_pass(tiny_base, tmp_path, monkeypatch):
    monkeypatch.setattr(B, "vllm_installed", lambda: True)
    monkeypatch.setattr(B, "cuda_available", lambda: True)
    check = _backend_check(_with_backend(tmp_path, tiny_base, "vllm"))
    assert check["passed"] is True and check["message"].endswith("; eval.backend vllm can run here")
    check = _backend_check(_with_backend(tmp_path / "t", tiny_base, "transformers"))
    assert check["passed"] is True and check["numbers"]["eval_backend"] == "transformers"
    assert "eval.backend" not in check["message"]
