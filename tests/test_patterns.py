"""Study patterns run with a time limit (src/tuneproof/patterns.py): a pattern that backtracks without end
stops the command with one line naming its key, where Python's re would hang; sound patterns read as re does."""

from __future__ import annotations

import re

import pytest

from tuneproof import patterns
from tuneproof.data.chat_template import parse_answer
from tuneproof.errors import TuneproofError
from tuneproof.study import Eval
from tuneproof.tasks.format import FormatRule

EVIL = r"(a|a)+$"
TEXT = "a" * 40 + "b"  # 2**40 ways to take the a's: re (and regex) would search for hours


def test_a_catastrophic_answer_from_stops_with_its_key_within_the_limit(monkeypatch):
    monkeypatch.setattr(patterns, "MATCH_TIMEOUT_S", 0.2)
    with pytest.raises(TuneproofError) as err:  # stopped by the limit: re would not return for hours
        parse_answer(TEXT, "PLAIN", EVIL, [])
    assert err.value.message == (
        f"eval.answer_from: the regular expression {EVIL!r} ran past 0.2 s on one text of 41 characters "
        "(catastrophic backtracking: a repetition inside a repetition, like (a+)+)"
    )
    assert "without nested repetition" in err.value.hint


def test_a_catastrophic_format_regex_stops_naming_eval_regex(monkeypatch):
    monkeypatch.setattr(patterns, "MATCH_TIMEOUT_S", 0.2)
    rule = FormatRule(None, r"(x|x)+y", None, [], False)
    with pytest.raises(TuneproofError, match=r"^eval.regex: the regular expression '\(x\|x\)\+y' ran past 0.2 s"):
        rule.check("x" * 40)


def test_nested_repetition_that_hangs_re_reads_no_answer_at_once():
    assert parse_answer(TEXT, "PLAIN", r"(a+)+$", []) == ""  # the regex engine prunes this one: no answer, no hang


@pytest.mark.parametrize(
    ("pattern", "text"),
    [(r"Answer: (\w+)", "so... Answer: blue."), (r"(?P<answer>\d+)\s*$", "total 42"), (r"é(\w)", "café ébène")],
)
def test_sound_patterns_match_as_re_does(pattern, text):
    want = re.search(pattern, text, flags=re.DOTALL)
    got = patterns.search(pattern, text, "eval.answer_from", flags=patterns.DOTALL)
    assert got.group(0) == want.group(0) and got.groups() == want.groups()


def test_an_invalid_pattern_is_refused_by_the_study_file_and_by_the_rule():
    with pytest.raises(ValueError, match="neither auto, raw nor a valid regular expression"):
        Eval(answer_from="(unclosed")
    with pytest.raises(TuneproofError, match=r"^eval.regex: not a valid regular expression"):
        FormatRule(None, "[z-a]", None, [], False)
