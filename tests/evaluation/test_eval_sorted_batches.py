"""Issue 15 item 5: evaluation batches sorted by prompt length hold less padding and leave the
outputs unchanged (same text per example as unsorted batches and as one example at a time, in the
order of the examples)."""

from __future__ import annotations

import contextlib

import torch

from tinymodels import make_llama, make_tokenizer
from tuneproof.data.examples import Example
from tuneproof.data.preprocess import TextPipeline
from tuneproof.modalities.batching import length_sorted_batches, padded_positions
from tuneproof.modalities.text import generate
from tuneproof.study import Eval, Prompt

TEXTS = [
    "hello world",
    "add the piano bar to my Cindy Wilson playlist",
    "a b c",
    "book a table for two in Paris tonight",
    "what is the weather in Rome tomorrow",
    "x y z",
    "rate this book five out of six",
    "hello",
]


def test_length_sorted_batches_exact():
    lengths = [2, 9, 3, 8, 7, 3, 6, 1]
    assert length_sorted_batches(lengths, 3) == [[7, 0, 2], [5, 6, 4], [3, 1]]  # stable: 2 before 5 (both 3)
    assert length_sorted_batches(lengths, 3, sort=False) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    # unsorted: (9-2)+(9-3) + (8-7)+(8-3) + (6-1) = 24 padded positions; sorted (1, 2, 3 | 3, 6, 7 | 8, 9): 2+1 + 4+1 +
    # 1 = 9
    assert padded_positions(lengths, length_sorted_batches(lengths, 3, sort=False)) == 24
    assert padded_positions(lengths, length_sorted_batches(lengths, 3)) == 9


def test_sorted_generation_outputs_equal_unsorted_and_one_at_a_time():
    tok = make_tokenizer(chat_template=None)
    model = make_llama(len(tok), seed=3)
    assert next(model.parameters()).dtype == torch.float32  # greedy fp32: the outputs must not depend on the batching
    pipe = TextPipeline(tok, Prompt(system=None, template="Q: {text}"), 128)
    examples = [Example(id=f"ex{i}", text=t) for i, t in enumerate(TEXTS)]

    def run(bs, sort):
        return generate(
            model,
            tok,
            pipe,
            examples,
            Eval(max_new_tokens=5, batch_size=bs),
            device=torch.device("cpu"),
            autocast=contextlib.nullcontext,
            sort_by_length=sort,
        )

    alone = [
        generate(
            model,
            tok,
            pipe,
            [e],
            Eval(max_new_tokens=5, batch_size=1),
            device=torch.device("cpu"),
            autocast=contextlib.nullcontext,
        )[0]
        for e in examples
    ]
    sorted_out, unsorted_out = run(3, True), run(3, False)
    assert sorted_out == unsorted_out == alone
    assert len(set(alone)) > 1  # the outputs differ between examples: a permuted order would be seen
    lengths = [len(tok(pipe.prompt_text(t), add_special_tokens=False)["input_ids"]) for t in TEXTS]
    assert padded_positions(lengths, length_sorted_batches(lengths, 3)) < padded_positions(
        lengths, length_sorted_batches(lengths, 3, sort=False)
    )


def test_sorted_classification_keeps_each_prediction_with_its_example():
    from transformers import BertConfig, BertForSequenceClassification

    from tuneproof.modalities.text import classify

    tok = make_tokenizer(chat_template=None)
    tok.pad_token = "<|endoftext|>"
    torch.manual_seed(0)
    model = BertForSequenceClassification(
        BertConfig(
            vocab_size=len(tok),
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            num_labels=4,
            pad_token_id=tok.pad_token_id,
        )
    )
    examples = [Example(id=f"ex{i}", text=t) for i, t in enumerate(TEXTS)]
    labels = ["a", "b", "c", "d"]

    def run(bs, sort, items=examples):
        return classify(
            model,
            tok,
            items,
            labels,
            max_length=64,
            batch_size=bs,
            device=torch.device("cpu"),
            autocast=contextlib.nullcontext,
            sort_by_length=sort,
        )

    alone = [run(1, False, [e])[0] for e in examples]
    assert run(3, True) == run(3, False) == alone
    assert len(set(alone)) > 1


def test_generation_progress_moves_per_decoding_step_not_per_batch():
    """A batch of 16 showed "0/16 ETA ?" for 20 minutes: the bar now moves at each decoding step (one
    token slot per row), and the calls add up to examples x max_new_tokens, batches that end early included."""
    tok = make_tokenizer(chat_template=None)
    model = make_llama(len(tok), seed=3)
    pipe = TextPipeline(tok, Prompt(system=None, template="Q: {text}"), 128)
    examples = [Example(id=f"ex{i}", text=t) for i, t in enumerate(TEXTS)]
    tokens: list[int] = []
    done: list[int] = []
    outputs = generate(
        model,
        tok,
        pipe,
        examples,
        Eval(max_new_tokens=6, batch_size=8),
        device=torch.device("cpu"),
        autocast=contextlib.nullcontext,
        progress=done.append,
        token_progress=tokens.append,
    )
    assert done == [8]  # one batch: examples finished once
    assert sum(tokens) == 8 * 6
    steps = [k for k in tokens if k == 8]
    assert len(steps) >= 2 and tokens[: len(steps)] == steps  # 8 slots at each decoding step, then what was left
    plain = generate(
        model,
        tok,
        pipe,
        examples,
        Eval(max_new_tokens=6, batch_size=8),
        device=torch.device("cpu"),
        autocast=contextlib.nullcontext,
    )
    assert outputs == plain  # counting never changes what is generated
