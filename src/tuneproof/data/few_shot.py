"""The few-shot control (``tuneproof baseline --few-shot K``): K demonstrations drawn once from the training
split, rendered as earlier user/assistant turns before every evaluated example, and the check that the longest
prompt still fits the model's context.

The draw (:func:`draw_shots`) is seeded by ``eval.seed`` (the seed of the evaluation procedure's other draws: the
bootstrap and the backend check's sample), so the same study draws the same shots; it reads the training split
only, never the evaluation or the reserved test split. Where the examples have classes (``Example.label``) it is
stratified: with K below the number of classes, K distinct classes chosen by the seed, one example each; with K at
or above it, round-robin over the classes in an order chosen by the seed (each class's examples in a seeded order),
so every class is shown before any is shown twice. Without classes: K examples drawn by the seed.

The rendering (:func:`with_shots`) reuses :attr:`Example.context <tuneproof.data.examples.Example.context>`: the
row's own system message first (else ``eval.prompt.system`` applies, as for every prompt), then each shot as a user
turn with ``eval.prompt.template`` applied and its answer as the assistant turn, then the row's own earlier turns,
then its final user turn (the prompt's usual rendering, :func:`tuneproof.data.chat.prompt_messages`). A chat
template without a system role folds the system text into the first user turn, the first shot's
(:func:`tuneproof.data.chat_template.fold_system`); a template that strips think blocks from earlier assistant turns
strips them from the shots' answers, as it would in any conversation. A shot drawn from chat data keeps its own
earlier turns (as written) before its final user turn; its own system message is left out.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from tuneproof.data.dedup import normalise
from tuneproof.data.examples import Example, natural_key
from tuneproof.errors import TuneproofError
from tuneproof.study import render_prompt

#: the summary's ``control`` value of a few-shot control run (the plain baseline has none)
FEW_SHOT = "few_shot"
#: the file a few-shot control run records its shots in
SHOTS_FILE = "shots.json"


def draw_shots(
    train: Sequence[Example], k: int, seed: int, *, exclude_ids: Sequence[str] = (), exclude: Sequence[Example] = ()
) -> list[Example]:
    """K demonstrations from ``train``, in the order they are shown (see the module docstring for the rule).

    Args:
        train: the training split's examples (never the evaluation or test split).
        k: how many (>= 1).
        seed: the draw's seed (``eval.seed``).
        exclude_ids: ids never drawn (the evaluated examples' ids: a shot is never an evaluated example).
        exclude: examples whose input no shot may repeat (the evaluated ones): a training example with the same
            normalised input (:func:`tuneproof.data.dedup.normalise` of :meth:`Example.dedup_text`; an exact or
            normalised cross-split duplicate) is never drawn, else the prompt would hand the model that example's
            answer.

    Raises:
        TuneproofError: ``k < 1``, or fewer than ``k`` training examples to draw from.
    """
    if k < 1:
        raise TuneproofError(f"--few-shot {k}: K must be at least 1", hint="e.g. --few-shot 5")
    banned = set(map(str, exclude_ids))
    seen = {normalise(e.dedup_text()) for e in exclude}
    pool = sorted(
        (e for e in train if str(e.id) not in banned and normalise(e.dedup_text()) not in seen),
        key=lambda e: natural_key(e.id),
    )
    if len(pool) < k:
        repeats = sum(1 for e in train if str(e.id) not in banned) - len(pool)
        held = (
            f"holds {len(pool) + repeats} examples, {repeats} of which repeat an evaluated example's input: "
            f"{len(pool)} to draw from"
            if repeats
            else f"holds {len(pool)} example{'s' if len(pool) != 1 else ''} to draw from"
        )
        raise TuneproofError(
            f"--few-shot {k}: the training split {held}, fewer than K={k}",
            hint="lower K, or add training examples (data.split.max_examples caps the train split)",
        )
    rng = random.Random(seed)
    if all(e.label is None for e in pool):
        return rng.sample(pool, k)
    by_class: dict[str, list[Example]] = {}
    for e in pool:
        by_class.setdefault("" if e.label is None else str(e.label), []).append(e)
    classes = sorted(by_class, key=natural_key)
    for c in classes:
        rng.shuffle(by_class[c])
    if k < len(classes):
        return [by_class[c][0] for c in rng.sample(classes, k)]
    rng.shuffle(classes)
    out: list[Example] = []
    depth = 0
    while len(out) < k:
        for c in classes:
            if depth < len(by_class[c]) and len(out) < k:
                out.append(by_class[c][depth])
        depth += 1
    return out


def shot_turns(shot: Example, template: str) -> list[dict[str, str]]:
    """One demonstration as turns: the shot's own earlier turns (chat data, as written; its system message left
    out), its input as a user turn with ``template`` applied, its answer (``target``) as the assistant turn."""
    earlier = [dict(t) for t in shot.context if t["role"] != "system"]
    return [
        *earlier,
        {"role": "user", "content": render_prompt(template, shot.text)},
        {"role": "assistant", "content": shot.target if shot.target is not None else str(shot.label or "")},
    ]


def with_shots(examples: Sequence[Example], shots: Sequence[Example], template: str) -> list[Example]:
    """``examples`` with the shots' turns put into each one's context, after its own system message and before its
    own earlier turns (ids, inputs and references unchanged: the outputs pair with the plain baseline's)."""
    turns = [t for s in shots for t in shot_turns(s, template)]
    out = []
    for e in examples:
        own_system = [dict(t) for t in e.context if t["role"] == "system"]
        rest = [dict(t) for t in e.context if t["role"] != "system"]
        out.append(
            Example(
                id=e.id,
                text=e.text,
                label=e.label,
                target=e.target,
                source=e.source,
                split=e.split,
                meta=dict(e.meta),
                context=[*own_system, *turns, *rest],
            )
        )
    return out


def shots_record(shots: Sequence[Example], k: int, seed: int, split: str, fit: dict[str, Any]) -> dict[str, Any]:
    """What a few-shot control run records (``shots.json``): K, the seed and its source, the split drawn from,
    each shot's id, class and source row in the order shown, the classes covered, and the context check."""
    return {
        "control": FEW_SHOT,
        "k": k,
        "seed": seed,
        "seed_from": "eval.seed",
        "split": split,
        "shots": [{"id": s.id, "label": s.label, "source": s.source} for s in shots],
        "classes": sorted({str(s.label) for s in shots if s.label is not None}, key=natural_key),
        "fit": fit,
    }


def context_length(model_config: dict[str, Any], tokenizer: Any = None) -> tuple[int | None, str]:
    """The model's context length in tokens and where it was read: ``config.json``'s ``max_position_embeddings``
    (or ``n_positions``, ``max_sequence_length``, ``seq_length``; a nested ``text_config`` too), else the
    tokenizer's ``model_max_length`` when it is a real bound (below 10^7; transformers' "no limit" is 10^30).
    ``(None, "unknown")`` when neither says."""
    for cfg, where in ((model_config, "config.json"), (model_config.get("text_config") or {}, "config.json")):
        for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
            v = cfg.get(key) if isinstance(cfg, dict) else None
            if isinstance(v, int) and v > 0:
                return v, f"{where} {key}"
    n = getattr(tokenizer, "model_max_length", None)
    if isinstance(n, int) and 0 < n < 10**7:
        return n, "tokenizer model_max_length"
    return None, "unknown"


def check_fit(
    prompt_tokens: Sequence[int],
    ids: Sequence[str],
    k: int,
    max_new_tokens: int,
    limit: int | None,
    limit_from: str,
    plain_tokens: int | None = None,
) -> dict[str, Any]:
    """The few-shot context check: the longest evaluated prompt with the shots, plus the generation budget
    (``eval.max_new_tokens``), against the model's context length.

    Args:
        prompt_tokens: tokens of each evaluated example's prompt with the shots (its order: ``ids``).
        limit: the context length in tokens (:func:`context_length`; None: unknown, recorded and not refused).
        plain_tokens: tokens of the longest prompt without the shots (shown as what the shots add).

    Returns:
        ``{"k", "longest_prompt_tokens", "longest_id", "plain_longest_prompt_tokens", "max_new_tokens",
        "needed_tokens", "context_length", "context_length_from", "fits", "line"}``.

    Raises:
        TuneproofError: the longest prompt and the generation budget do not fit the context (names K, both numbers
            and what to do).
    """
    at = max(range(len(prompt_tokens)), key=lambda i: prompt_tokens[i]) if prompt_tokens else None
    longest = int(prompt_tokens[at]) if at is not None else 0
    needed = longest + int(max_new_tokens)
    fits = limit is None or needed <= limit
    added = f" ({longest - plain_tokens} more than without the shots)" if plain_tokens is not None else ""
    line = (
        f"few-shot K={k}: longest prompt {longest} tokens{added} + {max_new_tokens} generated = {needed} tokens; "
        + (f"context length {limit} ({limit_from})" if limit is not None else "context length unknown (not checked)")
    )
    record = {
        "k": k,
        "longest_prompt_tokens": longest,
        "longest_id": ids[at] if at is not None else None,
        "plain_longest_prompt_tokens": plain_tokens,
        "max_new_tokens": int(max_new_tokens),
        "needed_tokens": needed,
        "context_length": limit,
        "context_length_from": limit_from,
        "fits": fits,
        "line": line,
    }
    if not fits:
        raise TuneproofError(
            f"--few-shot {k}: the longest prompt with the shots ({record['longest_id']}) is {longest} tokens, plus "
            f"eval.max_new_tokens {max_new_tokens} = {needed} tokens, over the model's context length {limit} "
            f"({limit_from})",
            hint="lower K, or shorten eval.prompt.template / eval.max_new_tokens",
        )
    return record
