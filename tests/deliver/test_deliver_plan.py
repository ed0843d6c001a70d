"""The rental plan: hours per phase from measured rates, the variants that fit, the cost, the
warning when nothing fits, and a clear error (exit 2) before anything was measured."""

from __future__ import annotations

import pytest
import yaml

from tuneproof.cli import main
from tuneproof.deliver.rental_plan import SETUP_H, find_number, make_plan, measure
from tuneproof.errors import TuneproofError
from tuneproof.registry import Registry

MEASURED = {
    "s_per_step": 2.0,
    "step_source": "preflight r0003",
    "eval_s_per_example": 0.5,
    "eval_source": "preflight r0003",
    "tokens_per_s": 900.0,
    "reload_s": 120.0,
    "reload_source": "preflight r0003",
    "durations": {},
}


def test_phases_variants_and_cost_from_measured_rates():
    p = make_plan(
        MEASURED, days=3, hourly_rate=2.5, steps=1000, checkpoint_every=100, n_eval=200, n_test=100, k_verify=8
    )
    train_h, eval_h, resume_h = 2000 / 3600, 100 / 3600, (120 + 200) / 3600
    assert p["per_variant_h"] == pytest.approx(train_h + eval_h + resume_h)
    initial = SETUP_H + (60 + (20 * 2 + 16 * 0.5 + 120) + (200 * 0.5 + 120)) / 3600
    export = 2 * (8 * 0.5 + 120) / 3600
    fixed = initial + 50 / 3600 + export
    assert p["variants_fit"] == int((72 - fixed) // p["per_variant_h"]) == 105
    hours = {ph["phase"]: ph["hours"] for ph in p["phases"]}
    assert list(hours) == ["initial check", "experiment", "evaluation", "resume margin", "export"]
    assert hours["initial check"] == pytest.approx(initial)
    assert hours["experiment"] == pytest.approx(105 * train_h)
    assert hours["evaluation"] == pytest.approx(105 * eval_h + 50 / 3600)
    assert hours["resume margin"] == pytest.approx(105 * resume_h)
    assert hours["export"] == pytest.approx(export)
    assert p["total_h"] <= 72 and p["fits"] and p["cost"]["rental"] == pytest.approx(180.0)
    assert p["cost"]["planned_hours"] == pytest.approx(p["total_h"] * 2.5)
    assert p["warnings"] == []


def test_warns_when_one_variant_does_not_fit():
    p = make_plan(MEASURED, days=3, hourly_rate=4.0, steps=200_000, checkpoint_every=500, n_eval=200, n_test=100)
    assert p["variants_fit"] == 0 and p["variants"] == 1 and not p["fits"]
    assert p["warnings"][0].startswith("does not fit: one variant needs 111.5 h")
    p7 = make_plan(
        MEASURED, days=7, hourly_rate=4.0, steps=200_000, checkpoint_every=500, n_eval=200, n_test=100, variants=3
    )
    assert p7["variants_fit"] == 1 and not p7["fits"]
    assert p7["warnings"][0].startswith("3 variants do not fit") and "at most 1 fit" in p7["warnings"][0]


def test_nothing_measured_is_a_clear_error():
    with pytest.raises(TuneproofError, match="no the time of a training step"):
        make_plan(
            {"s_per_step": None, "eval_s_per_example": 0.3},
            days=7,
            hourly_rate=1,
            steps=10,
            checkpoint_every=5,
            n_eval=1,
            n_test=1,
        )


def test_measure_prefers_completed_runs_and_names_the_preflights_rate(tmp_path):
    """The preflight timed 26.5 s/step, the training ran at ~10 s/step: the plan uses the runs' rate
    and says both; without a completed train run the preflight's rate is used."""
    reg = Registry(tmp_path)
    with reg.run("preflight") as r:
        r.update_summary(
            throughput={"s_per_step": 26.5, "tokens_per_s": 900},
            smoke={"eval_seconds": 4.0, "n_eval": 8},
            reload_seconds=42,
        )
    m = measure(reg)
    assert (m["s_per_step"], m["step_source"], m["reload_s"]) == (26.5, "preflight r0001", 42.0)
    assert m["eval_s_per_example"] == 0.5 and m["tokens_per_s"] == 900
    with reg.run("train") as r:
        r.update_summary(train_seconds=100.0, steps=10)
    with reg.run("train") as r:  # resumed at step 6: its process made 4 steps in 44 s
        r.update_summary(train_seconds=44.0, steps=10, resumes=[{"from_step": 6}])
    with reg.run("baseline") as r:
        r.update_summary(eval_seconds=30.0, n_eval=60)
    m = measure(reg)
    assert m["s_per_step"] == pytest.approx(10.5)
    assert m["step_source"] == "median of 2 completed train run(s) (the training as it ran)"
    assert (m["preflight_s_per_step"], m["preflight_step_source"]) == (26.5, "preflight r0001")
    assert m["eval_source"] == "median of 1 completed baseline/eval run(s) (the full evaluation as it ran)"
    p = make_plan(m, days=1, steps=100, checkpoint_every=50, n_eval=60, n_test=60)
    assert (
        p["notes"][0] == "step time used: 10.5 s/step from median of 2 completed train run(s) (the training as it ran)"
    )
    assert (
        p["notes"][1]
        == "preflight r0001 timed 26.5 s/step over a few steps; the completed runs' rate is used (2.5x the preflight's)"
    )
    assert find_number({"a": [{"b": {"step_s": 0.25}}]}, ("s_per_step", "step_s")) == 0.25


def test_the_resume_margin_rule_is_in_its_row_and_a_margin_past_the_experiment_is_explained():
    p = make_plan(MEASURED, days=1, steps=20, checkpoint_every=100, n_eval=10, n_test=10)
    row = next(ph for ph in p["phases"] if ph["phase"] == "resume margin")
    n = p["variants"]
    assert row["hours"] == pytest.approx(n * (120 + 20 * 2.0) / 3600)
    assert row["basis"] == (
        f"one interruption per variant: {n} x (reload in a fresh process 120 s + up to 20 steps since the "
        "last checkpoint, training.checkpoint_every 100)"
    )
    why = [x for x in p["notes"] if x.startswith("the resume margin")]
    assert why == [
        f"the resume margin ({n * 160 / 3600:.2f} h) is larger than the experiment ({n * 40 / 3600:.2f} h): one "
        "interruption per variant costs a reload of 120 s (preflight r0003) + up to 20 steps, and a variant trains "
        "40 s; a measured reload (preflight) or a smaller training.checkpoint_every lowers it"
    ]
    long = make_plan(MEASURED, days=1, steps=1000, checkpoint_every=100, n_eval=10, n_test=10)
    assert not [x for x in long["notes"] if x.startswith("the resume margin")]


def test_days_are_said_in_words():
    from tuneproof.deliver.rental_plan import days_text

    assert (days_text(1), days_text(7), days_text(0.5)) == ("1 day", "7 days", "0.5 days")


def test_cli_plan_before_anything_measured_exits_2(tmp_path, capsys):
    from deliver_tiny import cls_config

    (tmp_path / "tuneproof.yaml").write_text(yaml.safe_dump(cls_config(tmp_path / "base")))
    with pytest.raises(SystemExit) as e:
        main(["plan", "--days", "7", "--hourly-rate", "2.5", "--study", str(tmp_path)])
    assert e.value.code == 2
    out = capsys.readouterr().out
    assert "nothing measured to plan from" in out and "tuneproof preflight" in out
    assert not (tmp_path / "plan.json").exists()


def test_evaluation_rate_is_the_task_kinds_measured_one(tmp_path):
    """A classifier evaluated in batches of 16 runs at ~0.06 s/example; the preflight's 2-example smoke
    evaluation (1.41 s/example, one-off costs included) must not plan 106 hours of evaluation."""
    reg = Registry(tmp_path)
    with reg.run("preflight") as r:
        r.update_summary(
            s_per_step=0.5,
            eval_s_per_example=1.41,
            eval_batch_s_per_example=0.0625,
            eval_batch_size=16,
            eval_batch_procedure="classifier forward pass",
            reload_seconds=20,
        )
    m = measure(reg)
    assert m["eval_s_per_example"] == 0.0625
    assert m["eval_source"] == "one evaluation batch of 16 (classifier forward pass) in preflight r0001"
    p = make_plan(m, days=7, steps=100, checkpoint_every=50, n_eval=3080, n_test=3080)
    ev = next(ph for ph in p["phases"] if ph["phase"] == "evaluation")
    assert ev["hours"] == pytest.approx(p["variants"] * 3080 * 0.0625 / 3600 + 3080 * 0.0625 / 3600)
    with reg.run("baseline") as r:  # the full evaluation as it ran wins over the preflight's batch
        r.update_summary(eval_seconds=154.0, n_eval=3080)
    assert measure(reg)["eval_s_per_example"] == pytest.approx(0.05)
    reg2 = Registry(tmp_path / "smoke-only")
    with reg2.run("preflight") as r:
        r.update_summary(s_per_step=0.5, eval_s_per_example=1.41)
    m2 = measure(reg2)
    assert (
        m2["eval_s_per_example"] == 1.41
        and m2["eval_source"] == "smoke evaluation of a few examples in preflight r0001 (an upper bound)"
    )


def test_plan_without_hourly_rate_gives_hours_and_the_cost_is_labelled(cls_study, tmp_path, capsys):
    import json
    import shutil

    p = make_plan(MEASURED, days=7, steps=1000, checkpoint_every=100, n_eval=200, n_test=100)
    assert p["cost"] is None and p["hourly_rate"] is None and p["total_h"] > 0
    d = tmp_path / "study"
    shutil.copytree(cls_study["dir"], d)
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["plan", "--days", "7", "--study", str(d)])
    assert e.value.code == 0
    out = capsys.readouterr().out
    plan = json.loads((d / "plan.json").read_text())
    assert (
        plan["cost"] is None
        and f"planned {plan['total_h']:.2f} hours of the 168 rented; no cost computed (pass --hourly-rate RATE)" in out
    )
    with pytest.raises(SystemExit) as e:
        main(["plan", "--days", "7", "--hourly-rate", "2.5", "--study", str(d)])
    out = capsys.readouterr().out
    plan = json.loads((d / "plan.json").read_text())
    c = plan["cost"]
    assert c["rental"] == pytest.approx(420.0) and c["planned_hours"] == pytest.approx(plan["total_h"] * 2.5)
    assert (
        "cost at 2.5 per hour: rental of 168 h 420.00; cost of the "
        f"{plan['total_h']:.2f} planned hours {c['planned_hours']:.2f}" in out
    )


def test_a_very_fast_evaluation_still_counts_as_measured(tmp_path):
    """A tiny model on a quiet machine evaluates in milliseconds: the run keeps the time to the
    microsecond, and a time recorded as 0.0 (older runs) is not a measurement of 0 s per example."""
    from tuneproof.deliver.rental_plan import measure
    from tuneproof.registry import Registry

    reg = Registry(tmp_path)
    with reg.run("preflight") as r:
        r.update_summary(s_per_step=0.5, eval_batch_s_per_example=0.002, eval_batch_size=4)
    with reg.run("baseline") as r:
        r.update_summary(eval_seconds=0.0, n_eval=12)  # rounded to nothing
    m = measure(reg)
    assert m["eval_s_per_example"] == 0.002 and m["eval_source"].startswith("one evaluation batch of 4")
    with reg.run("eval") as r:
        r.update_summary(eval_seconds=0.0036, n_eval=12)
    m = measure(reg)
    assert m["eval_s_per_example"] == pytest.approx(0.0003) and m["eval_source"].startswith("median of 1 completed")
