"""Warnings a user needs before the rental hours (docs/PROTOCOL.md step 3): small classes named with counts,
answers cut by max_length (count, ids, tokens lost; a hard fault when the end token is cut), a
suggested max_length that keeps every answer whole, and every check stating its result when it
finds nothing."""

from __future__ import annotations

import yaml

from tuneproof.context import StudyContext
from tuneproof.data.checks import cut_answers, small_classes
from tuneproof.data.examples import Example
from tuneproof.data.lengths import length_stats
from tuneproof.data.preprocess import TextPipeline
from tuneproof.study import Prompt


def _ex(split, label, n, start=0):
    return [
        Example(id=f"{split}-{label}-{i}", text=f"t {label} {i}", label=label, split=split)
        for i in range(start, start + n)
    ]


def test_classes_under_the_threshold_are_named_with_counts():
    splits = {
        "train": _ex("train", "a", 12) + _ex("train", "b", 3) + _ex("train", "c", 9),
        "validation": _ex("validation", "a", 10) + _ex("validation", "b", 2) + _ex("validation", "c", 11),
        "test": _ex("test", "a", 1),
    }
    r = small_classes(splits, "validation", 10)
    assert r["small"] == {"train": {"b": 3, "c": 9}, "validation": {"b": 2}}
    assert r["warnings"] == [
        "train: 2 of 3 classes have fewer than 10 examples: 'b' 3, 'c' 9",
        "validation: 1 of 3 classes have fewer than 10 examples: 'b' 2",
    ]
    ok = small_classes({"train": _ex("train", "a", 10), "validation": _ex("validation", "a", 10)}, "validation", 10)
    assert ok["warnings"] == [] and ok["line"] == "classes under 10 examples: none in train/validation"
    assert small_classes({"train": [Example("x", "t")]}, "validation")["line"] is None


def test_answers_cut_by_max_length_are_counted_and_a_cut_end_token_is_a_hard_fault(tiny_tokenizer):
    ex = Example(
        "long", "hello world", target="add the piano bar to my Cindy Wilson playlist rate this book five out of six"
    )
    whole = TextPipeline(tiny_tokenizer, Prompt(system=None), max_length=512).encode(ex)
    assert whole.answer_lost == 0 and not whole.end_cut and whole.faults == []
    cut_at = whole.full_length - 5
    enc = TextPipeline(tiny_tokenizer, Prompt(system=None), max_length=cut_at).encode(ex)
    assert (enc.answer_lost, enc.end_cut, enc.n_supervised) == (5, True, whole.n_supervised - 5)
    assert enc.faults == [
        f"the answer is cut by max_length {cut_at}: 5 of {whole.answer_tokens} answer tokens lost, "
        "the end token '<|im_end|>' among them (the model would never learn to stop)"
    ]
    short = TextPipeline(tiny_tokenizer, Prompt(system=None), max_length=cut_at).encode(
        Example("short", "hello", target="a b c")
    )
    r = cut_answers({"train": [enc, short]}, cut_at)
    assert (r["count"], r["tokens_lost"]) == (1, 5)
    assert r["examples"] == [
        {"split": "train", "id": "long", "answer_tokens": whole.answer_tokens, "tokens_lost": 5, "end_cut": True}
    ]
    assert (
        r["line"] == f"answers cut by max_length {cut_at}: 1 of 2 examples lose 5 answer "
        "tokens, 1 their end token: train/long (-5)"
    )
    assert cut_answers({"train": [short]}, cut_at)["line"] == f"answers cut by max_length {cut_at}: none"


def test_references_longer_than_the_generation_budget_are_counted(tiny_tokenizer):
    """A math-format set had 94 of 100 references over eval.max_new_tokens 64 and nothing warned: the
    answers are counted in the tokens the model must generate (its own tokenizer, end token left out)."""
    from tuneproof.data.checks import cut_by_generation

    pipe = TextPipeline(tiny_tokenizer, Prompt(system=None), max_length=512)
    long_answer = "add the piano bar to my Cindy Wilson playlist rate this book five out of six"
    n_long = len(tiny_tokenizer(long_answer, add_special_tokens=False)["input_ids"])
    enc = [pipe.encode(Example("v1", "hello", target=long_answer)), pipe.encode(Example("v2", "hi", target="a b c"))]
    assert enc[0].answer_tokens == n_long + 1  # the end token follows the answer
    r = cut_by_generation(enc, "validation", n_long - 1)
    assert (r["count"], r["n"], r["longest"], r["ids"]) == (1, 2, n_long, ["v1"])
    assert r["line"] == (
        f"answers longer than eval.max_new_tokens {n_long - 1}: 1 of 2 validation references (longest {n_long} "
        f"tokens; set eval.max_new_tokens to at least {n_long}, or the output metrics are capped): v1 ({n_long})"
    )
    sub = cut_by_generation(enc, "validation", n_long - 1, evaluated={"v2"})  # the eval.max_examples subset
    assert sub["in_evaluated"] == 0 and sub["line"].endswith(f"v1 ({n_long}); 0 of them among the 1 evaluated")
    ok = cut_by_generation(enc, "validation", n_long)  # the whole text fits; the end token is not needed for it
    assert ok["count"] == 0
    assert ok["line"] == f"answers longer than eval.max_new_tokens {n_long}: none of 2 validation references " + (
        f"(longest {n_long} tokens)"
    )


def test_suggested_max_length_never_cuts_an_answer():
    lengths = {"train": [30] * 99 + [500], "validation": [20, 610]}
    plain = length_stats(lengths, 128)
    assert plain["suggest_max_length"] == 40 and plain["whole_answers"] is None  # p99 = 34.7 -> 40
    r = length_stats(lengths, 128, keep_whole=lengths)
    assert r["whole_answers"] == 616 and r["suggest_max_length"] == 616  # longest 610 rounded up to a multiple of 8
    assert r["suggest_rule"].endswith(
        "raised to 616 tokens so that every answer stays whole (longest example, rounded up)"
    )


def test_data_check_states_every_result_when_it_finds_nothing(tmp_path, tiny_model_dir):
    rows = ["text,label"] + [
        f"sentence {i} about the topic {'rain sun'.split()[i % 2]} number {i * 7}," + "ab"[i % 2] for i in range(44)
    ]
    (tmp_path / "d.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "tuneproof.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "c",
                "hypothesis": {"behaviour": "b", "task": "classification", "success": {"metric": "macro_f1"}},
                "data": {
                    "sources": [{"path": "d.csv", "format": "csv"}],
                    "fields": {"label": "label"},
                    "split": {"fractions": {"train": 0.5, "validation": 0.5}},
                },
                "model": {"base": str(tiny_model_dir), "kind": "causal-lm"},
                "training": {"max_length": 128},
            }
        )
    )
    from tuneproof.recipes.data_check import data_report  # noqa: PLC0415

    rep = data_report(StudyContext.open(tmp_path))
    assert rep["sizes"] == {"train": 22, "validation": 22}
    template, gold = rep["checks"][:2]
    assert template.startswith("chat template: the tokenizer's (sha256 ") and template.endswith(
        "; end of turn '<|im_end|>' (auto: the special token the chat template puts after an assistant's content); "
        "system role: rendered"
    )
    assert gold == (
        "gold chain (eval.answer_from auto): the supervised span, decoded and parsed as the evaluation does, gives "
        "back 44 of 44 references exactly"
    )
    assert rep["checks"][2:] == [
        "empty texts dropped: none",
        "duplicates: none across train/validation",
        "classes under 10 examples: none in train/validation",
        "answers cut by max_length 128: none",
        "answers longer than eval.max_new_tokens 64: none of 22 validation references (longest 1 token)",
        # sentence, about, the, topic, rain, sun, number and the labels a, b: nothing lost by a byte-level BPE
        "tokenizer losses: 0 of 9 word types merged by its normalizer, 0 read without their diacritics, 0 with the "
        "unknown token (warns above 3%)",
        "classes missing from a split: none",
        "texts with different labels: none",
        "encoding faults (0 supervised tokens, end token, prompt prefix): none",
        "longer than max_length 128: none",
    ]
    assert rep["passed"] is True


def test_each_class_guard_states_how_many_classes_it_can_judge(tmp_path, tiny_model_dir):
    """A guard with min_support 5 on an eval subset of 2 per class was found only at `compare` ("not
    measurable", then every class name): the data check says it first, per guard, with the list capped."""
    labels = [f"c{k:02d}" for k in range(12)]
    rows = ["text,label"] + [
        f"sentence {i} about topic {labels[i % 12]} number {i * 7},{labels[i % 12]}" for i in range(120)
    ]
    (tmp_path / "d.csv").write_text("\n".join(rows) + "\n")
    guards = [
        {"metric": "per_class_recall", "max_drop": 0.1, "min_support": 5},
        {"metric": "per_class_f1", "max_drop": 0.1, "min_support": 2, "classes": ["c00", "c01"]},
        {"metric": "accuracy", "max_drop": 0.1},
    ]
    (tmp_path / "tuneproof.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "c",
                "hypothesis": {
                    "behaviour": "b",
                    "task": "classification",
                    "success": {"metric": "macro_f1"},
                    "guards": guards,
                },
                "data": {
                    "sources": [{"path": "d.csv", "format": "csv"}],
                    "fields": {"label": "label"},
                    "split": {"fractions": {"train": 0.5, "validation": 0.5}},
                },
                "model": {"base": str(tiny_model_dir), "kind": "causal-lm"},
                "eval": {"max_examples": 24},
            }
        )
    )
    from tuneproof.recipes.data_check import data_report  # noqa: PLC0415

    rep = data_report(StudyContext.open(tmp_path))
    first, second = rep["guard_support"]
    assert (first["measurable"], first["items"], first["n"], first["warn"]) == (0, 12, 24, True)
    assert first["unmeasurable"] == dict.fromkeys(labels, 2)
    assert first["line"] == (
        "hypothesis.guards[0] per_class_recall (min_support 5): 0 of 12 classes measurable on validation "
        "(24 examples); support under 5: 'c00' 2, 'c01' 2, 'c02' 2, 'c03' 2, 'c04' 2, 'c05' 2, 'c06' 2, 'c07' 2, "
        "'c08' 2, 'c09' 2 and 2 more; compare would call it 'not measurable': lower min_support, evaluate more "
        "examples (eval.max_examples, data.split.max_examples) or name the classes"
    )
    assert first["line"] in rep["warnings"]
    assert (second["measurable"], second["items"], second["warn"]) == (2, 2, False)
    assert second["line"] == (
        "hypothesis.guards[1] per_class_f1 (min_support 2): 2 of 2 classes measurable on validation (24 examples)"
    )
    assert second["line"] in rep["checks"] and second["line"] not in rep["warnings"]


def test_optional_keys_absent_are_counted():
    from tuneproof.data.checks import absent_optional

    ex = [
        Example("a", "t", meta={"absent": ["slots"]}),
        Example("b", "t"),
        Example("c", "t", meta={"absent": ["slots", "topic"]}),
    ]
    r = absent_optional({"train": ex[:2], "validation": ex[2:]}, ["slots", "topic"])
    assert r["counts"] == {"slots": 2, "topic": 1}
    assert r["line"] == "optional keys (null when absent): slots absent in 2 of 3, topic absent in 1 of 3"
    assert absent_optional({"train": ex}, [])["line"] is None


def test_an_optional_source_column_is_counted_where_it_is_absent(tmp_path):
    """``optional: [intents]`` with ``target: {intent: intents}`` said "intents absent in 0 of 5" while 2
    rows had no ``intents`` key: the source column is counted, and the target key it feeds as well."""
    import json

    from tuneproof.data.checks import absent_optional
    from tuneproof.data.sources import load_json_records
    from tuneproof.study import FieldMap

    p = tmp_path / "d.jsonl"
    rows = [{"text": f"t{i}", "intents": ["a"]} for i in range(3)] + [{"text": "u"}, {"text": "v"}]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    fields = FieldMap(text="text", target={"intent": "intents"}, optional=["intents"])
    ex, _ = load_json_records(p, fields, "train", lines=True)
    r = absent_optional({"train": ex}, ["intents"])
    assert r["counts"] == {"intents": 2}
    assert r["line"] == "optional keys (null when absent): intents absent in 2 of 5"
    assert absent_optional({"train": ex}, ["intent"])["counts"] == {"intent": 2}


def test_the_data_check_screen_says_a_warned_check_once(capsys):
    """quickstart --fast printed "check train: 7 of 7 classes have fewer than 10 examples: ..." and the
    same text again as two warnings: a check line made of warnings is said once, as the warnings."""
    from tuneproof.modalities.text import TEXT
    from tuneproof.recipes.data_check import _print

    warnings = [
        "train: 2 of 3 classes have fewer than 10 examples: 'b' 3, 'c' 9",
        "validation: 1 of 3 classes have fewer than 10 examples: 'b' 2",
    ]
    rep = {
        "fingerprint": {"hash": "0" * 64},
        "sizes": {"train": 24, "validation": 13},
        "repairs": [],
        "images": None,
        "lengths": {"max_length": 64, "suggest_max_length": 32, "splits": {}},
        "encoding_faults": [],
        "hard_faults": [],
        "checks": ["duplicates: none across train/validation", "; ".join(warnings)],
        "warnings": warnings,
        "passed": True,
    }
    _print(rep, TEXT.dossier_sections)
    out = capsys.readouterr().out
    assert out.count("'b' 3, 'c' 9") == 1 and out.count("validation: 1 of 3 classes") == 1
    assert "check duplicates: none across train/validation" in out and "data check passed" in out


def test_splits_and_fault_lists_have_one_stable_order():
    """The data check said `splits train 30, validation 12, test 6` then `splits test 6, train 30, validation 12`;
    fault lists put chats:10 before chats:2."""
    from tuneproof.data.audit import audit_targets
    from tuneproof.data.checks import audit_lines
    from tuneproof.data.examples import natural_key
    from tuneproof.data.split import split_order

    assert split_order(["test", "validation", "train"], "validation", "test") == ["train", "validation", "test"]
    assert split_order(["test", "zeta", "dev", "train", "alpha"], "dev", "test") == [
        "train",
        "dev",
        "alpha",
        "zeta",
        "test",
    ]
    assert sorted(["chats.jsonl:10", "b.jsonl:3", "chats.jsonl:2"], key=natural_key) == [
        "b.jsonl:3",
        "chats.jsonl:2",
        "chats.jsonl:10",
    ]
    bad = [Example(id=f"chats:{i}", text="t", target="{x", source=f"chats.jsonl:{i}") for i in (10, 2, 33)]
    rep = audit_targets(bad, [])
    assert [i["source"] for i in rep["invalid"]] == ["chats.jsonl:2", "chats.jsonl:10", "chats.jsonl:33"]
    assert "not strict JSON (parse rate 0.0%): chats.jsonl:2 (" in rep["hard_faults"][0]
    faults = [
        {"split": s, "id": i, "fault": "0 supervised tokens"} for s, i in (("test", "t:1"), ("train", "chats:10"))
    ]
    faults.append({"split": "train", "id": "chats:2", "fault": "0 supervised tokens"})
    line = next(x for x in audit_lines({}, None, faults, {}) if x.startswith("encoding faults"))
    assert line == "encoding faults: 3 examples (train/chats:2, train/chats:10, test/t:1)"


def test_the_context_lists_splits_train_eval_others_test(tmp_path, tiny_model_dir):
    names = ("test", "extra", "train", "dev")  # sources in an order the screen must not follow
    for k, name in enumerate(names):
        rows = ["text,label"] + [f"sentence {k} {i} about {'ab'[i % 2]} number {i * 7},{'ab'[i % 2]}" for i in range(8)]
        (tmp_path / f"{name}.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "tuneproof.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "o",
                "hypothesis": {"behaviour": "b", "task": "classification", "success": {"metric": "macro_f1"}},
                "data": {
                    "sources": [{"path": f"{n}.csv", "format": "csv", "split": n} for n in names],
                    "fields": {"label": "label"},
                },
                "model": {"base": str(tiny_model_dir), "kind": "causal-lm"},
                "eval": {"split": "dev"},
            }
        )
    )
    assert list(StudyContext.open(tmp_path).all_splits) == ["train", "dev", "extra", "test"]
    assert list(StudyContext.open(tmp_path).all_splits) == ["train", "dev", "extra", "test"]  # reusing the manifest


def test_one_fault_shared_by_many_examples_is_printed_once_with_its_count():
    from tuneproof.data.checks import fault_lines

    why = "the supervised answer, parsed as the evaluation does, reads nothing (eval.answer_from: no match)"
    enc = [{"split": "validation", "id": f"ex{i}", "fault": why} for i in range(1, 28)]
    enc.append({"split": "train", "id": "t9", "fault": "0 supervised tokens after truncation"})
    hard = ["train: 2 of 5 targets are not strict JSON"] + [f"{f['split']}/{f['id']}: {f['fault']}" for f in enc]
    assert fault_lines(hard, enc) == [
        "train: 2 of 5 targets are not strict JSON",
        f"validation/ex1, validation/ex2, validation/ex3 and 24 more (27 examples): {why}",
        "train/t9: 0 supervised tokens after truncation",
    ]
    assert fault_lines([], []) == []
