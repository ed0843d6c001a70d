"""The environment the runs recorded (the latest run's ``env.json``)."""

from __future__ import annotations

from tuneproof.deliver.dossier.blocks import NOT_RUN, _paragraph, _table, flatten
from tuneproof.deliver.dossier.evidence import _Evidence


def _environment(ev: _Evidence) -> list[dict]:
    for r in reversed(ev.runs):
        env = ev.json(r.id, "env.json")
        if env:
            rows = [[k, v] for k, v in flatten(env, depth=2) if v not in (None, "", [])]
            return [
                _paragraph(f"as recorded by {r.id} ({r.kind}); every run stores its own env.json."),
                _table(["key", "value"], rows),
            ]
    return [_paragraph(NOT_RUN)]
