"""Evaluation batch size: greedy outputs at ``eval.batch_size`` must equal those at batch size 1 (docs/CASES.md C22).

Batched generation pads the shorter prompts (left padding here, ``modalities/text.py``). A
model, attention implementation or padding side that lets the padding leak into the computation
changes the outputs with the batch size alone; public harnesses have reported 0.259 vs 0.459 on one
benchmark from the batch size. The check predicts a sample of evaluation examples one at a time and
in batches of ``eval.batch_size`` and fails naming the first example whose outputs differ.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tuneproof.preflight.eval_memory import evaluated_batch_size

DEFAULT_SAMPLE = 16  # evaluation examples compared (at most; a full batch at the default eval.batch_size)


def length_spread_sample(examples: Sequence[Any], k: int, key: Callable[[Any], int]) -> list[Any]:
    """``k`` examples spread evenly over the length order (shortest to longest), so one batch
    holds prompts of different lengths and therefore padding."""
    order = sorted(range(len(examples)), key=lambda i: (key(examples[i]), i))
    if k >= len(order):
        return [examples[i] for i in order]
    picks = sorted({order[round(j * (len(order) - 1) / max(1, k - 1))] for j in range(k)})
    return [examples[i] for i in picks]


def check_batch_invariance(
    predict: Callable[[list, int], list[str]],
    examples: Sequence[Any],
    batch_size: int,
    *,
    do_sample: bool = False,
    sample: int = DEFAULT_SAMPLE,
    ids: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Compare predictions at batch size 1 with predictions at ``batch_size``.

    Args:
        predict: ``predict(examples, batch_size) -> [output text]`` by the study's evaluation
            procedure (generation or the classification head).
        examples: the sample to compare (see :func:`length_spread_sample`); at most ``sample`` are used.
        batch_size: ``eval.batch_size``.
        do_sample: ``eval.do_sample``; sampled outputs are not compared (they depend on the random
            stream), the check passes with that note and the batch size is fingerprinted instead.
        ids: example ids for the message (default ``examples[i].id``).

    Returns:
        ``{"name": "eval batch size", "passed", "message", "numbers": {"sample", "batch_size",
        "differing"}, "details": {"first": {"id", "batch_1", "batch_n"} | None, "differing_ids"}}``.
        The message names the first differing example and both outputs, e.g. ``"greedy outputs
        differ between batch size 1 and eval.batch_size 4 on 2 of 8 examples; first: ex3: 'a' vs 'b'"``.
    """
    items = list(examples)[:sample]
    names = [str(i) for i in ids] if ids is not None else [str(getattr(e, "id", i)) for i, e in enumerate(items)]
    numbers = {"sample": len(items), "batch_size": int(batch_size), "differing": 0}
    if do_sample:
        return {
            "name": "eval batch size",
            "passed": True,
            "numbers": numbers,
            "details": {"first": None, "differing_ids": []},
            "message": "eval.do_sample: sampled outputs are not compared; the batch "
            "size is part of the eval fingerprint",
        }
    if batch_size <= 1 or len(items) <= 1:
        return {
            "name": "eval batch size",
            "passed": True,
            "numbers": numbers,
            "details": {"first": None, "differing_ids": []},
            "message": f"eval.batch_size {batch_size} on {len(items)} example(s): nothing is batched",
        }
    single = [predict([e], 1)[0] for e in items]
    batched = predict(items, batch_size)
    diff = [i for i, (a, b) in enumerate(zip(single, batched)) if a != b]
    numbers["differing"] = len(diff)
    first = None if not diff else {"id": names[diff[0]], "batch_1": single[diff[0]], "batch_n": batched[diff[0]]}
    if diff:
        msg = (
            "greedy outputs differ between batch size 1 and eval.batch_size "
            f"{batch_size} on {len(diff)} of {len(items)} examples; "
            f"first: {first['id']}: {first['batch_1'][:80]!r} vs {first['batch_n'][:80]!r} "
            "(padding changes the outputs: scores would depend on the batch size)"
        )
    else:
        msg = f"greedy outputs identical at batch size 1 and eval.batch_size {batch_size} on {len(items)} examples"
    return {
        "name": "eval batch size",
        "passed": not diff,
        "numbers": numbers,
        "message": msg,
        "details": {"first": first, "differing_ids": [names[i] for i in diff]},
    }


def check_study_eval_batch(ctx: Any, model, sample: int = DEFAULT_SAMPLE) -> dict[str, Any]:
    """:func:`check_batch_invariance` on the study's evaluation split with its own procedure (the
    modality's :meth:`~tuneproof.modalities.modality.Modality.predict` with ``eval.batch_size``
    replaced by the batch evaluation forms, :func:`~tuneproof.preflight.eval_memory.evaluated_batch_size`),
    on a sample of ``min(sample, that batch)`` examples spread over the token
    lengths of what the model reads (:meth:`~tuneproof.modalities.modality.Modality.eval_inputs`)."""
    ev = ctx.study.eval
    device, _, autocast = ctx.torch_setup()
    examples = ctx.eval_examples()
    size = evaluated_batch_size(ev.batch_size, len(examples))  # no evaluation batch is larger
    k = max(2, min(sample, size))

    def predict(items: list, bs: int) -> list[str]:
        return ctx.modality.predict(ctx, model, items, device=device, autocast=autocast, batch_size=bs)

    lengths = {
        e.id: len(ctx.tokenizer(text, add_special_tokens=False)["input_ids"])
        for e, text in zip(examples, ctx.modality.eval_inputs(ctx, examples))
    }
    examples = length_spread_sample(examples, k, lambda e: lengths[e.id])
    return check_batch_invariance(predict, examples, size, do_sample=ev.do_sample, sample=k)
