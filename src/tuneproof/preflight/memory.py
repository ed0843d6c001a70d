"""Size one complete training step (docs/PROTOCOL.md step 5, docs/CASES.md C8).

"A model that fits while loading can overflow during this step." Reading memory between steps
shows the weights (about 4 bytes per fp32 parameter); the step itself also holds gradients,
optimizer states and activations. This module gives

* :func:`memory_between_steps` -- bytes held by parameters, gradients and optimizer state now;
* :func:`estimate_step_memory` -- a stated breakdown of one step's memory before running it;
* :func:`tuneproof.training.memory.measure_step_peak` -- the measured peak of one whole step (forward, loss,
  backward, ``optimizer.step()``), counters reset first (in training/: the loop's bf16-base check measures too);
* :func:`find_max_micro_batch` -- the largest micro-batch whose measured peak fits a budget.

Sizes are bytes; ``*_gib`` fields are GiB (2**30 bytes).
"""

from __future__ import annotations

import gc
import re
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from tuneproof.errors import TuneproofError
from tuneproof.training.loss import chunk_positions

GIB = 1 << 30
BYTES_PER_ELEMENT = {"fp32": 4, "bf16": 2, "fp16": 2}
#: Optimizer state tensors per trainable element (torch.optim: AdamW/Adam keep exp_avg and
#: exp_avg_sq; SGD with momentum keeps momentum_buffer), each in the parameter's dtype.
OPTIMIZER_STATES = {"adamw": 2, "adam": 2, "sgd": 0, "sgd-momentum": 1}
ACTIVATION_SOURCE = (
    "Korthikanti et al. 2022, 'Reducing Activation Recomputation in Large Transformer Models' "
    "(arXiv:2205.05198), sec. 4.1: activations per layer = s*b*h*(34 + 5*a*s/h) bytes for 16-bit "
    "activations (attention 11sbh + 5as^2b, MLP 19sbh, layer norms 4sbh); checkpointing keeps 2sbh per layer"
)


GATED_ACTIVATION_SOURCE = (
    "counted op by op for transformers' LlamaDecoderLayer under autograd, SDPA attention (issue 15; checked against "
    "torch.autograd.graph.saved_tensors_hooks, which sees every tensor saved for backward): per token and layer the "
    "two RMSNorm inputs (2h), q/k/v as SDPA gets them (h + 2 kv, or 3h when a padding mask makes transformers repeat "
    "k/v to every head), the SDPA output (h) and its log-sum-exp (heads, fp32), the SwiGLU MLP's gate, silu(gate) and "
    "up outputs (3i); the input of every linear whose weight is trained (a LoRA A, or the base weight in full "
    "fine-tuning: q/k/v share one, gate/up share one), or with LoRA dropout a dropped copy of it per module plus a "
    "1-byte mask; r per LoRA module; a frozen linear keeps nothing (autograd saves an operand only for the "
    "gradient that needs it)"
)
#: the roles of a decoder block's linears by name: linears of one role read the same input tensor
_INPUT_ROLES = {
    "q_proj": "attn_in",
    "k_proj": "attn_in",
    "v_proj": "attn_in",
    "qkv_proj": "attn_in",
    "query_key_value": "attn_in",
    "o_proj": "attn_out",
    "gate_proj": "mlp_in",
    "up_proj": "mlp_in",
    "gate_up_proj": "mlp_in",
    "down_proj": "mlp_mid",
}


def _block_index(name: str) -> int | None:
    m = re.search(r"\.(\d+)\.", f".{name}.")
    return int(m.group(1)) if m else None


def _trained_linear_inputs(model: nn.Module, *, sdpa: bool = True, mask_bytes: int = 4) -> dict[str, float]:
    """Per-token elements and bytes that linears with trained weights keep for backward, over the whole model.

    Counted from what autograd saves (``torch.autograd.graph.saved_tensors_hooks``, CPU fp32):

    * a LoRA module (PEFT: ``lora_A``/``lora_B``/``lora_dropout`` around ``base_layer``) keeps its
      input for ``lora_A``'s gradient (``in_features``) and ``r`` elements (``lora_A``'s output) for
      ``lora_B``'s; the linears of one role read one tensor (q/k/v the normed hidden states), kept once;
    * the attention output projection's input is the SDPA output itself (already kept by SDPA, whose
      CPU and CUDA kernels return it laid out ``[batch, seq, heads, dim]``, so the transpose costs no
      copy): nothing more under SDPA, ``in_features`` under eager attention (a contiguous copy);
    * with ``lora_dropout`` p > 0 each module keeps its own dropped copy (``in_features``) and the
      dropout's mask: on a CPU ``input * noise`` keeps the noise tensor, ``mask_bytes`` = the compute
      dtype's size per element; CUDA's fused ``native_dropout`` keeps a ``bool`` mask (1 byte). The
      first block's attention input needs no gradient when the input embeddings are frozen, so its
      q/k/v dropout keeps no mask;
    * a plain ``nn.Linear`` with a trained weight keeps its input too (shared the same way), a norm
      with a trained weight its normed input (``weight * normed``).

    Returns ``{"inputs": elements, "masks": bytes, "ranks": elements, "modules": LoRA modules,
    "dropout": the largest LoRA dropout}``, per token.
    """
    shared: dict[tuple[str, str], int] = {}
    copies = masks = ranks = 0.0
    n_lora, top_p = 0, 0.0
    lora_bases = set()
    try:
        emb = model.get_input_embeddings()
        emb_frozen = emb is None or not any(q.requires_grad for q in emb.parameters())
    except (AttributeError, NotImplementedError, TypeError):
        emb_frozen = True
    first = min((i for n, _ in model.named_modules() for i in [_block_index(n)] if i is not None), default=None)

    def keep_shared(name: str, fin: int) -> None:
        parent, _, leaf = name.rpartition(".")
        role = _INPUT_ROLES.get(leaf, leaf)
        if role == "attn_out" and sdpa:
            return
        shared[(parent, role)] = max(shared.get((parent, role), 0), fin)

    for name, module in model.named_modules():
        lora_a = getattr(module, "lora_A", None)
        base = getattr(module, "base_layer", None)
        if isinstance(lora_a, nn.ModuleDict) and len(lora_a) and base is not None:
            lora_bases.add(id(base))
            key = next(iter(lora_a.keys()))
            fin = int(getattr(base, "in_features", 0) or getattr(lora_a[key], "in_features", 0))
            ranks += int(getattr(lora_a[key], "out_features", 0))
            dropouts = getattr(module, "lora_dropout", None)
            drop = dropouts[key] if isinstance(dropouts, nn.ModuleDict) and key in dropouts else None
            p = float(getattr(drop, "p", 0.0)) if isinstance(drop, nn.Dropout) else 0.0
            n_lora, top_p = n_lora + 1, max(top_p, p)
            if p > 0:
                copies += fin
                leaf = name.rpartition(".")[2]
                if not (emb_frozen and _INPUT_ROLES.get(leaf) == "attn_in" and _block_index(name) == first):
                    masks += fin * mask_bytes
            else:
                keep_shared(name, fin)
            if getattr(base, "weight", None) is not None and base.weight.requires_grad:
                keep_shared(name, fin)
    norms = 0.0
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and id(module) not in lora_bases and module.weight.requires_grad:
            if ".lora_" in f".{name}":  # LoRA's own A/B linears: counted above
                continue
            keep_shared(name, int(module.in_features))
        elif (
            type(module).__name__.endswith(("RMSNorm", "LayerNorm"))
            and isinstance(getattr(module, "weight", None), torch.Tensor)
            and module.weight.requires_grad
        ):
            norms += module.weight.numel()  # weight * normed keeps the normed input for the weight's gradient
    return {
        "inputs": float(sum(shared.values())) + copies + norms,
        "masks": masks,
        "ranks": ranks,
        "modules": n_lora,
        "dropout": top_p,
    }


def _gated_mlp(model: nn.Module) -> bool:
    """Whether the decoder blocks use a gated MLP (a module with ``gate_proj`` and ``up_proj``: Llama, Mistral, Qwen2/3,
    Gemma)."""
    for module in model.modules():
        if hasattr(module, "gate_proj") and hasattr(module, "up_proj"):
            return True
    return False


# --------------------------------------------------------------------------- between steps
def memory_between_steps(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, Any]:
    """Bytes held right now by parameters, their ``.grad`` and the optimizer state (tensor storage).

    Computed from tensor sizes (``numel * element_size``), the same on CPU and GPU; on CUDA
    ``torch.cuda.memory_allocated`` is added for comparison. docs/CASES.md C8: a freshly loaded fp32
    model reads ``bytes_per_parameter == 4``.

    Returns:
        ``{"passed": True (a reading, not a check), "parameters", "parameter_bytes", "bytes_per_parameter",
        "gradient_bytes", "optimizer_state_bytes", "total_bytes", "total_gib", "cuda_allocated_bytes"}``.
    """
    n = pbytes = gbytes = 0
    for p in model.parameters():
        n += p.numel()
        pbytes += p.numel() * p.element_size()
        if p.grad is not None:
            gbytes += p.grad.numel() * p.grad.element_size()
    obytes = 0
    if optimizer is not None:
        for state in optimizer.state.values():
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    obytes += v.numel() * v.element_size()
    total = pbytes + gbytes + obytes
    cuda = None
    p0 = next(model.parameters(), None)
    if p0 is not None and p0.device.type == "cuda":
        cuda = int(torch.cuda.memory_allocated(p0.device))
    return {
        "passed": True,
        "parameters": n,
        "parameter_bytes": pbytes,
        "bytes_per_parameter": pbytes / n if n else 0.0,
        "gradient_bytes": gbytes,
        "optimizer_state_bytes": obytes,
        "total_bytes": total,
        "total_gib": total / GIB,
        "cuda_allocated_bytes": cuda,
    }


# --------------------------------------------------------------------------- estimate
def _cfg(config: Any, *names: str) -> int | None:
    for name in names:
        v = getattr(config, name, None)
        if isinstance(v, int):
            return v
    return None


def is_packed_quantized(p) -> bool:
    """A parameter holding packed quantized values (bitsandbytes ``Params4bit``: two 4-bit values per
    uint8 element, or per ``bnb_4bit_quant_storage`` element, with a ``quant_state``): its bytes are
    ``numel * element_size`` as stored, whatever the compute dtype."""
    return type(p).__name__ == "Params4bit" or getattr(p, "quant_state", None) is not None


def estimate_step_memory(
    model: nn.Module,
    micro_batch: int,
    seq_len: int,
    precision: str,
    optimizer: str = "adamw",
    *,
    activation_checkpointing: bool = False,
    attention_scores_stored: bool | None = None,
    trainable_dtype: str | None = None,
    weights_dtype: str | None = None,
    budget_bytes: int | None = None,
    padded: bool = False,
    chunked_loss: bool = False,
    supervised_tokens: int | None = None,
    device: str = "cpu",
) -> dict[str, Any]:
    """Estimate the memory of one training step (bytes), part by part.

    Parts (``e`` = bytes per element of ``precision``, the compute/activation dtype; ``ew`` = of
    ``weights_dtype``; ``et`` = of ``trainable_dtype``):

    * weights: frozen elements * ``ew`` + trainable elements * ``et``;
    * autocast weight copies: when weights are stored wider than they are computed in
      (``weights_dtype="fp32"``, ``precision="bf16"``: mixed precision with ``torch.autocast``),
      autocast caches a ``precision`` copy of each weight it casts: all elements * ``e`` (an upper
      bound: norms and embeddings are not cast);
    * gradients: trainable elements * ``et`` (only trained tensors get a ``.grad``);
    * optimizer states: ``OPTIMIZER_STATES[optimizer]`` * trainable * ``et``; torch's AdamW keeps
      ``exp_avg`` and ``exp_avg_sq`` in the parameter's dtype: 2 * 4 bytes per fp32 element;
    * optimizer step temporary: AdamW/Adam materialise ``sqrt(exp_avg_sq)``: on a GPU over every
      trainable element at once (1 * trainable * ``et``, the foreach implementation), on a CPU one
      tensor at a time (the largest trainable tensor * ``et``: ``torch.optim`` defaults to foreach
      only for CUDA/XPU tensors, ``_default_to_fused_or_foreach``); 0 otherwise;
    * activations of Llama-style blocks (a gated MLP: ``gate_proj``/``up_proj``; Llama, Mistral,
      Qwen2/3, SmolLM2), counted op by op from what autograd keeps for backward
      (:data:`GATED_ACTIVATION_SOURCE`), ``t = s*b`` tokens, ``L`` blocks, ``kv`` the key/value width:
      norm inputs ``L*t*2h``; SDPA's q/k/v and output ``L*t*(2h + 2kv)`` plus its log-sum-exp
      (4 bytes per head and token); k/v repeated to every head (``kv = h``) when ``padded``
      (transformers passes a mask, so SDPA gets no ``enable_gqa``) or under eager attention; with
      ``padded`` the additive mask SDPA makes at each call, ``L*b*s^2``; eager attention keeps q/k/v
      and the softmax probabilities ``L*heads*s^2*b`` instead of the output; the MLP's gate, silu and
      up outputs ``L*t*3i``; the inputs of the linears whose weights are trained and the LoRA
      dropout masks (:func:`_trained_linear_inputs`); the final norm input ``t*h`` and RoPE's cos/sin.
      All in ``e`` bytes except where stated. Other blocks: Korthikanti et al. 2022 (see
      :data:`ACTIVATION_SOURCE`), ``s*b*h*(15 + 19*i/(4h)) + 5*a*s^2*b`` in 16-bit units scaled
      by ``e/2``, the ``5as^2b`` score term dropped when the scores are not stored (SDPA / flash).
      With activation checkpointing each block keeps its input (``h``) and one block is recomputed
      at a time. LoRA does not make the frozen base's activations free: it is backpropagated through;
    * loss (models with an output embedding, i.e. causal LMs), from ``training.loss.token_loss_sum``:
      the full logits ``s*b*V`` (``e``), their shifted fp32 copy (``.float()``, or ``reshape`` of the
      non-contiguous slice when b > 1) and the saved log-softmax in the forward; the saved
      log-softmax, the nll gradient and the log-softmax gradient in the backward: ``max(e + 8, 12)``
      bytes per ``s*b*V`` element (measured: the allocator peaks inside the cross-entropy). With
      ``chunked_loss`` (``training.loss.chunked_token_loss_sum``): 3 fp32 copies of one chunk of
      ``min(chunk_positions(V), supervised_tokens)`` x ``V`` logits (``CHUNK_BYTES`` of fp32 logits
      per chunk), plus the hidden states shifted and gathered (``(s*b + supervised)*h``).

    ``total_bytes`` is the sum of all parts, as if all were live at once: a planning bound (with
    gradient accumulation the micro-batches after the first hold the gradients as well).
    ``peak_bytes`` is the step's peak: weights + autocast copies + optimizer states + ``max(
    activations + loss, gradients + optimizer temporary)`` (:func:`in_step_bytes`): gradients do not
    exist yet at the loss, where the activations and the logits buffers peak. Measured with
    :func:`~tuneproof.training.memory.measure_step_peak` (``allocated_step_peak_bytes``) against
    :func:`in_step_bytes`, LoRA r16 on q/k/v/o, CPU fp32: within 0.97-1.00 on SmolLM2-135M and a random Llama
    (docs/benchmarks-preflight.md); bf16/fp16 and checkpointing are counted by the same rules, not measured.

    Args:
        model: the model (parameters may sit on the ``meta`` device); its ``config`` must give
            ``hidden_size``, ``num_hidden_layers``, ``num_attention_heads`` (and ``vocab_size`` /
            ``intermediate_size`` when present).
        micro_batch: examples per forward/backward pass (``b``).
        seq_len: tokens per example (``s``), the representative padded length.
        precision: ``"fp32"``, ``"bf16"`` or ``"fp16"`` (resolve ``auto`` with ``backend.choose_dtype``).
        optimizer: one of :data:`OPTIMIZER_STATES`.
        activation_checkpointing: count checkpointed activations.
        attention_scores_stored: None: inferred from ``config._attn_implementation`` (``eager`` stores them).
        trainable_dtype: dtype of trained tensors when it differs (e.g. ``"fp32"`` for PEFT adapters,
            which PEFT keeps in fp32 by default, ``autocast_adapter_dtype=True``); default ``weights_dtype``.
        weights_dtype: dtype the weights are stored in; default ``precision`` (weights loaded in the
            compute dtype). ``"fp32"`` with ``precision="bf16"`` describes autocast mixed precision.
        budget_bytes: when given, ``passed`` is ``total_bytes <= budget_bytes``.
        padded: the micro-batch has padded positions (an attention mask reaches the attention).
        chunked_loss: the loss is ``training.loss.chunked_token_loss_sum`` (``training.chunked_loss``).
        supervised_tokens: supervised positions in the micro-batch (chunked loss; default ``s*b``).
        device: ``"cpu"`` or a GPU kind (``"cuda"``): the dropout mask's size and the optimizer temporary.

    Returns:
        ``{"passed", "message", "precision", "optimizer", "micro_batch", "seq_len", "parameters",
        "trainable_parameters", "bytes_per_weight", "weights_bytes", "weights_dtype", "trainable_dtype",
        "autocast_weight_copies_bytes", "gradients_bytes",
        "optimizer_states_bytes", "optimizer_states_count", "optimizer_step_temporary_bytes",
        "activations_bytes", "activation_parts" ({name: bytes}), "logits_bytes", "loss_parts" ({name:
        bytes}), "parts" ([{"part", "bytes", "formula"}], the breakdown in order), "total_bytes",
        "total_gib", "peak_bytes", "budget_bytes", "padded", "kv_repeated", "chunked_loss",
        "chunk_positions", "activation_checkpointing",
        "attention_scores_stored", "formula", "source"}``.

    Raises:
        TuneproofError: unknown precision or optimizer, or a config without the needed sizes.
    """
    if precision not in BYTES_PER_ELEMENT:
        raise TuneproofError(
            f"estimate_step_memory: precision {precision!r} is not one of {', '.join(BYTES_PER_ELEMENT)}",
            hint="resolve 'auto' with tuneproof.models.device.choose_dtype first",
        )
    if optimizer not in OPTIMIZER_STATES:
        raise TuneproofError(
            f"estimate_step_memory: optimizer {optimizer!r} is not one of {', '.join(OPTIMIZER_STATES)}"
        )
    wdtype = weights_dtype or precision
    tdtype = trainable_dtype or wdtype
    for key, value in (("weights_dtype", wdtype), ("trainable_dtype", tdtype)):
        if value not in BYTES_PER_ELEMENT:
            raise TuneproofError(f"estimate_step_memory: {key} {value!r} is not one of {', '.join(BYTES_PER_ELEMENT)}")
    e, ew, et = BYTES_PER_ELEMENT[precision], BYTES_PER_ELEMENT[wdtype], BYTES_PER_ELEMENT[tdtype]
    total_n = trainable_n = packed_n = packed_bytes = 0
    for p in model.parameters():
        total_n += p.numel()
        if p.requires_grad:
            trainable_n += p.numel()
        elif is_packed_quantized(p):  # a 4-bit base (QLoRA): its storage as it is, never cast nor copied by autocast
            packed_n += p.numel()
            packed_bytes += p.numel() * p.element_size()
    weights = (total_n - trainable_n - packed_n) * ew + packed_bytes + trainable_n * et
    autocast_copies = (total_n - packed_n) * e if ew != e else 0
    grads = trainable_n * et
    n_states = OPTIMIZER_STATES[optimizer]
    states = n_states * trainable_n * et
    if optimizer not in ("adam", "adamw"):
        temp = 0
    elif device == "cpu":  # torch.optim defaults to foreach only for CUDA/XPU tensors: on a CPU one tensor at a time
        temp = max((p.numel() for p in model.parameters() if p.requires_grad), default=0) * et
    else:
        temp = trainable_n * et

    config = getattr(model, "config", None)
    h = _cfg(config, "hidden_size", "n_embd", "d_model")
    layers = _cfg(config, "num_hidden_layers", "n_layer", "num_layers")
    heads = _cfg(config, "num_attention_heads", "n_head", "num_heads")
    if h is None or layers is None or heads is None:
        raise TuneproofError(
            f"estimate_step_memory: {type(model).__name__}.config lacks "
            "hidden_size/num_hidden_layers/num_attention_heads",
            hint="the activation estimate needs them; pass a transformers model",
        )
    inter = _cfg(config, "intermediate_size", "n_inner") or 4 * h
    vocab = _cfg(config, "vocab_size") or 0
    if attention_scores_stored is None:
        attention_scores_stored = getattr(config, "_attn_implementation", "eager") in (None, "eager")
    s, b = seq_len, micro_batch
    scale = e / 2.0
    gated = _gated_mlp(model)
    blocks: dict[str, int] = {}  # the activation parts, bytes, for the breakdown
    repeated, chunk, forward_extra = False, 0, 0
    if gated:  # Llama-style block (SwiGLU, RoPE, grouped KV, SDPA): counted op by op, see GATED_ACTIVATION_SOURCE
        kv_heads = _cfg(config, "num_key_value_heads") or heads
        head_dim = _cfg(config, "head_dim") or h // heads
        q_dim, kv_dim = heads * head_dim, kv_heads * head_dim
        # transformers repeats k/v to every head in eager attention, and in sdpa_attention_forward when a mask is given
        repeated = kv_heads < heads and (padded or attention_scores_stored)
        kv_eff = q_dim if repeated else kv_dim
        lin = _trained_linear_inputs(model, sdpa=not attention_scores_stored, mask_bytes=e if device == "cpu" else 1)
        tokens = s * b
        blocks["norm inputs (2h per block)"] = layers * tokens * 2 * h * e
        if attention_scores_stored:  # eager: q, k for the scores, the softmax probabilities and v for their product
            blocks["attention q/k/v"] = layers * tokens * (q_dim + 2 * kv_eff) * e
            blocks["attention probabilities (eager)"] = layers * heads * s * s * b * e
        else:  # SDPA keeps q, k, v, its output and the log-sum-exp (fp32) per head
            blocks["attention q/k/v + output (SDPA)"] = layers * tokens * ((2 * q_dim + 2 * kv_eff) * e + 4 * heads)
            if padded:  # SDPA turns the boolean padding mask into an additive one at each call and keeps it
                blocks["attention mask (additive, per block)"] = layers * b * s * s * e
        blocks["MLP gate, silu, up (3i per block)"] = layers * tokens * 3 * inter * e
        blocks[
            f"trained linears' inputs ({lin['modules']} LoRA modules"
            + (f", dropout {lin['dropout']:g}" if lin["dropout"] else "")
            + ")"
        ] = int(tokens * ((lin["inputs"] + lin["ranks"]) * e + lin["masks"]))
        blocks["final norm input, RoPE cos/sin"] = (
            tokens * h * e + 2 * s * head_dim * e
        )  # cos/sin: one row of positions, all examples
        full = sum(blocks.values())
        # at the end of the forward pass, before the loss: transformers' KV cache (use_cache) still holds each block's
        # k/v before they were repeated (a tensor of their own only when repeated), and the last block's gate x up
        # product is alive for the down projection
        use_cache = bool(getattr(config, "use_cache", False))
        forward_extra = (
            layers * tokens * 2 * kv_dim * e if (repeated and use_cache and not activation_checkpointing) else 0
        ) + tokens * inter * e
        if activation_checkpointing:  # each block keeps its input; one block is recomputed at a time
            blocks = {
                "checkpointed block inputs (h per block)": layers * tokens * h * e,
                "one block recomputed": int((full - blocks["final norm input, RoPE cos/sin"]) / layers),
            }
        activations = int(sum(blocks.values()))
    else:
        per_layer_units = s * b * h * (15 + 19 * inter / (4 * h)) + (
            5 * heads * s * s * b if attention_scores_stored else 0
        )
        if activation_checkpointing:
            activations = int(scale * (layers * 2 * s * b * h + per_layer_units))
        else:
            activations = int(scale * layers * per_layer_units)
        blocks["activations (Korthikanti et al. 2022)"] = activations
    try:
        has_lm_head = model.get_output_embeddings() is not None  # type: ignore[operator]
    except (AttributeError, NotImplementedError, TypeError):
        has_lm_head = False
    loss_parts: dict[str, int] = {}
    if has_lm_head and vocab:
        if chunked_loss:  # training.loss.chunked_token_loss_sum: logits of one chunk of supervised positions at a time
            n_sup = s * b if supervised_tokens is None else max(0, min(int(supervised_tokens), s * b))
            chunk = min(chunk_positions(vocab), n_sup)
            loss_parts["chunk logits: 3 fp32 copies of one chunk x V"] = 12 * chunk * vocab
            loss_parts["hidden states shifted and gathered"] = (s * b + n_sup) * h * e
        else:  # full logits, then training.loss.token_loss_sum
            copies = max(e + 4 + 4, 12) / 4
            loss_parts[f"logits: {copies:g} fp32 copies of s x b x V"] = int(copies * 4 * s * b * vocab)
    logits = int(sum(loss_parts.values()))
    total = weights + autocast_copies + grads + states + temp + activations + logits
    passed = budget_bytes is None or total <= budget_bytes
    breakdown = [
        {
            "part": "weights",
            "bytes": weights,
            "formula": f"frozen x {ew} + trainable x {et} bytes"
            + (f" + {packed_n} packed 4-bit storage elements x their own size" if packed_n else ""),
        },
        {
            "part": "autocast weight copies",
            "bytes": autocast_copies,
            "formula": f"all elements x {e} bytes when stored wider than computed",
        },
        {"part": "gradients", "bytes": grads, "formula": f"trainable x {et} bytes"},
        {"part": f"optimizer states ({n_states})", "bytes": states, "formula": f"{n_states} x trainable x {et} bytes"},
        {
            "part": "optimizer step temporary",
            "bytes": temp,
            "formula": (
                "none"
                if not temp
                else f"the largest trainable tensor x {et} bytes (one tensor at a time on a CPU)"
                if device == "cpu"
                else f"trainable x {et} bytes (foreach)"
            ),
        },
    ]
    notes = {
        "attention q/k/v + output (SDPA)": "k/v repeated to every head (padding mask)"
        if repeated
        else "k/v at their own width (GQA in SDPA)",
        "attention q/k/v": "k/v repeated to every head" if repeated else "",
        "chunk logits: 3 fp32 copies of one chunk x V": f"chunk of {chunk} positions",
    }
    breakdown += [
        {"part": f"activations: {k}", "bytes": int(v), "formula": notes.get(k, "")} for k, v in blocks.items()
    ]
    breakdown += [{"part": f"loss: {k}", "bytes": int(v), "formula": notes.get(k, "")} for k, v in loss_parts.items()]
    parts = (
        f"weights {weights / GIB:.3f} + autocast copies {autocast_copies / GIB:.3f} + grads "
        f"{grads / GIB:.3f} + {n_states} optimizer states {states / GIB:.3f} + "
        f"step temp {temp / GIB:.3f} + activations {activations / GIB:.3f} + "
        f"logits {logits / GIB:.3f} = {total / GIB:.3f} GiB"
    )
    message = (
        parts
        if budget_bytes is None
        else (
            f"{parts} {'fits' if passed else 'exceeds'} the budget {budget_bytes / GIB:.3f} GiB"
            + (
                ""
                if passed
                else "; lower training.micro_batch_size, raise "
                "gradient_accumulation_steps, or enable activation_checkpointing"
            )
        )
    )
    return {
        "passed": passed,
        "message": message,
        "precision": precision,
        "optimizer": optimizer,
        "micro_batch": micro_batch,
        "seq_len": seq_len,
        "parameters": total_n,
        "trainable_parameters": trainable_n,
        "packed_parameters": packed_n,
        "packed_bytes": packed_bytes,
        "bytes_per_weight": ew,
        "weights_bytes": weights,
        "weights_dtype": wdtype,
        "trainable_dtype": tdtype,
        "autocast_weight_copies_bytes": autocast_copies,
        "gradients_bytes": grads,
        "optimizer_states_bytes": states,
        "optimizer_states_count": n_states,
        "optimizer_step_temporary_bytes": temp,
        "activations_bytes": activations,
        "activation_parts": blocks,
        "logits_bytes": logits,
        "loss_parts": loss_parts,
        "padded": padded,
        "kv_repeated": bool(gated and repeated),
        "chunked_loss": chunked_loss,
        "chunk_positions": chunk if (chunked_loss and has_lm_head and vocab) else None,
        "parts": breakdown,
        "total_bytes": total,
        "total_gib": total / GIB,
        "forward_end_extra_bytes": forward_extra,
        "peak_bytes": weights + autocast_copies + states + max(activations + max(logits, forward_extra), grads + temp),
        "budget_bytes": budget_bytes,
        "activation_checkpointing": activation_checkpointing,
        "attention_scores_stored": attention_scores_stored,
        "formula": (
            "Llama-style blocks counted op by op (activation_parts)"
            if gated
            else "per layer (16-bit units) s*b*h*(15 + 19*i/(4h)) + 5*a*s^2*b, times "
            "e/2; checkpointed: 2sbh per layer + one layer"
        ),
        "source": GATED_ACTIVATION_SOURCE if gated else ACTIVATION_SOURCE,
    }


def in_step_bytes(estimate: dict[str, Any]) -> int:
    """The peak of what a step allocates once the weights and optimizer states exist (bytes), from an
    :func:`estimate_step_memory` result: ``max(activations + max(logits / loss, forward-end extra),
    gradients + optimizer-step temporary)``. Gradients do not exist yet at the loss, where activations
    and the logits buffers peak (``zero_grad(set_to_none=True)`` before; measured: the allocator's
    peak falls inside the cross-entropy), and the activations are freed by the optimizer step. When
    the loss part is small (the chunked loss) the end of the forward pass can be higher: the KV
    cache's k/v before their repetition to every head and the last block's MLP product
    (``forward_end_extra_bytes``; measured on SmolLM2 at 512 x 8, chunked: the peak inside a linear of the forward).
    With gradient accumulation the micro-batches after the first also hold the gradients: ``total_bytes`` (every part at
    once) bounds that. The measured step's ``allocated_step_peak_bytes`` is compared with this."""
    return int(
        max(
            estimate["activations_bytes"] + max(estimate["logits_bytes"], estimate.get("forward_end_extra_bytes", 0)),
            estimate["gradients_bytes"] + estimate["optimizer_step_temporary_bytes"],
        )
    )


def side_by_side(estimate: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any]:
    """The measured peak next to the estimate's breakdown (docs/CASES.md C8), for the preflight report.

    Returns:
        ``{"rows": [[part, bytes]...], "estimate_total_bytes", "measured_peak_bytes",
        "measured_step_peak_bytes", "measured_over_estimate", "estimate_in_step_bytes",
        "measured_allocated_step_peak_bytes", "allocated_over_in_step", "device", "method", "note"}``.
        ``measured_over_estimate`` uses ``peak_bytes`` on CUDA (weights included in both) and is
        None on CPU, whose peak includes the interpreter. ``allocated_over_in_step``: the bytes the
        step's tensors held at the peak (``allocated_step_peak_bytes`` of
        :func:`~tuneproof.training.memory.measure_step_peak`)
        over the estimate's in-step parts (gradients, optimizer temporary, activations, logits), on
        any device; None when not measured.
    """
    parts = (
        "weights_bytes",
        "autocast_weight_copies_bytes",
        "gradients_bytes",
        "optimizer_states_bytes",
        "optimizer_step_temporary_bytes",
        "activations_bytes",
        "logits_bytes",
    )
    rows = [[p.removesuffix("_bytes"), int(estimate[p])] for p in parts]
    cuda = str(measured.get("device", "")).startswith("cuda")
    peak = measured.get("peak_bytes")
    ratio = (peak / estimate["total_bytes"]) if (cuda and peak and estimate.get("total_bytes")) else None
    in_step = in_step_bytes(estimate)
    tensors = measured.get("allocated_step_peak_bytes")
    return {
        "rows": rows,
        "estimate_in_step_bytes": in_step,
        "measured_allocated_step_peak_bytes": tensors,
        "allocated_over_in_step": (tensors / in_step) if (tensors is not None and in_step) else None,
        "estimate_total_bytes": int(estimate["total_bytes"]),
        "measured_peak_bytes": peak,
        "measured_step_peak_bytes": measured.get("step_peak_bytes"),
        "measured_over_estimate": ratio,
        "device": measured.get("device"),
        "method": measured.get("method"),
        "note": (
            "estimate total = sum of parts (all live at once); measured = peak of one whole step"
            + (
                ""
                if cuda
                else "; CPU peak is the process RSS, compare step_peak_bytes with the parts created in the step"
            )
        ),
    }


# --------------------------------------------------------------------------- search
def _is_oom(err: BaseException) -> bool:
    oom_types = tuple(
        t for t in (getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None)) if t
    )
    if isinstance(err, MemoryError) or (oom_types and isinstance(err, oom_types)):
        return True
    return isinstance(err, RuntimeError) and "out of memory" in str(err).lower()


def find_max_micro_batch(
    try_fn: Callable[[int], Any], budget_bytes: int, start: int = 1, limit: int = 1024
) -> dict[str, Any]:
    """Largest micro-batch in ``[start, limit]`` whose measured peak fits ``budget_bytes``.

    Doubles from ``start`` until a try exceeds the budget or runs out of memory, then bisects
    between the last fit and the first miss. Assumes the peak grows with the micro-batch.

    Args:
        try_fn: ``micro_batch -> peak bytes`` (an int, or a
            :func:`~tuneproof.training.memory.measure_step_peak` dict whose
            ``peak_bytes`` is used); an out-of-memory error (``torch.OutOfMemoryError``,
            ``MemoryError``, ``RuntimeError`` "out of memory") counts as a miss; other errors propagate.
        budget_bytes: the memory allowed for one step, bytes.
        start, limit: smallest and largest micro-batch to try.

    Returns:
        ``{"passed": a micro-batch fits, "message", "max_micro_batch" (0 when none fits),
        "peak_bytes" (of that micro-batch), "budget_bytes", "limit", "tries": [{"micro_batch",
        "peak_bytes", "fits", "oom"}]}``.
    """
    if start < 1 or limit < start:
        raise TuneproofError(f"find_max_micro_batch: need 1 <= start <= limit, got start={start}, limit={limit}")
    tries: list[dict[str, Any]] = []
    peaks: dict[int, int | None] = {}

    def fits(mb: int) -> bool:
        oom = False
        try:
            out = try_fn(mb)
            peak = int(out["peak_bytes"] if isinstance(out, dict) else out)
        except Exception as err:  # noqa: BLE001 - only out-of-memory is swallowed
            if not _is_oom(err):
                raise
            oom, peak = True, None
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        ok = (not oom) and peak is not None and peak <= budget_bytes
        peaks[mb] = peak
        tries.append({"micro_batch": mb, "peak_bytes": peak, "fits": ok, "oom": oom})
        return ok

    good, bad, mb = 0, None, start
    while mb <= limit:
        if fits(mb):
            good, mb = mb, mb * 2
        else:
            bad = mb
            break
    if good == 0:
        return {
            "passed": False,
            "message": f"micro-batch {start} does not fit in {budget_bytes / GIB:.3f} GiB"
            + (" (out of memory)" if tries and tries[0]["oom"] else f" (peak {tries[0]['peak_bytes'] / GIB:.3f} GiB)"),
            "max_micro_batch": 0,
            "peak_bytes": None,
            "budget_bytes": budget_bytes,
            "limit": limit,
            "tries": tries,
        }
    if bad is None:
        bad = limit + 1
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return {
        "passed": True,
        "message": f"largest micro-batch that fits {budget_bytes / GIB:.3f} GiB: {good} "
        f"(peak {peaks[good] / GIB:.3f} GiB, {len(tries)} tries)",
        "max_micro_batch": good,
        "peak_bytes": peaks[good],
        "budget_bytes": budget_bytes,
        "limit": limit,
        "tries": tries,
    }


__all__ = [
    "ACTIVATION_SOURCE",
    "BYTES_PER_ELEMENT",
    "OPTIMIZER_STATES",
    "estimate_step_memory",
    "find_max_micro_batch",
    "in_step_bytes",
    "memory_between_steps",
    "side_by_side",
]
