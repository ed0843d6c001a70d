"""One behavioural matrix over every task kind (PEFT's lesson: the same invariants for every variant).

Adding a task kind = one module in ``tuneproof.tasks`` + one row in ``CASES`` below.
"""

from __future__ import annotations

import json
import random

import pytest
import yaml

from tuneproof.context import parse_study
from tuneproof.data.examples import Example
from tuneproof.evaluation.compare import paired_compare
from tuneproof.recipes.init import template_text
from tuneproof.study import Eval
from tuneproof.tasks import TASKS, Task, TaskConfig, get_task


def _ex(refs, preds, cats=None):
    return [
        {"id": f"e{i}", "category": (cats[i] if cats else None), "reference": r, "prediction": p}
        for i, (r, p) in enumerate(zip(refs, preds))
    ]


def _x(intent, **slots):
    return json.dumps({"intent": intent, "slots": slots})


MR = [
    "inform(name[Dirt: Showdown], release_year[2012], genres[driving/racing, sport])",
    "request(specifier[exciting], genres[puzzle])",
    "inform(name[Tetris], genres[puzzle])",
    "confirm(name[Halo])",
]

# name -> (task, refs, the same answers rewritten in another order, config, success metric, categories)
CASES = {
    "classification": (
        "classification",
        ["a", "b", "c", "a", "b", "a"],
        None,
        TaskConfig.make(labels=["a", "b", "c"]),
        "macro_f1",
        None,
    ),
    "image-classification": (
        "image-classification",
        ["cat", "dog", "cat", "bird", "dog", "cat"],
        None,
        TaskConfig.make(labels=["bird", "cat", "dog"]),
        "macro_f1",
        None,
    ),
    "multi-label": (
        "multi-label",
        ['["a", "b"]', '["c"]', '["a"]', '["b", "c"]', "[]", '["a", "c"]'],
        ['["b", "a"]', '["c", "c"]', '["a"]', '["c", "b"]', "[]", '["c", "a"]'],
        TaskConfig.make(),
        "micro_f1",
        None,
    ),
    "extraction": (
        "extraction",
        [_x(["a", "b"]), _x("c", city="Paris"), _x("a", city="Rome", when="today"), _x("b", artist=["x", "y"])],
        [
            _x(["b", "a"]),
            _x("c", city="paris "),
            json.dumps({"slots": {"when": "today", "city": "Rome"}, "intent": "a"}),
            _x("b", artist=["y", "x"]),
        ],
        TaskConfig.make(["intent", "slots"]),
        "field_f1",
        None,
    ),
    # optional fields left empty in the reference (NLU++: slots null; no intent: []): a copy of it is right
    "extraction-optional": (
        "extraction",
        [
            json.dumps({"intent": ["a"], "slots": None}),
            json.dumps({"intent": ["b", "c"], "slots": {"city": "Paris"}}),
            json.dumps({"intent": [], "slots": {"when": "today"}}),
            json.dumps({"intent": ["a"], "slots": []}),
            json.dumps({"intent": ["c"], "slots": {}}),
        ],
        None,
        TaskConfig.make(["intent", "slots"]),
        "field_f1",
        None,
    ),
    "format-grammar": (
        "format",
        MR,
        [
            "inform(genres[sport, driving/racing], release_year[2012], name[Dirt: Showdown])",
            "request(genres[puzzle], specifier[exciting])",
            "inform(genres[puzzle], name[Tetris])",
            "confirm(name[halo])",
        ],
        TaskConfig.make(eval_cfg=Eval(grammar="function_slots")),
        "slot_f1",
        None,
    ),
    "format-regex": (
        "format",
        ["A: 1", "B: 22", "A: 3"],
        None,
        TaskConfig.make(eval_cfg=Eval(regex=r"(?P<key>[A-Z]): (?P<value>\d+)")),
        "part_accuracy",
        ["x", "y", "x"],
    ),
}
IDS = list(CASES)


def _score(case, preds):
    task, refs, _, cfg, _, cats = CASES[case]
    return get_task(task).score(_ex(refs, preds, cats), cfg)


def _rates(metrics):
    return {k: v for k, v in metrics.items() if isinstance(v, float)}


def test_every_kind_has_a_case_and_a_template():
    assert {c[0] for c in CASES.values()} == set(TASKS)
    for name, kind in TASKS.items():
        study = parse_study(yaml.safe_load(template_text(name)))
        assert study.hypothesis.task == name
        assert kind.template.endswith(".yaml") and kind.reader.target and kind.headline
        assert kind.has_label_set == (
            type(kind).label_set is not Task.label_set
        )  # task_config reads the data only for these


@pytest.mark.parametrize("case", IDS)
def test_perfect_prediction_scores_one(case):
    task, refs, _, _, success, _ = CASES[case]
    recs, m = _score(case, refs)
    assert all(r["correct"] for r in recs)
    assert m[success] == 1.0
    for key in get_task(task).headline_for(m):
        assert m[key] == 1.0, key


@pytest.mark.parametrize("case", IDS)
def test_a_copy_of_the_reference_passes_every_per_example_rule(case):
    """Fixed / broken and McNemar's test count every row: no rule fails a right answer (an optional field left
    null or empty in the reference included), and identical runs compare with every row unchanged right."""
    task, refs, _, cfg, _, cats = CASES[case]
    kind = get_task(task)
    recs, _ = _score(case, refs)
    for metric in [*kind.metric_names(cfg)["aggregate"], None]:
        rule = kind.example_rule(metric)
        assert [rule.passing(r) for r in recs] == [True] * len(refs), (metric, rule.name)
    r = paired_compare(
        recs, recs, task, required_fields=cfg.required_fields, eval_cfg=cfg.eval, labels=cfg.labels, iterations=50
    )
    assert r["counts"]["unchanged_right"] == len(refs) and r["counts"]["unchanged_wrong"] == 0


@pytest.mark.parametrize("case", IDS)
@pytest.mark.parametrize("bad", ["", "   ", "<<garbage))", "{}", "null"])
def test_empty_or_unparseable_output_is_never_right(case, bad):
    task, refs, _, cfg, success, _ = CASES[case]
    recs, m = _score(case, [bad] * len(refs))
    kind = get_task(task)
    assert not any(r["correct"] for r in recs)
    assert m[success] == 0.0
    # no per-example rule passes an empty or invalid answer, `{}` and `null` included
    # (valid JSON without the required fields), whatever the success metric
    for metric in [*kind.metric_names(cfg)["aggregate"], None]:
        rule = kind.example_rule(metric)
        assert not any(rule.passing(r) for r in recs), (metric, rule.name)
        assert all(rule.score(r) == 0.0 for r in recs), (metric, rule.name)


@pytest.mark.parametrize("case", IDS)
def test_order_of_examples_and_of_set_members_does_not_matter(case):
    task, refs, reordered, cfg, _, cats = CASES[case]
    kind = get_task(task)
    preds = list(refs[1:]) + refs[:1]  # mostly wrong answers, so the metrics are not all 1
    recs = _ex(refs, preds, cats)
    _, m1 = kind.score(recs, cfg)
    shuffled = recs[:]
    random.Random(3).shuffle(shuffled)
    _, m2 = kind.score(shuffled, cfg)
    assert _rates(m1) == pytest.approx(_rates(m2))
    if reordered is not None:  # set-valued answers written in another order score as the reference itself
        out, m = kind.score(_ex(refs, reordered, cats), cfg)
        assert all(r["correct"] for r in out), [r["id"] for r in out if not r["correct"]]


@pytest.mark.parametrize("case", IDS)
def test_per_example_statistics_sum_to_the_aggregate(case):
    task, refs, _, cfg, _, cats = CASES[case]
    kind = get_task(task)
    base, bm = kind.score(_ex(refs, ["", *refs[1:]], cats), cfg)
    cand, cm = kind.score(_ex(refs, list(refs[1:]) + refs[:1], cats), cfg)
    st = kind.bootstrap_stats(base, cand, bm, cm, cfg)
    for blocks, m in ((st.base, bm), (st.cand, cm)):
        full = st.metric_fn({k: v.sum(axis=0, keepdims=True) for k, v in blocks.items()}, len(refs), 0.0)
        assert full, "no metric from the statistics"
        for key, val in full.items():
            want = m[key] if isinstance(key, str) else m[key[0]].get(key[1], {}).get(key[2], 0.0)
            assert float(val[0]) == pytest.approx(want, abs=1e-12), key
    assert len(st.example_class) == len(refs)


@pytest.mark.parametrize("case", IDS)
def test_identical_runs_compare_as_unchanged(case):
    task, refs, _, cfg, success, cats = CASES[case]
    recs = _ex(refs, ["", *refs[1:]], cats)
    r = paired_compare(
        recs, recs, task, required_fields=cfg.required_fields, eval_cfg=cfg.eval, labels=cfg.labels, iterations=100
    )
    assert r["counts"]["fixed"] == 0 and r["counts"]["broken"] == 0 and r["mcnemar"]["p_value"] == 1.0
    assert all(v["delta"] in (0.0, None) for v in r["metrics"].values())
    assert set(r["headline"]) <= set(r["metrics"])


def _examples(task, refs):
    if task == "classification":
        return [
            Example(id=f"t{i}", text=f"text {i}", label=r, target=r, source=f"d.jsonl:{i + 1}")
            for i, r in enumerate(refs)
        ]
    return [
        Example(id=f"t{i}", text=f"text {i}", label=None, target=r, source=f"d.jsonl:{i + 1}")
        for i, r in enumerate(refs)
    ]


@pytest.mark.parametrize("case", IDS)
def test_audit_passes_good_data_and_names_a_bad_target(case):
    task, refs, _, cfg, _, _ = CASES[case]
    kind = get_task(task)
    good = _examples(task, refs)
    rep = kind.audit({"train": good, "validation": good}, cfg)
    assert rep["hard_faults"] == []
    if task in ("classification", "image-classification"):
        return  # a label is its own target
    bad = _examples(task, refs[:-1] + ["{{not valid"])
    rep = kind.audit({"train": good, "validation": bad}, cfg)
    assert rep["hard_faults"] and f"d.jsonl:{len(refs)}" in rep["hard_faults"][0]
