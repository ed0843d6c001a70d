"""One optimizer step changes exactly the trained tensors (docs/PROTOCOL.md step 4, docs/CASES.md C7)."""

import contextlib
import json
from types import SimpleNamespace

import pytest
import torch
from peft import LoraConfig, get_peft_model
from torch import nn
from transformers import BertConfig, BertForSequenceClassification, LlamaConfig, LlamaForCausalLM

from tuneproof.errors import TuneproofError
from tuneproof.preflight import update_check
from tuneproof.preflight.update_check import check_update
from tuneproof.study import Training
from tuneproof.training.loss import token_loss_sum


def tiny_llama(seed=0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
    )
    return LlamaForCausalLM(cfg)


def lora_llama(checkpointing=False, remedy=True, dropout=0.1):
    base = tiny_llama()
    model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=dropout))
    if checkpointing:
        base.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True})
        # transformers >= 5 installs the input-grad hook itself; remove it to get the docs/CASES.md C7 configuration
        base.disable_input_require_grads()
        if remedy:
            model.enable_input_require_grads()
    return model


def lm_batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 128, (2, 10), generator=g)
    labels = ids.clone()
    labels[:, :4] = -100  # prompt positions are not supervised
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    labels[1, 8:] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_c7_reentrant_checkpointing_without_input_grads_fails_with_cause_and_remedy():
    model = lora_llama(checkpointing=True, remedy=False)
    r = check_update(model, lm_batch())
    assert r["passed"] is False
    assert r["trainable_tensors"] == 8 and len(r["no_grad"]) == 8 and r["trainable_changed"] == 0
    assert r["frozen_unchanged"] == r["frozen_tensors"]
    assert r["diagnosis"]["activation_checkpointing"] and r["diagnosis"]["use_reentrant"] is True
    assert "8 of 8 trainable tensors got no gradient" in r["message"]
    assert "enable_input_require_grads()" in r["message"] and "'use_reentrant': False" in r["message"]


def test_c7_with_the_remedy_every_lora_tensor_changes_and_the_step_equals_no_checkpointing():
    batch = lm_batch()
    model = lora_llama(checkpointing=True, remedy=True)
    before = state(model)
    r = check_update(model, batch)
    assert r["passed"], r["message"]
    json.dumps(r)
    assert r["trainable_tensors"] == 8 and r["trainable_changed"] == 8 and r["trainable_nonzero_grad"] == 8
    assert r["frozen_tensors"] > 0 and r["frozen_unchanged"] == r["frozen_tensors"] and r["frozen_changed"] == []
    # lora_B starts at zero, so lora_A's step-1 gradient is exactly zero: one extra step is taken
    assert r["steps"] == 2 and r["extra_steps"] == 1
    assert all(v == 0.0 for k, v in r["grad_norms"].items() if "lora_A" in k)
    assert all(v > 0.0 for k, v in r["grad_norms"].items() if "lora_B" in k)
    # the model is restored bitwise
    after = state(model)
    assert all(torch.equal(before[k], after[k]) for k in before)
    plain = check_update(lora_llama(checkpointing=False), batch)
    assert plain["passed"]
    for k in r["update_norms"]:
        assert r["update_norms"][k] == pytest.approx(plain["update_norms"][k], rel=1e-5, abs=1e-8)
        assert (r["grad_norms"][k] or 0.0) == pytest.approx(plain["grad_norms"][k] or 0.0, rel=1e-5, abs=1e-8)
    assert r["losses"] == pytest.approx(plain["losses"], rel=1e-6)


def test_causal_lm_loss_is_token_loss_sum_over_supervised_tokens():
    batch = lm_batch()
    model = tiny_llama()
    r = check_update(model, batch)
    assert r["passed"] and r["loss_kind"] == "causal-lm per token"
    assert r["supervised_tokens"] == 2 * 6 - 2  # positions 4..9 of row 0, 4..7 of row 1
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        expected = float(token_loss_sum(logits, batch["labels"])) / r["supervised_tokens"]
    assert r["losses"][0] == pytest.approx(expected, rel=1e-5)
    assert r["steps"] == 1 and r["trainable_changed"] == r["trainable_tensors"]


def test_full_fine_tuning_of_a_classifier_uses_the_model_loss():
    torch.manual_seed(0)
    cfg = BertConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        vocab_size=100,
        max_position_embeddings=64,
        num_labels=2,
    )
    model = BertForSequenceClassification(cfg)
    for p in model.bert.embeddings.parameters():
        p.requires_grad_(False)
    batch = {
        "input_ids": torch.randint(0, 100, (4, 12)),
        "attention_mask": torch.ones(4, 12, dtype=torch.long),
        "labels": torch.tensor([0, 1, 1, 0]),
    }
    r = check_update(model, batch)
    assert r["passed"], r["message"]
    assert r["loss_kind"] == "model loss"
    assert r["frozen_tensors"] == len(list(model.bert.embeddings.parameters())) and r["frozen_changed"] == []


class Faulty(nn.Module):
    """A trainable tensor outside the graph, and a frozen tensor the forward pass modifies."""

    def __init__(self):
        super().__init__()
        self.used = nn.Linear(4, 4)
        self.unused = nn.Parameter(torch.ones(3))
        self.frozen = nn.Parameter(torch.zeros(2), requires_grad=False)

    def forward(self, input_ids, labels=None, **_):
        with torch.no_grad():
            self.frozen.add_(1.0)
        x = torch.nn.functional.one_hot(input_ids % 4, 4).float()
        return SimpleNamespace(loss=self.used(x).pow(2).mean())


def test_names_the_tensor_without_gradient_and_the_frozen_tensor_that_changed():
    model = Faulty()
    r = check_update(model, {"input_ids": torch.tensor([[1, 2, 3]]), "labels": torch.tensor([0])})
    assert r["passed"] is False
    assert r["no_grad"] == ["unused"] and r["not_changed"] == ["unused"]
    assert r["frozen_changed"] == ["frozen"]
    assert r["trainable_changed"] == 2 and r["trainable_tensors"] == 3
    assert "1 of 3 trainable tensors got no gradient: unused" in r["message"]
    assert "1 of 1 frozen tensors changed: frozen" in r["message"]
    assert torch.equal(model.frozen, torch.zeros(2))  # restored


class ZeroGrad(nn.Module):
    """A trainable tensor wired into the graph with an always-zero gradient."""

    def __init__(self):
        super().__init__()
        self.used = nn.Linear(4, 4)
        self.dead = nn.Parameter(torch.ones(3))

    def forward(self, input_ids, labels=None, **_):
        x = torch.nn.functional.one_hot(input_ids % 4, 4).float()
        return SimpleNamespace(loss=self.used(x).pow(2).mean() + 0.0 * self.dead.sum())


def test_weight_decay_alone_does_not_count_as_a_gradient():
    batch = {"input_ids": torch.tensor([[1, 2]]), "labels": torch.tensor([0])}
    r = check_update(ZeroGrad(), batch, optimizer_factory=lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1))
    assert r["zero_grad"] == ["dead"] and r["not_changed"] == []  # decoupled decay moved it
    assert r["steps"] == 3 and r["extra_steps"] == 2  # kept stepping in case it was a zero-init partner
    assert r["passed"] is False and r["optimizer"] == "AdamW"
    assert "1 of 3 trainable tensors got only all-zero gradients in 3 steps: dead" in r["message"]
    default = check_update(ZeroGrad(), batch)  # default AdamW has weight_decay=0: it does not move
    assert default["not_changed"] == ["dead"] and default["passed"] is False


def test_batch_without_supervised_tokens_is_a_user_error():
    batch = lm_batch()
    batch["labels"][:] = -100
    with pytest.raises(TuneproofError, match="no supervised tokens"):
        check_update(tiny_llama(), batch)


def _frozen_after_a_backward():
    """A tiny Llama whose embedding got a .grad from a backward and was frozen afterwards."""
    model = tiny_llama()
    batch = lm_batch()
    model(**batch).loss.backward()
    emb = model.get_input_embeddings().weight
    assert emb.grad is not None and bool((emb.grad != 0).any())
    emb.requires_grad_(False)  # frozen, .grad left as it was
    return model, batch, emb


def test_a_frozen_tensor_the_optimizer_moves_with_a_stale_grad_is_named_after_the_real_step():
    model, batch, emb = _frozen_after_a_backward()
    before = emb.detach().clone()
    stale = emb.grad.clone()
    # a plain loop's optimizer over every tensor of the model, with weight decay
    r = check_update(
        model, batch, optimizer_factory=lambda _ps: torch.optim.AdamW(model.parameters(), weight_decay=0.01)
    )
    assert r["passed"] is False
    assert r["frozen_changed"] == ["model.embed_tokens.weight"]
    assert r["frozen_held_by_optimizer"] == ["model.embed_tokens.weight"]
    assert r["frozen_with_grad"] == ["model.embed_tokens.weight"]
    assert "1 of 1 frozen tensors changed: model.embed_tokens.weight" in r["message"]
    assert "whose .grad held a value set before they were frozen" in r["message"]
    assert "model.zero_grad(set_to_none=True)" in r["message"]
    # restored bitwise, the stale .grad included (a copy, not the tensor the backward added to)
    assert torch.equal(emb, before) and torch.equal(emb.grad, stale)
    # the same model with the optimizer over the trainable tensors only: the frozen tensor stays put
    ok = check_update(model, batch, optimizer_factory=lambda ps: torch.optim.AdamW(ps, weight_decay=0.01))
    assert ok["passed"], ok["message"]
    assert ok["frozen_held_by_optimizer"] == [] and ok["frozen_with_grad"] == ["model.embed_tokens.weight"]


def test_a_stale_grad_on_a_trainable_tensor_is_not_taken_for_its_gradient():
    model, batch = tiny_llama(), lm_batch()
    clean = check_update(model, batch)
    head = model.get_output_embeddings().weight
    head.grad = torch.full_like(head, 0.5)  # left from an earlier backward
    r = check_update(model, batch)
    assert r["grad_norms"]["lm_head.weight"] == pytest.approx(clean["grad_norms"]["lm_head.weight"], rel=1e-5)
    assert torch.equal(head.grad, torch.full_like(head, 0.5))  # restored


def test_the_preflight_update_check_steps_the_runs_own_optimizer(monkeypatch):
    model, batch, _ = _frozen_after_a_backward()
    cfg = Training(max_steps=1, learning_rate=1e-3, weight_decay=0.01)
    ok = update_check.check_update_step(model, batch, contextlib.nullcontext, cfg)
    assert ok["passed"], ok["message"]
    assert ok["numbers"]["frozen_held_by_optimizer"] == 0
    # a loop whose optimizer holds every tensor (the fault injected where the run builds it)
    monkeypatch.setattr(
        update_check,
        "build_optimizer",
        lambda m, c: torch.optim.AdamW(m.parameters(), lr=c.learning_rate, weight_decay=c.weight_decay),
    )
    bad = update_check.check_update_step(model, batch, contextlib.nullcontext, cfg)
    assert bad["passed"] is False
    assert bad["details"]["frozen_changed"] == ["model.embed_tokens.weight"]
    assert bad["numbers"]["frozen_held_by_optimizer"] == 1
