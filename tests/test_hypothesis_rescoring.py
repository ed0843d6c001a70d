"""compare judges against the frozen hypothesis even when the edit changes the scoring itself
(hypothesis.required_fields, the format rule): the frozen scoring gives the verdict, the edited
one is scored again for the second verdict (docs/PROTOCOL.md step 1). Outputs are written by hand: no model."""

from __future__ import annotations

import json

import yaml

from tuneproof import hypothesis as hyp
from tuneproof.context import StudyContext, parse_study
from tuneproof.io import write_json, write_jsonl
from tuneproof.recipes.compare import run_compare
from tuneproof.registry import Registry

REF = json.dumps({"intent": "A", "slots": {"x": "1"}})


def _cfg(required: list[str]) -> dict:
    return {
        "name": "rescoring",
        "model": {"base": "smollm2-135m-instruct"},
        "hypothesis": {
            "behaviour": "extract",
            "task": "extraction",
            "success": {"metric": "field_f1", "min_gain": 0.0},
            "guards": [{"metric": "required_fields_rate", "max_drop": None, "floor": 0.9}],
            "required_fields": required,
        },
        "data": {"sources": [{"path": "d.jsonl", "format": "jsonl"}]},
        "eval": {"bootstrap_iterations": 200},
    }


def _eval_run(reg: Registry, kind: str, preds: list[str], parent: str | None = None) -> str:
    with reg.run(kind, parent=parent) as r:
        write_jsonl(
            r.path("outputs.jsonl"),
            [
                {"id": f"e{i}", "category": "A", "input": "t", "reference": REF, "prediction": p}
                for i, p in enumerate(preds)
            ],
        )
        write_json(r.path("eval.json"), {"fingerprint": {"hash": "same", "parts": {"procedure": "p"}}})
        return r.id


def test_edited_required_fields_are_scored_again_for_the_second_verdict(tmp_path):
    d = tmp_path / "study"
    d.mkdir()
    (d / "tuneproof.yaml").write_text(yaml.safe_dump(_cfg(["intent"])))
    reg = Registry(d)
    base = _eval_run(reg, "baseline", [json.dumps({"intent": "B"})] * 10)
    with reg.run("train") as t:
        hyp.freeze(d, parse_study(_cfg(["intent"])), t.id)  # frozen: required_fields [intent]
    half = [REF] * 5 + [json.dumps({"intent": "A"})] * 5  # half the outputs lack "slots"
    cand = _eval_run(reg, "eval", half, parent=t.id)
    reg.close()
    (d / "tuneproof.yaml").write_text(yaml.safe_dump(_cfg(["intent", "slots"])))  # edited after training
    cid = run_compare(StudyContext.open(d), [cand], against=base)
    cj = json.loads((d / "runs" / cid / "compare.json").read_text())
    c = cj["candidates"][cand]
    assert c["scoring"]["required_fields"] == ["intent"] and c["metrics"]["required_fields_rate"]["cand"] == 1.0
    assert cj["verdict"] == "pass"  # frozen: every output has "intent" (rate 1.0 >= floor 0.9)
    assert cj["verdict_edited"] == "fail"  # edited: 5 of 10 have both keys, 0.5 < 0.9
    guard = next(v for v in c["alternative"]["verdicts"] if v["kind"] == "guard")
    assert guard["cand"] == 0.5 and "below floor 0.9" in guard["detail"]
    assert cj["hypothesis"]["changes"] == [
        {"key": "hypothesis.required_fields", "old": ["intent"], "new": ["intent", "slots"]}
    ]
