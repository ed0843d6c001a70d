"""Loading a file never runs code (docs/CASES.md C21): a rule over the whole package's source, by AST.

Refused anywhere in ``src/tuneproof``:
- pickle and its kin (``pickle``, ``cPickle``, ``dill``, ``cloudpickle``, ``joblib``, ``marshal``,
  ``shelve``) imported, ``pandas.read_pickle``, ``torch.jit.load``;
- ``torch.load`` without ``weights_only=True``; ``numpy.load(..., allow_pickle=True)``;
- ``trust_remote_code=True`` written as a constant (it must come from ``model.trust_remote_code``);
- the builtins ``eval``, ``exec``, ``compile``, ``__import__``;
- PyYAML loaders other than ``yaml.safe_load`` (``yaml.load``, ``full_load``, ``unsafe_load``,
  ``Loader``, ``FullLoader``, ``UnsafeLoader``...).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "tuneproof"
BANNED_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib", "marshal", "shelve"}
BANNED_BUILTINS = {"eval", "exec", "compile", "__import__"}
YAML_ALLOWED = {"safe_load", "safe_load_all", "safe_dump", "safe_dump_all", "YAMLError"}


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def _kw(call: ast.Call, name: str):
    return next((k.value for k in call.keywords if k.arg == name), None)


def violations(source: str, filename: str = "<src>") -> list[str]:
    """``"file:line: what"`` for every breach of the rule in ``source``."""
    tree = ast.parse(source, filename)
    out = []
    yaml_names = {"yaml"}
    for node in ast.walk(tree):
        where = f"{filename}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in BANNED_MODULES:
                    out.append(f"{where}: import {a.name}")
                if a.name == "yaml" and a.asname:
                    yaml_names.add(a.asname)
        elif isinstance(node, ast.ImportFrom):
            mod = (node.module or "").split(".")[0]
            if mod in BANNED_MODULES:
                out.append(f"{where}: from {node.module} import ...")
            if mod == "yaml":
                out += [f"{where}: from yaml import {a.name}" for a in node.names if a.name not in YAML_ALLOWED]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in yaml_names:
            if node.attr not in YAML_ALLOWED:
                out.append(f"{where}: yaml.{node.attr}")
        elif isinstance(node, ast.Call):
            name = _dotted(node.func)
            if isinstance(node.func, ast.Name) and node.func.id in BANNED_BUILTINS:
                out.append(f"{where}: {node.func.id}()")
            if name == "torch.load" or name.endswith(".torch.load"):
                wo = _kw(node, "weights_only")
                if not (isinstance(wo, ast.Constant) and wo.value is True):
                    out.append(f"{where}: torch.load without weights_only=True")
            if name.endswith("jit.load"):
                out.append(f"{where}: torch.jit.load")
            if name.endswith("read_pickle"):
                out.append(f"{where}: read_pickle")
            if name in ("np.load", "numpy.load"):
                ap = _kw(node, "allow_pickle")
                if isinstance(ap, ast.Constant) and ap.value is True:
                    out.append(f"{where}: numpy.load(allow_pickle=True)")
            trc = _kw(node, "trust_remote_code")
            if isinstance(trc, ast.Constant) and trc.value is True:
                out.append(f"{where}: trust_remote_code=True")
    return out


def test_the_package_never_loads_code():
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 50  # the whole package is scanned
    found = []
    for path in files:
        found += violations(path.read_text(encoding="utf-8"), str(path.relative_to(SRC)))
    assert found == []


def test_every_from_pretrained_of_the_base_passes_the_study_setting():
    """transformers' loaders in models/base_model.py get ``trust_remote_code`` from ``model.trust_remote_code``."""
    tree = ast.parse((SRC / "models" / "base_model.py").read_text())
    calls = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and _dotted(n.func).endswith("from_pretrained")
        and not any(k.arg == "gguf_file" for k in n.keywords)
    ]
    assert len(calls) >= 3  # tokenizer, sequence classification, causal LM (and any later one)
    assert all(_dotted(_kw(c, "trust_remote_code")) == "ref.trust_remote_code" for c in calls)


def test_study_key_trust_remote_code_defaults_to_false_and_is_recorded():
    from tuneproof.study import ModelSpec

    assert ModelSpec(base="x").trust_remote_code is False
    assert ModelSpec(base="x", trust_remote_code=True).model_dump()["trust_remote_code"] is True


@pytest.mark.parametrize(
    "snippet, expected",
    [
        ("import pickle", "import pickle"),
        ("from joblib import load", "from joblib import ..."),
        ("import torch\ntorch.load(p)", "torch.load without weights_only=True"),
        ("import torch\ntorch.load(p, weights_only=False)", "torch.load without weights_only=True"),
        ("x = eval('1')", "eval()"),
        ("exec(code)", "exec()"),
        ("import yaml\nyaml.load(t, Loader=yaml.Loader)", "yaml.load"),
        ("import yaml as y\ny.unsafe_load(t)", "yaml.unsafe_load"),
        ("from yaml import FullLoader", "from yaml import FullLoader"),
        ("AutoModel.from_pretrained(p, trust_remote_code=True)", "trust_remote_code=True"),
        ("import numpy as np\nnp.load(p, allow_pickle=True)", "numpy.load(allow_pickle=True)"),
        ("import pandas as pd\npd.read_pickle(p)", "read_pickle"),
    ],
)
def test_the_rule_catches_each_kind(snippet, expected):
    found = violations(snippet)
    assert len(found) >= 1 and any(f.endswith(": " + expected) for f in found), found


def test_allowed_forms_pass():
    ok = (
        "import torch, yaml\ntorch.load(p, weights_only=True)\nyaml.safe_load(t)\nmodel.eval()\n"
        "AutoModel.from_pretrained(p, trust_remote_code=ref.trust_remote_code)\n"
    )
    assert violations(ok) == []
