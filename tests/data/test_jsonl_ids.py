"""One numbering everywhere: a JSON Lines example's default id is its file line, as every message names
it (a dropped "d.jsonl:3" was id ``d:2``); a study whose splits.json was written with the 0-based ids
keeps them, so its runs stay comparable."""

from __future__ import annotations

import json

import pytest

from tuneproof.data.cleaning import clean
from tuneproof.data.sources import LEGACY_ID, load_json_records
from tuneproof.data.split import freeze_or_reuse
from tuneproof.errors import TuneproofError
from tuneproof.study import FieldMap


def _file(tmp_path):
    p = tmp_path / "d.jsonl"
    rows = [{"text": "book a table", "label": "a"}, None, {"text": " ", "label": "b"}, {"text": "play", "label": "b"}]
    p.write_text("".join(("" if r is None else json.dumps(r)) + "\n" for r in rows))  # line 2 is blank
    return p


def test_jsonl_ids_are_file_lines_like_the_messages(tmp_path):
    ex, _ = load_json_records(_file(tmp_path), FieldMap(label="label"), "train", lines=True)
    assert [(e.id, e.source) for e in ex] == [
        ("d:1", f"{tmp_path / 'd.jsonl'}:1"),
        ("d:3", f"{tmp_path / 'd.jsonl'}:3"),
        ("d:4", f"{tmp_path / 'd.jsonl'}:4"),
    ]
    assert [e.meta[LEGACY_ID] for e in ex] == ["d:0", "d:1", "d:2"]  # what an earlier tuneproof called them
    kept, dropped = clean(ex, ["strip", "drop_empty"])
    assert [e.id for e in kept] == ["d:1", "d:4"] and "d.jsonl:3" in str(dropped)
    # a study's own id column is left alone
    p = tmp_path / "k.jsonl"
    p.write_text(json.dumps({"text": "x", "uid": "u7"}) + "\n")
    (k,) = load_json_records(p, FieldMap(id="uid"), "train", lines=True)[0]
    assert k.id == "u7" and LEGACY_ID not in k.meta


def test_a_study_frozen_with_0_based_ids_keeps_them(tmp_path):
    ex, _ = load_json_records(_file(tmp_path), FieldMap(label="label"), "train", lines=True)
    study = tmp_path / "study"
    study.mkdir()
    (study / "splits.json").write_text(json.dumps({"splits": {"train": ["d:0", "d:2"]}, "hash": "x"}))
    info: dict = {}
    splits, created = freeze_or_reuse(study, None, ex, info=info)
    assert not created and info == {"legacy_ids": 3}
    assert [(e.id, e.text) for e in splits["train"]] == [("d:0", "book a table"), ("d:2", "play")]
    # a new manifest records its numbering, and its ids are the file lines
    new = tmp_path / "new"
    new.mkdir()
    freeze_or_reuse(new, {"train": ex}, ex)
    manifest = json.loads((new / "splits.json").read_text())
    assert manifest["id_numbering"] == "file line" and manifest["splits"]["train"] == ["d:1", "d:3", "d:4"]
    assert [e.id for e in freeze_or_reuse(new, None, ex)[0]["train"]] == ["d:1", "d:3", "d:4"]
    # an old manifest whose ids the data does not hold under either numbering is refused as before
    (study / "splits.json").write_text(json.dumps({"splits": {"train": ["d:0", "d:9"]}, "hash": "x"}))
    with pytest.raises(
        TuneproofError, match=r"1 example ids of split 'train' are not in the data any more \(e.g. 'd:9'\)"
    ):
        freeze_or_reuse(study, None, ex)
