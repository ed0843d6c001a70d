"""Bad input in the hypothesis (docs/PROTOCOL.md step 1): a success metric the task does not report, a guard on a
class that is not a label, a format rule no gold target satisfies: exit 2 naming the key, before any run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tuneproof.cli import main
from tuneproof.context import parse_study
from tuneproof.errors import TuneproofError
from tuneproof.evaluation.compare import paired_compare
from tuneproof.recipes.init import template_text
from tuneproof.study import Eval
from tuneproof.tasks import metric_names


def _cli(*args: str) -> int:
    with pytest.raises(SystemExit) as e:
        main(list(args))
    return e.value.code


def _study(folder: Path, task: str, rows: list[dict], **hyp_or_eval) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    hypothesis = {
        "behaviour": "b",
        "task": task,
        "success": {"metric": "accuracy" if task == "classification" else "exact_match"},
        "guards": [],
    }
    ev = {"split": "validation"}
    for k, v in hyp_or_eval.items():
        (ev if k in ("regex", "json_schema") else hypothesis)[k] = v
    fields = {"text": "text", "label": "label"} if task == "classification" else {"text": "text", "target": "target"}
    cfg = {
        "name": "bad-input",
        "hypothesis": hypothesis,
        "data": {"sources": [{"path": "data.jsonl", "format": "jsonl"}], "fields": fields},
        "model": {"base": "smollm2-135m-instruct"},
        "eval": ev,
    }
    (folder / "tuneproof.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return folder


CLS_ROWS = [{"text": f"text number {i}", "label": ["refund", "card_arrival"][i % 2]} for i in range(40)]
FMT_ROWS = [{"text": f"what is {i}", "target": f"ANSWER: {i}"} for i in range(40)]


def test_success_metric_of_another_task_exits_2_naming_the_key(tmp_path, capsys):
    d = _study(tmp_path / "s", "classification", CLS_ROWS, success={"metric": "field_f1"})
    assert _cli("data", "check", "--study", str(d)) == 2
    out = capsys.readouterr().out
    assert "hypothesis.success.metric: 'field_f1' is not a metric of task 'classification'" in out
    assert "use one of accuracy, macro_f1, weighted_f1, micro_f1" in out
    assert not (d / "runs").exists()  # before any run


def test_guard_metric_and_format_metric_without_its_rule():
    base = yaml.safe_load(template_text("format"))
    base["hypothesis"]["guards"] = [{"metric": "regex_match_rate", "max_drop": 0.0}]
    with pytest.raises(
        TuneproofError,
        match=r"hypothesis.guards\[0\].metric: 'regex_match_rate' is not a metric of task 'format' "
        r"\(a format study reports it only when eval.regex is set\)",
    ):
        parse_study(base)
    base["hypothesis"]["guards"] = [{"metric": "per_class_recal", "max_drop": 0.0}]
    with pytest.raises(TuneproofError, match=r"guards\[0\].metric: 'per_class_recal'"):
        parse_study(base)
    base["hypothesis"]["guards"] = [{"metric": "exact_match", "max_drop": 0.0, "classes": ["x"]}]
    with pytest.raises(TuneproofError, match=r"guards\[0\].classes: only a per_class_\* guard names classes"):
        parse_study(base)


@pytest.mark.parametrize("task", ["classification", "multi-label", "extraction", "format"])
def test_every_template_names_metrics_of_its_task(task):
    s = parse_study(yaml.safe_load(template_text(task)))
    assert (
        s.hypothesis.success.metric
        in metric_names(
            task,
            required_fields=s.hypothesis.required_fields,
            json_schema=s.eval.json_schema,
            regex=s.eval.regex,
            grammar=s.eval.grammar,
        )["aggregate"]
    )


def test_metric_names_are_the_ones_the_comparison_reports():
    recs = [
        {
            "id": str(i),
            "category": "A" if i % 2 else "B",
            "reference": json.dumps({"intent": "A", "slots": {"x": "1"}}),
            "prediction": json.dumps({"intent": "A", "slots": {"x": str(i % 3)}}),
        }
        for i in range(8)
    ]
    for task, kw in (
        ("extraction", {"required_fields": ["intent"]}),
        ("format", {"required_fields": ["intent"], "json_schema": {"type": "object"}, "regex": r"\{.*\}"}),
    ):
        r = paired_compare(
            recs,
            recs,
            task,
            required_fields=kw["required_fields"],
            iterations=100,
            eval_cfg=Eval(json_schema=kw.get("json_schema"), regex=kw.get("regex")),
        )
        names = metric_names(task, **kw)
        multi = {
            "intent_precision",
            "intent_recall",
            "intent_micro_f1",
            "intent_macro_f1",
        }  # only when an intent is a list
        assert sorted(r["metrics"]) == sorted(n for n in names["aggregate"] if n not in multi)
        assert sorted({f"per_class_{k}" for m in r["per_class"].values() for k in m}) == sorted(names["per_class"])
        assert sorted({f"per_field_{k}" for m in r["per_field"].values() for k in m}) == sorted(names["per_field"])
    cls = [{"id": str(i), "reference": "A" if i % 2 else "B", "prediction": "A"} for i in range(8)]
    r = paired_compare(cls, cls, "classification", required_fields=None, eval_cfg=Eval(), iterations=100)
    assert sorted(r["metrics"]) == sorted(metric_names("classification")["aggregate"])
    assert sorted({f"per_class_{k}" for m in r["per_class"].values() for k in m}) == sorted(
        metric_names("classification")["per_class"]
    )


def test_guard_on_a_class_not_in_the_labels_exits_2_before_any_run(tmp_path, capsys):
    d = _study(
        tmp_path / "s",
        "classification",
        CLS_ROWS,
        guards=[{"metric": "per_class_recall", "floor": 0.2, "classes": ["refund", "card_arival"]}],
    )
    assert _cli("data", "check", "--study", str(d)) == 2
    out = capsys.readouterr().out
    assert (
        "hypothesis.guards[0].classes: 'card_arival' is not a label of the data" in out
        and "labels: card_arrival, refund" in out
    )
    assert not (d / "runs").exists()
    assert _cli("baseline", "--study", str(d)) == 2 and not (d / "runs").exists()


def test_format_rule_matching_no_gold_target_exits_2_naming_the_key(tmp_path, capsys):
    d = _study(tmp_path / "r", "format", FMT_ROWS, regex=r"[0-9]+")  # the gold answers are "ANSWER: 7"
    assert _cli("data", "check", "--study", str(d)) == 2
    out = capsys.readouterr().out
    assert "eval.regex matches none of the 40 gold targets (first: 'ANSWER: 0')" in out and not (d / "runs").exists()
    d = _study(tmp_path / "j", "format", FMT_ROWS, json_schema={"type": "object"})
    assert _cli("data", "check", "--study", str(d)) == 2
    assert (
        "eval.json_schema matches none of the 40 gold targets" in capsys.readouterr().out and not (d / "runs").exists()
    )


def test_format_rule_matching_some_gold_targets_is_a_note():
    from tuneproof.hypothesis import check_against_data

    rows = FMT_ROWS[:30] + [{"text": "x", "target": "no answer"}] * 10
    s = parse_study(
        {
            "name": "n",
            "hypothesis": {"behaviour": "b", "task": "format", "success": {"metric": "exact_match"}},
            "data": {"sources": [{"path": "d.jsonl", "format": "jsonl"}]},
            "model": {"base": "m"},
            "eval": {"regex": r"ANSWER: \d+"},
        }
    )

    class E:  # the two attributes the check reads
        def __init__(self, r):
            self.label, self.target = None, r["target"]

    assert check_against_data(s, {"train": [E(r) for r in rows]}, "tuneproof.yaml") == [
        "eval.regex matches 30 of 40 gold targets"
    ]
