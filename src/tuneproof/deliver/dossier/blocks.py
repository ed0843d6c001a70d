"""The block shapes a section is made of and the small value formats the dossier prints."""

from __future__ import annotations

from typing import Any

from tuneproof.ui import capped

NOT_RUN = "not run yet"


def _fmt(x: Any, nd: int = 3) -> str:
    """A value as the dossier prints it: ``nd`` decimals for floats, lower-case booleans, ``-`` for None."""
    if isinstance(x, bool):
        return str(x).lower()
    if isinstance(x, float):
        return f"{x:.{nd}f}" if abs(x) < 1e6 else f"{x:.3g}"
    return "-" if x is None else str(x)


def _ci(ci: Any) -> str:
    return "[" + ", ".join(_fmt(x) for x in (ci or [None, None])) + "]"


def seconds_text(s: Any) -> str:
    """A duration in the dossier, one format everywhere: ``91.6 s``, ``2.5 min`` (from 120 s), ``3.1 h`` (from 2 h);
    ``?`` when not recorded."""
    if not isinstance(s, (int, float)) or isinstance(s, bool):
        return "?"
    return f"{s:.1f} s" if s < 120 else (f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h")


def _dur(rec) -> str:
    if not rec.ended or not rec.created:
        return ""
    return seconds_text(rec.ended - rec.created)


def flatten(obj: Any, prefix: str = "", depth: int = 3) -> list[tuple[str, Any]]:
    """Scalar leaves of a nested dict as ``(dotted key, value)``; lists of scalars joined."""
    out: list[tuple[str, Any]] = []
    if isinstance(obj, dict) and depth > 0:
        for k, v in obj.items():
            if k == "schema_version":
                continue
            key = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, dict):
                out += flatten(v, key, depth - 1)
            elif isinstance(v, list):
                if all(not isinstance(x, (dict, list)) for x in v):
                    out.append((key, capped([_fmt(x) for x in v])))
            else:
                out.append((key, v))
    return out


def _paragraph(text: str) -> dict:
    """A ``{"type": "p"}`` block."""
    return {"type": "p", "text": text}


def not_completed(ev: Any, kind: str, command: str) -> list[dict]:
    """What a section without a completed run of ``kind`` says: ``not run yet (`COMMAND`)`` when no
    run of that kind exists, else what became of the latest one, e.g. ``not completed: the baseline
    r0002 was interrupted (interrupted by Ctrl-C); run `tuneproof baseline` again`` (a run that was
    started is never reported as not run)."""
    r = ev.latest(kind, any_status=True)
    if r is None:
        return [_paragraph(f"{NOT_RUN} (`{command}`)")]
    why = f" ({r.reason})" if r.reason else ""
    return [_paragraph(f"not completed: the {kind} {r.id} was {r.status}{why}; run `{command}` again")]


def _table(cols: list[str], rows: list[list[Any]]) -> dict:
    return {"type": "table", "cols": cols, "rows": [[_fmt(v) for v in r] for r in rows]}


def _fig(png: bytes | None, caption: str) -> list[dict]:
    return [{"type": "figure", "png": png, "caption": caption}] if png else []
