"""Loaders: real SNIPS/BANKING77 counts, the CESU-8 repair (docs/CASES.md C17), and bad-input messages."""

from __future__ import annotations

import json

import pytest

from tuneproof.data.sources import load_banking77, load_csv, load_json_records, load_snips
from tuneproof.errors import TuneproofError
from tuneproof.io import read_text
from tuneproof.study import FieldMap


def test_snips_counts_slots_and_cesu8_repair(shared_data):
    examples, repairs = load_snips(shared_data / "snips")
    train = [e for e in examples if e.split == "train"]
    val = [e for e in examples if e.split == "validation"]
    assert (len(train), len(val)) == (13784, 700)
    assert len({e.label for e in examples}) == 7
    # docs/CASES.md C17: the PlayMusic file holds one emoji as a CESU-8 surrogate pair; it is repaired and recorded
    assert len(repairs) == 1 and "train_PlayMusic_full.json: byte" in repairs[0] and "U+1F355" in repairs[0]
    pizza = [e for e in examples if "\U0001f355" in e.text]
    assert len(pizza) == 1 and pizza[0].label == "PlayMusic"
    pizza[0].text.encode("utf-8")  # no lone surrogates left
    rate = next(e for e in train if e.label == "RateBook" and "slots" in e.target)
    target = json.loads(rate.target)
    assert target["intent"] == "RateBook" and isinstance(target["slots"], dict)


def test_banking77_counts(shared_data):
    examples, _ = load_banking77(shared_data / "banking77")
    assert sum(e.split == "train" for e in examples) == 10003
    assert sum(e.split == "test" for e in examples) == 3080
    assert len({e.label for e in examples}) == 77


def test_cesu8_bytes_are_repaired_and_bad_bytes_named(tmp_path):
    good = tmp_path / "a.json"
    good.write_bytes(b'{"t": "x \xed\xa0\xbc\xed\xbd\x95 y"}')
    text, repairs = read_text(good)
    assert json.loads(text)["t"] == "x \U0001f355 y"
    assert repairs == [f"{good}: byte 9: CESU-8 surrogate pair repaired to U+1F355"]
    bad = tmp_path / "b.csv"
    bad.write_bytes(b"text,label\nabc\xff,x\n")
    with pytest.raises(TuneproofError, match=r"b.csv: not UTF-8 at byte offset 14"):
        read_text(bad)


def test_csv_errors_name_file_line_and_column(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("text,label\nhello,a\nbad,row,extra\n")
    with pytest.raises(TuneproofError, match=r"d.csv:3: 3 fields, header has 2"):
        load_csv(p, FieldMap(text="text", label="label"))
    p.write_text("text,label\nhello,a\n")
    with pytest.raises(TuneproofError, match=r"d.csv:1: column 'category' not found \(columns: text, label\)"):
        load_csv(p, FieldMap(text="text", label="category"))
    p.write_text("text,label\nhello,a\nworld,\n")
    with pytest.raises(TuneproofError, match=r"d.csv:3: empty label"):
        load_csv(p, FieldMap(text="text", label="label"))
    with pytest.raises(TuneproofError, match="file not found"):
        load_csv(tmp_path / "missing.csv", FieldMap())


def test_jsonl_bad_line_is_named(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"text": "a", "target": "{}"}\n{"text": "b", \n')
    with pytest.raises(TuneproofError, match=r"d.jsonl:2: invalid JSON line"):
        load_json_records(p, FieldMap(text="text", target="target"), lines=True)
