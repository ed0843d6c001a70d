"""Chat-format studies in the behavioural matrix (issue 30 items 1 and 6): single turn, multi-turn (the final
turn trained, or every assistant turn), a per-row system message, ShareGPT rows, TRL prompt-completion rows
(standard and conversational), contents as text parts with capitalised roles, a tool result in the context. Each
goes through the data check, the training text (answer + exactly one end-of-turn token per supervised turn; the
prompt prefix is the inference prompt) and the real generate / decode / score path, where a model that emits
exactly the supervised tokens scores 1.0."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import torch
import yaml

from tuneproof.cli import main
from tuneproof.context import StudyContext
from tuneproof.data.preprocess import IGNORE_INDEX
from tuneproof.tasks import get_task, task_config

INTENTS = ["BookRestaurant", "GetWeather", "PlayMusic"]


def _answer(i: int) -> str:
    return json.dumps({"intent": INTENTS[i % 3], "slots": {"n": str(i)}})


def _single(i):
    return {
        "messages": [{"role": "user", "content": f"request number {i}"}, {"role": "assistant", "content": _answer(i)}]
    }


def _multi(i):
    return {
        "messages": [
            {"role": "user", "content": f"hello {i}"},
            {"role": "assistant", "content": f"hi {i}, how can I help"},
            {"role": "user", "content": f"request number {i}"},
            {"role": "assistant", "content": _answer(i)},
        ]
    }


def _own_system(i):
    row = _single(i)
    if i % 2:
        row["messages"].insert(0, {"role": "system", "content": f"You are assistant {i % 4}. Reply with JSON."})
    return row


def _sharegpt(i):
    m = _multi(i)["messages"]
    return {
        "conversations": [{"from": {"user": "human", "assistant": "gpt"}[t["role"]], "value": t["content"]} for t in m]
    }


def _trl_standard(i):
    return {"prompt": f"request number {i}", "completion": _answer(i)}


def _trl_conversational(i):
    m = _own_system(i)["messages"]
    return {"prompt": m[:-1], "completion": m[-1:]}


def _content_parts(i):
    return {
        "messages": [
            {"role": "User", "content": [{"type": "text", "text": "request"}, {"type": "text", "text": f"number {i}"}]},
            {"role": "assistant", "content": [{"type": "text", "text": _answer(i)}]},
        ]
    }


def _tool_result(i):
    return {
        "conversations": [
            {"from": "human", "value": f"hello {i}"},
            {"from": "gpt", "value": "looking it up"},
            {"from": "observation", "value": f"record {i} found"},
            {"from": "human", "value": f"request number {i}"},
            {"from": "gpt", "value": _answer(i)},
        ]
    }


# name -> (row builder, data.chat, earlier assistant turns per row)
CASES = {
    "single-turn": (_single, {}, 0),
    "multi-turn-last": (_multi, {}, 0),
    "multi-turn-all-assistant": (_multi, {"train_on": "all_assistant"}, 1),
    "per-row-system": (_own_system, {}, 0),
    "sharegpt-all-assistant": (_sharegpt, {"train_on": "all_assistant"}, 1),
    "trl-prompt-completion": (_trl_standard, {}, 0),
    "trl-conversational-prompt-completion": (_trl_conversational, {}, 0),
    "content-parts-and-capitalised-roles": (_content_parts, {}, 0),
    "tool-result-in-context-all-assistant": (_tool_result, {"train_on": "all_assistant"}, 1),
}


def _study(folder: Path, base: Path, rows: list[dict], chat: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = {
        "name": "tiny-chat",
        "hypothesis": {"behaviour": "b", "task": "extraction", "success": {"metric": "field_f1", "min_gain": 0.0}},
        "data": {"sources": [{"path": "chat.jsonl", "format": "chat"}], "chat": chat},
        "model": {"base": str(base)},
        "training": {"max_length": 200},
        "eval": {"split": "validation", "max_new_tokens": 40, "prompt": {"system": "Default system message."}},
    }
    (folder / "tuneproof.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return folder


class EmitsTheSupervisedTokens(torch.nn.Module):
    """A causal LM stand-in whose ``generate`` continues each prompt (its unpadded token ids) with the
    tokens training supervises after exactly that prompt; an unknown prompt is a KeyError, so the
    inference prompt must equal the training prefix token for token."""

    def __init__(self, answers: dict[tuple[int, ...], list[int]]):
        super().__init__()
        self.answers = answers

    def generate(self, input_ids, attention_mask, max_new_tokens, pad_token_id, **_):
        rows = [
            self.answers[tuple(ids[m.bool()].tolist())][:max_new_tokens] for ids, m in zip(input_ids, attention_mask)
        ]
        width = input_ids.shape[1]
        out = torch.full((len(rows), width + max(map(len, rows))), pad_token_id, dtype=torch.long)
        out[:, :width] = input_ids
        for r, a in enumerate(rows):
            out[r, width : width + len(a)] = torch.tensor(a)
        return out


def _cli(*args: str) -> int:
    with pytest.raises(SystemExit) as e:
        main(list(args))
    return e.value.code


@pytest.mark.parametrize("case", list(CASES))
def test_chat_study_checks_trains_the_right_tokens_and_a_perfect_model_scores_one(
    case, tmp_path, tiny_model_dir, capsys
):
    build, chat, earlier = CASES[case]
    d = _study(tmp_path / case, tiny_model_dir, [build(i) for i in range(30)], chat)
    assert _cli("data", "check", "--study", str(d)) == 0
    out = capsys.readouterr().out
    assert "data check passed" in out and "chat: 30 conversations" in out, out
    assert f"data.chat.train_on {chat.get('train_on', 'last')}" in out

    ctx = StudyContext.open(d)
    tok, pipe = ctx.tokenizer, ctx.pipeline
    end_id = tok.convert_tokens_to_ids(pipe.end_token)
    examples = ctx.eval_examples()
    answers = {}
    for ex in [e for items in ctx.all_splits.values() for e in items]:
        enc = pipe.encode(ex)
        assert enc.faults == [], (ex.id, enc.faults)
        prompt_ids = tok(pipe.prompt_text(ex), add_special_tokens=False)["input_ids"]
        assert enc.input_ids[: enc.prompt_tokens] == prompt_ids  # prompt prefix = inference prompt
        final = [lab for lab in enc.labels[enc.prompt_tokens :] if lab != IGNORE_INDEX]
        answer_ids = tok(ex.target, add_special_tokens=False)["input_ids"]
        assert final == answer_ids + [end_id]  # the answer and exactly one end-of-turn token
        in_prompt = [lab for lab in enc.labels[: enc.prompt_tokens] if lab != IGNORE_INDEX]
        assert in_prompt.count(end_id) == earlier and enc.context_supervised == len(in_prompt)
        if earlier:  # the earlier assistant turn, then its end token, is what is supervised in the prompt
            said = next(t["content"] for t in ex.context if t["role"] == "assistant")
            assert in_prompt == tok(said, add_special_tokens=False)["input_ids"] + [end_id]
        # the row's own system message replaces eval.prompt.system; the others get it
        assert (ex.system or "Default system message.") in pipe.prompt_text(ex)
        answers[tuple(prompt_ids)] = final

    preds = ctx.modality.predict(
        ctx, EmitsTheSupervisedTokens(answers), examples, device="cpu", autocast=contextlib.nullcontext
    )
    assert preds == [e.target for e in examples]
    records = [
        {"id": e.id, "category": e.label, "reference": e.target, "prediction": p} for e, p in zip(examples, preds)
    ]
    recs, metrics = get_task(ctx.task).score(records, task_config(ctx))
    assert all(r["correct"] for r in recs) and metrics["field_f1"] == 1.0


def test_the_context_and_train_on_are_part_of_the_data_fingerprint(tmp_path, tiny_model_dir):
    rows = [_multi(i) for i in range(30)]
    d = _study(tmp_path / "fp", tiny_model_dir, rows, {})
    before = StudyContext.open(d).data_fingerprint()
    rows[4]["messages"][1]["content"] = "an earlier answer, edited"  # not the input, not the answer: the context
    (d / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    edited = StudyContext.open(d).data_fingerprint()
    assert edited["parts"]["examples"] != before["parts"]["examples"]
    assert edited["parts"]["preprocessing"] == before["parts"]["preprocessing"]
    cfg = yaml.safe_load((d / "tuneproof.yaml").read_text())
    cfg["data"]["chat"] = {"train_on": "all_assistant"}
    (d / "tuneproof.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    every = StudyContext.open(d).data_fingerprint()
    assert every["parts"]["preprocessing"] != edited["parts"]["preprocessing"]
    assert every["parts"]["examples"] == edited["parts"]["examples"]
