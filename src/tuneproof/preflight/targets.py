"""Preflight checks of what is trained (docs/PROTOCOL.md step 4): ``target modules``, ``trainable
parameters`` and ``embedding size`` (:func:`check_target_modules`). Target-module matching and the
trainable parameters themselves: :mod:`tuneproof.models.targets`.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from tuneproof.context import StudyContext
from tuneproof.models.base_model import load_model
from tuneproof.models.targets import match_target_modules, trainable_summary
from tuneproof.preflight.report import check_result


def _rows(module: Any) -> int | None:
    weight = getattr(module, "weight", None)
    return int(weight.shape[0]) if weight is not None and hasattr(weight, "shape") else None


def _trainable_or_saved(model: nn.Module, module: nn.Module) -> bool:
    if any(p.requires_grad for p in module.parameters()):
        return True
    name = next((n for n, m in model.named_modules() if m is module), None)
    if name is None:
        return False
    wrappers = {
        n for n, m in model.named_modules() if type(m).__name__ in ("ModulesToSaveWrapper", "TrainableTokensWrapper")
    }
    return any(name == w or name.startswith(w + ".") for w in wrappers)


def check_embedding_size(model: nn.Module, tokenizer: Any, added_tokens: int | None = None) -> dict[str, Any]:
    """Embedding rows vs tokenizer length, and whether added tokens are trained and saved.

    Args:
        model: the model (PEFT-wrapped or not) exposing ``get_input_embeddings()``.
        tokenizer: a tokenizer (``len(tokenizer)`` is used) or the length as an int.
        added_tokens: tokens added on top of the pretrained vocabulary; default
            ``len(tokenizer) - tokenizer.vocab_size`` for a tokenizer object, 0 for an int.

    Rules: a token id >= the number of embedding rows indexes out of range -> fail, call
    ``model.resize_token_embeddings(len(tokenizer))``. More rows than tokens is fine (models pad the
    matrix, e.g. to a multiple of 64). Added tokens get freshly initialised rows: when the embedding
    is frozen and not in ``modules_to_save`` (LoRA), those rows are never trained nor saved -> fail.

    Returns:
        ``{"passed", "message", "tokenizer_length", "input_embedding_rows", "output_embedding_rows",
        "added_tokens", "embedding_trainable_or_saved"}``.
    """
    n_tok = int(tokenizer) if isinstance(tokenizer, int) else len(tokenizer)
    if added_tokens is None:
        base = getattr(tokenizer, "vocab_size", None)
        added_tokens = max(0, n_tok - int(base)) if (not isinstance(tokenizer, int) and base is not None) else 0
    emb = model.get_input_embeddings()  # type: ignore[operator]
    in_rows = _rows(emb)
    try:
        out = model.get_output_embeddings()  # type: ignore[operator]
    except (AttributeError, NotImplementedError):
        out = None
    out_rows = _rows(out) if out is not None else None
    saved = _trainable_or_saved(model, emb)
    problems = []
    if in_rows is not None and n_tok > in_rows:
        problems.append(
            f"tokenizer has {n_tok} tokens but the input embedding has "
            f"{in_rows} rows: ids >= {in_rows} are out of range; "
            f"call model.resize_token_embeddings(len(tokenizer)) before adding the adapter"
        )
    if out_rows is not None and n_tok > out_rows:
        problems.append(
            f"tokenizer has {n_tok} tokens but the output layer has {out_rows} rows: resize_token_embeddings"
        )
    if added_tokens > 0 and not saved:
        problems.append(
            f"{added_tokens} added token(s) have freshly initialised embedding "
            "rows, but the embedding is frozen and not in "
            "modules_to_save: they are never trained nor saved; add the "
            "embedding (and output layer) to method.modules_to_save"
        )
    message = "; ".join(problems) if problems else f"embedding rows {in_rows} >= tokenizer length {n_tok}"
    return {
        "passed": not problems,
        "message": message,
        "tokenizer_length": n_tok,
        "input_embedding_rows": in_rows,
        "output_embedding_rows": out_rows,
        "added_tokens": added_tokens,
        "embedding_trainable_or_saved": saved,
    }


# --------------------------------------------------------------------------- the preflight's checks
def check_target_modules(
    ctx: StudyContext, model, report: dict[str, Any] | None, failure: str | None, *, embedding_size: bool = True
) -> list[dict[str, Any]]:
    """The preflight's ``target modules`` (matches per pattern of ``method.target_modules``; zero
    matches fails, docs/CASES.md C5), ``trainable parameters`` (trainable/total, ``method.modules_to_save``) and
    ``embedding size`` (embedding rows vs the tokenizer; only with ``embedding_size``, where the modality
    runs it in :data:`tuneproof.preflight.checks.CHECKS`: an image classifier has no token embeddings) checks.

    Args:
        model: the model ``build_model`` built, or None when it refused (``failure``: its first line);
            the matches are then taken on the plain base, and only ``target modules`` is returned.
        report: ``build_model``'s method report (``targets``, ``modules_to_save``), or None.
    """
    method = ctx.study.method
    out = []
    if method.kind == "full":
        out.append(
            check_result(
                "target modules",
                True,
                "method.kind full: every parameter is trained, no target patterns",
                {"method": "full"},
            )
        )
    else:
        match = (report or {}).get("targets")
        if match is None:  # build_model refused (docs/CASES.md C5): match on the plain base for the numbers
            base = load_model(ctx.base, ctx.head, labels=ctx.head_labels)
            match = match_target_modules(base, method.target_modules)
            del base
        numbers = {p: v["count"] for p, v in match["patterns"].items()}
        numbers["unmatched"] = match["unmatched"]
        extra = {"warning": "; ".join(match["warnings"])} if match.get("warnings") else {}
        out.append(
            check_result(
                "target modules",
                bool(match["passed"]) and failure is None,
                match["message"] if match["message"] else failure or "",
                numbers,
                match,
                **extra,
            )
        )
    if model is None:
        return out
    summary = trainable_summary(model)
    mts = sorted((report or {}).get("modules_to_save") or []) if method.kind in ("lora", "qlora") else []
    message = summary["message"] + (f"; modules_to_save: {', '.join(mts)}" if mts else "; modules_to_save: none")
    if method.kind in ("lora", "qlora"):
        message += f"; LoRA r={method.r}, alpha={method.alpha:g}"
    if method.kind == "qlora":
        message += f"; base in 4-bit {method.bnb_4bit_quant_type} (bitsandbytes)"
    out.append(
        check_result(
            "trainable parameters",
            bool(summary["passed"]),
            message,
            {
                "trainable": summary["trainable"],
                "total": summary["total"],
                "percent": round(summary["percent"], 4),
                "trainable_tensors": len(summary["trainable_tensors"]),
                "modules_to_save": mts,
            },
            {
                **{k: v for k, v in summary.items() if k != "trainable_tensors"},
                "trainable_tensors": summary["trainable_tensors"],
            },
        )
    )
    if not embedding_size:  # no token embeddings to match against a vocabulary
        return out
    emb = check_embedding_size(model, ctx.tokenizer)
    out.append(
        check_result(
            "embedding size",
            bool(emb["passed"]),
            emb["message"],
            {k: emb[k] for k in ("tokenizer_length", "input_embedding_rows", "output_embedding_rows", "added_tokens")},
            emb,
        )
    )
    return out
