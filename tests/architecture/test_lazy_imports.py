"""An import inside a function is for start-up time or an optional package only, and says which
(docs/ARCHITECTURE.md, "The import rule"): every ``# noqa: PLC0415`` outside ``cli.py`` (which imports each
recipe inside its command, the documented exception) carries its reason."""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "tuneproof"
NOQA = re.compile(r"#\s*noqa:\s*PLC0415(.*)$")


def test_every_lazy_import_says_why():
    bare = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "cli.py" and path.parent == SRC:
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            m = NOQA.search(line)
            if m and len(m.group(1).strip(" -:")) < 10:
                bare.append(f"{path.relative_to(SRC)}:{n}: {line.strip()}")
    assert bare == [], "a lazy import without its reason (`# noqa: PLC0415 - <why>`):\n" + "\n".join(bare)


def test_the_rule_can_fail():
    assert NOQA.search("    import torch  # noqa: PLC0415").group(1).strip(" -:") == ""
