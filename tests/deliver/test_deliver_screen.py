"""The screen of the tiny classification study (docs/PROTOCOL.md step 2): eval and test print their headline
metrics (worst classes first, averages named), test says whether the test split is reused,
compare and show take --json, a failing per-class guard is one line per class (at most 10)."""

from __future__ import annotations

import json
import shutil

import pytest

from tuneproof.evaluation.screen import MAX_FAILING_ON_SCREEN, guard_lines


def _main(args, capsys):
    from tuneproof.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(args)
    return exit_.value.code, capsys.readouterr().out


@pytest.fixture()
def study(cls_study, tmp_path):
    d = tmp_path / "study"
    shutil.copytree(cls_study["dir"], d)
    return {**cls_study, "dir": d}


def test_eval_and_test_print_metrics_and_test_reuse(study, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    ids, d = study["ids"], str(study["dir"])
    code, out = _main(["eval", ids["train"], "--study", d], capsys)
    assert code == 0
    lines = out.splitlines()
    worst = lines.index("worst 2 of 2 classes by recall:")
    recorded = json.loads((study["dir"] / "runs" / ids["eval"] / "eval.json").read_text())["metrics"]
    acc, f1 = recorded["accuracy"], recorded["macro_f1"]
    assert f"accuracy: {acc:.3f}" in lines[worst:]
    assert f"macro-F1 (unweighted over 2 of 2 labels present): {f1:.3f}" in lines[worst:]
    assert lines.index(f"accuracy: {acc:.3f}") > worst + 2  # classes first, then averages
    code, out = _main(["test", ids["train"], "--study", d], capsys)
    assert code == 0
    assert "test split: first use (not a reuse)" in out
    # rounded metrics, never a raw dict; the candidate paired with the base model in the same read
    from tuneproof.registry import Registry

    reg = Registry(study["dir"])
    rec = reg.latest("test")
    m = rec.summary["metrics"]
    assert f"scored with the frozen hypothesis: accuracy {m['accuracy']:.3f}, macro-F1 {m['macro_f1']:.3f}" in out
    assert "{'" not in out and len(reg.test_accesses()) == 1  # one sealed read
    versus = rec.summary["versus_base"]
    base_rows = [json.loads(x) for x in (study["dir"] / "runs" / rec.id / "baseline_outputs.jsonl").open()]
    base_acc = sum(r["prediction"] == r["reference"] for r in base_rows) / len(base_rows)
    acc = versus["metrics"]["accuracy"]
    assert versus["n"] == len(base_rows) == 6 and acc["base"] == pytest.approx(base_acc)
    assert acc["cand"] == pytest.approx(m["accuracy"]) and acc["delta"] == pytest.approx(acc["cand"] - acc["base"])
    assert acc["ci"][0] <= acc["delta"] <= acc["ci"][1]
    row = next(line for line in out.splitlines() if line.startswith("│ accuracy "))
    cells = [c.strip() for c in row.strip("│").split("│")]
    assert cells == [
        "accuracy",
        f"{acc['base']:.3f}",
        f"{acc['cand']:.3f}",
        f"{acc['delta']:.3f}",
        f"[{acc['ci'][0]:.3f}, {acc['ci'][1]:.3f}]",
    ]
    assert f"{versus['success']}: success: macro_f1 gain >= 0 on the test split (delta " in out
    reg.close()
    code, out = _main(["test", ids["train"], "--study", d], capsys)
    assert code == 0
    assert f"test split: REUSE - {ids['train']} was already evaluated on the test split" in " ".join(out.split())


def test_compare_and_show_json(study, capsys):
    ids, d = study["ids"], str(study["dir"])
    code, out = _main(["compare", ids["eval"], "--against", ids["baseline"], "--json", "--study", d], capsys)
    data = json.loads(out)  # stdout is the JSON alone
    assert data["baseline"] == ids["baseline"]
    assert data["run"].startswith("r") and code == (3 if data["verdict"] == "fail" else 0)
    cand = data["candidates"][ids["eval"]]
    stored = json.loads((study["dir"] / "runs" / data["run"] / "compare.json").read_text())
    assert cand["counts"] == stored["candidates"][ids["eval"]]["counts"]
    code, out = _main(["show", ids["eval"], "--fixed", "--json", "--study", d], capsys)
    assert code == 0
    shown = json.loads(out)
    assert shown["run"] == ids["eval"] and shown["baseline"] == ids["baseline"]
    assert shown["matched"] == cand["counts"]["fixed"]
    assert all(e["candidate_correct"] is True and e["baseline_correct"] is False for e in shown["examples"])
    # a cut list says so (the title read 'r0004: 6 examples' above 2 rows)
    n = json.loads(_main(["show", ids["eval"], "--json", "--study", d], capsys)[1])["matched"]
    code, out = _main(["show", ids["eval"], "--limit", "1", "--study", d], capsys)
    assert code == 0 and f"{ids['eval']}: {n} examples, the first 1 shown (--limit N for more)" in " ".join(out.split())


def test_failing_per_class_guard_is_one_line_per_class_at_most_10():
    items = [
        {
            "name": f"class_{i:02d}",
            "base": 0.9,
            "cand": 0.1 + i / 100,
            "delta": -0.8 + i / 100,
            "ci": [-0.9, -0.7],
            "support": 5,
            "verdict": "fail",
            "why": "below floor 0.2",
        }
        for i in range(15)
    ]
    items.append(
        {"name": "fine", "base": 0.5, "cand": 0.6, "delta": 0.1, "ci": [0.0, 0.2], "support": 5, "verdict": "pass"}
    )
    items.append(
        {"name": "rare", "base": 0.0, "cand": 0.0, "delta": 0.0, "ci": None, "support": 1, "verdict": "not measurable"}
    )
    v = {
        "kind": "guard",
        "metric": "per_class_recall",
        "min_support": 5,
        "verdict": "fail",
        "detail": "x" * 6000,
        "items": items,
    }
    lines = guard_lines(v, "runs/r0009/compare.json")
    assert MAX_FAILING_ON_SCREEN == 10
    assert len(lines) == 1 + 10 + 1
    assert lines[0] == "15 of 16 classes fail (judged on support >= 5)"
    assert lines[1] == "    class_00: recall 0.900 -> 0.100, delta -0.800 [-0.900, -0.700], support 5: below floor 0.2"
    assert lines[10].startswith("    class_09: recall 0.900 -> 0.190")
    assert lines[11] == "    ... and 5 more (full list in runs/r0009/compare.json)"
    assert guard_lines({"detail": "delta 0.1", "items": []}) == ["delta 0.1"]


def test_data_check_shows_progress(study, capsys):
    from tuneproof.context import StudyContext
    from tuneproof.recipes.data_check import data_report

    capsys.readouterr()
    rep = data_report(StudyContext.open(study["dir"]))
    assert rep["sizes"] == {"train": 32, "validation": 12, "test": 6}
    lines = [line.split(" | ")[0] for line in capsys.readouterr().out.splitlines() if line.startswith("data check: ")]
    # duplicates over all 50 examples, then the trainer's encoding of train and validation (44): 94 steps
    assert lines == [
        "data check: 50/94 (53%) duplicates done",
        "data check: 82/94 (87%) encoding train",
        "data check: 94/94 (100%) encoding validation",
    ]


def test_test_reads_the_capped_split_once_with_an_estimate_first_and_reuses_the_base_outputs(
    study, capsys, monkeypatch
):
    import re

    import yaml

    from tuneproof.registry import Registry

    monkeypatch.setenv("COLUMNS", "300")
    d, train = study["dir"], study["ids"]["train"]
    cfg = yaml.safe_load((d / "tuneproof.yaml").read_text())
    cfg.setdefault("eval", {})["max_examples"] = 4
    (d / "tuneproof.yaml").write_text(yaml.safe_dump(cfg))
    rate = Registry(d).get(study["ids"]["eval"]).summary["eval_examples_per_s"]
    code, out = _main(["test", train, "--study", str(d)], capsys)
    assert code == 0, out
    line = next(x for x in out.splitlines() if x.startswith("test: "))
    assert line.startswith(
        f"test: 4 of 6 'test' examples (eval.max_examples 4, class-balanced); 2 passes ({train}, then the base "
        "model to pair with): about "
    )
    assert line.endswith(f"({study['ids']['eval']} evaluated {rate:.3g} examples/s)")
    assert out.index(line) < out.index("test split: first use")  # before the model is loaded and read
    reg = Registry(d)
    first = reg.latest("test")
    assert first.summary["n_eval"] == 4 and first.summary["versus_base"]["n"] == 4
    assert first.summary["versus_base"]["base_outputs_from"] == first.id
    reg.close()
    code, out = _main(["test", train, "--study", str(d)], capsys)
    assert code == 0, out
    line = next(x for x in out.splitlines() if x.startswith("test: "))
    assert f"the base model's outputs on these examples are reused from {first.id}; 1 pass ({train})" in line
    assert re.search(r"about \d+ s", line)
    reg = Registry(d)
    second = reg.latest("test")
    assert second.summary["versus_base"]["base_outputs_from"] == first.id
    assert second.summary["versus_base"]["metrics"] == first.summary["versus_base"]["metrics"]
    reg.close()
