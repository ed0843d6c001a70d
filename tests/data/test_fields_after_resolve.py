"""A resolved config (what variants and resume read) holds every data.fields key with its default;
the built-in readers must read it as the study file did (it is not "data.fields given")."""

from __future__ import annotations

import pytest


def _both(raw: dict, tmp_path, data_root):
    from tuneproof.context import parse_study
    from tuneproof.data.sources import load_source
    from tuneproof.study import resolved_config

    study = parse_study(raw)
    again = parse_study(resolved_config(study))
    return [load_source(s.data.sources[0], s.data.fields, tmp_path, data_root)[0] for s in (study, again)]


def _raw(source: dict, **fields) -> dict:
    raw = {
        "name": "x",
        "hypothesis": {"behaviour": "b", "task": "classification", "success": {"metric": "macro_f1"}},
        "data": {"sources": [source]},
        "model": {"base": "minilm-l6"},
    }
    if fields:
        raw["data"]["fields"] = fields
    return raw


def test_snips_and_banking77_read_the_same_from_a_resolved_config(tmp_path, shared_data):
    for source in ({"path": "$DATA/snips", "format": "snips"}, {"path": "$DATA/banking77", "format": "banking77"}):
        first, again = _both(_raw(source), tmp_path, shared_data)
        assert len(first) == len(again) > 10000
        assert [(e.id, e.text, e.label) for e in first[:50]] == [(e.id, e.text, e.label) for e in again[:50]]


def test_lines_default_files_survive_a_resolved_config(tmp_path):
    folder = tmp_path / "train"
    folder.mkdir()
    (folder / "seq.in").write_text("play jazz\nwill it rain\n")
    (folder / "label").write_text("PlayMusic\nGetWeather\n")
    first, again = _both(_raw({"path": str(folder), "format": "lines"}), tmp_path, None)
    assert (
        [(e.text, e.label) for e in first]
        == [(e.text, e.label) for e in again]
        == [("play jazz", "PlayMusic"), ("will it rain", "GetWeather")]
    )


def test_snips_still_refuses_fields_the_study_sets(tmp_path, shared_data):
    from tuneproof.errors import TuneproofError

    with pytest.raises(TuneproofError, match=r"data.fields \(label\) does not apply to format 'snips'"):
        _both(_raw({"path": "$DATA/snips", "format": "snips"}, label="intent"), tmp_path, shared_data)
