"""User text is shown, never interpreted, by every command that prints it: labels and texts (the
study's data), run names, --why / --skip-* reasons and recorded error messages holding Rich markup,
ANSI/OSC sequences, newlines and 100k characters print literally, with no ESC byte and no crash;
dossier.md and dossier.html carry them neutralised (tuneproof.ui.user_text, markdown_text, html_text).

One tiny study serves every command (docs/ARCHITECTURE.md, "User text is shown, never interpreted")."""

from __future__ import annotations

import json
import re

import pytest
import yaml

#: counted by the fault suite (python -m tests.faults.run_all)
pytestmark = pytest.mark.fault("input: user text shown, never interpreted")

MARKUP = "[red]x[/]"
GLOO = "[/__w/a.cc:537] Connection closed by peer"
CLEAR = "\x1b[2J\x1b[Hclear"
OSC = "\x1b]8;;http://x\x07link\x1b]8;;\x07"
LONG = "y" * 100_000
# the labels (intents) of the study: each hostile kind is a class the screens name
LABELS = [MARKUP, CLEAR, "two\nlines " + OSC]
REASON = f"only report_to: [mlflow] added {CLEAR} {OSC}\nsecond line"


def _main(args, capsys) -> tuple[int, str]:
    from tuneproof.cli import main

    with pytest.raises(SystemExit) as exit_:
        main([str(a) for a in args])
    out = capsys.readouterr()
    return exit_.value.code, out.out + out.err


def _clean(out: str) -> str:
    """``out`` with no line breaks, spaces or table borders (Rich wraps and folds long cells);
    asserts first that no ESC, BEL or C1 CSI byte reached it."""
    assert "\x1b" not in out, repr(out[:2000])
    assert "\x07" not in out and "\x9b" not in out
    return "".join(ch for ch in out if ch not in "\n│┃|━─ ")


def _seen(text: str, one_line: bool = True) -> str:
    """How ``text`` reads on the screen as :func:`_clean` leaves it: control characters as escapes,
    a newline as ``\\n`` in a ``one_line`` place (a table cell, a name in a line)."""
    text = text.replace("\x1b", "\\x1b").replace("\x07", "\\x07")
    return _clean(text.replace("\n", "\\n") if one_line else text)


@pytest.fixture(scope="module")
def study(tiny_base, tmp_path_factory):
    from tiny_study import make_study

    folder = make_study(tmp_path_factory.mktemp("user-text") / "s", tiny_base, prepare=False)
    for split in ("train", "validation", "test"):
        path = folder / "data" / f"{split}.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        for i, row in enumerate(rows):
            target = json.loads(row["target"])
            target["intent"] = LABELS[i % len(LABELS)]
            row["target"] = json.dumps(target)
        rows[0]["text"] += " " + CLEAR + " " + MARKUP
        rows[1]["text"] += " " + LONG
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = yaml.safe_load((folder / "tuneproof.yaml").read_text())
    cfg["training"]["max_steps"] = 2
    cfg["data"]["max_chars"] = 200_000
    (folder / "tuneproof.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return folder


def test_every_command_shows_user_text_literally(study, capsys, monkeypatch):
    from tuneproof.registry import Registry

    monkeypatch.setenv("COLUMNS", "400")
    s = ["--study", study]

    def run(*args, code=0) -> str:
        rc, out = _main([*args, *s], capsys)
        assert rc == code, out
        return _clean(out)

    run("data", "check")
    out = run("data", "inspect", "-n", "30")  # every train example, the hostile ones included
    assert "ex000" in out
    run("data", "inspect", "-n", "30", "--html")
    assert "\x1b" not in (study / "inspect.html").read_text()
    out = run("baseline")
    for label in LABELS:  # the worst classes, by name, each on one line
        assert _seen(label) + ":recall" in out
    out = run("train", "--skip-preflight", REASON)
    assert _seen("recorded override: " + REASON.split("\n")[0]) in out
    # a recorded error holding a path in brackets (gloo) and an escape sequence
    reg = Registry(study)
    reg.finish("r0003", "failed", f"RuntimeError: {GLOO} {CLEAR}")
    reg.close()
    out = run("runs")
    failed = f"RuntimeError: {GLOO} {CLEAR}"
    assert _seen(failed) in out
    out = run("runs", "--tree")
    assert _seen(failed) in out
    out = run("resume", "r0003")  # a recorded gloo error made it crash with MarkupError
    assert _seen(f"resume r0003 (failed: {failed}) from step-000002") in out
    out = run("eval", "r0003")
    assert all(_seen(label) + ":recall" in out for label in LABELS)
    out = run("compare", "r0004")
    assert "overall" in out  # compare ran to its verdict
    out = run("test", "r0003")  # the sealed split's labels, on the screen once
    assert all(_seen(label) + ":recall" in out for label in LABELS)
    out = run("show", "r0004")
    assert _seen(MARKUP) in out and _seen(CLEAR) in out
    assert re.search(r"y\.\.\.\(98\d{3}morecharacters\)", out)  # the 100k text, cut
    out = run("invalidate", "r0004", "--why", REASON + LONG)
    assert _seen("r0004: invalid (" + REASON, one_line=False) in out and "morecharacters)" in out
    out = run("runs")
    assert _seen(REASON) in out  # one line in its cell
    out = run("show", f"r9{MARKUP}{CLEAR}", code=2)  # a value the user typed, quoted by an error
    assert _seen(f"r9{MARKUP}{CLEAR}") in out
    run("report", "--html")
    md, page = (study / "dossier.md").read_text(), (study / "dossier.html").read_text()
    for text in (md, page):
        assert "\x1b" not in text and "\x07" not in text and "x" * 20_000 not in text
    # Markdown: the labels as written (no link, no HTML), their escape sequences visible (\\x1b renders \x1b)
    assert "[red]x[/]" in md and "\\\\x1b[2J\\\\x1b[Hclear" in md
    assert "[red]x[/]" in page and "\\x1b[2J" in page and "<red>" not in page
