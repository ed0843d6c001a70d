"""Scoring rules with exact values, docs/CASES.md C20 among them."""

from __future__ import annotations

import json

import pytest

from tuneproof.data.examples import Example
from tuneproof.evaluation.compare import judge, paired_compare
from tuneproof.evaluation.metrics import score_extraction, score_format, score_multilabel
from tuneproof.recipes.compare import summary_lines
from tuneproof.study import Eval, Hypothesis
from tuneproof.tasks import TaskConfig, get_task


def _hyp(metric, min_gain=0.0, guards=(), task="classification"):
    return Hypothesis(behaviour="b", task=task, success={"metric": metric, "min_gain": min_gain}, guards=list(guards))


# --------------------------------------------------------------------- docs/CASES.md C20: a missing value never matches
C20_PREDS = ["{}", '{"slots": {}}', '{"intent": ["c"]}', '{"intent": ["b", "a"]}']


def test_c20_extraction_list_intent_exactly_one_right():
    ref = json.dumps({"intent": ["a", "b"]})
    recs = [{"id": str(i), "reference": ref, "prediction": p} for i, p in enumerate(C20_PREDS)]
    out, m = score_extraction(recs, required_fields=["intent"])
    assert [r["correct"] for r in out] == [False, False, False, True]
    assert m["intent_accuracy"] == 0.25 and m["exact_match"] == 0.25
    assert [r["scores"]["intent_correct"] for r in out] == [False, False, False, True]
    # set-valued intent: per-label P/R/F1, micro and macro over the intent labels
    assert m["intent_micro_f1"] == pytest.approx(2 * 2 / (2 * 2 + 1 + 6))  # tp 2, fp 1 (c), fn 6
    assert m["per_class"]["a"]["recall"] == 0.25 and m["per_class"]["a"]["precision"] == 1.0
    assert (
        m["intent_macro_f1"] == pytest.approx(0.4)
        and m["intent_macro_over"] == "macro over 2 of 2 intent labels present (support > 0)"
    )


def test_c20_multilabel_exactly_one_right():
    recs = [
        {"id": str(i), "reference": '["a", "b"]', "prediction": p}
        for i, p in enumerate(["{}", '{"slots": {}}', '["c"]', '["b", "a"]'])
    ]
    out, m = score_multilabel(recs)
    assert [r["correct"] for r in out] == [False, False, False, True]
    assert m["exact_set_match"] == 0.25 and m["json_valid_rate"] == 0.5
    assert m["unknown_predicted_labels"] == {"c": 1}


def test_multilabel_per_label_micro_macro_hand_computed():
    refs = ['["a", "b"]', '["a"]', '["c"]']
    preds = ['["a"]', '["c", "a"]', "[]"]
    out, m = score_multilabel(
        [{"id": str(i), "reference": r, "prediction": p} for i, (r, p) in enumerate(zip(refs, preds))],
        labels=["a", "b", "c", "d"],
    )
    assert m["per_class"]["a"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 2}
    assert (
        m["per_class"]["b"]["f1"] == 0.0
        and m["per_class"]["c"]["precision"] == 0.0
        and m["per_class"]["d"]["support"] == 0
    )
    assert m["micro_precision"] == pytest.approx(2 / 3) and m["micro_recall"] == pytest.approx(0.5)
    assert m["micro_f1"] == pytest.approx(4 / 7)
    assert m["macro_f1"] == pytest.approx(1 / 3) and m["macro_over"] == "macro over 3 of 4 labels present (support > 0)"
    assert m["exact_set_match"] == 0.0
    assert [r["scores"]["example_f1"] for r in out] == pytest.approx([2 / 3, 2 / 3, 0.0])


def test_multilabel_audit_support_per_label_and_cardinality():
    def ex(i, labs):
        return Example(id=f"x{i}", text=f"t{i}", target=json.dumps(labs), source=f"d.jsonl:{i}")

    splits = {
        "train": [ex(1, ["a", "b"]), ex(2, ["a"]), ex(3, ["b", "c", "a"])],
        "validation": [ex(4, ["a"]), ex(5, ["d"]), ex(6, [])],
    }
    rep = get_task("multi-label").audit(splits, TaskConfig.make())
    ls = rep["label_sets"]
    assert ls["support"] == {"train": {"a": 3, "b": 2, "c": 1}, "validation": {"a": 1, "d": 1}}
    assert ls["cardinality"]["train"] == {"mean": 2.0, "min": 1, "max": 3, "histogram": {"1": 1, "2": 1, "3": 1}}
    assert ls["cardinality"]["validation"]["histogram"] == {"0": 1, "1": 2}
    assert rep["hard_faults"] == [
        "label 'd' is in validation (1 example: d.jsonl:5) but never in train: the model cannot learn it"
    ]
    assert "label 'b' is in train but not in validation: it is never measured there (support 0)" in rep["warnings"]
    assert "validation: 1 example(s) have an empty label set" in rep["warnings"]


def test_multilabel_paired_comparison_and_per_label_guard():
    refs = ['["a", "b"]'] * 6 + ['["c"]'] * 6
    base = [{"id": str(i), "reference": r, "prediction": r if i < 6 else '["a"]'} for i, r in enumerate(refs)]
    cand = [{"id": str(i), "reference": r, "prediction": '["a"]' if i < 6 else r} for i, r in enumerate(refs)]
    hyp = _hyp("micro_f1", 0.0, [{"metric": "per_class_f1", "max_drop": 0.1}], task="multi-label")
    r = paired_compare(
        base,
        cand,
        "multi-label",
        required_fields=[],
        eval_cfg=Eval(),
        hypothesis=hyp,
        iterations=200,
        labels=["a", "b", "c"],
    )
    assert r["per_class"]["b"]["f1"]["base"] == 1.0 and r["per_class"]["b"]["f1"]["cand"] == 0.0
    assert r["per_class"]["c"]["f1"]["delta"] == 1.0
    g = r["verdicts"][1]
    assert g["verdict"] == "fail" and g["detail"].startswith("failing classes: b (f1 1.0000 -> 0.0000")


# --------------------------------------------------------------------------- zero support, guards as written
def _cls(table):
    base, cand, k = [], [], 0
    for ref, n, bp, cp in table:
        for _ in range(n):
            base.append({"id": f"x{k:03d}", "reference": ref, "prediction": bp})
            cand.append({"id": f"x{k:03d}", "reference": ref, "prediction": cp})
            k += 1
    return base, cand


def test_zero_support_class_is_left_out_of_macro_and_not_measurable_in_guards():
    base, cand = _cls([("A", 10, "A", "A"), ("B", 10, "A", "B")])
    hyp = _hyp("macro_f1", 0.0, [{"metric": "per_class_recall", "max_drop": 0.0}])
    r = paired_compare(
        base,
        cand,
        "classification",
        required_fields=[],
        eval_cfg=Eval(),
        hypothesis=hyp,
        iterations=200,
        labels=["A", "B", "C"],
    )
    assert (
        r["cand_metrics"]["macro_f1"] == 1.0
        and r["cand_metrics"]["macro_over"] == "macro over 2 of 3 labels present (support > 0)"
    )
    g = r["verdicts"][1]
    items = {it["name"]: it for it in g["items"]}
    assert (
        items["C"]["verdict"] == "not measurable" and items["C"]["detail"] == "not measurable (support 0, needs >= 1)"
    )
    assert g["verdict"] == "pass" and "judged on classes with support >= 1" in g["detail"]
    assert g["detail"].endswith("not measurable (support < 1): C (support 0)")
    assert "macro_f1: macro over 2 of 3 labels present (support > 0)" in "\n".join(summary_lines("r2", "r1", r))
    # 13 classes absent from the split: the detail names 10 and counts the rest; every item is kept
    many = [f"Z{k:02d}" for k in range(13)]
    r = paired_compare(
        base,
        cand,
        "classification",
        required_fields=[],
        eval_cfg=Eval(),
        hypothesis=hyp,
        iterations=50,
        labels=["A", "B", *many],
    )
    g = r["verdicts"][1]
    assert len(g["items"]) == 15
    assert g["detail"].endswith(
        "not measurable (support < 1): "
        + ", ".join(f"{z} (support 0)" for z in many[:10])
        + " and 3 more (in compare.json)"
    )


def test_guard_states_the_minimum_support_it_needs():
    base, cand = _cls([("A", 12, "A", "A"), ("B", 3, "A", "A")])
    hyp = _hyp("accuracy", 0.0, [{"metric": "per_class_recall", "floor": 0.5, "min_support": 5}])
    g = paired_compare(
        base, cand, "classification", required_fields=[], eval_cfg=Eval(), hypothesis=hyp, iterations=100
    )["verdicts"][1]
    assert {it["name"]: it["verdict"] for it in g["items"]} == {"A": "pass", "B": "not measurable"}
    assert (
        g["min_support"] == 5
        and "judged on classes with support >= 5" in g["detail"]
        and "B (support 3)" in g["detail"]
    )
    hyp2 = _hyp("accuracy", 0.0, [{"metric": "per_class_recall", "floor": 0.5, "min_support": 50}])
    g2 = paired_compare(
        base, cand, "classification", required_fields=[], eval_cfg=Eval(), hypothesis=hyp2, iterations=100
    )["verdicts"][1]
    assert g2["verdict"] == "not measurable" and g2["detail"].startswith("not measurable: no class has support >= 50")


def test_floor_alone_does_not_demand_no_drop():
    res = {
        "task": "classification",
        "metrics": {
            "accuracy": {"base": 0.5, "cand": 0.6, "delta": 0.1, "ci": [0.05, 0.15]},
            "macro_f1": {"base": 0.8, "cand": 0.5, "delta": -0.3, "ci": [-0.4, -0.2]},
        },
    }
    v = judge(_hyp("accuracy", 0.0, [{"metric": "macro_f1", "floor": 0.2}]), res)
    assert v[1]["verdict"] == "pass" and v[1]["threshold"] is None and v[1]["name"] == "guard: macro_f1 >= 0.2"
    v = judge(_hyp("accuracy", 0.0, [{"metric": "macro_f1", "floor": 0.2, "max_drop": 0.1}]), res)
    assert v[1]["verdict"] == "fail"


def test_one_class_for_every_example_is_said_on_the_compare_screen():
    base, cand = _cls([("A", 100, "A", "A"), ("B", 100, "B", "A"), ("C", 87, "C", "A")])
    r = paired_compare(base, cand, "classification", required_fields=[], eval_cfg=Eval(), iterations=100)
    d = r["dominant"]
    assert d["flagged"] and (d["class"], d["count"], d["n"]) == ("A", 287, 287)
    lines = summary_lines("r0004", "r0002", r)
    assert "  WARNING: the candidate predicts 'A' for 287 of 287 examples (100%; 34.8% of the references)" in lines
    assert r["dominant_baseline"]["flagged"] is False


# --------------------------------------------------------------------------- counts follow the success metric
FIELD_F1_RULE = (
    "an example passes only when its output is a valid JSON object with every required field "
    "(hypothesis.required_fields) holding a value (not null or empty), and its field F1 (slot/value pairs) is >= 0.5"
)


def test_paired_counts_follow_field_f1_when_exact_match_stays_zero():
    """The quickstart case: field F1 rises from 0, exact match stays 0 for both."""
    base, cand = [], []
    for i in range(35):
        ref = json.dumps({"intent": "PlayMusic", "slots": {"artist": "queen", "album": "jazz", "year": str(1970 + i)}})
        base.append(
            {"id": f"e{i}", "reference": ref, "prediction": "{'intent': 'PlayMusic'}"}
        )  # Python literal: invalid
        # candidate: strict JSON, right intent, 2 of 3 slots (F1 0.8) for 20 examples, 1 of 3 (F1 0.5) for 5, none for
        # 10
        k = 2 if i < 20 else 1 if i < 25 else 0
        slots = dict(list({"artist": "queen", "album": "jazz"}.items())[:k])
        cand.append(
            {"id": f"e{i}", "reference": ref, "prediction": json.dumps({"intent": "PlayMusic", "slots": slots})}
        )
    hyp = _hyp("field_f1", 0.05, task="extraction")
    r = paired_compare(
        base, cand, "extraction", required_fields=["intent", "slots"], eval_cfg=Eval(), hypothesis=hyp, iterations=300
    )
    assert r["metrics"]["exact_match"]["base"] == 0.0 and r["metrics"]["exact_match"]["cand"] == 0.0
    assert r["counts_basis"] == {
        "metric": "field_f1",
        "rule": "field_f1",
        "description": FIELD_F1_RULE,
    }
    assert r["counts"] == {"fixed": 25, "broken": 0, "unchanged_right": 0, "unchanged_wrong": 10}
    assert r["mcnemar"]["p_value"] == pytest.approx(2 / 2**25)
    assert r["counts_correct"] == {"fixed": 0, "broken": 0, "unchanged_right": 0, "unchanged_wrong": 35}
    lines = summary_lines("r0004", "r0002", r)
    assert lines[0].startswith(
        "r0004 vs baseline r0002 on 35 paired examples: fixed 25, broken 0, unchanged right 0, unchanged wrong 10"
    )
    assert lines[1] == "  basis: field_f1: " + FIELD_F1_RULE
    assert lines[2].startswith(
        "  on the per-example `correct` (exact match / right class): fixed 0, "
        "broken 0, unchanged right 0, unchanged wrong 35"
    )


# --------------------------------------------------------------------------- format with a grammar
MR_REF = "inform(name[Dirt: Showdown], release_year[2012], genres[driving/racing, sport])"


def test_grammar_parts_slot_f1_and_valid_but_wrong_outputs():
    preds = [
        "inform(genres[sport, driving/racing], name[dirt: showdown], release_year[2012])",  # same MR, other order
        # duplicated slot
        "inform(name[Dirt: Showdown], name[Dirt: Showdown], release_year[2012], genres[driving/racing, sport])",
        # invented slot
        "inform(name[Dirt: Showdown], release_year[2012], genres[driving/racing, sport], developer[EA])",
        "request(name[Dirt: Showdown])",  # wrong act, 1 of 4 items
        "inform name Dirt",  # not the grammar
    ]
    recs = [{"id": str(i), "reference": MR_REF, "prediction": p} for i, p in enumerate(preds)]
    out, m = score_format(recs, grammar="function_slots")
    assert [r["scores"]["compliant"] for r in out] == [True, True, True, True, False]
    assert [r["correct"] for r in out] == [True, False, False, False, False]
    assert out[1]["scores"]["duplicated_slots"] == ["name"] and out[2]["scores"]["invented_slots"] == ["developer"]
    assert m["grammar_valid_rate"] == 0.8 and m["compliance_rate"] == 0.8 and m["exact_match"] == 0.2
    assert m["function_accuracy"] == 0.6
    # items: ref 4 per example (name, year, 2 genres) -> tp 4+4+4+1+0 = 13, fp 0+1+1+0 = 2, fn 0+0+0+3+4 = 7
    assert m["slot_precision"] == pytest.approx(13 / 15) and m["slot_recall"] == pytest.approx(13 / 20)
    assert m["slot_f1"] == pytest.approx(26 / 35)
    assert m["n_duplicated_slots"] == 1 and m["n_invented_slots"] == 1
    assert m["per_field"]["genres"] == {"precision": 1.0, "recall": 0.6, "f1": 0.75, "support": 10}
    assert m["per_class"]["inform"]["exact_match"] == 0.2 and m["per_class"]["inform"]["support"] == 5
    assert out[4]["scores"]["error"] == "grammar: expected name(slot[value], ...)"


def test_regex_named_groups_give_per_part_accuracy_per_category():
    rx = r"(?P<act>\w+)\((?P<arg>[^)]*)\)"
    recs = [
        {"id": "1", "category": "q", "reference": "ask(time)", "prediction": "ask(time)"},
        {"id": "2", "category": "q", "reference": "ask(date)", "prediction": "ask(time)"},
        {"id": "3", "category": "r", "reference": "tell(date)", "prediction": "say(date)"},
        {"id": "4", "category": "r", "reference": "tell(now)", "prediction": "tell now"},
    ]
    out, m = score_format(recs, regex=rx)
    assert m["per_field"] == {"act": {"accuracy": 0.5, "support": 4}, "arg": {"accuracy": 0.5, "support": 4}}
    assert m["part_accuracy"] == 0.5 and m["regex_match_rate"] == 0.75 and m["exact_match"] == 0.25
    assert m["per_class"]["q"]["part_accuracy"] == 0.75 and m["per_class"]["r"]["part_accuracy"] == 0.25
    assert [r["scores"]["parts"] for r in out][2] == {"act": False, "arg": True}


def _mr_examples(targets):
    return [Example(id=f"v{i}", text=f"s{i}", target=t, source=f"viggo.jsonl:{i + 1}") for i, t in enumerate(targets)]


def test_data_check_validates_gold_targets_against_the_grammar_not_json():
    cfg = TaskConfig.make(eval_cfg=Eval(grammar="function_slots"))
    good = _mr_examples([MR_REF, "request(specifier[exciting])", "confirm(name[Halo])"])
    rep = get_task("format").audit({"train": good, "validation": good[:1]}, cfg)
    assert rep["hard_faults"] == [] and rep["targets"]["parse_rate"] == 1.0 and rep["targets"]["n"] == 4
    mixed = _mr_examples([MR_REF, "request(specifier[exciting]", "confirm(name[Halo])"])
    rep = get_task("format").audit({"train": mixed}, cfg)
    assert rep["targets"]["parsed"] == 2 and rep["targets"]["parse_rate"] == pytest.approx(2 / 3)
    assert rep["hard_faults"] == [
        "1 of 3 gold targets fail the format rule (eval.grammar function_slots; parse rate 66.7%): "
        "viggo.jsonl:2 (grammar: expected name(slot[value], ...))"
    ]
    rx = TaskConfig.make(eval_cfg=Eval(regex=r"\{.*\}"))
    rep = get_task("format").audit({"train": good}, rx)
    assert rep["hard_faults"][0].startswith(
        "the format rule (eval.regex '\\\\{.*\\\\}') matches none of the 3 gold targets: viggo.jsonl:1"
    )


def test_zero_support_class_is_neither_weak_nor_regressed_in_the_limits():
    from tuneproof.deliver.limits import observed_limits

    base, cand = _cls([("A", 10, "A", "A"), ("B", 10, "B", "A")])
    r = paired_compare(
        base, cand, "classification", required_fields=[], eval_cfg=Eval(), iterations=100, labels=["A", "B", "C"]
    )
    lim = observed_limits("classification", eval_metrics=r["cand_metrics"], outputs=[], comparison=r, test_accesses=[])
    assert [(x["name"], x["cand"]) for x in lim["weak"]] == [("B", 0.0)]  # C (support 0) is not listed
    assert [x["name"] for x in lim["regressed"]] == ["B"]
    lim2 = observed_limits(
        "classification", eval_metrics=r["cand_metrics"], outputs=[], comparison=None, test_accesses=[]
    )
    assert [x["name"] for x in lim2["weak"]] == ["B"]


def test_init_format_writes_a_grammar_template_with_named_parts(tmp_path):
    import yaml

    from tuneproof.context import load_study
    from tuneproof.recipes.init import run_init

    path = run_init(tmp_path / "mr", "format")
    s = load_study(path)
    assert s.eval.grammar == "function_slots" and s.hypothesis.success.metric == "slot_f1"
    assert [g.metric for g in s.hypothesis.guards] == [
        "grammar_valid_rate",
        "per_class_exact_match",
        "function_accuracy",
    ]
    assert s.hypothesis.guards[2].max_drop is None and s.hypothesis.guards[2].floor == 0.5  # floor alone: no drop rule
    text = path.read_text()
    assert "# regex: '(?P<act>\\w+)\\((?P<slots>.*)\\)'" in text and "min_support: 10" in text
    assert yaml.safe_load(text)["hypothesis"]["guards"][1]["min_support"] == 10


def test_a_list_valued_label_in_a_classification_study_names_the_multi_label_task():
    ex = [
        Example(id=f"x{i}", text=f"t{i}", label=json.dumps(["a", "b"]) if i == 2 else "a", source=f"d.jsonl:{i + 1}")
        for i in range(4)
    ]
    rep = get_task("classification").audit({"train": ex}, TaskConfig.make())
    assert rep["hard_faults"][0] == (
        "1 label(s) are lists, e.g. d.jsonl:3: a set of labels per example is a multi-label task "
        "(set hypothesis.task: multi-label)"
    )


def test_init_says_what_the_reader_expects(tmp_path, capsys):
    from tuneproof.cli import main

    with pytest.raises(SystemExit) as e:
        main(["init", str(tmp_path / "ml"), "--task", "multi-label"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert (
        "multi-label: target: data.fields.target: a list of labels (a JSON array, or a list in JSON/JSONL sources)"
        in out
    )


def test_a_grammar_metric_without_the_grammar_says_which_key_it_needs():
    import yaml

    from tuneproof.context import parse_study
    from tuneproof.errors import TuneproofError
    from tuneproof.recipes.init import template_text

    raw = yaml.safe_load(template_text("format"))
    raw["eval"]["grammar"] = None
    raw["eval"]["regex"] = r"(?P<act>\w+)\((?P<slots>.*)\)"
    with pytest.raises(
        TuneproofError,
        match=r"hypothesis.success.metric: 'slot_f1' is not a metric of task 'format' "
        r"\(a format study reports it only when eval.grammar is set\)",
    ):
        parse_study(raw)
    raw["hypothesis"]["success"]["metric"] = "part_accuracy"
    raw["hypothesis"]["guards"] = [{"metric": "per_field_accuracy", "max_drop": 0.1}]
    assert parse_study(raw).hypothesis.success.metric == "part_accuracy"


def test_show_fixed_follows_the_success_metric_rule():
    from tuneproof.recipes.show import select

    ref = json.dumps({"intent": "PlayMusic", "slots": {"artist": "queen", "album": "jazz"}})
    base = [{"id": f"e{i}", "reference": ref, "prediction": "not json"} for i in range(3)]
    cand = [
        {
            "id": f"e{i}",
            "reference": ref,
            "prediction": json.dumps({"intent": "PlayMusic", "slots": {"artist": "queen"} if i else {}}),
        }
        for i in range(3)
    ]
    kind, cfg = get_task("extraction"), TaskConfig.make(["intent", "slots"])
    base, _ = kind.score(base, cfg)
    cand, _ = kind.score(cand, cfg)
    assert select(base, cand, fixed=True) == []  # exact match stays 0: nothing "fixed" on `correct`
    rule = kind.example_rule("field_f1")
    assert [r["id"] for _, r in select(base, cand, fixed=True, passing=rule.passing)] == [
        "e1",
        "e2",
    ]  # field F1 0.667 >= 0.5


# --------------------------------------------------------------------------- an empty answer is never fixed
NO_SLOTS = json.dumps({"intent": "GetWeather", "slots": {}})
TWO_SLOTS = json.dumps({"intent": "PlayMusic", "slots": {"artist": "queen", "album": "jazz"}})


def _pm(**slots):
    return json.dumps({"intent": "PlayMusic", "slots": slots})


# (reference, prediction, per-example field F1 as scored, answered, passes the field F1 rule)
EXTRACTION_CASES = [
    (NO_SLOTS, "{}", 1.0, False, False),  # empty: nothing to find, nothing said
    (NO_SLOTS, '{"intent": null, "slots": {}}', 1.0, False, False),
    (NO_SLOTS, '{"intent": "", "slots": {}}', 1.0, False, False),
    (NO_SLOTS, '{"intent": [], "slots": {}}', 1.0, False, False),
    (NO_SLOTS, '{"intent": "GetWeather"}', 1.0, False, False),  # slots missing
    (NO_SLOTS, '{"intent": "GetWeather", "slots": "none"}', 1.0, False, False),  # slots not an object
    (NO_SLOTS, "{'intent': 'GetWeather', 'slots': {}}", 0.0, False, False),  # Python literal: invalid JSON
    (NO_SLOTS, '```json\n{"intent": "GetWeather", "slots": {}}\n```', 0.0, False, False),  # fenced: invalid
    (NO_SLOTS, "", 0.0, False, False),
    (NO_SLOTS, '{"intent": "GetWeather", "slots": {}}', 1.0, True, True),  # the right empty-slot answer
    (TWO_SLOTS, "{}", 0.0, False, False),
    (TWO_SLOTS, _pm(artist="queen"), 2 / 3, True, True),  # subset: tp 1, fn 1
    (TWO_SLOTS, json.dumps({"slots": {"artist": "queen", "album": "jazz"}}), 1.0, False, False),  # no intent
    (TWO_SLOTS, _pm(artist="queen", album="jazz", year="1975", genre="rock"), 2 / 3, True, True),  # superset: fp 2
    (TWO_SLOTS, _pm(artist="queen", album="jazz", a="1", b="2", c="3", d="4", e="5"), 4 / 9, True, False),  # fp 5
]


def test_extraction_rule_never_passes_an_empty_or_invalid_answer():
    recs = [{"id": str(i), "reference": r, "prediction": p} for i, (r, p, *_) in enumerate(EXTRACTION_CASES)]
    kind, cfg = get_task("extraction"), TaskConfig.make(["intent", "slots"])
    out, _ = kind.score(recs, cfg)
    rule = kind.example_rule("field_f1")
    assert [r["scores"]["field_f1"] for r in out] == pytest.approx([c[2] for c in EXTRACTION_CASES])
    assert [r["scores"]["answered"] for r in out] == [c[3] for c in EXTRACTION_CASES]
    assert [rule.passing(r) for r in out] == [c[4] for c in EXTRACTION_CASES]
    # the rule's score (what the concentration of gains sums) is 0 for an unanswered example
    assert [rule.score(r) for r in out] == pytest.approx([c[2] if c[3] else 0.0 for c in EXTRACTION_CASES])
    # every per-example rule of the kind fails `{}`, whatever the success metric
    empty = [r for r, c in zip(out, EXTRACTION_CASES) if c[1] == "{}"]
    for metric in kind.metric_names(cfg)["aggregate"] + [None]:
        assert not any(kind.example_rule(metric).passing(r) for r in empty), metric


def test_a_model_that_says_nothing_fixes_nothing():
    """Two thirds of the references have no slots (as in one real dataset): the baseline answers in
    prose, the candidate says `{}` everywhere. Field F1 per example is 1.0 on the no-slot rows, yet no
    example is fixed and McNemar has nothing to test; the basis is stated on the compare screen."""
    refs = [NO_SLOTS if i % 3 else TWO_SLOTS for i in range(30)]
    base = [{"id": f"e{i}", "reference": r, "prediction": "The weather is nice."} for i, r in enumerate(refs)]
    cand = [{"id": f"e{i}", "reference": r, "prediction": "{}"} for i, r in enumerate(refs)]
    r = paired_compare(
        base,
        cand,
        "extraction",
        required_fields=["intent", "slots"],
        eval_cfg=Eval(),
        hypothesis=_hyp("field_f1", 0.0, task="extraction"),
        iterations=100,
    )
    assert sum(1 for x in refs if x == NO_SLOTS) == 20
    assert r["counts"] == {"fixed": 0, "broken": 0, "unchanged_right": 0, "unchanged_wrong": 30}
    assert r["mcnemar"]["p_value"] == 1.0
    assert r["counts_basis"]["description"] == FIELD_F1_RULE
    assert summary_lines("r0004", "r0002", r)[1] == "  basis: field_f1: " + FIELD_F1_RULE
    # the same candidate answering the no-slot rows right: those 20 are fixed
    cand = [
        {"id": f"e{i}", "reference": ref, "prediction": ref if ref == NO_SLOTS else "{}"} for i, ref in enumerate(refs)
    ]
    r = paired_compare(
        base,
        cand,
        "extraction",
        required_fields=["intent", "slots"],
        eval_cfg=Eval(),
        hypothesis=_hyp("field_f1", 0.0, task="extraction"),
        iterations=100,
    )
    assert r["counts"] == {"fixed": 20, "broken": 0, "unchanged_right": 0, "unchanged_wrong": 10}


def test_extraction_required_fields_set_what_an_answer_must_hold():
    ref = json.dumps({"slots": {}})
    recs = [{"id": str(i), "reference": ref, "prediction": p} for i, p in enumerate(["{}", '{"slots": {}}'])]
    kind, cfg = get_task("extraction"), TaskConfig.make(["slots"])
    out, _ = kind.score(recs, cfg)
    assert [kind.example_rule("field_f1").passing(r) for r in out] == [False, True]


def test_format_rules_never_pass_an_output_without_the_required_fields():
    kind = get_task("format")
    cfg = TaskConfig.make(["answer"], eval_cfg=Eval(json_schema={"type": "object"}))
    preds = ["{}", '{"answer": 4}', "null", "not json", ""]
    recs = [{"id": str(i), "reference": '{"answer": 4}', "prediction": p} for i, p in enumerate(preds)]
    out, m = kind.score(recs, cfg)
    assert m["json_valid_rate"] == 0.6 and m["schema_valid_rate"] == 0.4 and m["required_fields_rate"] == 0.2
    want = {
        "json_valid_rate": [False, True, False, False, False],  # `{}` and `null` are JSON, without the field
        "schema_valid_rate": [False, True, False, False, False],
        "required_fields_rate": [False, True, False, False, False],
        "compliance_rate": [False, True, False, False, False],
        "exact_match": [False, True, False, False, False],
    }
    for metric, passing in want.items():
        assert [kind.example_rule(metric).passing(r) for r in out] == passing, metric
    assert kind.example_rule("json_valid_rate").description == (
        "an example passes when its output passes the json valid check and has every required field "
        "(when hypothesis.required_fields is set)"
    )


def test_format_grammar_and_regex_rules_need_a_compliant_output():
    kind = get_task("format")
    cfg = TaskConfig.make(eval_cfg=Eval(grammar="function_slots"))
    refs = ["thank()", "inform(name[Halo])", "inform(name[Halo])"]
    preds = ["thank()", "", "inform(name[Halo]"]
    out, _ = kind.score(
        [{"id": str(i), "reference": r, "prediction": p} for i, (r, p) in enumerate(zip(refs, preds))], cfg
    )
    rule = kind.example_rule("slot_f1")
    assert [r["scores"]["slot_f1"] for r in out] == [1.0, 0.0, 0.0]
    assert [rule.passing(r) for r in out] == [True, False, False]
    cfg = TaskConfig.make(eval_cfg=Eval(regex=r"(?P<key>[A-Z]): (?P<value>\d*)"))
    out, _ = kind.score([{"id": "0", "reference": "A: 1", "prediction": ""}], cfg)
    assert out[0]["scores"]["part_accuracy"] == 0.0 and not kind.example_rule("part_accuracy").passing(out[0])


def test_multilabel_and_classification_never_pass_an_empty_or_invalid_answer():
    kind = get_task("multi-label")
    preds = ["", "null", "{}", '"a"', "[1]", "[]", '["a"]']
    recs = [{"id": str(i), "reference": "[]", "prediction": p} for i, p in enumerate(preds)]
    out, _ = kind.score(recs, TaskConfig.make())
    # an empty label set is an answer (no label applies); an empty or unparseable output is not
    want = [False, False, False, False, False, True, False]
    for metric in ("exact_set_match", "micro_f1", "macro_f1", "json_valid_rate"):
        got = [kind.example_rule(metric).passing(r) for r in out]
        assert got == (want[:6] + [metric == "json_valid_rate"]), metric
    cls = get_task("classification")
    out, m = cls.score([{"id": "0", "reference": "", "prediction": ""}], TaskConfig.make(labels=["", "a"]))
    assert out[0]["correct"] is False and m["n_invalid"] == 1  # an empty answer is never a class


def test_a_copy_of_the_gold_with_null_optional_fields_passes_field_f1_and_every_row_counts():
    """Issue 33 item 3 (NLU++): ``{"intent": [...], "slots": null}`` scored against itself passed field F1's rule on
    5 of 24 rows, so fixed / broken and McNemar left most rows out. A copy of the gold now passes on every row: an
    optional field left null / [] in the reference, or a key the reference lacks, is answered by the same."""
    refs = [
        {"intent": ["greet"], "slots": None},
        {"intent": ["book"], "slots": {"date": "today"}},
        {"intent": ["book", "change"], "slots": []},
        {"intent": ["cancel"]},  # the key left out of the reference
    ] * 6
    gold = [json.dumps(r) for r in refs]
    base = [{"id": f"e{i}", "reference": g, "prediction": "no idea"} for i, g in enumerate(gold)]
    cand = [{"id": f"e{i}", "reference": g, "prediction": g} for i, g in enumerate(gold)]
    kind, cfg = get_task("extraction"), TaskConfig.make(["intent", "slots"])
    out, m = kind.score(cand, cfg)
    assert [r["scores"]["answered"] for r in out] == [True] * 24
    assert sum(kind.example_rule("field_f1").passing(r) for r in out) == 24
    assert m["exact_match"] == 1.0 and m["required_fields_rate"] == 1.0 and m["field_f1"] == 1.0
    r = paired_compare(
        base,
        cand,
        "extraction",
        required_fields=["intent", "slots"],
        eval_cfg=Eval(),
        hypothesis=_hyp("field_f1", 0.0, task="extraction"),
        iterations=100,
    )
    assert r["counts"] == {"fixed": 24, "broken": 0, "unchanged_right": 0, "unchanged_wrong": 0}
    assert r["mcnemar"]["p_value"] == pytest.approx(2 * 0.5**24)
    # a field the reference fills is still required: dropping it, or leaving it null, is no answer
    drop = [
        {"id": "0", "reference": gold[1], "prediction": json.dumps({"intent": ["book"]})},
        {"id": "1", "reference": gold[1], "prediction": json.dumps({"intent": ["book"], "slots": None})},
        {"id": "2", "reference": gold[0], "prediction": json.dumps({"slots": None})},
    ]
    out, _ = kind.score(drop, cfg)
    assert [r["scores"]["answered"] for r in out] == [False, False, False]


def test_an_empty_answer_is_never_compliant_and_a_rule_that_accepts_it_is_named():
    """Issue 33 item 2: a base answering "" for every example scored format compliance 1.000 under a regex that
    accepts ""; the data check said nothing. An empty (or whitespace-only) output, or an empty JSON string, is never
    compliant nor fixed; the data check warns about a rule that accepts the empty answer."""
    from tuneproof.data.audit import audit_format_targets
    from tuneproof.tasks.format import FormatRule

    kind = get_task("format")
    cfg = TaskConfig.make(eval_cfg=Eval(regex=r"[A-Z]?\d*"))
    refs = ["A1", "B22", "7", "C"]
    empty = [{"id": str(i), "reference": r, "prediction": p} for i, (r, p) in enumerate(zip(refs, ["", " ", "\n", ""]))]
    out, m = kind.score(empty, cfg)
    assert m["compliance_rate"] == 0.0 and m["regex_match_rate"] == 0.0 and m["exact_match"] == 0.0
    assert {r["scores"]["error"] for r in out} == {"empty: the output is empty or whitespace only"}
    right = [{"id": str(i), "reference": r, "prediction": r} for i, r in enumerate(refs)]
    r = paired_compare(right, empty, "format", required_fields=None, eval_cfg=cfg.eval, iterations=50)
    assert r["counts"] == {"fixed": 0, "broken": 4, "unchanged_right": 0, "unchanged_wrong": 0}
    r = paired_compare(empty, right, "format", required_fields=None, eval_cfg=cfg.eval, iterations=50)
    assert r["counts"]["fixed"] == 4  # the other way round: every row counts
    examples = [Example(id=f"t{i}", text="x", target=t, source=f"d.jsonl:{i + 1}") for i, t in enumerate(refs)]
    rep = audit_format_targets(examples, FormatRule(regex=r"[A-Z]?\d*"))
    assert rep["hard_faults"] == []
    assert rep["warnings"] == [
        "the format rule (eval.regex '[A-Z]?\\\\d*') accepts the empty answer (''): an empty or whitespace-only "
        "output is never counted compliant or fixed, but the rule does not say what an answer is; make eval.regex / "
        "eval.json_schema require one (e.g. '.+' instead of '.*', minLength: 1)"
    ]
    assert audit_format_targets(examples, FormatRule(regex=r"[A-Z]?\d+"))["warnings"] == []
    # a JSON Schema that accepts the empty JSON string: warned, and "" / " " as answers are not compliant
    schema = FormatRule(json_schema={"type": "string"})
    assert schema.accepts_empty() == ['the JSON string ""']
    assert [schema.check(t)["ok"] for t in ('""', '" "', '"x"')] == [False, False, True]
    assert FormatRule(json_schema={"type": "string", "minLength": 1}).accepts_empty() == ['the JSON string " "']
    assert FormatRule(json_schema={"type": "string", "pattern": "\\S"}).accepts_empty() == []
    # an empty gold target is a hard fault of the data check, not a right answer
    bad = audit_format_targets(
        [*examples, Example(id="t9", text="x", target=" ", source="d.jsonl:9")], FormatRule(regex=r"[A-Z]?\d*")
    )
    assert "d.jsonl:9 (empty: the output is empty or whitespace only)" in bad["hard_faults"][0]
