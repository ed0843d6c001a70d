"""Preflight checks of the memory of one training step: ``step memory`` (complete steps at the
configured micro-batch at the p95 train length and at ``training.max_length``: the itemised estimate
next to the measured peak, docs/CASES.md C8) and ``max micro-batch`` (``--find-max-micro-batch``: the largest
micro-batch whose measured peak fits the budget), with the breakdown table of the estimate.

The estimate itself is :func:`tuneproof.preflight.memory.estimate_step_memory`; a step is taken by
:class:`StepRunner` as the training loop takes it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from tuneproof.context import StudyContext
from tuneproof.data.preprocess import IGNORE_INDEX, collate
from tuneproof.preflight.memory import (
    estimate_step_memory,
    find_max_micro_batch,
    in_step_bytes,
    side_by_side,
)
from tuneproof.preflight.report import GIB, check_result, is_out_of_memory, to_gib
from tuneproof.preflight.update_check import loss_sum_and_count, model_device, to_device
from tuneproof.training.loop import build_optimizer
from tuneproof.training.loss import chunked_token_loss_sum, supervised_token_count
from tuneproof.training.memory import measure_step_peak
from tuneproof.ui import console, table

FIND_MAX_FACTOR = 4  # --find-max-micro-batch tries at most 4x the largest micro-batch whose estimate fits


def batch_at_length(encoded: list, micro_batch: int, length: int, pad_id: int) -> dict:
    """``micro_batch`` real examples padded/truncated to exactly ``length`` tokens (``[B, length]``).

    The examples whose length is closest to ``length`` from above come first (truncated to it),
    then the closest shorter ones (right-padded); the list is cycled when it is shorter than the
    micro-batch. Compute and memory of a step depend on the padded width, so this is the step of
    a micro-batch of that length.
    """
    ranked = sorted(encoded, key=lambda e: (len(e.input_ids) < length, abs(len(e.input_ids) - length), e.id))
    chosen = [ranked[i % len(ranked)] for i in range(micro_batch)]
    cut = [dataclasses.replace(e, input_ids=e.input_ids[:length], labels=e.labels[:length]) for e in chosen]
    batch = collate(cut, pad_id)
    width = batch["input_ids"].shape[1]
    if width < length:
        extra = length - width
        b = batch["input_ids"].shape[0]
        batch["input_ids"] = torch.cat([batch["input_ids"], torch.full((b, extra), pad_id, dtype=torch.long)], 1)
        batch["attention_mask"] = torch.cat([batch["attention_mask"], torch.zeros((b, extra), dtype=torch.long)], 1)
        if batch["labels"].dim() == 2:
            batch["labels"] = torch.cat([batch["labels"], torch.full((b, extra), IGNORE_INDEX, dtype=torch.long)], 1)
    return batch


def restore_parameters(model, snapshot: dict[str, Any]) -> None:
    """Copy the tensors of ``snapshot`` (name -> CPU tensor) back into ``model``'s parameters; every
    gradient is freed."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n in snapshot:
                p.copy_(snapshot[n].to(p.device))
            p.grad = None


class StepRunner:
    """Complete training steps as the loop takes them (forward, per-token loss, backward, clipping,
    AdamW step, grads freed), with the optimizer states created up front so every measured step
    holds them, as every step after the first of a run does. With ``training.chunked_loss`` the
    causal-LM loss is the chunked one, as ``training.loop`` computes it. ``restore()`` puts the
    trainable tensors back."""

    def __init__(self, model, cfg, autocast: Callable):
        self.model, self.cfg, self.autocast = model, cfg, autocast
        self.chunked = bool(getattr(cfg, "chunked_loss", False))
        self.snapshot = {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters() if p.requires_grad}
        self.optimizer = build_optimizer(model, cfg)
        self.params = [p for group in self.optimizer.param_groups for p in group["params"]]
        for p in self.params:  # create exp_avg / exp_avg_sq without a forward pass
            p.grad = torch.zeros_like(p)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def step(self, batch: dict) -> float:
        """One step on ``batch``; returns its per-token mean loss."""
        self.model.train()
        if self.chunked and batch["labels"].dim() == 2:
            batch = to_device(batch, model_device(self.model))
            with self.autocast():
                total = chunked_token_loss_sum(self.model, batch["input_ids"], batch["attention_mask"], batch["labels"])
            count = supervised_token_count(batch["labels"])
        else:
            with self.autocast():
                total, count = loss_sum_and_count(self.model, batch)
        (total / max(count, 1)).backward()
        if self.cfg.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(total.detach()) / max(count, 1)

    def restore(self) -> None:
        restore_parameters(self.model, self.snapshot)
        self.optimizer.state.clear()


def step_memory_estimate(
    model,
    micro_batch: int,
    length: int,
    dtype: str,
    checkpointing: bool,
    budget: int | None,
    *,
    bf16_base: bool = False,
    batch: dict | None = None,
    chunked_loss: bool = False,
    device: str = "cpu",
) -> dict[str, Any]:
    """``estimate_step_memory`` for this project's mixed precision: weights stay fp32 and bf16/fp16
    run under autocast (``StudyContext.torch_setup``), so frozen weights are counted at 4 bytes;
    with ``training.bf16_base_weights`` (``bf16_base``) they are held in bf16: 2 bytes per frozen
    element (trained tensors, their gradients and optimizer states stay fp32). ``batch``: the
    micro-batch the step will take (its padding and supervised tokens are counted); without it the
    batch is taken as padded, every position supervised. ``chunked_loss``: ``training.chunked_loss``."""
    padded, supervised = True, None
    if batch is not None and "attention_mask" in batch:
        padded = bool((batch["attention_mask"] == 0).any())
        labels = batch.get("labels")
        if labels is not None and labels.dim() == 2:
            supervised = supervised_token_count(labels)
    est = estimate_step_memory(
        model,
        micro_batch,
        length,
        dtype,
        "adamw",
        activation_checkpointing=checkpointing,
        trainable_dtype="fp32",
        weights_dtype="bf16" if bf16_base else None,
        budget_bytes=budget,
        padded=padded,
        chunked_loss=chunked_loss,
        supervised_tokens=supervised,
        device=device,
    )
    if bf16_base:
        est["weights_note"] = "frozen weights held in bf16 (training.bf16_base_weights): 2 bytes per frozen element"
    elif dtype != "fp32":  # the component counts frozen weights at the compute dtype; here they are stored in fp32
        # a 4-bit base stays packed
        frozen = est["parameters"] - est["trainable_parameters"] - est.get("packed_parameters", 0)
        add = frozen * (4 - est["bytes_per_weight"])
        est["weights_bytes"] += add
        est["total_bytes"] += add
        est["peak_bytes"] += add
        est["total_gib"] = est["total_bytes"] / GIB
        est["passed"] = budget is None or est["total_bytes"] <= budget
        for part in est.get("parts", []):
            if part["part"] == "weights":
                part["bytes"] = est["weights_bytes"]
                part["formula"] = part["formula"] + " (frozen stored in fp32: +2 bytes each)"
        est["weights_note"] = (
            "frozen weights stored in fp32 under autocast (+2 bytes per frozen element vs the compute dtype)"
        )
    return est


def format_bytes(n: int | float | None) -> str:
    """Bytes as GiB (>= 1 GiB) or MiB, for messages."""
    if n is None:
        return "?"
    return f"{n / GIB:.3f} GiB" if abs(n) >= GIB else f"{n / 2**20:.1f} MiB"


def estimate_parts(est: dict[str, Any]) -> str:
    """The estimate's breakdown, one line."""
    return (
        f"weights {format_bytes(est['weights_bytes'])} + gradients {format_bytes(est['gradients_bytes'])} + "
        f"{est['optimizer_states_count']} optimizer states {format_bytes(est['optimizer_states_bytes'])} + "
        f"step temporary {format_bytes(est['optimizer_step_temporary_bytes'])} + "
        f"activations {format_bytes(est['activations_bytes'])} + "
        f"logits {format_bytes(est['logits_bytes'])}"
    )


def check_step_memory(
    model,
    ctx: StudyContext,
    encoded: list,
    lengths: list[int],
    dtype: str,
    budget: int,
    budget_source: str,
    autocast: Callable,
) -> dict[str, Any]:
    """Complete steps at the configured micro-batch at each representative length (docs/CASES.md C8).

    Each length has its estimate (itemised, :func:`~tuneproof.preflight.memory.estimate_step_memory`)
    and its measured step (:func:`~tuneproof.training.memory.measure_step_peak`): the bytes the
    step's tensors hold at its peak (the CPU allocator's count, or CUDA's peak allocated) next to the
    in-step parts of the estimate, with their ratio, and the process peak (resident set on a CPU),
    which is what the budget (bytes) is judged on, with the estimate's total."""
    cfg = ctx.study.training
    device, _, _ = ctx.torch_setup()
    mb = cfg.micro_batch_size
    chunked = bool(getattr(cfg, "chunked_loss", False))
    stepper = StepRunner(model, cfg, autocast)
    rows, problems, numbers = [], [], {"micro_batch": mb, "budget_gib": to_gib(budget), "budget_source": budget_source}
    try:
        for length in lengths:
            batch = batch_at_length(encoded, mb, length, ctx.tokenizer.pad_token_id)
            est = step_memory_estimate(
                model,
                mb,
                length,
                dtype,
                cfg.activation_checkpointing,
                budget,
                bf16_base=cfg.bf16_base_weights,
                batch=batch,
                chunked_loss=chunked,
                device=device.type,
            )
            row: dict[str, Any] = {"length": length, "estimate": est}
            try:
                measured = measure_step_peak(lambda b=batch: stepper.step(b), device)
            except Exception as err:  # noqa: BLE001
                if not is_out_of_memory(err):
                    raise
                problems.append(
                    f"length {length}: out of memory at micro-batch {mb} ({type(err).__name__}); "
                    f"the estimate was {format_bytes(est['total_bytes'])}"
                )
                rows.append(row)
                continue
            row["measured"] = measured
            row["side_by_side"] = side_by_side(est, measured)
            in_step = in_step_bytes(est)
            row["estimate_in_step_bytes"] = in_step  # the parts a step allocates once the optimizer states exist
            tensors = measured.get("allocated_step_peak_bytes")
            row["measured_over_estimate"] = round(tensors / in_step, 4) if tensors and in_step else None
            rows.append(row)
            tag = f"L{length}"
            numbers[f"{tag}_estimate_gib"] = to_gib(est["total_bytes"])
            numbers[f"{tag}_peak_gib"] = to_gib(measured["peak_bytes"])
            numbers[f"{tag}_step_peak_gib"] = to_gib(measured["step_peak_bytes"])
            numbers[f"{tag}_estimate_in_step_gib"] = to_gib(in_step)
            numbers[f"{tag}_allocated_step_peak_gib"] = to_gib(tensors)
            numbers[f"{tag}_measured_over_estimate"] = row["measured_over_estimate"]
            numbers[f"{tag}_seconds"] = round(measured["seconds"], 3)
            over = []
            if est["total_bytes"] > budget:
                over.append(f"estimate {format_bytes(est['total_bytes'])} ({estimate_parts(est)})")
            if measured["peak_bytes"] is not None and measured["peak_bytes"] > budget:
                over.append(f"measured peak {format_bytes(measured['peak_bytes'])}")
            if over:
                problems.append(
                    f"length {length}: {' and '.join(over)} exceed{'s' if len(over) == 1 else ''} "
                    f"the budget {format_bytes(budget)}"
                )
    finally:
        stepper.restore()
    where = "process resident set (CPU)" if device.type == "cpu" else "peak allocated (CUDA)"

    def shown(r: dict[str, Any]) -> str:
        if "measured" not in r:
            return f"length {r['length']}: estimate {format_bytes(r['estimate']['total_bytes'])}, out of memory"
        m, ratio = r["measured"], r.get("measured_over_estimate")
        tensors = ""
        if m.get("allocated_step_peak_bytes") is not None:
            tensors = (
                f"the step's tensors {format_bytes(m.get('allocated_step_peak_bytes'))} vs "
                f"{format_bytes(r['estimate_in_step_bytes'])} estimated"
                + (f" (measured / estimated {ratio:.3f})" if ratio else "")
                + ", "
            )
        return (
            f"length {r['length']}: {tensors}whole step: estimate {format_bytes(r['estimate']['total_bytes'])}, "
            f"measured peak {format_bytes(m['peak_bytes'])} (the step adds {format_bytes(m['step_peak_bytes'])}), "
            f"{m['seconds']:.2f} s"
        )

    if problems:
        message = (
            "; ".join(problems) + f" (micro-batch {mb}, {where}); lower training.micro_batch_size, raise "
            "gradient_accumulation_steps or enable activation_checkpointing"
        )
    else:
        message = (
            f"micro-batch {mb}: {'; '.join(shown(r) for r in rows)} ({where}); "
            f"fits {format_bytes(budget)} ({budget_source})"
        )
    details = {
        "rows": rows,
        "budget_bytes": budget,
        "budget_source": budget_source,
        "breakdown": memory_breakdown(rows),
    }
    return check_result("step memory", not problems, message, numbers, details)


def _mib(n: int | float | None) -> float | None:
    return None if n is None else round(n / 2**20, 3)


def memory_breakdown(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The step-memory estimate itemised per length, next to the measured step, for the screen,
    ``preflight.json`` and the dossier.

    Returns ``{"lengths": [L...], "micro_batch", "rows": [[part, MiB at each length...]...]}``:
    the estimate's parts (weights, gradients, optimizer states and temporary, each activation part,
    the loss / logits part), its total, its peak and the step's part of it
    (:func:`~tuneproof.preflight.memory.in_step_bytes`), then the measured step's tensors (allocator
    or CUDA peak allocated), measured / estimate (the step's part), the process peak and what the step adds to it.
    MiB = 2**20 bytes.
    """
    if not rows:
        return {"lengths": [], "micro_batch": None, "rows": []}
    names: list[str] = []
    for r in rows:
        for part in r["estimate"].get("parts", []):
            if part["part"] not in names:
                names.append(part["part"])
    # the loss after every activation part
    names = sorted(names, key=lambda n, order=list(names): (n.startswith("loss:"), order.index(n)))
    table_rows = []
    for name in names:
        vals = [next((p["bytes"] for p in r["estimate"].get("parts", []) if p["part"] == name), 0) for r in rows]
        if any(vals):
            table_rows.append([name, *(_mib(v) for v in vals)])
    table_rows.append(
        [
            "forward end instead of the loss: KV cache k/v before repetition + last MLP product",
            *(_mib(r["estimate"].get("forward_end_extra_bytes")) for r in rows),
        ]
    )
    table_rows.append(["estimate, total (all parts at once)", *(_mib(r["estimate"]["total_bytes"]) for r in rows)])
    table_rows.append(
        [
            "estimate, the step's peak (weights + optimizer states + the step's part)",
            *(_mib(r["estimate"].get("peak_bytes")) for r in rows),
        ]
    )
    table_rows.append(
        [
            "estimate, the step's part: max(activations + max(loss, forward end), gradients + optimizer temporary)",
            *(_mib(in_step_bytes(r["estimate"])) for r in rows),
        ]
    )
    m = [r.get("measured") or {} for r in rows]
    table_rows.append(
        ["measured: the step's tensors at the peak", *(_mib(x.get("allocated_step_peak_bytes")) for x in m)]
    )
    table_rows.append(
        ["measured / estimate (the step's tensors / the step's part)", *(r.get("measured_over_estimate") for r in rows)]
    )
    table_rows.append(["measured: process peak", *(_mib(x.get("peak_bytes")) for x in m)])
    table_rows.append(["measured: the step adds to the process", *(_mib(x.get("step_peak_bytes")) for x in m)])
    return {
        "lengths": [r["length"] for r in rows],
        "micro_batch": rows[0]["estimate"].get("micro_batch"),
        "rows": table_rows,
    }


def memory_plain_rows(check: dict[str, Any] | None) -> tuple[list[str], list[list[str]]]:
    """The ``step memory`` check in plain words: ``(columns, rows)``, one column per length measured.

    Rows: the model's weights, the gradients, the optimizer's state, the activations kept for the
    backward pass, the logits of the loss (what the estimate adds up), the estimated and measured
    memory of the step's own tensors with their ratio (labelled), the whole process at its peak
    and the budget it is judged on. Sizes as :func:`format_bytes`; the itemised estimate is
    ``details.breakdown`` in ``preflight.json``. ``([], [])`` when the check has no such rows.
    """
    details = (check or {}).get("details")
    rows = details.get("rows") if isinstance(details, dict) else None
    if not rows or not all(isinstance(r, dict) and "estimate" in r for r in rows):
        return [], []
    est = [r["estimate"] for r in rows]
    meas = [r.get("measured") or {} for r in rows]
    states = est[0].get("optimizer_states_count")
    mb = est[0].get("micro_batch")

    def line(label: str, values: list[Any], fmt=format_bytes) -> list[str]:
        return [label, *("-" if v is None else fmt(v) for v in values)]

    out = [
        line("model weights", [e["weights_bytes"] + e.get("autocast_weight_copies_bytes", 0) for e in est]),
        line("gradients of the trained weights", [e["gradients_bytes"] for e in est]),
        line(
            f"optimizer state ({states} values per trained weight) and its step",
            [e["optimizer_states_bytes"] + e["optimizer_step_temporary_bytes"] for e in est],
        ),
        line("activations kept for the backward pass", [e["activations_bytes"] for e in est]),
        line("logits for the loss (tokens x vocabulary)", [e["logits_bytes"] for e in est]),
        line("estimated: the step's own tensors at their peak", [r.get("estimate_in_step_bytes") for r in rows]),
        line("measured: the step's own tensors at their peak", [m.get("allocated_step_peak_bytes") for m in meas]),
        line(
            "ratio measured / estimated (1.00 = exact)",
            [r.get("measured_over_estimate") for r in rows],
            "{:.2f}".format,
        ),
        line("measured: the whole process at its peak", [m.get("peak_bytes") for m in meas]),
    ]
    budget = details.get("budget_bytes")
    if budget:
        out.append([f"budget ({details.get('budget_source')})", *(format_bytes(budget) for _ in rows)])
    return [f"step memory, micro-batch {mb}", *(f"length {r['length']}" for r in rows)], out


def print_memory_plain(check: dict[str, Any] | None) -> None:
    """:func:`memory_plain_rows` as a table on the screen (nothing when the check has no rows)."""
    cols, rows = memory_plain_rows(check)
    if rows:
        console.print(table("step memory: what one training step holds", cols, rows))


def check_max_micro_batch(
    model, ctx: StudyContext, encoded: list, length: int, dtype: str, budget: int, autocast: Callable
) -> dict[str, Any]:
    """``--find-max-micro-batch``: the largest micro-batch whose measured step peak fits the budget
    (bytes) at ``length``.

    The search is bounded by the train split's size and by :data:`FIND_MAX_FACTOR` times the
    largest micro-batch whose estimate (a planning upper bound) fits, so a CPU run does not try
    hundreds of examples per step.
    """
    cfg = ctx.study.training
    device, _, _ = ctx.torch_setup()
    est_fit = 0
    mb = 1
    while (
        mb <= 1024
        and step_memory_estimate(
            model,
            mb,
            length,
            dtype,
            cfg.activation_checkpointing,
            budget,
            bf16_base=cfg.bf16_base_weights,
            chunked_loss=bool(getattr(cfg, "chunked_loss", False)),
            device=device.type,
        )["passed"]
    ):
        est_fit, mb = mb, mb * 2
    limit = max(1, min(1024, len(encoded), FIND_MAX_FACTOR * max(est_fit, 1)))
    stepper = StepRunner(model, cfg, autocast)
    try:

        def try_fn(n: int) -> dict[str, Any]:
            batch = batch_at_length(encoded, n, length, ctx.tokenizer.pad_token_id)
            return measure_step_peak(lambda: stepper.step(batch), device)

        r = find_max_micro_batch(try_fn, budget, start=1, limit=limit)
    finally:
        stepper.restore()
    numbers = {
        "max_micro_batch": r["max_micro_batch"],
        "length": length,
        "peak_gib": to_gib(r["peak_bytes"]),
        "budget_gib": to_gib(budget),
        "limit": limit,
        "tries": len(r["tries"]),
        "configured": cfg.micro_batch_size,
    }
    message = r["message"] + f" at length {length} (searched up to {limit})"
    passed = bool(r["passed"]) and r["max_micro_batch"] >= cfg.micro_batch_size
    if r["passed"] and not passed:
        message += f"; the configured micro-batch {cfg.micro_batch_size} does not fit"
    return check_result("max micro-batch", passed, message, numbers, r)
