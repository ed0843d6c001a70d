"""Added tokens (docs/CASES.md C6 kind): a tokenizer with tokens beyond the base's embedding rows
is trained on a resized base (new rows = mean of the old ones, the same in every process); the export
records the base vocabulary size before resizing and the added tokens apart from the special tokens;
verifying on a base of another size names both sizes."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from tiny_study import make_study, prepare_study
from tuneproof.cli import main
from tuneproof.io import read_json


def cli(capsys, *args) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_:
        main(list(args))
    return exit_.value.code, " ".join(capsys.readouterr().out.split())


def test_fit_embeddings_is_deterministic_and_a_no_op_when_rows_suffice(tiny_base):
    import torch
    from transformers import AutoModelForCausalLM

    from tuneproof.models.base_model import fit_embeddings

    model = AutoModelForCausalLM.from_pretrained(tiny_base)
    rows = model.get_input_embeddings().weight.shape[0]
    assert fit_embeddings(model, rows) is None and fit_embeddings(model, rows - 3) is None
    before = model.get_input_embeddings().weight[:rows].clone()
    assert fit_embeddings(model, rows + 2) == {"base_vocab_size": rows, "resized_to": rows + 2}
    w = model.get_input_embeddings().weight
    assert w.shape[0] == rows + 2 and torch.equal(w[:rows], before)
    assert torch.equal(w[rows], before.mean(0)) and torch.equal(w[rows + 1], before.mean(0))
    head = model.get_output_embeddings().weight
    assert head.shape[0] == rows + 2 and torch.equal(head[rows], head[:rows].mean(0))
    assert model.config.vocab_size == rows + 2


def test_export_records_base_size_and_added_tokens_and_another_base_size_is_named(tiny_base, tmp_path, capsys):
    from tokenizers import AddedToken
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = shutil.copytree(tiny_base, tmp_path / "base")
    v0 = json.loads((base / "config.json").read_text())["vocab_size"]
    tok = AutoTokenizer.from_pretrained(base)
    assert len(tok) == v0
    tok.add_tokens(["<slot>", "<val>"])
    tok.add_tokens([AddedToken("<|tool|>", special=True)], special_tokens=True)
    tok.save_pretrained(base)
    assert len(AutoTokenizer.from_pretrained(base)) == v0 + 3

    study = make_study(tmp_path / "s", base, prepare=False, max_steps=2, checkpoint_every=2)
    cfg = yaml.safe_load((study / "tuneproof.yaml").read_text())
    cfg["method"]["modules_to_save"] = ["embed_tokens", "lm_head"]  # the added rows are trained and saved
    (study / "tuneproof.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    prepare_study(study)
    code, out = cli(capsys, "train", "--study", str(study), "--skip-preflight", "added-token test")
    assert code == 0, out
    train_id = next(
        p.name for p in sorted((study / "runs").iterdir()) if read_json(p / "summary.json").get("kind") == "train"
    )
    method = read_json(study / "runs" / train_id / "method.json")
    assert method["vocabulary"]["base_vocab_size"] == v0 and method["vocabulary"]["tokenizer_size"] == v0 + 3

    code, out = cli(capsys, "export", train_id, "--study", str(study), "--verify-examples", "2")
    assert code == 0, out
    bundle = study / "exports" / train_id
    voc = read_json(bundle / "manifest.json")["vocabulary"]
    assert voc["base_vocab_size"] == v0 and voc["tokenizer_size"] == v0 + 3 and voc["resized"] is True
    assert voc["added_tokens"] == {"<slot>": v0, "<val>": v0 + 1}  # apart from the special tokens
    assert voc["added_special_tokens"]["<|tool|>"] == v0 + 2
    assert {"[PAD]", "[UNK]", "<|end|>", "<|user|>", "<|assistant|>", "<|system|>"} <= set(voc["added_special_tokens"])

    # a base of another size (the same model padded to v0 + 5 rows): both sizes are named
    other = shutil.copytree(base, tmp_path / "other")
    model = AutoModelForCausalLM.from_pretrained(other)
    model.resize_token_embeddings(v0 + 5, mean_resizing=False)
    model.save_pretrained(other, safe_serialization=True)
    code, out = cli(capsys, "verify", str(bundle), "--base", str(other))
    assert code == 3, out
    assert (
        f"base vocabulary size: the export was trained on a base with {v0} embedding rows (before resizing, resized to "
        f"{v0 + 3} for 2 added token(s)), {other} has {v0 + 5}"
    ) in out
