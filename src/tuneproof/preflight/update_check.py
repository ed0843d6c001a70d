"""Does one optimizer step change exactly what it should? (docs/PROTOCOL.md step 4, docs/CASES.md C7.)

"Check from the start that an update really changes the expected parameters (and nothing
else)." :func:`check_update` takes real optimizer steps on one batch and then restores the model,
so later checks see it unchanged.

The LoRA zero-initialisation subtlety: PEFT initialises ``lora_B`` to zero
(``init_lora_weights=True``, following Hu et al. 2021, "LoRA", section 4.1) so the adapter starts
as the identity. The gradient of ``lora_A`` is ``B^T @ (...)`` and is therefore exactly zero on
the first step: present (the tensor is wired into the graph) but zero. A gradient that is
``None`` means the tensor is not reached at all (the docs/CASES.md C7 fault). So the check keeps stepping, up to
``max_extra_steps`` more steps, while some trainable tensor has only received all-zero gradients;
after step 1 ``B != 0`` and ``lora_A`` gets its gradient on step 2. The default optimizer is AdamW
with ``weight_decay=0``, so a tensor changes only through its gradient (decoupled weight decay
would move a tensor whose gradient is zero and hide the fault); the preflight
(:func:`check_update_step`) passes the run's own optimizer
(:func:`tuneproof.training.loop.build_optimizer`, with the study's learning rate and weight decay),
and a tensor whose gradient is zero is named whatever moved it.

Frozen tensors are compared bitwise *after the real optimizer step*, taken as a training loop
takes it: the first step starts from whatever ``.grad`` each tensor held (no ``zero_grad`` before
it), so a frozen tensor that the optimizer holds with a ``.grad`` left from before it was frozen is
moved by AdamW (its moments and weight decay: about ``lr`` per element) and named, with that cause.
A trainable tensor's own gradient on that first step is ``.grad`` after the backward minus what it
held before.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from tuneproof.data.preprocess import IGNORE_INDEX
from tuneproof.errors import TuneproofError
from tuneproof.preflight.report import check_result
from tuneproof.training.loop import build_optimizer
from tuneproof.training.loss import supervised_token_count, token_loss_sum

LossFn = Callable[[nn.Module, dict], torch.Tensor]
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]

DEFAULT_LR = 1e-3
REMEDY_REENTRANT = (
    "call model.enable_input_require_grads() after enabling activation checkpointing, or enable it with "
    "gradient_checkpointing_kwargs={'use_reentrant': False}"
)


# --------------------------------------------------------------------------- batches and loss
def model_device(model: nn.Module) -> torch.device:
    """Device of the model's first parameter (CPU for a model without parameters)."""
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def to_device(batch: dict, device: torch.device) -> dict:
    """Copy of ``batch`` with every tensor on ``device``."""
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}


def is_token_batch(batch: dict) -> bool:
    """Causal-LM batch: ``labels`` ``[B, T]`` with the shape of ``input_ids`` (docs/CONTRACTS.md)."""
    labels, ids = batch.get("labels"), batch.get("input_ids")
    return (
        isinstance(labels, torch.Tensor)
        and isinstance(ids, torch.Tensor)
        and labels.dim() == 2
        and labels.shape == ids.shape
    )


def loss_sum_and_count(model: nn.Module, batch: dict) -> tuple[torch.Tensor, int]:
    """Summed loss and its count for one micro-batch.

    Causal LM (``labels [B, T]``, -100 where not supervised): ``token_loss_sum(logits, labels)``
    (nats) and the supervised tokens (after the causal shift). The model gets the batch without
    ``labels`` and must return ``.logits [B, T, V]``.
    Otherwise (sequence classification, ``labels [B]``): the model's own mean loss
    (``outputs.loss``) times ``B``, and ``B``.
    """
    batch = to_device(batch, model_device(model))
    if is_token_batch(batch):
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        logits = model(**inputs).logits
        return token_loss_sum(logits, batch["labels"]), supervised_token_count(batch["labels"])
    out = model(**batch)
    loss = getattr(out, "loss", None)
    if loss is None:
        raise TuneproofError(
            f"{type(model).__name__} returned no loss for a batch with keys {sorted(batch)}",
            hint="pass labels in the batch, or pass loss_fn(model, batch) -> scalar tensor",
        )
    n = int(batch["labels"].shape[0]) if isinstance(batch.get("labels"), torch.Tensor) else 1
    return loss * n, n


def batch_loss(model: nn.Module, batch: dict) -> torch.Tensor:
    """Mean loss of one batch: per supervised token (causal LM) or the model's ``outputs.loss``.

    Raises:
        TuneproofError: a causal-LM batch with no supervised token (``labels`` all -100 after the shift).
    """
    total, count = loss_sum_and_count(model, batch)
    if count == 0:
        raise TuneproofError(
            "the preflight batch has no supervised tokens (labels are all -100 after the causal shift)",
            hint="use examples whose answer survives truncation (raise training.max_length)",
        )
    return total / count


# --------------------------------------------------------------------------- diagnosis
def _checkpoint_settings(model: nn.Module) -> tuple[bool, bool | None]:
    """(activation checkpointing on, use_reentrant) as set by transformers on the model's modules."""
    enabled = False
    reentrant: bool | None = None
    for module in model.modules():
        if getattr(module, "gradient_checkpointing", False) is True:
            enabled = True
            func = getattr(module, "_gradient_checkpointing_func", None)
            if isinstance(func, functools.partial):
                # torch.utils.checkpoint's default when use_reentrant is not passed is True (with a warning)
                reentrant = bool(func.keywords.get("use_reentrant", True))
            elif func is not None and reentrant is None:
                reentrant = True
    return enabled, reentrant


def diagnose_gradient_flow(model: nn.Module) -> dict[str, Any]:
    """Why trainable tensors may get no gradient: activation-checkpointing settings and input grads.

    Returns:
        ``{"activation_checkpointing": bool, "use_reentrant": bool|None, "input_require_grads_hook": bool,
        "input_embedding_trainable": bool, "cause": str|None, "remedy": str|None}``. ``cause`` is set
        for the known fault (docs/CASES.md C7): reentrant checkpointing whose block inputs do not require grad
        (frozen embedding, no ``enable_input_require_grads`` hook). Source: torch.utils.checkpoint docs
        ("use_reentrant=True ... at least one input needs requires_grad=True for gradients to flow"),
        transformers ``PreTrainedModel.enable_input_require_grads``.
    """
    enabled, reentrant = _checkpoint_settings(model)
    hook = any(
        bool(getattr(m, "_require_grads_hooks", None)) or getattr(m, "_require_grads_hook", None) is not None
        for m in model.modules()
    )
    try:
        emb = model.get_input_embeddings()  # type: ignore[operator]
        emb_trainable = emb is not None and any(p.requires_grad for p in emb.parameters())
    except (AttributeError, NotImplementedError, TypeError):
        emb_trainable = False
    cause = remedy = None
    if enabled and reentrant is not False and not hook and not emb_trainable:
        cause = (
            "reentrant activation checkpointing (use_reentrant=True) with a frozen input embedding and no "
            "enable_input_require_grads hook: no input of a checkpointed block requires grad, so the block's output "
            "has no graph and the trainable tensors inside it get no gradient"
        )
        remedy = REMEDY_REENTRANT
    return {
        "activation_checkpointing": enabled,
        "use_reentrant": reentrant,
        "input_require_grads_hook": hook,
        "input_embedding_trainable": emb_trainable,
        "cause": cause,
        "remedy": remedy,
    }


# --------------------------------------------------------------------------- the check
def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when ``a`` and ``b`` have the same shape, dtype and bytes (NaNs and signed zeros included)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8))


def forked_rng(device: torch.device):
    """Context manager: torch RNG state (CPU and ``device``) saved on entry and restored on exit."""
    if device.type == "cuda":
        return torch.random.fork_rng(devices=[device.index or 0])
    return torch.random.fork_rng(devices=[])


def _names(names: list[str], limit: int = 5) -> str:
    return ", ".join(names[:limit]) + (f" (+{len(names) - limit} more)" if len(names) > limit else "")


def check_update(
    model: nn.Module,
    batch: dict,
    optimizer_factory: OptimizerFactory | None = None,
    loss_fn: LossFn | None = None,
    steps: int = 1,
    *,
    max_extra_steps: int = 2,
    seed: int = 0,
) -> dict[str, Any]:
    """Take ``steps`` full optimizer steps on ``batch`` and check what changed; then restore the model.

    Each step: forward, loss, backward, ``optimizer.step()``, then ``zero_grad`` (model in train
    mode, torch RNG seeded with ``seed + step`` inside a forked RNG so dropout is reproducible and
    the caller's RNG is untouched). The first step keeps every ``.grad`` the tensors held, as a
    training loop's first step does; the gradients and ``.grad`` values are restored afterwards.

    Args:
        model: the model as it will train (PEFT-wrapped or not, checkpointing as configured).
        batch: ``input_ids [B, T]``, ``attention_mask [B, T]``, ``labels [B, T]`` (-100 = not
            supervised) for causal LM, or ``labels [B]`` for sequence classification.
        optimizer_factory: ``params -> optimizer``, given the trainable parameters (it may hold
            others: every tensor it holds is stepped, and every frozen one is checked); default
            ``torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0)``.
        loss_fn: ``(model, batch) -> scalar loss``; default :func:`batch_loss` (per-token mean via
            ``token_loss_sum`` for causal LM, ``outputs.loss`` otherwise).
        steps: optimizer steps to take (>= 1).
        max_extra_steps: extra steps allowed while a trainable tensor has had only all-zero gradients
            (LoRA ``lora_A`` on step 1, see the module doc).
        seed: RNG seed of the steps.

    Passes when every trainable tensor had a non-zero finite gradient in some step and changed,
    and every frozen tensor (``requires_grad=False``) is bitwise unchanged.

    Returns:
        ``{"passed", "message", "steps", "extra_steps", "losses": [float per step], "loss_kind",
        "supervised_tokens", "optimizer", "trainable_tensors": N, "trainable_changed": int,
        "trainable_nonzero_grad": int, "no_grad": [names, grad None in every step], "zero_grad":
        [names, only all-zero grads], "nonfinite_grad": [names], "not_changed": [names],
        "frozen_tensors": M, "frozen_unchanged": int, "frozen_changed": [names],
        "frozen_held_by_optimizer": [names of frozen tensors in the optimizer's param groups],
        "frozen_with_grad": [names of frozen tensors whose .grad held a value before the check],
        "grad_norms": {trainable name: L2 norm of the step-1 gradient or None},
        "update_norms": {trainable name: L2 norm of (after - before), all steps}, "diagnosis": {...}
        from :func:`diagnose_gradient_flow`, "restored": True}``.
        Memory: one extra copy of every parameter on the CPU for the snapshot, plus optimizer state.

    Raises:
        TuneproofError: ``steps < 1``; a batch without supervised tokens; a model without loss.
    """
    if steps < 1:
        raise TuneproofError(f"check_update: steps must be >= 1, got {steps}")
    device = model_device(model)
    named = list(model.named_parameters())
    trainable = [(n, p) for n, p in named if p.requires_grad]
    frozen = [(n, p) for n, p in named if not p.requires_grad]
    snapshot = {n: p.detach().to("cpu", copy=True) for n, p in named}
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    # copies: a backward adds to .grad in place, so a reference would come back changed
    prior_grads = {n: (p.grad.detach().clone() if p.grad is not None else None) for n, p in named}
    was_training = model.training
    loss_fn = loss_fn or batch_loss
    token_batch = is_token_batch(batch)
    supervised = supervised_token_count(batch["labels"]) if token_batch else None

    if not trainable:
        return {
            "passed": False,
            "message": f"no trainable parameters in {type(model).__name__}: nothing would be updated",
            "steps": 0,
            "extra_steps": 0,
            "losses": [],
            "loss_kind": "causal-lm per token" if token_batch else "model loss",
            "supervised_tokens": supervised,
            "optimizer": None,
            "trainable_tensors": 0,
            "trainable_changed": 0,
            "trainable_nonzero_grad": 0,
            "no_grad": [],
            "zero_grad": [],
            "nonfinite_grad": [],
            "not_changed": [],
            "frozen_tensors": len(frozen),
            "frozen_unchanged": len(frozen),
            "frozen_changed": [],
            "frozen_held_by_optimizer": [],
            "frozen_with_grad": [n for n, _ in frozen if prior_grads[n] is not None],
            "grad_norms": {},
            "update_norms": {},
            "diagnosis": diagnose_gradient_flow(model),
            "restored": True,
        }

    params = [p for _, p in trainable]
    optimizer = (
        optimizer_factory(params) if optimizer_factory else torch.optim.AdamW(params, lr=DEFAULT_LR, weight_decay=0.0)
    )
    opt_name = type(optimizer).__name__ if optimizer_factory else f"AdamW(lr={DEFAULT_LR:g}, weight_decay=0)"
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    frozen_held = [n for n, p in frozen if id(p) in held]
    frozen_with_grad = [n for n, _ in frozen if prior_grads[n] is not None]
    status = {n: "none" for n, _ in trainable}  # best seen: none < zero < nonzero
    nonfinite: set[str] = set()
    grad_norms: dict[str, float | None] = {}
    losses: list[float] = []
    no_graph = False
    taken = 0
    try:
        model.train()
        while True:
            if taken > 0:  # the first step starts from the .grad values held, as a loop's first step does
                optimizer.zero_grad(set_to_none=True)
                for _, p in trainable:
                    p.grad = None
            with forked_rng(device):
                torch.manual_seed(seed + taken)
                loss = loss_fn(model, batch)
                losses.append(float(loss.detach().float()))
                if loss.requires_grad:
                    loss.backward()
                else:
                    no_graph = True
            for n, p in trainable:
                g = p.grad
                if taken == 0 and g is not None and prior_grads[n] is not None:
                    g = g - prior_grads[n].to(g.device)  # this step's own gradient
                if taken == 0:
                    grad_norms[n] = None if g is None else float(g.detach().float().norm())
                if g is None:
                    continue
                if not bool(torch.isfinite(g).all()):
                    nonfinite.add(n)
                if bool((g != 0).any()):
                    status[n] = "nonzero"
                elif status[n] == "none":
                    status[n] = "zero"
            optimizer.step()
            taken += 1
            if taken >= steps:
                pending_zero = any(s == "zero" for s in status.values())
                if not pending_zero or taken >= steps + max_extra_steps:
                    break
        optimizer.zero_grad(set_to_none=True)
        after = {n: p.detach().to("cpu", copy=True) for n, p in named}
    finally:
        with torch.no_grad():
            for n, p in named:
                p.copy_(snapshot[n].to(p.device))
                g = prior_grads[n]
                p.grad = None if g is None else g.to(p.device)
            for n, b in model.named_buffers():
                if n in buffers:
                    b.copy_(buffers[n])
        model.train(was_training)
        del optimizer

    no_grad = [n for n, s in status.items() if s == "none"]
    zero_grad = [n for n, s in status.items() if s == "zero"]
    not_changed = [n for n, _ in trainable if same_bits(after[n], snapshot[n])]
    frozen_changed = [n for n, _ in frozen if not same_bits(after[n], snapshot[n])]
    update_norms = {n: float((after[n].float() - snapshot[n].float()).norm()) for n, _ in trainable}
    n_nonzero = sum(1 for s in status.values() if s == "nonzero")
    diagnosis = diagnose_gradient_flow(model)
    bad_loss = [x for x in losses if x != x or x in (float("inf"), float("-inf"))]

    problems = []
    if bad_loss:
        problems.append(f"non-finite loss {bad_loss[0]}")
    if no_graph:
        problems.append("the loss has no graph: no trainable tensor is reached by the forward pass")
    if no_grad:
        problems.append(f"{len(no_grad)} of {len(trainable)} trainable tensors got no gradient: {_names(no_grad)}")
    if zero_grad:
        problems.append(
            f"{len(zero_grad)} of {len(trainable)} trainable tensors got only "
            f"all-zero gradients in {taken} steps: {_names(zero_grad)}"
        )
    if nonfinite:
        problems.append(f"non-finite gradients in {_names(sorted(nonfinite))}")
    unexplained = [n for n in not_changed if n not in set(no_grad) | set(zero_grad)]
    if not_changed:
        problems.append(
            f"{len(not_changed)} of {len(trainable)} trainable tensors did not change"
            + (f": {_names(unexplained)}" if unexplained else "")
        )
    if frozen_changed:
        problems.append(f"{len(frozen_changed)} of {len(frozen)} frozen tensors changed: {_names(frozen_changed)}")
        stepped = [n for n in frozen_changed if n in set(frozen_held)]
        if stepped:
            stale = [n for n in stepped if n in set(frozen_with_grad)]
            problems.append(
                f"cause: the optimizer ({opt_name}) holds frozen tensors {_names(stepped)}"
                + (f", whose .grad held a value set before they were frozen ({_names(stale)})" if stale else "")
                + "; remedy: clear .grad when freezing (model.zero_grad(set_to_none=True)) and build the "
                "optimizer over requires_grad tensors only"
            )
    if problems and (no_grad or no_graph) and diagnosis["cause"]:
        problems.append(f"cause: {diagnosis['cause']}; remedy: {diagnosis['remedy']}")
    changed = len(trainable) - len(not_changed)
    if problems:
        message = "update check failed: " + "; ".join(problems)
    else:
        message = (
            f"{changed} of {len(trainable)} trainable tensors got a non-zero gradient and changed in {taken} step(s); "
            f"{len(frozen)} of {len(frozen)} frozen tensors bitwise unchanged"
        )
    return {
        "passed": not problems,
        "message": message,
        "steps": taken,
        "extra_steps": taken - steps,
        "losses": losses,
        "loss_kind": "causal-lm per token" if token_batch else "model loss",
        "supervised_tokens": supervised,
        "optimizer": opt_name,
        "trainable_tensors": len(trainable),
        "trainable_changed": changed,
        "trainable_nonzero_grad": n_nonzero,
        "no_grad": no_grad,
        "zero_grad": zero_grad,
        "nonfinite_grad": sorted(nonfinite),
        "not_changed": not_changed,
        "frozen_tensors": len(frozen),
        "frozen_unchanged": len(frozen) - len(frozen_changed),
        "frozen_changed": frozen_changed,
        "frozen_held_by_optimizer": frozen_held,
        "frozen_with_grad": frozen_with_grad,
        "grad_norms": grad_norms,
        "update_norms": update_norms,
        "diagnosis": diagnosis,
        "restored": True,
    }


def check_update_step(model: nn.Module, batch: dict, autocast: Callable, cfg=None) -> dict[str, Any]:
    """The preflight's ``update check``: real optimizer steps (:func:`check_update`) on a real
    micro-batch under ``autocast`` change every trainable tensor and no frozen one (docs/CASES.md C7); the model is
    restored. With ``cfg`` (the study's ``training`` section) the steps are the run's own optimizer's
    (:func:`tuneproof.training.loop.build_optimizer`: its learning rate, its weight decay, the tensors it holds)."""

    def loss_fn(m, b):
        with autocast():
            return batch_loss(m, b)

    factory = None if cfg is None else (lambda _params: build_optimizer(model, cfg))
    r = check_update(model, batch, optimizer_factory=factory, loss_fn=loss_fn)
    numbers = {
        "trainable_changed": r["trainable_changed"],
        "trainable_tensors": r["trainable_tensors"],
        "frozen_unchanged": r["frozen_unchanged"],
        "frozen_tensors": r["frozen_tensors"],
        "steps": r["steps"],
        "first_loss": round(r["losses"][0], 6) if r["losses"] else None,
        "supervised_tokens": r["supervised_tokens"],
        "micro_batch": int(batch["labels"].shape[0]),
        "optimizer": r["optimizer"],
        "frozen_held_by_optimizer": len(r["frozen_held_by_optimizer"]),
    }
    return check_result("update check", bool(r["passed"]), r["message"], numbers, r)


__all__ = [
    "IGNORE_INDEX",
    "batch_loss",
    "check_update",
    "check_update_step",
    "diagnose_gradient_flow",
    "forked_rng",
    "is_token_batch",
    "loss_sum_and_count",
    "model_device",
    "same_bits",
    "to_device",
]
