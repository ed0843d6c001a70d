"""The chat data people bring (issue 30's cousins): TRL's prompt-completion rows (standard and conversational),
contents given as a list of parts, role spellings of the wild (ShareGPT's human/gpt/observation/function_call,
Gemma's model, capitalised roles), tool turns as prompt context (refused, naming the row, when the chat template
drops them), and Alpaca rows through ``data.fields.text: [instruction, input]``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tinymodels import CHATML, make_tokenizer
from tuneproof.data.chat import chat_summary
from tuneproof.data.examples import Example
from tuneproof.data.preprocess import TextPipeline
from tuneproof.data.sources import load_chat, load_hf, load_json_records, load_lines
from tuneproof.errors import TuneproofError
from tuneproof.study import FieldMap, Prompt


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_trl_prompt_completion_rows_standard_and_conversational(tmp_path):
    rows = [
        {"prompt": "The sky is", "completion": "blue."},
        {
            "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What color is it?"}],
            "completion": [{"role": "assistant", "content": "It is blue."}],
        },
    ]
    exs, _ = load_chat(_jsonl(tmp_path / "pc.jsonl", rows), FieldMap())
    assert [(e.text, e.target, e.context) for e in exs] == [
        ("The sky is", "blue.", []),
        ("What color is it?", "It is blue.", [{"role": "system", "content": "Be brief."}]),
    ]
    assert exs[1].system == "Be brief."


@pytest.mark.parametrize(
    ("row", "says"),
    [
        (
            {"prompt": [{"role": "user", "content": "q"}], "completion": [{"role": "assistant", "content": "a"}] * 2},
            "pc.jsonl:1: 'completion' holds 2 messages, not the one assistant answer",
        ),
        (
            {"prompt": "q", "completion": [{"role": "assistant", "content": "a"}]},
            "pc.jsonl:1: 'prompt' and 'completion' are str and list: both strings (standard) or both lists",
        ),
        (
            {"prompt": "q", "chosen": "a", "rejected": "b"},
            "pc.jsonl:1: a preference row (chosen and rejected answers): tuneproof fine-tunes and judges one answer",
        ),
        ({"prompt": "The sky is"}, "pc.jsonl:1: a prompt-only row: no answer to train or judge"),
    ],
)
def test_trl_rows_without_one_answer_are_refused_with_the_way_on(tmp_path, row, says):
    with pytest.raises(TuneproofError) as err:
        load_chat(_jsonl(tmp_path / "pc.jsonl", [row]), FieldMap())
    assert says in err.value.message and err.value.hint


def test_prompt_completion_rows_read_as_flat_rows_name_format_chat(tmp_path):
    path = _jsonl(tmp_path / "pc.jsonl", [{"prompt": "q", "completion": "a"}])
    with pytest.raises(TuneproofError) as err:
        load_json_records(path, FieldMap(), lines=True)
    assert "column 'text' not found (columns: prompt, completion)" in err.value.message
    assert err.value.hint == "these rows hold conversations (TRL prompt-completion): set format: chat (docs/data.md)"


def test_a_hf_dataset_of_prompt_completion_columns_is_read_as_chat(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [
        {"prompt": [{"role": "user", "content": f"q{i}"}], "completion": [{"role": "assistant", "content": f"a{i}"}]}
        for i in range(2)
    ]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    exs, _ = load_hf(tmp_path / "ds", FieldMap(), "train")
    assert [(e.id, e.text, e.target) for e in exs] == [("train:0", "q0", "a0"), ("train:1", "q1", "a1")]


def test_text_parts_are_joined_by_a_newline_and_a_non_text_part_is_refused_by_row(tmp_path):
    parts = [{"type": "text", "text": "Look at this."}, {"type": "input_text", "text": "What is it?"}]
    rows = [{"messages": [{"role": "user", "content": parts}, {"role": "assistant", "content": [parts[0]]}]}]
    exs, _ = load_chat(_jsonl(tmp_path / "p.jsonl", rows), FieldMap())
    assert (exs[0].text, exs[0].target) == ("Look at this.\nWhat is it?", "Look at this.")
    image = {"type": "image_url", "image_url": {"url": "cat.png"}}
    rows.append({"messages": [{"role": "user", "content": [parts[0], image]}, {"role": "assistant", "content": "a"}]})
    with pytest.raises(TuneproofError) as err:
        load_chat(_jsonl(tmp_path / "p.jsonl", rows), FieldMap())
    assert err.value.message == (
        f"{tmp_path / 'p.jsonl'}:2: messages[0].content[1] (user) is a 'image_url' part: only text parts "
        "(text, input_text, output_text) are trained"
    )


def test_role_spellings_of_the_wild_map_to_the_chat_roles(tmp_path):
    rows = [  # OpenHermes-2.5 writes weight null on every turn
        {
            "conversations": [
                {"from": "System", "value": "S", "weight": None},
                {"from": "HUMAN", "value": "q", "weight": None},
                {"from": "gpt", "value": "a", "weight": None},
            ]
        },
        {"messages": [{"role": "User", "content": "q"}, {"role": "model", "content": "a"}]},
        {"conversations": [{"from": "user", "value": "q"}, {"from": "bot", "value": "a"}]},
    ]
    exs, _ = load_chat(_jsonl(tmp_path / "r.jsonl", rows), FieldMap())
    assert [(e.system, e.text, e.target) for e in exs] == [("S", "q", "a"), (None, "q", "a"), (None, "q", "a")]


SHAREGPT_TOOLS = {
    "conversations": [
        {"from": "human", "value": "weather in Rome?"},
        {"from": "function_call", "value": json.dumps({"name": "get_weather", "arguments": {"city": "Rome"}})},
        {"from": "observation", "value": "sunny, 21 C"},
        {"from": "human", "value": "so, shorts?"},
        {"from": "gpt", "value": "yes"},
    ]
}


def test_tool_turns_are_prompt_context_with_the_call_as_tool_calls(tmp_path):
    (ex,), _ = load_chat(_jsonl(tmp_path / "t.jsonl", [SHAREGPT_TOOLS]), FieldMap())
    assert ex.context == [
        {"role": "user", "content": "weather in Rome?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}],
        },
        {"role": "tool", "content": "sunny, 21 C"},
    ]
    bad = {"conversations": [*SHAREGPT_TOOLS["conversations"][:4], {"from": "function_call", "value": "{}"}]}
    with pytest.raises(TuneproofError, match=r"t.jsonl:1: conversations\[4\] \(function_call\) is not a JSON object"):
        load_chat(_jsonl(tmp_path / "t.jsonl", [bad]), FieldMap())


TOOLS_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m.tool_calls %}{% for c in m.tool_calls %}"
    "<tool_call>{{ c.function.name }} {{ c.function.arguments | tojson }}</tool_call>{% endfor %}{% endif %}"
    "{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_template_that_renders_tool_turns_keeps_them_and_one_that_drops_them_is_a_fault_naming_the_row(tmp_path):
    (ex,), _ = load_chat(_jsonl(tmp_path / "t.jsonl", [SHAREGPT_TOOLS]), FieldMap())
    renders = TextPipeline(make_tokenizer(TOOLS_TEMPLATE), Prompt(), 256)
    enc = renders.encode(ex)
    assert enc.faults == [] and "sunny, 21 C" in enc.text and "<tool_call>get_weather" in enc.text
    drops = TextPipeline(make_tokenizer(CHATML), Prompt(), 256)  # renders the content only: the call is lost
    assert drops.encode(ex).faults == [
        f"the tool call 'get_weather' (row {tmp_path / 't.jsonl'}:1) does not appear in the rendered prompt (the chat "
        "template drops it): it would never be seen in training or inference; set model.chat_template to a template "
        "that renders it, or drop the tool turns from the rows (they are prompt context only)"
    ]


def test_a_row_ending_in_a_tool_call_or_after_a_tool_result_is_refused(tmp_path):
    ends_in_call = {"conversations": SHAREGPT_TOOLS["conversations"][:2]}
    after_tool = {"conversations": [*SHAREGPT_TOOLS["conversations"][:3], {"from": "gpt", "value": "yes"}]}
    with pytest.raises(TuneproofError) as err:
        load_chat(_jsonl(tmp_path / "t.jsonl", [ends_in_call, after_tool]), FieldMap())
    assert "t.jsonl:1: the last turn (conversations[1]) is a tool call, not the assistant answer" in err.value.message
    assert "t.jsonl:2: the final assistant turn follows 'tool', not a user turn" in err.value.message


def test_alpaca_rows_join_instruction_and_input_with_a_blank_line(tmp_path):
    rows = [
        {"instruction": "Give the capital.", "input": "France", "output": "Paris"},
        {"instruction": "Say hello.", "input": "", "output": "hello"},
    ]
    exs, _ = load_json_records(
        _jsonl(tmp_path / "a.jsonl", rows), FieldMap(text=["instruction", "input"], target="output"), lines=True
    )
    assert [(e.text, e.target) for e in exs] == [("Give the capital.\n\nFrance", "Paris"), ("Say hello.", "hello")]
    with pytest.raises(TuneproofError, match=r"a.jsonl:2: column 'context' not found"):
        load_json_records(tmp_path / "a.jsonl", FieldMap(text=["instruction", "context"], target="output"), lines=True)
    with pytest.raises(TuneproofError, match="format lines reads the text from one file, not a list of columns"):
        load_lines(tmp_path, FieldMap(text=["a", "b"]))
    with pytest.raises(ValueError, match="each once"):
        FieldMap(text=["input", "input"])


def test_the_alpaca_text_reaches_the_prompt_whole(tmp_path):
    ex = Example("a", "Give the capital.\n\nFrance", target="Paris")
    pipe = TextPipeline(make_tokenizer(), Prompt(), 128)
    assert "<|im_start|>user\nGive the capital.\n\nFrance<|im_end|>" in pipe.prompt_text(ex)


def test_openai_tool_calls_with_null_content_and_the_tool_call_id_are_kept(tmp_path):
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}
    row = {
        "messages": [
            {"role": "user", "content": "weather in Rome?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "sunny"},
            {"role": "user", "content": "shorts?"},
            {"role": "assistant", "content": "yes"},
        ]
    }
    (ex,), _ = load_chat(_jsonl(tmp_path / "o.jsonl", [row]), FieldMap())
    assert ex.context[1] == {"role": "assistant", "content": "", "tool_calls": [call]}
    assert ex.context[2] == {"role": "tool", "content": "sunny", "name": "get_weather", "tool_call_id": "call_1"}


def test_a_template_with_no_end_token_after_the_answer_names_both_ways_on():
    alpaca = (
        "{% for m in messages %}{% if m['role'] == 'user' %}### Instruction:\n{{ m['content'] }}\n\n"
        "{% elif m['role'] == 'assistant' %}### Response:\n{{ m['content'] }}\n\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}### Response:\n{% endif %}"
    )
    faults = TextPipeline(make_tokenizer(alpaca), Prompt(), 128).encode(Example("e", "hello world", target="a b c"))
    assert faults.faults == [
        "the end token '<|im_end|>' (auto: eos (the chat template puts no special token after an assistant's "
        "content)) is not supervised (the model would never learn to stop): set model.end_of_turn to the one token "
        "the chat template puts after an assistant's answer, or model.chat_template to a template that puts one "
        "there (such as {{ eos_token }})"
    ]


def test_a_row_level_system_prompt_is_the_rows_system_message_and_reasoning_is_never_dropped(tmp_path):
    turns = [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]
    (ex,), _ = load_chat(_jsonl(tmp_path / "s.jsonl", [{"conversations": turns, "system": "Be brief."}]), FieldMap())
    assert ex.system == "Be brief." and (ex.text, ex.target) == ("q", "a")
    both = {"conversations": [{"from": "system", "value": "S"}, *turns], "system": "Be brief."}
    with pytest.raises(TuneproofError, match=r"s.jsonl:1: two system messages: the row's 'system' and conversations"):
        load_chat(_jsonl(tmp_path / "s.jsonl", [both]), FieldMap())
    thought = {
        "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning_content": "hm"}]
    }
    with pytest.raises(TuneproofError) as err:
        load_chat(_jsonl(tmp_path / "s.jsonl", [thought]), FieldMap())
    assert err.value.message.endswith(
        "s.jsonl:1: messages[1] (assistant) has a 'reasoning_content' that would be left out of training"
    )
    empty = {
        "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning_content": ""}]
    }
    assert load_chat(_jsonl(tmp_path / "s.jsonl", [empty]), FieldMap())[0][0].target == "a"


def test_developer_role_an_empty_system_message_and_openai_weight_zero(tmp_path):
    rows = [
        {
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": "q"},
                _assistant("a"),
            ]
        },
        {"messages": [{"role": "system", "content": ""}, {"role": "user", "content": "q"}, _assistant("a")]},
    ]
    exs, _ = load_chat(_jsonl(tmp_path / "w.jsonl", rows), FieldMap())
    assert [e.system for e in exs] == ["Be brief.", ""]
    # the empty system message is rendered as the template renders one (not replaced by eval.prompt.system)
    pipe = TextPipeline(make_tokenizer(), Prompt(system="Default."), 256)
    assert pipe.prompt_text(exs[1]).startswith("<|im_start|>system\n<|im_end|>\n<|im_start|>user\nq")

    said = {"messages": [{"role": "user", "content": "hello world"}, {**_assistant("x y z"), "weight": 0}]}
    row = {"messages": [*said["messages"], {"role": "user", "content": "a b c"}, _assistant("hello world")]}
    (ex,), _ = load_chat(_jsonl(tmp_path / "w.jsonl", [row]), FieldMap())
    assert ex.context[1] == {"role": "assistant", "content": "x y z", "weight": 0}
    every = TextPipeline(make_tokenizer(), Prompt(), 256, train_on="all_assistant")
    enc = every.encode(ex)
    assert enc.faults == [] and enc.context_supervised == 0  # weight 0: context only, even under all_assistant
    unweighted = every.encode(ex.__class__(**{**ex.__dict__, "context": [ex.context[0], _assistant("x y z")]}))
    assert unweighted.context_supervised > 0
    with pytest.raises(TuneproofError, match=r"w.jsonl:1: the final assistant turn \(messages\[1\]\) has weight 0"):
        load_chat(_jsonl(tmp_path / "w.jsonl", [said]), FieldMap())


def _assistant(text):
    return {"role": "assistant", "content": text}


def test_a_flat_hf_dataset_with_a_prompt_column_is_mapped_by_fields_not_refused_as_prompt_only(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list([{"prompt": "q", "response": "a"}]).save_to_disk(str(tmp_path / "ds"))
    with pytest.raises(TuneproofError) as err:
        load_hf(tmp_path / "ds", FieldMap(), "train")
    assert "column 'text' not found (columns: prompt, response)" in err.value.message
    assert err.value.hint.startswith("fix data.fields")
    exs, _ = load_hf(tmp_path / "ds", FieldMap(text="prompt", target="response"), "train")
    assert [(e.text, e.target) for e in exs] == [("q", "a")]


def test_turns_stored_as_json_text_are_read(tmp_path):
    turns = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    rows = [{"messages": json.dumps(turns)}, {"messages": "[{oops"}]
    with pytest.raises(TuneproofError) as err:
        load_chat(_jsonl(tmp_path / "j.jsonl", rows), FieldMap())
    assert err.value.message.startswith(
        f"{tmp_path / 'j.jsonl'}:2: 'messages' is text that is not a JSON list of turns"
    )
    (ex,), _ = load_chat(_jsonl(tmp_path / "j.jsonl", rows[:1]), FieldMap())
    assert (ex.text, ex.target) == ("q", "a")


def test_the_chat_line_counts_the_conversations_with_tool_turns(tmp_path):
    plain = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    exs, _ = load_chat(_jsonl(tmp_path / "t.jsonl", [SHAREGPT_TOOLS, plain]), FieldMap())
    summary = chat_summary({"train": exs}, {"train": []}, "last")
    assert summary["with_tool_turns"] == 1 and summary["multi_turn"] == 1
    assert (
        "2 conversations (0 with their own system message, 1 multi-turn, up to 5 turns, 1 with tool turns in the "
        in (summary["line"])
    )
