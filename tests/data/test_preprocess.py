"""The single preprocessing path: end token supervised with pad == eos (docs/CASES.md C2), the answer boundary
from character offsets (docs/CASES.md C3), 0 supervised tokens reported before training (docs/CASES.md C4)."""

from __future__ import annotations

import pytest

from tinymodels import CHATML, make_tokenizer
from tuneproof.data.examples import Example
from tuneproof.data.preprocess import IGNORE_INDEX, TextPipeline, collate, raise_on_faults
from tuneproof.errors import CheckFailed
from tuneproof.study import Prompt


def test_c2_end_token_supervised_when_pad_equals_eos(tiny_tokenizer):
    tok = tiny_tokenizer
    assert tok.pad_token_id == tok.eos_token_id
    pipe = TextPipeline(tok, Prompt(system=None), max_length=128)
    a = pipe.encode(Example("a", "hello world", target="a b c"))
    b = pipe.encode(Example("b", "what is the weather in Rome tomorrow", target="x"))
    batch = collate([a, b], tok.pad_token_id)
    eos = tok.eos_token_id
    for i, e in enumerate([a, b]):
        n = len(e.input_ids)
        labels = batch["labels"][i]
        assert labels[n - 1].item() == eos  # the last real position is supervised on the end token
        assert int((labels == eos).sum()) == 1  # exactly one supervised end token per example
        assert (labels[n:] == IGNORE_INDEX).all()  # only padding positions are ignored
    assert batch["input_ids"].shape[1] == max(len(a.input_ids), len(b.input_ids))
    assert not a.faults and not b.faults


def _char_bpe(template: str, merges: list[tuple[str, str]]):
    """A character-level BPE with hand-written merges, so the test controls what merges."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    vocab = {
        t: i for i, t in enumerate(["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + chars + [a + b for a, b in merges])
    }
    raw = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<|endoftext|>"))
    raw.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=raw, eos_token="<|im_end|>", pad_token="<|im_end|>", unk_token="<|endoftext|>"
    )
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    tok.chat_template = template
    return tok


def test_c3_boundary_merge_is_found_by_offsets_and_answer_supervised():
    # the generation prompt ends in ':' and the answer starts with '{': the tokenizer merges ':{'
    # when the whole text is tokenised in one pass, so the marker tokenises differently in context
    template = (
        "{% for m in messages %}{% if m['role'] == 'assistant' %}Answer:{{ m['content'] }}<|im_end|>"
        "{% else %}{{ m['content'] }}\n{% endif %}{% endfor %}{% if add_generation_prompt %}Answer:{% endif %}"
    )
    tok = _char_bpe(template, [(":", "{")])
    pipe = TextPipeline(tok, Prompt(system=None), max_length=128)
    enc = pipe.encode(Example("c3", "hi", target='{"x"}'))
    joint = tok(enc.text, add_special_tokens=False)["input_ids"]
    prompt_ids = tok(pipe.prompt_text("hi"), add_special_tokens=False)["input_ids"]
    assert tok.convert_ids_to_tokens(joint)[9] == ":{"  # one-pass tokenisation really merges across the boundary
    assert enc.input_ids[: enc.prompt_tokens] == prompt_ids  # the training prefix is the inference prompt
    assert enc.n_supervised == 6 and not enc.faults  # { " x " } <|im_end|>
    assert enc.notes and "merges across the answer boundary (':{')" in enc.notes[0]
    assert "'hi\\nAnswer:' | '{\"x\"}<|im_en'" in enc.notes[0]  # the tokens on each side of the boundary
    supervised = tok.decode([t for t, lab in zip(enc.input_ids, enc.labels) if lab != IGNORE_INDEX])
    assert supervised == '{"x"}<|im_end|>'


def test_c4_zero_supervised_tokens_reported_before_training(tiny_tokenizer):
    prompt = "add the piano bar to my Cindy Wilson playlist and book a table for two in Paris tonight please"
    ex = Example("long-1", prompt, target="a b c")
    short = TextPipeline(tiny_tokenizer, Prompt(system=None), max_length=16).encode(ex)
    assert short.prompt_tokens >= 25 and short.n_supervised == 0
    assert short.faults == [
        f"0 supervised tokens after truncation (prompt {short.prompt_tokens} + answer {short.answer_tokens} tokens > "
        f"max_length 16): raise training.max_length to at least {short.prompt_tokens + short.answer_tokens}"
    ]
    with pytest.raises(CheckFailed) as err:
        raise_on_faults([short], "train")
    assert "long-1" in str(err.value) and f"prompt {short.prompt_tokens}" in str(err.value)
    ok = TextPipeline(tiny_tokenizer, Prompt(system=None), max_length=128).encode(ex)
    assert ok.n_supervised == ok.answer_tokens > 0 and not ok.faults


def test_end_token_not_supervised_is_a_fault(tiny_tokenizer):
    # a template that drops the end token after the assistant message
    template = CHATML.replace("{{ m['content'] }}<|im_end|>\n", "{{ m['content'] }}\n")
    tok = make_tokenizer(template)
    enc = TextPipeline(tok, Prompt(system=None), max_length=128).encode(Example("e", "hello world", target="a b c"))
    assert any("end token" in f and "not supervised" in f for f in enc.faults)


# a template that renders the conversation only when no generation prompt is asked for
EMPTY_PROMPT = "{% if not add_generation_prompt %}" + CHATML.split("{% if add_generation_prompt")[0] + "{% endif %}"
# a template that drops the assistant's content (its header and end token stay)
NO_ANSWER = CHATML.replace("{{ m['content'] }}", "{% if m['role'] != 'assistant' %}{{ m['content'] }}{% endif %}")
# a template that drops the user's content when a generation prompt is asked for
NO_INPUT = CHATML.replace("{{ m['content'] }}", "{% if not add_generation_prompt %}{{ m['content'] }}{% endif %}")


def _encode(template: str, max_length: int = 128):
    pipe = TextPipeline(make_tokenizer(template), Prompt(system=None), max_length=max_length)
    return pipe, pipe.encode(Example("t", "hello world", target="a b c"))


def test_an_empty_inference_prompt_is_a_hard_fault_naming_the_supervised_prompt():
    pipe, enc = _encode(EMPTY_PROMPT)
    assert pipe.prompt_text("hello world") == "" and enc.prompt_tokens == 0
    supervised = pipe.tok.decode([t for t, lab in zip(enc.input_ids, enc.labels) if lab != IGNORE_INDEX])
    assert supervised.startswith("<|im_start|>user\nhello world")  # what the fault is about: the prompt is trained on
    assert enc.faults == [
        "the inference prompt is empty (the chat template renders nothing for the system and user messages with "
        "add_generation_prompt=True): the model would be asked nothing at inference, and the prompt tokens of the "
        "training text are supervised"
    ]
    with pytest.raises(CheckFailed, match="t \\(prompt 0, answer 29 tokens\\): the inference prompt is empty"):
        raise_on_faults([enc], "train")


def test_an_inference_prompt_without_the_input_text_is_a_hard_fault():
    pipe, enc = _encode(NO_INPUT)
    assert "hello world" not in pipe.prompt_text("hello world")
    assert enc.faults[0].startswith("the inference prompt does not contain the example's input text")
    assert enc.faults[1].startswith("the training text does not start with the inference prompt")


def test_a_template_that_drops_the_answer_names_it_not_truncation():
    pipe, enc = _encode(NO_ANSWER)
    assert "a b c" not in enc.text and not enc.truncated
    assert enc.faults == [
        "the training text does not contain the answer (the chat template drops the assistant's content): "
        "nothing of the target would be supervised"
    ]
    # the whole assistant turn dropped: the training text is the prompt itself; still not "truncation"
    whole = "{% for m in messages %}{% if m['role'] != 'assistant' %}" + CHATML.split("{% for m in messages %}")[1]
    whole = whole.replace("{% endfor %}", "{% endif %}{% endfor %}", 1)
    pipe, enc = _encode(whole)
    assert enc.faults and all("truncat" not in f for f in enc.faults)
    assert enc.faults[0].startswith("the training text does not contain the answer")


def test_zero_supervised_tokens_without_truncation_is_not_called_truncation():
    # the answer is an empty string: nothing follows the prompt but the end token, which the template drops
    template = CHATML.replace("{{ m['content'] }}<|im_end|>\n", "{{ m['content'] }}")
    pipe = TextPipeline(make_tokenizer(template), Prompt(system=None), max_length=128)
    enc = pipe.encode(Example("z", "hello world", target=""))
    assert enc.n_supervised == 0 and not enc.truncated
    assert enc.faults[0].startswith("0 supervised tokens although nothing was truncated (prompt 22 + answer 0 tokens")


def test_input_text_supervised_before_the_answer_is_a_fault_other_text_a_note():
    # the training text repeats the user's input inside the assistant turn, before the answer
    repeat = CHATML.replace(
        "{{ m['content'] }}",
        "{% if m['role'] == 'assistant' %}{{ messages[-2]['content'] }}\n{% endif %}{{ m['content'] }}",
    )
    _, enc = _encode(repeat)
    assert enc.faults == [
        "prompt tokens are supervised: the supervised span before the answer holds the example's input text "
        "('hello·world\\n'...); the inference prompt is not where the template puts the answer"
    ]
    # an empty reasoning block the template adds before every answer: trained, said, not refused
    think = CHATML.replace(
        "{{ m['content'] }}", "{% if m['role'] == 'assistant' %}<think></think>{% endif %}{{ m['content'] }}"
    )
    _, enc = _encode(think)
    assert not enc.faults
    assert enc.notes == [
        "the model is also trained to generate '<think></think>' before the answer (the chat template adds it when "
        "an answer follows, the inference prompt does not end with it)"
    ]


@pytest.mark.parametrize("adds_end", [True, False])
def test_a_truncated_classifier_input_keeps_an_end_token_only_when_the_tokenizer_adds_one(adds_end):
    # training's truncation equals the tokenizer's own (what evaluation calls): with no end token added,
    # the last word is not kept in place of one
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[SEP]", "a", "b", "c", "d", "e"])}
    raw = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    if adds_end:
        raw.post_processor = processors.TemplateProcessing(single="$A [SEP]", special_tokens=[("[SEP]", 2)])
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]", pad_token="[PAD]", sep_token="[SEP]")
    pipe = TextPipeline(tok, Prompt(system=None), max_length=3, labels=["x", "y"])
    enc = pipe.encode(Example("t", "a b c d e", label="x"))
    assert enc.truncated and enc.input_ids == ([3, 4, 2] if adds_end else [3, 4, 5])
    assert enc.input_ids == tok("a b c d e", truncation=True, max_length=3)["input_ids"]


def test_a_short_input_inside_a_role_header_before_the_answer_is_a_note_not_a_fault():
    # no generation prompt in the template: the assistant header is trained before the answer; the input "a"
    # is a letter of "assistant", not the prompt supervised
    template = CHATML.split("{% if add_generation_prompt")[0]
    pipe = TextPipeline(make_tokenizer(template), Prompt(system=None), max_length=128)
    enc = pipe.encode(Example("s", "a", target="x y z"))
    assert not any("prompt tokens" in f for f in enc.faults)
    # the header is generated before the answer (read back as the evaluation reads it, the answer is not the
    # reference); the one fault names the cause, a template without generation prompt, not the parsing
    assert enc.gold_answer == "assistant\nx y z"
    assert len(enc.faults) == 1 and enc.faults[0].startswith(
        "the chat template renders no generation prompt (the prompt with add_generation_prompt=True equals the "
        "prompt without it): the inference prompt ends without the assistant's role header '<|im_start|>assistant\\n'"
    )
    assert enc.before_answer == "<|im_start|>assistant\n" and enc.before_tokens == 9
    assert enc.notes == []  # the fault says it; no note beside it
