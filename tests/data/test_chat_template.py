"""Issue 30 items 2-4: the chat template as the model family writes it (``data/chat_template.py``): the study's keys
(``model.chat_template``, ``model.chat_template_kwargs``, ``model.end_of_turn``, ``eval.answer_from``), template errors
as one line (never a traceback, through the CLI too), the system role, answers parsed out of think blocks and
channels, and the faults found before any compute."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from chat_families import FAMILIES, family_tokenizer
from tinymodels import CHATML, make_tokenizer
from tuneproof.cli import main
from tuneproof.context import parse_study
from tuneproof.data.chat_template import (
    ChatTemplate,
    fold_system,
    load_template_text,
    parse_answer,
    regex_miss,
    split_generation,
)
from tuneproof.data.examples import Example
from tuneproof.data.preprocess import TextPipeline
from tuneproof.errors import TuneproofError
from tuneproof.evaluation.fingerprint import eval_fingerprint
from tuneproof.registry import Registry
from tuneproof.study import Eval, Prompt

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))  # tiny_study

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer(CHATML)


# --------------------------------------------------------------------------- answers
@pytest.mark.parametrize(
    ("raw", "answer_from", "want"),
    [
        ('<think>\n\n</think>\n\n{"a": 1}', "auto", '{"a": 1}'),
        ('let me see\n</think>\n\n{"a": 1}', "auto", '{"a": 1}'),  # the prompt opened the block
        ("<think>\nstill thinking", "auto", ""),  # no answer yet
        (
            '<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>final<|message|>{"a": 1}',
            "auto",
            '{"a": 1}',
        ),
        ('<|channel|>final<|message|>{"a": 1}<|return|>', "auto", '{"a": 1}'),
        ('{"a": 1}', "auto", "PLAIN"),
        ('<think>\n\n</think>\n\n{"a": 1}', "raw", "PLAIN"),
        ("Answer: yes.", r"Answer: (\w+)", "yes"),
        ("Answer: yes.", r"Answer: (?P<answer>\w+)\.", "yes"),
        ("nothing here", r"Answer: (\w+)", ""),
    ],
)
def test_parse_answer(raw, answer_from, want):
    specials = ["<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|return|>"]
    assert parse_answer(raw, "PLAIN", answer_from, specials) == want


@pytest.mark.parametrize(
    ("answer_from", "why"),
    [
        ("ZZZ", "the expression does not match"),
        (r"(x)?(\{.*\})", "its group 1 takes no part in the match: name the answer's group (?P<answer>...)"),
        ("a*", "the whole match is empty (at character 0)"),
        (r"(?P<answer>\s*)\{", "its group 'answer' is empty (at character 0)"),
    ],
)
def test_the_gold_chain_says_why_a_regular_expression_reads_no_answer(tok, answer_from, why):
    pipe = TextPipeline(tok, Prompt(), 128, answer_from=answer_from)
    enc = pipe.encode(Example(id="e", text="hello world", target='{"intent": "PlayMusic"}'))
    assert enc.faults == [
        f"the supervised answer, decoded and parsed as the evaluation does (eval.answer_from: {answer_from}: {why}), "
        "gives '', not the reference '{\"intent\":·\"PlayMusic\"}': a model that learned exactly its training "
        "tokens would be scored wrong"
    ]
    assert regex_miss('{"intent": "PlayMusic"}', r"(?P<answer>\{.*\})") is None  # it reads the answer


def test_a_generation_is_cut_at_its_first_stop_token_and_keeps_its_channel_markers():
    tok = family_tokenizer(FAMILIES["harmony"])
    ids = tok('<|channel|>final<|message|>{"intent": "GetWeather"}', add_special_tokens=False)["input_ids"]
    ret = tok.convert_tokens_to_ids("<|return|>")
    tail = tok("junk", add_special_tokens=False)["input_ids"]
    raw, answer = split_generation(tok, ids + [ret] + tail, [ret], "auto")
    assert raw == '<|channel|>final<|message|>{"intent": "GetWeather"}' and answer == '{"intent": "GetWeather"}'
    # decoded without the markers (the old decode) the answer read 'final{...}': every prediction invalid
    assert tok.decode(ids, skip_special_tokens=True).startswith("final{")


# --------------------------------------------------------------------------- the keys
def test_answer_from_must_be_auto_raw_or_a_regular_expression():
    assert Eval(answer_from=r"Answer: (\w+)").answer_from == r"Answer: (\w+)"
    with pytest.raises(ValueError, match="neither auto, raw nor a valid regular expression"):
        Eval(answer_from="Answer: (")


def test_the_template_settings_are_part_of_the_evaluation_fingerprint():
    base = eval_fingerprint(["a"], Eval(), "extraction", None, {"x": 1})
    same = eval_fingerprint(["a"], Eval(), "extraction", None, {"x": 1}, chat_template={})
    kw = eval_fingerprint(
        ["a"], Eval(), "extraction", None, {"x": 1}, chat_template={"kwargs": {"enable_thinking": False}}
    )
    parsed = eval_fingerprint(["a"], Eval(answer_from="raw"), "extraction", None, {"x": 1})
    assert base == same  # the defaults keep fingerprints recorded before these keys existed
    assert kw["hash"] != base["hash"] and [p for p in kw["parts"] if kw["parts"][p] != base["parts"][p]] == ["prompt"]
    assert [p for p in parsed["parts"] if parsed["parts"][p] != base["parts"][p]] == ["metrics"]


def test_chat_template_kwargs_reach_every_render_and_a_pinned_clock_pins_the_date():
    fam = FAMILIES["smollm3"]
    tok = family_tokenizer(fam)
    msgs = [{"role": "user", "content": "hi"}]
    chat = ChatTemplate(tok, None, {"enable_thinking": False, "strftime_now": "2026-01-31"})
    prompt = chat.render(msgs, True)
    assert "Today Date: 31 January 2026" in prompt and "Reasoning Mode: /no_think" in prompt
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n") and chat.injected(msgs) is None
    assert ChatTemplate(tok).injected(msgs)["first"] != ChatTemplate(tok).injected(msgs)["second"]
    with pytest.raises(TuneproofError, match=r"model.chat_template_kwargs.strftime_now: 'today' is not a date"):
        ChatTemplate(tok, None, {"strftime_now": "today"})


def test_model_chat_template_overrides_the_tokenizers_from_a_file_or_inline(tmp_path, tok):
    (tmp_path / "t.jinja").write_text(
        "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}<|im_end|>{% endfor %}"
    )
    text = load_template_text("t.jinja", tmp_path)
    chat = ChatTemplate(tok, text)
    assert chat.overridden and chat.render([{"role": "user", "content": "x"}], True) == "[user]x<|im_end|>"
    assert load_template_text("{{ 'inline' }}") == "{{ 'inline' }}"
    with pytest.raises(TuneproofError, match=r"model.chat_template: cannot read the template file .*nope.jinja"):
        load_template_text("nope.jinja", tmp_path)


def test_end_of_turn_auto_finds_the_turn_token_and_a_named_one_must_be_a_token():
    fam = FAMILIES["gemma-2"]
    tok = family_tokenizer(fam)
    chat = ChatTemplate(tok)
    assert (chat.end_of_turn, tok.eos_token) == ("<end_of_turn>", "<eos>")
    assert chat.stop_ids == [tok.convert_tokens_to_ids("<end_of_turn>"), tok.eos_token_id]
    assert ChatTemplate(tok, end_of_turn="<eos>").end_of_turn == "<eos>"
    with pytest.raises(TuneproofError, match=r"model.end_of_turn: '<end_of_tur>' is not a token") as err:
        ChatTemplate(tok, end_of_turn="<end_of_tur>")
    assert "<end_of_turn>" in str(err.value)
    # a named end of turn the template does not put after the answer: the data check says which key to set
    pipe = TextPipeline(tok, Prompt(), 128, chat=ChatTemplate(tok, end_of_turn="<eos>"))
    fault = pipe.encode(Example("e", "hello world", target="a b c")).faults[0]
    assert "the end token '<eos>' (model.end_of_turn) is not supervised" in fault and "set model.end_of_turn" in fault


# --------------------------------------------------------------------------- the system role
def test_a_template_without_system_role_gets_the_system_folded_into_the_first_user_turn():
    tok = family_tokenizer(FAMILIES["gemma-2"])
    pipe = TextPipeline(tok, Prompt(system="Be brief."), 128)
    assert pipe.chat.system_role == "folded"
    assert pipe.prompt_text("hello world") == (
        "<bos><start_of_turn>user\nBe brief.\n\nhello world<end_of_turn>\n<start_of_turn>model\n"
    )
    assert fold_system([{"role": "system", "content": "S"}]) == [{"role": "user", "content": "S"}]
    empty = [{"role": "system", "content": " "}, {"role": "user", "content": "hello world"}]  # no blank head
    assert fold_system(empty) == [{"role": "user", "content": "hello world"}]


def test_a_template_that_drops_the_system_message_is_a_fault_naming_it(tok):
    dropping = CHATML.replace("{% for m in messages %}", "{% for m in messages if m['role'] != 'system' %}")
    pipe = TextPipeline(make_tokenizer(dropping), Prompt(system="Reply with JSON only."), 128)
    assert pipe.chat.system_role == "dropped"
    faults = pipe.encode(Example("e", "hello world", target="a b c")).faults
    assert faults == [
        "the system message 'Reply·with·JSON·only.' does not appear in the rendered prompt (the chat template drops "
        "it): it would never be seen in training or inference; set model.chat_template to a template that renders "
        "it, or remove it"
    ]


# --------------------------------------------------------------------------- faults before compute
def test_end_of_turn_text_inside_a_target_or_an_input_is_a_fault_naming_the_row(tok):
    pipe = TextPipeline(tok, Prompt(), 128)
    enc = pipe.encode(Example("e7", "hello world", target="a b<|im_end|> c", source="d.jsonl:7"))
    assert enc.faults[0] == (
        "the target holds the text of the special token '<|im_end|>' (the end of turn) (row d.jsonl:7): the "
        "tokenizer turns it into that token, so the answer ends there and the model learns to stop early; remove or "
        "escape it in the data"
    )
    enc = pipe.encode(Example("e8", "hello <|im_start|>system world", target="a", source="d.jsonl:8"))
    assert "the input holds the text of the special token '<|im_start|>' (row d.jsonl:8)" in enc.faults[0]


def test_end_of_turn_inside_an_input_or_a_context_turn_says_the_turn_is_cut_not_that_the_answer_stops(tok):
    # issue fix item 8: each place says what really happens there
    pipe = TextPipeline(tok, Prompt(), 128)
    enc = pipe.encode(Example("e9", "hello<|im_end|> world", target="a", source="d.jsonl:9"))
    assert enc.faults[0] == (
        "the input holds the text of the special token '<|im_end|>' (the end of turn) (row d.jsonl:9): the "
        "tokenizer turns it into that token, so the prompt's user turn is cut short there: the model sees a turn "
        "boundary inside the user's text, in training and at inference; remove or escape it in the data"
    )
    context = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes<|im_end|> no"}]
    enc = pipe.encode(Example("e10", "hello world", target="a", source="d.jsonl:10", context=context))
    assert enc.faults[0] == (
        "the assistant turn of its context holds the text of the special token '<|im_end|>' (the end of turn) "
        "(row d.jsonl:10): the tokenizer turns it into that token, so that assistant turn is cut short there: the "
        "model sees a turn boundary inside the assistant's text, in training and at inference; remove or escape it "
        "in the data"
    )
    assert not any("stop early" in f for f in enc.faults)


def test_a_template_that_ignores_add_generation_prompt_is_one_fault_naming_it_not_a_switch(tok):
    # issue fix item 3: ChatML written without the generation prompt (the header is never rendered at the end)
    no_generation_prompt = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    )
    pipe = TextPipeline(make_tokenizer(no_generation_prompt), Prompt(), 128)
    encoded = [
        pipe.encode(Example(f"e{i}", f"hello world {i}", target='{"a": 1}', source=f"d.jsonl:{i}")) for i in (1, 2)
    ]
    assert encoded[0].faults == [
        "the chat template renders no generation prompt (the prompt with add_generation_prompt=True equals the "
        "prompt without it): the inference prompt ends without the assistant's role header "
        "'<|im_start|>assistant\\n' that the training text puts before the answer, so the model is trained to write "
        "that header first and the evaluation reads it as part of the answer; set model.chat_template to a template "
        "that renders the generation prompt when add_generation_prompt is true"
    ]
    assert encoded[0].notes == []  # no "also trained to generate" note beside the fault
    lines = pipe.template_report(encoded)["lines"]
    assert lines[1] == (
        f"supervised before the answer in 2 of 2 examples: '<|im_start|>assistant\\n' ({encoded[0].before_tokens} "
        "tokens), the role header the inference prompt lacks: the chat template renders no generation prompt (see "
        "faults)"
    )
    assert encoded[0].before_tokens > 0
    assert not any("offers no switch" in line for line in lines)
    assert lines[2].endswith("gives back 0 of 2 references exactly; 2 lost by the template or the parsing, first e1")
    # the same template with its generation prompt: no such fault
    fine = TextPipeline(tok, Prompt(), 128).encode(Example("e1", "hello world", target='{"a": 1}'))
    assert fine.faults == []


def test_a_template_error_is_one_line_naming_the_template_and_the_example(tok):
    picky = CHATML.replace(
        "{% for m in messages %}",
        "{% for m in messages %}{% if 'Rome' in m['content'] %}{{ raise_exception('no Rome here') }}{% endif %}",
    )
    pipe = TextPipeline(make_tokenizer(picky), Prompt(), 128)
    with pytest.raises(TuneproofError) as err:
        pipe.encode(Example("e3", "the weather in Rome", target="x", source="d.jsonl:3"))
    assert err.value.message == (
        "example e3 (row d.jsonl:3): the tokenizer's chat template fails on the messages user "
        "(add_generation_prompt=True): TemplateError: no Rome here"
    )
    with pytest.raises(TuneproofError, match="does not compile: TemplateSyntaxError"):
        TextPipeline(make_tokenizer("{% for m in messages %}"), Prompt(), 128)


def _study(tmp_path, tiny_base, **model):
    from tiny_study import make_study

    folder = make_study(tmp_path / "s", tiny_base, prepare=False)
    cfg = yaml.safe_load((folder / "tuneproof.yaml").read_text())
    cfg["model"].update(model)
    cfg["eval"]["prompt"]["system"] = "Extract the intent."
    (folder / "tuneproof.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    parse_study(cfg)
    return folder


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    from tiny_study import build_base

    return build_base(tmp_path_factory.mktemp("tiny-llama"))


@pytest.mark.parametrize("command", [["data", "check"], ["data", "inspect"], ["baseline"]])
def test_a_raising_template_ends_every_command_in_one_line_exit_2(tmp_path, tiny_base, capsys, command):
    folder = _study(tmp_path, tiny_base, chat_template="{{ raise_exception('System role not supported') }}")
    with pytest.raises(SystemExit) as exit_:
        main([*command, "--study", str(folder)])
    out = capsys.readouterr()
    text = out.out + out.err
    assert exit_.value.code == 2, text
    assert "Traceback" not in text
    assert (
        "model.chat_template fails on the messages user (add_generation_prompt=True): TemplateError: System role "
        "not supported" in text
    )
    reg = Registry(folder)
    assert not [r for r in reg.list() if r.status == "completed"]
    reg.close()


def test_the_data_check_names_the_template_its_end_of_turn_and_the_gold_chain(tmp_path, tiny_base, capsys):
    from tiny_study import CHAT_TEMPLATE

    folder = _study(tmp_path, tiny_base, chat_template=CHAT_TEMPLATE, chat_template_kwargs={"unused": 1})
    with pytest.raises(SystemExit) as exit_:
        main(["data", "check", "--study", str(folder)])
    text = capsys.readouterr().out
    assert exit_.value.code == 0, text
    assert "chat template: model.chat_template (sha256 " in text and "model.chat_template_kwargs {'unused': 1}" in text
    assert "end of turn '<|end|>'" in text and "gold chain (eval.answer_from auto)" in text
    with pytest.raises(SystemExit) as exit_:
        main(["data", "inspect", "--study", str(folder)])
    text = capsys.readouterr().out
    assert exit_.value.code == 0 and "chat template: model.chat_template (sha256 " in text, text


def test_verify_generates_with_the_studys_stop_tokens_and_answer_parsing():
    from types import SimpleNamespace

    from tuneproof.recipes.export import generation_stops

    tok = family_tokenizer(FAMILIES["gemma-2"])
    eot = tok.convert_tokens_to_ids("<end_of_turn>")

    def ctx(pipe, answer_from="auto"):
        return SimpleNamespace(pipeline=pipe, tokenizer=tok, study=SimpleNamespace(eval=Eval(answer_from=answer_from)))

    assert generation_stops(ctx(TextPipeline(tok, Prompt(), 64))) == {"stop_ids": [eot, tok.eos_token_id]}
    eos_only = TextPipeline(tok, Prompt(), 64, chat=ChatTemplate(tok, end_of_turn="<eos>"))
    assert generation_stops(ctx(eos_only)) == {}  # the procedure of older bundles, unchanged
    assert generation_stops(ctx(eos_only, "raw")) == {"answer_from": "raw"}


def test_outputs_keep_the_raw_generation_beside_the_scored_answer(tmp_path, tiny_base, capsys):
    import json

    from tiny_study import CHAT_TEMPLATE

    # whatever the model generates is its raw output (special tokens kept, cut at the stop token); the prediction is
    # what eval.answer_from reads out of it (auto, no think block or channel here: the generation itself)
    folder = _study(tmp_path, tiny_base, chat_template=CHAT_TEMPLATE)
    for command in (["data", "check"], ["baseline"]):
        with pytest.raises(SystemExit) as exit_:
            main([*command, "--study", str(folder)])
        assert exit_.value.code == 0, capsys.readouterr().out
    reg = Registry(folder)
    run = reg.latest("baseline")
    rows = [json.loads(line) for line in (folder / "runs" / run.id / "outputs.jsonl").read_text().splitlines()]
    reg.close()
    assert rows and all({"raw", "prediction"} <= set(r) for r in rows)
    plain = [r for r in rows if "<|" not in r["raw"]]
    assert plain and all(r["prediction"] == r["raw"] for r in plain)


def test_a_template_file_that_does_not_compile_is_named_with_its_line(tok):
    broken = CHATML.replace("{% endfor %}", "{% endfo %}")  # on the third line, after two newlines
    with pytest.raises(TuneproofError) as err:
        ChatTemplate(tok, broken, source="templates/chat.jinja")
    assert err.value.message.startswith(
        "model.chat_template templates/chat.jinja line 3 does not compile: TemplateSyntaxError: Encountered unknown "
        "tag 'endfo'."
    )


def test_a_kwarg_every_render_gives_is_refused_in_the_study_file():
    from tuneproof.study import ModelSpec

    with pytest.raises(ValueError, match="'messages' is given to the template by every render"):
        ModelSpec(base="b", chat_template_kwargs={"messages": [], "enable_thinking": False})
    assert ModelSpec(base="b", chat_template_kwargs={"enable_thinking": False}).chat_template_kwargs == {
        "enable_thinking": False
    }


@pytest.mark.parametrize(
    "loop",
    [
        "{% for i in range(99999) %}{% for j in range(99999) %}x{% endfor %}{% endfor %}",  # writes without end
        "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}",  # writes nothing
    ],
)
def test_a_template_that_loops_is_stopped_with_one_line(tok, monkeypatch, loop):
    import time

    import tuneproof.data.chat_template as ct

    monkeypatch.setattr(ct, "RENDER_LIMIT_S", 0.5)
    started = time.monotonic()
    with pytest.raises(TuneproofError) as err:
        ChatTemplate(tok, loop + CHATML)
    assert time.monotonic() - started < 5
    assert "model.chat_template renders more than 16 M characters or for more than 0.5 s" in err.value.message
    assert err.value.message.endswith(": a loop that does not end")
    import signal

    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # the timer is off again
