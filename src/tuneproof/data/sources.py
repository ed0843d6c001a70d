"""Loading examples from files: CSV, JSON, JSONL, a local Hugging Face ``datasets`` folder, and the
two built-in real datasets (SNIPS for extraction, BANKING77 for classification).

Every loader returns :class:`~tuneproof.data.examples.Example` objects whose ``source`` names
the file and line, and raises :class:`~tuneproof.errors.TuneproofError` naming the file, line or
column on bad input (missing file, wrong column, broken encoding, a CSV row with the wrong number
of fields, an empty label).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from tuneproof.data.examples import Example
from tuneproof.errors import TuneproofError
from tuneproof.io import read_text

SNIPS_INTENTS = (
    "AddToPlaylist", "BookRestaurant", "GetWeather", "PlayMusic", "RateBook", "SearchCreativeWork", "SearchScreeningEvent",
)


def _field(row: dict[str, Any], name: str | None, where: str, available: list[str]) -> Any:
    if name is None:
        return None
    if name not in row:
        raise TuneproofError(
            f"{where}: column '{name}' not found (columns: {', '.join(available)})",
            hint="fix data.fields in tuneproof.yaml",
        )
    return row[name]


def _to_example(row: dict[str, Any], fields, where: str, default_id: str, split: str | None, available: list[str]) -> Example:
    text = _field(row, fields.text, where, available)
    label = _field(row, fields.label, where, available)
    target = _field(row, fields.target, where, available)
    if text is None or (isinstance(text, str) and not text.strip()):
        raise TuneproofError(f"{where}: empty text in column '{fields.text}'")
    if fields.label is not None and (label is None or str(label).strip() == ""):
        raise TuneproofError(f"{where}: empty label in column '{fields.label}'", hint="fill or drop the row")
    if target is not None and not isinstance(target, str):
        target = json.dumps(target, ensure_ascii=False)
    ex_id = str(_field(row, fields.id, where, available)) if fields.id else default_id
    label = None if label is None else str(label)
    if target is None and label is not None:
        target = label
    return Example(id=ex_id, text=str(text), label=label, target=target, source=where, split=split)


def load_csv(path: Path, fields, split: str | None = None) -> tuple[list[Example], list[str]]:
    """Read a CSV with a header row. Returns ``(examples, repairs)``.

    Raises:
        TuneproofError: missing file, not UTF-8 (byte offset), missing column, a row whose number
            of fields differs from the header (line number), an empty text or label.
    """
    text, repairs = read_text(path)
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except StopIteration:
        raise TuneproofError(f"{path}: empty CSV file") from None
    for key in ("text", "label", "target", "id"):
        col = getattr(fields, key)
        if col is not None and col not in header:
            raise TuneproofError(f"{path}:1: column '{col}' not found (columns: {', '.join(header)})", hint="fix data.fields in tuneproof.yaml")
    out = []
    for row in reader:
        line = reader.line_num
        if not row:
            continue
        if len(row) != len(header):
            raise TuneproofError(
                f"{path}:{line}: {len(row)} fields, header has {len(header)} ({', '.join(header)})",
                hint="quote fields that contain commas",
            )
        rec = dict(zip(header, row))
        out.append(_to_example(rec, fields, f"{path}:{line}", f"{path.stem}:{line}", split, header))
    return out, repairs


def load_json_records(path: Path, fields, split: str | None = None, *, lines: bool) -> tuple[list[Example], list[str]]:
    """Read a JSON list of objects (``lines=False``) or JSON Lines (``lines=True``)."""
    text, repairs = read_text(path)
    records: list[tuple[str, dict]] = []
    if lines:
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append((f"{path}:{lineno}", json.loads(line)))
            except json.JSONDecodeError as err:
                raise TuneproofError(f"{path}:{lineno}: invalid JSON line ({err.msg})") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise TuneproofError(f"{path}:{err.lineno}:{err.colno}: invalid JSON ({err.msg})") from None
        if isinstance(data, dict):
            data = data.get("data", data.get("examples"))
        if not isinstance(data, list):
            raise TuneproofError(f"{path}: expected a JSON list of objects (or {{'data': [...]}})")
        records = [(f"{path}#{i}", r) for i, r in enumerate(data)]
    out = []
    for i, (where, rec) in enumerate(records):
        if not isinstance(rec, dict):
            raise TuneproofError(f"{where}: expected an object, got {type(rec).__name__}")
        out.append(_to_example(rec, fields, where, f"{path.stem}:{i}", split, list(rec)))
    return out, repairs


def load_hf_dir(path: Path, fields, split: str | None = None) -> tuple[list[Example], list[str]]:
    """Read a local folder written by ``datasets.Dataset.save_to_disk`` (or a ``DatasetDict``).

    Each split of a DatasetDict becomes that split; a single Dataset takes ``split``.
    """
    try:
        import datasets  # noqa: PLC0415
    except ImportError:
        raise TuneproofError(f"{path}: format 'hf' needs the `datasets` package", hint="pip install datasets") from None
    if not path.exists():
        raise TuneproofError(f"{path}: folder not found")
    ds = datasets.load_from_disk(str(path))
    parts = ds.items() if isinstance(ds, datasets.DatasetDict) else [(split, ds)]
    out = []
    for name, d in parts:
        cols = list(d.column_names)
        for i, rec in enumerate(d):
            out.append(_to_example(rec, fields, f"{path}[{name}]#{i}", f"{name}:{i}", name, cols))
    return out, []


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
    intent from the file. The PlayMusic CESU-8 emoji is repaired and reported (CASES C17).

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
                        id=f"{intent}/{split}/{i:04d}", text=utter, label=intent, target=snips_target(intent, pieces),
                        source=f"{path}#{i}", split=split, meta={"pieces": pieces},
                    )
                )
    return out, repairs


def load_banking77(root: Path) -> tuple[list[Example], list[str]]:
    """Read BANKING77 (``train.csv``, ``test.csv`` with header ``text,category``). Ids are ``train:LINE``."""
    from tuneproof.study import FieldMap  # noqa: PLC0415

    fields = FieldMap(text="text", label="category")
    if not root.is_dir():
        raise TuneproofError(f"{root}: BANKING77 folder not found", hint="pass --data DIR holding banking77/ (see README)")
    out, repairs = [], []
    for split in ("train", "test"):
        ex, rep = load_csv(root / f"{split}.csv", fields, split=split)
        out += ex
        repairs += rep
    return out, repairs


def load_source(src, fields, base_dir: Path, data_root: Path | None = None) -> tuple[list[Example], list[str]]:
    """Load one ``data.sources`` entry of the study file. ``$DATA/`` in a path means the data root."""
    raw = src.path
    if raw.startswith("$DATA/") or raw == "$DATA":
        if data_root is None:
            from tuneproof.data.locate import find_data_root  # noqa: PLC0415

            data_root = find_data_root()
        path = data_root / raw[len("$DATA/"):]
    else:
        path = Path(raw).expanduser()
        if not path.is_absolute():
            path = base_dir / path
    if src.format == "snips":
        return load_snips(path)
    if src.format == "banking77":
        return load_banking77(path)
    if src.format == "hf":
        return load_hf_dir(path, fields, src.split)
    if not path.exists():
        raise TuneproofError(f"{path}: file not found", hint="fix data.sources[].path in tuneproof.yaml")
    if src.format == "csv":
        return load_csv(path, fields, src.split)
    return load_json_records(path, fields, src.split, lines=src.format == "jsonl")
