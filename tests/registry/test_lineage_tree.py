"""``runs --tree``: lineage, status, change of each variant and headline metric vs the baseline
(from each train run's latest completed eval child; no delta across evaluation procedures)."""

from __future__ import annotations

import re

import yaml

from tiny_study import study_config
from tuneproof.recipes.lineage import build_tree
from tuneproof.registry import Registry
from tuneproof.ui import console


def _run(reg, kind, *, parent=None, status="completed", reason=None, eval_fp=None, **summary):
    run = reg.create(kind, parent=parent)
    if summary:
        run.update_summary(**summary)
    if eval_fp:
        run.set(eval_fingerprint=eval_fp)
    if status != "running":
        reg.finish(run.id, status, reason)
    return run.id


def _render(reg, raw: bool = False) -> list[str]:
    with console.capture() as cap:
        old, console.width = console._width, 200
        try:
            console.print(build_tree(reg, reg.list()))
        finally:
            console._width = old
    lines = cap.get().splitlines()
    return lines if raw else [" ".join(line.split()) for line in lines]


def test_tree_shows_lineage_changes_and_metric_vs_baseline(tmp_path):
    (tmp_path / "tuneproof.yaml").write_text(yaml.safe_dump(study_config(tmp_path / "base")))
    reg = Registry(tmp_path)
    base = _run(reg, "baseline", eval_fp="E1", metrics={"json_valid_rate": 0.9, "field_f1": 0.30})
    parent = _run(reg, "train")
    _run(reg, "eval", parent=parent, eval_fp="E1", metrics={"json_valid_rate": 1.0, "field_f1": 0.35})
    v1 = _run(reg, "train", parent=parent, variant={"parent": parent, "change": "method.r: 4 -> 8"}, multi_change=False)
    _run(reg, "eval", parent=v1, eval_fp="E1", metrics={"field_f1": 0.25})
    _run(
        reg,
        "train",
        parent=parent,
        status="interrupted",
        reason="terminated (signal 15) at step 5",
        variant={"parent": parent, "change": "method.r: 4 -> 8; training.seed: 3 -> 5"},
        multi_change=True,
    )
    v3 = _run(reg, "train", parent=parent, variant={"parent": parent, "change": "eval.max_new_tokens: 8 -> 16"})
    _run(reg, "eval", parent=v3, eval_fp="E2", metrics={"field_f1": 0.5})
    lines = _render(reg)
    assert lines[0] == "tmp_path0 (8 runs; headline field_f1; baseline r0001)".replace("tmp_path0", tmp_path.name)
    text = "\n".join(lines)
    assert f"{base} baseline completed · field_f1 0.300" in text
    assert f"{parent} train completed · field_f1 0.350 (+0.050 vs r0001, eval r0003)" in text
    assert f"{v1} train completed method.r: 4 -> 8 · field_f1 0.250 (-0.050 vs r0001, eval r0005)" in text
    assert (
        "r0006 train interrupted (terminated (signal 15) at step 5) method.r: 4 -> 8; training.seed: 3 -> 5 "
        "multi-change · not evaluated"
    ) in text
    assert "field_f1 0.500 (eval procedure differs from r0001: not comparable)" in text
    # nesting: baseline and parent are roots; variants under the parent; each eval under its train run
    ids = [re.search(r"r\d{4}", line) for line in _render(reg, raw=True)[1:]]
    depth = {m.group(): m.start() // 4 - 1 for m in ids}
    assert depth == {"r0001": 0, "r0002": 0, "r0003": 1, "r0004": 1, "r0005": 2, "r0006": 1, "r0007": 1, "r0008": 2}


def test_tree_without_baseline_or_study_file(tmp_path):
    reg = Registry(tmp_path)
    t = _run(reg, "train", status="failed", reason="RuntimeError: out of memory")
    _run(reg, "eval", parent=t, status="running")
    lines = _render(reg)
    assert "no completed baseline" in lines[0]
    assert "r0001 train failed (RuntimeError: out of memory) · not evaluated" in "\n".join(lines)
    assert any("r0002 eval running" in line for line in lines)


def test_a_few_shot_control_is_labelled_and_never_the_reference_of_the_deltas(tmp_path, monkeypatch):
    (tmp_path / "tuneproof.yaml").write_text(yaml.safe_dump(study_config(tmp_path / "base")))
    reg = Registry(tmp_path)
    _run(reg, "baseline", eval_fp="E1", metrics={"field_f1": 0.0})
    _run(reg, "baseline", eval_fp="E1+shots", metrics={"field_f1": 0.111}, control="few_shot", few_shot=3)
    t = _run(reg, "train")
    _run(reg, "eval", parent=t, eval_fp="E1", metrics={"field_f1": 0.355})
    monkeypatch.chdir(tmp_path)
    lines = _render(Registry("."))  # `runs --tree` inside the study folder: `--study .`
    assert lines[0] == f"{tmp_path.name} (4 runs; headline field_f1; baseline r0001)"
    text = "\n".join(lines)
    assert "r0002 baseline completed control: 3-shot prompt · field_f1 0.111" in text
    assert "r0003 train completed · field_f1 0.355 (+0.355 vs r0001, eval r0004)" in text
