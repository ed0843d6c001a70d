"""Label audits and strict-JSON target audits (docs/CASES.md C16)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tuneproof.data.audit import audit_labels, audit_targets
from tuneproof.data.examples import Example
from tuneproof.errors import TuneproofError

BANKING77 = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "banking77"


def _ex(i: str, text: str, label=None, target=None, source=None) -> Example:
    return Example(id=i, text=text, label=label, target=target, source=source or f"{i}.jsonl:1")


def test_a_class_never_in_train_names_its_rows():
    """7 validation rows whose label train never shows (a typo of the label set): the hard fault
    counts them and names the first five file:line, so all are fixed in one pass."""
    lines = (4, 7, 8, 11, 15, 20, 23)
    splits = {
        "train": [_ex(f"tr{i}", f"text {i}", "card" if i % 2 else "lost") for i in range(6)],
        "validation": [
            _ex(f"va{i}", f"other {i}", "crad" if i in lines else "card", source=f"valid.csv:{i}") for i in range(2, 25)
        ],
    }
    r = audit_labels(splits)
    assert r["hard_faults"] == [
        "class 'crad' is in validation (7 examples: valid.csv:4, valid.csv:7, valid.csv:8, valid.csv:11, "
        "valid.csv:15 and 2 more) but never in train: the model cannot learn it"
    ]


def test_audit_labels_counts_missing_conflicts_and_empty():
    splits = {
        "test": [_ex("te1", "where is my card", "card"), _ex("te2", "close my account", "close")],
        "train": [
            _ex("tr1", "Where is my card?", "card"),
            _ex("tr2", "card not here", "card"),
            _ex("tr3", "card lost", "card"),
            _ex("tr4", "top up please", "top_up"),
            _ex("tr5", "hello", None),
            _ex("tr6", "WHERE is my card", "lost"),
        ],
    }
    r = audit_labels(splits)
    assert r["class_counts"] == {"train": {"card": 3, "lost": 1, "top_up": 1}, "test": {"card": 1, "close": 1}}
    assert r["imbalance_ratio"] == {"train": 3.0, "test": 1.0}
    assert r["missing_classes"] == [
        {"label": "close", "present_in": ["test"], "absent_from": ["train"]},
        {"label": "lost", "present_in": ["train"], "absent_from": ["test"]},
        {"label": "top_up", "present_in": ["train"], "absent_from": ["test"]},
    ]
    assert r["empty_labels"] == ["tr5"]
    assert r["conflicting_labels"] == [
        {
            "text": "where is my card",
            "labels": ["card", "lost"],
            "examples": [
                {"id": "tr1", "split": "train", "label": "card"},
                {"id": "tr6", "split": "train", "label": "lost"},
                {"id": "te1", "split": "test", "label": "card"},
            ],
        }
    ]
    # 'close' is only in the reserved test split: nothing to fix before baseline/train, a named warning
    assert r["hard_faults"] == ["1 example(s) have an empty label: tr5"]
    assert r["warnings"] == [
        "class 'close' is in test (1 example: te2.jsonl:1) but never in train: the model cannot learn it; "
        "its examples count against every candidate on the 'test' split",
        "class 'lost' is in train but not in test: it is never measured there",
        "class 'top_up' is in train but not in test: it is never measured there",
        "1 text(s) appear with different labels: tr1 (card / lost)",
    ]
    json.dumps(r)


def test_audit_labels_imbalance_warning_and_unlabelled_data():
    train = [_ex(f"a{i}", f"text a {i}", "a") for i in range(11)] + [_ex("b0", "text b", "b")]
    r = audit_labels({"train": train})
    assert r["imbalance_ratio"]["train"] == 11.0
    assert r["warnings"] == [
        "train: class imbalance 11.0x ('a' 11 vs 'b' 1): report per-class recall, not only accuracy"
    ]
    unlabelled = audit_labels({"train": [_ex("x", "text"), _ex("y", "other")]})
    assert unlabelled["class_counts"] == {"train": {}} and unlabelled["imbalance_ratio"] == {"train": None}
    assert unlabelled["empty_labels"] == [] and unlabelled["hard_faults"] == [] and unlabelled["warnings"] == []
    with pytest.raises(TuneproofError, match="non-empty dict"):
        audit_labels({})


@pytest.mark.skipif(not BANKING77.is_dir(), reason="../shared/data/banking77 not present")
def test_audit_labels_banking77():
    splits = {}
    for name in ("train", "test"):
        with open(BANKING77 / f"{name}.csv", encoding="utf-8", newline="") as fh:
            splits[name] = [_ex(f"{name}:{i}", r["text"], r["category"]) for i, r in enumerate(csv.DictReader(fh))]
    r = audit_labels(splits)
    train = r["class_counts"]["train"]
    assert len(train) == 77 and sum(train.values()) == 10003
    assert min(train.values()) == train["contactless_not_working"] == 35  # SOURCE.md: min 35
    assert max(train.values()) == train["card_payment_fee_charged"] == 187  # SOURCE.md: max 187
    assert r["imbalance_ratio"] == {"train": pytest.approx(187 / 35), "test": 1.0}
    assert set(r["class_counts"]["test"].values()) == {40}
    assert r["missing_classes"] == [] and r["conflicting_labels"] == [] and r["empty_labels"] == []
    assert r["hard_faults"] == [] and r["warnings"] == []


# --------------------------------------------------------------------------- targets (docs/CASES.md C16)
def test_c16_python_dict_target_gives_parse_rate_50_and_is_named():
    examples = [
        _ex(
            "snips/0",
            "play jazz",
            "PlayMusic",
            "{'intent': 'PlayMusic', 'slots': {'genre': 'jazz'}, 'ok': True}",
            "train.jsonl:1",
        ),
        _ex(
            "snips/1", "play rock", "PlayMusic", '{"intent": "PlayMusic", "slots": {"genre": "rock"}}', "train.jsonl:2"
        ),
    ]
    r = audit_targets(examples, ["intent", "slots"])
    assert r["n"] == 2 and r["parsed"] == 1 and r["parse_rate"] == 0.5
    assert r["invalid"] == [
        {
            "id": "snips/0",
            "source": "train.jsonl:1",
            "error": "line 1 column 2: Expecting property name enclosed in double quotes",
        }
    ]
    assert r["missing_fields"] == []
    assert r["hard_faults"] == [
        "1 of 2 targets are not strict JSON (parse rate 50.0%): "
        "train.jsonl:1 (line 1 column 2: Expecting property name enclosed in double quotes)"
    ]
    json.dumps(r)


def test_targets_missing_fields_non_objects_nan_and_absent_targets():
    examples = [
        _ex("a", "t", target='{"intent": "X"}', source="f.jsonl:1"),
        _ex("b", "t", target='["intent", "slots"]', source="f.jsonl:2"),
        _ex("c", "t", target='{"intent": "X", "slots": {}, "score": NaN}', source="f.jsonl:3"),
        _ex("d", "t", target=None, source="f.jsonl:4"),
        _ex("e", "t", target='{"intent": "X", "slots": {}}', source="f.jsonl:5"),
    ]
    r = audit_targets(examples, ["intent", "slots"])
    assert r["parsed"] == 3 and r["parse_rate"] == pytest.approx(3 / 5)
    assert r["invalid"] == [
        {"id": "c", "source": "f.jsonl:3", "error": "NaN is not valid JSON"},
        {"id": "d", "source": "f.jsonl:4", "error": "no target"},
    ]
    assert r["missing_fields"] == [
        {"id": "a", "source": "f.jsonl:1", "missing": ["slots"]},
        {"id": "b", "source": "f.jsonl:2", "missing": ["intent", "slots"]},
    ]
    assert (
        r["hard_faults"][1]
        == "2 of 3 parsed targets lack required fields: f.jsonl:1 (missing slots), f.jsonl:2 (missing intent, slots)"
    )
    # without required fields only strictness counts; the default is docs/CONTRACTS.md's ["intent", "slots"]
    assert audit_targets(examples, [])["missing_fields"] == []
    assert audit_targets(examples)["required_fields"] == ["intent", "slots"]
    assert audit_targets([], [])["parse_rate"] == 1.0


def test_targets_long_lists_are_shortened_and_bad_arguments_rejected():
    examples = [_ex(f"x{i}", "t", target="{bad", source=f"f.jsonl:{i + 1}") for i in range(7)]
    r = audit_targets(examples, [])
    assert r["parse_rate"] == 0.0
    assert r["hard_faults"][0].startswith("7 of 7 targets are not strict JSON (parse rate 0.0%): f.jsonl:1 (")
    assert r["hard_faults"][0].endswith(" and 2 more")
    with pytest.raises(TuneproofError, match="required_fields must be a list"):
        audit_targets(examples, "intent")
    with pytest.raises(TuneproofError, match="examples must be a list"):
        audit_targets(None, [])  # type: ignore[arg-type]


def test_labels_differing_only_in_case_or_spaces_are_named():
    from tuneproof.data.audit import audit_labels
    from tuneproof.data.examples import Example

    labels = ["sport", "sport ", "Sport ", "news", "news", "Sport ", "news\u200b"]
    train = [Example(id=f"t{i}", text=f"text {i}", label=lab) for i, lab in enumerate(labels)]
    rep = audit_labels({"train": train})
    assert rep["near_identical_labels"] == [["Sport ", "sport", "sport "], ["news", "news\u200b"]]
    said = " ".join(rep["warnings"])
    assert (
        "labels 'Sport ', 'sport', 'sport ' differ only in case, spaces or invisible characters: they are 3 separate "
        "classes" in said
    )
    assert "labels 'news', 'news\\u200b' differ only in case, spaces or invisible characters: they are 2" in said
    clean = audit_labels({"train": [Example(id="a", text="x", label="sport"), Example(id="b", text="y", label="news")]})
    assert clean["near_identical_labels"] == []
