"""Generation backends of the evaluation, and the check a fast backend passes before its numbers count.

A backend turns rendered prompts (``pipeline.prompt_text``) into answers::

    backend.generate(prompts, max_new_tokens, adapter_dir) -> list[str]   # one answer per prompt, in order

``adapter_dir`` is a saved PEFT LoRA adapter (``runs/<id>/adapter``) served on the backend's base,
or None for the base alone. Two implementations (study key ``eval.backend``):

- :class:`TransformersBackend` (``transformers``, the default): the procedure of
  :func:`tuneproof.modalities.text.generate_prompts` (length-sorted, left-padded batches,
  ``model.generate``) on a transformers model, the adapter through PEFT.
- :class:`VllmBackend` (``vllm``): ``vllm.LLM`` (imported lazily; CUDA only, installed separately)
  with ``enable_lora`` and a ``LoRARequest`` per adapter, greedy ``SamplingParams(temperature=0,
  max_tokens=...)``. The prompts are tokenized by the study's tokenizer exactly as for transformers
  (no added special tokens) and passed as token ids; vLLM's output token ids are decoded by the same
  tokenizer, so tokenization and detokenization cannot differ between the two backends.

The check (:func:`check_backends`, tests/evaluation/test_eval_backends.py): before a vLLM evaluation's numbers are used,
a seeded sample of the evaluation split (``eval.backend_check_examples``, default 16;
:func:`backend_check_sample`) is generated greedily by both backends. The share of identical
outputs (exact string match) must be at least ``eval.backend_check_min_agreement`` (default 0.9:
two engines in bf16 may part at a near-tie of the greedy argmax; a wrong model, tokenizer, stop
token or adapter parts on most examples). For a trained adapter both backends also generate the
sample without it: when vLLM's outputs with the adapter equal its outputs without it on every
sampled example while transformers' adapted outputs differ from the base on at least one, the
served adapter had no effect and the run is refused, whatever the agreement (an adapter that
changes 1 answer in 16 still passes an agreement of 0.9; a served adapter that is silently
dropped is a known fault of serving stacks, e.g. a LoRA rank above the server's limit or target
modules it does not map). A refused run is marked invalid with the one-line reason and reports
no numbers; the check's result is recorded in the run (``backend_check.json`` and the summary's
``backend_check``) either way.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import random
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from tuneproof.data.chat_template import special_texts, split_generation
from tuneproof.errors import CheckFailed, TuneproofError
from tuneproof.modalities.text import generate_prompts
from tuneproof.models.heads import Head
from tuneproof.models.method import load_adapter_onto

BACKENDS = ("transformers", "vllm")
CHECK_NAME = "eval backend check"
SHOWN = 60  # characters of an output quoted in a message


class GenerationBackend(Protocol):
    """What the evaluation needs from a generation backend."""

    name: str

    def generate(
        self,
        prompts: Sequence[str],
        max_new_tokens: int,
        adapter_dir: str | Path | None = None,
        *,
        progress: Callable[[int], None] | None = None,
        raw_out: list[str] | None = None,
    ) -> list[str]:
        """One answer per prompt (the generation up to its stop token, parsed by ``eval.answer_from``, surrounding
        whitespace stripped), in the order of ``prompts``; ``raw_out`` (when given) gets the raw generations."""
        ...

    def identity(self) -> dict[str, Any]:
        """``{"name", "version", ...}``: recorded in the run summary (``eval_backend``)."""
        ...


class BackendCheckFailed(CheckFailed):
    """The backend check refused the fast backend's numbers: the evaluation run is invalid (exit 3)."""

    def __init__(self, reason: str, run_id: str = "<id>"):
        self.reason = f"backend check: {reason}"  # the one-line reason the invalid run records
        super().__init__(
            self.reason,
            hint=f"runs/{run_id}/backend_check.json holds both backends' sampled answers; fix the serving "
            "setup, or evaluate with eval.backend: transformers",
        )


def _resolved(adapter_dir: str | Path | None) -> Path | None:
    return None if adapter_dir is None else Path(adapter_dir).resolve()


def _is_peft(model: Any) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


class TransformersBackend:
    """The study's transformers procedure behind the backend interface.

    Args:
        model: a transformers causal LM, or a ``PeftModel`` carrying the adapter loaded from ``adapter_dir``.
        tokenizer: the study's tokenizer.
        eval_cfg: the study's :class:`~tuneproof.study.Eval` (batch_size, decoding).
        device, autocast: from ``StudyContext.torch_setup``.
        adapter_dir: the folder of the adapter ``model`` carries (None: a plain model).

    ``generate(..., adapter_dir=None)`` on a ``PeftModel`` runs with the adapter disabled (PEFT's
    ``disable_adapter``); an ``adapter_dir`` on a plain model is loaded onto it once
    (:func:`~tuneproof.models.method.load_adapter_onto`, which wraps that model in place and refuses
    unmatched tensor names).

    Raises:
        ValueError: ``generate`` asked for another adapter than the one the model carries.
    """

    name = "transformers"

    def __init__(
        self,
        model,
        tokenizer,
        eval_cfg,
        *,
        device,
        autocast,
        adapter_dir: str | Path | None = None,
        stop_ids: list[int] | None = None,
    ):
        self.model, self.tokenizer, self.eval_cfg = model, tokenizer, eval_cfg
        self.stop_ids = stop_ids
        self.device, self.autocast = device, autocast
        self.adapter_dir = _resolved(adapter_dir) if _is_peft(model) else None

    def generate(
        self,
        prompts: Sequence[str],
        max_new_tokens: int,
        adapter_dir: str | Path | None = None,
        *,
        progress: Callable[[int], None] | None = None,
        raw_out: list[str] | None = None,
    ) -> list[str]:
        want = _resolved(adapter_dir)
        cfg = self.eval_cfg.model_copy(update={"max_new_tokens": int(max_new_tokens)})
        if want is not None and want != self.adapter_dir:
            if _is_peft(self.model):
                raise ValueError(f"this backend's model carries the adapter {self.adapter_dir}, not {want}")
            self.model = load_adapter_onto(self.model, str(want)).to(self.device)
            self.adapter_dir = want
        off = self.model.disable_adapter() if want is None and _is_peft(self.model) else contextlib.nullcontext()
        with off:
            return generate_prompts(
                self.model,
                self.tokenizer,
                list(prompts),
                cfg,
                device=self.device,
                autocast=self.autocast,
                progress=progress,
                stop_ids=self.stop_ids,
                raw_out=raw_out,
            )

    def identity(self) -> dict[str, Any]:
        import transformers  # noqa: PLC0415 - transformers loads only when identity() runs

        return {"name": self.name, "version": transformers.__version__}

    def release(self) -> None:
        """Move the model off the accelerator (the vLLM engine allocates its share of free GPU memory when it
        starts)."""
        import torch  # noqa: PLC0415 - torch loads only when release() runs

        if getattr(self.device, "type", str(self.device)) != "cpu":
            self.model.to("cpu")
            if torch.cuda.is_available():
                torch.cuda.empty_cache()


def vllm_installed() -> bool:
    """Whether the ``vllm`` package can be imported (without importing it)."""
    if "vllm" in sys.modules:
        return True
    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        return False


def cuda_available() -> bool:
    import torch  # noqa: PLC0415 - torch loads only when cuda_available() runs

    return bool(torch.cuda.is_available())


def check_backend_available(eval_cfg, head: Head, path: str | Path = "tuneproof.yaml") -> None:
    """Refuse ``eval.backend: vllm`` where it cannot run, before any run is created; ``head``: the
    model kind's :class:`~tuneproof.models.heads.Head` (vLLM serves generative heads).

    Raises:
        TuneproofError: (two lines, exit 2) the model is not generative, vllm is not installed, or no
            CUDA GPU is visible; each names ``eval.backend`` and what to do.
    """
    backend = getattr(eval_cfg, "backend", "transformers")
    if backend != "vllm":
        return
    if not head.generative:
        raise TuneproofError(
            f"{path}: eval.backend: vllm serves generative (causal-lm) models; this model is {head.kind}",
            hint="set eval.backend: transformers",
        )
    if not vllm_installed():
        raise TuneproofError(
            f"{path}: eval.backend: vllm, but the package vllm is not installed in this environment",
            hint="on a CUDA machine: pip install -e '.[vllm]' from the clone, or pip "
            "install vllm (it pins its own torch build); "
            "or set eval.backend: transformers",
        )
    if not cuda_available():
        raise TuneproofError(
            f"{path}: eval.backend: vllm needs a CUDA GPU; none is visible here (torch.cuda.is_available() is False)",
            hint="run the evaluation on a CUDA machine, or set eval.backend: transformers",
        )


def lora_rank(adapter_dir: str | Path | None) -> int | None:
    """The rank ``r`` in the adapter's ``adapter_config.json`` (None without an adapter)."""
    if adapter_dir is None:
        return None
    cfg = json.loads((Path(adapter_dir) / "adapter_config.json").read_text(encoding="utf-8"))
    return int(cfg.get("r") or 8)


VLLM_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


class VllmBackend:
    """vLLM's offline engine behind the backend interface (greedy decoding only).

    Args:
        model_path: the folder vLLM loads (the base model, or a fully fine-tuned run's ``model``).
        tokenizer: the study's tokenizer (prompts are encoded and answers decoded by it).
        tokenizer_path: the tokenizer folder vLLM loads for itself (default ``model_path``).
        dtype: the study's compute dtype (``fp32``, ``bf16``, ``fp16``) or a vLLM dtype name.
        max_lora_rank: the largest adapter rank served (None: LoRA disabled).
        seed, trust_remote_code: passed to ``vllm.LLM``.
        llm_kwargs: more ``vllm.LLM`` arguments.

    The engine starts at the first ``generate`` (after the transformers reference has released the GPU).

    Raises:
        TuneproofError: vllm cannot be imported (names ``eval.backend``).
    """

    name = "vllm"

    def __init__(
        self,
        model_path: str | Path,
        tokenizer,
        *,
        tokenizer_path: str | Path | None = None,
        dtype: str = "auto",
        max_lora_rank: int | None = None,
        seed: int = 0,
        trust_remote_code: bool = False,
        llm_kwargs: dict | None = None,
        stop_ids: list[int] | None = None,
        answer_from: str = "auto",
    ):
        self.model_path, self.tokenizer = Path(model_path), tokenizer
        self.tokenizer_path = Path(tokenizer_path) if tokenizer_path is not None else self.model_path
        self.dtype = VLLM_DTYPES.get(dtype, dtype)
        self.max_lora_rank, self.seed, self.trust_remote_code = max_lora_rank, seed, trust_remote_code
        self.llm_kwargs = dict(llm_kwargs or {})
        self.stop_ids = list(stop_ids) if stop_ids else None
        self.answer_from = answer_from
        self._vllm = None
        self._llm = None
        self._lora_ids: dict[Path, int] = {}

    def _module(self):
        if self._vllm is None:
            try:
                self._vllm = importlib.import_module("vllm")
            except ImportError as err:
                raise TuneproofError(
                    f"eval.backend: vllm, but vllm cannot be imported ({err})",
                    hint="pip install vllm on a CUDA machine, or set eval.backend: transformers",
                ) from None
        return self._vllm

    @property
    def llm(self):
        """The ``vllm.LLM`` engine, started on first use."""
        if self._llm is None:
            vllm = self._module()
            kw: dict[str, Any] = {
                "model": str(self.model_path),
                "tokenizer": str(self.tokenizer_path),
                "dtype": self.dtype,
                "seed": self.seed,
                "trust_remote_code": self.trust_remote_code,
            }
            if self.max_lora_rank is not None:
                # vLLM accepts a fixed set of rank limits; the next power of two >= r (at least 16) is one of them
                kw.update(
                    enable_lora=True,
                    max_loras=1,
                    max_lora_rank=max(16, 1 << (int(self.max_lora_rank) - 1).bit_length()),
                )
            kw.update(self.llm_kwargs)
            self._llm = vllm.LLM(**kw)
        return self._llm

    def _lora_request(self, adapter_dir: Path | None):
        if adapter_dir is None:
            return None
        if self.max_lora_rank is None:
            raise ValueError(
                "this vLLM engine was started without LoRA (max_lora_rank None); it cannot serve an adapter"
            )
        from vllm.lora.request import LoRARequest  # noqa: PLC0415 - vllm is optional (the vllm extra, CUDA only)

        lora_id = self._lora_ids.setdefault(adapter_dir, len(self._lora_ids) + 1)  # a unique positive int per adapter
        return LoRARequest(f"adapter-{lora_id}", lora_id, str(adapter_dir))

    def generate(
        self,
        prompts: Sequence[str],
        max_new_tokens: int,
        adapter_dir: str | Path | None = None,
        *,
        progress: Callable[[int], None] | None = None,
        chunk: int = 256,
        raw_out: list[str] | None = None,
    ) -> list[str]:
        vllm = self._module()
        llm = self.llm
        eos = self.tokenizer.eos_token_id
        stops = self.stop_ids or ([eos] if eos is not None else [])
        specials = special_texts(self.tokenizer)
        params = vllm.SamplingParams(
            temperature=0.0, max_tokens=int(max_new_tokens), stop_token_ids=stops or None, skip_special_tokens=False
        )
        request = self._lora_request(_resolved(adapter_dir))
        out: list[str] = []
        prompts = list(prompts)
        for s in range(0, len(prompts), chunk):
            part = prompts[s : s + chunk]
            inputs = [{"prompt_token_ids": self.tokenizer(p, add_special_tokens=False)["input_ids"]} for p in part]
            results = llm.generate(inputs, params, lora_request=request, use_tqdm=False)
            if len(results) != len(part):
                raise RuntimeError(f"vllm returned {len(results)} outputs for {len(part)} prompts")
            for r in results:  # decoded by the study's tokenizer and parsed as transformers' outputs are
                raw, answer = split_generation(
                    self.tokenizer, list(r.outputs[0].token_ids), stops, self.answer_from, specials
                )
                out.append(answer)
                if raw_out is not None:
                    raw_out.append(raw)
            if progress:
                progress(len(part))
        return out

    def identity(self) -> dict[str, Any]:
        vllm = self._module()
        return {
            "name": self.name,
            "version": getattr(vllm, "__version__", None),
            "dtype": self.dtype,
            "model_path": str(self.model_path),
            "max_lora_rank": self.max_lora_rank,
        }


def backend_check_sample(examples: Sequence[Any], k: int, seed: int) -> list[Any]:
    """``min(k, len(examples))`` examples drawn with ``random.Random(seed)``, in their order in ``examples``
    (the same sample for the same split, ``k`` and seed)."""
    n = len(examples)
    picks = sorted(random.Random(seed).sample(range(n), min(int(k), n)))
    return [examples[i] for i in picks]


def _first(ids: Sequence[str], a: Sequence[str], b: Sequence[str], names: tuple[str, str]) -> dict[str, Any] | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return {"id": str(ids[i]), names[0]: x, names[1]: y}
    return None


def check_backends(
    reference: GenerationBackend,
    candidate: GenerationBackend,
    prompts: Sequence[str],
    ids: Sequence[str],
    *,
    max_new_tokens: int,
    adapter_dir: str | Path | None = None,
    min_agreement: float = 0.9,
    between: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """The backend check: the candidate's greedy outputs on the sample against the reference's.

    Args:
        reference: the trusted backend (transformers).
        candidate: the backend whose numbers are to be used (vLLM).
        prompts, ids: the sample (rendered prompts, example ids), see :func:`backend_check_sample`.
        max_new_tokens: ``eval.max_new_tokens``.
        adapter_dir: the adapter served (None: the base model or a fully fine-tuned one; no effect check).
        min_agreement: ``eval.backend_check_min_agreement``, a share in [0, 1].
        between: called after the reference's generations, before the candidate's (frees the GPU).

    Returns:
        ``{"name": "eval backend check", "reference", "candidate", "passed", "reason", "message",
        "numbers": {"sample", "agreeing", "agreement", "min_agreement", "adapter_changed_reference",
        "adapter_changed_candidate"}, "first_disagreement": {"id", "reference", "candidate"} | None,
        "adapter_effect": "checked" | "no adapter" | "not testable", "ids", "outputs": {"reference",
        "candidate", "reference_base", "candidate_base"}}``. ``agreement`` is ``agreeing / sample``
        (exact string match of the answers with the adapter); the ``adapter_changed_*`` counts are
        the sampled examples whose answer with the adapter differs from the one without it (None
        without an adapter). ``reason`` (None when passed) is one line: ``"the served adapter had no
        effect: vllm gives the same answers with and without it on all 16 sampled examples,
        transformers different ones on 5"`` or ``"vllm agrees with transformers on 13 of 16 sampled examples (agreement
        0.812 < eval.backend_check_min_agreement 0.9); first: ..."``.
    """
    prompts, ids = list(prompts), [str(i) for i in ids]
    n = len(prompts)
    ref = reference.generate(prompts, max_new_tokens, adapter_dir)
    ref_base = reference.generate(prompts, max_new_tokens, None) if adapter_dir is not None else None
    if between is not None:
        between()
    cand = candidate.generate(prompts, max_new_tokens, adapter_dir)
    cand_base = candidate.generate(prompts, max_new_tokens, None) if adapter_dir is not None else None
    r_name, c_name = reference.name, candidate.name
    agreeing = sum(a == b for a, b in zip(ref, cand))
    agreement = agreeing / n if n else 1.0
    first = _first(ids, ref, cand, ("reference", "candidate"))
    changed_ref = None if ref_base is None else sum(a != b for a, b in zip(ref, ref_base))
    changed_cand = None if cand_base is None else sum(a != b for a, b in zip(cand, cand_base))
    reason = None
    if adapter_dir is None:
        effect = "no adapter"
    elif changed_ref == 0:
        effect = "not testable"  # the adapter changes no sampled answer in the reference either
    else:
        effect = "checked"
        if changed_cand == 0:
            reason = (
                f"the served adapter had no effect: {c_name} gives the same answers with and without it on all {n} "
                f"sampled examples, {r_name} different ones on {changed_ref}"
            )
    agree_text = f"{c_name} agrees with {r_name} on {agreeing} of {n} sampled examples (agreement {agreement:.3f}"
    if reason is None and agreement < min_agreement:
        shown = (
            f"; first: {first['id']}: {first['reference'][:SHOWN]!r} vs {first['candidate'][:SHOWN]!r}" if first else ""
        )
        reason = f"{agree_text} < eval.backend_check_min_agreement {min_agreement:g}){shown}"
    if reason is None:
        message = (
            f"{agree_text} >= {min_agreement:g})"
            + {
                "checked": f"; the adapter changes {changed_cand} answers in {c_name}, {changed_ref} in {r_name}",
                "not testable": f"; the adapter changes no sampled answer in {r_name}, "
                "so its effect could not be checked",
                "no adapter": "",
            }[effect]
        )
    else:
        message = reason
    return {
        "name": CHECK_NAME,
        "reference": r_name,
        "candidate": c_name,
        "passed": reason is None,
        "reason": reason,
        "message": message,
        "numbers": {
            "sample": n,
            "agreeing": agreeing,
            "agreement": agreement,
            "min_agreement": float(min_agreement),
            "adapter_changed_reference": changed_ref,
            "adapter_changed_candidate": changed_cand,
        },
        "first_disagreement": first,
        "adapter_effect": effect,
        "ids": ids,
        "outputs": {"reference": ref, "candidate": cand, "reference_base": ref_base, "candidate_base": cand_base},
    }


def check_summary(result: dict[str, Any]) -> dict[str, Any]:
    """The part of a check result kept in the run summary (the outputs stay in ``backend_check.json``)."""
    return {
        k: result[k]
        for k in (
            "passed",
            "reason",
            "message",
            "reference",
            "candidate",
            "numbers",
            "first_disagreement",
            "adapter_effect",
        )
    }
