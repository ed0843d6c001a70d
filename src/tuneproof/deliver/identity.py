"""The identity of a base model: what an adapter is bound to (PROTOCOL.md step 4, CASES C13).

An adapter is a difference to one exact set of base weights. The identity recorded at export
and checked by ``verify`` is: the id or path, the revision, the sha256 of every weight file the
model is loaded from, one combined hash over them, the sha256 of ``config.json``, and the
tokenizer (class, vocabulary size, added tokens, chat template hash and the hash of the token ids
of a fixed probe text, see :func:`tuneproof.data.preprocess.tokenizer_identity`).

Pure hashing: nothing here imports torch, so a mismatch is found in a second or so.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from tuneproof.io import sha256_file
from tuneproof.models.base import weight_hashes

# tokenizer fields that must be equal for the adapter's token ids to mean the same thing
TOKENIZER_KEYS = ("class", "vocab_size", "added_tokens", "eos_token", "pad_token", "chat_template_sha256", "probe_hash")


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
    return {"path": str(path), "revision": ref.revision, "weight_files": weights, "weights_sha256": combined_weights_hash(weights),
            "config_sha256": sha256_file(path / "config.json") if (path / "config.json").is_file() else None}


def compare_base(recorded: dict[str, Any], ref) -> list[str]:
    """Problems between the base hashes recorded at train start (:func:`base_hashes`) and the
    base ``ref`` resolves to now (empty: the same). Each names both hashes (CASES C13)."""
    now = base_hashes(ref)
    problems = []
    if recorded.get("weights_sha256") and recorded["weights_sha256"] != now["weights_sha256"]:
        rec_files, now_files = recorded.get("weight_files") or {}, now["weight_files"]
        for name in sorted(set(rec_files) | set(now_files)):
            if rec_files.get(name) != now_files.get(name):
                problems.append(f"weight file {name}: sha256 {rec_files.get(name) or '(absent)'} -> {now_files.get(name) or '(absent)'}")
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
    """The identity of a resolved base model (:class:`tuneproof.models.base.BaseModelRef`).

    Returns ``{"name", "path", "revision", "kind", "source", "source_weight_sha256",
    "weight_files": {file: sha256}, "weights_sha256", "config_sha256", "tokenizer"}``.
    ``weight_files`` are the files ``from_pretrained`` reads (for the GGUF alias: the converted
    safetensors, while ``source_weight_sha256`` keeps the GGUF file's hash).
    """
    h = base_hashes(ref)
    return {
        "name": ref.name, "path": h["path"], "revision": ref.revision, "kind": ref.kind, "source": ref.source,
        "source_weight_sha256": dict(ref.weight_sha256), "weight_files": h["weight_files"],
        "weights_sha256": h["weights_sha256"], "config_sha256": h["config_sha256"],
        "tokenizer": dict(tokenizer_id),
    }


def compare_weights(expected: dict[str, str], folder: Path) -> list[str]:
    """Problems between the recorded weight files and those in ``folder`` (empty: identical).

    Each problem names the file and both sha256 values, then one line gives both combined
    hashes (CASES C13: "refuse, naming both hashes").
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
        problems.append(f"combined weights hash: expected {combined_weights_hash(expected)}, found {combined_weights_hash(found)}")
    return problems


def compare_tokenizer(expected: dict[str, Any], found: dict[str, Any]) -> list[str]:
    """Problems between two tokenizer identities, one per differing key, naming both values."""
    out = []
    for key in TOKENIZER_KEYS:
        if key in expected and expected.get(key) != found.get(key):
            out.append(f"tokenizer {key}: expected {expected.get(key)!r}, found {found.get(key)!r}")
    return out
