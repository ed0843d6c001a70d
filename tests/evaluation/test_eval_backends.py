"""Issue 15 item 5: generation backends behind one interface, and the check that guards a vLLM
evaluation (agreement with transformers on a seeded sample; a served adapter that has no effect).

vLLM needs CUDA, so the check is exercised with REAL generations on the CPU: the transformers
backend on a tiny random Llama with a LoRA adapter that changes its answers, against (a) a
"vLLM-like" backend that serves the same model and adapter correctly, (b) one that drops the
adapter, (c) one that disagrees on some answers; and ``VllmBackend`` itself against a stand-in
for vLLM's offline API backed by transformers (``fake_vllm.py``), up to ``tuneproof eval``.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))  # tiny_study

import fake_vllm  # noqa: E402
from tinymodels import make_llama, make_tokenizer  # noqa: E402
from tuneproof.data.preprocess import TextPipeline  # noqa: E402
from tuneproof.errors import CheckFailed, TuneproofError  # noqa: E402
from tuneproof.evaluation import backends as B  # noqa: E402
from tuneproof.modalities.image import IMAGE_CLASSIFIER  # noqa: E402
from tuneproof.modalities.text import CAUSAL_LM, SEQUENCE_CLASSIFIER  # noqa: E402
from tuneproof.study import Eval, Prompt  # noqa: E402

CPU = torch.device("cpu")
WORDS = "play add book rate what is the weather in Rome tomorrow a table for two Paris tonight song playlist".split()
TEXTS = [" ".join(WORDS[(i * 5 + j * 3) % len(WORDS)] for j in range(2 + i % 6)) for i in range(16)]
EVAL = Eval(max_new_tokens=6, batch_size=4)
IDS = [f"ex{i:02d}" for i in range(16)]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer(chat_template=None)


@pytest.fixture(scope="module")
def prompts(tok):
    pipe = TextPipeline(tok, Prompt(system=None, template="Q: {text}"), 128)
    return [pipe.prompt_text(t) for t in TEXTS]


@pytest.fixture(scope="module")
def adapter(tok, tmp_path_factory) -> Path:
    """A LoRA adapter (r 4 on q/v, random A and B with B scaled by 0.05, alpha 8) on the seed-3 tiny Llama,
    saved as PEFT saves it: it changes some of the 16 greedy answers, not all (7 on this project's CPU)."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(11)
    peft = get_peft_model(
        make_llama(len(tok), seed=3),
        LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    with torch.no_grad():
        for name, param in peft.named_parameters():
            if "lora_B" in name:
                param.mul_(0.05)
    d = tmp_path_factory.mktemp("adapter")
    peft.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def model_dir(tok, tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tiny-llama-seed3")
    make_llama(len(tok), seed=3).save_pretrained(d, safe_serialization=True)
    tok.save_pretrained(d)
    return d


def transformers_backend(tok, seed: int = 3) -> B.TransformersBackend:
    return B.TransformersBackend(
        make_llama(len(tok), seed=seed), tok, EVAL, device=CPU, autocast=contextlib.nullcontext
    )


@pytest.fixture(scope="module")
def direct(tok, prompts, adapter):
    """Answers of the study's own procedure (``generate_prompts``) with and without the adapter, computed apart."""
    from peft import PeftModel

    from tuneproof.modalities.text import generate_prompts

    run = dict(device=CPU, autocast=contextlib.nullcontext)
    base = generate_prompts(make_llama(len(tok), seed=3), tok, prompts, EVAL, **run)
    adapted = generate_prompts(
        PeftModel.from_pretrained(make_llama(len(tok), seed=3), str(adapter)), tok, prompts, EVAL, **run
    )
    changed = sum(a != b for a, b in zip(base, adapted))
    return {"base": base, "adapted": adapted, "changed": changed}


class Delegating:
    """A "vLLM-like" backend that serves the model and adapter correctly: its own copy of the same weights."""

    name = "vllm"

    def __init__(self, tok):
        self.inner = transformers_backend(tok)

    def generate(self, prompts, max_new_tokens, adapter_dir=None, *, progress=None):
        return self.inner.generate(prompts, max_new_tokens, adapter_dir)


class DropsAdapter(Delegating):
    """Accepts the adapter and ignores it (the known serving fault)."""

    def generate(self, prompts, max_new_tokens, adapter_dir=None, *, progress=None):
        return self.inner.generate(prompts, max_new_tokens, None)


class Disagrees(Delegating):
    """Serves correctly but changes the answers at fixed positions (a numerics or stop-token difference)."""

    def __init__(self, tok, at):
        super().__init__(tok)
        self.at = set(at)

    def generate(self, prompts, max_new_tokens, adapter_dir=None, *, progress=None):
        out = self.inner.generate(prompts, max_new_tokens, adapter_dir)
        return [o + " !" if i in self.at else o for i, o in enumerate(out)]


def check(reference, candidate, prompts, adapter, **kw):
    return B.check_backends(
        reference, candidate, prompts, IDS, max_new_tokens=EVAL.max_new_tokens, adapter_dir=adapter, **kw
    )


# --------------------------------------------------------------------------- the transformers backend
def test_transformers_backend_is_the_study_procedure(tok, prompts, adapter, direct):
    backend = transformers_backend(tok)
    assert backend.generate(prompts, 6, None) == direct["base"]
    assert backend.generate(prompts, 6, adapter) == direct["adapted"]  # loads the adapter onto its model
    assert backend.generate(prompts, 6, None) == direct["base"]  # the adapter disabled again
    assert 0 < direct["changed"] < 16, direct  # the adapter changes some answers and leaves others
    assert len(set(direct["base"])) > 1
    with pytest.raises(ValueError, match="carries the adapter"):
        backend.generate(prompts[:1], 6, adapter.parent)


# --------------------------------------------------------------------------- the check
def test_check_passes_for_a_backend_serving_model_and_adapter(tok, prompts, adapter, direct):
    res = check(transformers_backend(tok), Delegating(tok), prompts, adapter)
    assert res["passed"] is True and res["reason"] is None
    assert res["numbers"] == {
        "sample": 16,
        "agreeing": 16,
        "agreement": 1.0,
        "min_agreement": 0.9,
        "adapter_changed_reference": direct["changed"],
        "adapter_changed_candidate": direct["changed"],
    }
    assert res["first_disagreement"] is None and res["adapter_effect"] == "checked"
    assert res["outputs"]["reference"] == res["outputs"]["candidate"] == direct["adapted"]
    assert res["outputs"]["reference_base"] == direct["base"]
    assert res["message"] == (
        f"vllm agrees with transformers on 16 of 16 sampled examples (agreement 1.000 >= 0.9); "
        f"the adapter changes {direct['changed']} answers in vllm, {direct['changed']} in transformers"
    )


def test_check_refuses_a_served_adapter_without_effect(tok, prompts, adapter, direct):
    res = check(transformers_backend(tok), DropsAdapter(tok), prompts, adapter)
    assert res["passed"] is False
    assert res["reason"] == (
        "the served adapter had no effect: vllm gives the same answers with and without it on all 16 "
        f"sampled examples, transformers different ones on {direct['changed']}"
    )
    assert res["numbers"]["adapter_changed_candidate"] == 0
    assert res["numbers"]["agreeing"] == 16 - direct["changed"]  # its answers are the base's
    assert res["numbers"]["agreement"] == (16 - direct["changed"]) / 16
    # refused whatever the agreement threshold: an adapter changing 1 answer in 16 would pass 0.9
    lax = check(transformers_backend(tok), DropsAdapter(tok), prompts, adapter, min_agreement=0.0)
    assert lax["passed"] is False and lax["reason"].startswith("the served adapter had no effect")


def test_check_refuses_a_backend_that_disagrees(tok, prompts, adapter, direct):
    res = check(transformers_backend(tok), Disagrees(tok, at=(2, 7, 11)), prompts, adapter)
    assert res["passed"] is False
    assert res["numbers"]["agreeing"] == 13 and res["numbers"]["agreement"] == 0.8125
    assert res["first_disagreement"] == {
        "id": "ex02",
        "reference": direct["adapted"][2],
        "candidate": direct["adapted"][2] + " !",
    }
    assert res["reason"] == (
        f"vllm agrees with transformers on 13 of 16 sampled examples (agreement 0.812 < "
        "eval.backend_check_min_agreement 0.9); first: ex02: "
        f"{direct['adapted'][2]!r} vs {direct['adapted'][2] + ' !'!r}"
    )
    assert res["adapter_effect"] == "checked" and res["numbers"]["adapter_changed_candidate"] == direct["changed"]
    assert "\n" not in res["reason"]  # one line
    # one answer in 16 apart: 0.9375 passes the default 0.9 (the first disagreement is still recorded), not 1.0
    one = check(transformers_backend(tok), Disagrees(tok, at=(5,)), prompts, adapter)
    assert one["passed"] is True and one["numbers"]["agreement"] == 0.9375 and one["first_disagreement"]["id"] == "ex05"
    strict = check(transformers_backend(tok), Disagrees(tok, at=(5,)), prompts, adapter, min_agreement=1.0)
    assert (
        strict["passed"] is False
        and "15 of 16" in strict["reason"]
        and "< eval.backend_check_min_agreement 1)" in strict["reason"]
    )


def test_check_without_adapter_compares_the_base(tok, prompts, direct):
    res = check(transformers_backend(tok), Delegating(tok), prompts, None)
    assert res["passed"] is True and res["numbers"]["agreement"] == 1.0 and res["adapter_effect"] == "no adapter"
    assert res["numbers"]["adapter_changed_reference"] is None and res["outputs"]["candidate"] == direct["base"]
    other = transformers_backend(tok, seed=4)  # another model served: most answers differ
    expected = sum(a == b for a, b in zip(direct["base"], other.generate(prompts, 6)))
    res = check(transformers_backend(tok), other, prompts, None)
    assert res["numbers"]["agreeing"] == expected and expected <= 8
    assert res["passed"] is False and res["reason"].startswith(
        f"transformers agrees with transformers on {expected} of 16"
    )


def test_check_sample_is_seeded_and_in_order():
    items = list(range(40))
    a = B.backend_check_sample(items, 16, 0)
    assert a == B.backend_check_sample(items, 16, 0) and len(a) == 16 and a == sorted(a)
    assert a != B.backend_check_sample(items, 16, 1)
    assert B.backend_check_sample(items[:5], 16, 0) == [0, 1, 2, 3, 4]


# --------------------------------------------------------------------------- VllmBackend on the stand-in
def test_vllm_backend_serves_adapter_through_lora_request(monkeypatch, tok, prompts, model_dir, adapter, direct):
    fake_vllm.install(monkeypatch)
    backend = B.VllmBackend(model_dir, tok, dtype="fp32", max_lora_rank=4, seed=7)
    assert backend.generate(prompts, 6, adapter) == direct["adapted"]
    assert backend.generate(prompts, 6, None) == direct["base"]
    (llm,) = fake_vllm.LLM.instances
    assert llm.kwargs["enable_lora"] is True and llm.kwargs["max_lora_rank"] == 16 and llm.kwargs["dtype"] == "float32"
    assert llm.kwargs["model"] == str(model_dir) and llm.kwargs["seed"] == 7
    assert [(r.lora_int_id, r.lora_path) if r else None for r in llm.requests] == [(1, str(adapter.resolve())), None]
    assert backend.identity() == {
        "name": "vllm",
        "version": "0.0.0+fake",
        "dtype": "float32",
        "model_path": str(model_dir),
        "max_lora_rank": 4,
    }
    res = check(
        transformers_backend(tok), B.VllmBackend(model_dir, tok, dtype="fp32", max_lora_rank=4), prompts, adapter
    )
    assert res["passed"] is True and res["numbers"]["agreement"] == 1.0


def test_vllm_backend_dropping_the_adapter_is_refused(monkeypatch, tok, prompts, model_dir, adapter, direct):
    fake_vllm.install(monkeypatch, drop_lora=True)
    res = check(
        transformers_backend(tok), B.VllmBackend(model_dir, tok, dtype="fp32", max_lora_rank=4), prompts, adapter
    )
    assert res["passed"] is False and res["reason"].startswith("the served adapter had no effect")
    assert (
        res["numbers"]["adapter_changed_candidate"] == 0
        and res["numbers"]["adapter_changed_reference"] == direct["changed"]
    )


def test_lora_rank_limit_is_a_power_of_two_at_least_16(monkeypatch, tok, model_dir):
    fake_vllm.install(monkeypatch)
    for r, limit in ((4, 16), (16, 16), (17, 32), (64, 64), (65, 128)):
        B.VllmBackend(model_dir, tok, max_lora_rank=r).llm
        assert fake_vllm.LLM.instances[-1].kwargs["max_lora_rank"] == limit
    B.VllmBackend(model_dir, tok).llm
    assert fake_vllm.LLM.instances[-1].kwargs["enable_lora"] is False


# --------------------------------------------------------------------------- where vLLM cannot run
def test_vllm_not_installed_is_a_two_line_error(monkeypatch):
    monkeypatch.setattr(B, "vllm_installed", lambda: False)
    with pytest.raises(TuneproofError) as e:
        B.check_backend_available(Eval(backend="vllm"), CAUSAL_LM, "s/tuneproof.yaml")
    lines = str(e.value).splitlines()
    assert len(lines) == 2 and e.value.exit_code == 2
    assert lines[0] == "s/tuneproof.yaml: eval.backend: vllm, but the package vllm is not installed in this environment"
    assert "pip install -e '.[vllm]'" in lines[1] and "eval.backend: transformers" in lines[1]
    B.check_backend_available(Eval(), CAUSAL_LM)  # transformers: nothing to check


def test_vllm_really_absent_here():
    if B.vllm_installed():
        pytest.skip("vllm is installed on this machine")
    with pytest.raises(TuneproofError, match="the package vllm is not installed"):
        B.check_backend_available(Eval(backend="vllm"), CAUSAL_LM)


def test_vllm_without_cuda_is_a_two_line_error(monkeypatch):
    fake_vllm.install(monkeypatch)
    monkeypatch.setattr(B, "cuda_available", lambda: False)
    with pytest.raises(TuneproofError) as e:
        B.check_backend_available(Eval(backend="vllm"), CAUSAL_LM, "s/tuneproof.yaml")
    lines = str(e.value).splitlines()
    assert len(lines) == 2
    assert (
        lines[0] == "s/tuneproof.yaml: eval.backend: vllm needs a CUDA GPU; none is "
        "visible here (torch.cuda.is_available() is False)"
    )
    assert "eval.backend: transformers" in lines[1]
    for head in (SEQUENCE_CLASSIFIER, IMAGE_CLASSIFIER):  # the head says whether it generates
        with pytest.raises(TuneproofError, match=f"serves generative .*this model is {head.kind}"):
            B.check_backend_available(Eval(backend="vllm"), head)


def test_study_keys():
    from tuneproof.context import parse_study

    assert (Eval().backend, Eval().backend_check_examples, Eval().backend_check_min_agreement) == (
        "transformers",
        16,
        0.9,
    )
    raw = {
        "name": "s",
        "hypothesis": {"behaviour": "b", "task": "extraction", "success": {"metric": "field_f1"}},
        "data": {"sources": [{"path": "d.jsonl", "format": "jsonl"}]},
        "model": {"base": "x"},
    }
    with pytest.raises(TuneproofError) as e:
        parse_study({**raw, "eval": {"backend": "vllm", "do_sample": True}}, "s.yaml")
    assert (
        str(e.value)
        .splitlines()[0]
        .startswith("s.yaml: eval: eval.backend vllm needs greedy decoding (eval.do_sample: false)")
    )
    with pytest.raises(TuneproofError, match="eval.backend"):
        parse_study({**raw, "eval": {"backend": "sglang"}}, "s.yaml")
    with pytest.raises(TuneproofError, match="eval.backend_check_min_agreement"):
        parse_study({**raw, "eval": {"backend_check_min_agreement": 1.5}}, "s.yaml")


# --------------------------------------------------------------------------- fingerprint and preflight scope
def test_fingerprint_separates_backends_and_keeps_old_hashes():
    from tuneproof.evaluation.fingerprint import PARTS, diff_fingerprints, eval_fingerprint

    old_cfg = {
        k: v for k, v in Eval().model_dump().items() if not k.startswith("backend")
    }  # as recorded before the key existed
    tf = eval_fingerprint(["a", "b"], Eval(), "extraction", None, {"v": 1})
    assert eval_fingerprint(["a", "b"], old_cfg, "extraction", None, {"v": 1}) == tf and tuple(tf["parts"]) == PARTS
    # the check settings do not change the outputs
    assert (
        eval_fingerprint(
            ["a", "b"], Eval(backend_check_examples=4, backend_check_min_agreement=1.0), "extraction", None, {"v": 1}
        )
        == tf
    )
    vl = eval_fingerprint(["a", "b"], Eval(backend="vllm"), "extraction", None, {"v": 1})
    assert tuple(vl["parts"]) == PARTS + ("backend",) and vl["hash"] != tf["hash"]
    assert diff_fingerprints(tf, vl) == ["backend"]


def test_backend_keys_keep_a_passed_preflight():
    from tuneproof.preflight.scope import preflight_changes

    cur = {"eval": {**Eval(backend="vllm", backend_check_examples=8).model_dump(), "split": "validation"}}
    old = {"eval": {k: v for k, v in cur["eval"].items() if not k.startswith("backend")}}
    assert preflight_changes(old, cur) == []
    assert [c["key"] for c in preflight_changes(old, {"eval": {**cur["eval"], "batch_size": 3}})] == ["eval.batch_size"]


# --------------------------------------------------------------------------- the recipes
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The tiny extraction study (data check, transformers baseline r0002) and one LoRA train run."""
    from tiny_study import build_base, make_study
    from tuneproof.context import StudyContext
    from tuneproof.recipes.train import run_train

    base = build_base(tmp_path_factory.mktemp("tiny-base"))
    study = make_study(tmp_path_factory.mktemp("vllm-study") / "s", base, learning_rate=0.05)
    ctx = StudyContext.open(study)
    train_id = run_train(ctx)
    ctx.registry.close()
    return {"dir": study, "train": train_id, "base": base}


def _copy_with_backend(src: Path, dst: Path, **eval_keys) -> Path:
    import shutil

    import yaml

    shutil.copytree(src, dst)
    cfg = yaml.safe_load((dst / "tuneproof.yaml").read_text())
    cfg["eval"].update(eval_keys)
    (dst / "tuneproof.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return dst


def _cli(capsys, study, *args) -> tuple[int, str]:
    from tuneproof.cli import main

    with pytest.raises(SystemExit) as exit_:
        main([*args, "--study", str(study)])
    cap = capsys.readouterr()
    return exit_.value.code, cap.out + cap.err


def test_eval_with_vllm_passes_check_and_is_another_procedure(monkeypatch, trained, tmp_path, capsys):
    from tuneproof.io import read_json
    from tuneproof.registry import Registry

    study = _copy_with_backend(trained["dir"], tmp_path / "s", backend="vllm")
    fake_vllm.install(monkeypatch)
    monkeypatch.setattr(B, "cuda_available", lambda: True)
    code, out = _cli(capsys, study, "eval", trained["train"])
    assert code == 0, out
    reg = Registry(study)
    rec = reg.latest("eval")
    s = rec.summary
    assert (
        rec.status == "completed"
        and s["eval_backend"]["name"] == "vllm"
        and s["eval_backend"]["version"] == "0.0.0+fake"
    )
    bc = s["backend_check"]
    assert (
        bc["passed"] is True and bc["numbers"]["sample"] == 6 and bc["numbers"]["agreement"] == 1.0
    )  # the 6 validation examples
    detail = read_json(study / "runs" / rec.id / "backend_check.json")
    assert detail["numbers"] == bc["numbers"] and len(detail["outputs"]["candidate"]) == 6
    assert (
        bc["adapter_effect"] == "checked"
        and bc["numbers"]["adapter_changed_candidate"] == bc["numbers"]["adapter_changed_reference"] > 0
    )
    preds = [json.loads(x)["prediction"] for x in (study / "runs" / rec.id / "outputs.jsonl").read_text().splitlines()]
    assert preds == detail["outputs"]["candidate"]  # the whole split is the sample here: the same answers
    assert len(fake_vllm.LLM.instances) == 1  # one engine for the check and the run
    efp = read_json(study / "runs" / rec.id / "eval.json")["fingerprint"]
    base_efp = read_json(study / "runs" / "r0002" / "eval.json")["fingerprint"]
    assert reg.get("r0002").kind == "baseline" and "backend" not in base_efp["parts"] and "backend" in efp["parts"]
    reg.close()
    # a vLLM candidate is not silently paired with the transformers baseline, even after a passed check
    code, out = _cli(capsys, study, "compare", rec.id)
    assert code == 2 and f"{rec.id} was evaluated differently from baseline r0002 (differs: backend)" in " ".join(
        out.split()
    )
    # and train wants a baseline evaluated by the same backend
    from tuneproof.context import StudyContext
    from tuneproof.recipes.protocol import require_baseline

    with pytest.raises(CheckFailed, match=r"the evaluation fingerprint \(backend differ\)"):
        require_baseline(StudyContext.open(study))


def test_test_split_with_vllm_checks_on_the_eval_split(monkeypatch, trained, tmp_path, capsys):
    from tuneproof.io import read_json
    from tuneproof.registry import Registry

    study = _copy_with_backend(trained["dir"], tmp_path / "s", backend="vllm", backend_check_examples=4)
    fake_vllm.install(monkeypatch)
    monkeypatch.setattr(B, "cuda_available", lambda: True)
    code, out = _cli(capsys, study, "test", "base")
    assert code == 0, out
    reg = Registry(study)
    rec = reg.latest("test")
    detail = read_json(study / "runs" / rec.id / "backend_check.json")
    assert detail["numbers"]["sample"] == 4 and detail["adapter_effect"] == "no adapter" and detail["passed"] is True
    assert all(
        i.startswith("ex1") for i in detail["ids"]
    )  # validation ids ex100..ex105; the test split is ex200..ex203
    assert len((study / "runs" / rec.id / "outputs.jsonl").read_text().splitlines()) == 4
    reg.close()


def test_eval_refused_when_served_adapter_has_no_effect(monkeypatch, trained, tmp_path, capsys):
    from tuneproof.registry import Registry

    study = _copy_with_backend(trained["dir"], tmp_path / "s", backend="vllm")
    fake_vllm.install(monkeypatch, drop_lora=True)
    monkeypatch.setattr(B, "cuda_available", lambda: True)
    code, out = _cli(capsys, study, "eval", trained["train"])
    assert code == 3, out
    reg = Registry(study)
    rec = reg.latest("eval", status="invalid")
    assert rec is not None and rec.reason.startswith(
        "backend check: the served adapter had no effect: vllm gives the same answers with and without it"
    )
    assert "(was failed" not in rec.reason  # said once
    assert "metrics" not in rec.summary and not (study / "runs" / rec.id / "outputs.jsonl").exists()  # no numbers
    assert (
        rec.summary["backend_check"]["passed"] is False
        and rec.summary["backend_check"]["numbers"]["adapter_changed_candidate"] == 0
    )
    assert "the served adapter had no effect" in out and f"runs/{rec.id}/backend_check.json" in out
    reg.close()


def test_eval_with_vllm_absent_stops_before_any_run(trained, tmp_path, capsys):
    from tuneproof.registry import Registry

    if B.vllm_installed():
        pytest.skip("vllm is installed on this machine")
    study = _copy_with_backend(trained["dir"], tmp_path / "s", backend="vllm")
    before = [r.id for r in Registry(study).list()]
    code, out = _cli(capsys, study, "eval", trained["train"])
    assert code == 2
    assert "eval.backend: vllm, but the package vllm is not installed" in out and "pip install -e '.[vllm]'" in out
    assert [r.id for r in Registry(study).list()] == before


def test_baseline_with_vllm_is_the_baseline_train_wants(monkeypatch, trained, tmp_path, capsys):
    from tuneproof.context import StudyContext
    from tuneproof.io import read_json
    from tuneproof.recipes.protocol import require_baseline
    from tuneproof.registry import Registry

    study = _copy_with_backend(trained["dir"], tmp_path / "s", backend="vllm")
    fake_vllm.install(monkeypatch)
    monkeypatch.setattr(B, "cuda_available", lambda: True)
    code, out = _cli(capsys, study, "baseline")
    assert code == 0, out
    reg = Registry(study)
    rec = reg.latest("baseline")
    assert rec.id != "r0002" and rec.summary["backend_check"]["adapter_effect"] == "no adapter"
    assert rec.summary["backend_check"]["numbers"]["agreement"] == 1.0 and rec.summary["eval_backend"]["name"] == "vllm"
    (llm,) = fake_vllm.LLM.instances
    assert llm.kwargs["enable_lora"] is False and llm.requests == [None, None]  # the check's sample, then the split
    # the same answers as the transformers baseline r0002 on the same examples (greedy fp32, same weights)
    rows = lambda rid: [json.loads(x) for x in (study / "runs" / rid / "outputs.jsonl").read_text().splitlines()]  # noqa: E731
    assert [r["prediction"] for r in rows(rec.id)] == [r["prediction"] for r in rows("r0002")]
    assert (
        read_json(study / "runs" / rec.id / "eval.json")["fingerprint"]["hash"]
        != read_json(study / "runs" / "r0002" / "eval.json")["fingerprint"]["hash"]
    )
    reg.close()
    assert require_baseline(StudyContext.open(study)) == rec.id  # train now finds a baseline of its procedure


def test_served_paths_of_lora_full_and_base(trained, tmp_path):
    import shutil

    from tuneproof.context import StudyContext
    from tuneproof.evaluation.recording import served_paths

    study = tmp_path / "s"
    shutil.copytree(trained["dir"], study)
    ctx = StudyContext.open(study)
    run_dir = study / "runs" / trained["train"]
    assert served_paths(ctx, trained["train"]) == (ctx.base.path, run_dir / "adapter")
    assert served_paths(ctx, None) == (ctx.base.path, None)
    (run_dir / "model").mkdir()
    (run_dir / "model" / "config.json").write_text("{}")  # a fully fine-tuned run: vLLM loads its weights, no adapter
    assert served_paths(ctx, trained["train"]) == (run_dir / "model", None)
    ctx.registry.close()
