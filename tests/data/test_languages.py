"""Languages other than English (issue 30 item 5): `data inspect` shows byte-level BPE tokens as readable
characters with their boundaries, and the data check measures what the tokenizer loses (word types
merged by lowercasing or accent stripping, unknown tokens) on Vietnamese and Italian texts."""

from __future__ import annotations

import unicodedata

import pytest

from tinymodels import make_tokenizer
from tuneproof.data.examples import Example
from tuneproof.data.inspect import CONTINUES, readable_tokens, render_rich, token_rows
from tuneproof.data.languages import WARN_SHARE, strip_accents, tokenizer_loss, word_types
from tuneproof.data.preprocess import TextPipeline
from tuneproof.study import Prompt

VIETNAMESE = [
    "Tôi muốn đặt bàn cho hai người ở Hà Nội tối nay",
    "Bạn có biết thời tiết ở Việt Nam ngày mai không",
    "Viết cho tôi một bài thơ về mùa thu",
    "Bàn này của ai vậy",
    "Ban nhạc chơi bài hát mới",
    "viet nam là một đất nước đẹp",
]
ITALIAN = [
    "La città è bella e il caffè è buono",
    "Perché non vieni con me alla festa",
    "Il papa è a Roma, il papà è a casa",
    "Però la pero non è matura",
]


def _uncased_wordpiece(texts: list[str]):
    """An uncased WordPiece tokenizer (BERT's normalizer: lowercase, strip accents) whose vocabulary is the
    stripped words of ``texts``, built here (no download)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "[PAD]": 3}
    for w in word_types(texts):
        vocab.setdefault(strip_accents(w.lower()), len(vocab))
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]")


def test_an_uncased_tokenizer_merging_vietnamese_words_is_warned_with_examples():
    rep = tokenizer_loss(_uncased_wordpiece(VIETNAMESE), VIETNAMESE)
    # Việt / Viết / viet -> viet; Bàn / bàn / Bạn / Ban -> ban; Nam / nam; bài / ... : real merges, counted exactly
    types = word_types(VIETNAMESE)
    forms = {}
    for w in types:
        forms.setdefault(strip_accents(w.lower()), []).append(w)
    # counted: forms that absorb words differing in more than a capital first letter
    merged = [v for v in forms.values() if len({w[0].lower() + w[1:] for w in v}) > 1]
    want = sum(len(v) for v in merged)
    assert {"Nam", "nam"} in [set(v) for v in forms.values()] and ["Nam", "nam"] not in merged  # a sentence start
    assert rep["word_types"] == len(types) and rep["merged_types"] == want > 0.1 * len(types)
    assert rep["merged_into"] == len(merged)
    assert rep["by_cause"]["accent stripping"] > 0
    accented = [w for w in types if strip_accents(w) != w]
    assert rep["stripped_types"] == len(accented) and rep["unknown_types"] == 0
    assert len(rep["warnings"]) == 2 and rep["warnings"][1].startswith(
        f"the tokenizer reads {len(accented)} of {len(types)} word types"
    )
    w = rep["warnings"][0]
    assert w.startswith(f"the tokenizer merges {want} of {len(types)} word types")
    assert "'Việt', 'Viết', 'viet' → 'viet'" in w and "a cased (or byte-level) tokenizer keeps them" in w


def test_italian_accents_that_carry_meaning_are_counted():
    rep = tokenizer_loss(_uncased_wordpiece(ITALIAN), ITALIAN)
    merged = {e["form"]: set(e["types"]) for e in rep["merged_examples"]}
    assert {"è", "e"} <= merged["e"] and {"papa", "papà"} <= merged["papa"] and {"Però", "pero"} <= merged["pero"]
    assert rep["warnings"]


def test_diacritics_lost_without_a_merge_are_counted_and_named():
    # French: no two types share a stripped form, yet the model reads 'élève' as 'eleve'
    texts = ["L'élève préfère le théâtre", "Où est la forêt"]
    rep = tokenizer_loss(_uncased_wordpiece(texts), texts)
    assert rep["merged_types"] == 0
    assert rep["stripped_types"] == 5 and rep["stripped_examples"] == ["élève", "préfère", "théâtre", "Où", "forêt"]
    assert rep["warnings"] == [
        "the tokenizer reads 5 of 9 word types (55.6%) without their diacritics, e.g. 'élève' → 'eleve'; "
        "'préfère' → 'prefere'; 'théâtre' → 'theatre'; 'Où' → 'ou'; 'forêt' → 'foret': the model never sees "
        "them (and cannot write them); a cased (or byte-level) tokenizer keeps them"
    ]
    plain = ["Le chat est noir", "Il fait beau"]
    rep = tokenizer_loss(_uncased_wordpiece(plain), plain)
    assert rep["stripped_types"] == 0 and rep["warnings"] == []


def test_unknown_tokens_are_counted_and_named():
    tok = _uncased_wordpiece(ITALIAN)  # knows no Vietnamese word
    rep = tokenizer_loss(tok, ITALIAN + ["xin chào bạn"])
    assert rep["unknown_types"] == 3 and rep["unknown_examples"] == ["xin", "chào", "bạn"]
    assert any("3 of" in w and "hold the unknown token '[UNK]'" in w for w in rep["warnings"])


def test_a_byte_level_tokenizer_loses_nothing_and_says_so():
    rep = tokenizer_loss(make_tokenizer(), VIETNAMESE + ITALIAN)
    assert rep["merged_types"] == 0 and rep["unknown_types"] == 0 and rep["warnings"] == []
    assert rep["line"] == (
        f"tokenizer losses: 0 of {rep['word_types']} word types merged by its normalizer, 0 read without their "
        f"diacritics, 0 with the unknown token (warns above {WARN_SHARE:.0%})"
    )


def test_capitalised_sentence_starts_are_not_a_loss_but_other_case_merges_are():
    texts = ["The cat sat", "the dog ran", "What now", "what then"]
    rep = tokenizer_loss(_uncased_wordpiece(texts), texts)
    assert rep["merged_types"] == 0 and rep["warnings"] == []
    texts += ["the USA and the usa", "iPhone or iphone"]
    rep = tokenizer_loss(_uncased_wordpiece(texts), texts)
    assert rep["merged_types"] == 4 and rep["by_cause"] == {"lowercasing": 2}
    assert rep["warnings"] and "'USA', 'usa' → 'usa'" in rep["warnings"][0]


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()  # byte-level BPE trained on English: Vietnamese characters split into byte tokens


def test_readable_tokens_merge_the_bytes_of_a_character_and_keep_the_boundaries(tok):
    text = "Tôi muốn đặt bàn ở Việt Nam 🍕"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert any("\ufffd" in tok.decode([i]) for i in ids)  # the tokenizer does split characters
    shown = readable_tokens(ids, tok)
    assert len(shown) == len(ids)  # one cell per token
    assert not any("\ufffd" in s for s in shown)
    assert "".join(s for s in shown if s != CONTINUES) == text
    assert "ệ" in shown and shown[shown.index("ệ") + 1] == CONTINUES
    assert "🍕" in shown and shown[shown.index("🍕") + 1 : shown.index("🍕") + 4] == [CONTINUES] * 3


def test_inspect_rows_of_a_vietnamese_example_show_no_replacement_character(tok):
    ex = Example(id="vi1", text="Bạn có khỏe không", target="Tôi khỏe, cảm ơn")
    enc = TextPipeline(tok, Prompt(), 256).encode(ex)
    rows = token_rows(enc, tok)
    assert not any("\ufffd" in r["text"] for r in rows)
    assert not any(r["scored_against"] and "\ufffd" in r["scored_against"] for r in rows)
    plain = render_rich(enc, tok).plain
    assert "\ufffd" not in plain and "ơ" in plain and CONTINUES in plain
    # the supervised text still reads as the answer, token boundaries aside
    sup = "".join(r["text"] for r in rows if r["supervised"] and r["text"] != CONTINUES)
    assert unicodedata.normalize("NFC", sup) == "Tôi khỏe, cảm ơn<|im_end|>"
