"""What must not get worse outside the task: the study's ``eval.sets`` generated with each evaluation, and the
candidate's outputs on them compared with the base's (docs/eval-sets.md).

- :func:`evaluate_sets`: after the eval split, ``baseline``, ``eval`` and ``test`` generate every set with the same
  model, prompt template and decoding; each set's rows go to ``runs/<id>/sets/<name>/outputs.jsonl``, their sha256
  to the run's summary (``set_outputs_sha256``, inside the record's hash), so a missing or altered file makes the
  run incomplete (:func:`tuneproof.evaluation.outputs.check_complete`) and it is never judged.
- :func:`compare_sets`: per set, the **agreement** (the share of the set's examples whose candidate answer equals
  the base's, :func:`same_answer`) with a percentile bootstrap interval over examples, and, where the set has
  references, every aggregate metric of the study's task kind for base and candidate with the paired bootstrap
  interval of the delta (:func:`tuneproof.evaluation.compare.paired_compare`, the main split's machinery).
  ``hypothesis.guards[].set`` judges them (:func:`tuneproof.evaluation.compare.judge`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tuneproof.errors import CheckFailed, TuneproofError
from tuneproof.evaluation.compare import CONFIDENCE, paired_compare
from tuneproof.evaluation.outputs import SET_OUTPUTS_KEY, set_outputs_path
from tuneproof.io import read_jsonl, sha256_file, write_jsonl

#: how many disagreeing examples a comparison keeps per set (compare.json, dossier)
DISAGREEMENTS_SHOWN = 5
#: the definition of agreement as written in compare.json and docs/eval-sets.md
AGREEMENT_DEFINITION = (
    "share of the set's examples whose candidate answer equals the base's: the answer as the evaluation scores it "
    "(the generation parsed by eval.answer_from, surrounding whitespace stripped), compared character for character"
)


# --------------------------------------------------------------------------- generating the sets
def evaluate_sets(ctx, run, generate: Callable[[list, str, list], list[str]], what: str) -> dict[str, dict]:
    """Generate each of the study's ``eval.sets`` (:attr:`~tuneproof.context.StudyContext.eval_sets`) into ``run``.

    Args:
        generate: ``generate(examples, label, raw_out) -> predictions``: the evaluation's own procedure
            (model, prompt template, decoding, backend), as :func:`tuneproof.evaluation.recording.evaluate_into`
            runs it on the split; ``raw_out`` gets the raw generations.
        what: the evaluation's name on the progress bars (``baseline``, ``eval r0003``).

    Returns:
        ``{name: {"n", "sha256" (the set's content), "references", "outputs_sha256"}}`` for ``eval.json``; {} when
        the study has no sets. The run's summary gets ``set_outputs_sha256: {name: sha256}``.
    """
    out: dict[str, dict] = {}
    hashes: dict[str, str] = {}
    for s in ctx.eval_sets:
        examples = list(s.examples)
        raw: list[str] = []
        preds = generate(examples, f"{what}: set '{s.name}'", raw)
        rows = [
            {"id": e.id, "input": e.text, "reference": e.target, "prediction": p}
            | ({"raw": raw[k]} if len(raw) == len(preds) else {})
            for k, (e, p) in enumerate(zip(examples, preds))
        ]
        path = set_outputs_path(run.dir, s.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_jsonl(path, rows)
        hashes[s.name] = sha256_file(path)
        out[s.name] = {
            "n": len(rows),
            "sha256": s.sha256,
            "references": s.has_references,
            "outputs_sha256": hashes[s.name],
        }
    if hashes:
        run.update_summary(**{SET_OUTPUTS_KEY: hashes})
    return out


def read_set_outputs(runs_dir: Path, rec, name: str) -> list[dict[str, Any]]:
    """The rows run ``rec`` recorded on the set ``name``, after checking their sha256 against its summary.

    Raises:
        CheckFailed: the run recorded no outputs on that set (evaluated before the set existed), or the file is
            missing or changed since (the run is incomplete: evaluate again).
    """
    run_dir = Path(runs_dir) / rec.id
    want = ((rec.summary or {}).get(SET_OUTPUTS_KEY) or {}).get(name)
    path = set_outputs_path(run_dir, name)
    if want is None:
        raise CheckFailed(
            f"{rec.id} has no outputs on eval.sets '{name}' (it was evaluated without that set)",
            hint="evaluate it again with the study's eval.sets (`tuneproof baseline` / `tuneproof eval RUN`)",
        )
    if not path.is_file() or sha256_file(path) != want:
        why = "is missing" if not path.is_file() else "changed since the run wrote it"
        raise CheckFailed(
            f"{rec.id} is incomplete: {path} {why}; evaluate again",
            hint="a verdict is computed only from the outputs a run recorded",
        )
    return read_jsonl(path)


# --------------------------------------------------------------------------- comparing them
def same_answer(base: Any, cand: Any) -> bool:
    """Whether two recorded answers agree (:data:`AGREEMENT_DEFINITION`): both present and equal once surrounding
    whitespace is stripped. The rows' ``prediction`` is already the answer the evaluation scores (the text
    modality parses it with ``eval.answer_from``, :func:`tuneproof.data.chat_template.split_generation`); a
    missing answer (None) never agrees."""
    if base is None or cand is None:
        return False
    return str(base).strip() == str(cand).strip()


def agreement(base_rows: Sequence[dict], cand_rows: Sequence[dict], *, iterations: int = 1000, seed: int = 0) -> dict:
    """Agreement of paired rows (same ids, same order) with its 95% percentile bootstrap interval.

    The bootstrap resamples example indices with replacement (``numpy.random.default_rng(seed)``, ``iterations``
    resamples; Efron & Tibshirani 1993) and takes the 2.5 / 97.5 percentiles of the resampled share.

    Returns:
        ``{"base": None, "cand": share, "delta": None, "ci": [lo, hi], "agree": k, "n": n, "definition"}``: the
        guard's entry (``cand`` is what ``floor`` is compared with).
    """
    same = np.array([same_answer(b.get("prediction"), c.get("prediction")) for b, c in zip(base_rows, cand_rows)])
    n = len(same)
    if n == 0:
        return {"base": None, "cand": None, "delta": None, "ci": None, "agree": 0, "n": 0}
    rng = np.random.default_rng(seed)
    shares = []
    chunk = max(1, 4_000_000 // n)
    done = 0
    while done < iterations:
        b = min(chunk, iterations - done)
        shares.append(same[rng.integers(0, n, size=(b, n))].mean(axis=1))
        done += b
    alpha = (1 - CONFIDENCE) / 2 * 100
    lo, hi = np.percentile(np.concatenate(shares), [alpha, 100 - alpha])
    return {
        "base": None,
        "cand": float(same.mean()),
        "delta": None,
        "ci": [float(lo), float(hi)],
        "agree": int(same.sum()),
        "n": n,
        "definition": AGREEMENT_DEFINITION,
    }


def compare_set(
    name: str,
    base_rows: Sequence[dict],
    cand_rows: Sequence[dict],
    task: str,
    *,
    required_fields: Sequence[str] | None,
    eval_cfg: Any,
    iterations: int = 1000,
    seed: int = 0,
    labels: Sequence[str] | None = None,
) -> dict:
    """One set's comparison: the base's and the candidate's rows paired by id.

    Returns:
        ``{"name", "n", "references", "agreement": :func:`agreement`, "metrics": {metric: {"base", "cand", "delta",
        "ci"}} (the task's aggregate metrics; {} without references), "disagreements": [{"id", "input", "base",
        "cand"}] (the first :data:`DISAGREEMENTS_SHOWN`), "disagreeing": how many}``.

    Raises:
        TuneproofError: the runs hold other ids or other references on the set (another version of it), or a
            reference the task's scorer refuses (names the set and the example).
    """
    base_by = {str(r.get("id")): r for r in base_rows}
    cand_by = {str(r.get("id")): r for r in cand_rows}
    if set(base_by) != set(cand_by) or len(base_by) != len(base_rows) or len(cand_by) != len(cand_rows):
        raise TuneproofError(
            f"eval.sets '{name}': the runs generated other examples of the set "
            f"({len(base_rows)} and {len(cand_rows)} rows, {len(set(base_by) ^ set(cand_by))} ids on one side only)",
            hint="evaluate both with the study's current eval.sets, then compare",
        )
    ids = [str(r.get("id")) for r in base_rows]
    base = [base_by[i] for i in ids]
    cand = [cand_by[i] for i in ids]
    refs = all(r.get("reference") is not None for r in base)
    metrics: dict = {}
    if refs:
        if labels is not None:  # a reference outside the study's labels is one more class, not a fault
            labels = list(dict.fromkeys([*labels, *(str(r["reference"]).strip() for r in base)]))
        try:
            paired = paired_compare(
                base,
                cand,
                task,
                required_fields=required_fields,
                eval_cfg=eval_cfg,
                iterations=iterations,
                seed=seed,
                labels=labels,
            )
        except TuneproofError as err:  # a reference the task's scorer refuses: name the set it came from
            raise TuneproofError(
                f"eval.sets '{name}': {err.message}",
                hint="fix the set's reference (`tuneproof data check` names its file and key), then evaluate "
                "the baseline and the candidate again",
            ) from None
        metrics = paired["metrics"]
    agree = agreement(base, cand, iterations=iterations, seed=seed)
    differ = [(b, c) for b, c in zip(base, cand) if not same_answer(b.get("prediction"), c.get("prediction"))]
    return {
        "name": name,
        "n": len(ids),
        "references": refs,
        "agreement": agree,
        "metrics": metrics,
        "disagreeing": len(differ),
        "disagreements": [
            {"id": str(b["id"]), "input": b.get("input"), "base": b.get("prediction"), "cand": c.get("prediction")}
            for b, c in differ[:DISAGREEMENTS_SHOWN]
        ],
    }


def compare_sets(runs_dir: Path, base_rec, cand_rec, names: Sequence[str], **kwargs: Any) -> dict[str, dict]:
    """:func:`compare_set` of each set in ``names`` between two evaluation runs, their outputs read by
    :func:`read_set_outputs` (sha256 checked). ``kwargs`` go to :func:`compare_set` (task, required_fields,
    eval_cfg, iterations, seed, labels).

    Raises:
        CheckFailed: a run has no, or no longer its, outputs on a set.
        TuneproofError: see :func:`compare_set`.
    """
    return {
        name: compare_set(
            name,
            read_set_outputs(runs_dir, base_rec, name),
            read_set_outputs(runs_dir, cand_rec, name),
            **kwargs,
        )
        for name in names
    }


def set_lines(sets: dict[str, dict]) -> list[str]:
    """The compare screen's lines per set: n, agreement with its CI, each reference metric base -> candidate with
    the delta's CI (``set 'general' (10 examples): agreement 0.7000 (7 of 10), 95% CI [0.4000, 1.0000]``)."""
    lines = []
    for name, s in sets.items():
        a = s.get("agreement") or {}
        ci = a.get("ci") or [None, None]
        line = f"set '{name}' ({s.get('n')} examples): agreement {_f(a.get('cand'))} ({a.get('agree')} of {a.get('n')})"
        line += f", 95% CI [{_f(ci[0])}, {_f(ci[1])}]"
        if not s.get("references"):
            line += "; no references"
        lines.append(line)
        for m, e in (s.get("metrics") or {}).items():
            eci = e.get("ci") or [None, None]
            lines.append(
                f"  {m}: {_f(e.get('base'))} -> {_f(e.get('cand'))}, delta {_f(e.get('delta'), signed=True)} "
                f"(95% CI [{_f(eci[0], signed=True)}, {_f(eci[1], signed=True)}])"
            )
    return lines


def _f(x: Any, signed: bool = False) -> str:
    if x is None:
        return "n/a"
    return f"{x:+.4f}" if signed else f"{x:.4f}"
