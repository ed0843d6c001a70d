"""What the tokenizer loses of the study's language, measured on its own data (docs/PROTOCOL.md step 3).

An uncased encoder tokenizer (BERT's ``BasicTokenizer`` rules, kept in a fast tokenizer's
normalizer: lowercasing, then NFD and removal of combining marks) merges word types that the
language keeps apart: Vietnamese ``Việt`` / ``Viet`` / ``viết``, Italian ``è`` (is) / ``e`` (and),
Dutch ``één`` / ``een``. A tokenizer without byte fallback maps characters it does not know to its
unknown token. Neither shows in a loss curve; both cap what any fine-tuning can learn.

:func:`tokenizer_loss` runs the tokenizer's own normalizer (``tokenizers.normalizers``) on every
word type of the texts and encodes each type once, and reports the share of word types merged
with another one (by cause: lowercasing, accent stripping, other normalisation), the share read
without its diacritics even where no other type shares its form (French ``élève`` read as ``eleve``:
the model never sees the accent, and a generative model cannot write it), and the share that holds
the unknown token, each with examples; above :data:`WARN_SHARE` each is a data-check warning. A
byte-level BPE tokenizer (GPT-2, Llama-3, Qwen, SmolLM) loses nothing here: no normalizer that
changes words, no unknown token.
"""

from __future__ import annotations

import re
import unicodedata
from collections import defaultdict
from typing import Any

from tuneproof.ui import capped

#: share of word types merged (or holding the unknown token) above which the data check warns
WARN_SHARE = 0.03
#: examples named per finding
SHOWN = 5
_WORD = re.compile(r"\w+", re.UNICODE)


def word_types(texts: list[str]) -> list[str]:
    """The distinct words (``\\w+``, Unicode) of ``texts``, in order of first appearance, digits-only words left out."""
    seen: dict[str, None] = {}
    for t in texts:
        for w in _WORD.findall(t):
            if not w.isdigit():
                seen.setdefault(w, None)
    return list(seen)


def strip_accents(word: str) -> str:
    """``word`` in NFD without its combining marks (Unicode category Mn), as BERT's uncased
    tokenizer strips accents (``đ`` is a letter of its own, not an accented ``d``: kept)."""
    return "".join(c for c in unicodedata.normalize("NFD", word) if unicodedata.category(c) != "Mn")


def _sentence_case(word: str) -> str:
    return word[:1].lower() + word[1:]


def _cause(word: str, normalised: str) -> str:
    if normalised == word.lower() or normalised == word.casefold():
        return "lowercasing"
    if normalised in (strip_accents(word), strip_accents(word.lower()), strip_accents(word).lower()):
        return "accent stripping" if strip_accents(word) != word else "lowercasing"
    return "other normalisation"


def tokenizer_loss(tokenizer, texts: list[str], warn_share: float = WARN_SHARE) -> dict[str, Any]:
    """What ``tokenizer`` loses of the words of ``texts`` (inputs, references, chat turns).

    Args:
        tokenizer: a Hugging Face tokenizer; a fast one's ``backend_tokenizer.normalizer`` is the
            normalisation measured (a slow one: only unknown tokens are measured).
        texts: the texts the model reads and writes.
        warn_share: the share of word types above which a finding is a warning.

    Returns:
        ``{"word_types", "merged_types", "merged_into", "by_cause": {cause: types}, "merged_examples":
        [{"types", "form"}], "stripped_types", "stripped_examples", "unknown_types", "unknown_examples",
        "warnings", "line"}``; shares are of
        ``word_types``. A type is *merged* when another type of the texts normalises to the same form
        and the two differ in more than the case of their first letter (``What`` / ``what`` is where
        a word stands in a sentence, not a second word). A type is *stripped* when it holds a
        combining mark (NFD) that the normalizer removes, merged or not.
    """
    types = word_types(texts)
    norm = getattr(getattr(tokenizer, "backend_tokenizer", None), "normalizer", None)
    forms: dict[str, list[str]] = defaultdict(list)
    for w in types:
        forms[norm.normalize_str(w) if norm is not None else w].append(w)
    # a capital first letter is where a word stands (a sentence start), not another word: "What" / "what"
    # alone are not counted as a loss; "Việt" / "viết" / "viet" and "è" / "e" are
    merged = {f: ws for f, ws in forms.items() if len({_sentence_case(w) for w in ws}) > 1}
    by_cause: dict[str, int] = defaultdict(int)
    for f, ws in merged.items():
        for w in ws:
            if w != f:
                by_cause[_cause(w, f)] += 1
    n_merged = sum(len(ws) for ws in merged.values())
    # diacritics lost whether or not another type shares the form: "élève" -> "eleve"
    stripped = [
        w
        for f, ws in forms.items()
        for w in ws
        if strip_accents(w) != w and f != w and _cause(w, f) == "accent stripping"
    ]
    # the most visible merges first: the forms that absorb the most types
    examples = [{"types": ws[:4], "form": f} for f, ws in sorted(merged.items(), key=lambda kv: -len(kv[1]))[:SHOWN]]
    unk_id = getattr(tokenizer, "unk_token_id", None)
    unknown: list[str] = []
    if unk_id is not None and types:
        ids = tokenizer(types, add_special_tokens=False)["input_ids"]
        unknown = [w for w, t in zip(types, ids) if unk_id in t]
    n = len(types)
    warnings = []
    if n and n_merged / n > warn_share:
        causes = ", ".join(f"{c} {k:,}" for c, k in sorted(by_cause.items(), key=lambda kv: -kv[1]))
        warnings.append(
            f"the tokenizer merges {n_merged:,} of {n:,} word types ({n_merged / n:.1%}) into {len(merged):,} "
            f"forms ({causes}): the model cannot tell them apart, e.g. "
            + capped([", ".join(map(repr, e["types"])) + f" → {e['form']!r}" for e in examples], cap=SHOWN, sep="; ")
            + "; a cased (or byte-level) tokenizer keeps them"
        )
    if n and len(stripped) / n > warn_share:
        warnings.append(
            f"the tokenizer reads {len(stripped):,} of {n:,} word types ({len(stripped) / n:.1%}) without their "
            f"diacritics, e.g. "
            + capped([f"{w!r} → {norm.normalize_str(w)!r}" for w in stripped], cap=SHOWN, sep="; ")
            + ": the model never sees them (and cannot write them); a cased (or byte-level) tokenizer keeps them"
        )
    if n and len(unknown) / n > warn_share:
        warnings.append(
            f"{len(unknown):,} of {n:,} word types ({len(unknown) / n:.1%}) hold the unknown token "
            f"{tokenizer.unk_token!r}: the model reads them as one unknown symbol, e.g. {capped(unknown, cap=SHOWN)}"
        )
    if warnings:
        line = "tokenizer: " + "; ".join(warnings)
    elif n:
        line = (
            f"tokenizer losses: {n_merged:,} of {n:,} word types merged by its normalizer, "
            f"{len(stripped):,} read without their diacritics, {len(unknown):,} with the unknown token "
            f"(warns above {warn_share:.0%})"
        )
    else:
        line = None
    return {
        "word_types": n,
        "merged_types": n_merged,
        "merged_into": len(merged),
        "by_cause": dict(by_cause),
        "merged_examples": examples,
        "stripped_types": len(stripped),
        "stripped_examples": stripped[:SHOWN],
        "unknown_types": len(unknown),
        "unknown_examples": unknown[:SHOWN],
        "warnings": warnings,
        "line": line,
    }
