"""The few-shot control's shots (issue 32 item 1): drawn once by seed from the train split, stratified by class,
rendered as earlier user/assistant turns with the prompt template under the families' chat templates, and the
context check that refuses a prompt that does not fit."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

from tuneproof.data.chat_template import ChatTemplate
from tuneproof.data.examples import Example
from tuneproof.data.few_shot import check_fit, context_length, draw_shots, shot_turns, with_shots
from tuneproof.data.preprocess import TextPipeline
from tuneproof.errors import TuneproofError
from tuneproof.study import Prompt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from chat_families import FAMILIES, family_tokenizer  # noqa: E402
from tinymodels import make_tokenizer  # noqa: E402

CLASSES = ["alarm", "music", "weather", "book"]


def _train(per_class: dict[str, int]) -> list[Example]:
    out = []
    for c, n in per_class.items():
        out += [Example(id=f"{c}-{i}", text=f"{c} request {i}", label=c, target=c, split="train") for i in range(n)]
    return out


def test_k_below_the_classes_draws_k_distinct_classes_one_each():
    train = _train({c: 5 for c in CLASSES})
    shots = draw_shots(train, 3, seed=7)
    assert len(shots) == 3 and len({s.label for s in shots}) == 3
    assert all(s.id.startswith(s.label + "-") for s in shots)


def test_k_at_or_above_the_classes_goes_round_robin():
    train = _train({"alarm": 6, "music": 6, "weather": 2})
    shots = draw_shots(train, 7, seed=1)
    counts = Counter(s.label for s in shots)
    # every class shown once before any is shown twice; weather runs out after 2, the others take the rest
    assert counts == {"alarm": 3, "music": 2, "weather": 2} or counts == {"alarm": 2, "music": 3, "weather": 2}
    first_round = [s.label for s in shots[:3]]
    assert sorted(first_round) == ["alarm", "music", "weather"]
    assert len({s.id for s in shots}) == 7


def test_the_draw_is_deterministic_by_seed_and_never_takes_an_excluded_id():
    train = _train({c: 8 for c in CLASSES})
    a = [s.id for s in draw_shots(train, 6, seed=3)]
    assert a == [s.id for s in draw_shots(list(reversed(train)), 6, seed=3)]  # the input order does not matter
    assert a != [s.id for s in draw_shots(train, 6, seed=4)]
    banned = [e.id for e in train if e.label == "music"][:7]
    got = draw_shots(train, 8, seed=3, exclude_ids=banned)
    assert not set(banned) & {s.id for s in got}


def test_a_training_example_repeating_an_evaluated_input_is_never_a_shot():
    train = _train({"alarm": 3, "music": 3})
    # validation holds the same inputs as alarm-0 and music-1 (a cross-split duplicate; spacing and case aside)
    evaluated = [
        Example(id="v0", text="Alarm  request 0", label="alarm", target="alarm", split="validation"),
        Example(id="v1", text="music request 1", label="music", target="music", split="validation"),
    ]
    for seed in range(20):
        got = {s.id for s in draw_shots(train, 4, seed=seed, exclude=evaluated)}
        assert len(got) == 4 and not got & {"alarm-0", "music-1"}
    with pytest.raises(
        TuneproofError,
        match="holds 6 examples, 2 of which repeat an evaluated example's input: 4 to draw from, fewer than K=5",
    ):
        draw_shots(train, 5, seed=0, exclude=evaluated)


def test_unlabelled_examples_are_drawn_by_seed():
    train = [Example(id=f"r{i}", text=f"t{i}", target=f"a{i}") for i in range(10)]
    got = [s.id for s in draw_shots(train, 4, seed=0)]
    assert len(set(got)) == 4 and got == [s.id for s in draw_shots(train, 4, seed=0)]


@pytest.mark.parametrize(
    "k, train, phrase",
    [(0, _train({"a": 3}), "K must be at least 1"), (5, _train({"a": 2, "b": 2}), "holds 4 examples to draw from")],
)
def test_k_below_one_or_a_small_train_split_is_refused(k, train, phrase):
    with pytest.raises(TuneproofError) as err:
        draw_shots(train, k, seed=0)
    assert phrase in err.value.message and f"--few-shot {k}" in err.value.message


def _pipeline(tokenizer, system="Label the request.", template="Request: {text}"):
    prompt = Prompt(system=system, template=template)
    return TextPipeline(tokenizer, prompt, 512, chat=ChatTemplate(tokenizer))


SHOTS = [
    Example(id="s1", text="wake me at six", label="alarm", target="alarm"),
    Example(id="s2", text="play some jazz", label="music", target="music"),
]
ROW = Example(id="e1", text="will it rain", label="weather", target="weather")


@pytest.mark.parametrize("family", ["qwen2.5", "llama-3", "gemma-2", "mistral-v0.3", "deepseek-r1", "phi-3"])
def test_the_prompt_holds_the_shots_in_order_with_the_template(family):
    fam = FAMILIES[family]
    pipe = _pipeline(family_tokenizer(fam))
    (ex,) = with_shots([ROW], SHOTS, "Request: {text}")
    prompt = pipe.prompt_text(ex)
    order = [
        "Label the request.",
        "Request: wake me at six",
        "alarm",
        "Request: play some jazz",
        "music",
        "Request: will it rain",
    ]
    at = [prompt.find(part) for part in order]
    assert all(a >= 0 for a in at), (family, prompt)
    if fam.system_role == "folded" and family == "gemma-2":
        # no system role: the system text heads the first user turn, the first shot's
        assert "Label the request.\n\nRequest: wake me at six" in prompt
    if family != "mistral-v0.3":  # Mistral puts the system text into the last user turn (folded: the first here)
        assert at == sorted(at), (family, prompt)
    else:
        assert at[1:] == sorted(at[1:])
    # each shot is a turn of its own: its answer is followed by the template's end of turn
    eot = pipe.end_token
    assert prompt.find(eot, at[2]) < at[3]
    # the ids, input and reference of the evaluated example are unchanged: outputs pair with the plain baseline's
    assert (ex.id, ex.text, ex.target) == (ROW.id, ROW.text, ROW.target)
    assert pipe.prompt_text(ROW).count("Request:") == 1


def test_the_rows_own_system_message_comes_first_then_the_shots_then_its_earlier_turns():
    row = Example(
        id="c1",
        text="and tomorrow?",
        target="weather",
        context=[
            {"role": "system", "content": "Own system."},
            {"role": "user", "content": "is it sunny"},
            {"role": "assistant", "content": "weather"},
        ],
    )
    (ex,) = with_shots([row], SHOTS, "Q: {text}")
    assert [t["role"] for t in ex.context] == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
    assert ex.context[0]["content"] == "Own system." and ex.context[1]["content"] == "Q: wake me at six"
    assert ex.context[-2]["content"] == "is it sunny"
    prompt = _pipeline(make_tokenizer(), system="Study system.", template="Q: {text}").prompt_text(ex)
    assert "Study system." not in prompt and prompt.index("Own system.") < prompt.index("Q: wake me at six")
    assert prompt.index("Q: play some jazz") < prompt.index("is it sunny") < prompt.index("Q: and tomorrow?")


def test_a_template_that_strips_think_blocks_keeps_the_shot_answers():
    fam = FAMILIES["deepseek-r1"]
    shot = Example(id="s", text="wake me", target="<think>it is an alarm</think>alarm")
    assert shot_turns(shot, "{text}")[-1]["content"] == "<think>it is an alarm</think>alarm"
    prompt = _pipeline(family_tokenizer(fam)).prompt_text(with_shots([ROW], [shot], "{text}")[0])
    assert "it is an alarm" not in prompt and "\uff5cAssistant\uff5c>alarm" in prompt


def test_without_a_chat_template_the_shots_are_written_as_the_training_text_writes_turns():
    tok = make_tokenizer(chat_template=None)
    pipe = TextPipeline(tok, Prompt(template="Q: {text}"), 512)
    (ex,) = with_shots([ROW], SHOTS, "Q: {text}")
    assert pipe.prompt_text(ex) == (
        "Q: wake me at six\nalarm<|im_end|>Q: play some jazz\nmusic<|im_end|>Q: will it rain\n"
    )
    assert pipe.prompt_text(ROW) == "Q: will it rain\n"


def test_the_context_check_refuses_a_prompt_that_does_not_fit_naming_k_and_the_numbers():
    ok = check_fit([40, 90, 60], ["a", "b", "c"], 4, 30, 128, "config.json max_position_embeddings", 20)
    assert (ok["longest_prompt_tokens"], ok["longest_id"], ok["needed_tokens"], ok["fits"]) == (90, "b", 120, True)
    assert "70 more than without the shots" in ok["line"]
    with pytest.raises(TuneproofError) as err:
        check_fit([40, 110, 60], ["a", "b", "c"], 8, 30, 128, "config.json max_position_embeddings", 20)
    msg = err.value.message
    assert "--few-shot 8" in msg and "(b) is 110 tokens" in msg and "= 140 tokens" in msg and "128" in msg
    assert "lower K" in err.value.hint
    unknown = check_fit([10**6], ["a"], 2, 8, None, "unknown")
    assert unknown["fits"] and unknown["context_length"] is None


def test_the_context_length_is_read_from_the_config_then_the_tokenizer():
    assert context_length({"max_position_embeddings": 2048}) == (2048, "config.json max_position_embeddings")
    assert context_length({"text_config": {"n_positions": 1024}}) == (1024, "config.json n_positions")
    tok = make_tokenizer()
    tok.model_max_length = 512
    assert context_length({}, tok) == (512, "tokenizer model_max_length")
    tok.model_max_length = int(1e30)
    assert context_length({}, tok) == (None, "unknown")
