"""Recipe ``schema``: the study file's JSON Schema, and the key reference in ``docs/study-file.md``
generated from the schema's own field descriptions (``tuneproof.study``), so the two cannot drift.

The reference holds one generated table per key group between markers
(``<!-- generated: GROUP -->`` ... ``<!-- end generated: GROUP -->``); the prose around them is
written by hand and kept as it is when the tables are written again.
"""

from __future__ import annotations

import json
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from tuneproof.errors import TuneproofError
from tuneproof.io import atomic_write_text
from tuneproof.study import Study, role_of, study_json_schema

#: the top-level keys that are no group of their own: one table for them
TOP_LEVEL = "top-level"
_MARK = re.compile(r"<!-- generated: ([\w-]+) -->\n.*?<!-- end generated: \1 -->", re.DOTALL)


def schema_text() -> str:
    """The JSON Schema as the text ``tuneproof schema`` prints and ``init`` writes (sorted keys, newline)."""
    return json.dumps(study_json_schema(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_schema(path: Path) -> Path:
    """Write the JSON Schema to ``path`` atomically; returns ``path``."""
    return atomic_write_text(Path(path), schema_text())


def _type_name(annotation: Any) -> str:
    """``str | None`` -> ``string or null``; ``Literal['a', 'b']`` -> ``a \\| b``: a type as a reader says it."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args)
    if origin is list:
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        return f"mapping of {_type_name(args[0])} to {_type_name(args[1])}" if args else "mapping"
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    names = {str: "string", int: "integer", float: "number", bool: "boolean", typing.Any: "any"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _default(field) -> str:
    if field.is_required():
        return "required"
    value = field.default_factory() if field.default_factory is not None else field.default
    if value is PydanticUndefined:
        return "required"
    if isinstance(value, BaseModel):
        return "(section)"
    return f"`{json.dumps(value, ensure_ascii=False)}`"


def _model_of(annotation: Any) -> tuple[type[BaseModel] | None, str]:
    """The section model inside an annotation (``Guard`` in ``list[Guard]``, ``X`` in ``X | None``) and
    the suffix its keys take (``[]`` for a list of sections)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, ""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is list and args and isinstance(args[0], type) and issubclass(args[0], BaseModel):
        return args[0], "[]"
    for a in args:
        if isinstance(a, type) and issubclass(a, BaseModel):
            return a, ""
    return None, ""


Row = tuple[str, str, str, str, str]  # key, type, default, meaning, role


def _role(key: str) -> str:
    """The key's role (:func:`tuneproof.study.role_of`; ``mixed`` for a section whose keys declare their own)."""
    return role_of(key.replace("[]", "")) or "mixed"


def _rows(model: type[BaseModel], prefix: str) -> list[Row]:
    rows = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        sub, suffix = _model_of(field.annotation)
        doc = (field.description or (sub.__doc__ if sub else "") or "").strip()
        doc = " ".join(doc.split())
        if sub is not None:
            kind = "list of sections" if suffix else "section"
            rows.append((f"{key}{suffix}", kind, _default(field), doc, _role(key)))
            rows += _rows(sub, f"{key}{suffix}.")
        else:
            rows.append((key, _type_name(field.annotation), _default(field), doc, _role(key)))
    return rows


def groups() -> dict[str, list[Row]]:
    """``{group: [(key, type, default, description, role), ...]}``: one group per top-level section of
    :class:`Study` (``hypothesis``, ``data``, ...), and ``top-level`` for the plain top-level keys; ``role``
    is the key's role (:data:`tuneproof.study.ROLES`)."""
    out: dict[str, list] = {TOP_LEVEL: []}
    for name, field in Study.model_fields.items():
        sub, _ = _model_of(field.annotation)
        if sub is None:
            row = (name, _type_name(field.annotation), _default(field), field.description or "", _role(name))
            out[TOP_LEVEL].append(row)
        else:
            out[name] = _rows(sub, f"{name}.")
    return out


def table(rows: list[Row]) -> str:
    """One Markdown table: key, type, default, role, meaning (``|`` in a cell escaped)."""
    lines = ["| key | type | default | role | meaning |", "|---|---|---|---|---|"]
    for key, kind, default, doc, role in rows:
        doc = doc.replace("|", "\\|")
        lines.append(f"| `{key}` | {kind} | {default} | {role} | {doc} |")
    return "\n".join(lines)


def render_reference(text: str) -> str:
    """``text`` (the reference document) with every generated table written from the schema.

    Raises:
        TuneproofError: a group of the schema has no marked place in the document, or the document
            marks a group the schema does not have.
    """
    tables = groups()
    marked = [m.group(1) for m in _MARK.finditer(text)]
    missing = [g for g in tables if g not in marked]
    unknown = [g for g in marked if g not in tables]
    if missing or unknown:
        raise TuneproofError(
            "the study-file reference does not mark "
            + (f"the groups {', '.join(missing)}" if missing else "")
            + (" and " if missing and unknown else "")
            + (f"marks groups the schema lacks: {', '.join(unknown)}" if unknown else ""),
            hint="add `<!-- generated: GROUP -->` / `<!-- end generated: GROUP -->` lines for each group",
        )
    return _MARK.sub(
        lambda m: (
            f"<!-- generated: {m.group(1)} -->\n{table(tables[m.group(1)])}\n<!-- end generated: {m.group(1)} -->"
        ),
        text,
    )


def write_reference(path: Path) -> bool:
    """Write the generated tables into ``path`` in place (atomically); ``True`` when anything changed."""
    try:
        old = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise TuneproofError(f"{path}: cannot read the study-file reference ({err.strerror})") from None
    new = render_reference(old)
    if new != old:
        atomic_write_text(Path(path), new)
    return new != old
