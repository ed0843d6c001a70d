"""What is trained (PROTOCOL.md step 4): embedding size vs tokenizer. Target-module matching and
the trainable parameters: :mod:`tuneproof.models.targets`.
"""

from __future__ import annotations

from typing import Any

from torch import nn


def _rows(module: Any) -> int | None:
    weight = getattr(module, "weight", None)
    return int(weight.shape[0]) if weight is not None and hasattr(weight, "shape") else None


def _trainable_or_saved(model: nn.Module, module: nn.Module) -> bool:
    if any(p.requires_grad for p in module.parameters()):
        return True
    name = next((n for n, m in model.named_modules() if m is module), None)
    if name is None:
        return False
    wrappers = {n for n, m in model.named_modules() if type(m).__name__ in ("ModulesToSaveWrapper", "TrainableTokensWrapper")}
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
            f"tokenizer has {n_tok} tokens but the input embedding has {in_rows} rows: ids >= {in_rows} are out of range; "
            f"call model.resize_token_embeddings(len(tokenizer)) before adding the adapter"
        )
    if out_rows is not None and n_tok > out_rows:
        problems.append(f"tokenizer has {n_tok} tokens but the output layer has {out_rows} rows: resize_token_embeddings")
    if added_tokens > 0 and not saved:
        problems.append(
            f"{added_tokens} added token(s) have freshly initialised embedding rows, but the embedding is frozen and not in "
            "modules_to_save: they are never trained nor saved; add the embedding (and output layer) to method.modules_to_save"
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
