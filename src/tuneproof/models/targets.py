"""What is trained (docs/PROTOCOL.md step 4): which modules the LoRA target patterns select, and the
trainable parameters.

Target-module matching follows PEFT's documented semantics (``LoraConfig.target_modules``;
``peft.tuners.tuners_utils.check_target_module_exists``), applied to the names of
``model.named_modules()``:

* a **list** of names: a module matches a pattern when its full name equals the pattern or ends
  with ``"." + pattern`` (so ``"q_proj"`` matches ``model.layers.0.self_attn.q_proj``, and
  ``"ff.0"`` would match ``...ff.0`` but never ``...ff.0.weight`` or ``...buff.0``);
* a single **string**: a regular expression that must match the full name (``re.fullmatch``);
* ``"all-linear"``: every ``nn.Linear``/``Conv1D`` except the output layer (PEFT's shorthand).

A pattern that matches nothing is a failed check (docs/CASES.md C5), and so is a match on a module type
LoRA cannot wrap (PEFT raises "Target module ... is not supported" for it at ``get_peft_model``).

Matches are also counted per tower (:func:`tower_of`: encoder, decoder, cross-attention, vision,
...), derived from the components of the module path. A pattern that matches in more than one
named tower (``"q"`` on T5 adapts the encoder's and the decoder's self-attention and the decoder's
cross-attention alike) is a warning, with the counts per tower, not a failure: it is often meant,
but it should be a decision. The terminal report shows the counts per tower whenever the model has
more than one named tower (top-level modules outside any tower, e.g. embeddings or a head, count
as ``model``).
"""

from __future__ import annotations

import difflib
import math
import re
from collections import Counter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

_SUPPORTED_NAMES = ("Conv1D", "Linear8bitLt", "Linear4bit")
SEMANTICS = (
    "PEFT target_modules: list -> full name equal to the pattern or ending with '.' + pattern; "
    "string -> re.fullmatch on the full name; 'all-linear' -> every Linear/Conv1D except the output layer"
)


def _supported_types() -> tuple[type, ...]:
    """Module types LoRA can wrap (``peft.tuners.lora.model.LoraModel._create_new_module`` dispatchers);
    torch is imported here so that importing this module stays light."""
    from torch import nn  # noqa: PLC0415 - torch loads only when _supported_types() runs

    return (nn.Linear, nn.Embedding, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.MultiheadAttention)


def _is_supported(module: nn.Module) -> bool:
    return (
        isinstance(module, _supported_types())
        or type(module).__name__ in _SUPPORTED_NAMES
        or hasattr(module, "base_layer")
    )


def _is_linear(module: nn.Module) -> bool:
    from torch import nn  # noqa: PLC0415 - torch loads only when _is_linear() runs

    return (
        isinstance(module, nn.Linear)
        or type(module).__name__ in _SUPPORTED_NAMES
        or (hasattr(module, "base_layer") and "Linear" in type(module).__name__)
    )


def _group(name: str) -> str:
    """``model.layers.3.self_attn.q_proj`` -> ``model.layers.*.self_attn.q_proj``."""
    return re.sub(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.)", "*", name)


#: module-path components that name a tower, checked in this order (the first match wins): the
#: cross-attention inside a decoder before the decoder; a vision tower before the encoder inside it.
#: Names from transformers' model code (T5 ``EncDecAttention``, BART/Marian/Whisper ``encoder_attn``,
#: BERT ``crossattention``, Mllama ``cross_attn``; Llava ``vision_tower``, CLIP/SigLIP
#: ``vision_model``, Qwen2-VL ``visual``; Whisper's audio ``encoder``).
TOWERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("cross-attention", ("encdecattention", "encoder_attn", "crossattention", "cross_attn", "cross_attention")),
    ("vision", ("vision_tower", "vision_model", "visual", "vision_encoder", "image_encoder", "vision", "vit")),
    ("projector", ("multi_modal_projector", "mm_projector", "visual_projection", "text_projection")),
    ("encoder", ("encoder",)),
    ("decoder", ("decoder",)),
    ("language model", ("language_model", "text_model")),
)
SINGLE_TOWER = "model"  # no tower component in the path (decoder-only or encoder-only models)


def tower_of(name: str) -> str:
    """The tower of a module path: ``decoder.block.0.layer.1.EncDecAttention.q`` -> ``cross-attention``,
    ``model.encoder.layers.0.self_attn.q_proj`` -> ``encoder``, ``model.layers.0.self_attn.q_proj``
    -> ``model`` (see :data:`TOWERS`; a component matches when equal, case-insensitively, or, for
    cross-attention and vision, when it starts with the name)."""
    parts = [p.lower() for p in name.split(".")]
    for tower, keys in TOWERS:
        prefix_ok = tower in ("cross-attention", "vision")
        for part in parts:
            if part in keys or (prefix_ok and any(part.startswith(k) for k in keys if len(k) > 3)):
                return tower
    return SINGLE_TOWER


def _named_towers(counts: dict[str, int]) -> list[str]:
    """The towers of ``counts`` other than :data:`SINGLE_TOWER` (top-level modules such as the
    embeddings, a pooler or a head belong to no tower and make no model multi-tower)."""
    return [t for t in counts if t != SINGLE_TOWER]


def _tower_warning(pattern: str, entry: dict[str, Any]) -> str:
    """One line: the pattern, its matches per tower, and how to adapt one tower only."""
    per = ", ".join(f"{t}: {c}" for t, c in entry["towers"].items())
    first = next(iter(entry["towers"]))
    example = next(n for n in entry["matches"] if tower_of(n) == first)
    return (
        f"target_modules pattern {pattern!r} matches in "
        f"{len(entry['towers'])} towers ({per}): LoRA adapts all of them; "
        "to adapt one tower only, list the full names of its modules in "
        "method.target_modules (a full name matches only "
        f"itself), e.g. {example!r} for the {first}"
    )


def _output_layer_name(model: nn.Module) -> str | None:
    try:
        out = model.get_output_embeddings()  # type: ignore[operator]
    except (AttributeError, NotImplementedError, TypeError):
        return None
    if out is None:
        return None
    return next((n for n, m in model.named_modules() if m is out), None)


def _matches(pattern: str, name: str, as_regex: bool) -> bool:
    if as_regex:
        return re.fullmatch(pattern, name) is not None
    return name == pattern or name.endswith("." + pattern)


def match_target_modules(model: nn.Module, patterns: list[str] | str) -> dict[str, Any]:
    """Which modules each LoRA target pattern selects, with PEFT's matching rules (module doc).

    Args:
        model: the base model (or an already wrapped PEFT model; names then carry PEFT's prefix).
        patterns: ``method.target_modules``: a list of names, a regex string, or ``"all-linear"``.

    Returns:
        ``{"passed", "message", "semantics", "model": class name, "total_matched": int,
        "unmatched": [pattern], "patterns": {pattern: {"count", "matches": [module names],
        "groups": {"model.layers.*.self_attn.q_proj": 2}, "types": {"Linear": 2},
        "towers": {"model": 2}, "unsupported": [names of matched modules LoRA cannot wrap]}},
        "towers": {tower: modules of the model LoRA can wrap there}, "warnings": [one line per
        pattern matching in more than one tower], "available": [leaf names of the modules LoRA can wrap]}``.
        docs/CASES.md C5: ``["q_proj", "ff.0"]`` on a 2-layer Llama -> q_proj count 2, ff.0 count 0, passed False.
        On a 2+2-layer T5, ``["q"]`` -> towers ``{"encoder": 2, "decoder": 2, "cross-attention": 2}`` and a warning.
    """
    named = [(n, m) for n, m in model.named_modules() if n]
    output_name = _output_layer_name(model)
    available = sorted(
        {n.rsplit(".", 1)[-1] for n, m in named if _is_supported(m) and not re.fullmatch(r"\d+", n.rsplit(".", 1)[-1])}
    )
    if isinstance(patterns, str):
        plist, as_regex = [patterns], patterns.lower() != "all-linear"
    else:
        plist, as_regex = list(patterns), False
    per: dict[str, Any] = {}
    problems: list[str] = []
    unmatched: list[str] = []
    for pattern in plist:
        if isinstance(patterns, str) and pattern.lower() == "all-linear":
            hits = [
                (n, m)
                for n, m in named
                if _is_linear(m) and n != output_name and ".lora_" not in n and not n.endswith("base_layer")
            ]
        else:
            hits = [(n, m) for n, m in named if _matches(pattern, n, as_regex)]
        unsupported = [n for n, m in hits if not _is_supported(m)]
        per[pattern] = {
            "count": len(hits),
            "matches": [n for n, _ in hits],
            "groups": dict(Counter(_group(n) for n, _ in hits)),
            "types": dict(Counter(type(m).__name__ for _, m in hits)),
            "towers": dict(Counter(tower_of(n) for n, _ in hits)),
            "unsupported": unsupported,
        }
        if not hits:
            unmatched.append(pattern)
            close = difflib.get_close_matches(pattern.rsplit(".", 1)[-1], available, n=3, cutoff=0.4)
            problems.append(
                f"target_modules pattern {pattern!r} matches no module of {type(model).__name__}"
                + (f" (closest: {', '.join(close)})" if close else "")
                + f"; modules LoRA can wrap are named: {', '.join(available[:12])}"
            )
        elif unsupported:
            kinds = sorted({type(dict(named)[n]).__name__ for n in unsupported})
            problems.append(
                f"target_modules pattern {pattern!r} matches {len(unsupported)} module(s) of a type LoRA cannot wrap "
                f"({', '.join(kinds)}: {unsupported[0]}); name the Linear layers inside it instead"
            )
    towers = dict(Counter(tower_of(n) for n, m in named if _is_supported(m)))
    multi = len(_named_towers(towers)) > 1

    def counts(v: dict[str, Any]) -> str:
        per_tower = v["towers"]
        return f"{v['count']}" + (
            f" ({', '.join(f'{t} {c}' for t, c in per_tower.items())})" if multi and per_tower else ""
        )

    warnings = [_tower_warning(p, v) for p, v in per.items() if len(_named_towers(v["towers"])) > 1]
    summary = ", ".join(f"{p}: {counts(v)}" for p, v in per.items())
    passed = not problems
    message = f"target modules matched ({summary})" if passed else "; ".join(problems) + f" [{summary}]"
    return {
        "passed": passed,
        "message": message,
        "semantics": SEMANTICS,
        "model": type(model).__name__,
        "total_matched": len({n for v in per.values() for n in v["matches"]}),
        "unmatched": unmatched,
        "patterns": per,
        "towers": towers,
        "warnings": warnings,
        "available": available,
    }


def _modules_to_save(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if type(m).__name__ == "ModulesToSaveWrapper"]


def trainable_summary(model: nn.Module) -> dict[str, Any]:
    """Trainable vs total parameters (docs/PROTOCOL.md step 4: the trained parameter count and
    any extra layer saved with the adapter).

    Counts elements of ``model.parameters()`` (shared/tied tensors once); a packed quantized weight
    (bitsandbytes ``Params4bit``, QLoRA's 4-bit base: two values per uint8 element) counts the values
    of the weight it holds (its ``quant_state.shape``), not its storage elements.

    Returns:
        ``{"passed": trainable > 0, "message", "trainable": int elements, "total": int elements, "frozen": int,
        "percent": 100*trainable/total, "trainable_tensors": [names], "frozen_tensors": int count, "trainable_dtypes":
        {dtype: elements}, "modules_to_save": [names of PEFT ModulesToSaveWrapper modules]}``.
    """
    trainable = total = 0
    names: list[str] = []
    frozen_tensors = 0
    dtypes: Counter[str] = Counter()
    for name, p in model.named_parameters():
        shape = getattr(getattr(p, "quant_state", None), "shape", None)
        n = math.prod(shape) if shape is not None else p.numel()
        total += n
        if p.requires_grad:
            trainable += n
            names.append(name)
            dtypes[str(p.dtype).replace("torch.", "")] += n
        else:
            frozen_tensors += 1
    pct = 100.0 * trainable / total if total else 0.0
    return {
        "passed": trainable > 0,
        "message": (
            f"{trainable:,} of {total:,} parameters trainable ({pct:.4g}%) in {len(names)} tensors"
            if trainable
            else f"no trainable parameters in {type(model).__name__}: nothing would be updated"
        ),
        "trainable": trainable,
        "total": total,
        "frozen": total - trainable,
        "percent": pct,
        "trainable_tensors": names,
        "frozen_tensors": frozen_tensors,
        "trainable_dtypes": dict(dtypes),
        "modules_to_save": _modules_to_save(model),
    }
