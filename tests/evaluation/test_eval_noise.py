"""Issue 32 item 2: how much the numbers move by themselves. ``eval.repeat: N`` evaluates the same model N times
(permuted batches, a sampling seed per repeat), ``noise.json`` records each metric per repeat, its spread (the noise
floor) and the per-example flips, and ``compare`` judges the success criterion's gain only above max(min_gain,
floor), saying which threshold applied."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))

from tiny_study import build_base, make_study  # noqa: E402
from tuneproof import hypothesis as hyp  # noqa: E402
from tuneproof.context import StudyContext  # noqa: E402
from tuneproof.deliver.headline import noise_lines  # noqa: E402
from tuneproof.errors import CheckFailed  # noqa: E402
from tuneproof.evaluation import recording  # noqa: E402
from tuneproof.evaluation.compare import paired_compare  # noqa: E402
from tuneproof.evaluation.fingerprint import eval_fingerprint  # noqa: E402
from tuneproof.evaluation.noise import comparison_floor, repeat_order, success_threshold  # noqa: E402
from tuneproof.evaluation.outputs import check_complete  # noqa: E402
from tuneproof.preflight.scope import is_exempt  # noqa: E402
from tuneproof.recipes.baseline import run_baseline  # noqa: E402
from tuneproof.recipes.compare import run_compare  # noqa: E402
from tuneproof.recipes.data_check import run_data_check  # noqa: E402
from tuneproof.study import Eval, Study, role_of  # noqa: E402


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return build_base(tmp_path_factory.mktemp("noise-base") / "base")


def _study(folder: Path, base: Path, **eval_changes) -> Path:
    make_study(folder, base, prepare=False)
    cfg = yaml.safe_load((folder / "tuneproof.yaml").read_text())
    cfg["eval"].update(eval_changes)
    (folder / "tuneproof.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return folder


def _set_repeat(folder: Path, n: int) -> None:
    cfg = yaml.safe_load((folder / "tuneproof.yaml").read_text())
    cfg["eval"]["repeat"] = n
    (folder / "tuneproof.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))


def _spy(monkeypatch) -> list[tuple[list[str], bool, str]]:
    """Every prediction pass of an evaluation: (example ids in the order predicted, sorted by length, label)."""
    calls = []
    real = recording.predict

    def spy(ctx, model, examples, what, on_progress=None, raw_out=None, sort_by_length=True):
        calls.append(([e.id for e in examples], sort_by_length, what))
        return real(ctx, model, examples, what, on_progress, raw_out, sort_by_length=sort_by_length)

    monkeypatch.setattr(recording, "predict", spy)
    return calls


def _read(study: Path, rid: str, name: str):
    return json.loads((study / "runs" / rid / name).read_text())


def test_eval_repeat_is_a_budget_key_outside_the_fingerprint_and_the_frozen_hypothesis():
    assert role_of("eval.repeat") == "budget" and is_exempt("eval.repeat")  # keeps a passed preflight
    assert Eval().repeat == 1
    with pytest.raises(ValueError):
        Eval(repeat=0)
    with pytest.raises(ValueError, match="eval.repeat > 1 needs eval.backend: transformers"):
        Eval(repeat=3, backend="vllm")
    args = (["a", "b"], "extraction", ["intent"], {"vocab": "x"})
    one, three = eval_fingerprint(args[0], Eval(), *args[1:]), eval_fingerprint(args[0], Eval(repeat=3), *args[1:])
    assert one == three  # older runs (N = 1) stay comparable with repeated ones
    cfg = {"name": "s", "hypothesis": {"behaviour": "b", "task": "extraction", "success": {"metric": "field_f1"}}}
    study1 = Study.model_validate(cfg | {"data": {"sources": []}, "model": {"base": "m"}})
    study3 = study1.model_copy(update={"eval": Eval(repeat=3)})
    assert hyp.view_hash(hyp.hypothesis_view(study1)) == hyp.view_hash(hyp.hypothesis_view(study3))


def test_repeat_order_is_seeded_and_canonical_first():
    assert repeat_order(6, 0, 0) == [0, 1, 2, 3, 4, 5]
    assert repeat_order(6, 1, 0) == repeat_order(6, 1, 0)  # the same permutation on every machine
    assert sorted(repeat_order(6, 2, 0)) == list(range(6))
    assert repeat_order(6, 1, 0) != repeat_order(6, 2, 0) != list(range(6))


def test_greedy_cpu_repeats_measure_the_floor_and_leave_n1_unchanged(tmp_path, base, monkeypatch):
    study = _study(tmp_path / "s", base, repeat=3)
    calls = _spy(monkeypatch)
    ctx = StudyContext.open(study)
    try:
        run_data_check(ctx)
        rep = run_baseline(ctx)
    finally:
        ctx.registry.close()
    ids = [f"ex{k:03d}" for k in range(100, 106)]
    # three passes: the canonical order sorted by length, then two seeded permutations batched in their order
    assert [c[1] for c in calls] == [True, False, False]
    assert calls[0][0] == ids
    assert sorted(calls[1][0]) == sorted(calls[2][0]) == ids
    assert calls[1][0] != ids and calls[2][0] != ids and calls[1][0] != calls[2][0]
    assert [c[2] for c in calls] == ["baseline (repeat 1 of 3)", "baseline (repeat 2 of 3)", "baseline (repeat 3 of 3)"]

    noise = _read(study, rep, "noise.json")
    assert noise["repeats"] == 3 and noise["device"] == "cpu" and noise["sampling_seeds"] == [None, None, None]
    orders = [o["order"] for o in noise["orders"]]
    assert orders[0] == list(range(6)) and orders[1] != orders[2] and orders[1] != orders[0]  # recorded, different
    assert [[ids[i] for i in o] for o in orders[1:]] == [calls[1][0], calls[2][0]]
    for name in ("field_f1", "json_valid_rate", "intent_accuracy"):
        values = noise["metrics"][name]["values"]
        assert len(values) == 3
        assert noise["metrics"][name]["spread"] == max(values) - min(values)  # measured, not assumed
    # greedy decoding in fp32 on a CPU: the batching does not change the outputs, and the floor measured says so
    assert all(m["spread"] == 0.0 for m in noise["metrics"].values())
    assert noise["flips"] == {"count": 0, "ids": [], "examples": []}
    ev = _read(study, rep, "eval.json")
    assert ev["repeats"] == 3 and ev["n"] == 6
    summary = _read(study, rep, "summary.json")
    assert summary["eval_repeats"] == 3 and summary["noise"]["floors"]["field_f1"] == 0.0
    assert len(summary["noise_sha256"]) == 64

    _set_repeat(study, 1)  # the same study evaluated once: as before the key existed
    calls.clear()
    ctx = StudyContext.open(study)
    try:
        once = run_baseline(ctx)
        cid = run_compare(ctx, [once], against=rep)
    finally:
        ctx.registry.close()
    assert len(calls) == 1 and calls[0][1] is True and calls[0][2] == "baseline"
    assert not (study / "runs" / once / "noise.json").exists()
    ev1 = _read(study, once, "eval.json")
    assert "repeats" not in ev1 and set(ev1) == set(ev) - {"repeats"}
    assert ev1["fingerprint"] == ev["fingerprint"]  # the same procedure: comparable
    assert "eval_repeats" not in _read(study, once, "summary.json")
    a, b = (study / "runs" / rep / "outputs.jsonl").read_bytes(), (study / "runs" / once / "outputs.jsonl").read_bytes()
    assert a == b  # repeat 1's outputs are the run's outputs, byte for byte

    comp = _read(study, cid, "compare.json")["candidates"][once]
    assert comp["noise"]["baseline"] == {"run": rep, "repeats": 3, "floors": noise_floors(noise), "flips": 0}
    assert comp["noise"]["candidate"] is None
    succ = comp["verdicts"][0]
    assert succ["noise"]["noise_floor"] == 0.0 and succ["noise"]["applied"] == "min_gain"
    assert "min_gain 0 >= noise floor 0 (3 repeats of the baseline)" in succ["detail"]


def noise_floors(noise: dict) -> dict:
    return {k: v["spread"] for k, v in noise["metrics"].items()}


def test_sampled_repeats_flip_examples_and_move_the_metric(tmp_path, base):
    study = _study(tmp_path / "s", base, repeat=4, do_sample=True, temperature=3.0, max_new_tokens=2, seed=7)
    cfg = yaml.safe_load((study / "tuneproof.yaml").read_text())
    cfg["hypothesis"] = {
        "behaviour": "starts with a word from the first half of the alphabet",
        "task": "format",
        "success": {"metric": "regex_match_rate", "min_gain": 0.0},
    }
    cfg["eval"]["regex"] = "[a-m{].*"
    (study / "tuneproof.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    ctx = StudyContext.open(study)
    try:
        rid = run_baseline(ctx, data_check_override="noise test: the data check is not what this test checks")
    finally:
        ctx.registry.close()
    noise = _read(study, rid, "noise.json")
    assert noise["do_sample"] is True and noise["sampling_seeds"] == [7000, 7001, 7002, 7003]
    assert any("sampling" in s for s in noise["sources"])
    rate = noise["metrics"]["regex_match_rate"]
    assert rate["spread"] == max(rate["values"]) - min(rate["values"]) > 0
    assert noise["flips"]["count"] > 0 and len(noise["flips"]["ids"]) == noise["flips"]["count"]
    flipped = noise["flips"]["examples"][0]
    assert len(flipped["predictions"]) == 4 and len(set(flipped["predictions"])) > 1


def _rows(correct: list[bool]) -> list[dict]:
    return [
        {"id": f"e{i}", "category": "a" if i % 2 else "b", "reference": "a" if i % 2 else "b"}
        | {"prediction": ("a" if i % 2 else "b") if ok else "z"}
        for i, ok in enumerate(correct)
    ]


class _Hyp:
    class success:  # noqa: N801 - the shape of study.Hypothesis
        metric, min_gain = "accuracy", 0.0

    guards: list = []


def _noise(base_floor: float | None, cand_floor: float | None) -> dict | None:
    def side(floor):
        return (
            None if floor is None else {"repeats": 3, "metrics": {"accuracy": {"spread": floor}}, "flips": {"count": 2}}
        )

    if base_floor is None and cand_floor is None:
        return None
    return comparison_floor(side(base_floor), side(cand_floor), "r0002", "r0005")


def test_compare_judges_the_gain_above_the_larger_floor():
    base = _rows([i < 20 for i in range(40)])  # accuracy 0.5
    cand = _rows([i < 32 for i in range(40)])  # accuracy 0.8: gain 0.3, 12 fixed, 0 broken
    args = dict(task="classification", required_fields=None, eval_cfg=Eval(), hypothesis=_Hyp, iterations=300)

    plain = paired_compare(base, cand, **args)
    none = plain["verdicts"][0]  # no floor measured: the verdict exactly as before the noise floor existed
    assert none["verdict"] == "pass" and none["threshold"] == 0.0 and "noise" not in none
    assert none["name"] == "success: accuracy gain >= 0"
    assert none["detail"].startswith("delta +0.3000, 95% CI [") and none["detail"].endswith("] vs required gain 0")
    assert plain["success_threshold"]["why"] == (
        "noise floor not measured (neither run was evaluated with eval.repeat > 1): min_gain 0 applies"
    )

    high = paired_compare(base, cand, noise=_noise(0.05, 0.6), **args)  # the candidate's floor is the larger
    v = high["verdicts"][0]
    assert v["verdict"] == "fail" and v["verdict_min_gain"] == "pass" and v["decided_by_noise_floor"] is True
    assert v["threshold"] == 0.6 and v["noise"]["floor_from"] == "candidate"
    assert "noise floor 0.6 (3 repeats of the candidate) > min_gain 0" in v["detail"]
    assert v["name"] == "success: accuracy gain >= 0 and >= noise floor 0.6"
    assert high["overall"]["verdict"] == "fail"
    decided, notes = noise_lines(high, high["verdicts"])
    assert decided.startswith("the noise floor decided the verdict: fail against the noise floor 0.6")
    assert "pass against min_gain 0 alone (delta +0.3000)" in decided
    assert notes[1] == "per-example flips between repeats: baseline r0002 2 (3 repeats), candidate r0005 2 (3 repeats)"

    low = paired_compare(base, cand, noise=_noise(0.05, None), **args)["verdicts"][0]
    assert low["verdict"] == "pass" and low["threshold"] == 0.05 and low["noise"]["applied"] == "noise floor"
    assert "vs required gain 0.05 (noise floor 0.05 (3 repeats of the baseline) > min_gain 0)" in low["detail"]
    assert low["decided_by_noise_floor"] is False
    assert noise_lines({}, [low])[0] is None


def test_success_threshold_min_gain_above_the_floor():
    th = success_threshold(0.1, _noise(0.02, 0.03), "accuracy")
    assert th["threshold"] == 0.1 and th["applied"] == "min_gain" and th["noise_floor"] == 0.03
    assert th["why"] == "min_gain 0.1 >= noise floor 0.03 (3 repeats of the candidate)"
    assert success_threshold(0.1, _noise(0.02, 0.03), "macro_f1")["noise_floor"] is None  # not measured on it


def test_an_interrupted_repeat_leaves_the_run_interrupted(tmp_path, base, monkeypatch):
    study = _study(tmp_path / "s", base, repeat=3)
    real = recording.predict
    seen = []

    def stop_in_repeat_two(ctx, model, examples, what, on_progress=None, raw_out=None, sort_by_length=True):
        seen.append(what)
        if len(seen) == 2:
            on_progress(4)  # four examples of repeat 2 done, then Ctrl-C
            raise KeyboardInterrupt
        return real(ctx, model, examples, what, on_progress, raw_out, sort_by_length=sort_by_length)

    monkeypatch.setattr(recording, "predict", stop_in_repeat_two)
    ctx = StudyContext.open(study)
    try:
        run_data_check(ctx)
        with pytest.raises(KeyboardInterrupt):
            run_baseline(ctx)
        (rec,) = ctx.registry.list(kind="baseline")
        assert rec.status == "interrupted"
        assert not (study / "runs" / rec.id / "noise.json").exists()
        with pytest.raises(CheckFailed, match="at example 4 of 6 of repeat 2 of 3"):
            check_complete(ctx.registry, rec)
    finally:
        ctx.registry.close()


def test_the_test_reads_estimate_counts_every_repeat_of_the_candidate():
    from types import SimpleNamespace

    from tuneproof.recipes.test_read import estimate_line

    rec = SimpleNamespace(
        id="r0002", kind="baseline", status="completed", parent=None, summary={"eval_examples_per_s": 2}
    )
    ctx = SimpleNamespace(
        study=SimpleNamespace(data=SimpleNamespace(test_split="test"), eval=Eval(repeat=3)),
        registry=SimpleNamespace(list=lambda: [rec]),
        eval_sets=[],
    )
    line = estimate_line(ctx, "r0003", 60, 60, True, None)
    # (3 repeats of the candidate + 1 pass of the base model) x 60 examples / 2 per second = 120 s
    assert line == (
        "test: 60 of 60 'test' examples; 2 passes (r0003 x 3 repeats (eval.repeat), then the base model to pair "
        "with): about 2 min 00 s (r0002 evaluated 2 examples/s)"
    )
    ctx.study.eval = Eval()
    assert "about 1 min 00 s" in estimate_line(ctx, "r0003", 60, 60, True, None)  # as before: 2 passes x 30 s


def test_a_repeated_run_without_its_noise_json_is_missing_evidence(tmp_path):
    from types import SimpleNamespace

    from tuneproof.deliver.dossier.evidence import run_evidence_gaps

    for rid in ("r0002", "r0003"):
        (tmp_path / rid).mkdir()
        for name in ("outputs.jsonl", "eval.json"):
            (tmp_path / rid / name).write_text("{}\n")
    reg = SimpleNamespace(runs_dir=tmp_path)

    def run(rid, **summary):
        return SimpleNamespace(id=rid, kind="baseline", status="completed", summary=summary)

    runs = [run("r0002", noise_sha256="ab" * 32, eval_repeats=3), run("r0003")]  # r0003: evaluated once
    (gap,) = run_evidence_gaps(reg, runs)
    assert gap["run"] == "r0002" and gap["what"] == "baseline run r0002's evidence is missing (runs/r0002/noise.json)"
    (tmp_path / "r0002" / "noise.json").write_text("{}\n")
    assert run_evidence_gaps(reg, runs) == []


def test_an_edited_noise_json_is_refused(tmp_path):
    from types import SimpleNamespace

    from tuneproof.errors import TuneproofError
    from tuneproof.evaluation.noise import read_noise
    from tuneproof.io import sha256_file, write_json

    write_json(tmp_path / "noise.json", {"repeats": 3, "metrics": {"accuracy": {"spread": 0.05}}})
    rec = SimpleNamespace(id="r0002", summary={"noise_sha256": sha256_file(tmp_path / "noise.json"), "eval_repeats": 3})
    assert read_noise(tmp_path, rec)["metrics"]["accuracy"]["spread"] == 0.05
    assert read_noise(tmp_path, SimpleNamespace(id="r0001", summary={})) is None  # evaluated once
    write_json(tmp_path / "noise.json", {"repeats": 3, "metrics": {"accuracy": {"spread": 0.0}}})  # a floor hidden
    with pytest.raises(TuneproofError, match="noise.json: sha256 [0-9a-f]{64} differs from"):
        read_noise(tmp_path, rec)
    (tmp_path / "noise.json").unlink()
    with pytest.raises(TuneproofError, match="missing; run r0002 recorded 3 evaluation repeats"):
        read_noise(tmp_path, rec)


def test_the_dossier_refuses_an_edited_noise_json_as_it_refuses_edited_outputs(tmp_path):
    """``report`` (``check_all``) checked outputs.jsonl and the eval.sets outputs but not noise.json: a dossier
    was written from a noise record edited after its run (its floor hidden), where compare refuses it."""
    from types import SimpleNamespace

    from tuneproof.errors import TuneproofError
    from tuneproof.evaluation.outputs import check_all
    from tuneproof.io import sha256_file, write_json

    (tmp_path / "r0002").mkdir()
    write_json(tmp_path / "r0002" / "noise.json", {"repeats": 3, "metrics": {"accuracy": {"spread": 0.05}}})
    rec = SimpleNamespace(
        id="r0002",
        status="completed",
        summary={"noise_sha256": sha256_file(tmp_path / "r0002" / "noise.json"), "eval_repeats": 3},
    )
    reg = SimpleNamespace(runs_dir=tmp_path, list=lambda: [rec])
    assert check_all(reg) == 0  # no outputs.jsonl with a hash here; the noise record as written
    write_json(tmp_path / "r0002" / "noise.json", {"repeats": 3, "metrics": {"accuracy": {"spread": 0.0}}})
    with pytest.raises(
        TuneproofError, match=r"r0002/noise.json: sha256 [0-9a-f]{64} differs from [0-9a-f]{64} recorded"
    ):
        check_all(reg)
    rec.status = "invalid"  # an invalidated run is no evidence: not read
    assert check_all(reg) == 0
