"""The evidence one dossier build reads (cached run files, the hypothesis in force) and what a verdict
would need that is missing or broken."""

from __future__ import annotations

from typing import Any

from tuneproof import hypothesis as hyp
from tuneproof.deliver.headline import Headline, choose
from tuneproof.errors import TuneproofError
from tuneproof.evaluation.outputs import SET_OUTPUTS_KEY, set_outputs_path
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

    @property
    def headline(self) -> Headline | None:
        """The comparison the verdict is read from (:func:`tuneproof.deliver.headline.choose`): the frozen
        hypothesis judged for the delivered (or best passed) candidate against the baseline it names."""
        if not hasattr(self, "_headline"):

            def passed(entry: dict) -> bool:
                got = self.judged(entry)[0]
                return got is not None and str((got[1] or {}).get("verdict")) == "pass"

            self._headline = choose(self.runs, self.json, passed)
        return self._headline

    @property
    def missing(self) -> dict[str, dict[str, str]]:
        """``{run id: gap}`` of the completed runs whose evidence is gone (:func:`run_evidence_gaps`)."""
        if not hasattr(self, "_missing"):
            self._missing = {g["run"]: g for g in run_evidence_gaps(self.reg, self.runs)}
        return self._missing

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


#: what a completed run of each kind leaves in its folder for the dossier to stand on (a kind not listed: its
#: folder alone); a run whose folder or one of these files is gone is missing evidence (issue 33 item 5); an
#: evaluation's outputs on ``eval.sets`` (``sets/<name>/outputs.jsonl``, listed in its summary) count the same
RUN_EVIDENCE: dict[str, tuple[str, ...]] = {
    "baseline": ("outputs.jsonl", "eval.json"),
    "eval": ("outputs.jsonl", "eval.json"),
    "test": ("outputs.jsonl", "eval.json"),
    "compare": ("compare.json",),
    "train": ("config.json",),
    "data-check": ("data_check.json",),
}
#: evidence a run leaves only where its summary says it wrote it: file -> the summary key recorded with it
#: (``noise.json`` of an evaluation with ``eval.repeat`` > 1, its sha256 in ``noise_sha256``)
RUN_EVIDENCE_IF_RECORDED: dict[str, str] = {"noise.json": "noise_sha256"}


def run_evidence_gaps(reg, runs: list) -> list[dict[str, str]]:
    """The completed runs whose folder, or a file :data:`RUN_EVIDENCE` names for their kind (or
    :data:`RUN_EVIDENCE_IF_RECORDED` for what their summary recorded), is gone: each
    ``{"run", "what", "message", "hint"}``. A run that did not complete is listed with its status and reason
    instead; one marked invalid is no evidence of anything."""
    gaps = []
    for r in runs:
        if r.status != "completed":
            continue
        folder = reg.runs_dir / r.id
        if not folder.is_dir():
            what, path = f"{r.kind} run {r.id}'s folder is missing (runs/{r.id})", folder
        else:
            wanted = list(RUN_EVIDENCE.get(r.kind, ())) + [
                n for n, key in RUN_EVIDENCE_IF_RECORDED.items() if (r.summary or {}).get(key)
            ]
            gone = [n for n in wanted if not (folder / n).is_file()]
            gone += [  # the outputs on eval.sets the run recorded (their sha256 in its summary)
                set_outputs_path(folder, name).relative_to(folder).as_posix()
                for name in sorted((r.summary or {}).get(SET_OUTPUTS_KEY) or {})
                if not set_outputs_path(folder, name).is_file()
            ]
            if not gone:
                continue
            what, path = f"{r.kind} run {r.id}'s evidence is missing (runs/{r.id}/{', '.join(gone)})", folder / gone[0]
        gaps.append(
            {
                "run": r.id,
                "what": what,
                "message": f"{path}: {what.split(' (runs/')[0]}; what the run recorded is not shown",
                "hint": f"restore the run folder runs/{r.id} from a copy, or mark it invalid "
                f"(`tuneproof invalidate {r.id} --why ...`) and run it again",
            }
        )
    return gaps


def missing_evidence(ev: _Evidence) -> list[dict[str, str]]:
    """What the verdict rests on that is gone: the headline comparison's ``compare.json``, the baseline's or a
    candidate's per-example outputs (a deleted run folder), plus a broken seal of the frozen hypothesis
    (:func:`tuneproof.hypothesis.check_sealed`) and any other completed run whose evidence is gone
    (:func:`run_evidence_gaps`: a deleted test run's folder). Each ``{"what", "message", "hint"}``; [] when the
    dossier can be backed."""
    gaps = list(ev.gaps)
    named: set[str] = set()
    h = ev.headline
    if h is not None:
        c = h.compare
        named.add(c.id)
        if h.data is None:
            path = ev.reg.runs_dir / c.id / "compare.json"
            gaps.append(
                {
                    "what": f"comparison {c.id}'s compare.json is missing",
                    "message": f"{path}: comparison {c.id}'s compare.json is missing",
                    "hint": "run `tuneproof compare RUN` again",
                }
            )
        who = [("baseline", h.baseline)] + [("candidate", cid) for cid in (h.data or {}).get("candidates") or {}]
        for role, rid in who if h.data is not None else []:
            if not rid:
                continue
            named.add(rid)
            path = ev.reg.runs_dir / rid / "outputs.jsonl"
            redo = "`tuneproof baseline`" if role == "baseline" else "`tuneproof eval TRAIN_RUN`"
            if not path.is_file():
                gaps.append(
                    {
                        "what": f"{role} {rid}'s outputs are missing (runs/{rid}/outputs.jsonl)",
                        "message": f"{path}: {role} {rid}'s outputs are missing; comparison {c.id} was computed "
                        "from them",
                        "hint": f"restore the run folder runs/{rid}, or run {redo} and `tuneproof compare` again",
                    }
                )
    return gaps + [{k: v for k, v in g.items() if k != "run"} for rid, g in ev.missing.items() if rid not in named]


def _incomplete_block(gaps: list[dict[str, str]]) -> dict:
    return {"type": "strong", "text": "INCOMPLETE: " + "; ".join(g["what"] for g in gaps)}


_RESCORE = "scored with other required fields or format rule: run `tuneproof compare` again to judge it"


def _latest_candidate(ev: _Evidence) -> tuple[Any, dict | None, str | None]:
    """``(compare record, candidate entry, candidate id)`` of the headline comparison (:attr:`_Evidence.headline`,
    never a candidate-vs-candidate one); Nones when there is none."""
    h = ev.headline
    if h is None:
        return None, None, None
    return h.compare, h.entry, h.cid


def _kind_of(ev: _Evidence, run_id: str | None) -> str:
    return next((r.kind for r in ev.runs if r.id == run_id), "unknown")
