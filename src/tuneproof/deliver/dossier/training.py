"""The train runs (loss curves, steps, speed-ups used)."""

from __future__ import annotations

from tuneproof.deliver.dossier.blocks import NOT_RUN, _fig, _paragraph, _table, seconds_text
from tuneproof.deliver.dossier.evidence import _Evidence
from tuneproof.deliver.dossier.preflight import _auto_blocks
from tuneproof.deliver.dossier.runs import resumed_line
from tuneproof.deliver.plots import loss_curves
from tuneproof.modalities.modality import (
    LOSS_NORMALISATION,
    Modality,
)


def _speedups_cell(summary: dict) -> str:
    """The speed-ups a train run used (``training.chunked_loss``, ``length_grouping``, ``packing``,
    ``bf16_base_weights``: each recorded in the summary's ``speedups`` after its check passed) and the
    padding share of epoch 0 before and after the layout; ``none`` for a run that trained without
    them, ``-`` for one that recorded no steps (e.g. interrupted before its summary)."""
    used = list(summary.get("speedups") or {})
    pad = summary.get("padding") or {}
    cell = ", ".join(used) if used else "none"
    if used and isinstance(pad.get("before"), (int, float)) and isinstance(pad.get("after"), (int, float)):
        cell += f" (padding {pad['before']:.1%} -> {pad['after']:.1%})"
    return cell if summary.get("steps") is not None or used else "-"


def _training(ev: _Evidence, plots: bool, modality: Modality) -> list[dict]:
    """Every train run (steps, losses, seconds, the rate in the modality's unit, speed-ups, the steps it was
    resumed from, with a line per resumed run: :func:`~tuneproof.deliver.dossier.runs.resumed_line`) and, where the
    modality declares it, the loop's loss normalisation; the loss curves."""
    trains = [r for r in ev.runs if r.kind == "train"]
    if not trains:
        return [_paragraph(f"{NOT_RUN} (`tuneproof train`)")]
    rows = []
    series = {}
    for r in trains:
        s = r.summary
        rows.append(
            [
                r.id,
                r.status,
                ", ".join(str(x.get("from_step", "?")) for x in s.get("resumes") or [] if isinstance(x, dict)) or "-",
                s.get("steps", s.get("last_step")),
                s.get("first_loss"),
                s.get("final_loss"),
                seconds_text(s.get("train_seconds")) if s.get("train_seconds") is not None else None,
                s.get("tokens_per_s"),
                s.get("trainable"),
                s.get("dtype"),
                _speedups_cell(s),
            ]
        )
        pts = [
            (int(m["step"]), float(m["loss"]))
            for m in ev.rows(r.id, "metrics.jsonl")
            if "step" in m and isinstance(m.get("loss"), (int, float))
        ]
        if pts:
            series[r.id] = list(dict(pts).items())  # a resumed step logged twice: the last row wins
    blocks = [
        _table(
            [
                "run",
                "status",
                "resumed from step",
                "steps",
                "first loss",
                "final loss",
                "train time",
                f"{modality.unit}/s",
                "trainable params",
                "dtype",
                "speed-ups",
            ],
            rows,
        )
    ]
    resumed = [line for line in (resumed_line(ev, r.id) for r in trains) if line]
    if resumed:  # the status is that of the last process: each interruption and the checkpoint it resumed from
        blocks.append({"type": "list", "items": resumed})
    for r in trains:  # what auto resolved to in the loop, which is what the run trained with
        blocks += _auto_blocks(r.id, r.summary.get("speedups_auto"))
    norm = next((r.summary.get("loss_normalisation") for r in trains if r.summary.get("loss_normalisation")), None)
    if norm and LOSS_NORMALISATION in modality.dossier_sections:
        blocks.append(_paragraph(f"loss normalisation: {norm}"))
    if plots:
        blocks += _fig(loss_curves(series), "training loss curves (runs/<id>/metrics.jsonl)")
    return blocks
