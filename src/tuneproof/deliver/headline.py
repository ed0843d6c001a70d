"""Which comparison is the verdict (docs/PROTOCOL.md step 7): the headline of the dossier, and the claims an
export bundles, follow it; every other comparison is listed as what it is.

The verdict is the frozen hypothesis judged for one candidate against the baseline the hypothesis names (a run of
kind ``baseline``: the base model evaluated with the study's procedure). The candidate is, in this order:

1. **delivered**: the train run of the latest completed export; its latest comparison against the baseline its
   train run was gated on (``baseline_run`` in its summary), else against any baseline run;
2. **best passed**: the candidate whose verdict passed with the largest gain of the success metric (the latest one
   on a tie);
3. **latest**: the latest comparison against a baseline (no candidate passed).

Only comparisons whose runs (baseline and candidate) are all still completed count: one that rests on a run
invalidated since is no verdict (:func:`stale_comparisons` lists it); none left: no verdict.

A comparison whose reference run is not a baseline (``compare r0008 --against r0005``: two candidates) is never
the verdict, whatever its order: :func:`other_comparisons` lists it as a candidate-vs-candidate comparison. A
comparison is read from its ``compare.json``, or, when that is gone, from its run's summary (``baseline``,
``candidates``), so that a lost file is named as missing evidence rather than skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tuneproof.evaluation.noise import flips_text, noise_decided_text

#: why a candidate is the headline's (``Headline.basis``) -> how the dossier says it
BASES = {
    "delivered": "the delivered candidate",
    "best passed": "the best candidate that passed",
    "latest": "the latest comparison with the baseline (no candidate passed)",
}


@dataclass
class Headline:
    """The comparison the verdict is read from.

    ``compare``: the compare run's record; ``data``: its ``compare.json`` (None when it is gone); ``cid``: the
    candidate's evaluation run id; ``entry``: its entry in ``compare.json`` (None when gone); ``baseline``: the
    baseline run id; ``basis``: a key of :data:`BASES`; ``train``: the candidate's train run id (None for a
    candidate that is no train run's evaluation); ``export``: the export run that delivered it (basis delivered).
    """

    compare: Any
    data: dict | None
    cid: str
    entry: dict | None
    baseline: str | None
    basis: str
    train: str | None = None
    export: str | None = None

    @property
    def says(self) -> str:
        """``r0004 (the delivered candidate: export r0006 of r0003) vs baseline r0002 (r0005)``."""
        who = BASES[self.basis] + (f": export {self.export} of {self.train}" if self.export else "")
        return f"{self.cid} ({who}) vs baseline {self.baseline} ({self.compare.id})"


def _pairs(runs: list, read: Callable[[str, str], Any]) -> list[tuple[Any, dict | None, str | None, list[str]]]:
    """``(compare record, compare.json or None, reference run id, candidate ids)`` of every completed comparison."""
    out = []
    for c in runs:
        if c.kind != "compare" or c.status != "completed":
            continue
        data = read(c.id, "compare.json")
        data = data if isinstance(data, dict) else None
        ref = (data or {}).get("baseline") or c.summary.get("baseline")
        cands = list((data or {}).get("candidates") or {}) or list(c.summary.get("candidates") or [])
        out.append((c, data, ref, cands))
    return out


def against_baseline(runs: list, ref: str | None) -> bool:
    """The run ``ref`` a comparison was made against is a ``baseline`` run (not another candidate)."""
    return any(r.id == ref and r.kind == "baseline" for r in runs)


def other_comparisons(runs: list, read: Callable[[str, str], Any]) -> list[tuple[Any, str | None, list[str]]]:
    """``(compare record, reference run id, candidate ids)`` of the comparisons that are not against a baseline run
    (candidate vs candidate): listed as such, never the verdict."""
    return [(c, ref, cands) for c, _, ref, cands in _pairs(runs, read) if not against_baseline(runs, ref)]


def _success_delta(entry: dict | None) -> float:
    for v in (entry or {}).get("verdicts") or []:
        if v.get("kind") == "success" and isinstance(v.get("delta"), (int, float)):
            return float(v["delta"])
    return float("-inf")


def choose(
    runs: list, read: Callable[[str, str], Any], passed: Callable[[dict], bool] | None = None
) -> Headline | None:
    """The headline comparison of a study (see the module docstring); None when no comparison is against a
    baseline run.

    Args:
        runs: every run record of the registry, oldest first (``Registry.list()``).
        read: ``read(run_id, name)`` -> the JSON file ``runs/<run_id>/<name>`` or None.
        passed: ``passed(entry)`` -> the candidate's verdict under the hypothesis in force is pass (default:
            the recorded ``overall.verdict``).
    """
    passed = passed or (lambda e: (e.get("overall") or {}).get("verdict") == "pass")
    by_id = {r.id: r for r in runs}
    rows = []  # (compare, data, baseline id, candidate id, entry), oldest first
    for c, data, ref, cands in _pairs(runs, read):
        if against_baseline(runs, ref):
            rows += [(c, data, ref, cid, ((data or {}).get("candidates") or {}).get(cid)) for cid in cands]
    if not rows:
        return None

    def train_of(cid: str) -> str | None:
        rec = by_id.get(cid)
        parent = by_id.get(rec.parent) if rec is not None and rec.parent else None
        return parent.id if parent is not None and parent.kind == "train" else None

    rows = [row for row in rows if _whole(by_id, row[2], row[3])]  # an invalidated run is no evidence
    if not rows:
        return None
    exports = [r for r in runs if r.kind == "export" and r.status == "completed" and r.parent]
    if exports:
        exp = exports[-1]
        named = (by_id[exp.parent].summary.get("baseline_run") if exp.parent in by_id else None) or None
        mine = [row for row in rows if train_of(row[3]) == exp.parent]
        for pick in ([row for row in mine if row[2] == named], mine):
            if pick:
                c, data, ref, cid, entry = pick[-1]
                return Headline(c, data, cid, entry, ref, "delivered", exp.parent, exp.id)

    good = [row for row in rows if row[4] is not None and passed(row[4])]
    if good:
        best = max(range(len(good)), key=lambda i: (_success_delta(good[i][4]), i))
        c, data, ref, cid, entry = good[best]
        return Headline(c, data, cid, entry, ref, "best passed", train_of(cid))
    c, data, ref, cid, entry = next(row for row in rows if row[0] is rows[-1][0])  # the latest, its first candidate
    return Headline(c, data, cid, entry, ref, "latest", train_of(cid))


def _whole(by_id: dict, *run_ids: str | None) -> bool:
    """Every run a comparison rests on is still in the registry and completed (none invalidated since)."""
    return all(rid in by_id and by_id[rid].status == "completed" for rid in run_ids)


def stale_comparisons(runs: list, read: Callable[[str, str], Any]) -> list[str]:
    """One line per comparison with a baseline that rests on a run no longer completed (``r0005: candidate r0004
    is invalid (outputs edited by hand)``): never the verdict, listed so that no comparison disappears unsaid."""
    by_id = {r.id: r for r in runs}
    out = []
    for c, _, ref, cands in _pairs(runs, read):
        if not against_baseline(runs, ref):
            continue
        for role, rid in [("baseline", ref)] + [("candidate", cid) for cid in cands]:
            if not _whole(by_id, rid):
                rec = by_id.get(rid)
                now = "gone from the registry" if rec is None else f"{rec.status} ({rec.reason or 'no reason'})"
                out.append(f"comparison {c.id}: {role} {rid} is {now}")
    return out


def noise_lines(entry: dict | None, verdicts: list[dict] | None) -> tuple[str | None, list[str]]:
    """What the first screen says of the noise floor (``eval.repeat``) for the headline comparison ``entry``
    judged as ``verdicts``: ``(decided, notes)``. ``decided``: the line saying the noise floor decided the success
    verdict (a gain above min_gain but not above the floor; :func:`tuneproof.evaluation.noise.noise_decided_text`),
    else None; ``notes``: which threshold judged the gain and why, and the per-example flips between repeats
    (empty where no floor was measured: neither run repeated, or a comparison recorded before the floor existed;
    the success criterion's detail then says that min_gain alone applied)."""
    succ = next((v for v in verdicts or [] if v.get("kind") == "success"), None)
    if succ is None or not succ.get("noise") or succ["noise"].get("noise_floor") is None:
        return None, []  # no floor measured: min_gain alone, as the criterion's detail says
    notes = [f"success threshold: {succ['noise']['why']}"]
    flips = flips_text((entry or {}).get("noise"))
    if flips:
        notes.append(flips)
    return noise_decided_text(succ), notes
