"""FSDP wrap units that mix frozen and trainable parameters (docs/CASES.md C11).

FSDP (``torch.distributed.fsdp.FullyShardedDataParallel``) flattens the parameters of each wrap
unit into one ``FlatParameter``; with the default ``use_orig_params=False`` a unit whose
parameters do not share one ``requires_grad`` value is rejected or trains wrongly (PyTorch FSDP
docs, "use_orig_params"). Under LoRA every transformer block holds frozen base weights and
trainable adapters together, so each block is a mixed unit. Known remedies: FSDP1 with
``use_orig_params=True``, or FSDP2 (``torch.distributed.fsdp.fully_shard``), which shards each
parameter on its own. This check names every mixed unit before launch.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import nn

REMEDY = (
    "FSDP1: FullyShardedDataParallel(..., use_orig_params=True); or FSDP2: fully_shard(block) per block "
    "(per-parameter sharding); accelerate: fsdp_use_orig_params: true"
)


def wrap_units(model: nn.Module, layer_classes: Iterable[type | str]) -> list[str]:
    """Module names FSDP would wrap with a transformer auto-wrap policy over ``layer_classes``
    (classes or class names, e.g. ``"LlamaDecoderLayer"``); the root holds what is left."""
    names = {c if isinstance(c, str) else c.__name__ for c in layer_classes}
    return [n for n, m in model.named_modules() if type(m).__name__ in names]


def mixed_units(
    model: nn.Module, layer_classes: Iterable[type | str], *, use_orig_params: bool = False, fsdp_version: int = 1
) -> dict[str, Any]:
    """Name each wrap unit whose own parameters mix ``requires_grad`` True and False.

    Args:
        model: the model as it will train (e.g. PEFT-wrapped, base frozen).
        layer_classes: the auto-wrap policy's block classes.
        use_orig_params: FSDP1's flag as configured (True is the remedy).
        fsdp_version: 1 (FlatParameter per unit) or 2 (``fully_shard``: per-parameter, no conflict).

    Returns:
        ``{"passed", "message", "remedy", "units": n, "mixed": [{"unit", "trainable", "frozen"}]}``;
        passed is False when mixed units exist and the configuration does not apply the remedy.
    """
    units = wrap_units(model, layer_classes)
    owned: dict[str, list[nn.Parameter]] = {u: [] for u in units}
    root: list[nn.Parameter] = []
    for pname, p in model.named_parameters():
        owner = max((u for u in units if pname.startswith(u + ".")), key=len, default=None)
        (owned[owner] if owner is not None else root).append(p)
    owned["<root>"] = root
    mixed = []
    for unit, params in owned.items():
        t = sum(p.numel() for p in params if p.requires_grad)
        f = sum(p.numel() for p in params if not p.requires_grad)
        if t and f:
            mixed.append({"unit": unit, "trainable": t, "frozen": f})
    remedied = use_orig_params or fsdp_version == 2
    passed = not mixed or remedied
    if not mixed:
        message = f"{len(units)} wrap units, none mixes frozen and trainable parameters"
    else:
        names = ", ".join(m["unit"] for m in mixed[:4]) + (f" and {len(mixed) - 4} more" if len(mixed) > 4 else "")
        message = f"{len(mixed)} of {len(owned)} FSDP units mix frozen and trainable parameters ({names}); " + (
            "remedy applied" if remedied else f"required: {REMEDY}"
        )
    return {"passed": passed, "message": message, "remedy": REMEDY, "units": len(owned), "mixed": mixed}
