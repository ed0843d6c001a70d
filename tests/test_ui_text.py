"""User text (labels, texts, run names, reasons, recorded errors) is shown, never interpreted:
``tuneproof.ui.user_text`` for Rich, ``markdown_text`` and ``html_text`` for the files."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from tuneproof.ui import html_text, markdown_text, table, user_text, visible_text

#: counted by the fault suite (python -m tests.faults.run_all)
pytestmark = pytest.mark.fault("input: user text shown, never interpreted")

ESC = "\x1b"
HOSTILE = {
    "markup": ("[red]x[/]", "[red]x[/]"),
    "gloo path": ("[/__w/a.cc:537] Connection closed", "[/__w/a.cc:537] Connection closed"),
    "bracketed word": ("only report_to: [mlflow] added", "only report_to: [mlflow] added"),
    "clear screen": ("\x1b[2J\x1b[Hclear", "\\x1b[2J\\x1b[Hclear"),
    "OSC 8 link": ("\x1b]8;;http://x\x07link\x1b]8;;\x07", "\\x1b]8;;http://x\\x07link\\x1b]8;;\\x07"),
    "carriage return": ("ok\rFAKE", "ok\\rFAKE"),
    "C1 CSI": ("a\x9b2Jb", "a\\x9b2Jb"),
    "bidi override": ("abc\u202edcba", "abc\\u202edcba"),
    "trailing backslash": ("C:\\data\\", "C:\\data\\"),
}


def _printed(markup: str, width: int = 200) -> str:
    """What the terminal receives for ``markup``, colours on (a real terminal), as plain text."""
    buf = io.StringIO()
    Console(file=buf, force_terminal=True, color_system=None, width=width).print(markup, soft_wrap=True)
    return buf.getvalue()


@pytest.mark.parametrize("name", list(HOSTILE))
def test_user_text_prints_literally_with_no_escape_byte(name):
    value, shown = HOSTILE[name]
    out = _printed(f"[bold]label[/] {user_text(value)}")
    assert out == f"label {shown}\n"
    assert ESC not in _printed(user_text(value))


def test_user_text_in_a_table_cell_and_title():
    value, shown = HOSTILE["gloo path"]
    buf = io.StringIO()
    con = Console(file=buf, force_terminal=True, color_system=None, width=120)
    con.print(table(user_text("runs of [b]x[/b]"), ["run", "reason"], [["r0001", user_text(value, one_line=True)]]))
    out = buf.getvalue()
    assert shown in out and "runs of [b]x[/b]" in out


def test_newlines_kept_or_shown_on_one_line():
    assert user_text("a\nb\tc") == "a\nb\tc"
    assert user_text("a\nb\tc", one_line=True) == "a\\nb\\tc"
    assert _printed(user_text("line 1\n[x]line 2", one_line=True)) == "line 1\\n[x]line 2\n"


def test_long_text_is_cut_with_the_count_of_what_is_left_out():
    value = "y" * 100_000
    assert user_text(value) == "y" * 2000 + "... (98000 more characters)"
    assert user_text(value, limit=10) == "y" * 10 + "... (99990 more characters)"
    assert user_text(value, limit=None) == value
    assert user_text("y" * 2000) == "y" * 2000


def test_none_and_non_strings():
    assert user_text(None) == ""
    assert user_text(3.5) == "3.5"
    assert visible_text(ESC) == "\\x1b"


def test_markdown_text_neutralises_syntax_and_controls():
    assert markdown_text("card_arrival") == "card_arrival"
    assert markdown_text("_x_ *y* a|b <script>") == "\\_x\\_ \\*y\\* a\\|b \\<script>"
    assert markdown_text("[link](http://x) ![img](http://x/p.png)") == "[link\\](http://x) ![img\\](http://x/p.png)"
    assert markdown_text("[ref]: http://x") == "[ref\\]: http://x"
    assert markdown_text("[red]x[/] [-0.48, 0.35]") == "[red]x[/] [-0.48, 0.35]"  # no link: as written
    assert markdown_text("# title") == "\\# title"
    assert markdown_text("- item") == "\\- item"
    assert markdown_text("> quote") == "\\> quote"
    assert markdown_text("---") == "\\---"
    assert markdown_text("12. item") == "12\\. item"
    assert markdown_text("-0.025") == "-0.025" and markdown_text("5.000") == "5.000"
    assert markdown_text("&amp; R&D") == "&amp;amp; R&D"
    assert markdown_text("\x1b[2J") == "\\\\x1b[2J"  # renders as the visible \x1b[2J
    assert markdown_text("a\nb") == "a\\\\nb"  # renders as a\nb, on one line
    assert markdown_text("a\n# b", one_line=False) == "a  \n\\# b"
    assert markdown_text("run `tuneproof eval`", code_spans=True) == "run `tuneproof eval`"
    assert markdown_text("run `x`") == "run \\`x\\`"
    assert ESC not in markdown_text(HOSTILE["OSC 8 link"][0])


def test_one_line_text_is_cut_sooner():
    assert user_text("z" * 300, one_line=True) == "z" * 200 + "... (100 more characters)"
    assert user_text("z" * 300) == "z" * 300


def test_html_text_escapes_tags_quotes_and_controls():
    assert html_text('<b a="1">x</b>') == "&lt;b a=&quot;1&quot;&gt;x&lt;/b&gt;"
    assert html_text("\x1b[2J&") == "\\x1b[2J&amp;"


def test_a_trailing_backslash_prints_once_and_escapes_no_closing_tag():
    path, two = "C:\\data\\", "a\\\\"
    assert _printed(user_text(path)) == path + "\n"
    assert _printed("[cyan]" + user_text(path) + "[/] after") == path + " after\n"
    assert _printed("[cyan]" + user_text(two) + "[/]") == two + "\n"


def test_model_card_neutralises_the_study_text():
    from tuneproof.deliver.card import model_card

    evil = "[x](http://evil) <img src=x> \x1b[2J `tick`"
    man = {
        "base_model": {
            "name": "my`base\x1b",
            "path": 'C:\\models\\a"b',
            "revision": "r1",
            "weight_files": {"model.safetensors": "ab"},
            "weights_sha256": "cd",
        },
        "procedure": {"model_kind": "causal-lm"},
        "payload": "adapter",
        "run": "r0003",
        "tokenizer": {"class": "T", "vocab_size": 10, "probe_hash": "ef"},
        "config": {
            "name": "# study " + evil,
            "hypothesis": {"task": "classification", "behaviour": "line 1\n# not a heading " + evil},
            "method": {"kind": "full"},
            "data": {"sources": []},
            "eval": {"split": "validation"},
            "training": {
                "micro_batch_size": 1,
                "gradient_accumulation_steps": 1,
                "learning_rate": 0.1,
                "max_length": 8,
                "seed": 0,
            },
        },
        "forced": {"status": "invalid", "reason": evil},
        "comparison": {
            "verdict": "fail",
            "detail": evil,
            "metrics": {},
            "verdicts": [{"kind": "guard", "verdict": "fail", "name": evil}],
        },
        "limits": {"notes": [evil]},
    }
    card = model_card(man)
    body = card.split("---\n", 2)[2]  # after the metadata block (YAML, quoted by its writer)
    assert ESC not in card and not re.search(r"(?<!\\)(<img|\]\(http)", body)
    assert "# \\# study [x\\](http://evil) \\<img src=x> \\\\x1b[2J \\`tick\\`: r0003" in card
    assert "Behaviour: line 1  \n\\# not a heading" in card
    assert "- local folder ``my`base\\x1b``" in card
    assert 'from_pretrained("my`base\\u001b")' in card  # a Python string literal


def test_progress_descriptions_show_user_text():
    from tuneproof.ui import LineProgress

    lines: list[str] = []
    LineProgress("test r9[red]\x1b[2J", 1, every_s=0.0, out=lines.append).advance()
    assert lines[0].startswith("test r9[red]\\x1b[2J: 1/1 (100%)")


def test_sentences_wrap_at_word_boundaries_on_an_80_column_terminal():
    """A long line printed with soft_wrap=True (kept whole for logs) is cut by an 80-column terminal
    mid-word; on a terminal the console wraps it at spaces instead, and off a terminal keeps it whole."""
    import io

    from tuneproof.ui import WrappingConsole

    sentence = (
        "no preflight for this configuration (the latest passed preflight r0004 was for another configuration: "
        "config method.r: 4 -> 16 changed): running `tuneproof preflight` now, about 3 min 05 s"
    )
    out = io.StringIO()
    term = WrappingConsole(file=out, force_terminal=True, width=80, color_system=None, highlight=False)
    term.print(sentence, soft_wrap=True)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and all(len(line) <= 80 for line in lines)
    assert " ".join(line.strip() for line in lines) == sentence  # every break is at a space
    words = set(sentence.split())
    assert all(word in words for line in lines for word in line.split())
    log = io.StringIO()
    WrappingConsole(file=log, force_terminal=False, width=80, highlight=False).print(sentence, soft_wrap=True)
    assert log.getvalue() == sentence + "\n"
