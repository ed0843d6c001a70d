"""docs/CASES.md C22: greedy outputs at eval.batch_size equal those at batch size 1, or the preflight fails
naming the first differing example."""

from __future__ import annotations

import contextlib

import torch

from tinymodels import make_llama, make_tokenizer
from tuneproof.data.examples import Example
from tuneproof.data.preprocess import TextPipeline
from tuneproof.evaluation.fingerprint import eval_fingerprint
from tuneproof.modalities.text import generate
from tuneproof.preflight.eval_batch import check_batch_invariance, length_spread_sample
from tuneproof.study import Eval, Prompt

TEXTS = [
    "hello world",
    "add the piano bar to my Cindy Wilson playlist",
    "a b c",
    "book a table for two in Paris tonight",
    "what is the weather in Rome tomorrow",
    "x y z",
]


def _examples():
    return [Example(id=f"ex{i}", text=t) for i, t in enumerate(TEXTS)]


def test_component_names_the_first_differing_example():
    def predict(items, bs):  # a procedure whose output for ex3 changes when it is batched
        return [f"{e.id}-{'padded' if bs > 1 and e.id in ('ex3', 'ex5') else 'ok'}" for e in items]

    r = check_batch_invariance(predict, _examples(), 4)
    assert r["passed"] is False and r["numbers"] == {"sample": 6, "batch_size": 4, "differing": 2}
    assert r["details"]["first"] == {"id": "ex3", "batch_1": "ex3-ok", "batch_n": "ex3-padded"}
    assert r["message"].startswith(
        "greedy outputs differ between batch size 1 and eval.batch_size 4 on 2 "
        "of 6 examples; first: ex3: 'ex3-ok' vs 'ex3-padded'"
    )
    ok = check_batch_invariance(lambda items, bs: [e.id for e in items], _examples(), 4)
    assert (
        ok["passed"] and ok["message"] == "greedy outputs identical at batch size 1 and eval.batch_size 4 on 6 examples"
    )
    assert check_batch_invariance(predict, _examples(), 4, do_sample=True)["passed"] is True


def test_length_spread_sample_covers_short_and_long_prompts():
    ex = _examples()
    picked = length_spread_sample(ex, 3, key=lambda e: len(e.text))
    assert [e.id for e in picked] == ["ex0", "ex1", "ex2"]  # shortest ex2 'a b c', middle ex0, longest ex1 (file order)


class _IgnoresMask(torch.nn.Module):
    """A model whose attention sees the padding: the fault that makes scores depend on the batch size."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.config = model.config
        self.generation_config = model.generation_config

    def generate(self, input_ids, attention_mask, **kw):
        out = input_ids
        for _ in range(kw["max_new_tokens"]):
            logits = self.model(input_ids=out).logits[:, -1]  # no attention mask, positions count the padding
            out = torch.cat([out, logits.argmax(-1, keepdim=True)], dim=1)
        return out

    def eval(self):
        self.model.eval()
        return self


def _predictor(model, tok):
    pipe = TextPipeline(tok, Prompt(system=None, template="Q: {text}"), 128)
    cfg = Eval(max_new_tokens=5)

    def predict(items, bs):
        return generate(
            model,
            tok,
            pipe,
            items,
            cfg.model_copy(update={"batch_size": bs}),
            device=torch.device("cpu"),
            autocast=contextlib.nullcontext,
        )

    return predict


def test_real_generation_is_batch_invariant_and_a_padding_leak_is_caught():
    tok = make_tokenizer(chat_template=None)
    model = make_llama(len(tok), seed=3)
    model.eval()
    r = check_batch_invariance(_predictor(model, tok), _examples(), 6)
    assert r["passed"], r["message"]
    assert r["numbers"] == {"sample": 6, "batch_size": 6, "differing": 0}
    bad = check_batch_invariance(_predictor(_IgnoresMask(model), tok), _examples(), 6)
    assert bad["passed"] is False and bad["numbers"]["differing"] >= 1
    assert bad["details"]["first"]["id"] == bad["details"]["differing_ids"][0]
    assert bad["message"].startswith(
        "greedy outputs differ between batch size 1 and eval.batch_size 6 on "
        f"{bad['numbers']['differing']} of 6 examples; first: {bad['details']['first']['id']}"
    )


def test_batch_size_is_in_the_fingerprint_only_where_it_can_change_outputs():
    ids, tok = ["a", "b"], {"name": "t"}
    fp = {bs: eval_fingerprint(ids, Eval(batch_size=bs), "extraction", [], tok) for bs in (1, 16)}
    assert fp[1]["hash"] == fp[16]["hash"]  # greedy fp32: the preflight checks it does not matter
    for kw in ({"precision": "bf16"}, {"precision": "fp16"}):
        a = eval_fingerprint(ids, Eval(batch_size=1), "extraction", [], tok, **kw)
        b = eval_fingerprint(ids, Eval(batch_size=16), "extraction", [], tok, **kw)
        assert a["parts"]["decoding"] != b["parts"]["decoding"]
    a = eval_fingerprint(ids, Eval(batch_size=1, do_sample=True), "extraction", [], tok)
    b = eval_fingerprint(ids, Eval(batch_size=16, do_sample=True), "extraction", [], tok)
    assert a["parts"]["decoding"] != b["parts"]["decoding"]
