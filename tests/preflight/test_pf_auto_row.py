"""The preflight's ``speedups auto`` row names the speed-ups auto left off, not only those it used: its
headline was the message's first clause, ``used: chunked_loss``, so length grouping (which auto never
turns on) was not on the screen at all."""

from __future__ import annotations

from tuneproof.preflight.report import headline
from tuneproof.recipes.preflight import _auto_message, _auto_numbers

RECORD = {
    "used": ["chunked_loss"],
    "decisions": {
        "packing": {"used": False, "reason": "pays only with varlen (flash) attention on a GPU"},
        "length_grouping": {"used": False, "reason": "would lower the padding 14.8% -> 2.1% but changes ..."},
        "chunked_loss": {"used": True, "reason": "check passed"},
        "compile": {"used": False, "reason": "not tried on a CPU"},
    },
}


def test_the_row_names_what_auto_used_and_left_off_on_one_line():
    numbers = _auto_numbers(RECORD)
    assert numbers == {"used": "chunked_loss", "off": "packing,length_grouping,compile"}
    row = {"name": "speedups auto", "passed": True, "message": _auto_message(RECORD), "numbers": numbers}
    assert headline(row) == (
        "used: chunked_loss; off: packing, length_grouping, compile (why each: preflight.json, the dossier)"
    )


def test_nothing_used_and_an_older_record_without_off():
    numbers = _auto_numbers({"used": [], "decisions": {"packing": {"used": False, "reason": "x"}}})
    assert numbers == {"used": "none", "off": "packing"}
    older = {
        "name": "speedups auto",
        "passed": True,
        "message": "used: none; packing off: x",
        "numbers": {"used": "none"},
    }
    assert headline(older) == "used: none"
