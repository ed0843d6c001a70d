"""What evaluations and comparisons print (docs/PROTOCOL.md step 2): headline metrics with their names, worst
classes / fields first, p-values in scientific notation, guard failures one line per class,
the concentration figure explained when the net gain is small or negative."""

from __future__ import annotations

import numpy as np

from tuneproof.evaluation.compare import _concentration
from tuneproof.evaluation.screen import fmt_p, metric_name, reuse_line, screen_lines
from tuneproof.tasks import get_task
from tuneproof.tasks.classification import score_classification


def test_p_values_in_scientific_notation_below_1e_3():
    assert fmt_p(3.7e-78) == "3.7e-78"
    assert fmt_p(1e-5) == "1.0e-5"
    assert fmt_p(0.00099) == "9.9e-4"
    assert fmt_p(0.03857421875) == "0.0386"
    assert fmt_p(1.0) == "1.0000"
    assert fmt_p(0.0) == "< 1e-300"
    assert fmt_p(None) == "-"


def _records():
    # 3 labels; 'c' has support 0 in the references (predicted once): macro over 2 of 3 labels
    refs = ["a"] * 6 + ["b"] * 4
    preds = ["a"] * 5 + ["c"] + ["b", "b", "a", "a"]
    return [{"id": str(i), "reference": r, "prediction": p} for i, (r, p) in enumerate(zip(refs, preds))]


def test_classification_screen_lists_worst_classes_then_named_averages():
    _, m = score_classification(_records(), labels=["a", "b", "c"])
    lines = screen_lines(get_task("classification"), m)
    assert lines == [
        "worst 2 of 2 classes by recall:",
        "  b: recall 0.500, precision 1.000, f1 0.667 (support 4)",
        "  a: recall 0.833, precision 0.714, f1 0.769 (support 6)",
        "accuracy: 0.700",
        "macro-F1 (unweighted over 2 of 3 labels present): 0.718",
    ]


def test_ties_at_the_worst_value_are_counted():
    refs = [f"l{i}" for i in range(8) for _ in range(2)]
    recs = [{"id": str(i), "reference": r, "prediction": "l0"} for i, r in enumerate(refs)]
    _, m = score_classification(recs)
    lines = screen_lines(get_task("classification"), m, worst=3)
    assert lines[0] == "worst 3 of 8 classes by recall (7 at 0.000):"
    assert lines[1:4] == [
        "  l1: recall 0.000, precision 0.000, f1 0.000 (support 2)",
        "  l2: recall 0.000, precision 0.000, f1 0.000 (support 2)",
        "  l3: recall 0.000, precision 0.000, f1 0.000 (support 2)",
    ]
    assert metric_name("macro_f1", m) == "macro-F1 (unweighted over 8 of 8 labels present)"


def test_extraction_screen_lists_worst_fields_by_f1():
    from tuneproof.tasks.extraction import score_extraction

    recs = [
        {
            "id": "1",
            "reference": '{"intent": "A", "slots": {"city": "Paris", "day": "mon"}}',
            "prediction": '{"intent": "A", "slots": {"city": "Paris", "day": "tue"}}',
        },
        {"id": "2", "reference": '{"intent": "B", "slots": {"city": "Rome"}}', "prediction": "not json"},
    ]
    _, m = score_extraction(recs, required_fields=["intent"])
    lines = screen_lines(get_task("extraction"), m)
    fields = lines[lines.index("worst 2 of 2 fields by F1:") + 1 :][:2]
    assert fields == [
        "  day: f1 0.000, precision 0.000, recall 0.000 (support 1)",
        "  city: f1 0.667, precision 1.000, recall 0.500 (support 2)",
    ]
    assert "strict JSON validity: 0.500" in lines
    assert "field F1 (micro over slot/value pairs): 0.400" in lines


def test_test_split_use_is_stated():
    assert reuse_line([]) == "test split: first use (not a reuse)"
    assert reuse_line(["the test split was already used for r0003"]) == (
        "test split: REUSE - the test split was already used for r0003 (the result no longer is a clean control)"
    )


def test_concentration_over_a_small_net_gain_is_explained():
    # 20 fixed, 17 broken among 100: net +3; the top 5 examples carry 5 = 167% of it
    gains = np.array([1.0] * 20 + [-1.0] * 17 + [0.0] * 63)
    ids = [f"e{i}" for i in range(100)]
    classes = ["a"] * 10 + ["b"] * 27 + ["c"] * 63
    c = _concentration(ids, classes, gains, "correct")
    assert (c["net_gain"], c["gained"], c["lost"]) == (3.0, 20.0, 17.0)
    assert c["detail"] == (
        "5 example(s) (top 5%) carry 167% of the net gain of 3 (these "
        "examples gain 5; the other examples lose 2 in total, "
        "so the net is 3: a share above 100% means the rest gives back part of this gain); "
        "class 'a' carries 333% of the net gain of 3 (this class gains 10; the "
        "other examples lose 7 in total, so the net is 3: "
        "a share above 100% means the rest gives back part of this gain); "
        "the net gain is small (3 of 100 examples: 20 gained, 17 lost), so its shares swing with a few examples"
    )


def test_no_net_gain_says_what_was_gained_and_lost():
    gains = np.array([1.0] * 5 + [-1.0] * 8 + [0.0] * 87)
    c = _concentration([f"e{i}" for i in range(100)], [None] * 100, gains, "correct")
    assert c["flagged"] is False
    assert c["detail"] == "no net gain (5 gained, 8 lost over 100 examples: net -3)"
