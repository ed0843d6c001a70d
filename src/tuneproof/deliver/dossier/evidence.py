"""The evidence one dossier build reads (cached run files, the hypothesis in force) and what a verdict
would need that is missing or broken."""

from __future__ import annotations

from typing import Any

from tuneproof import hypothesis as hyp
from tuneproof.errors import TuneproofError
from tuneproof.io import read_jsonl


class _Evidence:
    """Cached reads of run files for one dossier build."""

    def __init__(self, ctx, use_edited: str | None = None):
        self.ctx = ctx
        self.reg = ctx.registry
        self.runs = self.reg.list()
        self._json: dict[tuple[str, str], Any] = {}
        self.judging_error = None
        self.gaps: list[dict[str, str]] = []  # evidence a verdict needs that is missing: {"what", "message", "hint"}
        try:
            self.judging = hyp.resolve(ctx.study_dir, ctx.study, self.reg, use_edited)
        except hyp.SealBroken as err:  # no verdict against a hypothesis that is not the one frozen
            self.judging = hyp.Judging(current=hyp.hypothesis_view(ctx.study))
            self.judging_error = err.message
            self.gaps.append({"what": err.what, "message": err.message, "hint": err.hint or ""})
        except TuneproofError as err:  # e.g. the task changed after training: say so, still render
            if use_edited is not None and not use_edited.strip():
                raise
            self.judging, self.judging_error = (
                hyp.Judging(current=hyp.hypothesis_view(ctx.study)),
                str(err).splitlines()[0],
            )

    def judged(self, entry: dict) -> tuple[tuple[list, dict] | None, tuple[str, dict] | None]:
        """A recorded comparison entry judged against the hypothesis in force, and (when the study
        file's differs) ``(name, overall)`` of the other one; None where it needs re-scoring."""
        j = self.judging
        if j.frozen is None and "hypothesis_hash" not in entry:  # nothing frozen: as recorded
            return (entry.get("verdicts") or [], entry.get("overall") or {}), None
        primary = hyp.rejudge(entry, j.primary)
        other = None
        if j.other is not None:
            got = hyp.rejudge(entry, j.other)
            other = (j.other_name, got[1] if got else {"verdict": None, "detail": _RESCORE})
        return primary, other

    def json(self, run_id: str, name: str) -> Any:
        key = (run_id, name)
        if key not in self._json:
            try:
                self._json[key] = self.reg.run_json(run_id, name)
            except Exception:  # noqa: BLE001 - a damaged artifact must not stop the dossier
                self._json[key] = None
        return self._json[key]

    def rows(self, run_id: str, name: str) -> list[dict]:
        path = self.reg.runs_dir / run_id / name
        try:
            return read_jsonl(path) if path.exists() else []
        except Exception:  # noqa: BLE001
            return []

    def latest(self, kind: str, any_status: bool = False):
        runs = [r for r in self.runs if r.kind == kind and (any_status or r.status == "completed")]
        return runs[-1] if runs else None


def missing_evidence(ev: _Evidence) -> list[dict[str, str]]:
    """What the latest comparison's verdict rests on that is gone: its ``compare.json``, the
    baseline's or a candidate's per-example outputs (a deleted run folder), plus a broken seal of the
    frozen hypothesis (:func:`tuneproof.hypothesis.check_sealed`). Each ``{"what", "message", "hint"}``;
    [] when the verdict can be backed."""
    gaps = list(ev.gaps)
    c = ev.latest("compare")
    if c is None:
        return gaps
    data = ev.json(c.id, "compare.json")
    if data is None:
        path = ev.reg.runs_dir / c.id / "compare.json"
        return gaps + [
            {
                "what": f"comparison {c.id}'s compare.json is missing",
                "message": f"{path}: comparison {c.id}'s compare.json is missing",
                "hint": "run `tuneproof compare RUN` again",
            }
        ]
    who = [("baseline", data.get("baseline"))] + [("candidate", cid) for cid in data.get("candidates") or {}]
    for role, rid in who:
        if not rid:
            continue
        path = ev.reg.runs_dir / rid / "outputs.jsonl"
        if path.is_file():
            continue
        redo = "`tuneproof baseline`" if role == "baseline" else "`tuneproof eval TRAIN_RUN`"
        gaps.append(
            {
                "what": f"{role} {rid}'s outputs are missing (runs/{rid}/outputs.jsonl)",
                "message": f"{path}: {role} {rid}'s outputs are missing; comparison {c.id} was computed from them",
                "hint": f"restore the run folder runs/{rid}, or run {redo} and `tuneproof compare` again",
            }
        )
    return gaps


def _incomplete_block(gaps: list[dict[str, str]]) -> dict:
    return {"type": "strong", "text": "INCOMPLETE: " + "; ".join(g["what"] for g in gaps)}


_RESCORE = "scored with other required fields or format rule: run `tuneproof compare` again to judge it"


def _latest_candidate(ev: _Evidence) -> tuple[Any, dict | None, str | None]:
    c = ev.latest("compare")
    if not c:
        return None, None, None
    data = ev.json(c.id, "compare.json") or {}
    cands = data.get("candidates") or {}
    if not cands:
        return c, None, None
    cid = next(iter(cands))
    return c, cands[cid], cid
