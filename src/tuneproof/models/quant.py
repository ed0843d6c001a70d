"""QLoRA's 4-bit base (``method.kind: qlora``): the quantization config a run records, and the
transformers ``BitsAndBytesConfig`` built from it.

QLoRA (Dettmers et al. 2023, "QLoRA: Efficient Finetuning of Quantized LLMs", arXiv:2305.14314)
loads the frozen base in 4-bit NormalFloat (NF4) with double quantization (the quantization
constants quantized again) and trains LoRA adapters in a 16/32-bit compute dtype on top. The base
is quantized at load time from the ordinary (unquantized) checkpoint, so a run binds to the
*unquantized* base files (their sha256) plus this record: re-loading the base with the same record
gives the same 4-bit weights.

The record uses transformers' names (``BitsAndBytesConfig``): ``load_in_4bit``,
``bnb_4bit_quant_type`` (``nf4`` or ``fp4``), ``bnb_4bit_use_double_quant``,
``bnb_4bit_compute_dtype`` (from the resolved ``training.precision``: fp32 -> float32, bf16 ->
bfloat16, fp16 -> float16) and ``bnb_4bit_quant_storage`` (the dtype the packed 4-bit values are
stored in; ``uint8`` by default, a float dtype for FSDP, :mod:`tuneproof.preflight.qlora`), plus
``quant_method: bitsandbytes`` and the installed ``bitsandbytes_version``.

bitsandbytes is an optional dependency (:func:`tuneproof.errors.install_hint`). Its 4-bit layers run
on CUDA and, since the multi-backend releases (0.46+), on the CPU through its default torch kernels
(checked with 0.50.2: ``Linear4bit`` forward and backward on CPU tensors), so a tiny QLoRA run is
tested on CPU for real.
"""

from __future__ import annotations

import functools
import importlib.util
from importlib import metadata
from typing import Any

from tuneproof.errors import TuneproofError, install_hint

BNB_PIN = "bitsandbytes==0.50.2"
INSTALL_HINT = install_hint("qlora") + ": installs bitsandbytes==0.50.2"
#: training.precision's resolved dtype -> the compute dtype name of BitsAndBytesConfig
COMPUTE_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
#: quant storage names accepted by ``method.bnb_4bit_quant_storage`` (torch dtype names, as transformers takes them)
QUANT_STORAGES = ("uint8", "int8", "bfloat16", "float16", "float32")
FLOAT_STORAGES = ("bfloat16", "float16", "float32")


def bitsandbytes_installed() -> bool:
    """Whether the ``bitsandbytes`` package can be imported (looked up, not imported: no CUDA probe)."""
    return importlib.util.find_spec("bitsandbytes") is not None


def bitsandbytes_version() -> str | None:
    try:
        return metadata.version("bitsandbytes")
    except metadata.PackageNotFoundError:
        return None


def require_bitsandbytes(path: str = "tuneproof.yaml") -> None:
    """Refuse ``method.kind: qlora`` when bitsandbytes is not installed.

    Raises:
        TuneproofError: two lines, naming ``method.kind`` and the install command.
    """
    if not bitsandbytes_installed():
        raise TuneproofError(
            f"{path}: method.kind: qlora loads the base in 4-bit with bitsandbytes, which is not installed",
            hint=INSTALL_HINT,
        )


@functools.lru_cache(maxsize=4)
def _probe_4bit(device: str) -> str | None:
    """None when a bitsandbytes NF4 ``Linear4bit`` (64 -> 32) runs forward and backward on ``device``,
    else the error (``Type: message``, first line)."""
    try:
        import bitsandbytes as bnb  # noqa: PLC0415 - bitsandbytes is optional (the qlora extra)
        import torch  # noqa: PLC0415 - torch loads only when _probe_4bit() runs

        lin = bnb.nn.Linear4bit(64, 32, compute_dtype=torch.float32, quant_type="nf4")
        lin.weight = bnb.nn.Params4bit(torch.randn(32, 64), requires_grad=False, quant_type="nf4")
        lin = lin.to(device)
        x = torch.randn(2, 64, device=device, requires_grad=True)
        lin(x).sum().backward()
        if x.grad is None or not bool(torch.isfinite(x.grad).all()):
            return "the backward pass gave no finite gradient"
    except Exception as err:  # noqa: BLE001 - any failure: no usable 4-bit backend on this device
        return f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
    return None


def require_4bit_device(device: str | None = None) -> str:
    """The device a 4-bit base is loaded on (``cuda`` when a CUDA GPU is visible, else ``cpu``), after
    checking that bitsandbytes' 4-bit layers run there (one tiny NF4 layer, forward and backward,
    once per process and device).

    Raises:
        TuneproofError: two lines, naming ``method.kind: qlora``, the error, and that a CUDA device is needed.
    """
    import torch  # noqa: PLC0415 - torch loads only when require_4bit_device() runs

    require_bitsandbytes("method.kind: qlora")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    err = _probe_4bit(device)
    if err is not None:
        raise TuneproofError(
            f"method.kind: qlora: bitsandbytes {bitsandbytes_version()} cannot run 4-bit layers on {device} ({err})",
            hint="QLoRA needs a CUDA device here (bitsandbytes' CPU 4-bit kernels do not run on this machine); "
            "run on a GPU, or set method.kind: lora",
        )
    return device


def quantization_record(method, dtype: str) -> dict[str, Any]:
    """The quantization config of a qlora run (recorded in ``method.json``, the run summary,
    ``base.json`` and the export manifest).

    Args:
        method: the study's ``method`` section (``kind: qlora``).
        dtype: the resolved compute dtype, ``fp32``/``bf16``/``fp16`` (``ctx.device_choice["dtype"]``).

    Returns:
        ``{"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type",
        "bnb_4bit_use_double_quant", "bnb_4bit_compute_dtype", "bnb_4bit_quant_storage",
        "llm_int8_skip_modules" (``method.modules_to_save`` + ``lm_head``, kept unquantized; None:
        transformers' default, the output embedding), "bitsandbytes_version"}`` (dtype names as strings).

    Raises:
        TuneproofError: ``dtype`` is not one of fp32, bf16, fp16.
    """
    if dtype not in COMPUTE_DTYPES:
        raise TuneproofError(
            f"method.kind: qlora: no compute dtype for precision {dtype!r}",
            hint="set training.precision to fp32, bf16 or fp16",
        )
    # modules trained in full (a classifier head) must stay unquantized; transformers' own default (the
    # output embedding, lm_head) applies only when the list is unset, so lm_head is kept in it
    skip = sorted(set(method.modules_to_save) | {"lm_head"}) if method.modules_to_save else None
    return {
        "quant_method": "bitsandbytes",
        "load_in_4bit": True,
        "bnb_4bit_quant_type": method.bnb_4bit_quant_type,
        "bnb_4bit_use_double_quant": bool(method.bnb_4bit_use_double_quant),
        "bnb_4bit_compute_dtype": COMPUTE_DTYPES[dtype],
        "bnb_4bit_quant_storage": method.bnb_4bit_quant_storage,
        "llm_int8_skip_modules": skip,
        "bitsandbytes_version": bitsandbytes_version(),
    }


def bnb_config(record: dict[str, Any]):
    """transformers' ``BitsAndBytesConfig`` for a :func:`quantization_record`.

    Raises:
        TuneproofError: bitsandbytes is not installed (two lines, the install command).
    """
    import torch  # noqa: PLC0415 - torch loads only when bnb_config() runs
    from transformers import BitsAndBytesConfig  # noqa: PLC0415 - transformers loads only when bnb_config() runs

    require_bitsandbytes("the run's quantization config")
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=record["bnb_4bit_quant_type"],
        bnb_4bit_use_double_quant=bool(record["bnb_4bit_use_double_quant"]),
        bnb_4bit_compute_dtype=getattr(torch, record["bnb_4bit_compute_dtype"]),
        bnb_4bit_quant_storage=getattr(torch, record["bnb_4bit_quant_storage"]),
        llm_int8_skip_modules=record.get("llm_int8_skip_modules"),
    )


def keep_training_kernels(model) -> int:
    """Turn off bitsandbytes' CPU inference repacking on every ``Linear4bit`` of ``model``; returns how many.

    bitsandbytes 0.50.2, on a CPU with AVX512-BF16, converts a 4-bit weight in place the first time
    its layer runs in eval mode without gradients (``_convert_weight_packed_for_cpu``: another memory
    layout, the absmax constants rounded to bf16), and from then on the layer calls ``gemv_4bit``,
    which has no autograd kernel: a training step after an evaluation in the same process gets no
    gradient through the 4-bit layers (measured on this project's AMD EPYC, a tiny Llama + LoRA: after
    one generation the next step's loss was 3.596983 instead of 3.596757 and no LoRA tensor got a
    gradient, norm 0.0; 0 of 8 LoRA tensors changed in 2 steps of the training loop; torch warns
    "gemv_4bit: an autograd kernel was not registered"). The attribute
    ``support_avx512bf16_for_cpu`` gates that conversion; with it off, evaluation and training use
    the same dequantize-and-matmul path on every CPU (slower CPU inference, the same numbers).
    CUDA is not affected (the conversion is for CPU tensors only).
    """
    try:
        import bitsandbytes as bnb  # noqa: PLC0415 - bitsandbytes is optional (the qlora extra)
    except ImportError:
        return 0
    n = 0
    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            module.support_avx512bf16_for_cpu = False
            n += 1
    return n


def quantized_modules(model) -> dict[str, Any]:
    """What was loaded in 4-bit: ``{"linear4bit": n, "quant_types": sorted, "storage_dtypes": sorted,
    "cpu_inference_repacking": True when any layer may still be repacked (:func:`keep_training_kernels`),
    "examples": first 3 module names}`` (bitsandbytes ``Linear4bit`` modules, PEFT-wrapped or not)."""
    try:
        import bitsandbytes as bnb  # noqa: PLC0415 - bitsandbytes is optional (the qlora extra)
    except ImportError:
        return {"linear4bit": 0, "quant_types": [], "storage_dtypes": [], "examples": []}
    names, qtypes, storages, repack = [], set(), set(), False
    for name, module in model.named_modules():
        if isinstance(module, bnb.nn.Linear4bit):
            names.append(name)
            w = module.weight
            qtypes.add(str(getattr(w, "quant_type", None)))
            storages.add(str(w.dtype).removeprefix("torch."))
            repack |= bool(getattr(module, "support_avx512bf16_for_cpu", False))
    return {
        "linear4bit": len(names),
        "quant_types": sorted(qtypes),
        "storage_dtypes": sorted(storages),
        "cpu_inference_repacking": repack,
        "examples": names[:3],
    }
