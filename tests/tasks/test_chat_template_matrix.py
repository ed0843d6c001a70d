"""Issue 30 item 6: one behavioural matrix over the chat-template layouts of the model families people fine-tune
(``tests/chat_families.py``: Llama-3, Llama-3.2, Qwen2.5, Qwen3 with and without thinking, DeepSeek-R1 distill,
Gemma-2/3, Mistral v0.3, Phi-3, harmony channels, SmolLM3 with and without /think; Phi-4, Granite 3, Command-R,
OLMo-2, Llama-2, DeepSeek-V3, Mistral v0.1, a ChatML template that raises for a system message).

For each layout: either it works by default, or the data check refuses it in one line naming the key that makes it
work; then, with that key: the supervised tokens are the answer, the text the template supervises before it (listed
by the data check) and exactly one end-of-turn token; nothing injected (the system text, the date) is supervised;
the tokens before the first supervised one are the inference prompt; and a model that emits exactly the supervised
tokens scores 1.0 through the real generate, decode, parse and score path (``generate_prompts`` and the task's
scorer). Chat data in the same matrix: a multi-turn example with its own system message, and a single-turn one;
under ``train_on: all_assistant`` every earlier answer is supervised with one end-of-turn token, or the example is
refused naming ``data.chat.train_on: last``; a template that writes the BOS gives one BOS, in training and in
what generation is given, where the tokenizer would add its own.
"""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from chat_families import FAMILIES, Family, family_tokenizer
from tuneproof.data.chat_template import ChatTemplate
from tuneproof.data.examples import Example
from tuneproof.data.preprocess import IGNORE_INDEX, TextPipeline
from tuneproof.modalities.text import generate_prompts
from tuneproof.study import Eval, Prompt
from tuneproof.tasks import TaskConfig, get_task

SYSTEM = "Reply with JSON only."
ROWS = [
    ("add the piano bar to my Cindy Wilson playlist", {"intent": "PlayMusic", "slots": {"artist": "Cindy Wilson"}}),
    ("book a table for two in Paris tonight", {"intent": "BookRestaurant", "slots": {"city": "Paris"}}),
    ("what is the weather in Rome tomorrow", {"intent": "GetWeather", "slots": {}}),
]
EXAMPLES = [
    Example(id=f"r{i}", text=t, target=json.dumps(y), source=f"d.jsonl:{i + 1}") for i, (t, y) in enumerate(ROWS)
]
IDS = list(FAMILIES)


class ScriptedLlama(LlamaForCausalLM):
    """A tiny Llama whose next-token logits follow a script: after a prompt it emits the prompt's scripted tokens,
    then its last stop token. The model's own forward runs (cache and all); only the logits are replaced."""

    script: dict[tuple[int, ...], list[int]] = {}
    stop: int = 0

    def forward(self, input_ids=None, attention_mask=None, **kw):
        out = super().forward(input_ids=input_ids, attention_mask=attention_mask, **kw)
        if input_ids.shape[1] > 1:  # the prompt (left-padded): the history starts
            mask = attention_mask if attention_mask is not None else kw.get("attention_mask")
            if mask is None:  # no mask given: the left padding is the run of pad tokens before the prompt
                mask = torch.cumsum(input_ids != self.config.pad_token_id, dim=1) > 0
            self.hist = [row[m.bool()].tolist() for row, m in zip(input_ids, mask)]
        else:
            for h, t in zip(self.hist, input_ids[:, 0].tolist()):
                h.append(t)
        logits = torch.full_like(out.logits, -1e4)
        for b, h in enumerate(self.hist):
            nxt = self.stop
            for prompt, emitted in self.script.items():
                k = len(h) - len(prompt)
                if tuple(h[: len(prompt)]) == prompt and 0 <= k < len(emitted):
                    nxt = emitted[k]
            logits[b, -1, nxt] = 1e4
        out.logits = logits
        return out


def _pipeline(fam: Family, tok, **keys) -> TextPipeline:
    chat = ChatTemplate(
        tok, keys.get("chat_template"), keys.get("chat_template_kwargs", {}), keys.get("end_of_turn", "auto")
    )
    return TextPipeline(tok, Prompt(system=SYSTEM), max_length=512, chat=chat)


def _model(tok, stop: int) -> ScriptedLlama:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=len(tok),
        max_position_embeddings=1024,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    return ScriptedLlama(cfg).eval()


@pytest.fixture(scope="module", params=IDS)
def family(request):
    fam = FAMILIES[request.param]
    return request.param, fam, family_tokenizer(fam)


def test_a_layout_works_by_default_or_is_refused_in_one_line_naming_the_key(family):
    name, fam, tok = family
    encoded = _pipeline(fam, tok).encode_all(EXAMPLES)
    faults = [f for e in encoded for f in e.faults]
    if fam.refusal is None:
        assert faults == [], (name, faults[:1])
        return
    phrase, key = fam.refusal
    assert len(faults) == len(EXAMPLES), (name, faults)
    assert all(phrase in f and key in f and "\n" not in f for f in faults), faults[0]


def test_with_its_keys_the_supervised_tokens_are_the_answer_and_one_end_of_turn(family):
    name, fam, tok = family
    pipe = _pipeline(fam, tok, **fam.fix)
    assert pipe.end_token == fam.end_of_turn and pipe.chat.system_role == fam.system_role
    eot = tok.convert_tokens_to_ids(fam.end_of_turn)
    for ex in EXAMPLES:
        enc = pipe.encode(ex)
        assert enc.faults == [], (name, enc.faults)
        sup = [lab for lab in enc.labels if lab != IGNORE_INDEX]
        assert sup[-1] == eot and sup.count(eot) == 1, name
        answer = sup[enc.before_tokens : -1]
        # the answer tokens read back as the reference; nothing else is supervised but the listed text
        assert tok.decode(answer).strip() == ex.target, name
        assert enc.n_supervised == enc.before_tokens + len(answer) + 1
        assert enc.before_answer == fam.before and tok.decode(sup[: enc.before_tokens]) == fam.before.strip(" ")
        supervised_text = tok.decode(sup)
        assert SYSTEM not in supervised_text and "Date" not in supervised_text and ex.text not in supervised_text
        # the tokens before the first supervised one are the inference prompt, and it holds the system text
        prompt = pipe.prompt_text(ex.text)
        assert enc.input_ids[: enc.prompt_tokens] == tok(prompt, add_special_tokens=False)["input_ids"]
        assert enc.text.startswith(prompt) and SYSTEM in prompt and ex.text in prompt
        assert enc.gold_answer == ex.target
    lines = pipe.template_report(pipe.encode_all(EXAMPLES))["lines"]
    assert f"end of turn {fam.end_of_turn!r}" in lines[0]
    assert f"gives back {len(EXAMPLES)} of {len(EXAMPLES)} references exactly" in lines[-1]
    if fam.before:
        n = pipe.encode(EXAMPLES[0]).before_tokens
        assert any("supervised before the answer in 3 of 3 examples" in x and f"({n} tokens)" in x for x in lines)


def test_a_model_that_emits_exactly_the_supervised_tokens_scores_one(family):
    name, fam, tok = family
    pipe = _pipeline(fam, tok, **fam.fix)
    prompts, script = [], {}
    for ex in EXAMPLES:
        enc = pipe.encode(ex)
        prompts.append(pipe.prompt_text(ex.text))
        script[tuple(enc.input_ids[: enc.prompt_tokens])] = [lab for lab in enc.labels if lab != IGNORE_INDEX]
    model = _model(tok, stop=pipe.stop_ids[-1])
    model.script = script
    raw: list[str] = []
    preds = generate_prompts(
        model,
        tok,
        prompts,
        Eval(max_new_tokens=64, batch_size=len(prompts)),
        device=torch.device("cpu"),
        autocast=contextlib.nullcontext,
        stop_ids=pipe.stop_ids,
        raw_out=raw,
    )
    assert preds == [ex.target for ex in EXAMPLES], (name, preds, raw)
    if fam.before:  # the raw generation keeps what the answer was parsed out of
        assert all(r.startswith(fam.before.strip()) or fam.before.strip() in r for r in raw), raw
    records = [{"id": e.id, "category": None, "reference": e.target, "prediction": p} for e, p in zip(EXAMPLES, preds)]
    recs, metrics = get_task("extraction").score(records, TaskConfig.make(["intent", "slots"]))
    assert all(r["correct"] for r in recs) and metrics["field_f1"] == 1.0, (name, metrics)


@pytest.mark.parametrize("answer_from", ["raw", r"NOTHING(?P<answer>x)"])
def test_the_think_block_is_scored_when_the_answer_is_read_raw_and_the_gold_chain_says_so(answer_from):
    fam = FAMILIES["qwen3"]
    tok = family_tokenizer(fam)
    pipe = TextPipeline(tok, Prompt(system=SYSTEM), 512, chat=ChatTemplate(tok), answer_from=answer_from)
    enc = pipe.encode(EXAMPLES[0])
    assert len(enc.faults) == 1 and f"eval.answer_from: {answer_from}" in enc.faults[0]
    lines = pipe.template_report([enc])["lines"]
    assert "gives back 0 of 1 references exactly; 1 lost by the template or the parsing, first r0" in lines[-1]
    assert any("model.chat_template_kwargs: {enable_thinking: false} removes it" in x for x in lines)


# chat data in the same matrix: a multi-turn conversation with its own system message (data30's ``format: chat``
# rows become examples whose context holds the earlier turns and the row's system message)
ROW_SYSTEM = "You sort requests into intents."
CHAT_EXAMPLES = [
    Example(
        id="c0",
        text="book a table for two in Paris tonight",
        target=json.dumps({"intent": "BookRestaurant", "slots": {"city": "Paris"}}),
        source="chat.jsonl:1",
        context=[
            {"role": "system", "content": ROW_SYSTEM},
            {"role": "user", "content": "what is the weather in Rome tomorrow"},
            {"role": "assistant", "content": json.dumps({"intent": "GetWeather", "slots": {}})},
        ],
    ),
    Example(
        id="c1",
        text="what is the weather in Rome tomorrow",
        target='{"intent": "GetWeather", "slots": {}}',
        source="chat.jsonl:2",
        context=[{"role": "system", "content": ROW_SYSTEM}],
    ),
]


def test_chat_examples_with_earlier_turns_and_their_own_system_message(family):
    name, fam, tok = family
    pipe = _pipeline(fam, tok, **fam.fix)
    eot = tok.convert_tokens_to_ids(fam.end_of_turn)
    prompts, script = [], {}
    for ex in CHAT_EXAMPLES:
        enc = pipe.encode(ex)
        assert enc.faults == [], (name, enc.faults)
        prompt = pipe.prompt_text(ex)
        # the row's system message replaces eval.prompt.system; the earlier turns are prompt context, not supervised
        assert ROW_SYSTEM in prompt and SYSTEM not in prompt and all(t["content"] in prompt for t in ex.context)
        sup = [lab for lab in enc.labels if lab != IGNORE_INDEX]
        assert sup[-1] == eot and sup.count(eot) == 1 and tok.decode(sup[enc.before_tokens : -1]).strip() == ex.target
        assert enc.input_ids[: enc.prompt_tokens] == tok(prompt, add_special_tokens=False)["input_ids"]
        prompts.append(prompt)
        script[tuple(enc.input_ids[: enc.prompt_tokens])] = sup
    model = _model(tok, stop=pipe.stop_ids[-1])
    model.script = script
    preds = generate_prompts(
        model,
        tok,
        prompts,
        Eval(max_new_tokens=64, batch_size=len(prompts)),
        device=torch.device("cpu"),
        autocast=contextlib.nullcontext,
        stop_ids=pipe.stop_ids,
    )
    records = [
        {"id": e.id, "category": None, "reference": e.target, "prediction": p} for e, p in zip(CHAT_EXAMPLES, preds)
    ]
    recs, metrics = get_task("extraction").score(records, TaskConfig.make(["intent", "slots"]))
    assert all(r["correct"] for r in recs) and metrics["field_f1"] == 1.0, (name, preds)


MULTI_TURN = Example(
    id="m0",
    text="book a table for two in Paris tonight",
    target=json.dumps({"intent": "BookRestaurant", "slots": {"city": "Paris"}}),
    source="chat.jsonl:3",
    context=[
        {"role": "user", "content": "what is the weather in Rome tomorrow"},
        {"role": "assistant", "content": json.dumps({"intent": "GetWeather", "slots": {}})},
    ],
)


def test_every_assistant_turn_supervised_with_one_end_of_turn_or_refused_naming_train_on_last(family):
    name, fam, tok = family
    pipe = _pipeline(fam, tok, **fam.fix)
    pipe.train_on = "all_assistant"
    enc = pipe.encode(MULTI_TURN)
    assert bool(enc.faults) != fam.all_assistant, (name, enc.faults)
    if not fam.all_assistant:  # history rendered unlike a fresh answer (harmony's <|end|> vs <|return|>)
        assert enc.faults and all("set data.chat.train_on: last" in f and "\n" not in f for f in enc.faults), (
            name,
            enc.faults,
        )
        return
    eot = tok.convert_tokens_to_ids(fam.end_of_turn)
    in_prompt = [lab for lab in enc.labels[: enc.prompt_tokens] if lab != IGNORE_INDEX]
    earlier = MULTI_TURN.context[1]["content"]
    assert in_prompt[-1] == eot and in_prompt.count(eot) == 1 and enc.context_supervised == len(in_prompt), name
    assert tok.decode(in_prompt[:-1]).strip() == earlier, name
    final = [lab for lab in enc.labels[enc.prompt_tokens :] if lab != IGNORE_INDEX]
    assert final.count(eot) == 1 and tok.decode(final[enc.before_tokens : -1]).strip() == MULTI_TURN.target


def test_a_template_that_writes_the_bos_gives_one_bos_where_the_tokenizer_adds_its_own(family):
    name, fam, tok = family
    if fam.bos is None or "bos_token" not in fam.template:
        pytest.skip("the template writes no bos")
    bos = tok.convert_tokens_to_ids(fam.bos)
    pipe = _pipeline(fam, tok, **fam.fix)
    enc = pipe.encode(EXAMPLES[0])
    assert enc.input_ids[0] == bos and enc.input_ids[1] != bos, name  # the template's one bos, not two
    if fam.add_bos:  # the tokenizer would add a second one if the prompt were tokenised with special tokens
        assert tok(pipe.prompt_text(EXAMPLES[0]))["input_ids"][:2] == [bos, bos]
    # what generation is given: the prompt's own tokens (add_special_tokens=False), so one bos there too
    model = _model(tok, stop=pipe.stop_ids[-1])
    seen = []
    model.script = {}
    original = model.forward

    def spy(input_ids=None, **kw):
        if input_ids.shape[1] > 1:
            seen.append(input_ids[0].tolist())
        return original(input_ids=input_ids, **kw)

    model.forward = spy
    generate_prompts(
        model,
        tok,
        [pipe.prompt_text(EXAMPLES[0])],
        Eval(max_new_tokens=2, batch_size=1),
        device=torch.device("cpu"),
        autocast=contextlib.nullcontext,
        stop_ids=pipe.stop_ids,
    )
    assert (
        seen and seen[0][:2] == enc.input_ids[:2] and seen[0][: enc.prompt_tokens] == enc.input_ids[: enc.prompt_tokens]
    )


def test_granite_writes_todays_date_without_a_system_message_and_the_pinned_clock_fixes_it():
    fam = FAMILIES["granite-3"]
    tok = family_tokenizer(fam)
    chat = ChatTemplate(tok)
    faults = TextPipeline(tok, Prompt(), 512, chat=chat).encode(EXAMPLES[0]).faults
    assert len(faults) == 1 and "injects text that changes between two renders" in faults[0]
    assert "model.chat_template_kwargs: {strftime_now: '2026-01-31'}" in faults[0]
    pinned = TextPipeline(tok, Prompt(), 512, chat=ChatTemplate(tok, kwargs={"strftime_now": "2026-01-31"}))
    enc = pinned.encode(EXAMPLES[0])
    assert enc.faults == [] and "Today's Date: January 31, 2026." in enc.text


def test_a_target_with_surrounding_whitespace_is_trained_as_the_template_writes_it(family):
    # TRL's standard completions start with a space (" blue."); templates that trim an answer (Llama-3, Gemma,
    # Mistral, Llama-2) write it without: the answer is found trimmed, not refused as dropped
    name, fam, tok = family
    pipe = _pipeline(fam, tok, **fam.fix)
    eot = tok.convert_tokens_to_ids(fam.end_of_turn)
    ex = Example(id="w", text=ROWS[1][0], target=" " + json.dumps(ROWS[1][1]) + "\n", source="d.jsonl:9")
    enc = pipe.encode(ex)
    assert enc.faults == [], (name, enc.faults)
    sup = [lab for lab in enc.labels if lab != IGNORE_INDEX]
    assert (
        sup[-1] == eot and sup.count(eot) == 1 and tok.decode(sup[enc.before_tokens : -1]).strip() == ex.target.strip()
    )
    assert enc.gold_answer == ex.target.strip()
    # an earlier answer with surrounding whitespace, every assistant turn trained: found as the template writes it
    pipe.train_on = "all_assistant"
    said = MULTI_TURN.context[1]["content"]
    spaced = Example(
        id="w2",
        text=MULTI_TURN.text,
        target=MULTI_TURN.target,
        context=[MULTI_TURN.context[0], {"role": "assistant", "content": f" {said}\n"}],
    )
    enc = pipe.encode(spaced)
    assert bool(enc.faults) != fam.all_assistant, (name, enc.faults)
    if not fam.all_assistant:  # history rendered unlike a fresh answer (see the all_assistant test)
        assert enc.faults and all("set data.chat.train_on: last" in f for f in enc.faults), (name, enc.faults)
        return
    in_prompt = [lab for lab in enc.labels[: enc.prompt_tokens] if lab != IGNORE_INDEX]
    assert in_prompt.count(eot) == 1 and tok.decode(in_prompt[:-1]).strip() == said, name
