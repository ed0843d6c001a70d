"""End to end on the real SmolLM2-135M-Instruct weights with chat-format data (issue 30 item 1): multi-turn
conversations, some with their own system message, every assistant turn trained; the whole protocol (data check,
baseline, train a few steps, eval with the baseline's procedure, paired compare)."""

from __future__ import annotations

import json

import pytest
import yaml

from tuneproof.cli import main
from tuneproof.context import StudyContext
from tuneproof.io import read_json, read_jsonl
from tuneproof.registry import Registry

pytestmark = pytest.mark.slow

CITIES = ["Paris", "Rome", "Hanoi", "Lima", "Oslo", "Cairo", "Quito", "Seoul"]


def _row(i: int) -> dict:
    city = CITIES[i % len(CITIES)]
    intent = ["GetWeather", "BookRestaurant"][i % 2]
    ask = (
        f"what is the weather in {city} on day {i}"
        if intent == "GetWeather"
        else f"book a table in {city} for {i % 5 + 2}"
    )
    msgs = [
        {"role": "user", "content": f"hello, I have a question number {i}"},
        {"role": "assistant", "content": "Sure, ask me."},
        {"role": "user", "content": ask},
        {"role": "assistant", "content": json.dumps({"intent": intent, "slots": {"city": city}})},
    ]
    if i % 3 == 0:
        msgs.insert(0, {"role": "system", "content": "You turn requests into JSON with intent and slots."})
    return {"messages": msgs}


def _cli(*args: str) -> int:
    with pytest.raises(SystemExit) as e:
        main(list(args))
    return e.value.code


def test_a_chat_study_runs_the_whole_protocol_on_smollm2(tmp_path, capsys):
    study = tmp_path / "chat"
    study.mkdir()
    (study / "chat.jsonl").write_text("".join(json.dumps(_row(i)) + "\n" for i in range(80)))
    cfg = {
        "name": "chat-e2e",
        "hypothesis": {
            "behaviour": "answer the last request of a conversation as JSON",
            "task": "extraction",
            "success": {"metric": "field_f1", "min_gain": 0.0},
            "guards": [{"metric": "json_valid_rate", "max_drop": 1.0}],
            "required_fields": ["intent", "slots"],
        },
        "data": {
            "sources": [{"path": "chat.jsonl", "format": "chat"}],
            "chat": {"train_on": "all_assistant"},
            "split": {"max_examples": {"train": 16, "validation": 4}},
        },
        "model": {"base": "smollm2-135m-instruct"},
        "training": {"max_steps": 2, "micro_batch_size": 2, "warmup_steps": 1, "max_length": 128},
        "eval": {
            "split": "validation",
            "max_new_tokens": 20,
            "batch_size": 4,
            "prompt": {"system": "Reply with JSON."},
        },
    }
    (study / "tuneproof.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))

    assert _cli("data", "check", "--study", str(study)) == 0
    out = capsys.readouterr().out
    assert "data.chat.train_on all_assistant: every assistant turn supervised" in out
    assert _cli("baseline", "--study", str(study)) == 0
    assert _cli("train", "--study", str(study), "--skip-preflight", "a wiring test on a CPU") == 0
    reg = Registry(study)
    train = next(r for r in reg.list() if r.kind == "train")
    assert _cli("eval", train.id, "--study", str(study)) == 0
    runs = {r.kind: r for r in reg.list()}
    assert _cli("compare", runs["eval"].id, "--study", str(study)) == 0
    runs = {r.kind: r for r in reg.list()}
    assert all(r.status == "completed" for r in reg.list()), [(r.id, r.status, r.reason) for r in reg.list()]
    assert {"data-check", "baseline", "train", "eval", "compare"} <= set(runs)

    # every train conversation has an earlier assistant turn: supervised with its end token on the real tokenizer
    ctx = StudyContext.open(study)
    encoded = ctx.pipeline.encode_all(ctx.split("train"))
    assert all(e.faults == [] and e.context_supervised > 0 for e in encoded)
    end_id = ctx.tokenizer.convert_tokens_to_ids(ctx.pipeline.end_token)
    said = ctx.tokenizer("Sure, ask me.", add_special_tokens=False)["input_ids"]
    assert all(e.context_supervised == len(said) + 1 for e in encoded)
    assert all([t for t in e.labels[: e.prompt_tokens] if t != -100] == said + [end_id] for e in encoded)
    metrics = read_jsonl(study / "runs" / train.id / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2] and all(0 < m["loss"] < 20 for m in metrics)
    # baseline and eval judged the same final turns with the same procedure; outputs kept per example
    base_out = read_jsonl(study / "runs" / runs["baseline"].id / "outputs.jsonl")
    eval_out = read_jsonl(study / "runs" / runs["eval"].id / "outputs.jsonl")
    assert [r["id"] for r in base_out] == [r["id"] for r in eval_out] and len(eval_out) == 4
    assert runs["baseline"].eval_fingerprint == runs["eval"].eval_fingerprint
    by_id = {e.id: e for e in ctx.eval_examples()}
    assert all(r["reference"] == by_id[r["id"]].target and r["input"] == by_id[r["id"]].text for r in eval_out)
    # the runs record this data version: conversations (context included) and data.chat in the fingerprint
    data = read_json(study / "runs" / runs["baseline"].id / "data.json")
    assert data["hash"] == ctx.data_fingerprint()["hash"]
    cmp = read_json(study / "runs" / runs["compare"].id / "compare.json")
    assert cmp["baseline"] == runs["baseline"].id and cmp["candidates"][runs["eval"].id]["n"] == 4
