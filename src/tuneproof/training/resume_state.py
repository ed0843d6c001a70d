"""Checkpoints that load without running code (docs/CASES.md C12, C21).

A checkpoint is one folder ``runs/<id>/checkpoints/step-NNNNNN/`` holding two files:

- ``tensors.safetensors``: every tensor (trainable weights, optimizer moments and step counts,
  the torch/CUDA RNG states as uint8 tensors), read with ``safetensors.torch.load_file`` (a
  JSON header and raw bytes: loading parses, it never executes);
- ``state.json``: everything else (format, step, total_steps, scheduler, optimizer param groups,
  the Python and NumPy RNG states, data position, losses, resolved config, fingerprints), plain
  JSON. Where a tensor sat in the nested checkpoint dict, ``state.json`` holds
  ``{"__tensor__": "<key in tensors.safetensors>"}``; tuples, non-string dict keys and NumPy
  arrays have their own one-key markers (see :func:`encode`), so :func:`load_checkpoint` returns
  exactly the dict that was saved (floats round-trip bit for bit: JSON writes ``repr``).

Integrity: ``checkpoints/index.json`` records, for each checkpoint, the sha256 of both files;
it is written before the folder is renamed into place, so every complete checkpoint is listed.
:func:`verify_checkpoint` recomputes them; a mismatch names the file and both hashes.

Refused, never opened with a code-running loader: any other file matching ``step-*`` (a
``step-NNNNNN.pt`` written by ``torch.save``, format 1, is a pickle; unpickling can run code:
https://docs.python.org/3/library/pickle.html, "Warning: the pickle module is not secure").

Writes are atomic: both files go to a temp folder ``.step-NNNNNN.tmp-*`` in ``checkpoints/``,
which is renamed into place (a temp folder left by a killed process is removed at the next save).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tuneproof.errors import TuneproofError
from tuneproof.io import read_json, read_jsonl, sha256_file, write_json
from tuneproof.training.data_order import window_position

CKPT_FORMAT = 2  # 1: one torch.save pickle (refused since); 2: safetensors + JSON folder
TENSORS = "tensors.safetensors"
STATE = "state.json"
INDEX = "index.json"
KEEP = 2  # checkpoints kept per run (the older ones are removed after each save)
CKPT_KEYS = ("format", "step", "total_steps", "trainable", "optimizer", "scheduler", "rng", "data", "losses", "config")
_NAME_RE = re.compile(r"^step-(\d{6,})$")
_MARKERS = ("__tensor__", "__tuple__", "__items__", "__ndarray__")


# --------------------------------------------------------------------------- state of the run
def trainable_state(model) -> dict[str, torch.Tensor]:
    """Every tensor with ``requires_grad`` (LoRA matrices, modules_to_save, or all for full FT), on CPU."""
    return {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters() if p.requires_grad}


def rng_state() -> dict[str, Any]:
    """Python, NumPy, torch (CPU) and CUDA RNG states (CUDA: None without a GPU)."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore the states of :func:`rng_state` (lists where tuples were accepted too)."""
    py = state["python"]
    random.setstate((int(py[0]), tuple(int(x) for x in py[1]), py[2]))
    np_state = state["numpy"]
    np.random.set_state((str(np_state[0]), np.asarray(np_state[1], dtype=np.uint32), *np_state[2:]))
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# --------------------------------------------------------------------------- encoding
def encode(obj: Any, tensors: dict[str, torch.Tensor], path: str = "") -> Any:
    """A JSON-safe copy of ``obj``; every tensor is moved to ``tensors`` under its key path.

    Markers: ``{"__tensor__": key}``, ``{"__tuple__": [...]}``, ``{"__items__": [[key, value], ...]}``
    (a dict with a non-string key, e.g. the optimizer's ``state`` keyed by parameter index),
    ``{"__ndarray__": [...], "dtype": "uint32"}``.

    Raises:
        TypeError: a value of another type (it would need code to rebuild).
    """
    if isinstance(obj, torch.Tensor):
        key = path.strip("/") or "tensor"
        tensors[key] = obj.detach().to("cpu").contiguous().clone()
        return {"__tensor__": key}
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj) and not (len(obj) == 1 and next(iter(obj), None) in _MARKERS):
            return {k: encode(v, tensors, f"{path}/{k}") for k, v in obj.items()}
        return {
            "__items__": [
                [encode(k, tensors, f"{path}/k{i}"), encode(v, tensors, f"{path}/{k}")]
                for i, (k, v) in enumerate(obj.items())
            ]
        }
    if isinstance(obj, tuple):
        return {"__tuple__": [encode(v, tensors, f"{path}/{i}") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [encode(v, tensors, f"{path}/{i}") for i, v in enumerate(obj)]
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": obj.tolist(), "dtype": str(obj.dtype)}
    if isinstance(obj, np.generic):
        return obj.item()
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"checkpoint value at '{path or '/'}' is a {type(obj).__name__}: not storable without code")


def decode(obj: Any, tensors: dict[str, torch.Tensor], where: Path) -> Any:
    """Inverse of :func:`encode`; only dicts, lists, tuples, NumPy arrays and tensors are built.

    Raises:
        TuneproofError: a tensor key missing from the safetensors file (names ``where``).
    """
    if isinstance(obj, list):
        return [decode(v, tensors, where) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if len(obj) == 1 and "__tensor__" in obj:
        key = obj["__tensor__"]
        if key not in tensors:
            raise TuneproofError(
                f"{where}: tensor '{key}' named in {STATE} is not in {TENSORS}", hint="the checkpoint is damaged"
            )
        return tensors[key]
    if len(obj) == 1 and "__tuple__" in obj:
        return tuple(decode(v, tensors, where) for v in obj["__tuple__"])
    if len(obj) == 1 and "__items__" in obj:
        return {decode(k, tensors, where): decode(v, tensors, where) for k, v in obj["__items__"]}
    if set(obj) == {"__ndarray__", "dtype"}:
        return np.asarray(obj["__ndarray__"], dtype=np.dtype(obj["dtype"]))
    return {k: decode(v, tensors, where) for k, v in obj.items()}


# --------------------------------------------------------------------------- index
def read_index(folder: Path) -> dict[str, Any]:
    """``checkpoints/index.json``: ``{"format", "checkpoints": {name: {"step", "files": {file: sha256}, "written"}}}``.
    An absent index is empty; an unreadable one raises :class:`TuneproofError` naming it."""
    path = Path(folder) / INDEX
    if not path.exists():
        return {"format": CKPT_FORMAT, "checkpoints": {}}
    idx = read_json(path)
    if not isinstance(idx, dict) or not isinstance(idx.get("checkpoints"), dict):
        raise TuneproofError(
            f"{path}: not a checkpoint index", hint="it is damaged; the checkpoints cannot be verified"
        )
    return idx


def _write_index(folder: Path, idx: dict[str, Any]) -> None:
    write_json(Path(folder) / INDEX, idx)


# --------------------------------------------------------------------------- save
def save_checkpoint(folder: Path, step: int, payload: dict[str, Any], *, keep: int = KEEP) -> Path:
    """Write ``payload`` as ``folder/step-NNNNNN/`` (atomic: temp folder + rename), record the
    sha256 of its two files in ``folder/index.json``, and keep only the ``keep`` newest checkpoints.

    Returns the checkpoint folder. On any error (disk full...) the temp folder is removed and
    the previous checkpoints are untouched.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    from safetensors.torch import save_file  # noqa: PLC0415 - safetensors.torch loads only when save_checkpoint() runs

    name = f"step-{step:06d}"
    dest = folder / name
    for stale in folder.glob(".step-*.tmp-*"):  # left by a process killed while saving
        shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink(missing_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=folder))
    try:
        tensors: dict[str, torch.Tensor] = {}
        state = encode({**payload, "format": CKPT_FORMAT}, tensors)
        save_file(tensors, str(tmp / TENSORS), metadata={"format": str(CKPT_FORMAT), "step": str(step)})
        (tmp / STATE).write_text(json.dumps(state, ensure_ascii=False) + "\n", encoding="utf-8")
        for f in (TENSORS, STATE):
            with open(tmp / f, "rb") as fh:
                os.fsync(fh.fileno())
        os.chmod(tmp, 0o777 & ~_umask())
        idx = read_index(folder)
        idx["format"] = CKPT_FORMAT
        idx["checkpoints"][name] = {
            "step": step,
            "files": {f: sha256_file(tmp / f) for f in (STATE, TENSORS)},
            "written": round(time.time(), 3),
        }
        _write_index(folder, idx)  # before the rename: every complete checkpoint is listed
        if dest.exists():  # the same step saved again (a resume from an older checkpoint)
            old = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-old-", dir=folder))
            os.replace(dest, old / name)
            os.replace(tmp, dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    prune(folder, keep)
    return dest


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


def prune(folder: Path, keep: int = KEEP) -> None:
    """Remove all but the ``keep`` newest checkpoint folders and their index entries."""
    ckpts = [p for p in list_checkpoints(folder.parent) if p.is_dir()]
    idx = read_index(folder)
    for old in ckpts[:-keep] if keep else ckpts:
        shutil.rmtree(old, ignore_errors=True)
        idx["checkpoints"].pop(old.name, None)
    names = {p.name for p in list_checkpoints(folder.parent)}
    idx["checkpoints"] = {k: v for k, v in idx["checkpoints"].items() if k in names}
    _write_index(folder, idx)


# --------------------------------------------------------------------------- find
def step_of(path: Path) -> int | None:
    """The step number in a checkpoint name (``step-000010``, ``step-000010.pt``...), else None."""
    m = re.match(r"^step-(\d+)", Path(path).name)
    return int(m.group(1)) if m else None


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Everything named ``step-N...`` in ``runs/<id>/checkpoints/`` (checkpoint folders, and any
    other file such as a pickle ``step-N.pt``, which :func:`load_checkpoint` refuses), by step,
    oldest first."""
    folder = Path(run_dir) / "checkpoints"
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if not p.name.startswith(".") and step_of(p) is not None]
    return sorted(found, key=lambda p: (step_of(p), p.name))


def latest_checkpoint(run_dir: Path) -> Path | None:
    ckpts = list_checkpoints(run_dir)
    return ckpts[-1] if ckpts else None


# --------------------------------------------------------------------------- load
def _refuse_not_a_checkpoint(path: Path) -> None:
    with open(path, "rb") as fh:
        head = fh.read(4)
    kind = (
        "a zip archive as written by torch.save (holds a pickle)"
        if head[:2] == b"PK"
        else "a pickle"
        if head[:1] == b"\x80"
        else "not a checkpoint folder"
    )
    raise TuneproofError(
        f"{path}: refused, {kind}; tuneproof loads only checkpoint folders (step-NNNNNN/ with {TENSORS} + {STATE}, "
        f"format {CKPT_FORMAT}) because unpickling a file can run code; nothing was loaded",
        hint="remove the file (it was not written by this tuneproof version); resume "
        "from another checkpoint with --checkpoint or --fallback",
    )


def checkpoint_folder(path: Path) -> Path:
    """The checkpoint folder for ``path`` (the folder itself, or one of its two files).

    Raises:
        TuneproofError: not found, or a file that is not part of a checkpoint folder (a pickle
            ``step-N.pt`` included: refused without being opened by a code-running loader).
    """
    path = Path(path)
    if path.is_file() and path.name in (STATE, TENSORS):
        path = path.parent
    if not path.exists():
        raise TuneproofError(f"{path}: checkpoint not found")
    if not path.is_dir():
        _refuse_not_a_checkpoint(path)
    return path


def verify_checkpoint(path: Path) -> dict[str, str]:
    """Recompute the sha256 of the checkpoint's two files and compare them with ``index.json``.

    Returns ``{file: sha256}``.

    Raises:
        TuneproofError: a file missing, the checkpoint absent from the index, or a hash that
            differs (names the file and both hashes).
    """
    folder = checkpoint_folder(path)
    idx = read_index(folder.parent)
    entry = idx["checkpoints"].get(folder.name)
    for f in (STATE, TENSORS):
        if not (folder / f).is_file():
            raise TuneproofError(
                f"{folder}: checkpoint has no {f}", hint="it is incomplete; resume from an older one with --fallback"
            )
    if entry is None:
        raise TuneproofError(
            f"{folder}: not listed in {folder.parent / INDEX}, its sha256 cannot be checked",
            hint="it was not written by this run; resume from a listed one with --checkpoint or --fallback",
        )
    found = {}
    for f in (STATE, TENSORS):
        found[f] = sha256_file(folder / f)
        want = entry["files"].get(f)
        if found[f] != want:
            raise TuneproofError(
                f"{folder / f}: sha256 {found[f]} differs from {want} recorded when it was written",
                hint="the checkpoint was altered or damaged; resume from an older one with --fallback",
            )
    return found


def load_checkpoint(path: Path, *, verify: bool = True) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint` (no code runs) and check it is complete.

    Args:
        path: the ``step-NNNNNN`` folder (or one of its files).
        verify: check both files' sha256 against ``index.json`` first (:func:`verify_checkpoint`).

    Returns the dict that was saved: ``trainable`` ``{name: tensor}``, ``optimizer`` (a
    ``state_dict`` with int parameter keys), ``scheduler``, ``rng``, ``step``, ``losses``...

    Raises:
        TuneproofError: missing, refused (not a checkpoint folder, e.g. a pickle), altered,
            unreadable or incomplete checkpoint, or another format; the message names the file.
    """
    folder = checkpoint_folder(path)
    if verify:
        verify_checkpoint(folder)
    from safetensors import SafetensorError  # noqa: PLC0415 - safetensors loads only when load_checkpoint() runs
    from safetensors.torch import load_file  # noqa: PLC0415 - safetensors.torch loads only when load_checkpoint() runs

    for f in (STATE, TENSORS):
        if not (folder / f).is_file():
            raise TuneproofError(
                f"{folder}: checkpoint has no {f}", hint="it is incomplete; resume from an older one with --fallback"
            )
    try:
        tensors = load_file(str(folder / TENSORS))
    except (SafetensorError, OSError, ValueError) as err:
        raise TuneproofError(
            f"{folder / TENSORS}: unreadable checkpoint ({type(err).__name__}: {str(err).splitlines()[0][:200]})",
            hint="the file is damaged; resume from an older one with --checkpoint or --fallback",
        ) from None
    try:
        raw = json.loads((folder / STATE).read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise TuneproofError(
            f"{folder / STATE}: unreadable checkpoint ({type(err).__name__}: {str(err)[:200]})",
            hint="the file is damaged; resume from an older one with --checkpoint or --fallback",
        ) from None
    if not isinstance(raw, dict):
        raise TuneproofError(f"{folder / STATE}: not a tuneproof checkpoint (a {type(raw).__name__}, not an object)")
    ckpt = decode(raw, tensors, folder)
    for key in CKPT_KEYS:
        if key not in ckpt:
            raise TuneproofError(
                f"{folder}: checkpoint has no '{key}'",
                hint="it was not written by this tuneproof version or is damaged",
            )
    if ckpt["format"] != CKPT_FORMAT:
        raise TuneproofError(f"{folder}: checkpoint format {ckpt['format']}, this tuneproof reads format {CKPT_FORMAT}")
    for key in ("python", "numpy", "torch"):
        if key not in ckpt["rng"]:
            raise TuneproofError(f"{folder}: checkpoint has no '{key}' RNG state", hint="it is damaged")
    check_step(folder, ckpt)
    return ckpt


def _step_witnesses(folder: Path, ckpt: dict[str, Any]) -> list[tuple[str, int]]:
    """What else records the step a checkpoint was written at: ``[(where, step)]``."""
    out: list[tuple[str, int]] = []
    if _NAME_RE.match(folder.name):
        out.append((f"its folder name {folder.name}", int(step_of(folder))))
    entry = read_index(folder.parent)["checkpoints"].get(folder.name)
    if entry is not None and "step" in entry:
        out.append((f"{INDEX}", int(entry["step"])))
    from safetensors import safe_open  # noqa: PLC0415  (safetensors is imported with torch, where checkpoints load)

    with safe_open(str(folder / TENSORS), framework="pt") as fh:  # the header only
        meta = fh.metadata() or {}
    if "step" in meta:
        out.append((f"the metadata of {TENSORS}", int(meta["step"])))
    out.append((f"its {len(ckpt['losses'])} per-step losses", len(ckpt["losses"])))
    sched = ckpt.get("scheduler") or {}
    if isinstance(sched, dict) and "last_epoch" in sched:
        out.append(("the learning-rate scheduler (last_epoch)", int(sched["last_epoch"])))
    counts = {
        int(round(float(st["step"])))
        for st in (ckpt.get("optimizer") or {}).get("state", {}).values()
        if isinstance(st, dict) and "step" in st
    }
    if len(counts) == 1:
        out.append(("the optimizer's step count", counts.pop()))
    return out


def check_step(folder: Path, ckpt: dict[str, Any]) -> None:
    """Cross-check the step of ``state.json`` with every other record of it: the folder name, the index,
    the safetensors metadata, the per-step losses, the scheduler, the optimizer's step count and the data
    position (``next_micro_batch``, ``epoch`` recomputed from the step). A rehashed index does not make an
    edited step pass.

    Raises:
        TuneproofError: a record that says another step, or a data position that is not the step's (one line).
    """
    step = int(ckpt["step"])
    hint = "the checkpoint was altered after it was written (a hash recomputed does not make it whole)"
    for where, other in _step_witnesses(folder, ckpt):
        if other != step:
            raise TuneproofError(f"{folder / STATE}: step {step}, but {where} says step {other}", hint=hint)
    d = ckpt["data"]
    try:
        pos = window_position(
            int(d["n_examples"]), int(d["micro_batch"]), int(d["accumulation"]), step, int(d.get("world_size", 1))
        )
    except (KeyError, TypeError, ValueError):
        return  # a data section without the position: nothing to recompute
    if (int(d.get("next_micro_batch", -1)), int(d.get("epoch", -1))) != (pos["first_micro_batch"], pos["epoch"]):
        raise TuneproofError(
            f"{folder / STATE}: step {step} reads from micro-batch {pos['first_micro_batch']} (epoch {pos['epoch']}), "
            f"but its data position says micro-batch {d.get('next_micro_batch')} (epoch {d.get('epoch')})",
            hint=hint,
        )


def check_against_metrics(run_dir: Path, folder: Path, ckpt: dict[str, Any]) -> None:
    """The checkpoint's step and last loss against the run's own ``metrics.jsonl`` (written before each
    checkpoint): the run must have logged that step, with that loss (to the 6 decimals logged).

    Raises:
        TuneproofError: the metrics end before the step, or log another loss at that step (one line).
    """
    path = Path(run_dir) / "metrics.jsonl"
    step = int(ckpt["step"])
    if not path.is_file() or step == 0:
        return
    rows = [r for r in read_jsonl(path) if isinstance(r, dict) and "loss" in r and isinstance(r.get("step"), int)]
    if not rows:
        return
    hint = "the checkpoint was altered after it was written (a hash recomputed does not make it whole)"
    last = max(r["step"] for r in rows)
    if last < step:
        raise TuneproofError(
            f"{folder / STATE}: step {step}, but the run's metrics ({path}) end at step {last}", hint=hint
        )
    want = round(float(ckpt["losses"][-1]), 6)
    logged = [r["loss"] for r in rows if r["step"] == step]
    if logged and not any(abs(float(x) - want) <= 1e-6 for x in logged):
        raise TuneproofError(
            f"{folder / STATE}: loss {want} at step {step}, but the run's metrics ({path}) logged {logged[-1]}",
            hint=hint,
        )


def restore_state(model, optimizer, scheduler, ckpt: dict[str, Any]) -> None:
    """Copy a checkpoint's trainable tensors into ``model`` and load the optimizer (moments, step
    counts), the scheduler (``last_epoch`` = global step) and the RNG states, exactly.

    Raises:
        TuneproofError: a checkpoint tensor that the model lacks or whose shape differs, or a model
            tensor that is trainable but absent from the checkpoint.
    """
    named = {n: p for n, p in model.named_parameters() if p.requires_grad}
    missing = sorted(set(named) - set(ckpt["trainable"]))
    if missing:
        raise TuneproofError(
            f"the model trains '{missing[0]}' ({len(missing)} tensors) that the checkpoint does not hold",
            hint="the method or base model changed since the checkpoint",
        )
    for name, tensor in ckpt["trainable"].items():
        if name not in named:
            raise TuneproofError(
                f"checkpoint tensor '{name}' is not in the model",
                hint="the method or base model changed since the checkpoint",
            )
        if tuple(named[name].shape) != tuple(tensor.shape):
            raise TuneproofError(
                f"checkpoint tensor '{name}' has shape {tuple(tensor.shape)}, the model {tuple(named[name].shape)}",
                hint="the method or base model changed since the checkpoint",
            )
        with torch.no_grad():
            named[name].copy_(tensor.to(named[name].device, named[name].dtype))
    optimizer.load_state_dict(ckpt["optimizer"])
    scheduler.load_state_dict(ckpt["scheduler"])
    set_rng_state(ckpt["rng"])
