"""Observed limits from recorded evidence: regressions with their interval, weak classes and
fields, typical failures with example ids, test-set reuse; and the K verification examples."""

from __future__ import annotations

from tuneproof.deliver.limits import limits_lines, observed_limits, reserved_split_use
from tuneproof.recipes.export import pick_examples

COMPARISON = {
    "per_class": {
        "A": {"recall": {"base": 0.9, "cand": 0.6, "delta": -0.3, "ci": [-0.5, -0.1], "support": 10}},
        "B": {"recall": {"base": 0.2, "cand": 0.3, "delta": 0.1, "ci": [-0.1, 0.3], "support": 5}},
        "C": {"recall": {"base": 0.8, "cand": 0.75, "delta": -0.05, "ci": [-0.2, 0.1], "support": 4}},
    },
    "per_field": {"city": {"f1": {"base": 0.7, "cand": 0.4, "delta": -0.3, "ci": [-0.6, 0.05], "support": 7}}},
    "broken_ids": ["x3", "x9"],
    "concentration": {"flagged": True, "detail": "2 examples carry 80% of the gain"},
    "notes": [],
}
OUTPUTS = [
    {"id": "x1", "correct": True, "scores": {"json_valid": True}},
    {"id": "x2", "correct": False, "scores": {"json_valid": False, "parse_error": "code_fence: the output is wrapped"}},
    {"id": "x3", "correct": False, "scores": {"json_valid": False, "parse_error": "not_json: Expecting value"}},
    {"id": "x4", "correct": False, "scores": {"json_valid": False, "parse_error": "not_json: Unterminated string"}},
    {"id": "x5", "correct": False, "scores": {"json_valid": True, "required_present": True, "intent_correct": False}},
    {
        "id": "x6",
        "correct": False,
        "scores": {"json_valid": True, "required_present": True, "intent_correct": True, "fp": 1, "fn": 0},
    },
]


def test_regressed_weak_failures_and_test_reuse():
    lim = observed_limits(
        "extraction",
        eval_metrics=None,
        outputs=OUTPUTS,
        comparison=COMPARISON,
        test_accesses=[{"candidate": "r2"}, {"candidate": "r2"}, {"candidate": "r5"}],
    )
    assert [(r["kind"], r["name"], r["delta"], r["significant"]) for r in lim["regressed"]] == [
        ("class", "A", -0.3, True),
        ("field", "city", -0.3, False),
        ("class", "C", -0.05, False),
    ]
    assert [(r["kind"], r["name"], r["cand"]) for r in lim["weak"]] == [("class", "B", 0.3), ("field", "city", 0.4)]
    assert lim["failures"] == [
        {"kind": "not_json", "count": 2, "share": 2 / 6, "example_ids": ["x3", "x4"]},
        {"kind": "code_fence", "count": 1, "share": 1 / 6, "example_ids": ["x2"]},
        {"kind": "wrong intent", "count": 1, "share": 1 / 6, "example_ids": ["x5"]},
        {"kind": "wrong or missing slot values", "count": 1, "share": 1 / 6, "example_ids": ["x6"]},
    ]
    assert lim["broken"] == ["x3", "x9"]
    assert (
        lim["test_set"]["reads"] == 3
        and lim["test_set"]["reused"]
        and lim["test_set"]["candidates"] == {"r2": 2, "r5": 1}
    )
    assert lim["notes"] == ["gain concentrated: 2 examples carry 80% of the gain"]
    lines = limits_lines(lim)
    assert lines[0] == "regressed: class A: recall 0.900 -> 0.600 (-0.300, 95% CI [-0.500, -0.100], significant)"
    assert "typical failure: not_json: 2 example(s) (33%), e.g. x3, x4" in lines


def test_without_comparison_weak_comes_from_the_eval_metrics():
    lim = observed_limits(
        "classification",
        eval_metrics={"per_class": {"a": {"recall": 0.2, "support": 3}, "b": {"recall": 0.9}}},
        outputs=[{"id": "1", "correct": False, "reference": "a", "prediction": "b", "scores": {"valid_label": True}}],
        comparison=None,
        test_accesses=[],
        forced={"status": "failed", "reason": "OOM"},
    )
    assert [(r["name"], r["cand"]) for r in lim["weak"]] == [("a", 0.2)] and lim["regressed"] == []
    assert lim["failures"][0]["kind"] == "a predicted as b"
    assert lim["notes"] == [
        "no comparison with the baseline was run: regressions cannot be judged",
        "exported with --force although the run is failed (OOM)",
    ]
    assert reserved_split_use([])["note"].startswith("the reserved test split has not been read")


def test_verification_examples_cover_the_classes_round_robin():
    rows = [{"id": f"{c}{i}", "category": c} for c in "aab" for i in range(3)]
    rows = [dict(r) for r in {r["id"]: r for r in rows}.values()]  # a0 a1 a2 b0 b1 b2
    assert [r["id"] for r in pick_examples(rows, 4)] == ["a0", "b0", "a1", "b1"]
    assert [r["id"] for r in pick_examples(rows[:2], 5)] == ["a0", "a1"]


def test_the_first_screen_names_at_most_five_short_limits():
    from tuneproof.deliver.limits import summary_limits

    many = {
        f"intent_{i:02d}": {"recall": {"base": 0.6, "cand": 0.3, "delta": -0.3, "ci": [-0.5, 0.1], "support": 4}}
        for i in range(40)
    }
    lim = observed_limits(
        "classification",
        eval_metrics=None,
        outputs=[{"id": "1", "correct": False, "reference": "a", "prediction": "b", "scores": {"valid_label": True}}],
        comparison={"per_class": many, "per_field": {}, "broken_ids": [f"x{i}" for i in range(20)], "notes": ["n1"]},
        test_accesses=[{"candidate": "r2"}],
    )
    assert summary_limits(lim) == [
        "regressed: 40 classes (0 significantly); worst class intent_00: recall 0.600 -> 0.300",
        "weak (below 0.5): 40 classes: intent_00 0.30, intent_01 0.30, intent_02 0.30, intent_03 0.30, "
        "intent_04 0.30 and 35 more",
        "most frequent failure: a predicted as b: 1 example(s) (100%)",
        "right before, wrong after fine-tuning: x0, x1, x2 and 17 more",
        "test set: the test split was read once",
    ]  # the note is the 6th: left to section Limits observed
    lines = limits_lines(lim, 12)
    assert lines[12] == "regressed: and 28 more" and lines[13].startswith("weak: class intent_00")
