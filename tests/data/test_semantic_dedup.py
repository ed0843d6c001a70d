"""Leaks by paraphrase (data.dedup.semantic): a train text that says an evaluated text again in other words."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from tuneproof.cli import main
from tuneproof.data.examples import Example
from tuneproof.data.semantic_dedup import apply_semantic_policy, find_semantic_duplicates
from tuneproof.errors import TuneproofError

# the stub encoder: texts of one meaning share a direction; every other text gets its own random direction
MEANINGS = {
    "how do i top up my card": 0,
    "what is the way to add money to my card": 0,
    "how can i put funds on my card": 0,
    "my card has not arrived yet": 1,
    "i am still waiting for my card to be delivered": 1,
}


def stub_embed(texts):
    rows = []
    for t in texts:
        key = t.lower().strip("?!. ")
        seed = MEANINGS.get(key, int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) + 100)
        rng = np.random.default_rng(seed)
        v = rng.normal(size=64)
        if key in MEANINGS:  # a paraphrase: the meaning's direction plus a little of its own
            v = np.random.default_rng(MEANINGS[key]).normal(size=64) * 10 + np.random.default_rng(len(key)).normal(
                size=64
            )
        rows.append(v / np.linalg.norm(v))
    return np.array(rows, dtype=np.float32)


def _ex(i, text, label="x"):
    return Example(id=i, text=text, label=label)


SPLITS = {
    "train": [
        _ex("t0", "What is the way to add money to my card?", "top_up"),
        _ex("t1", "I am still waiting for my card to be delivered", "card_arrival"),
        _ex("t2", "Why was I charged twice?", "duplicate_charge"),
    ],
    "test": [
        _ex("e0", "How do I top up my card?", "top_up"),
        _ex("e1", "Can I change my PIN at an ATM?", "change_pin"),
        _ex("e2", "why was i charged twice", "duplicate_charge"),
    ],
}


def test_paraphrase_pairs_are_listed_with_both_texts_and_the_lexical_ones_marked():
    rep = find_semantic_duplicates(SPLITS, 0.9, stub_embed, settings={"encoder": "stub"})
    r = rep.splits["train/test"]
    assert (r.n_train, r.n_eval, r.eval_colliding, r.paraphrase_only) == (3, 3, 2, 1)
    assert r.fraction == pytest.approx(2 / 3)
    got = {(p.id_train, p.id_eval): p for p in r.pairs}
    assert set(got) == {("t0", "e0"), ("t2", "e2")}
    para = got[("t0", "e0")]
    assert (para.text_train, para.text_eval) == ("What is the way to add money to my card?", "How do I top up my card?")
    assert para.lexical is False and 0.9 <= para.cosine < 1.0 and para.label_train == para.label_eval == "top_up"
    assert got[("t2", "e2")].lexical is True and got[("t2", "e2")].cosine == pytest.approx(1.0, abs=1e-5)
    assert rep.summary_lines() == [
        "train/test: 2 of 3 test examples (66.7%) have a train example at cosine >= 0.9 "
        "(1 not lexical duplicates; 2 pairs)"
    ]
    d = rep.to_dict()
    assert d["settings"] == {"encoder": "stub", "threshold": 0.9}
    assert d["splits"]["train/test"]["pairs"][0]["id_eval"] in ("e0", "e2")
    json.dumps(d)  # JSON-safe
    kept, dropped = apply_semantic_policy(SPLITS["train"], rep, "drop-from-train")
    assert [e.id for e in kept] == ["t1"] and dropped == ["t0", "t2"]
    assert apply_semantic_policy(SPLITS["train"], rep, "report") == (SPLITS["train"], [])


def test_threshold_above_every_pair_finds_none_and_bad_input_is_named():
    rep = find_semantic_duplicates(SPLITS, 1.01 - 0.01 + 0.0, stub_embed)  # 1.0: only the lexical pair
    assert [(p.id_train, p.id_eval) for p in rep.splits["train/test"].pairs] == [("t2", "e2")]
    clean = {"train": SPLITS["train"][:2], "test": SPLITS["test"][1:2]}
    assert find_semantic_duplicates(clean, 0.9, stub_embed).summary_lines() == [
        "train/test: no paraphrase (cosine >= 0.9) among 1 test examples"
    ]
    with pytest.raises(TuneproofError, match="no 'train' split"):
        find_semantic_duplicates({"test": SPLITS["test"]}, 0.9, stub_embed)
    with pytest.raises(TuneproofError, match="encoder returned shape"):
        find_semantic_duplicates(SPLITS, 0.9, lambda texts: np.zeros((1, 4), dtype=np.float32))


def _reports(folder: Path) -> list[Path]:
    return sorted(Path(folder, "runs").rglob("data_check.json"), key=lambda p: p.stat().st_mtime_ns)


def _cli(*args: str) -> int:
    with pytest.raises(SystemExit) as e:
        main(list(args))
    return e.value.code


def test_data_check_reports_the_planted_paraphrase_and_drop_from_train_removes_it(
    tmp_path, tiny_model_dir, capsys, monkeypatch
):
    monkeypatch.setattr("tuneproof.recipes.data_check.minilm_embed", lambda batch_size=64: stub_embed)
    monkeypatch.setattr("tuneproof.context.minilm_embed", lambda batch_size=64: stub_embed)
    folder = tmp_path / "s"
    folder.mkdir()
    rows = [{"text": f"question number {i} about fees", "label": ["fees", "other"][i % 2]} for i in range(40)]
    (folder / "train.jsonl").write_text(
        "".join(
            json.dumps(r) + "\n" for r in rows + [{"text": "What is the way to add money to my card?", "label": "fees"}]
        )
    )
    val = [{"text": f"a validation sentence {i}", "label": ["fees", "other"][i % 2]} for i in range(6)]
    (folder / "validation.jsonl").write_text("".join(json.dumps(r) + "\n" for r in val))
    (folder / "test.jsonl").write_text(
        "".join(
            json.dumps(r) + "\n"
            for r in [
                {"text": "How do I top up my card?", "label": "fees"},
                {"text": "unrelated words", "label": "other"},
            ]
        )
    )
    cfg = {
        "name": "para",
        "hypothesis": {"behaviour": "b", "task": "classification", "success": {"metric": "accuracy"}},
        "data": {
            "sources": [
                {"path": "train.jsonl", "format": "jsonl", "split": "train"},
                {"path": "validation.jsonl", "format": "jsonl", "split": "validation"},
                {"path": "test.jsonl", "format": "jsonl", "split": "test"},
            ],
            "fields": {"text": "text", "label": "label"},
            "dedup": {"semantic": {"threshold": 0.9}},
        },
        "model": {"base": str(tiny_model_dir)},
        "eval": {"split": "validation"},
    }
    (folder / "tuneproof.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    assert _cli("data", "check", "--study", str(folder)) == 0
    out = capsys.readouterr().out
    assert "paraphrases across splits: train/validation: no paraphrase" in out
    assert "train/test: 1 of 2 test examples (50.0%) have a train example at cosine >= 0.9" in out
    report = json.loads(_reports(folder)[-1].read_text())
    pairs = report["semantic_dedup"]["splits"]["train/test"]["pairs"]
    assert [(p["text_train"], p["text_eval"]) for p in pairs] == [
        ("What is the way to add money to my card?", "How do I top up my card?")
    ]
    assert any(w.startswith("paraphrase leak: train/test: 1 of 2") for w in report["warnings"])

    cfg["data"]["dedup"]["semantic"]["policy"] = "drop-from-train"
    (folder / "tuneproof.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    assert _cli("data", "check", "--study", str(folder)) == 0
    reports = _reports(folder)
    assert len(reports) == 2
    report = json.loads(reports[-1].read_text())
    assert report["dropped_by_dedup"] == ["train:41"]
    assert report["semantic_dedup"]["splits"]["train/test"]["pairs"] == []


@pytest.mark.slow
def test_real_minilm_finds_a_planted_paraphrase_leak_the_lexical_pass_misses():
    from tuneproof.data.dedup import find_duplicates
    from tuneproof.data.semantic_dedup import minilm_embed
    from tuneproof.study import SemanticDedup

    embed = minilm_embed()
    splits = {
        "train": [
            _ex("t0", "How can I top up my card?"),
            _ex("t1", "What is the weather going to be like in Paris tomorrow?"),
            _ex("t2", "Play some jazz music from the seventies"),
        ],
        "test": [
            _ex("e0", "How do I top up my card?"),
            _ex("e1", "Book a table for two at an Italian restaurant"),
        ],
    }
    emb = embed(["a", "b c d e f g", "b"])  # rows come back in input order although batches sort by length
    assert emb.shape == (3, 384) and np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    assert np.allclose(emb[[0, 2]], embed(["a", "b"]), atol=1e-5)
    lexical = find_duplicates(splits, threshold=0.8)
    assert lexical.pair("train", "test").counts["near"]["pairs"] == 0  # word 3-shingle Jaccard 3/7
    rep = find_semantic_duplicates(splits, SemanticDedup().threshold, embed)
    r = rep.splits["train/test"]
    assert [(p.id_train, p.id_eval) for p in r.pairs] == [("t0", "e0")]
    assert r.pairs[0].lexical is False and r.paraphrase_only == 1 and r.pairs[0].cosine > 0.95


def test_dossier_lists_the_paraphrase_pairs_with_both_texts():
    from tuneproof.deliver.dossier.data_check import _paraphrase_blocks

    rep = find_semantic_duplicates(SPLITS, 0.9, stub_embed, settings={"encoder": "stub", "policy": "report"})
    blocks = _paraphrase_blocks(rep.to_dict())
    assert blocks[0]["text"] == "paraphrases across splits (stub, cosine >= 0.9, policy report):"
    assert blocks[1]["rows"] == [["train/test", "3", "2", "1", "2"]]
    listed = blocks[2]["blocks"][0]["rows"]
    assert {(r[1], r[2], r[4], r[5]) for r in listed} == {
        ("t0", "e0", "What is the way to add money to my card?", "How do I top up my card?"),
        ("t2", "e2", "Why was I charged twice?", "why was i charged twice"),
    }
    assert _paraphrase_blocks(None) == []
