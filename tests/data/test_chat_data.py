"""Chat data (``format: chat``, issue 30 item 1): conversations read into examples (messages and ShareGPT
layouts, JSON Lines, JSON and Parquet), bad rows refused together by file:line, the prompt context in
every rendered prompt, the fingerprint and the duplicate text, and ``data.chat.train_on`` per turn."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tinymodels import make_tokenizer
from tuneproof.data.chat import chat_summary
from tuneproof.data.dedup import find_duplicates
from tuneproof.data.examples import Example
from tuneproof.data.preprocess import IGNORE_INDEX, TextPipeline
from tuneproof.data.sources import load_chat, load_hf, load_parquet, load_source
from tuneproof.errors import TuneproofError
from tuneproof.study import ChatData, FieldMap, Prompt, Source

SYS = {"role": "system", "content": "Answer in one word."}


def _u(c):
    return {"role": "user", "content": c}


def _a(c):
    return {"role": "assistant", "content": c}


ROWS = [
    {"messages": [_u("hello there"), _a("hi")]},  # single turn
    {"messages": [SYS, _u("what is 2+2"), _a("four")]},  # its own system message
    {"messages": [_u("name a colour"), _a("red"), _u("another one"), _a("blue")]},  # multi-turn
]


def _write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_messages_rows_become_examples_with_their_context(tmp_path):
    exs, _ = load_chat(_write_jsonl(tmp_path / "c.jsonl", ROWS), FieldMap())
    assert [(e.id, e.text, e.target, e.source) for e in exs] == [
        ("c:1", "hello there", "hi", f"{tmp_path / 'c.jsonl'}:1"),
        ("c:2", "what is 2+2", "four", f"{tmp_path / 'c.jsonl'}:2"),
        ("c:3", "another one", "blue", f"{tmp_path / 'c.jsonl'}:3"),
    ]
    assert exs[0].context == [] and exs[0].system is None
    assert exs[1].context == [SYS] and exs[1].system == "Answer in one word."
    assert exs[2].context == [_u("name a colour"), _a("red")] and exs[2].system is None
    assert exs[2].dedup_text() == "user: name a colour\nassistant: red\nanother one"


def test_sharegpt_rows_are_read_by_the_same_reader(tmp_path):
    rows = [
        {
            "conversations": [
                {"from": "system", "value": "Be brief."},
                {"from": "human", "value": "q1"},
                {"from": "gpt", "value": "a1"},
                {"from": "human", "value": "q2"},
                {"from": "gpt", "value": "a2"},
            ]
        }
    ]
    (ex,), _ = load_chat(_write_jsonl(tmp_path / "s.jsonl", rows), FieldMap())
    assert (ex.text, ex.target) == ("q2", "a2")
    assert ex.context == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1"},
    ]


def test_a_json_list_and_a_parquet_file_of_chat_rows(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    (tmp_path / "c.json").write_text(json.dumps(ROWS))
    from_json, _ = load_chat(tmp_path / "c.json", FieldMap())
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "c.parquet")
    from_parquet, _ = load_chat(tmp_path / "c.parquet", FieldMap())
    assert [e.id for e in from_json] == [e.id for e in from_parquet] == ["c:0", "c:1", "c:2"]
    assert [(e.text, e.target, e.context) for e in from_json] == [(e.text, e.target, e.context) for e in from_parquet]
    assert from_parquet[1].source == f"{tmp_path / 'c.parquet'}#1"
    with pytest.raises(TuneproofError, match="reads .jsonl, .json or .parquet files, not '.csv'"):
        load_chat(tmp_path / "c.csv", FieldMap())


def test_bad_rows_are_refused_together_by_file_and_line(tmp_path):
    rows = [
        ROWS[0],
        {"messages": [{"content": "no role"}, _a("x")]},
        {"messages": [_u("q"), _a("a"), _u("unanswered")]},
        {"messages": [_u("   "), _a("a")]},
        {"messages": [_u("q"), {"role": "narrator", "content": "{}"}, _a("a")]},
        {"messages": [_u("q"), SYS, _a("a")]},
        {"text": "not a chat row"},
        ROWS[2],
    ]
    path = _write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(TuneproofError) as err:
        load_chat(path, FieldMap())
    msg = err.value.message
    assert msg.startswith(f"{path}: 6 rows refused: ")
    assert f"{path}:2: messages[0] has no 'role'" in msg
    assert f"{path}:3: the last turn (messages[2]) is 'user', not the assistant answer" in msg
    assert f"{path}:4: messages[0] (user) has an empty content" in msg
    assert f"{path}:5: messages[1]: unknown role 'narrator' (known, any case: system, developer, user, human" in msg
    assert f"{path}:6: messages[1] is a system message after the first turn" in msg
    assert (
        f"{path}:7: no 'messages' or 'conversations' list of turns, nor 'prompt' and 'completion' (keys: text)" in msg
    )
    assert "more" not in msg


def test_past_twenty_refused_rows_the_error_names_a_file_listing_them_all(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    rows = [ROWS[0]] + [{"messages": [_u("q"), _a("a"), _u("unanswered")]} for _ in range(24)]
    rows.append({"messages": [SYS, _a("a")]})  # a second reason: each row named with its own
    path = _write_jsonl(tmp_path / "many.jsonl", rows)
    with pytest.raises(TuneproofError) as err:
        load_chat(path, FieldMap())
    msg = err.value.message
    assert msg.startswith(f"{path}: 25 rows refused: {path}:2, {path}:3, ")
    assert f"{path}:21: the last turn" in msg and f"{path}:22" not in msg  # the first 20 named here
    listed = Path(msg.rsplit(" listed in ", 1)[1])
    assert msg.endswith(f"; and 5 more, all 25 listed in {listed}") and listed.parent.parent == tmp_path / "tmp"
    lines = listed.read_text().splitlines()
    assert len(lines) == 25
    assert lines[-2] == f"{path}:25: the last turn (messages[2]) is 'user', not the assistant answer"
    assert lines[-1].startswith(f"{path}:26: the final assistant turn follows 'system'")


def test_past_twenty_rows_refused_for_one_reason_the_reason_is_said_once_first(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    rows = [ROWS[0]] + [{"messages": [_u("q"), _a("a"), _u("unanswered")]} for _ in range(25)]
    path = _write_jsonl(tmp_path / "many.jsonl", rows)
    with pytest.raises(TuneproofError) as err:
        load_chat(path, FieldMap())
    msg = err.value.message
    listed = Path(msg.rsplit(" listed in ", 1)[1].rstrip(")"))
    assert msg == (
        f"{path}: all 25 rows refused have the same fault: the last turn (messages[2]) is 'user', not the assistant "
        f"answer ({path}:2, {path}:3, {path}:4, {path}:5, {path}:6 and 20 more, all 25 listed in {listed})"
    )
    lines = listed.read_text().splitlines()
    assert len(lines) == 25 and lines[0] == f"{path}:2: the last turn (messages[2]) is 'user', not the assistant answer"
    assert lines[-1] == f"{path}:26: the last turn (messages[2]) is 'user', not the assistant answer"


def test_an_assistant_turn_that_answers_no_user_and_a_flat_field_are_refused(tmp_path):
    path = _write_jsonl(tmp_path / "c.jsonl", [{"messages": [SYS, _a("a")]}])
    with pytest.raises(TuneproofError, match=r"c.jsonl:1: the final assistant turn follows 'system', not a user turn"):
        load_chat(path, FieldMap())
    with pytest.raises(TuneproofError, match="data.fields.text does not apply to format 'chat'"):
        load_chat(_write_jsonl(tmp_path / "d.jsonl", ROWS), FieldMap(text="prompt"))


def test_label_and_id_keys_and_another_turns_key(tmp_path):
    rows = [{"dialog": r["messages"], "topic": t, "uid": f"u{i}"} for i, (r, t) in enumerate(zip(ROWS, "abc"))]
    exs, _ = load_chat(
        _write_jsonl(tmp_path / "c.jsonl", rows), FieldMap(label="topic", id="uid"), ChatData(messages="dialog")
    )
    assert [(e.id, e.label) for e in exs] == [("u0", "a"), ("u1", "b"), ("u2", "c")]
    with pytest.raises(
        TuneproofError,
        match=r"3 rows refused: .*c.jsonl:3: no 'messages' or 'conversations' list of turns, nor 'prompt' and "
        r"'completion' \(keys: dialog, topic",
    ):
        load_chat(tmp_path / "c.jsonl", FieldMap())


def test_flat_parquet_rows_are_mapped_by_fields(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    pq.write_table(pa.Table.from_pylist([{"q": "a", "y": "x"}, {"q": "b", "y": None}]), tmp_path / "f.parquet")
    with pytest.raises(TuneproofError, match=r"f.parquet#1: empty label in column 'y'"):
        load_parquet(tmp_path / "f.parquet", FieldMap(text="q", label="y"))
    exs, _ = load_source(Source(path="f.parquet", format="parquet"), FieldMap(text="q"), tmp_path)
    assert [(e.id, e.text) for e in exs] == [("f:0", "a"), ("f:1", "b")]
    (tmp_path / "junk.parquet").write_text("not parquet")
    with pytest.raises(TuneproofError, match="junk.parquet: not a readable Parquet file"):
        load_parquet(tmp_path / "junk.parquet", FieldMap())


def test_hf_reads_a_saved_dataset_and_a_data_files_folder_and_refuses_an_unpinned_id(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(ROWS), "validation": datasets.Dataset.from_list(ROWS[:1])}
    ).save_to_disk(str(tmp_path / "saved"))
    exs, _ = load_hf(tmp_path / "saved", FieldMap(), chat=ChatData())
    assert [(e.id, e.split, e.target) for e in exs] == [
        ("train:0", "train", "hi"),
        ("train:1", "train", "four"),
        ("train:2", "train", "blue"),
        ("validation:0", "validation", "hi"),
    ]
    assert exs[2].context == [_u("name a colour"), _a("red")]
    files = tmp_path / "files"
    files.mkdir()
    _write_jsonl(files / "data.jsonl", [{"text": "t1", "label": "a"}, {"text": "t2", "label": "b"}])
    exs, _ = load_source(Source(path="files", format="hf"), FieldMap(label="label"), tmp_path)
    assert [(e.text, e.label, e.split) for e in exs] == [("t1", "a", None), ("t2", "b", None)]  # tuneproof splits it
    with pytest.raises(TuneproofError, match="format 'hf' reads a dataset folder or a dataset id, not one file"):
        load_source(Source(path="files/data.jsonl", format="hf"), FieldMap(), tmp_path)
    with pytest.raises(TuneproofError, match="a Hugging Face dataset id needs data.sources\\[\\].revision"):
        load_source(Source(path="someone/chats", format="hf"), FieldMap(), tmp_path)
    # pinned but not in the local cache: one line, nothing downloaded (tests run with HF_HUB_OFFLINE=1)
    with pytest.raises(TuneproofError, match="someone/chats: the dataset did not load") as err:
        load_source(Source(path="someone/chats", format="hf", revision="0" * 40), FieldMap(), tmp_path)
    assert "TUNEPROOF_ALLOW_DOWNLOAD=1" in (err.value.hint or "")


# --------------------------------------------------------------------------- the rendered conversation
@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


def _chat_examples(tmp_path) -> list[Example]:
    return load_chat(_write_jsonl(tmp_path / "c.jsonl", ROWS), FieldMap())[0]


def test_prompts_hold_the_context_and_the_rows_own_system_message(tmp_path, tok):
    single, own_sys, multi = _chat_examples(tmp_path)
    pipe = TextPipeline(tok, Prompt(system="Default system.", template="Q: {text}"), 256)
    assert pipe.prompt_text(single) == (
        "<|im_start|>system\nDefault system.<|im_end|>\n<|im_start|>user\nQ: hello there<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # the row's system message replaces eval.prompt.system; the template applies to the final user turn
    assert pipe.prompt_text(own_sys).startswith("<|im_start|>system\nAnswer in one word.<|im_end|>\n")
    assert "Default system." not in pipe.prompt_text(own_sys)
    assert pipe.prompt_text(multi) == (
        "<|im_start|>system\nDefault system.<|im_end|>\n<|im_start|>user\nname a colour<|im_end|>\n"
        "<|im_start|>assistant\nred<|im_end|>\n<|im_start|>user\nQ: another one<|im_end|>\n<|im_start|>assistant\n"
    )
    # a bare text is an example without context (older callers)
    assert pipe.prompt_text("hello there") == pipe.prompt_text(single)


def _supervised_text(tok, enc) -> str:
    return tok.decode([lab for lab in enc.labels if lab != IGNORE_INDEX])


def test_train_on_last_supervises_the_final_turn_and_all_assistant_every_turn(tmp_path, tok):
    multi = _chat_examples(tmp_path)[2]
    last = TextPipeline(tok, Prompt(), 256).encode(multi)
    assert last.faults == [] and last.context_supervised == 0
    assert _supervised_text(tok, last) == "blue<|im_end|>"
    every = TextPipeline(tok, Prompt(), 256, train_on="all_assistant").encode(multi)
    assert every.faults == []
    assert _supervised_text(tok, every) == "red<|im_end|>blue<|im_end|>"
    assert every.context_supervised == len(tok("red<|im_end|>", add_special_tokens=False)["input_ids"])
    assert (
        every.answer_tokens == last.answer_tokens and every.n_supervised == last.n_supervised + every.context_supervised
    )
    # the prompt tokens are the inference prompt's, whatever is supervised
    assert every.input_ids == last.input_ids


def test_a_history_rendered_unlike_its_own_inference_prompt_is_a_per_turn_fault(tmp_path, tok):
    # earlier assistant turns are rendered with a marker the generation prompt never gives
    history_marker = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
        "{% if m['role'] == 'assistant' and not loop.last %}(old) {% endif %}{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    t = make_tokenizer(history_marker)
    multi = _chat_examples(tmp_path)[2]
    assert TextPipeline(t, Prompt(), 256).encode(multi).faults == []  # train_on last: the history is context only
    enc = TextPipeline(t, Prompt(), 256, train_on="all_assistant").encode(multi)
    assert len(enc.faults) == 1
    assert enc.faults[0].startswith("assistant turn 1 (train_on all_assistant): its content does not follow")
    assert "set data.chat.train_on: last" in enc.faults[0]
    # the data check's chat line counts the earlier turns' tokens of the examples without faults only, and says so
    exs = _chat_examples(tmp_path)
    pipe = TextPipeline(t, Prompt(), 256, train_on="all_assistant")
    summary = chat_summary({"train": exs}, {"train": [pipe.encode(e) for e in exs]}, "all_assistant")
    assert (summary["context_supervised_tokens"], summary["examples_with_faults"]) == (0, 1)
    assert summary["line"].endswith(
        f"data.chat.train_on all_assistant: every assistant turn supervised (0 tokens in earlier turns of the "
        f"{len(exs) - 1} examples without faults, end tokens included; 1 example with faults not counted (see faults))"
    )


def test_chat_examples_without_a_chat_template_are_a_fault(tmp_path):
    multi = _chat_examples(tmp_path)[2]
    enc = TextPipeline(make_tokenizer(None), Prompt(), 256).encode(multi)
    assert any("the tokenizer has no chat template" in f for f in enc.faults)


def test_the_context_tells_conversations_apart_for_duplicates(tmp_path):
    a = Example(id="a", text="another one", target="x", context=[_u("name a colour"), _a("red")])
    b = Example(id="b", text="another one", target="x", context=[_u("name a fruit"), _a("apple")])
    c = Example(id="c", text="another one", target="x", context=[SYS, _u("name a colour"), _a("red")])
    rep = find_duplicates({"train": [a], "validation": [b], "test": [c]}, threshold=0.99)
    # a and b differ only in their earlier turns: not duplicates; c is a with a system message: the same input
    kinds = {(col.id_a, col.id_b): col.kind for p in rep.pairs.values() for col in p.collisions}
    assert kinds == {("a", "c"): "exact"}
    assert a != b  # the context is compared (and so hashed into the data fingerprint)


def test_cleaning_rules_apply_to_earlier_user_turns_too():
    from tuneproof.data.cleaning import clean

    ex = Example(
        id="a",
        text="  final   question ",
        target="x",
        context=[{"role": "system", "content": " keep  me "}, _u("  first   question "), _a(" said  so ")],
    )
    (out,), dropped = clean([ex], ["strip", "collapse_whitespace"])
    assert dropped == [] and out.text == "final question"
    assert out.context == [{"role": "system", "content": " keep  me "}, _u("first question"), _a(" said  so ")]


def test_an_empty_system_message_is_the_rows_own_rendered_empty_and_counted(tmp_path):
    rows = [{"messages": [{"role": "system", "content": ""}, _u("q"), _a("a")]}, ROWS[0]]
    exs, _ = load_chat(_write_jsonl(tmp_path / "c.jsonl", rows), FieldMap())
    assert exs[0].system == "" and exs[0].context == [{"role": "system", "content": ""}]
    t = make_tokenizer()
    pipe = TextPipeline(t, Prompt(system="Default."), 256)
    assert pipe.prompt_text(exs[0]).startswith("<|im_start|>system\n<|im_end|>\n<|im_start|>user\nq")
    for ex in exs:
        ex.meta["chat_turns"] = len(ex.context) + 2
    summary = chat_summary({"train": exs}, {"train": [pipe.encode(e) for e in exs]}, "last")
    assert (summary["own_system"], summary["empty_system"]) == (1, 1)
    assert ", 1 of them empty: rendered empty, eval.prompt.system not used" in summary["line"]


def test_an_answer_cut_under_all_assistant_counts_its_own_tokens_apart_from_earlier_turns(tok):
    turns = [m for k in range(4) for m in (_u(f"hello world {k} book a table"), _a(f"a b c {k} x y z"))]
    ex = Example(id="long", text="what is the weather", target='{"intent": "GetWeather"}', context=turns)
    whole = TextPipeline(tok, Prompt(), 512, train_on="all_assistant").encode(ex)
    assert whole.faults == [] and whole.context_supervised > 0
    last_earlier = max(i for i, lab in enumerate(whole.labels[: whole.prompt_tokens]) if lab != IGNORE_INDEX)
    at = last_earlier - 2  # the cut falls inside the last earlier answer: the final answer is lost whole
    earlier_lost = sum(1 for lab in whole.labels[at : whole.prompt_tokens] if lab != IGNORE_INDEX)
    cut = TextPipeline(tok, Prompt(), at, train_on="all_assistant").encode(ex)
    assert (cut.answer_lost, cut.answer_tokens) == (whole.answer_tokens, whole.answer_tokens)
    assert cut.faults == [
        f"the answer is cut by max_length {at}: {whole.answer_tokens} of {whole.answer_tokens} answer tokens lost, "
        f"the end token '<|im_end|>' among them (the model would never learn to stop); and {earlier_lost} "
        "supervised tokens of earlier assistant turns"
    ]
    assert earlier_lost > 0


def test_a_context_past_max_length_says_the_length_that_fits_or_fewer_turns(tok):
    turns = [m for k in range(4) for m in (_u(f"hello world {k} book a table"), _a(f"a b c {k} x y z"))]
    ex = Example(id="long", text="what is the weather", target='{"intent": "GetWeather"}', context=turns)
    enc = TextPipeline(tok, Prompt(), 40).encode(ex)
    need = enc.prompt_tokens + enc.answer_tokens
    assert enc.n_supervised == 0 and enc.faults == [
        f"0 supervised tokens after truncation (prompt {enc.prompt_tokens} + answer {enc.answer_tokens} tokens > "
        f"max_length 40): raise training.max_length to at least {need}, or keep fewer earlier turns in the row"
    ]
