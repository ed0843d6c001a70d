"""The layer rule of docs/ARCHITECTURE.md, enforced: a package of ``src/tuneproof`` imports only
packages below it (every import, function-level ones included), no two packages import each
other, directly or through others, and tuneproof imports sit at the top of their module."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "tuneproof"

#: lowest first; a unit is a subpackage or a top-level module of tuneproof (docs/ARCHITECTURE.md)
LAYERS: list[set[str]] = [
    {"errors", "procs", "ui", "io", "clock", "patterns", "__init__"},
    {"study"},
    {"data", "models", "registry", "storage", "tracking"},
    {"tasks", "modalities", "context"},
    {"training", "evaluation"},
    {"preflight", "hypothesis"},
    {"deliver"},
    {"recipes"},
    {"cli", "__main__"},
]
LEVEL = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}


def _unit(rel: Path) -> str:
    return rel.with_suffix("").parts[0]


def imports_of(path: Path, root: Path = SRC) -> list[tuple[str, int]]:
    """``(unit, line)`` for every ``tuneproof`` import in ``path`` (a file under ``root``), at any
    depth of the module; ``from tuneproof import NAME`` of a name that is no unit is ``__init__``."""
    rel = path.relative_to(root)
    package = ["tuneproof", *rel.parent.parts]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(a.name.split(".")[1], node.lineno) for a in node.names if a.name.startswith("tuneproof.")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                module = package[: len(package) - node.level + 1] + (node.module.split(".") if node.module else [])
            else:
                module = (node.module or "").split(".")
            if module[0] != "tuneproof":
                continue
            if len(module) > 1:
                found.append((module[1], node.lineno))
            else:
                found += [
                    (
                        a.name if (root / a.name).is_dir() or (root / f"{a.name}.py").is_file() else "__init__",
                        node.lineno,
                    )
                    for a in node.names
                ]
    return found


def graph() -> tuple[dict[str, set[str]], list[tuple[str, str, int]]]:
    """The unit graph (``unit -> units it imports``) and every ``(file, unit, line)`` import."""
    edges: dict[str, set[str]] = {}
    rows = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        unit = _unit(rel)
        for target, line in imports_of(path):
            if target != unit:
                edges.setdefault(unit, set()).add(target)
                rows.append((rel.as_posix(), target, line))
    return edges, rows


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one unit (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_every_unit_has_a_layer():
    edges, _ = graph()
    units = set(edges) | {u for targets in edges.values() for u in targets}
    assert sorted(units - set(LEVEL)) == []


def test_no_import_climbs_a_layer():
    _, rows = graph()
    upward = sorted((f, t, line) for f, t, line in rows if LEVEL[t] > LEVEL[_unit(Path(f))])
    assert upward == [], "an import climbs a layer (docs/ARCHITECTURE.md): move the code down"


#: imports a lower unit may not make either: the training engine knows nothing of the study
#: context or the run registry (recipes hand it plain collaborators)
FORBIDDEN: dict[str, set[str]] = {"training": {"context", "registry", "storage", "tracking"}}


def test_training_knows_no_context_or_registry():
    _, rows = graph()
    found = sorted((f, t, line) for f, t, line in rows if t in FORBIDDEN.get(_unit(Path(f)), set()))
    assert found == []


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the import nodes under a module-level ``if TYPE_CHECKING:`` (never run)."""
    out = set()
    for node in tree.body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            out |= {id(n) for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))}
    return out


def inner_imports() -> set[str]:
    """``file: module`` for every tuneproof import below the module's top level (cli.py excepted:
    its lazy recipe imports keep `tuneproof --help` fast)."""
    inner = set()
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "cli.py" and path.parent == SRC:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = set(map(id, tree.body)) | _type_checking_only(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in skip:
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                inner |= {f"{path.relative_to(SRC).as_posix()}: {n}" for n in names if n.startswith("tuneproof")}
    return inner


def test_imports_are_at_the_top():
    assert sorted(inner_imports()) == [], "import it at the top of the module (docs/ARCHITECTURE.md)"


def test_no_cycle_between_packages():
    edges, _ = graph()
    assert cycles(edges) == []


def test_the_scan_sees_function_level_and_relative_imports(tmp_path):
    (tmp_path / "training").mkdir()
    (tmp_path / "recipes").mkdir()
    (tmp_path / "training" / "x.py").write_text(
        "from tuneproof import SCHEMA_VERSION, recipes\n"
        "def f():\n    from tuneproof.recipes.train import build_model\n"
        "    from ..preflight import memory\n    import tuneproof.deliver.card\n"
    )
    assert sorted(imports_of(tmp_path / "training" / "x.py", tmp_path)) == [
        ("__init__", 1),
        ("deliver", 5),
        ("preflight", 4),
        ("recipes", 1),
        ("recipes", 3),
    ]


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
