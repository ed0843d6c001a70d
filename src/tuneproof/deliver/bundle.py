"""The export bundle on disk: its file list with hashes, its manifest, and what the saved adapter
really contains.

Layout of ``exports/<train run>/``::

    manifest.json          # schema-versioned: identity, results, limits, sha256 of every other file
    manifest.sha256        # the manifest's own sha256 (sha256sum format)
    README.md              # model card with the Hugging Face metadata header
    adapter/               # PEFT layout: adapter_config.json (+ revision), adapter_model.safetensors, tokenizer
    model/                 # instead of adapter/ for full fine-tuning
    merged/                # with --merge: base + adapter merged, safetensors
    results/               # compare.json, eval.json, limits.json of the exported run; outputs.jsonl and
                           # baseline_outputs.jsonl (the per-example outputs the claims are recomputed from);
                           # sets/<name>/ the same two on each eval.sets entry the set guards were judged on;
                           # control_outputs.jsonl: the control success.against: strongest judged against
    verify/examples.jsonl  # K stored inputs with the predictions (and logits) verify must reproduce

Nothing here imports torch.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from tuneproof.errors import CheckFailed, TuneproofError
from tuneproof.io import atomic_write_text, read_json, sha256_file

MANIFEST = "manifest.json"
MANIFEST_SHA = "manifest.sha256"  # "<sha256>  manifest.json" (sha256sum format), beside the manifest
BUNDLE_KIND = "tuneproof-export"
BUNDLE_SCHEMA = 1


def file_hashes(folder: Path) -> dict[str, str]:
    """``{relative posix path: sha256}`` of every file under ``folder`` except ``manifest.json`` and
    ``manifest.sha256``."""
    folder = Path(folder)
    return {
        p.relative_to(folder).as_posix(): sha256_file(p)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.relative_to(folder).as_posix() not in (MANIFEST, MANIFEST_SHA)
    }


def write_manifest_sha(bundle: Path) -> str:
    """Write ``manifest.sha256`` (``sha256sum -c`` checks it) beside the manifest, atomically; returns the hash."""
    digest = sha256_file(Path(bundle) / MANIFEST)
    atomic_write_text(Path(bundle) / MANIFEST_SHA, f"{digest}  {MANIFEST}\n")
    return digest


def check_manifest_sha(bundle: Path) -> list[str]:
    """Problems between ``manifest.json`` and the hash in ``manifest.sha256`` (empty: they match)."""
    side = Path(bundle) / MANIFEST_SHA
    if not side.is_file():
        return [f"{MANIFEST_SHA} is missing: the manifest's own hash cannot be checked"]
    parts = side.read_text(encoding="utf-8", errors="replace").split()
    want = parts[0] if parts else ""
    found = sha256_file(Path(bundle) / MANIFEST)
    if found != want:
        return [f"{MANIFEST}: sha256 {found} differs from {want or '(none)'} in {MANIFEST_SHA}"]
    return []


def check_files(folder: Path, expected: dict[str, str]) -> dict[str, Any]:
    """Compare the bundle's files with the manifest's list.

    Returns ``{"missing": [path], "altered": [{"path", "expected", "found"}], "extra": [path]}``;
    verification fails on each of them, an extra file too (a file the loader may pick up, such as a
    second tokenizer or weights file, changes what is loaded without changing a listed one).
    """
    found = file_hashes(folder)
    return {
        "missing": sorted(set(expected) - set(found)),
        "altered": [
            {"path": p, "expected": expected[p], "found": found[p]}
            for p in sorted(set(expected) & set(found))
            if expected[p] != found[p]
        ],
        "extra": sorted(set(found) - set(expected)),
    }


def read_manifest(bundle: Path) -> dict[str, Any]:
    """The bundle's manifest.

    Raises:
        TuneproofError: no such folder, no manifest.json, not a tuneproof export, or a newer schema.
    """
    bundle = Path(bundle)
    if not bundle.is_dir():
        raise TuneproofError(
            f"{bundle}: no such bundle folder", hint="pass the folder written by `tuneproof export` (exports/<run>)"
        )
    if not (bundle / MANIFEST).is_file():
        raise CheckFailed(f"{bundle}: manifest.json is missing", hint="the bundle is incomplete; export it again")
    man = read_json(bundle / MANIFEST)
    if not isinstance(man, dict) or man.get("kind") != BUNDLE_KIND:
        raise TuneproofError(
            f"{bundle / MANIFEST}: not a tuneproof export manifest (kind "
            f"{man.get('kind') if isinstance(man, dict) else None!r})"
        )
    if int(man.get("schema_version", 0)) > BUNDLE_SCHEMA:
        raise TuneproofError(
            f"{bundle / MANIFEST}: schema_version {man['schema_version']} is "
            f"newer than this tuneproof reads ({BUNDLE_SCHEMA})",
            hint="upgrade tuneproof",
        )
    return man


def safetensors_keys(path: Path) -> list[str]:
    """Tensor names stored in a ``.safetensors`` file, read from its JSON header (no torch).

    Format: 8 bytes little-endian header length, then the JSON header (safetensors spec).

    Raises:
        TuneproofError: not a readable safetensors file.
    """
    try:
        with open(path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
    except (OSError, struct.error, ValueError) as err:
        raise TuneproofError(f"{path}: not a readable safetensors file ({err})") from None
    return sorted(k for k in header if k != "__metadata__")


def saved_modules(adapter_dir: Path, modules: list[str]) -> dict[str, list[str]]:
    """For each module of ``modules_to_save``, the tensors of the saved adapter that hold it
    (PEFT saves them under ``<...>.<module>.<param>``, e.g. ``base_model.model.classifier.weight``)."""
    keys = safetensors_keys(Path(adapter_dir) / "adapter_model.safetensors")
    out = {}
    for m in modules:
        out[m] = [k for k in keys if f".{m}." in f".{k}" and "lora_" not in k]
    return out
