"""``show RUN`` without --against/--regressed/--fixed joins no baseline: it printed an empty
``baseline`` column beside the candidate, read as a baseline that answered nothing."""

from __future__ import annotations

import tuneproof.recipes.show as show
from tuneproof.ui import console

CAND = [
    {"id": "ex1", "category": "a", "input": "hello", "reference": "R1", "prediction": "P1", "correct": True},
    {"id": "ex2", "category": "b", "input": "bye", "reference": "R2", "prediction": "P2", "correct": False},
]
BASE = [dict(CAND[0], prediction="B1", correct=False), dict(CAND[1], prediction="B2", correct=False)]


def _shown(monkeypatch, **kw) -> str:
    monkeypatch.setattr(console, "_width", 120)  # every column fits, whatever the terminal
    monkeypatch.setattr(show, "resolve_candidate", lambda ctx, run_id: "r0005")
    monkeypatch.setattr(show, "load_outputs", lambda ctx, rid: (None, CAND if rid == "r0005" else BASE))
    with console.capture() as cap:
        assert show.run_show(None, "r0004", **kw) == 2
    return cap.get()


def test_without_a_baseline_there_is_no_baseline_column(monkeypatch):
    out = _shown(monkeypatch)
    assert " ".join(out.split()).startswith("r0005: 2 examples; --against BASELINE adds the baseline's outputs ")
    header = next(line for line in out.splitlines() if "candidate" in line)
    assert header.split("┃")[1:-1] and [c.strip() for c in header.split("┃")[1:-1]] == [
        "id",
        "category",
        "input",
        "reference",
        "candidate",
    ]
    assert "P1" in out and "B1" not in out


def test_against_a_baseline_shows_its_outputs(monkeypatch):
    out = _shown(monkeypatch, against="r0002")
    assert out.startswith("r0005: 2 examples")
    header = next(line for line in out.splitlines() if "candidate" in line)
    assert [c.strip() for c in header.split("┃")[1:-1]] == [
        "id",
        "category",
        "input",
        "reference",
        "baseline",
        "candidate",
    ]
    assert "B1" in out and "P1" in out


def test_nothing_matched_is_said_in_words_not_an_empty_table(monkeypatch):
    monkeypatch.setattr(show, "resolve_candidate", lambda ctx, run_id: "r0005")
    monkeypatch.setattr(show, "load_outputs", lambda ctx, rid: (None, CAND if rid == "r0005" else BASE))
    with console.capture() as cap:
        assert show.run_show(None, "r0004", category="no-such-class") == 0
    assert cap.get().strip() == "r0005: no matching examples"
    with console.capture() as cap:
        assert show.run_show(None, "r0004", category="no-such-class", against="r0002") == 0
    assert cap.get().strip() == "r0005: no matching examples against r0002"
