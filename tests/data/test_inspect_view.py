"""Inspection shows what the trainer sees (cousins of docs/CASES.md C2/C3): the class index
and name for sequence classification with a legend that matches, the token each supervised
position is scored against in the terminal, the training prefix vs the inference prompt with a
character diff, and ``-n K`` meaning K per category (K in total without categories)."""

from __future__ import annotations

from collections import Counter

from rich.console import Console

from tinymodels import CHATML, make_tokenizer
from tuneproof.data.examples import Example
from tuneproof.data.inspect import LEGEND_CLS, choose_examples, render_html, render_rich, scored_pairs, token_rows
from tuneproof.data.preprocess import TextPipeline, char_diff, visible
from tuneproof.study import Prompt


def _plain(text) -> str:
    c = Console(width=400, record=True, file=open("/dev/null", "w"))
    c.print(text, soft_wrap=True)
    return c.export_text()


def test_sequence_classification_shows_class_index_and_name(tiny_tokenizer):
    pipe = TextPipeline(tiny_tokenizer, Prompt(), max_length=64, labels=["alarm", "music", "weather"])
    enc = pipe.encode(Example("e1", "what is the weather in Rome tomorrow", label="weather"))
    out = _plain(render_rich(enc, tiny_tokenizer, pipe.labels))
    assert enc.class_index == 2
    assert "the head is trained on class 2 = 'weather' (of 3)" in out
    assert "answer 0 tokens" not in out and "supervised" not in out
    assert "class K = name" in LEGEND_CLS and "no token is scored" in LEGEND_CLS
    page = render_html([(enc, token_rows(enc, tiny_tokenizer))], "t", pipe.labels)
    assert (
        "class 2 = &#x27;weather&#x27; (of 3)" in page
        and "no token is scored" in page
        and "green: supervised" not in page
    )


def test_terminal_shows_which_token_each_supervised_position_is_scored_against(tiny_tokenizer):
    enc = TextPipeline(tiny_tokenizer, Prompt(system=None), max_length=128).encode(
        Example("e", "hello world", target="a b c")
    )
    rows = token_rows(enc, tiny_tokenizer)
    pairs = scored_pairs(rows)
    assert len(pairs) == enc.n_supervised
    first_sup = next(t for t, lab in enumerate(enc.labels) if lab != -100)
    # the first scored position is the last prompt token, scored against the first answer token
    assert (
        pairs[0] == f"{first_sup - 1}:{visible(rows[first_sup - 1]['text'])}→"
        f"{visible(tiny_tokenizer.decode([enc.input_ids[first_sup]]))}"
    )
    assert "".join(p.split("→", 1)[1] for p in pairs) == "a·b·c<|im_end|>"  # targets read as the answer + end token
    last = len(enc.input_ids) - 2
    assert pairs[-1] == f"{last}:{visible(rows[last]['text'])}→<|im_end|>"
    out = _plain(render_rich(enc, tiny_tokenizer))
    assert "scored: " + "  ".join(pairs) in out


def test_training_prefix_vs_inference_prompt_diff_from_the_template():
    # a template that adds a line only when the generation prompt is asked for (inference), not when an answer follows
    tmpl = "{% if add_generation_prompt %}Today: Monday\n{% endif %}" + CHATML
    tok = make_tokenizer(tmpl)
    enc = TextPipeline(tok, Prompt(system=None), max_length=128).encode(Example("e", "hello world", target="a b c"))
    d = enc.prefix_diff
    assert d["prompt"] == "Today: Monday\n<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\n"
    assert d["training_prefix"] == "<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\n"
    assert d["first_difference"] == 0
    assert d["diff"] == "[-Today:·Monday\\n-]<|im_start|>user\\nhello·world<|im_end|>\\n<|im_start|>assistant\\n"
    assert any("first difference at character 0" in f for f in enc.faults)
    out = _plain(render_rich(enc, tok))
    assert "inference prompt: Today:·Monday\\n<|im_start|>user" in out and "training prefix:  <|im_start|>user" in out
    assert "diff ([-prompt only-] {+training only+}): [-Today:·Monday\\n-]" in out
    assert char_diff("abXd", "abYd") == (2, "ab[-X-]{+Y+}d")


def test_n_means_k_per_category_and_k_in_total_without_categories(tiny_tokenizer):
    pipe = TextPipeline(tiny_tokenizer, Prompt(system=None), max_length=256)
    labelled = [
        Example(f"{c}{i}", "hello " * (i + 1), label=c, target="a")
        for c, n in (("a", 5), ("b", 6), ("c", 2))
        for i in range(n)
    ]
    enc = pipe.encode_all(labelled)
    chosen = choose_examples(labelled, enc, 3, seed=0)
    assert Counter(labelled[i].label for i in chosen) == {"a": 3, "b": 3, "c": 2}
    assert labelled.index(next(e for e in labelled if e.id == "b5")) in chosen  # the longest is one of the three
    plain = [Example(f"x{i}", "hello " * (i % 7 + 1), target="a") for i in range(10)]
    chosen = choose_examples(plain, pipe.encode_all(plain), 3, seed=0)
    assert len(chosen) == 3 and 6 in chosen  # x6 is the longest


def test_data_check_and_inspect_print_the_prefix_diff_in_the_terminal(tmp_path, capsys):
    import json

    import pytest
    import yaml

    from tinymodels import make_llama
    from tuneproof.cli import main

    tok = make_tokenizer("{% if add_generation_prompt %}Today: Monday\n{% endif %}" + CHATML)
    base = tmp_path / "base"
    make_llama(len(tok)).save_pretrained(base, safe_serialization=True)
    tok.save_pretrained(base)
    rows = [{"text": f"hello world {i}", "target": json.dumps({"intent": "greet"})} for i in range(4)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "tuneproof.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "c3",
                "hypothesis": {
                    "behaviour": "b",
                    "task": "extraction",
                    "success": {"metric": "field_f1"},
                    "required_fields": ["intent"],
                },
                "data": {
                    "sources": [{"path": "d.jsonl", "format": "jsonl"}],
                    "fields": {"target": "target"},
                    "split": {"fractions": {"train": 0.5, "validation": 0.5}},
                },
                "model": {"base": str(base)},
            }
        )
    )
    with pytest.raises(SystemExit) as exit_:
        main(["data", "check", "--study", str(tmp_path)])
    out = capsys.readouterr().out
    assert exit_.value.code == 3
    assert "first difference at character 0" in out
    assert "inference prompt: Today:·Monday\\n<|im_start|>user\\nhello·world" in out
    assert "training prefix:  <|im_start|>user\\nhello·world" in out
    assert "diff ([-prompt only-] {+training only+}): [-Today:·Monday\\n-]<|im_start|>user" in out
    with pytest.raises(SystemExit) as exit_:
        main(["data", "inspect", "--study", str(tmp_path), "-n", "1"])
    out = capsys.readouterr().out
    assert exit_.value.code in (0, None) and out.count("training prefix differs from the inference prompt") == 1


def test_the_header_names_the_category_only_when_the_example_has_one(tiny_tokenizer):
    from tuneproof.data.inspect import header

    pipe = TextPipeline(tiny_tokenizer, Prompt(system=None), max_length=128)
    plain = pipe.encode(Example("ex100", "hello world", target="a b c"))
    assert plain.category in (None, "") and header(plain).startswith("ex100 prompt ")  # was 'ex100 [] prompt'
    cat = pipe.encode(Example("ex101", "hello world", target="a b c", label="Sky"))
    assert header(cat).startswith("ex101 [Sky] prompt ")
