"""A stand-in for the part of vLLM's offline API that ``VllmBackend`` calls (``vllm.LLM``,
``vllm.SamplingParams``, ``vllm.lora.request.LoRARequest``), backed by transformers + PEFT on the
CPU, since vLLM itself needs CUDA. It generates each prompt alone from its token ids (no padding,
like a continuous-batching engine) and returns ``RequestOutput``-like objects whose
``outputs[0].token_ids`` are the new tokens, stopping at ``stop_token_ids``.

Switches, to play the faults the backend check must catch:
- ``drop_lora=True``: the LoRA request is accepted and silently ignored (the served adapter has no effect).
It refuses, like vLLM: a LoRA request when the engine was built without ``enable_lora``, and an
adapter whose rank is above ``max_lora_rank``.
"""

from __future__ import annotations

import importlib.machinery
import json
import sys
import types
from pathlib import Path
from types import SimpleNamespace


class SamplingParams:
    def __init__(self, temperature: float = 1.0, max_tokens: int = 16, stop_token_ids=None, **kw):
        self.temperature, self.max_tokens, self.stop_token_ids, self.extra = (
            temperature,
            max_tokens,
            list(stop_token_ids or []),
            kw,
        )


class LoRARequest:
    def __init__(self, lora_name: str, lora_int_id: int, lora_path: str):
        self.lora_name, self.lora_int_id, self.lora_path = lora_name, lora_int_id, lora_path


class LLM:
    instances: list[LLM] = []
    drop_lora = False

    def __init__(
        self,
        model: str,
        tokenizer: str | None = None,
        dtype: str = "auto",
        seed: int = 0,
        trust_remote_code: bool = False,
        enable_lora: bool = False,
        max_loras: int = 1,
        max_lora_rank: int = 16,
        **kw,
    ):
        import torch
        from transformers import AutoModelForCausalLM

        self.kwargs = {
            "model": model,
            "tokenizer": tokenizer,
            "dtype": dtype,
            "seed": seed,
            "trust_remote_code": trust_remote_code,
            "enable_lora": enable_lora,
            "max_loras": max_loras,
            "max_lora_rank": max_lora_rank,
            **kw,
        }
        self.base = AutoModelForCausalLM.from_pretrained(model, torch_dtype=torch.float32).eval()
        self.peft = None
        self.lora_ids: dict[int, str] = {}
        self.requests: list[LoRARequest | None] = []
        LLM.instances.append(self)

    def _model(self, request: LoRARequest | None):
        import contextlib

        if request is not None:
            if not self.kwargs["enable_lora"]:
                raise ValueError("LoRA is not enabled")
            rank = json.loads((Path(request.lora_path) / "adapter_config.json").read_text())["r"]
            if rank > self.kwargs["max_lora_rank"]:
                raise ValueError(f"LoRA rank {rank} is greater than max_lora_rank {self.kwargs['max_lora_rank']}")
            if self.lora_ids.setdefault(request.lora_int_id, request.lora_path) != request.lora_path:
                raise ValueError(f"lora_int_id {request.lora_int_id} names two adapters")
            if self.peft is None:
                from peft import PeftModel

                self.peft = PeftModel.from_pretrained(self.base, request.lora_path).eval()
            if not LLM.drop_lora:
                return self.peft, contextlib.nullcontext()
        if self.peft is not None:
            return self.peft, self.peft.disable_adapter()
        return self.base, contextlib.nullcontext()

    def generate(
        self, prompts, sampling_params: SamplingParams, lora_request: LoRARequest | None = None, use_tqdm: bool = True
    ):
        import torch

        assert sampling_params.temperature == 0.0, "the fake serves greedy decoding only"
        self.requests.append(lora_request)
        model, mode = self._model(lora_request)
        out = []
        with mode, torch.inference_mode():
            for p in prompts:
                ids = torch.tensor([p["prompt_token_ids"]])
                gen = model.generate(
                    input_ids=ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=sampling_params.max_tokens,
                    do_sample=False,
                    temperature=None,
                    top_p=None,
                    top_k=None,
                    eos_token_id=sampling_params.stop_token_ids or None,
                    pad_token_id=self.base.config.pad_token_id,
                )
                new = gen[0, ids.shape[1] :].tolist()
                out.append(SimpleNamespace(outputs=[SimpleNamespace(token_ids=new, text=None)]))
        return out


def install(monkeypatch, *, drop_lora: bool = False) -> types.ModuleType:
    """Put the fake at ``vllm`` (and ``vllm.lora.request``) in ``sys.modules`` for one test."""
    mod = types.ModuleType("vllm")
    mod.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
    mod.__version__ = "0.0.0+fake"
    mod.LLM, mod.SamplingParams = LLM, SamplingParams
    lora = types.ModuleType("vllm.lora")
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = LoRARequest
    lora.request = request
    mod.lora = lora
    LLM.instances = []
    monkeypatch.setattr(LLM, "drop_lora", drop_lora)
    for name, m in (("vllm", mod), ("vllm.lora", lora), ("vllm.lora.request", request)):
        monkeypatch.setitem(sys.modules, name, m)
    return mod
