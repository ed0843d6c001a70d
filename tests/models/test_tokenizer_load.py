"""The base's tokenizer: a folder without tokenizer files, or a tokenizer with no pad token and no end token to pad
with, is a one-line error naming the folder (exit 2), never transformers' raw ValueError or an empty tokenizer."""

from __future__ import annotations

import pytest

from tuneproof.errors import TuneproofError
from tuneproof.models.base_model import BaseModelRef, load_tokenizer


def _ref(path):
    return BaseModelRef(str(path), path, "local", "sequence-classification", "local")


def _word_tokenizer(folder, **specials):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["[UNK]", "[SEP]", "good", "bad", "film"])}
    raw = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]", **specials).save_pretrained(folder)
    return folder


def test_a_tokenizer_with_no_end_token_and_no_pad_token_is_named(tmp_path):
    folder = _word_tokenizer(tmp_path / "no-end")
    with pytest.raises(TuneproofError) as err:
        load_tokenizer(_ref(folder))
    assert err.value.exit_code == 2
    assert err.value.message == (
        f"tokenizer of {folder}: TokenizersBackend has no pad token and no end token (eos_token None, sep_token None): "
        "a batch cannot be padded"
    )
    # with an end token it pads with it (what encoders without a pad token get)
    tok = load_tokenizer(_ref(_word_tokenizer(tmp_path / "sep", sep_token="[SEP]")))
    assert tok.pad_token == "[SEP]" and tok.pad_token_id == 1


def test_a_folder_without_tokenizer_files_is_named(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(TuneproofError) as err:
        load_tokenizer(_ref(tmp_path))
    assert err.value.message == (
        f"tokenizer of {tmp_path}: none found "
        "(no tokenizer file: tokenizer.json, tokenizer_config.json, vocab.txt, ...)"
    )
