"""User text reaches the screen only through ``tuneproof.ui.user_text`` (docs/ARCHITECTURE.md, "User
text is shown, never interpreted"): Rich's ``escape`` is used by ui.py alone, and a Rich print or table
that interpolates a field holding user text (a reason, a message, a detail, a label...) wraps it."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "tuneproof"

#: names of values that hold user text: run reasons, check messages and details, --skip-* overrides,
#: --why, labels / classes / categories, example texts, variant changes, recorded errors
USER_FIELDS = {
    "reason",
    "message",
    "detail",
    "override",
    "why",
    "label",
    "labels",
    "category",
    "text",
    "change",
    "warning",
    "err",
    "note",
    "path",
    "dest",
    "bundle",
    "directory",
}
#: the calls that make user text safe to show
SAFE_CALLS = {"user_text", "visible_text", "markdown_text", "html_text", "len"}


def _unsafe(node: ast.AST) -> bool:
    """Whether the value ``node`` shows reads a user-text field (``x.reason``, ``x["reason"]``,
    ``reason``) outside a safe call; the test of a conditional is not shown."""
    if isinstance(node, ast.Call):
        fn = node.func
        if (fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else "") in SAFE_CALLS:
            return False
    if isinstance(node, ast.IfExp):
        return _unsafe(node.body) or _unsafe(node.orelse)
    if isinstance(node, ast.Attribute) and node.attr in USER_FIELDS:
        return True
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value in USER_FIELDS:
        return True
    if isinstance(node, ast.Name) and node.id in USER_FIELDS:
        return True
    return any(_unsafe(child) for child in ast.iter_child_nodes(node))


def _markup_args(call: ast.Call) -> list[ast.AST]:
    """The arguments Rich parses as markup: a ``console.print`` without ``markup=False``, a
    ``console.rule``, a ``table``."""
    fn = call.func
    name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
    if name in ("print", "rule") and isinstance(fn, ast.Attribute) and "console" in ast.unparse(fn.value):
        plain = [k for k in call.keywords if k.arg == "markup" and isinstance(k.value, ast.Constant)]
        if plain and plain[0].value.value is False:
            return []
        return list(call.args)
    if name == "table":
        return list(call.args)
    return []


def test_rich_escape_is_used_only_by_ui():
    users = [
        str(p.relative_to(SRC))
        for p in SRC.rglob("*.py")
        if p.name != "ui.py" and "rich.markup import escape" in p.read_text()
    ]
    assert users == [], f"print user text with tuneproof.ui.user_text, not rich.markup.escape: {users}"


def test_rich_prints_wrap_user_text_fields():
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for call in ast.walk(tree):
            if not isinstance(call, ast.Call):
                continue
            for arg in _markup_args(call):
                for node in ast.walk(arg):
                    if isinstance(node, ast.FormattedValue) and _unsafe(node.value):
                        bad.append(f"{path.relative_to(SRC)}:{node.lineno}: {{{ast.unparse(node.value)}}}")
    assert bad == [], "user text printed as Rich markup without ui.user_text:\n" + "\n".join(bad)
