"""Paired comparison: McNemar, paired bootstrap, concentration, guards and verdicts."""

import json
import sys
from pathlib import Path

try:
    import tuneproof  # noqa: F401
except ImportError:  # running from a checkout without an installed package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import numpy as np
import pytest

from tuneproof.errors import TuneproofError
from tuneproof.evaluation.compare import judge, mcnemar_exact, overall_verdict, paired_compare
from tuneproof.evaluation.metrics import score_classification
from tuneproof.study import Eval, Hypothesis

EVAL = Eval()


def _hyp(metric="accuracy", min_gain=0.0, guards=(), task="classification"):
    return Hypothesis(behaviour="b", task=task, success={"metric": metric, "min_gain": min_gain}, guards=list(guards))


def _cls_pair(table):
    """table: list of (class, n, base_right, cand_right) groups -> (base, cand) records."""
    base, cand = [], []
    k = 0
    for cls, n, b_ok, c_ok in table:
        wrong = "B" if cls == "A" else "A"
        for _ in range(n):
            rid = f"x{k:04d}"
            base.append({"id": rid, "category": cls, "reference": cls, "prediction": cls if b_ok else wrong})
            cand.append({"id": rid, "category": cls, "reference": cls, "prediction": cls if c_ok else wrong})
            k += 1
    return base, cand


# --------------------------------------------------------------------------- McNemar
def test_mcnemar_exact_hand_computed():
    # 2 * P(X <= 2), X ~ Bin(12, 0.5) = 2 * (1 + 12 + 66) / 4096
    assert mcnemar_exact(10, 2) == pytest.approx(0.03857421875, abs=1e-15)
    assert mcnemar_exact(2, 10) == pytest.approx(0.03857421875, abs=1e-15)
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(3, 3) == 1.0
    assert mcnemar_exact(5, 0) == pytest.approx(2 / 32)


def test_counts_and_mcnemar_in_comparison():
    base, cand = _cls_pair(
        [
            ("A", 10, False, True),
            ("A", 2, True, False),
            ("A", 30, True, True),
            ("B", 5, False, False),
            ("B", 13, True, True),
        ]
    )
    r = paired_compare(base, cand, "classification", required_fields=[], eval_cfg=EVAL, hypothesis=None, iterations=200)
    assert r["counts"] == {"fixed": 10, "broken": 2, "unchanged_right": 43, "unchanged_wrong": 5}
    assert r["fixed_ids"] == [f"x{i:04d}" for i in range(10)]
    assert r["broken_ids"] == ["x0010", "x0011"]
    assert r["mcnemar"]["p_value"] == pytest.approx(0.03857421875)
    assert r["n"] == 60
    assert r["metrics"]["accuracy"]["delta"] == pytest.approx(8 / 60)
    assert r["headline"] == ["accuracy", "macro_f1"]
    assert "verdicts" not in r
    json.dumps(r)  # JSON-ready


# --------------------------------------------------------------------------- bootstrap
def test_paired_bootstrap_ci_contains_true_delta():
    rng = np.random.default_rng(7)
    n = 600
    labels = ["a", "b", "c"]
    refs = [labels[i % 3] for i in range(n)]

    # the candidate is right with probability 0.75, the baseline 0.60, independently: true delta 0.15
    def preds(p):
        return [r if rng.random() < p else labels[(labels.index(r) + 1) % 3] for r in refs]

    bp, cp = preds(0.60), preds(0.75)
    base = [{"id": str(i), "reference": refs[i], "prediction": bp[i]} for i in range(n)]
    cand = [{"id": str(i), "reference": refs[i], "prediction": cp[i]} for i in range(n)]
    r = paired_compare(
        base, cand, "classification", required_fields=[], eval_cfg=EVAL, hypothesis=None, iterations=1000, seed=3
    )
    acc = r["metrics"]["accuracy"]
    lo, hi = acc["ci"]
    assert lo < 0.15 < hi
    assert lo < acc["delta"] < hi
    assert 0.0 < lo and hi - lo < 0.15  # clearly positive, and not absurdly wide
    # the point values are the scorer's (sklearn) values
    assert acc["base"] == score_classification(base)[1]["accuracy"]
    assert r["metrics"]["macro_f1"]["cand"] == pytest.approx(score_classification(cand)[1]["macro_f1"])
    # reproducible for a seed, different for another
    r2 = paired_compare(base, cand, "classification", required_fields=[], eval_cfg=EVAL, iterations=1000, seed=3)
    assert r2["metrics"]["accuracy"]["ci"] == acc["ci"]
    r3 = paired_compare(base, cand, "classification", required_fields=[], eval_cfg=EVAL, iterations=1000, seed=4)
    assert r3["metrics"]["macro_f1"]["ci"] != r["metrics"]["macro_f1"]["ci"]


def test_identical_runs_give_zero_width_ci():
    base, _ = _cls_pair([("A", 20, True, True), ("B", 10, False, False)])
    r = paired_compare(base, base, "classification", required_fields=[], eval_cfg=EVAL, iterations=200)
    for m in r["metrics"].values():
        assert m["delta"] == 0.0 and m["ci"] == [0.0, 0.0]


# --------------------------------------------------------------------------- pairing errors
def test_refuses_different_id_sets():
    base, cand = _cls_pair([("A", 10, True, True)])
    with pytest.raises(TuneproofError, match="2 baseline ids missing from the candidate.*1 candidate ids missing"):
        paired_compare(
            base,
            cand[2:] + [{"id": "new", "reference": "A", "prediction": "A"}],
            "classification",
            required_fields=[],
            eval_cfg=EVAL,
            hypothesis=None,
        )
    with pytest.raises(TuneproofError, match="twice"):
        paired_compare(base + base[:1], cand, "classification", required_fields=[], eval_cfg=EVAL)
    changed = [dict(c) for c in cand]
    changed[3]["reference"] = "B"
    with pytest.raises(TuneproofError, match="x0003.*different reference"):
        paired_compare(base, changed, "classification", required_fields=[], eval_cfg=EVAL)


# --------------------------------------------------------------------------- guards and verdicts
def test_per_class_recall_guard_fails_when_one_class_collapses_while_macro_f1_rises():
    # A and B go from recall 1/3 to 1.0; C collapses from 0.9 to 0.0 (answered A)
    base, cand = [], []
    for cls, b_right, c_right in [("A", 10, 30), ("B", 10, 30), ("C", 27, 0)]:
        for i in range(30):
            wrong_b = "B" if cls == "A" else "A"
            wrong_c = "A" if cls == "C" else wrong_b
            base.append({"id": f"{cls}{i}", "reference": cls, "prediction": cls if i < b_right else wrong_b})
            cand.append({"id": f"{cls}{i}", "reference": cls, "prediction": cls if i < c_right else wrong_c})
    hyp = _hyp(
        "macro_f1", 0.0, [{"metric": "per_class_recall", "max_drop": 0.05}, {"metric": "macro_f1", "max_drop": 0.05}]
    )
    r = paired_compare(base, cand, "classification", required_fields=[], eval_cfg=EVAL, hypothesis=hyp, iterations=500)
    assert r["metrics"]["macro_f1"]["delta"] > 0.02  # the global average rises
    guard = r["verdicts"][1]
    assert guard["kind"] == "guard" and guard["metric"] == "per_class_recall"
    assert guard["verdict"] == "fail"
    assert guard["detail"].startswith("failing classes: C ")
    assert "A (" not in guard["detail"] and "B (" not in guard["detail"]
    assert (guard["base"], guard["cand"], guard["delta"]) == (pytest.approx(0.9), 0.0, pytest.approx(-0.9))
    assert {it["name"]: it["verdict"] for it in guard["items"]} == {"A": "pass", "B": "pass", "C": "fail"}
    assert r["per_class"]["C"]["recall"]["ci"][1] < -0.05
    assert r["overall"]["verdict"] == "fail"
    assert "per_class_recall" in r["overall"]["detail"]


def _fake(metric_entries, per_class=None):
    return {"task": "classification", "metrics": metric_entries, "per_class": per_class or {}, "per_field": {}}


def _e(base, cand, lo, hi):
    return {"base": base, "cand": cand, "delta": cand - base, "ci": [lo, hi]}


@pytest.mark.parametrize(
    "ci, expected", [((0.03, 0.10), "pass"), ((-0.05, 0.01), "fail"), ((0.0, 0.05), "inconclusive")]
)
def test_success_rule(ci, expected):
    v = judge(_hyp("accuracy", 0.02), _fake({"accuracy": _e(0.5, 0.55, *ci)}))
    assert v[0]["verdict"] == expected and v[0]["threshold"] == 0.02 and v[0]["ci"] == list(ci)


@pytest.mark.parametrize(
    "ci, expected", [((-0.05, -0.02), "fail"), ((-0.005, 0.02), "pass"), ((-0.03, 0.01), "inconclusive")]
)
def test_guard_max_drop_rule(ci, expected):
    v = judge(
        _hyp("accuracy", 0.0, [{"metric": "macro_f1", "max_drop": 0.01}]),
        _fake({"accuracy": _e(0.5, 0.6, 0.05, 0.15), "macro_f1": _e(0.5, 0.49, *ci)}),
    )
    assert v[1]["verdict"] == expected and v[1]["threshold"] == -0.01


def test_guard_floor_and_overall():
    res = _fake({"accuracy": _e(0.5, 0.6, 0.05, 0.15), "macro_f1": _e(0.85, 0.86, -0.01, 0.03)})
    v = judge(_hyp("accuracy", 0.0, [{"metric": "macro_f1", "max_drop": None, "floor": 0.9}]), res)
    assert v[1]["verdict"] == "fail" and "below floor 0.9" in v[1]["detail"]
    assert overall_verdict(v)["verdict"] == "fail"
    v = judge(_hyp("accuracy", 0.0, [{"metric": "macro_f1", "max_drop": 0.0, "floor": 0.8}]), res)
    assert v[1]["verdict"] == "inconclusive"
    assert overall_verdict(v)["verdict"] == "pass"  # success passes and no guard fails
    v = judge(_hyp("accuracy", 0.1, [{"metric": "macro_f1", "max_drop": 0.05}]), res)
    assert [x["verdict"] for x in v] == ["inconclusive", "pass"]
    assert overall_verdict(v)["verdict"] == "inconclusive"


def test_unknown_metrics_name_the_study_key():
    res = _fake({"accuracy": _e(0.5, 0.6, 0.05, 0.15)}, per_class={"A": {"recall": _e(0.5, 0.6, 0.0, 0.2)}})
    with pytest.raises(TuneproofError, match="hypothesis.success.metric: metric 'field_f1'"):
        judge(_hyp("field_f1"), res)
    with pytest.raises(TuneproofError, match=r"hypothesis.guards\[0\].metric: 'per_field_f1'"):
        judge(_hyp("accuracy", 0.0, [{"metric": "per_field_f1", "max_drop": 0.0}]), res)
    # a guard that writes no condition is refused when the study is read (no silent max_drop 0.0)
    with pytest.raises(ValueError, match=r"guard on 'accuracy' sets neither max_drop nor floor"):
        _hyp("accuracy", 0.0, [{"metric": "accuracy", "max_drop": None}])


# --------------------------------------------------------------------------- concentration
def test_concentration_flags_a_handful_of_examples():
    base, cand = _cls_pair([("A", 6, False, True), ("A", 44, True, True), ("B", 50, True, True)])
    r = paired_compare(base, cand, "classification", required_fields=[], eval_cfg=EVAL, iterations=100)
    c = r["concentration"]
    assert c["net_gain"] == 6 and c["top_k"] == 5
    assert c["flag_examples"] is True and c["top_share"] == pytest.approx(5 / 6)
    assert c["top_ids"] == ["x0000", "x0001", "x0002", "x0003", "x0004"]
    assert c["flag_class"] is True and c["top_class"] == "A"


def test_concentration_not_flagged_for_broad_gain():
    base, cand = _cls_pair(
        [("A", 20, False, True), ("A", 30, True, True), ("B", 20, False, True), ("B", 30, True, True)]
    )
    c = paired_compare(base, cand, "classification", required_fields=[], eval_cfg=EVAL, iterations=100)["concentration"]
    assert c["net_gain"] == 40 and c["by_class"] == {"A": 20.0, "B": 20.0}
    assert c["flagged"] is False and c["detail"] == "gain not concentrated"


# --------------------------------------------------------------------------- extraction and format
def _x(intent, **slots):
    return json.dumps({"intent": intent, "slots": slots})


def test_extraction_comparison_per_field_and_guards():
    base, cand = [], []
    for i in range(40):
        intent = "PlayMusic" if i % 2 else "GetWeather"
        ref = _x(intent, artist="Queen") if intent == "PlayMusic" else _x(intent, city="Paris", when="today")
        # baseline: right, but half of the outputs are fenced (invalid under strict JSON, docs/CASES.md C16)
        base_pred = "```json\n" + ref + "\n```" if i % 4 in (0, 1) else ref
        # candidate: always valid JSON, but drops the 'when' slot everywhere
        cand_pred = ref if intent == "PlayMusic" else _x(intent, city="Paris")
        base.append({"id": f"e{i:02d}", "category": intent, "reference": ref, "prediction": base_pred})
        cand.append({"id": f"e{i:02d}", "category": intent, "reference": ref, "prediction": cand_pred})
    hyp = _hyp(
        "json_valid_rate",
        0.1,
        [{"metric": "per_field_f1", "max_drop": 0.1}, {"metric": "required_fields_rate", "max_drop": 0.0}],
        task="extraction",
    )
    r = paired_compare(
        base, cand, "extraction", required_fields=["intent", "slots"], eval_cfg=EVAL, hypothesis=hyp, iterations=300
    )
    m = r["metrics"]
    assert m["json_valid_rate"]["base"] == 0.5 and m["json_valid_rate"]["cand"] == 1.0
    assert r["base_metrics"]["parse_errors"] == {"code_fence": 20} and r["cand_metrics"]["parse_errors"] == {}
    assert r["headline"] == ["json_valid_rate", "required_fields_rate", "field_f1", "exact_match", "intent_accuracy"]
    assert m["exact_match"]["base"] == 0.5 and m["exact_match"]["cand"] == 0.5
    # 'when': base tp 10 / fn 10 -> F1 2/3; candidate never predicts it -> 0
    assert r["per_field"]["when"]["f1"]["base"] == pytest.approx(2 / 3) and r["per_field"]["when"]["f1"]["cand"] == 0.0
    assert r["per_field"]["when"]["f1"]["ci"][1] < -0.1
    assert r["per_field"]["artist"]["f1"]["delta"] == pytest.approx(1 / 3)
    assert r["per_field"]["city"]["f1"]["support"] == 20
    assert r["per_class"]["GetWeather"]["exact_match"]["cand"] == 0.0
    verdicts = {v["metric"]: v for v in r["verdicts"]}
    assert verdicts["json_valid_rate"]["verdict"] == "pass"
    assert verdicts["per_field_f1"]["verdict"] == "fail"
    assert verdicts["per_field_f1"]["detail"].startswith("failing fields: when ")
    assert {it["name"]: it["verdict"] for it in verdicts["per_field_f1"]["items"]} == {
        "artist": "pass",
        "city": "pass",
        "when": "fail",
    }
    assert verdicts["required_fields_rate"]["verdict"] == "pass"
    assert r["overall"]["verdict"] == "fail"
    # paired counts follow the success metric (json_valid_rate): the 20 fenced outputs became valid
    assert r["counts_basis"]["rule"] == "json_valid"
    assert r["counts"] == {"fixed": 20, "broken": 0, "unchanged_right": 20, "unchanged_wrong": 0}
    # second line, exact match: fenced PlayMusic fixed, plain GetWeather broken
    assert r["counts_correct"] == {"fixed": 10, "broken": 10, "unchanged_right": 10, "unchanged_wrong": 10}
    assert r["mcnemar"]["p_value"] == pytest.approx(2 / 2**20) and r["mcnemar_correct"]["p_value"] == 1.0
    assert r["concentration"]["basis"] == "json_valid" and r["concentration"]["net_gain"] == 20


def test_format_comparison():
    base = [{"id": str(i), "reference": "A: 1", "prediction": "a: 1" if i < 8 else "A: 1"} for i in range(20)]
    cand = [{"id": str(i), "reference": "A: 1", "prediction": "A: 1"} for i in range(20)]
    r = paired_compare(
        base,
        cand,
        "format",
        required_fields=[],
        eval_cfg=Eval(regex=r"[A-Z]: \d+"),
        hypothesis=_hyp("compliance_rate", 0.1, task="format"),
        iterations=300,
    )
    assert r["headline"] == ["compliance_rate", "regex_match_rate", "exact_match"]
    assert r["metrics"]["compliance_rate"]["delta"] == pytest.approx(0.4)
    assert r["counts"]["fixed"] == 8 and r["mcnemar"]["p_value"] == pytest.approx(2 / 256)
    assert r["overall"]["verdict"] == "pass"


def test_extraction_targets_without_intent_group_by_category():
    ref = json.dumps({"slots": {"city": "Paris"}})
    base = [
        {
            "id": str(i),
            "category": "weather" if i < 6 else "travel",
            "reference": ref,
            "prediction": "{}" if i < 3 else ref,
        }
        for i in range(10)
    ]
    cand = [
        {"id": str(i), "category": "weather" if i < 6 else "travel", "reference": ref, "prediction": ref}
        for i in range(10)
    ]
    r = paired_compare(
        base,
        cand,
        "extraction",
        required_fields=["slots"],
        eval_cfg=EVAL,
        hypothesis=_hyp("field_f1", 0.0, [{"metric": "per_class_exact_match", "max_drop": 0.0}], task="extraction"),
        iterations=200,
    )
    assert (
        "intent_accuracy" not in r["metrics"]
    )  # no reference has an intent: not scored on it (a missing value never matches)
    assert (
        r["per_class"]["weather"]["exact_match"]["base"] == 0.5
        and r["per_class"]["weather"]["exact_match"]["cand"] == 1.0
    )
    assert r["metrics"]["field_f1"]["base"] == pytest.approx(2 * 7 / (2 * 7 + 3))
    assert r["concentration"]["basis"] == "field_f1" and r["concentration"]["by_class"] == {
        "weather": 3.0,
        "travel": 0.0,
    }
    assert r["concentration"]["flag_class"] is True
    assert [v["verdict"] for v in r["verdicts"]] == ["pass", "pass"]


def test_explicit_label_set_keeps_predictions_of_absent_classes_valid():
    base = [{"id": str(i), "reference": "A", "prediction": "C"} for i in range(4)]
    cand = [{"id": str(i), "reference": "A", "prediction": "A" if i else "C"} for i in range(4)]
    r = paired_compare(
        base, cand, "classification", required_fields=[], eval_cfg=EVAL, iterations=100, labels=["A", "B", "C"]
    )
    assert r["base_metrics"]["n_invalid"] == 0 and r["base_metrics"]["labels"] == ["A", "B", "C"]
    assert r["metrics"]["accuracy"]["cand"] == 0.75 and r["counts"]["fixed"] == 3
    r2 = paired_compare(base, cand, "classification", required_fields=[], eval_cfg=EVAL, iterations=100)
    assert r2["base_metrics"]["n_invalid"] == 4  # "C" is outside the reference label set
