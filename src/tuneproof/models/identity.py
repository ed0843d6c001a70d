"""The identity of a base model: what an adapter is bound to (docs/PROTOCOL.md step 4, docs/CASES.md C13).

An adapter is a difference to one exact set of base weights. The identity recorded at export
and checked by ``verify`` is: the id or path, the revision, the sha256 of every weight file the
model is loaded from, one combined hash over them, the sha256 of ``config.json``, and the
tokenizer (class, vocabulary size, added tokens, chat template hash and the hash of the token ids
of a fixed probe text, see :func:`tokenizer_identity`), plus, from
:func:`study_tokenizer_identity`, the sha256 of the whole token -> id map (``vocab_sha256``) and
the hash of the token ids of a fixed sample of the study's own evaluation texts
(``study_probe_hash``): a tokenizer with two ids swapped splits a fixed sentence the same way but
gives other ids for the study's words (docs/CASES.md C13 kind).

Pure hashing: nothing here imports torch, so a mismatch is found in a second or so.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from tuneproof.io import sha256_file, sha256_json
from tuneproof.models.base_model import weight_hashes

# tokenizer fields that must be equal for the adapter's token ids to mean the same thing
TOKENIZER_KEYS = (
    "class",
    "vocab_size",
    "added_tokens",
    "eos_token",
    "pad_token",
    "chat_template_sha256",
    "probe_hash",
    "vocab_sha256",
)
PROBE_SAMPLE = 32  # study texts in the probe (evenly spaced over the sorted distinct texts)


def tokenizer_identity(tokenizer) -> dict[str, Any]:
    """Tokenizer class, vocabulary size, special tokens, added tokens and a hash of the ids of a
    fixed probe text (two tokenizers that split text differently get different hashes)."""
    probe = 'tuneproof probe: Héllo, wörld! 12345 {"key": [1, 2]} <|im_end|>\n\tend'
    ids = tokenizer(probe, add_special_tokens=False)["input_ids"]
    return {
        "class": type(tokenizer).__name__,
        "vocab_size": len(tokenizer),
        "eos_token": tokenizer.eos_token,
        "pad_token": tokenizer.pad_token,
        "bos_token": getattr(tokenizer, "bos_token", None),
        "added_tokens": sorted(str(t) for t in tokenizer.get_added_vocab())[:50],
        "chat_template_sha256": hashlib.sha256((getattr(tokenizer, "chat_template", None) or "").encode()).hexdigest(),
        "probe_hash": hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest(),
    }


def vocab_sha256(tokenizer) -> str:
    """sha256 of the canonical JSON of the sorted ``[token, id]`` pairs of ``tokenizer.get_vocab()``
    (added tokens included): equal exactly when every token has the same id."""
    return sha256_json(sorted([str(t), int(i)] for t, i in tokenizer.get_vocab().items()))


def probe_sample(texts: list[str], n: int = PROBE_SAMPLE) -> list[str]:
    """A fixed sample of ``texts``: ``n`` evenly spaced over the sorted distinct non-empty texts
    (all of them when there are at most ``n``). Independent of the input order."""
    pool = sorted({t for t in texts if t})
    if len(pool) <= n:
        return pool
    return [pool[(i * len(pool)) // n] for i in range(n)]


def study_tokenizer_identity(tokenizer, texts: list[str]) -> dict[str, Any]:
    """The tokenizer identity of a study: :func:`tokenizer_identity` plus
    ``vocab_sha256`` (:func:`vocab_sha256`), ``study_probe_n``, ``study_probe_texts_sha256`` (the
    sampled texts) and ``study_probe_hash`` (sha256 of the JSON list of their token ids, no special
    tokens) over :func:`probe_sample` of ``texts`` (the study passes its evaluation inputs and references)."""
    ident = dict(tokenizer_identity(tokenizer))
    sample = probe_sample(texts)
    ids = [list(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in sample]
    ident.update(
        vocab_sha256=vocab_sha256(tokenizer),
        study_probe_n=len(sample),
        study_probe_texts_sha256=sha256_json(sample),
        study_probe_hash=sha256_json(ids),
    )
    return ident


def combined_weights_hash(weights: dict[str, str]) -> str:
    """One sha256 over a ``{file name: sha256}`` map: sha256 of the lines ``"<name>:<sha256>\\n"``
    sorted by name. Two folders get the same value exactly when every weight file is equal."""
    return hashlib.sha256("".join(f"{k}:{weights[k]}\n" for k in sorted(weights)).encode()).hexdigest()


def base_hashes(ref) -> dict[str, Any]:
    """The hashes that bind a run to its base: ``{"path", "revision", "weight_files": {file: sha256},
    "weights_sha256" (combined), "config_sha256"}`` of the folder ``from_pretrained`` reads.
    Weight hashes are cached by path, size and mtime (``tuneproof --rehash`` recomputes them)."""
    path = Path(ref.path)
    weights = weight_hashes(path)
    return {
        "path": str(path),
        "revision": ref.revision,
        "weight_files": weights,
        "weights_sha256": combined_weights_hash(weights),
        "config_sha256": sha256_file(path / "config.json") if (path / "config.json").is_file() else None,
    }


def compare_base(recorded: dict[str, Any], ref) -> list[str]:
    """Problems between the base hashes recorded at train start (:func:`base_hashes`) and the
    base ``ref`` resolves to now (empty: the same). Each names both hashes (docs/CASES.md C13)."""
    now = base_hashes(ref)
    problems = []
    if recorded.get("weights_sha256") and recorded["weights_sha256"] != now["weights_sha256"]:
        rec_files, now_files = recorded.get("weight_files") or {}, now["weight_files"]
        for name in sorted(set(rec_files) | set(now_files)):
            if rec_files.get(name) != now_files.get(name):
                problems.append(
                    f"weight file {name}: sha256 {rec_files.get(name) or '(absent)'} -> "
                    f"{now_files.get(name) or '(absent)'}"
                )
        problems.append(f"combined weights sha256 {recorded['weights_sha256']} -> {now['weights_sha256']}")
    if "config_sha256" in recorded and recorded["config_sha256"] != now["config_sha256"]:
        problems.append(f"config.json sha256 {recorded['config_sha256']} -> {now['config_sha256']}")
    return problems


def compare_recorded(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Problems between two recorded :func:`base_hashes` (empty: the same weights and config.json)."""
    out = []
    if a.get("weights_sha256") != b.get("weights_sha256"):
        out.append(f"combined weights sha256 {a.get('weights_sha256')} vs {b.get('weights_sha256')}")
    if a.get("config_sha256") != b.get("config_sha256"):
        out.append(f"config.json sha256 {a.get('config_sha256')} vs {b.get('config_sha256')}")
    return out


def base_identity(ref, tokenizer_id: dict[str, Any]) -> dict[str, Any]:
    """The identity of a resolved base model (:class:`tuneproof.models.base_model.BaseModelRef`).

    Returns ``{"name", "path", "revision", "kind", "source", "source_weight_sha256",
    "weight_files": {file: sha256}, "weights_sha256", "config_sha256", "tokenizer"}``.
    ``weight_files`` are the files ``from_pretrained`` reads (for the GGUF alias: the converted
    safetensors, while ``source_weight_sha256`` keeps the GGUF file's hash).
    """
    h = base_hashes(ref)
    return {
        "name": ref.name,
        "path": h["path"],
        "revision": ref.revision,
        "kind": ref.kind,
        "source": ref.source,
        "source_weight_sha256": dict(ref.weight_sha256),
        "weight_files": h["weight_files"],
        "weights_sha256": h["weights_sha256"],
        "config_sha256": h["config_sha256"],
        "tokenizer": dict(tokenizer_id),
    }


def compare_weights(expected: dict[str, str], folder: Path) -> list[str]:
    """Problems between the recorded weight files and those in ``folder`` (empty: identical).

    Each problem names the file and both sha256 values, then one line gives both combined
    hashes (docs/CASES.md C13: "refuse, naming both hashes").
    """
    found = weight_hashes(Path(folder))
    problems = []
    for name in sorted(set(expected) | set(found)):
        e, f = expected.get(name), found.get(name)
        if e == f:
            continue
        if f is None:
            problems.append(f"weight file {name} is missing from {folder} (expected sha256 {e})")
        elif e is None:
            problems.append(f"weight file {name} in {folder} was not part of the base at export (sha256 {f})")
        else:
            problems.append(f"weight file {name}: expected sha256 {e}, found {f}")
    if problems:
        problems.append(
            f"combined weights hash: expected {combined_weights_hash(expected)}, found {combined_weights_hash(found)}"
        )
    return problems


def base_vocab_size(folder: str | Path) -> int | None:
    """Embedding rows of the base in ``folder`` as its ``config.json`` says (``vocab_size``, or
    ``text_config.vocab_size`` for multimodal models): the size before any resizing."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        return None
    cfg = json.loads(path.read_text(encoding="utf-8"))
    size = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
    return int(size) if size is not None else None


def vocabulary_record(base_folder: str | Path, tokenizer) -> dict[str, Any]:
    """What an adapter's token ids need from the base (docs/CASES.md C6 kind): ``{"base_vocab_size"`` (rows
    of the base before resizing), ``"tokenizer_size"`` (``len(tokenizer)``), ``"resized"`` (tokenizer
    larger than the base), ``"added_tokens"`` ({token: id} added to the vocabulary that are not special
    tokens), ``"added_special_tokens"`` ({token: id} of added special tokens)}``, from
    ``tokenizer.added_tokens_decoder`` (each ``AddedToken`` says whether it is special)."""
    rows = base_vocab_size(base_folder)
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    added = {str(t.content): int(i) for i, t in sorted(decoder.items()) if not getattr(t, "special", False)}
    special = {str(t.content): int(i) for i, t in sorted(decoder.items()) if getattr(t, "special", False)}
    size = len(tokenizer)
    return {
        "base_vocab_size": rows,
        "tokenizer_size": size,
        "resized": bool(rows is not None and size > rows),
        "added_tokens": added,
        "added_special_tokens": special,
    }


def compare_vocabulary(recorded: dict[str, Any] | None, base_folder: str | Path) -> list[str]:
    """Problems loading an export onto the base in ``base_folder`` (empty: same size): names the
    recorded base vocabulary size (before resizing) and the one found."""
    if not recorded or recorded.get("base_vocab_size") is None:
        return []
    found = base_vocab_size(base_folder)
    if found == recorded["base_vocab_size"]:
        return []
    resized = (
        f", resized to {recorded['tokenizer_size']} for {len(recorded.get('added_tokens') or {})} added token(s)"
        if recorded.get("resized")
        else ""
    )
    return [
        f"base vocabulary size: the export was trained on a base with {recorded['base_vocab_size']} embedding rows "
        f"(before resizing{resized}), {Path(base_folder)} has {found}"
    ]


def compare_tokenizer(expected: dict[str, Any], found: dict[str, Any]) -> list[str]:
    """Problems between two tokenizer identities, one per differing key, naming both values. The
    study probe is compared when both sides probed the same texts (``study_probe_texts_sha256``);
    keys absent from ``expected`` (older records) are not compared."""
    out = []
    for key in TOKENIZER_KEYS:
        if key in expected and expected.get(key) != found.get(key):
            out.append(f"tokenizer {key}: expected {expected.get(key)!r}, found {found.get(key)!r}")
    if (
        "study_probe_hash" in expected
        and expected.get("study_probe_texts_sha256") == found.get("study_probe_texts_sha256")
        and expected["study_probe_hash"] != found.get("study_probe_hash")
    ):
        out.append(
            f"tokenizer study_probe_hash (token ids of {expected.get('study_probe_n')} of the study's evaluation "
            "texts): "
            f"expected {expected['study_probe_hash']!r}, found {found.get('study_probe_hash')!r}"
        )
    return out


# ------------------------------------------------- the trained weights (tests/faults/test_faults_evidence.py)
TRAINED_CONFIG_FILES = ("adapter_config.json", "config.json", "model.safetensors.index.json")


def trained_weights_record(folder: str | Path) -> dict[str, Any]:
    """The sha256 of what a train run saved: the weight files of ``folder`` (``runs/<id>/adapter``:
    ``adapter_model.safetensors``; ``runs/<id>/model``: every safetensors file) and its config
    (``adapter_config.json``; ``config.json`` and the shard index of a full model). Recorded when
    ``train`` saves (the run's summary ``trained_weights``) and when ``eval`` / ``test`` load it,
    compared by ``export``.

    Returns:
        ``{"folder": "adapter" | "model", "files": {file name: sha256}, "sha256": combined}``, the
        combined hash as :func:`combined_weights_hash` over ``files``.
    """
    folder = Path(folder)
    files = weight_hashes(folder) if folder.is_dir() else {}
    for name in TRAINED_CONFIG_FILES:
        if (folder / name).is_file():
            files[name] = sha256_file(folder / name)
    return {"folder": folder.name, "files": dict(sorted(files.items())), "sha256": combined_weights_hash(files)}


def compare_trained(recorded: dict[str, Any], found: dict[str, Any]) -> list[tuple[str, str, str]]:
    """``(file, recorded sha256, found sha256)`` of every file that differs between two
    :func:`trained_weights_record` (``"(absent)"`` for a file on one side only); empty when the
    combined hashes are equal."""
    if recorded.get("sha256") == found.get("sha256"):
        return []
    a, b = recorded.get("files") or {}, found.get("files") or {}
    return [
        (n, a.get(n) or "(absent)", b.get(n) or "(absent)") for n in sorted(set(a) | set(b)) if a.get(n) != b.get(n)
    ]
