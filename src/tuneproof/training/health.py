"""Training health: a diverged or stalled run is invalid, not completed (docs/CASES.md C19).

:class:`HealthMonitor` is called on every optimizer step by :func:`tuneproof.training.loop.train`:
:meth:`HealthMonitor.before_update` after the backward pass of the window (before the optimizer
touches the weights), :meth:`HealthMonitor.after_update` after ``optimizer.step()``. The first rule
that fires raises :class:`HealthFault` (a :class:`~tuneproof.errors.CheckFailed`) naming the rule,
the 1-based optimizer step and the numbers; the train recipe marks the run ``invalid`` with that
reason and records ``summary["health"] = {"rule", "step", "detail", "thresholds"}``.

Rules, in the order they are checked (ids as recorded):

``nonfinite_loss``
    the window's loss (nats per supervised token or per example) is NaN or +-inf.
``nonfinite_grad_norm``
    the total L2 norm of the gradients of every trainable tensor (before clipping) is NaN or inf.
``uniform_loss``
    the loss is within :data:`UNIFORM_TOL` nats of ``ln(V)``, the loss of a uniform prediction over
    the ``V`` outputs of the model (``logits.shape[-1]``: the vocabulary rows of a causal LM, the
    class count of a classifier), *and* the gradient norm is at most :data:`NO_GRADIENT`: the model
    predicts nothing and can no longer learn. A freshly initialised head also starts near ``ln(V)``
    but with a real gradient, which is why both conditions are needed.
``zero_grad``
    the gradient norm is exactly 0.0 on :data:`ZERO_GRAD_STEPS` consecutive optimizer steps (the
    update cannot change anything; e.g. saturated or dead activations after a divergence).
``nonfinite_tensor``
    after the update a trainable tensor holds a NaN or inf.
``exploded_tensor``
    after the update a trainable tensor's largest ``|value|`` exceeds
    ``max(EXPLODE_MAX_ABS, EXPLODE_GROWTH * its largest |value| before the first step)``: with
    the defaults 1e4, or 100 times the tensor's initial scale if that is larger (LoRA B matrices
    start at 0, so 1e4 applies to them). Weights of trained transformers and LoRA adapters stay
    orders of magnitude below 1e4; AdamW moves each element by about the learning rate per step,
    so ``learning_rate: 1e6`` crosses the limit on its first real step and ``1e30`` reaches ~1e30
    (docs/CASES.md C19) without ever producing a NaN loss.

Cost per step: one total gradient norm (computed anyway for clipping) and one max-``|value|``
reduction per trainable tensor, read back as one small tensor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from tuneproof.errors import CheckFailed

UNIFORM_TOL = 1e-3  # nats: |loss - ln V| at or below this is "sits at the uniform-prediction value"
NO_GRADIENT = 1e-6  # total gradient L2 norm at or below this is "no gradient" for the uniform_loss rule
ZERO_GRAD_STEPS = 3  # consecutive optimizer steps with a gradient norm of exactly 0.0
EXPLODE_MAX_ABS = 1e4  # largest |value| of a trainable tensor (absolute part of the limit)
EXPLODE_GROWTH = 100.0  # ... or this many times the tensor's largest |value| before training, if larger

RULES = ("nonfinite_loss", "nonfinite_grad_norm", "uniform_loss", "zero_grad", "nonfinite_tensor", "exploded_tensor")
THRESHOLDS = {
    "uniform_tol_nats": UNIFORM_TOL,
    "no_gradient": NO_GRADIENT,
    "zero_grad_steps": ZERO_GRAD_STEPS,
    "explode_max_abs": EXPLODE_MAX_ABS,
    "explode_growth": EXPLODE_GROWTH,
}
HINT = "the run is invalid; lower training.learning_rate (or check the data and the model), then train again"


class HealthFault(CheckFailed):
    """A health rule fired at an optimizer step: the run is invalid.

    Attributes:
        rule: one of :data:`RULES`; step: the 1-based optimizer step; detail: the numbers, in words;
        numbers: the same as values (``max_abs`` and ``tensor`` for the tensor rules), for metrics.jsonl.
    """

    def __init__(self, rule: str, step: int, detail: str, **numbers: Any):
        self.rule, self.step, self.detail, self.numbers = rule, step, detail, numbers
        where = f" in trainable tensor {numbers['tensor']}" if "tensor" in numbers else ""
        super().__init__(f"step {step}: {rule}: {detail}{where}", hint=HINT)

    @property
    def reason(self) -> str:
        """The one-line reason recorded in the registry."""
        return f"step {self.step}: {self.rule}: {self.detail}"

    def record(self) -> dict[str, Any]:
        """What the run summary stores under ``health``."""
        return {
            "rule": self.rule,
            "step": self.step,
            "detail": self.detail,
            **self.numbers,
            "thresholds": dict(THRESHOLDS),
        }


def grad_norm(params: list[torch.Tensor], max_norm: float | None) -> float:
    """Total L2 norm of the gradients of ``params`` before clipping (0.0 when no tensor has a gradient).

    With ``max_norm`` the gradients are clipped in place to that norm
    (``torch.nn.utils.clip_grad_norm_``); without it the norm is only measured
    (``torch.nn.utils.get_total_norm``). A non-finite norm leaves the gradients as they are.
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    total = torch.nn.utils.get_total_norm(grads, 2.0)
    if hasattr(
        total, "full_tensor"
    ):  # FSDP2: sharded (DTensor) gradients give a partial norm; reduce it over the ranks
        total = total.full_tensor()
    if max_norm and torch.isfinite(total):
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return float(total)


def max_abs(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Largest ``|value|`` of each tensor, shape ``[len(tensors)]``, fp32 on the tensors' device
    (NaN where a tensor holds a NaN)."""
    with torch.no_grad():
        return torch.stack(
            [t.detach().abs().amax().float() if t.numel() else t.new_zeros((), dtype=torch.float32) for t in tensors]
        )


@dataclass
class HealthMonitor:
    """The rules of the module docstring over one run.

    Args:
        named_params: ``(name, tensor)`` of every trainable tensor, in a fixed order; their scale
            is taken now (call before the first optimizer step of the run, or of a resume: the
            limit then uses the scale at the resume, which a divergence already recorded never reaches).
    """

    named_params: list[tuple[str, torch.Tensor]]
    zero_streak: int = 0
    limits: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        start = max_abs([p for _, p in self.named_params]).cpu().tolist() if self.named_params else []
        self.limits = [max(EXPLODE_MAX_ABS, EXPLODE_GROWTH * s) if math.isfinite(s) else EXPLODE_MAX_ABS for s in start]

    def before_update(self, step: int, loss: float, norm: float, outputs: int) -> None:
        """Rules on the window's loss (nats), gradient norm (before clipping) and output size ``V``.

        Raises:
            HealthFault: ``nonfinite_loss``, ``nonfinite_grad_norm``, ``uniform_loss`` or ``zero_grad``.
        """
        if not math.isfinite(loss):
            raise HealthFault("nonfinite_loss", step, f"loss is {loss}")
        if not math.isfinite(norm):
            raise HealthFault("nonfinite_grad_norm", step, f"gradient norm is {norm} (loss {loss:.6g})")
        uniform = math.log(outputs) if outputs > 1 else 0.0
        if outputs > 1 and abs(loss - uniform) <= UNIFORM_TOL and norm <= NO_GRADIENT:
            raise HealthFault(
                "uniform_loss",
                step,
                f"loss {loss:.6f} = ln({outputs}) {uniform:.6f} (uniform prediction) with gradient norm {norm:.3g}",
            )
        self.zero_streak = self.zero_streak + 1 if norm == 0.0 else 0
        if self.zero_streak >= ZERO_GRAD_STEPS:
            raise HealthFault(
                "zero_grad",
                step,
                f"gradient norm 0.0 on {self.zero_streak} consecutive steps ({step - self.zero_streak + 1}-{step})",
            )

    def after_update(self, step: int) -> float:
        """Rules on the trainable tensors after the update; returns the largest ``|value|`` of all of them.

        Raises:
            HealthFault: ``nonfinite_tensor`` or ``exploded_tensor`` (naming the first such tensor).
        """
        if not self.named_params:
            return 0.0
        values = max_abs([p for _, p in self.named_params]).cpu().tolist()
        for (name, _), v in zip(self.named_params, values):
            if not math.isfinite(v):
                raise HealthFault("nonfinite_tensor", step, f"{v} after the update", max_abs=v, tensor=name)
        for (name, _), v, limit in zip(self.named_params, values, self.limits):
            if v > limit:
                raise HealthFault(
                    "exploded_tensor",
                    step,
                    f"max |value| {v:.3g} > limit {limit:.3g} after the update",
                    max_abs=v,
                    tensor=name,
                )
        return max(values)
