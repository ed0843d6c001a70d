"""The schema of ``rental.json`` (docs/CONTRACTS.md, "Rental window"): every key the rental clock reads,
with its type, checked when the file is read (:func:`validate`), like the study file and the run records.

A hand-edited or damaged record is named by its key and what is wrong (``rental.json: clock: Input should be
a valid dictionary (got None)``), never a traceback; the one path it holds (``delivered.bundle``) must lie
inside the study folder, relative to it. Keys this version does not know are kept as they are (a later
tuneproof of the same ``rental_schema`` may add some); the known ones must have their type.
"""

from __future__ import annotations

import math
import re
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tuneproof.errors import TuneproofError


class _Record(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


def _finite(v: float) -> float:
    if not math.isfinite(v):
        raise ValueError("not a finite number of seconds")
    return v


class Work(_Record):
    steps: int = Field(ge=0, description="optimizer steps of the study's training budget")
    checkpoint_every: int = Field(ge=0, description="steps between checkpoints")
    n_eval: int = Field(ge=0, description="examples one evaluation predicts")
    n_test: int = Field(ge=0, description="examples of the reserved test split")


class Phase(_Record):
    phase: str
    hours: float = Field(ge=0, description="hours planned for the phase")


class Plan(_Record):
    phases: list[Phase] = Field(description="the plan's phases at the start of the window")


class Command(_Record):
    command: str = Field(description="the command that spent hours (train, eval, deliver, ...)")
    phase: str = Field(description="the plan's phase its hours count in")
    start: float = Field(description="seconds since the epoch, as read")
    end: float | None = Field(None, description="seconds since the epoch, as read; None while it runs")
    estimate_s: float = Field(0.0, ge=0, description="seconds it was expected to take")
    basis: str = ""
    status: str | None = None
    runs: list[str] = Field(default_factory=list)
    pid: int | None = Field(None, description="the process that runs it (an open entry whose process is gone ends)")
    host: str | None = None
    proc_start: str | None = None

    @field_validator("start", "end")
    @classmethod
    def _time(cls, v: float | None) -> float | None:
        return v if v is None else _finite(v)


class Override(_Record):
    command: str
    time: float
    reason: str
    numbers: str = ""


class Machine(_Record):
    host: str
    first_seen: float


class Step(_Record):
    from_: float = Field(alias="from", description="the last recorded time (seconds since the epoch)")
    to: float = Field(description="the reading behind it")
    where: str = ""
    host: str | None = None


class Clock(_Record):
    last_seen: float
    went_back: list[Step] = Field(default_factory=list)


class Delivered(_Record):
    train: str
    export: str | None = None
    bundle: str = Field(description="the verified bundle folder, relative to the study folder")
    verified: bool
    verify_seconds: float | None = None
    time: float | None = None
    started: float | None = None
    chosen: str | None = None
    manifest_sha256: str | None = Field(None, description="sha256 of the bundle's manifest.json when verified")


class Rental(_Record):
    rental_schema: int = Field(ge=1)
    start: float
    ends: float
    days: float | None = None
    work: Work
    plan: Plan
    rates: dict[str, Any]
    commands: list[Command] = Field(default_factory=list)
    overrides: list[Override] = Field(default_factory=list)
    machines: list[Machine] = Field(default_factory=list)
    clock: Clock
    delivered: Delivered | None = None

    @field_validator("start", "ends")
    @classmethod
    def _time(cls, v: float) -> float:
        return _finite(v)


def _loc(loc: tuple) -> str:
    return ".".join("from" if p == "from_" else str(p) for p in loc) or "<root>"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def inside_study(recorded: str) -> str | None:
    """What is wrong with a path ``rental.json`` records (``delivered.bundle``), or None: it must be relative
    to the study folder and stay inside it (no ``..``, not absolute)."""
    p = PurePosixPath(recorded.replace("\\", "/"))
    if not recorded.strip() or p.is_absolute() or Path(recorded).is_absolute():
        return "is not a path relative to the study folder"
    if ".." in p.parts:
        return "leads out of the study folder ('..')"
    return None


def validate(path: Path, raw: Any) -> dict[str, Any]:
    """``raw`` (the JSON read from ``path``) checked against :class:`Rental`; returns it as a plain dict
    (times as floats, ``went_back`` steps with their ``from`` key).

    Raises:
        TuneproofError: a key missing or of the wrong type, ``ends`` not after ``start``, or a
            ``delivered.bundle`` outside the study folder (exit 2), naming the key and the value found.
    """
    hint = "restore rental.json from a copy of the study, or start a new window in a new study folder"
    try:
        rec = Rental.model_validate(raw)
    except ValidationError as err:
        lines = []
        for e in err.errors()[:3]:
            msg = re.sub(r" or instance of \w+", "", e["msg"].removeprefix("Value error, "))
            got = "" if e["type"] == "missing" else f" (got {_short(e.get('input'))})"
            lines.append(f"{path}: {_loc(e['loc'])}: {msg}{got}")
        more = len(err.errors()) - 3
        raise TuneproofError("\n".join(lines) + (f"\n(and {more} more)" if more > 0 else ""), hint=hint) from None
    if rec.ends <= rec.start:
        raise TuneproofError(f"{path}: ends {rec.ends} is not after start {rec.start}", hint=hint)
    if rec.delivered is not None and (problem := inside_study(rec.delivered.bundle)):
        raise TuneproofError(f"{path}: delivered.bundle {rec.delivered.bundle!r} {problem}", hint=hint)
    return rec.model_dump(by_alias=True)
