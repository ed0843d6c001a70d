"""Loading examples from files: CSV, JSON, JSONL, Parquet, chat conversations (``chat``: JSONL,
JSON or Parquet rows, :mod:`tuneproof.data.chat`), line-aligned text files (``lines``), a Hugging
Face ``datasets`` dataset (``hf``: a saved folder, a folder of data files, or a dataset id at a
pinned revision from the local cache), and the two built-in real datasets (SNIPS for extraction,
BANKING77 for classification).

Every loader returns :class:`~tuneproof.data.examples.Example` objects whose ``source`` names
the file and line (the default id numbers the same way: ``d.jsonl:3`` is ``d:3``, ``d.csv:3`` is
``d:3``, ``d.json#2`` is ``d:2``), and raises :class:`~tuneproof.errors.TuneproofError` naming the file, line or
column on bad input (missing file, wrong column, broken encoding, a CSV row with the wrong number
of fields, a missing-value label such as ``NaN``, a text that is not a string, a text longer than
``data.max_chars``, a file without examples). The rows a file's loader refuses are all named in one
error (:class:`BadRows`: the count, up to 20 with ``file:line``, the rest in a file the error names).

Empty texts are *not* refused here: the cleaning rules act first (``drop_empty`` drops them and
the data check lists each ``file:line``), then :func:`tuneproof.data.cleaning.validate` refuses
what is left (see ``context.StudyContext.all_splits``).

Field mapping (``data.fields``): ``text``, ``label``, ``id`` name a column or key; ``target`` names
one, or is a mapping ``{out_key: column}`` that builds a JSON object per example. A name with dots
(``meta.intent``) is a path into nested JSON objects when no key has that literal name. Names in
``fields.optional`` may be absent: the value is ``null`` and the example records in ``meta["absent"]``
the key it feeds and, when its name differs, the source column (the data check counts each name
``optional`` lists: ``optional: [intents]`` with ``target: {intent: intents}`` counts the rows without
``intents``).
"""

from __future__ import annotations

import csv
import glob
import io
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from tuneproof.data.chat import chat_example, refuse_flat_fields, row_layout
from tuneproof.data.examples import Example
from tuneproof.data.image_sources import IMAGE_FORMATS, load_image_source
from tuneproof.data.locate import find_data_root
from tuneproof.data.rows import BadRows
from tuneproof.errors import TuneproofError, install_hint
from tuneproof.io import read_text
from tuneproof.study import FieldMap

SNIPS_INTENTS = (
    "AddToPlaylist",
    "BookRestaurant",
    "GetWeather",
    "PlayMusic",
    "RateBook",
    "SearchCreativeWork",
    "SearchScreeningEvent",
)

#: default of ``data.max_chars``: characters per text (or target) accepted before tokenising.
DEFAULT_MAX_CHARS = 100_000
#: label values that mean "missing" (compared stripped and case-insensitively); pandas writes NaN,
#: Python None, JSON null.
MISSING_LABELS = frozenset({"", "nan", "none", "null"})
#: default files of ``format: lines`` (the ATIS/SNIPS "seq.in / label" layout)
LINES_TEXT, LINES_LABEL = "seq.in", "label"
_MISSING = object()
#: what joins the values of several text columns (``data.fields.text: [instruction, input]``): a blank line, the
#: separator of Alpaca's own prompt between its instruction and input; empty values are left out
TEXT_JOIN = "\n\n"


def _lookup(row: Any, name: str) -> Any:
    """``row[name]``, else the dotted path ``a.b.c`` into nested objects, else ``_MISSING``."""
    if isinstance(row, dict) and name in row:
        return row[name]
    if "." not in name:
        return _MISSING
    node = row
    for part in name.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


class _Mapper:
    """Applies ``data.fields`` to one record (a dict) and validates the values."""

    def __init__(self, fields, max_chars: int = DEFAULT_MAX_CHARS, kind: str = "column"):
        self.fields = fields
        self.kind = kind
        self.optional = set(getattr(fields, "optional", None) or [])
        self.max_chars = max_chars
        known = {*text_columns(fields), fields.label, fields.id, "text", "label", "id", "target"}
        known |= (
            set(fields.target) | set(fields.target.values()) if isinstance(fields.target, dict) else {fields.target}
        )
        unknown = sorted(self.optional - known)
        if unknown:
            raise TuneproofError(
                f"data.fields.optional: '{unknown[0]}' names no field or target key "
                f"(fields: {', '.join(sorted(str(k) for k in known if k))})",
                hint="fix data.fields.optional in tuneproof.yaml",
            )

    def _get(self, row, name: str, out_key: str, where: str, available: list[str], absent: list[str]) -> Any:
        value = _lookup(row, name)
        if value is _MISSING:
            if name in self.optional or out_key in self.optional:
                # the key it feeds and the source column: `optional` may name either (data check counts both)
                absent += [out_key] + ([name] if name != out_key else [])
                return None
            layout = row_layout(row) if isinstance(row, dict) and out_key == "text" else None
            raise TuneproofError(
                f"{where}: {self.kind} '{name}' not found ({self.kind}s: {', '.join(map(str, available))})",
                hint=f"these rows hold conversations ({layout}): set format: chat (docs/data.md)"
                if layout
                else "fix data.fields in tuneproof.yaml (or list it in data.fields.optional)",
            )
        return value

    def _check_chars(self, value: str, what: str, where: str) -> None:
        if len(value) > self.max_chars:
            raise TuneproofError(
                f"{where}: {what} is {len(value):,} characters, over data.max_chars {self.max_chars:,}",
                hint="fix the line, or raise data.max_chars in tuneproof.yaml",
            )

    def example(
        self,
        row: dict[str, Any],
        where: str,
        default_id: str,
        split: str | None,
        available: list[str],
        meta: dict[str, Any] | None = None,
    ) -> Example:
        f = self.fields
        absent: list[str] = []
        parts = []
        for col in text_columns(f):
            value = self._get(row, col, "text", where, available, absent)
            if value is None:
                value = ""
            if not isinstance(value, str):
                raise TuneproofError(
                    f"{where}: text in {self.kind} '{col}' is {type(value).__name__} {_short(value)}, not a string",
                    hint="texts must be strings; quote the value or fix data.fields.text",
                )
            parts.append(value)
        # several text columns (Alpaca's instruction and input): the non-empty ones, in order, a blank line between
        text = parts[0] if len(parts) == 1 else TEXT_JOIN.join(v for v in parts if v.strip())
        self._check_chars(text, f"the text in {self.kind} '{'+'.join(text_columns(f))}'", where)
        label = None
        if f.label is not None:
            label = self._get(row, f.label, "label", where, available, absent)
            if label is None and "label" in absent:
                pass
            elif _missing_label(label):
                shown = "empty" if label is None or (isinstance(label, str) and not label.strip()) else repr(label)
                raise TuneproofError(
                    f"{where}: {shown} label in {self.kind} '{f.label}' (a missing value, not a class)",
                    hint="fill or drop the row",
                )
            else:
                # a list (multi-label) is kept as its JSON text, so it can be parsed back exactly
                label = json.dumps(label, ensure_ascii=False) if isinstance(label, list) else str(label)
        if isinstance(f.target, dict):
            obj = {key: self._get(row, col, key, where, available, absent) for key, col in f.target.items()}
            target = json.dumps(obj, ensure_ascii=False)
        elif f.target is not None:
            target = self._get(row, f.target, "target", where, available, absent)
            if target is not None and not isinstance(target, str):
                target = json.dumps(target, ensure_ascii=False)
        else:
            target = None
        if target is not None:
            self._check_chars(target, "the target", where)
        ex_id = default_id
        if f.id:
            raw_id = self._get(row, f.id, "id", where, available, absent)
            ex_id = default_id if raw_id is None else str(raw_id)
        if target is None and label is not None:
            target = label
        meta = dict(meta or {})
        if absent:
            meta["absent"] = absent
        return Example(id=ex_id, text=text, label=label, target=target, source=where, split=split, meta=meta)


def text_columns(fields) -> list[str]:
    """The columns ``data.fields.text`` names: one, or the list whose values are joined (:data:`TEXT_JOIN`)."""
    return list(fields.text) if isinstance(fields.text, list) else [fields.text]


def _short(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _missing_label(label: Any) -> bool:
    if label is None:
        return True
    if isinstance(label, float) and math.isnan(label):
        return True
    return isinstance(label, str) and label.strip().casefold() in MISSING_LABELS


def _columns(fields) -> list[str]:
    """The column names ``fields`` reads (target mapping values included), optional ones excluded."""
    optional = set(getattr(fields, "optional", None) or [])
    names = [*text_columns(fields), fields.label, fields.id]
    if isinstance(fields.target, dict):
        names += [c for k, c in fields.target.items() if k not in optional]
    else:
        names.append(fields.target)
    return [n for n in names if n is not None and n not in optional]


def load_csv(
    path: Path, fields, split: str | None = None, *, max_chars: int = DEFAULT_MAX_CHARS, id_prefix: str | None = None
) -> tuple[list[Example], list[str]]:
    """Read a CSV with a header row. Returns ``(examples, repairs)``.

    Raises:
        TuneproofError: missing file, not UTF-8 (byte offset), an empty or header-only file, missing
            column, a row whose number of fields differs from the header (line number), a
            missing-value label, a text over ``max_chars`` characters.
    """
    text, repairs = read_text(path)
    # the csv module refuses fields over 128 KiB with a bare error; lengths are checked per field instead
    csv.field_size_limit(sys.maxsize)
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except StopIteration:
        raise TuneproofError(f"{path}: empty file, no header and no examples", hint="fix data.sources[].path") from None
    except csv.Error as err:
        raise TuneproofError(f"{path}:1: malformed CSV header ({err})") from None
    for col in _columns(fields):
        if col not in header:
            raise TuneproofError(
                f"{path}:1: column '{col}' not found (columns: {', '.join(header)})",
                hint="fix data.fields in tuneproof.yaml",
            )
    mapper = _Mapper(fields, max_chars)
    prefix = id_prefix or path.stem
    out = []
    bad = BadRows(path)
    while True:
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as err:  # the parser cannot go on: what was refused before, and this
            where = f"{path}:{reader.line_num}"
            bad.add(
                where,
                TuneproofError(f"{where}: malformed CSV ({err})", hint="quote fields that contain quotes or newlines"),
            )
            break
        line = reader.line_num
        if not row:
            continue
        where = f"{path}:{line}"
        if len(row) != len(header):
            bad.add(
                where,
                TuneproofError(
                    f"{where}: {len(row)} fields, header has {len(header)} ({', '.join(header)})",
                    hint="quote fields that contain commas",
                ),
            )
            continue
        rec = dict(zip(header, row))
        try:
            out.append(mapper.example(rec, where, f"{prefix}:{line}", split, header))
        except TuneproofError as err:
            bad.add(where, err)
    bad.check()
    if not out:
        raise TuneproofError(
            f"{path}: header only, no examples (columns: {', '.join(header)})", hint="fix data.sources[].path"
        )
    return out, repairs


#: ``Example.meta`` key of a JSON Lines example's id as tuneproof numbered it before ids followed file
#: lines (the 0-based index among the file's non-blank lines); a study whose ``splits.json`` was written
#: then keeps those ids (:func:`tuneproof.data.split.freeze_or_reuse`)
LEGACY_ID = "id_before_file_lines"


def load_json_records(
    path: Path,
    fields,
    split: str | None = None,
    *,
    lines: bool,
    max_chars: int = DEFAULT_MAX_CHARS,
    id_prefix: str | None = None,
) -> tuple[list[Example], list[str]]:
    """Read a JSON list of objects (``lines=False``) or JSON Lines (``lines=True``).

    Raises:
        TuneproofError: invalid JSON (line), a record that is not an object, no records at all, a
            missing key, a missing-value label, a text that is not a string or over ``max_chars``.
    """
    records, repairs = _json_records(path, lines)
    mapper = _Mapper(fields, max_chars)
    prefix = id_prefix or path.stem
    out = []
    bad = BadRows(path)
    for i, (where, rec) in enumerate(records):
        if isinstance(rec, TuneproofError):  # a line that is not JSON
            bad.add(where, rec)
            continue
        if not isinstance(rec, dict):
            bad.add(where, TuneproofError(f"{where}: expected an object, got {type(rec).__name__}"))
            continue
        # the default id numbers as the message does: JSON Lines by file line (d.jsonl:3 is d:3), a JSON list
        # by position (d.json#2 is d:2)
        number = where.rsplit(":", 1)[1] if lines else str(i)
        try:
            ex = mapper.example(rec, where, f"{prefix}:{number}", split, list(rec))
        except TuneproofError as err:
            bad.add(where, err)
            continue
        if lines and ex.id == f"{prefix}:{number}":  # the id an earlier tuneproof gave (0-based record index)
            ex.meta[LEGACY_ID] = f"{prefix}:{i}"
        out.append(ex)
    bad.check()
    return out, repairs


def _json_records(path: Path, lines: bool) -> tuple[list[tuple[str, Any]], list[str]]:
    """``([(file:line or file#index, record or the line's TuneproofError)], repairs)`` of a JSON
    Lines file or a JSON list (``{"data": [...]}`` / ``{"examples": [...]}`` too).

    Raises:
        TuneproofError: an empty file, a JSON document that does not parse or is not a list, no records.
    """
    text, repairs = read_text(path)
    records: list[tuple[str, Any]] = []
    if lines:
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append((f"{path}:{lineno}", json.loads(line)))
            except json.JSONDecodeError as err:
                records.append((f"{path}:{lineno}", TuneproofError(f"{path}:{lineno}: invalid JSON line ({err.msg})")))
    else:
        if not text.strip():
            raise TuneproofError(f"{path}: empty file, no examples", hint="fix data.sources[].path")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise TuneproofError(f"{path}:{err.lineno}:{err.colno}: invalid JSON ({err.msg})") from None
        if isinstance(data, dict):
            data = data.get("data", data.get("examples"))
        if not isinstance(data, list):
            raise TuneproofError(f"{path}: expected a JSON list of objects (or {{'data': [...]}})")
        records = [(f"{path}#{i}", r) for i, r in enumerate(data)]
    if not records:
        raise TuneproofError(
            f"{path}: {'empty file' if not text.strip() else 'no records'}, no examples", hint="fix data.sources[].path"
        )
    return records, repairs


def _parquet_records(path: Path) -> list[tuple[str, Any]]:
    """``[(file#row, row dict)]`` of a Parquet file (pyarrow; nested lists and structs become
    lists and dicts). Reading a Parquet file runs no code.

    Raises:
        TuneproofError: pyarrow missing, a file that is not Parquet, no rows.
    """
    try:
        import pyarrow.parquet as pq  # noqa: PLC0415  (only Parquet sources need pyarrow)
    except ImportError:
        raise TuneproofError(f"{path}: Parquet needs the `pyarrow` package", hint=install_hint("data")) from None
    try:
        rows = pq.read_table(path).to_pylist()
    except (OSError, ValueError) as err:  # pyarrow.ArrowInvalid is a ValueError
        raise TuneproofError(f"{path}: not a readable Parquet file ({err})", hint="fix data.sources[].path") from None
    if not rows:
        raise TuneproofError(f"{path}: no rows, no examples", hint="fix data.sources[].path")
    return [(f"{path}#{i}", r) for i, r in enumerate(rows)]


def load_parquet(
    path: Path, fields, split: str | None = None, *, max_chars: int = DEFAULT_MAX_CHARS, id_prefix: str | None = None
) -> tuple[list[Example], list[str]]:
    """Read a Parquet file of flat rows, mapped by ``data.fields`` like JSON records (``d.parquet#2`` is ``d:2``).

    Raises:
        TuneproofError: see :func:`_parquet_records`; a missing column, a missing-value label, a
            text that is not a string or over ``max_chars`` (all refused rows named together).
    """
    records = _parquet_records(path)
    mapper = _Mapper(fields, max_chars)
    prefix = id_prefix or path.stem
    out, bad = [], BadRows(path)
    for i, (where, rec) in enumerate(records):
        try:
            out.append(mapper.example(rec, where, f"{prefix}:{i}", split, list(rec)))
        except TuneproofError as err:
            bad.add(where, err)
    bad.check()
    return out, []


def chat_examples(
    records: list[tuple[str, Any]], where: Path | str, fields, chat, split: str | None, max_chars: int, default_id
) -> list[Example]:
    """Chat rows as examples (:func:`tuneproof.data.chat.chat_example`); ``default_id(i, where)``
    numbers each row. Every refused row is named in one error (:class:`BadRows`).

    Raises:
        TuneproofError: at least one refused row, or ``data.fields.text`` / ``target`` set.
    """
    refuse_flat_fields(fields)
    out: list[Example] = []
    bad = BadRows(where)
    for i, (where, rec) in enumerate(records):
        if isinstance(rec, TuneproofError):
            bad.add(where, rec)
            continue
        if not isinstance(rec, dict):
            bad.add(where, TuneproofError(f"{where}: expected an object, got {type(rec).__name__}"))
            continue
        try:
            out.append(chat_example(rec, where, default_id(i, where), split, fields, chat, max_chars))
        except TuneproofError as err:
            bad.add(where, err)
    bad.check()
    return out


def load_chat(
    path: Path,
    fields,
    chat=None,
    split: str | None = None,
    *,
    max_chars: int = DEFAULT_MAX_CHARS,
    id_prefix: str | None = None,
) -> tuple[list[Example], list[str]]:
    """Read chat rows (``format: chat``) from a ``.jsonl``, ``.json`` or ``.parquet`` file (by its
    suffix); default ids number as the other readers do (``d.jsonl:3`` is ``d:3``, ``d.json#2`` and
    ``d.parquet#2`` are ``d:2``). ``chat``: the study's ``data.chat``.

    Raises:
        TuneproofError: another suffix; the errors of :func:`chat_examples` and of the file readers.
    """
    suffix = path.suffix.lower()
    prefix = id_prefix or path.stem
    if suffix == ".parquet":
        records, repairs = _parquet_records(path), []
    elif suffix in (".jsonl", ".json"):
        records, repairs = _json_records(path, suffix == ".jsonl")
    else:
        raise TuneproofError(
            f"{path}: format 'chat' reads .jsonl, .json or .parquet files, not '{suffix or 'no suffix'}'",
            hint="convert it; a CSV of prompt and completion columns is read by format csv with fields: {text: prompt, "
            "target: completion}",
        )

    def number(i: int, where: str) -> str:
        return f"{prefix}:{where.rsplit(':', 1)[1] if suffix == '.jsonl' else i}"

    return chat_examples(records, path, fields, chat, split, max_chars, number), repairs


def explicit_fields(fields) -> dict:
    """The ``data.fields`` keys whose value differs from the default: what the study asks for. A
    resolved config (variants, resume) holds every key with its default, so "set in the file" is
    read as "not the default" (pydantic's ``model_fields_set`` would count every key there)."""
    if fields is None:
        return {}
    defaults = type(fields)()
    return {k: getattr(fields, k) for k in type(fields).model_fields if getattr(fields, k) != getattr(defaults, k)}


def lines_files(folder: Path, fields) -> dict[str, str]:
    """For ``format: lines``: ``{field key: file name}`` read in ``folder`` (text, label, target
    parts), defaults ``seq.in`` for the text and ``label`` for the label; a label file that is
    absent and not named in ``data.fields`` means no labels."""
    set_ = explicit_fields(fields)
    if isinstance(fields.text, list):
        raise TuneproofError(
            "data.fields.text: format lines reads the text from one file, not a list of columns",
            hint="name one file (default seq.in); a list joins columns of csv, json, jsonl, parquet or hf rows",
        )
    text = fields.text if "text" in set_ else LINES_TEXT
    label = fields.label if "label" in set_ else (LINES_LABEL if (folder / LINES_LABEL).is_file() else None)
    files = {"text": text}
    if label:
        files["label"] = label
    if isinstance(fields.target, dict):
        files.update({f"target.{k}": v for k, v in fields.target.items()})
    elif fields.target:
        files["target"] = fields.target
    if fields.id:
        files["id"] = fields.id
    return files


def load_lines(
    folder: Path, fields, split: str | None = None, *, max_chars: int = DEFAULT_MAX_CHARS
) -> tuple[list[Example], list[str]]:
    """Read line-aligned files in one split folder: line *i* of each file is example *i*
    (e.g. ``train/seq.in`` beside ``train/label``). ``data.fields`` entries name the files.

    The split is ``split`` when given, else the folder's name. Ids are ``<folder>:<line>``.

    Raises:
        TuneproofError: folder or file missing, empty text file, line counts that differ (names
            both files and counts), and the per-value errors of the other loaders.
    """
    if not folder.is_dir():
        raise TuneproofError(
            f"{folder}: folder not found (format 'lines' reads a split folder holding {LINES_TEXT} and {LINES_LABEL})",
            hint="fix data.sources[].path",
        )
    names = lines_files(folder, fields)
    optional = set(getattr(fields, "optional", None) or [])
    columns: dict[str, list[str]] = {}
    repairs: list[str] = []
    for name in dict.fromkeys(names.values()):
        path = folder / name
        if not path.is_file() and name in optional:
            continue
        text, rep = read_text(path)
        repairs += rep
        columns[name] = text.splitlines()
    text_file = names["text"]
    n = len(columns[text_file])
    if n == 0:
        raise TuneproofError(f"{folder / text_file}: empty file, no examples", hint="fix data.sources[].path")
    for name, rows in columns.items():
        if len(rows) != n:
            raise TuneproofError(
                f"{folder / text_file} has {n} lines but {folder / name} has {len(rows)}: line-aligned files must have "
                "the same number of lines",
                hint="line i of every file is example i; fix the shorter file",
            )
    mapper = _Mapper(
        fields.model_copy(update={"text": text_file, "label": names.get("label"), "id": names.get("id")}),
        max_chars,
        kind="file",
    )
    split = split or folder.name
    out, bad = [], BadRows(folder / text_file)
    for i in range(n):
        where = f"{folder / text_file}:{i + 1}"
        try:
            out.append(
                mapper.example(
                    {k: v[i] for k, v in columns.items()}, where, f"{folder.name}:{i + 1}", split, list(columns)
                )
            )
        except TuneproofError as err:
            bad.add(where, err)
    bad.check()
    return out, repairs


def load_hf(
    path: Path,
    fields,
    split: str | None = None,
    *,
    max_chars: int = DEFAULT_MAX_CHARS,
    chat=None,
    dataset_id: str | None = None,
    revision: str | None = None,
    name: str | None = None,
) -> tuple[list[Example], list[str]]:
    """Read a Hugging Face ``datasets`` dataset (``format: hf``): a folder written by
    ``save_to_disk`` (a ``Dataset`` or ``DatasetDict``), a folder of data files (CSV, JSON, Parquet;
    ``datasets.load_dataset`` on the folder), or, when ``path`` is no local folder, the dataset id
    ``dataset_id`` at ``revision`` (and configuration ``name``) from the local Hugging Face cache
    (nothing downloads unless ``TUNEPROOF_ALLOW_DOWNLOAD=1``, as for base models). None of these runs
    code: ``datasets`` reads Arrow and the packaged file formats, and no longer runs loading scripts.

    Each split of a ``DatasetDict`` becomes that split; a single ``Dataset``, and the one ``train``
    split ``datasets`` names a folder's lone data file, take ``split``. Rows holding a conversation
    (the columns of a layout of :data:`tuneproof.data.chat.LAYOUTS`: ``messages``, ``conversations``, TRL's
    ``prompt``/``completion``, or ``data.chat.messages``'s, and no ``data.fields.text`` column) are read as
    chat rows (:mod:`tuneproof.data.chat`); others are mapped by ``data.fields``.
    Ids are ``<split>:<index>``.

    Raises:
        TuneproofError: ``datasets`` missing; a dataset id without ``revision``; a dataset that does
            not load (not found locally, not in the cache); the row errors of the readers.
    """
    try:
        import datasets  # noqa: PLC0415  (only hf sources need datasets)
    except ImportError:
        raise TuneproofError(f"{path}: format 'hf' needs the `datasets` package", hint=install_hint("data")) from None
    shown = str(path) if path.exists() or not dataset_id else dataset_id
    from_files = False
    try:
        if path.is_dir() and any((path / n).is_file() for n in ("dataset_dict.json", "state.json")):
            ds = datasets.load_from_disk(str(path))
        elif path.is_dir():
            ds, from_files = datasets.load_dataset(str(path), name=name), True
        elif path.is_file():
            raise TuneproofError(
                f"{path}: format 'hf' reads a dataset folder or a dataset id, not one file",
                hint="use format parquet, jsonl, json, csv or chat for a single file",
            )
        elif dataset_id:
            if not revision:
                raise TuneproofError(
                    f"data.sources[].path '{dataset_id}': no local folder of that name, and a Hugging Face dataset "
                    "id needs data.sources[].revision (the commit sha or tag to read)",
                    hint="set revision: (the dataset's commit), or fix the path",
                )
            ds, from_files = _load_hub_dataset(datasets, dataset_id, revision, name), True
        else:
            raise TuneproofError(f"{path}: folder not found", hint="fix data.sources[].path")
    except TuneproofError:
        raise
    except Exception as err:  # noqa: BLE001 (datasets raises many kinds for a bad source: FileNotFoundError, its own)
        raise TuneproofError(
            f"{shown}: the dataset did not load ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})",
            hint="a dataset id is read from the local Hugging Face cache only (TUNEPROOF_ALLOW_DOWNLOAD=1 fetches it)"
            if dataset_id and not path.exists()
            else "fix data.sources[].path",
        ) from None
    parts = list(ds.items()) if isinstance(ds, datasets.DatasetDict) else [(split, ds)]
    if from_files and len(parts) == 1 and parts[0][0] == "train":  # datasets' name for a folder's lone file
        parts = [(split, parts[0][1])]
    out: list[Example] = []
    key = getattr(chat, "messages", None)
    for part, d in parts:
        cols = list(d.column_names)
        prefix = part or "hf"
        if not set(text_columns(fields)) & set(cols) and row_layout(cols, key):
            records = [(f"{shown}[{part}]#{i}", rec) for i, rec in enumerate(d)]
            out += chat_examples(
                records, f"{shown}[{part}]", fields, chat, part, max_chars, lambda i, _w, p=prefix: f"{p}:{i}"
            )
            continue
        mapper = _Mapper(fields, max_chars)
        bad = BadRows(f"{shown}[{part}]")
        for i, rec in enumerate(d):
            try:
                out.append(mapper.example(rec, f"{shown}[{part}]#{i}", f"{prefix}:{i}", part, cols))
            except TuneproofError as err:
                bad.add(f"{shown}[{part}]#{i}", err)
        bad.check()
    if not out:
        raise TuneproofError(f"{shown}: no examples", hint="fix data.sources[].path")
    return out, []


def _load_hub_dataset(datasets, dataset_id: str, revision: str, name: str | None):
    """``datasets.load_dataset(dataset_id, name, revision=...)`` from the local cache only, unless
    ``TUNEPROOF_ALLOW_DOWNLOAD=1`` (datasets and huggingface_hub read their offline switch at import,
    so it is set on both for the call)."""
    import huggingface_hub.constants as hub_constants  # noqa: PLC0415  (with datasets)

    offline = os.environ.get("TUNEPROOF_ALLOW_DOWNLOAD") != "1"
    saved = (datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE)
    if offline:
        datasets.config.HF_HUB_OFFLINE = hub_constants.HF_HUB_OFFLINE = True
    try:
        return datasets.load_dataset(dataset_id, name=name, revision=revision)
    finally:
        datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE = saved


def snips_target(intent: str, pieces: list[dict[str, Any]]) -> str:
    """The extraction target of one SNIPS utterance: ``{"intent": ..., "slots": {slot: value}}``.

    A slot name that occurs more than once gets a list of values (see docs/CONTRACTS.md).
    """
    slots: dict[str, Any] = {}
    for p in pieces:
        if "entity" in p:
            value = p["text"].strip()
            if p["entity"] in slots:
                prev = slots[p["entity"]]
                slots[p["entity"]] = (prev if isinstance(prev, list) else [prev]) + [value]
            else:
                slots[p["entity"]] = value
    return json.dumps({"intent": intent, "slots": slots}, ensure_ascii=False)


def load_snips(root: Path) -> tuple[list[Example], list[str]]:
    """Read the SNIPS 2017 custom-intent-engines folder (``<Intent>/train_<Intent>_full.json`` and
    ``<Intent>/validate_<Intent>.json``). Slots come from the segments that carry ``entity``; the
    intent from the file. The PlayMusic CESU-8 emoji is repaired and reported (docs/CASES.md C17).

    Returns ``(examples, repairs)``; ids are ``<Intent>/<split>/<index:04d>``.
    """
    if not root.is_dir():
        raise TuneproofError(f"{root}: SNIPS folder not found", hint="pass --data DIR holding snips/ (see README)")
    out: list[Example] = []
    repairs: list[str] = []
    for intent in SNIPS_INTENTS:
        for split, name in (("train", f"train_{intent}_full.json"), ("validation", f"validate_{intent}.json")):
            path = root / intent / name
            text, rep = read_text(path)
            repairs += rep
            try:
                data = json.loads(text)
            except json.JSONDecodeError as err:
                raise TuneproofError(f"{path}:{err.lineno}: invalid JSON ({err.msg})") from None
            if intent not in data:
                raise TuneproofError(f"{path}: expected the key '{intent}'")
            for i, item in enumerate(data[intent]):
                pieces = item.get("data")
                if not isinstance(pieces, list):
                    raise TuneproofError(f"{path}: item {i} has no 'data' list")
                utter = "".join(p["text"] for p in pieces)
                out.append(
                    Example(
                        id=f"{intent}/{split}/{i:04d}",
                        text=utter,
                        label=intent,
                        target=snips_target(intent, pieces),
                        source=f"{path}#{i}",
                        split=split,
                        meta={"pieces": pieces},
                    )
                )
    return out, repairs


def load_banking77(root: Path, fields=None, *, max_chars: int = DEFAULT_MAX_CHARS) -> tuple[list[Example], list[str]]:
    """Read BANKING77 (``train.csv``, ``test.csv`` with header ``text,category``). Ids are ``train:LINE``.

    ``fields`` (the study's ``data.fields``) is applied over the built-in mapping ``text: text,
    label: category``: only the keys the study sets change, and a column the files lack is
    refused naming the file (it is never silently ignored).
    """
    given = explicit_fields(fields)
    fields = FieldMap(**{"text": "text", "label": "category", **given})
    if not root.is_dir():
        raise TuneproofError(
            f"{root}: BANKING77 folder not found", hint="pass --data DIR holding banking77/ (see README)"
        )
    out, repairs = [], []
    for split in ("train", "test"):
        ex, rep = load_csv(root / f"{split}.csv", fields, split=split, max_chars=max_chars)
        out += ex
        repairs += rep
    return out, repairs


#: the text formats of ``data.sources[].format`` (the image ones: :data:`tuneproof.data.image_sources.IMAGE_FORMATS`);
#: the text modality declares them as its ``source_formats``
TEXT_FORMATS = ("csv", "json", "jsonl", "parquet", "chat", "lines", "hf", "snips", "banking77")

BUILTIN_FILES = {
    "banking77": ["train.csv", "test.csv"],
    "snips": [f"{i}/{n}" for i in SNIPS_INTENTS for n in (f"train_{i}_full.json", f"validate_{i}.json")],
}
_GLOB_CHARS = "*?["


def resolve_path(raw: str, base_dir: Path, data_root: Path | None = None) -> Path:
    """A ``data.sources[].path`` as a path: ``$DATA/...`` from the data root, relative paths from
    the study folder (``base_dir``)."""
    if raw.startswith("$DATA/") or raw == "$DATA":
        if data_root is None:
            data_root = find_data_root()
        return data_root / raw[len("$DATA/") :]
    path = Path(raw).expanduser()
    return path if path.is_absolute() else base_dir / path


def is_pattern(raw: str, base_dir: Path, data_root: Path | None = None) -> bool:
    """Whether a ``data.sources[].path`` is read as a glob pattern: it has ``*``, ``?`` or ``[`` and no
    file or folder has that very name (a literal path comes first: ``data/set [v2]/train.csv`` is a file)."""
    return any(c in raw for c in _GLOB_CHARS) and not resolve_path(raw, base_dir, data_root).exists()


def _pattern(raw: str, base_dir: Path, data_root: Path | None) -> tuple[str, Path]:
    """``(glob pattern, the folder before its first wildcard)`` of a ``data.sources[].path``: the study
    folder or the data root it is read from is escaped (``glob.escape``), so that a ``[`` in their names
    is a character; only what the study file wrote is a pattern."""
    if raw.startswith("$DATA/") or raw == "$DATA":
        prefix, rel = (data_root if data_root is not None else find_data_root()), raw[len("$DATA/") :]
    else:
        p = Path(raw).expanduser()
        prefix, rel = (None, str(p)) if p.is_absolute() else (base_dir, raw)
    parts = Path(rel).parts
    fixed = Path(*parts[: next((i for i, q in enumerate(parts) if any(c in q for c in _GLOB_CHARS)), len(parts))])
    if prefix is None:
        return rel, fixed
    return os.path.join(glob.escape(str(prefix)), rel), Path(prefix) / fixed


def expand(src, base_dir: Path, data_root: Path | None = None) -> list[Path]:
    """The files (or, for ``lines`` / ``hf`` / built-ins, folders) one source entry names: its
    path, or every match of a glob pattern (``folds/fold*.json``, ``train/*.jsonl``), sorted. A path
    that exists is read as written, whatever characters it holds (:func:`is_pattern`).

    Raises:
        TuneproofError: a glob pattern that matches nothing (names the pattern).
    """
    path = resolve_path(src.path, base_dir, data_root)
    if not is_pattern(src.path, base_dir, data_root):
        return [path]
    pattern, _ = _pattern(src.path, base_dir, data_root)
    matches = sorted(Path(p) for p in glob.glob(pattern, recursive=True))
    if src.format in ("lines", "hf"):
        matches = [p for p in matches if p.is_dir()]
    else:
        matches = [p for p in matches if p.is_file()]
    if not matches:
        what = "folder" if src.format in ("lines", "hf") else "file"
        raise TuneproofError(
            f"{path}: no such {what}, and read as a glob pattern it matches no {what}",
            hint="fix data.sources[].path in tuneproof.yaml (in a pattern, a literal '[' is written '[[]')",
        )
    return matches


def source_files(src, base_dir: Path, data_root: Path | None = None, fields=None) -> list[Path]:
    """Every file one source entry reads (globs expanded, folder formats listed), for the data
    fingerprint."""
    out: list[Path] = []
    for p in expand(src, base_dir, data_root):
        if src.format in BUILTIN_FILES:
            out += [p / n for n in BUILTIN_FILES[src.format]]
        elif src.format == "lines" and fields is not None:
            out += [p / n for n in dict.fromkeys(lines_files(p, fields).values()) if (p / n).is_file()]
        elif p.is_dir():
            out += sorted(q for q in p.rglob("*") if q.is_file())
        else:
            out.append(p)
    return out


def load_source(
    src,
    fields,
    base_dir: Path,
    data_root: Path | None = None,
    *,
    max_chars: int = DEFAULT_MAX_CHARS,
    image=None,
    chat=None,
) -> tuple[list[Example], list[str]]:
    """Load one ``data.sources`` entry of the study file. ``$DATA/`` in a path means the data root;
    a glob pattern loads every match (sorted) as one source, ids prefixed by the match's path
    below the pattern's fixed folder (``folds/fold*.json`` -> ``fold1:0``, ``fold2:0``). ``image``: the
    study's ``data.image`` (image formats: ``max_pixels``, ``allow_outside_paths``); ``chat``: its
    ``data.chat`` (``format: chat``, and chat rows of ``format: hf``).

    Raises:
        TuneproofError: see the loaders; ``data.fields`` set for ``snips`` (its fields are fixed).
    """
    paths = expand(src, base_dir, data_root)
    globbed = is_pattern(src.path, base_dir, data_root)
    root = _pattern(src.path, base_dir, data_root)[1] if globbed else None
    out: list[Example] = []
    repairs: list[str] = []
    for path in paths:
        prefix = path.relative_to(root).with_suffix("").as_posix() if globbed else None
        ex, rep = _load_one(src, path, fields, max_chars, prefix, image, chat)
        out += ex
        repairs += rep
    return out, repairs


def _load_one(
    src, path: Path, fields, max_chars: int, prefix: str | None, image=None, chat=None
) -> tuple[list[Example], list[str]]:
    if src.format in IMAGE_FORMATS:
        return load_image_source(src, fields, path, image)
    if src.format == "snips":
        if explicit_fields(fields):
            raise TuneproofError(
                f"data.fields ({', '.join(sorted(explicit_fields(fields)))}) does not apply to format 'snips': its "
                "text, label (intent) and target (intent + slots) are fixed",
                hint="remove data.fields from tuneproof.yaml",
            )
        return load_snips(path)
    if src.format == "banking77":
        return load_banking77(path, fields, max_chars=max_chars)
    if src.format == "hf":
        return load_hf(
            path,
            fields,
            src.split,
            max_chars=max_chars,
            chat=chat,
            dataset_id=src.path,
            revision=getattr(src, "revision", None),
            name=getattr(src, "name", None),
        )
    if src.format == "lines":
        return load_lines(path, fields, src.split, max_chars=max_chars)
    if not path.exists():
        raise TuneproofError(f"{path}: file not found", hint="fix data.sources[].path in tuneproof.yaml")
    if src.format == "csv":
        return load_csv(path, fields, src.split, max_chars=max_chars, id_prefix=prefix)
    if src.format == "parquet":
        return load_parquet(path, fields, src.split, max_chars=max_chars, id_prefix=prefix)
    if src.format == "chat":
        return load_chat(path, fields, chat, src.split, max_chars=max_chars, id_prefix=prefix)
    return load_json_records(
        path, fields, src.split, lines=src.format == "jsonl", max_chars=max_chars, id_prefix=prefix
    )
