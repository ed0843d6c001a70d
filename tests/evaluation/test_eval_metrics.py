"""Metrics: strict JSON, classification (docs/CASES.md C15), extraction, format, target check (docs/CASES.md C16)."""

import json
import sys
from pathlib import Path

try:
    import tuneproof  # noqa: F401
except ImportError:  # running from a checkout without an installed package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import pytest

from tuneproof.data.examples import Example
from tuneproof.errors import TuneproofError
from tuneproof.evaluation.metrics import (
    check_targets_json,
    score,
    score_classification,
    score_extraction,
    score_format,
)
from tuneproof.study import Eval
from tuneproof.tasks.parsing import parse_json_output

REF = json.dumps({"intent": "PlayMusic", "slots": {"artist": "Queen", "genre": ["rock", "pop"]}})


# --------------------------------------------------------------------------- strict JSON
def test_parse_json_output_strict():
    assert parse_json_output(' {"a": [1, 2]}\n') == ({"a": [1, 2]}, None)
    assert parse_json_output("null") == (None, None)  # valid JSON null: reason is None
    obj, why = parse_json_output("{'intent': 'X', 'ok': True}")
    assert obj is None and why.startswith("python_literal:")
    assert "line 1 column 2" in why
    for bad, kind in [
        ("", "empty"),
        ("   ", "empty"),
        ("NaN", "not_json"),
        ('{"a": Infinity}', "not_json"),
        ('Here it is: {"a": 1}', "not_json"),
        ('{"a": 1', "not_json"),
    ]:
        obj, why = parse_json_output(bad)
        assert obj is None and why.split(":")[0] == kind, (bad, why)


def test_code_fence_is_invalid_unless_allowed():
    fenced = '```json\n{"intent": "X", "slots": {}}\n```'
    obj, why = parse_json_output(fenced)
    assert obj is None and why.startswith("code_fence:")
    assert parse_json_output(fenced, allow_fenced=True) == ({"intent": "X", "slots": {}}, None)
    assert parse_json_output("```\n[1]\n```", allow_fenced=True) == ([1], None)
    assert parse_json_output('```json\n{"a": 1}', allow_fenced=True)[1].startswith("code_fence:")


# --------------------------------------------------------------------------- classification
def _c15_records():
    return [{"id": str(i), "category": None, "reference": "0" if i < 50 else "1", "prediction": "0"} for i in range(68)]


def test_c15_majority_class_metrics():
    recs, m = score_classification(_c15_records())
    assert m["n"] == 68
    assert m["accuracy"] == pytest.approx(50 / 68) and round(m["accuracy"], 3) == 0.735
    assert m["per_class"]["1"]["recall"] == 0.0
    assert m["per_class"]["1"]["support"] == 18
    assert m["per_class"]["0"]["recall"] == 1.0
    assert m["per_class"]["0"]["precision"] == pytest.approx(50 / 68)
    assert m["macro_f1"] == pytest.approx(25 / 59) and round(m["macro_f1"], 4) == 0.4237
    assert m["weighted_f1"] == pytest.approx(50 / 68 * 100 / 118)
    assert list(m["per_class"]["0"])[0] == "recall"  # per-class recall shown first (docs/CASES.md C15)
    assert "macro over 2 of 2 labels present" in m["averaging"]["macro_f1"]
    assert m["confusion"] == {
        "labels": ["0", "1"],
        "columns": ["0", "1", "<invalid>"],
        "matrix": [[50, 0, 0], [18, 0, 0]],
    }
    assert sum(r["correct"] for r in recs) == 50


def test_classification_invalid_predictions_are_wrong():
    recs = [
        {"id": "a", "reference": "pos", "prediction": " pos\n"},
        {"id": "b", "reference": "neg", "prediction": "Negative"},
        {"id": "c", "reference": "neg", "prediction": "neg"},
        {"id": "d", "reference": "pos", "prediction": "neg"},
    ]
    out, m = score_classification(recs)
    assert [r["correct"] for r in out] == [True, False, True, False]
    assert out[1]["scores"] == {"valid_label": False}
    assert "correct" not in recs[0]  # inputs untouched
    assert m["accuracy"] == 0.5 and m["n_invalid"] == 1 and m["invalid_rate"] == 0.25
    assert m["confusion"]["matrix"] == [[1, 0, 1], [1, 1, 0]]  # rows neg, pos
    # micro-F1 over the labels: tp=2, predicted=3, support=4 -> 4/7 (an <invalid> is only a false negative)
    assert m["micro_f1"] == pytest.approx(4 / 7)
    assert m["per_class"]["neg"]["recall"] == 0.5 and m["per_class"]["neg"]["precision"] == 0.5


def test_classification_label_errors():
    with pytest.raises(TuneproofError, match="not in the label set"):
        score_classification([{"id": "a", "reference": "x", "prediction": "x"}], labels=["y"])
    with pytest.raises(TuneproofError, match="empty"):
        score_classification([])
    # a class of the label set with support 0 in the split is left out of the macro average
    _, m = score_classification([{"id": "a", "reference": "x", "prediction": "x"}], labels=["x", "y"])
    assert (
        m["macro_f1"] == 1.0
        and m["labels_present"] == 1
        and m["macro_over"] == "macro over 1 of 2 labels present (support > 0)"
    )


# --------------------------------------------------------------------------- extraction
def _extraction_records():
    return [
        # exact after normalisation: case, whitespace, order of a repeated slot's values
        {
            "id": "a",
            "category": "PlayMusic",
            "reference": REF,
            "prediction": '{"intent": "PlayMusic", "slots": {"artist": " queen", "genre": ["POP", "rock"]}}',
        },
        # one right pair, one hallucinated slot, genre missing
        {
            "id": "b",
            "category": "PlayMusic",
            "reference": REF,
            "prediction": '{"intent": "PlayMusic", "slots": {"artist": "Queen", "album": "x"}}',
        },
        # Python-dict style: invalid, every reference pair is a false negative
        {"id": "c", "category": "PlayMusic", "reference": REF, "prediction": "{'intent': 'PlayMusic', 'slots': {}}"},
    ]


def test_extraction_hand_computed():
    recs, m = score_extraction(_extraction_records(), ["intent", "slots"])
    assert [r["correct"] for r in recs] == [True, False, False]
    assert m["json_valid_rate"] == pytest.approx(2 / 3)
    assert m["required_fields_rate"] == pytest.approx(2 / 3)
    assert m["intent_accuracy"] == pytest.approx(2 / 3)
    assert m["exact_match"] == pytest.approx(1 / 3)
    assert (m["tp"], m["fp"], m["fn"]) == (4, 1, 5)
    assert m["field_precision"] == pytest.approx(4 / 5)
    assert m["field_recall"] == pytest.approx(4 / 9)
    assert m["field_f1"] == pytest.approx(8 / 14)
    assert m["per_field"]["artist"] == pytest.approx(
        {"precision": 1.0, "recall": 2 / 3, "f1": 0.8, "support": 3, "exact_match_rate": 2 / 3}
    )
    assert m["per_field"]["genre"]["recall"] == pytest.approx(2 / 6)
    assert m["per_field"]["genre"]["support"] == 6
    assert m["unknown_predicted_fields"] == {"album": 1}
    assert m["parse_errors"] == {"python_literal": 1}
    pc = m["per_class"]["PlayMusic"]
    assert pc["support"] == 3 and pc["recall"] == pytest.approx(2 / 3) and pc["exact_match"] == pytest.approx(1 / 3)
    assert pc["field_f1"] == pytest.approx(8 / 14)
    s = recs[2]["scores"]
    assert s["json_valid"] is False and s["parse_error"].startswith("python_literal")
    assert (s["tp"], s["fp"], s["fn"]) == (0, 0, 3) and s["required_present"] is False
    assert recs[1]["scores"]["fields"] == {"artist": [1, 0, 0], "genre": [0, 0, 2], "album": [0, 1, 0]}


def test_extraction_required_fields_and_non_objects():
    recs = [
        {"id": "a", "reference": REF, "prediction": '{"intent": "PlayMusic"}'},
        {"id": "b", "reference": REF, "prediction": '["PlayMusic"]'},
    ]
    out, m = score_extraction(recs, None)  # default required fields: intent, slots
    assert m["required_fields"] == ["intent", "slots"]
    assert m["json_valid_rate"] == 1.0 and m["required_fields_rate"] == 0.0
    assert m["intent_accuracy"] == 0.5 and m["fn"] == 6
    assert m["parse_errors"] == {"not_object": 1}
    with pytest.raises(TuneproofError, match="example a: the reference is not a strict JSON"):
        score_extraction([{"id": "a", "reference": "{'intent': 'X'}", "prediction": "{}"}], None)


def test_score_dispatch_fenced_json_c16():
    recs = [{"id": "a", "reference": REF, "prediction": "```json\n" + REF + "\n```"}]
    _, strict = score("extraction", recs, required_fields=["intent", "slots"], eval_cfg=Eval())
    assert strict["json_valid_rate"] == 0.0 and strict["parse_errors"] == {"code_fence": 1}
    _, lenient = score("extraction", recs, required_fields=[], eval_cfg=Eval(allow_fenced_json=True))
    assert lenient["json_valid_rate"] == 1.0 and lenient["exact_match"] == 1.0
    with pytest.raises(TuneproofError, match="unknown task kind"):
        score("regression", recs, required_fields=[], eval_cfg=None)


# --------------------------------------------------------------------------- format
SCHEMA = {"type": "object", "required": ["answer"], "properties": {"answer": {"type": "integer"}}}


def test_format_schema_and_regex():
    recs = [
        {"id": "a", "category": "q", "reference": '{"answer": 3}', "prediction": '{"answer": 3}'},
        {"id": "b", "category": "q", "reference": '{"answer": 4}', "prediction": '{"answer": "4"}'},
        {"id": "c", "category": "r", "reference": '{"answer": 5}', "prediction": "answer: 5"},
        {"id": "d", "category": "r", "reference": '{"answer": 6}', "prediction": '{ "answer" : 7 }'},
    ]
    out, m = score_format(recs, json_schema=SCHEMA)
    assert m["checks"] == ["json_schema"]
    assert m["json_valid_rate"] == 0.75 and m["schema_valid_rate"] == 0.5 and m["compliance_rate"] == 0.5
    assert m["exact_match"] == 0.25
    assert out[1]["scores"]["schema_error"] == "'4' is not of type 'integer'"
    assert m["per_class"] == {
        "q": {"support": 2, "compliance_rate": 0.5, "exact_match": 0.5},
        "r": {"support": 2, "compliance_rate": 0.5, "exact_match": 0.0},
    }
    _, m2 = score("format", recs, required_fields=None, eval_cfg=Eval(regex=r'\{"answer": \d+\}'))
    assert m2["regex_match_rate"] == 0.25 and m2["compliance_rate"] == 0.25 and "json_valid_rate" not in m2


def test_format_config_errors():
    recs = [{"id": "a", "reference": "x", "prediction": "x"}]
    with pytest.raises(TuneproofError, match="needs a check"):
        score_format(recs)
    with pytest.raises(TuneproofError, match="eval.json_schema"):
        score_format(recs, json_schema={"type": 12})
    with pytest.raises(TuneproofError, match="eval.regex"):
        score_format(recs, regex="(")


# --------------------------------------------------------------------------- data check (docs/CASES.md C16)
def test_check_targets_json_c16():
    examples = [
        Example(
            id="t1",
            text="play queen",
            label="PlayMusic",
            target="{'intent': 'PlayMusic', 'slots': {'artist': 'queen'}, 'ok': True}",
            source="train.jsonl:1",
        ),
        Example(id="t2", text="play abba", label="PlayMusic", target=REF, source="train.jsonl:2"),
    ]
    rep = check_targets_json(examples)
    assert rep["n"] == 2 and rep["n_valid"] == 1 and rep["parse_rate"] == 0.5
    assert rep["passed"] is False
    assert len(rep["bad"]) == 1
    bad = rep["bad"][0]
    assert bad["id"] == "t1" and bad["source"] == "train.jsonl:1"
    assert bad["error"].startswith("python_literal:")
    rep2 = check_targets_json(examples[1:], required_fields=["intent", "slots", "domain"])
    assert rep2["parse_rate"] == 1.0 and rep2["n_missing_fields"] == 1 and not rep2["passed"]
    assert "domain" in rep2["bad"][0]["error"]


def test_references_outside_the_label_set_are_counted_and_the_first_five_named():
    recs = [
        {"id": f"valid:{i}", "reference": "crad" if i in (3, 5, 6, 9, 12, 14, 17) else "card", "prediction": "card"}
        for i in range(2, 19)
    ]
    with pytest.raises(TuneproofError) as err:
        score_classification(recs, labels=["card", "lost"])
    assert str(err.value).splitlines()[0] == (
        "7 reference labels not in the label set (2 labels): valid:3 'crad', valid:5 'crad', "
        "valid:6 'crad', valid:9 'crad', valid:12 'crad' and 2 more"
    )
