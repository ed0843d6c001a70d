"""Inputs as users bring them (docs/PROTOCOL.md step 3) and bad input refused with file and line:
line-aligned files, globs, target mappings and dotted paths, optional keys, cleaning before
validation, missing-value labels, non-string texts, huge lines, empty files, data.fields on a
built-in format. Small fixtures built here mirror the layouts; BANKING77 from ../shared/data."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from tuneproof.context import StudyContext
from tuneproof.data.sources import load_csv, load_json_records, load_lines, load_source
from tuneproof.errors import TuneproofError
from tuneproof.study import FieldMap, Source


def _write_lines(folder, texts, labels=None, **extra):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "seq.in").write_text("".join(t + "\n" for t in texts))
    if labels is not None:
        (folder / "label").write_text("".join(lab + "\n" for lab in labels))
    for name, rows in extra.items():
        (folder / name.replace("_", ".")).write_text("".join(r + "\n" for r in rows))


def test_lines_format_reads_seq_in_beside_label(tmp_path):
    _write_lines(
        tmp_path / "train",
        ["book a flight to boston", "weather in rome", "play abba"],
        ["flight", "weather", "music"],
        seq_out=["O O O O B-city", "O O B-city", "O B-artist"],
    )
    ex, rep = load_lines(tmp_path / "train", FieldMap())
    assert [(e.id, e.text, e.label, e.split) for e in ex] == [
        ("train:1", "book a flight to boston", "flight", "train"),
        ("train:2", "weather in rome", "weather", "train"),
        ("train:3", "play abba", "music", "train"),
    ]
    assert ex[1].source == f"{tmp_path / 'train' / 'seq.in'}:2" and rep == []
    # fields name the files; target as a mapping builds one JSON object per line
    ex, _ = load_lines(tmp_path / "train", FieldMap(target={"intent": "label", "tags": "seq.out"}), split="validation")
    assert ex[2].split == "validation" and json.loads(ex[2].target) == {"intent": "music", "tags": "O B-artist"}


def test_lines_count_mismatch_names_both_files_and_counts(tmp_path):
    _write_lines(tmp_path / "dev", ["a b", "c d", "e f"], ["x", "y"])
    with pytest.raises(TuneproofError) as err:
        load_lines(tmp_path / "dev", FieldMap())
    assert f"{tmp_path / 'dev' / 'seq.in'} has 3 lines but {tmp_path / 'dev' / 'label'} has 2" in str(err.value)


@pytest.mark.fault("input: a data path with [ ]")
def test_a_path_with_brackets_is_read_as_written_before_any_glob(tmp_path):
    """Issue 33 item 17: ``data/set [v2]/train.json`` was read as a glob (``[v2]`` one character of v or 2)
    and matched nothing; a study folder whose own name has ``[ ]`` broke every pattern under it."""
    rows = [{"text": f"clause {i} about rent", "label": "rent" if i % 2 else "tax"} for i in range(4)]
    data = tmp_path / "set [v2]"
    data.mkdir()
    (data / "train.json").write_text(json.dumps(rows))
    (tmp_path / "set 2").mkdir()  # what the bracket would match as a glob
    (tmp_path / "set 2" / "train.json").write_text(json.dumps(rows[:1]))
    ex, _ = load_source(Source(path="set [v2]/train.json", format="json"), FieldMap(label="label"), tmp_path)
    assert len(ex) == 4 and ex[0].source.endswith("set [v2]/train.json#0")  # one file, read as written
    study = tmp_path / "study [copy]"  # a pattern below a folder whose name has brackets
    (study / "folds").mkdir(parents=True)
    for k in (1, 2):
        (study / "folds" / f"fold{k}.json").write_text(json.dumps(rows))
    ex, _ = load_source(Source(path="folds/fold*.json", format="json"), FieldMap(label="label"), study)
    assert len(ex) == 8 and [ex[0].id, ex[-1].id] == ["fold1:0", "fold2:3"]
    with pytest.raises(TuneproofError, match=r"no such file, and read as a glob pattern it matches no file"):
        load_source(Source(path="set [v3]/train.json", format="json"), FieldMap(label="label"), tmp_path)


def test_glob_sources_load_every_match_and_list_files_in_fingerprint(tmp_path, tiny_model_dir):
    folds = tmp_path / "folds"
    folds.mkdir()
    for k in (1, 2, 3):
        rows = [{"text": f"clause {k} number {i} about rent", "label": "rent" if i % 2 else "tax"} for i in range(4)]
        (folds / f"fold{k}.json").write_text(json.dumps(rows))
    (folds / "notes.txt").write_text("not data")
    ex, _ = load_source(
        Source(path="folds/fold*.json", format="json", split="train"), FieldMap(label="label"), tmp_path
    )
    assert len(ex) == 12 and ex[0].id == "fold1:0" and ex[-1].id == "fold3:3"
    with pytest.raises(TuneproofError, match=r"folds/nope\*\.json: no such file, and read as a glob pattern it"):
        load_source(Source(path="folds/nope*.json", format="json"), FieldMap(), tmp_path)
    (tmp_path / "tuneproof.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "g",
                "hypothesis": {"behaviour": "b", "task": "classification", "success": {"metric": "macro_f1"}},
                "data": {
                    "sources": [{"path": "folds/fold*.json", "format": "json"}],
                    "fields": {"label": "label"},
                    "split": {"fractions": {"train": 0.5, "validation": 0.5}},
                },
                "model": {"base": str(tiny_model_dir), "kind": "causal-lm"},
            }
        )
    )
    ctx = StudyContext.open(tmp_path)
    files = ctx.data_fingerprint()["files"]
    assert [f["path"] for f in files] == ["folds/fold1.json", "folds/fold2.json", "folds/fold3.json"]
    assert all(len(f["sha256"]) == 64 and f["bytes"] > 0 for f in files)


def test_target_mapping_dotted_paths_and_optional_keys(tmp_path):
    p = tmp_path / "d.jsonl"
    rows = [
        {"utt": {"text": "wake me at 7"}, "ann": {"intents": ["alarm"], "slots": {"time": "7"}}},
        {"utt": {"text": "stop"}, "ann": {"intents": ["stop"]}},
        {"utt": {"text": "louder please"}, "ann": {"intents": ["volume_up"]}},
    ]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    fields = FieldMap(text="utt.text", target={"intent": "ann.intents", "slots": "ann.slots"}, optional=["slots"])
    ex, _ = load_json_records(p, fields, "train", lines=True)
    assert [e.text for e in ex] == ["wake me at 7", "stop", "louder please"]
    assert json.loads(ex[0].target) == {"intent": ["alarm"], "slots": {"time": "7"}}
    assert json.loads(ex[1].target) == {"intent": ["stop"], "slots": None}
    assert [e.meta.get("absent") for e in ex] == [None, ["slots", "ann.slots"], ["slots", "ann.slots"]]
    with pytest.raises(
        TuneproofError, match=r"d.jsonl: 2 rows refused: .*d.jsonl:2, .*d.jsonl:3: column 'ann.slots' not found"
    ):
        load_json_records(
            p, FieldMap(text="utt.text", target={"intent": "ann.intents", "slots": "ann.slots"}), lines=True
        )


def _cls_study(tmp_path, model_dir, data_rows, **data):
    (tmp_path / "train.csv").write_text(data_rows)
    (tmp_path / "tuneproof.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "c",
                "hypothesis": {"behaviour": "b", "task": "classification", "success": {"metric": "macro_f1"}},
                "data": {
                    "sources": [{"path": "train.csv", "format": "csv"}],
                    "fields": {"label": "label"},
                    "split": {"fractions": {"train": 0.5, "validation": 0.5}},
                    **data,
                },
                "model": {"base": str(model_dir), "kind": "causal-lm"},
            }
        )
    )
    return StudyContext.open(tmp_path)


def test_ten_empty_texts_are_dropped_before_validation_and_listed(tmp_path, tiny_model_dir):
    rows = ["text,label"]
    for i in range(30):
        rows.append(("   " if i % 3 == 0 else f"sentence number {i} about topic {i % 2}") + f",{'ab'[i % 2]}")
    ctx = _cls_study(tmp_path, tiny_model_dir, "\n".join(rows) + "\n")
    splits = ctx.all_splits
    assert sum(len(v) for v in splits.values()) == 20
    lines = [d["source"] for d in ctx.dropped_empty]
    assert lines == [f"{tmp_path / 'train.csv'}:{i + 2}" for i in range(0, 30, 3)]
    from tuneproof.recipes.data_check import data_report  # noqa: PLC0415

    rep = data_report(ctx)
    line = next(c for c in rep["checks"] if c.startswith("10 empty texts dropped"))
    assert line == "10 empty texts dropped: " + ", ".join(lines)
    # without drop_empty, every empty text is refused at once (count and the first five lines)
    ctx = _cls_study(tmp_path, tiny_model_dir, "\n".join(rows) + "\n", cleaning=["strip"])
    with pytest.raises(TuneproofError, match=r"^10 empty text\(s\): .*train.csv:2, .*train.csv:5, .*train.csv:29\n"):
        ctx.all_splits


@pytest.mark.parametrize("value", ["NaN", "nan", "None", "null", "", "  "])
def test_missing_value_labels_are_refused(tmp_path, value):
    p = tmp_path / "d.csv"
    p.write_text(f'text,label\nhello there,greet\nbye now,"{value}"\n')
    with pytest.raises(TuneproofError, match=r"d.csv:3: .* label in column 'label' \(a missing value, not a class\)"):
        load_csv(p, FieldMap(label="label"))


def test_json_null_and_nan_labels_and_non_string_texts_are_refused(tmp_path):
    p = tmp_path / "d.jsonl"
    for rec, msg in (
        ({"text": "a b", "label": None}, r"d.jsonl:1: empty label"),
        ({"text": "a b", "label": float("nan")}, r"d.jsonl:1: nan label"),
        ({"text": 12345, "label": "x"}, r"d.jsonl:1: text in column 'text' is int 12345, not a string"),
        ({"text": ["a"], "label": "x"}, r"d.jsonl:1: text in column 'text' is list \[\"a\"\], not a string"),
    ):
        p.write_text(json.dumps(rec) + "\n")
        with pytest.raises(TuneproofError, match=msg):
            load_json_records(p, FieldMap(label="label"), lines=True)


BAD_LINES = (3, 5, 6, 9, 12, 14, 17)  # the file lines of the 7 missing-value labels (line 1 is the CSV header)


def _rows_with_bad_labels(n_lines: int = 18) -> list[tuple[str, str]]:
    values = iter(["NaN", "", "None", "null", "nan", "  ", "NULL"])
    return [
        (f"row {i} text", next(values) if i in BAD_LINES else ("greet" if i % 2 else "bye"))
        for i in range(2, n_lines + 1)
    ]


def _assert_seven_named(message: str, path) -> None:
    first_line = message.splitlines()[0]
    assert first_line.startswith(f"{path}: 7 rows refused: ")
    for line in BAD_LINES:  # all seven (under the cap of 20), each with its file:line
        assert f"{path}:{line}" in first_line, line
    assert "more" not in first_line
    assert "(a missing value, not a class)" in first_line
    assert len(message.splitlines()) == 2 and message.splitlines()[1] == "  -> fill or drop the row"


def test_every_bad_label_of_a_csv_is_counted_and_the_first_five_named(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("text,label\n" + "".join(f'{t},"{lab}"\n' for t, lab in _rows_with_bad_labels()))
    with pytest.raises(TuneproofError) as err:
        load_csv(p, FieldMap(label="label"))
    _assert_seven_named(str(err.value), p)
    assert f"{p}:3: 'NaN' label" in str(err.value) and f"{p}:5: empty label" in str(err.value)


def test_every_bad_row_of_a_jsonl_file_is_named_in_file_order(tmp_path):
    """Missing-value labels, a line that is not JSON and a text that is not a string: one error, in file order."""
    p = tmp_path / "d.jsonl"
    lines = []
    for t, lab in _rows_with_bad_labels():
        lines.append(json.dumps({"text": t, "label": None if lab in ("null", "None") else lab}))
    lines.insert(0, json.dumps({"text": "first", "label": "greet"}))
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(TuneproofError) as err:
        load_json_records(p, FieldMap(label="label"), lines=True)
    _assert_seven_named(str(err.value), p)
    p.write_text(
        '{"text": "ok", "label": "a"}\n{"text": 12, "label": "b"}\nnot json\n{"text": "fine", "label": "nan"}\n'
    )
    with pytest.raises(TuneproofError) as err:
        load_json_records(p, FieldMap(label="label"), lines=True)
    assert str(err.value).splitlines()[0] == (
        f"{p}: 3 rows refused: {p}:2: text in column 'text' is int 12, not a "
        f"string; {p}:3: invalid JSON line (Expecting value); "
        f"{p}:4: 'nan' label in column 'label' (a missing value, not a class)"
    )


def test_every_bad_label_of_a_label_file_and_every_duplicate_id_is_named(tmp_path):
    labels = ["greet" if i % 2 else "bye" for i in range(1, 18)]
    for i in (2, 4, 5, 8, 11, 13, 16):  # lines of the label file
        labels[i - 1] = "nan"
    _write_lines(tmp_path / "train", [f"text {i}" for i in range(1, 18)], labels)
    with pytest.raises(TuneproofError) as err:
        load_lines(tmp_path / "train", FieldMap())
    seq = tmp_path / "train" / "seq.in"
    first = str(err.value).splitlines()[0]
    assert first == (
        f"{seq}: 7 rows refused: {seq}:2, {seq}:4, {seq}:5, {seq}:8, {seq}:11, {seq}:13, {seq}:16: 'nan' label in "
        "file 'label' (a missing value, not a class)"
    )

    from tuneproof.data.examples import Example
    from tuneproof.data.split import check_unique_ids

    exs = [Example(id=f"x{i % 4}", text="t", source=f"d.csv:{i + 2}") for i in range(10)]
    with pytest.raises(TuneproofError) as err:
        check_unique_ids(exs)
    assert str(err.value).splitlines()[0] == (
        "6 duplicate example ids: 'x0' (d.csv:2 and d.csv:6), 'x1' (d.csv:3 and d.csv:7), "
        "'x2' (d.csv:4 and d.csv:8), 'x3' (d.csv:5 and d.csv:9), 'x0' (d.csv:2 and d.csv:10), "
        "'x1' (d.csv:3 and d.csv:11)"
    )


def test_a_50mb_line_is_refused_by_the_character_limit_before_tokenising(tmp_path):
    p = tmp_path / "big.csv"
    p.write_text("text,label\nshort one,a\n" + "x" * 50_000_000 + ",b\n")
    t0 = time.perf_counter()
    with pytest.raises(TuneproofError) as err:
        load_csv(p, FieldMap(label="label"))
    assert "big.csv:3: the text in column 'text' is 50,000,000 characters, over data.max_chars 100,000" in str(
        err.value
    )
    assert "raise data.max_chars" in str(err.value)
    assert time.perf_counter() - t0 < 60  # bounded, not the minutes of tokenising it (not a speed target)
    ex, _ = load_csv(p, FieldMap(label="label"), max_chars=60_000_000)
    assert len(ex[1].text) == 50_000_000


def test_empty_files_and_header_only_csv_are_named(tmp_path):
    for name, body, fmt, msg in (
        ("e.csv", "", "csv", "e.csv: empty file, no header and no examples"),
        ("h.csv", "text,label\n", "csv", "h.csv: header only, no examples (columns: text, label)"),
        ("e.jsonl", "\n", "jsonl", "e.jsonl: empty file, no examples"),
        ("e.json", "[]", "json", "e.json: no records, no examples"),
    ):
        (tmp_path / name).write_text(body)
        with pytest.raises(TuneproofError) as err:
            load_source(Source(path=name, format=fmt, split="train"), FieldMap(label="label"), tmp_path)
        assert str(tmp_path / msg) in str(err.value)
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "seq.in").write_text("")
    with pytest.raises(TuneproofError, match=r"train/seq.in: empty file, no examples"):
        load_source(Source(path="train", format="lines"), FieldMap(), tmp_path)


def test_fields_on_banking77_are_applied_or_refused(shared_data):
    root = shared_data / "banking77"
    with pytest.raises(TuneproofError) as err:
        load_source(Source(path=str(root), format="banking77"), FieldMap(label="intent"), shared_data)
    assert f"{root / 'train.csv'}:1: column 'intent' not found (columns: text, category)" in str(err.value)
    ex, _ = load_source(Source(path=str(root), format="banking77"), FieldMap(label="category"), shared_data)
    assert len(ex) == 13083 and len({e.label for e in ex}) == 77
    with pytest.raises(TuneproofError, match=r"data.fields \(label\) does not apply to format 'snips'"):
        load_source(Source(path=str(shared_data / "snips"), format="snips"), FieldMap(label="x"), shared_data)


def test_optional_naming_no_field_is_refused(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"text": "a b", "target": "x"}\n')
    with pytest.raises(TuneproofError, match=r"data.fields.optional: 'slotz' names no field or target key"):
        load_json_records(p, FieldMap(target={"intent": "i", "slots": "s"}, optional=["slotz"]), lines=True)


def test_changed_split_settings_cut_again_until_a_run_that_is_not_a_data_check_used_them(tmp_path, tiny_model_dir):
    rows = "text,label\n" + "".join(f"sentence number {i} about topic {i % 2},{'ab'[i % 2]}\n" for i in range(40))
    ctx = _cls_study(tmp_path, tiny_model_dir, rows)
    assert len(ctx.all_splits["validation"]) == 20
    with ctx.registry.run("data-check"):
        pass  # a data check only reads the split
    capped = {"fractions": {"train": 0.5, "validation": 0.5}, "max_examples": {"validation": 6}}
    ctx = _cls_study(tmp_path, tiny_model_dir, rows, split=capped)
    assert len(ctx.all_splits["validation"]) == 6 and ctx.manifest_created
    assert ctx.split_info["resplit"] == ["data.split.max_examples: {} -> {'validation': 6}"]
    with ctx.registry.run("baseline"):
        pass  # a run that read the split (a running one is the command's own: it does not count)
    capped["max_examples"] = {"validation": 8}
    ctx = _cls_study(tmp_path, tiny_model_dir, rows, split=capped)
    with pytest.raises(TuneproofError, match=r"splits.json was cut with other split settings .*runs r0002 used it"):
        ctx.all_splits
