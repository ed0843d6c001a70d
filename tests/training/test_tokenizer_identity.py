"""Tokenizer identity (docs/CASES.md C13 kind): ``eval`` and ``export`` compare the tokenizer with
the one recorded by the train run and its baseline and refuse, naming both; the probe covers the
study's own texts, so a tokenizer with two swapped ids is caught although it splits the fixed probe
sentence exactly as before."""

from __future__ import annotations

import json
import shutil

import pytest

from tiny_study import make_study
from tuneproof.cli import main
from tuneproof.context import StudyContext
from tuneproof.io import read_json
from tuneproof.models.identity import compare_tokenizer, probe_sample, study_tokenizer_identity
from tuneproof.registry import Registry


def cli(capsys, *args) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_:
        main(list(args))
    return exit_.value.code, " ".join(capsys.readouterr().out.split())


def swap_ids(base, a: str, b: str) -> callable:
    """Swap the ids of tokens ``a`` and ``b`` in the base's tokenizer.json; returns the undo."""
    path = base / "tokenizer.json"
    text = path.read_text()
    tok = json.loads(text)
    vocab = tok["model"]["vocab"]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    path.write_text(json.dumps(tok))
    return lambda: path.write_text(text)


def test_probe_sample_is_fixed_and_order_free():
    texts = [f"t{i:03d}" for i in range(100)]
    assert probe_sample(texts, 4) == ["t000", "t025", "t050", "t075"] == probe_sample(list(reversed(texts)), 4)
    assert probe_sample(["b", "a", "a", ""], 4) == ["a", "b"]


def test_two_swapped_ids_are_refused_by_eval_and_export(tiny_base, tmp_path, capsys):
    from transformers import AutoTokenizer

    from tuneproof.recipes.train import run_train

    base = shutil.copytree(tiny_base, tmp_path / "base")  # its tokenizer is edited below
    study = make_study(tmp_path / "s", base, max_steps=2, checkpoint_every=2)  # data check r0001, baseline r0002
    ctx = StudyContext.open(study)
    train_id = run_train(ctx)
    texts = [t for e in ctx.split("validation") for t in (e.text, e.target)]
    ctx.registry.close()
    recorded = read_json(study / "runs" / train_id / "tokenizer_identity.json")
    assert recorded == read_json(study / "runs" / "r0002" / "tokenizer_identity.json")
    assert recorded["study_probe_n"] == 12  # 6 eval inputs + 6 references, all distinct

    undo = swap_ids(base, "sun", "moon")
    swapped = study_tokenizer_identity(AutoTokenizer.from_pretrained(base), texts)
    # the fixed probe sentence, the class and the size cannot tell; the vocabulary map and the study probe can
    assert swapped["probe_hash"] == recorded["probe_hash"] and swapped["vocab_size"] == recorded["vocab_size"]
    problems = compare_tokenizer(recorded, swapped)
    assert [p.split(":")[0] for p in problems] == [
        "tokenizer vocab_sha256",
        "tokenizer study_probe_hash (token ids of 12 of the study's evaluation texts)",
    ]
    assert f"expected {recorded['study_probe_hash']!r}, found {swapped['study_probe_hash']!r}" in problems[1]

    code, out = cli(capsys, "eval", train_id, "--study", str(study))
    assert code == 3, out
    assert (
        f"eval refused: the tokenizer of {base} differs from the one recorded "
        f"by train run {train_id} and baseline run r0002: "
        f"tokenizer vocab_sha256: expected '{recorded['vocab_sha256']}', found '{swapped['vocab_sha256']}'"
    ) in out
    assert f"found '{swapped['study_probe_hash']}'" in out
    assert Registry(study).list(kind="eval") == []  # refused before any eval run
    code, out = cli(capsys, "export", train_id, "--study", str(study))
    assert (
        code == 3
        and f"export refused: the tokenizer of {base} differs from the one recorded by train run {train_id}" in out
    )
    assert Registry(study).list(kind="export") == [] and not (study / "exports").exists()

    undo()
    code, out = cli(capsys, "eval", train_id, "--study", str(study))
    assert code == 0, out
