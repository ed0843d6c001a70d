"""How much an evaluation's numbers move by themselves: ``eval.repeat`` and the noise floor (``noise.json``).

An evaluation (``baseline``, ``eval``, ``test``) with ``eval.repeat: N`` (N >= 2) evaluates the same model N times
under the procedure's own sources of variation:

- repeat 1 predicts the examples in their canonical order, batched by prompt length as always: its outputs are the
  run's ``outputs.jsonl``, scored exactly as an evaluation without repeats;
- repeat r >= 2 predicts a seeded permutation of the examples (:func:`repeat_order`, ``numpy.random.default_rng``
  seeded with ``[eval.seed, r - 1]``), batched in that order without sorting by length, so that batch order, batch
  composition and padding change; its predictions are put back in the canonical order before scoring;
- with ``eval.do_sample`` every repeat draws from its own sampling seed (:func:`sampling_seed`: ``eval.seed * 1000 +
  r - 1``, recorded; torch's generators are seeded before the repeat);
- on a GPU, kernel nondeterminism (atomics, split reductions chosen by shape) comes with every repeat.

With ``eval.repeat: 1`` (the default) nothing here runs and the evaluation is exactly what it was before the key
existed: the same outputs, the same ``eval.json`` and evaluation fingerprint (``eval.repeat`` has the role
``budget``, which no fingerprint part holds), no ``noise.json``.

``noise.json`` (:func:`noise_record`) holds each metric's value per repeat, its spread (max - min over the
repeats: the run's *noise floor* on that metric, always computed from the repeats, never assumed: on a CPU with
greedy decoding in fp32 it is usually measured as 0, and says so only because the repeats agreed) and the
per-example flips: the ids whose per-example correctness or parsed prediction differs between any two repeats,
with each flipped example's predictions per repeat. Its sha256 is recorded in the run's summary
(``noise_sha256``) when it is written; :func:`read_noise` refuses a file whose bytes changed since.

The floor of a comparison (:func:`comparison_floor`) is the **larger** of the baseline's and the candidate's
measured floors on the success metric. Both numbers come from the same procedure on the same examples; the larger
one is the conservative choice: a gain is attributed to the training only when it exceeds what either model's
evaluation produced by itself, and a candidate cannot look better by being evaluated fewer times than its
baseline. When only one of the two runs has repeats, its floor is the comparison's (measured on one side, said so);
when neither has, the floor is *not measured* and the success criterion is judged against ``min_gain`` alone, as
before (:func:`success_threshold` says which applied and why). A spread from N repeats is a lower bound of the
range the numbers can take (more repeats can only widen it), so the floor is a minimum, not a guarantee. The gain is
judged as compare judges it against min_gain (:func:`tuneproof.evaluation.compare.judge`): pass when the 95% CI's
lower bound reaches max(min_gain, floor), fail when its upper bound is below it.

Limits: repeats need ``eval.backend: transformers`` (refused with vllm when the study file is read); the base
model's pass that ``test`` pairs a candidate with on the test split runs once (its floor there is the candidate's).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tuneproof.errors import TuneproofError
from tuneproof.io import read_json, sha256_file

NOISE_JSON = "noise.json"
_EPS = 1e-12  # float tolerance of threshold comparisons (as tuneproof.evaluation.compare's)


def repeat_order(n: int, repeat: int, seed: int) -> list[int]:
    """The order in which repeat ``repeat`` (0-based) predicts ``n`` examples: positions ``0..n-1``.

    Repeat 0 is the canonical order (``list(range(n))``); repeat r >= 1 a permutation drawn by
    ``numpy.random.default_rng([seed, r]).permutation(n)`` (the same for the same seed and repeat on every machine).
    """
    if repeat == 0:
        return list(range(n))
    return [int(i) for i in np.random.default_rng([int(seed) & 0xFFFFFFFF, int(repeat)]).permutation(n)]


def sampling_seed(seed: int, repeat: int) -> int:
    """The sampling seed of repeat ``repeat`` (0-based) with ``eval.do_sample``: ``eval.seed * 1000 + repeat``
    (distinct for the repeats of one evaluation; recorded in ``noise.json``)."""
    return int(seed) * 1000 + int(repeat)


def seed_sampling(seed: int | None) -> None:
    """Seed torch's generators (every device's) for one repeat's sampling; nothing when ``seed`` is None."""
    if seed is None:
        return
    import torch  # noqa: PLC0415 - torch loads only when a sampled evaluation repeats

    torch.manual_seed(seed)


def scalar_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """The scalar metrics of a task's scorer output (``accuracy``, ``macro_f1``, ``field_f1``...): its top-level
    finite numbers (booleans and nested per-class / per-field tables left out)."""
    return {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))
    }


def noise_record(
    metrics: Sequence[dict[str, Any]],
    records: Sequence[Sequence[dict[str, Any]]],
    *,
    orders: Sequence[Sequence[int]],
    seeds: Sequence[int | None],
    device: str,
    do_sample: bool,
) -> dict[str, Any]:
    """``noise.json`` of an evaluation repeated ``len(metrics)`` times.

    Args:
        metrics: per repeat, the task's metrics (the scorer's dict; its scalars are kept, :func:`scalar_metrics`).
        records: per repeat, the scored rows in the canonical order (``id``, ``prediction``, ``correct``).
        orders: per repeat, the order its examples were predicted in (:func:`repeat_order`).
        seeds: per repeat, its sampling seed (None: greedy decoding, no seed).
        device: where it ran (``cpu``, ``cuda``...), since the sources of variation depend on it.
        do_sample: ``eval.do_sample``.

    Returns:
        ``{"repeats", "device", "do_sample", "sources", "orders", "sampling_seeds", "metrics", "flips"}``:
        ``repeats`` (N), ``sources`` (the sources of variation in force, in words), ``orders`` (per repeat,
        ``{"canonical", "order"}``: the positions of the examples in the order it predicted them, and whether that
        is the canonical order), ``sampling_seeds``, ``metrics`` (``{name: {"values": [N floats], "spread": max -
        min, "floor": spread}}``), ``flips`` (``{"count", "ids", "examples": [{"id", "predictions": [N],
        "correct": [N]}]}``: the examples whose correctness or parsed prediction differs between repeats).

    Raises:
        ValueError: fewer than two repeats, or repeats over different example ids.
    """
    n_rep = len(metrics)
    if n_rep < 2 or len(records) != n_rep or len(orders) != n_rep:
        raise ValueError(f"noise_record needs at least two repeats with records and orders (got {n_rep})")
    ids = [str(r["id"]) for r in records[0]]
    for k, rows in enumerate(records[1:], start=2):
        if [str(r["id"]) for r in rows] != ids:
            raise ValueError(f"repeat {k} holds other example ids than repeat 1")
    scalars = [scalar_metrics(m) for m in metrics]
    names = [k for k in scalars[0] if all(k in s for s in scalars)]
    per_metric = {}
    for name in names:
        values = [s[name] for s in scalars]
        spread = max(values) - min(values)
        per_metric[name] = {"values": values, "spread": spread, "floor": spread}
    flipped = []
    for i, rid in enumerate(ids):
        preds = [rows[i].get("prediction") for rows in records]
        correct = [bool(rows[i].get("correct")) for rows in records]
        if len({str(p) for p in preds}) > 1 or len(set(correct)) > 1:
            flipped.append({"id": rid, "predictions": preds, "correct": correct})
    sources = ["batch order and composition (a seeded permutation of the examples per repeat)"]
    if do_sample:
        sources.append("sampling (one seed per repeat)")
    if device != "cpu":
        sources.append(f"kernel nondeterminism on {device}")
    return {
        "repeats": n_rep,
        "device": device,
        "do_sample": bool(do_sample),
        "sources": sources,
        "orders": [{"canonical": list(o) == sorted(o), "order": [int(x) for x in o]} for o in orders],
        "sampling_seeds": list(seeds),
        "metrics": per_metric,
        "flips": {"count": len(flipped), "ids": [f["id"] for f in flipped], "examples": flipped},
    }


def noise_summary(noise: dict[str, Any]) -> dict[str, Any]:
    """What a run's summary and a comparison carry of ``noise.json``: ``{"repeats", "floors": {metric:
    spread}, "flips"}``."""
    return {
        "repeats": int(noise.get("repeats") or 1),
        "floors": {k: v.get("spread") for k, v in (noise.get("metrics") or {}).items()},
        "flips": int((noise.get("flips") or {}).get("count") or 0),
    }


def read_noise(run_dir: Path, rec) -> dict[str, Any] | None:
    """``noise.json`` of the run ``rec`` in ``run_dir``, None for a run evaluated without repeats.

    Raises:
        TuneproofError: the run's summary records repeats but the file is gone, or its sha256 differs from the
            ``noise_sha256`` recorded when the run wrote it (names the file and both hashes).
    """
    summary = getattr(rec, "summary", None) or {}
    path = Path(run_dir) / NOISE_JSON
    want = summary.get("noise_sha256")
    if want is None:
        return None
    if not path.is_file():
        raise TuneproofError(
            f"{path}: missing; run {rec.id} recorded {summary.get('eval_repeats')} evaluation repeats in it",
            hint=f"restore runs/{rec.id}/{NOISE_JSON} from a copy, or mark the run invalid "
            f"(`tuneproof invalidate {rec.id} --why ...`) and evaluate again",
        )
    found = sha256_file(path)
    if found != want:
        raise TuneproofError(
            f"{path}: sha256 {found} differs from {want} recorded when run {rec.id} wrote it",
            hint="the noise record was edited after the run; restore it, or mark the run invalid and evaluate again",
        )
    return read_json(path)


def comparison_floor(base: dict[str, Any] | None, cand: dict[str, Any] | None, base_id: str, cand_id: str) -> dict:
    """The noise of a comparison as ``compare.json`` records it: ``{"baseline": {"run", "repeats", "floors",
    "flips"} or None, "candidate": ... or None}`` from both runs' :func:`noise_summary` (None: evaluated once).
    The floor on a given metric is read by :func:`success_threshold`."""
    return {
        "baseline": None if base is None else {"run": base_id, **noise_summary(base)},
        "candidate": None if cand is None else {"run": cand_id, **noise_summary(cand)},
    }


def floor_on(noise: dict[str, Any] | None, metric: str) -> dict[str, Any]:
    """The comparison's noise floor on ``metric``: ``{"floor": float or None, "repeats": {"baseline": N,
    "candidate": N}, "from": "baseline" | "candidate" | None, "flips": {"baseline": k, "candidate": k}}``.
    The floor is the larger of the two sides' spreads on ``metric`` (one side only when the other was evaluated
    once); None when neither side measured it."""
    sides = {s: (noise or {}).get(s) for s in ("baseline", "candidate")}
    floors = {s: v["floors"].get(metric) for s, v in sides.items() if v and isinstance(v.get("floors"), dict)}
    floors = {s: float(f) for s, f in floors.items() if isinstance(f, (int, float))}
    repeats = {s: (v or {}).get("repeats", 1) for s, v in sides.items()}
    flips = {s: (v or {}).get("flips") for s, v in sides.items() if v}
    if not floors:
        return {"floor": None, "repeats": repeats, "from": None, "flips": flips}
    side = max(floors, key=lambda s: (floors[s], s == "baseline"))
    return {"floor": floors[side], "repeats": repeats, "from": side, "flips": flips}


def success_threshold(min_gain: float, noise: dict[str, Any] | None, metric: str) -> dict[str, Any]:
    """The gain the success criterion must show: ``max(min_gain, noise floor)``.

    Returns ``{"threshold", "applied": "noise floor" | "min_gain", "noise_floor": float or None, "min_gain",
    "repeats", "floor_from", "flips", "why"}``; ``why`` says which threshold applied and why, e.g.
    ``noise floor 0.012 (3 repeats, from the baseline) > min_gain 0`` or ``noise floor not measured (no run was
    evaluated with eval.repeat > 1): min_gain 0 applies``."""
    got = floor_on(noise, metric)
    floor = got["floor"]
    reps = got["repeats"]
    out = {
        "min_gain": min_gain,
        "noise_floor": floor,
        "repeats": reps,
        "floor_from": got["from"],
        "flips": got["flips"],
    }
    if floor is None:
        return out | {
            "threshold": min_gain,
            "applied": "min_gain",
            "why": f"noise floor not measured (neither run was evaluated with eval.repeat > 1): min_gain "
            f"{min_gain:g} applies",
        }
    where = f"{reps.get(got['from'])} repeats of the {got['from']}"
    if floor > min_gain + _EPS:
        return out | {
            "threshold": floor,
            "applied": "noise floor",
            "why": f"noise floor {floor:.4g} ({where}) > min_gain {min_gain:g}",
        }
    return out | {
        "threshold": min_gain,
        "applied": "min_gain",
        "why": f"min_gain {min_gain:g} >= noise floor {floor:.4g} ({where})",
    }


def flips_text(noise: dict[str, Any] | None) -> str | None:
    """``per-example flips between repeats: baseline r0002 3 of its examples, candidate r0005 0`` (None when
    neither run was repeated)."""
    parts = [
        f"{side} {v['run']} {v.get('flips', 0)} ({v.get('repeats')} repeats)"
        for side, v in ((s, (noise or {}).get(s)) for s in ("baseline", "candidate"))
        if v
    ]
    return "per-example flips between repeats: " + ", ".join(parts) if parts else None


def noise_decided_text(success: dict[str, Any]) -> str | None:
    """The line saying that the noise floor decided a success verdict (``decided_by_noise_floor``), e.g. ``the noise
    floor decided the verdict: fail against the noise floor 0.05 (3 repeats of the baseline), pass against min_gain
    0 alone (delta +0.0310)``; None when it did not."""
    if not success.get("decided_by_noise_floor") or not success.get("noise"):
        return None
    th = success["noise"]
    where = f"{th['repeats'].get(th['floor_from'])} repeats of the {th['floor_from']}"
    delta = success.get("delta")
    said = f"delta {delta:+.4f}" if isinstance(delta, (int, float)) else "delta n/a"
    return (
        f"the noise floor decided the verdict: {success['verdict']} against the noise floor {th['noise_floor']:.4g} "
        f"({where}), {success.get('verdict_min_gain')} against min_gain {th['min_gain']:g} alone ({said})"
    )
