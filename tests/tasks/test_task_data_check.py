"""`tuneproof data check` on the task kinds users bring (docs/PROTOCOL.md step 3): a grammar-style format task and
a multi-label task, on fixtures built here that mirror those layouts (tiny model, no download)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tuneproof.cli import main


def _cli(*args: str) -> int:
    with pytest.raises(SystemExit) as e:
        main(list(args))
    return e.value.code


def _study(folder: Path, base: Path, task: str, rows: list[dict], success: str, ev: dict, fields: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = {
        "name": f"tiny-{task}",
        "hypothesis": {"behaviour": "b", "task": task, "success": {"metric": success, "min_gain": 0.0}},
        "data": {"sources": [{"path": "data.jsonl", "format": "jsonl"}], "fields": fields, "cleaning": ["strip"]},
        "model": {"base": str(base)},
        "training": {"max_length": 240},
        "eval": {"split": "validation", **ev},
    }
    (folder / "tuneproof.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return folder


MR_ROWS = [
    {
        "text": f"game {i} came out in {2000 + i}",
        "target": f"inform(name[Game {i}], release_year[{2000 + i}], genres[puzzle, sport])",
    }
    for i in range(30)
]


def test_grammar_targets_are_checked_against_the_rule_not_json(tmp_path, tiny_model_dir, capsys):
    d = _study(
        tmp_path / "mr",
        tiny_model_dir,
        "format",
        MR_ROWS,
        "slot_f1",
        {"grammar": "function_slots"},
        {"text": "text", "target": "target"},
    )
    assert _cli("data", "check", "--study", str(d)) == 0
    out = capsys.readouterr().out
    assert "targets: 30 of 30 follow eval.grammar function_slots (parse rate 100.0%); none fails" in out
    assert "strict JSON" not in out and "data check passed" in out

    rows = [dict(r) for r in MR_ROWS]
    rows[7]["target"] = "inform(name[Game 7], release_year[2007]"  # the closing parenthesis is missing
    d = _study(
        tmp_path / "mr2",
        tiny_model_dir,
        "format",
        rows,
        "slot_f1",
        {"grammar": "function_slots"},
        {"text": "text", "target": "target"},
    )
    assert _cli("data", "check", "--study", str(d)) == 3
    out = capsys.readouterr().out
    assert "1 of 30 gold targets fail the format rule (eval.grammar function_slots; parse rate 96.7%)" in out
    assert "data.jsonl:8 (grammar: expected name(slot[value], ...))" in out, out


def test_multilabel_data_check_audits_each_label(tmp_path, tiny_model_dir, capsys):
    sets = [["card", "refund"], ["card"], ["refund"], ["card", "fees", "refund"]]
    rows = [{"text": f"message number {i}", "labels": sets[i % 4]} for i in range(40)]
    d = _study(
        tmp_path / "ml", tiny_model_dir, "multi-label", rows, "micro_f1", {}, {"text": "text", "target": "labels"}
    )
    assert _cli("data", "check", "--study", str(d)) == 0
    out = capsys.readouterr().out
    rep = json.loads(next((d / "runs").glob("*/data_check.json")).read_text())
    ls = rep["label_sets"]
    total = {lab: sum(s.get(lab, 0) for s in ls["support"].values()) for lab in ("card", "fees", "refund")}
    assert total == {"card": 30, "fees": 10, "refund": 30}
    assert sum(c["histogram"].get("3", 0) for c in ls["cardinality"].values()) == 10
    assert "label sets train:" in out and "labels per example mean" in out
