"""The chunked causal-LM loss (docs/PROTOCOL.md step 5): same summed loss and gradients as the full-logits
reference, and a model that post-processes its logits fails the check."""

from __future__ import annotations

import pytest
import torch


def _batch(vocab: int):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (3, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[2, 9:] = 0
    labels = ids.clone()
    labels[:, :5] = -100  # prompt not supervised
    labels[2, 9:] = -100  # padding
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


@pytest.fixture()
def lora_llama():
    from peft import LoraConfig, get_peft_model

    from tinymodels import make_llama

    torch.manual_seed(0)
    model = make_llama(64)
    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))


def test_chunked_loss_equals_the_reference_loss_and_gradients(lora_llama):
    from tuneproof.training.loss import check_chunked_loss, chunked_token_loss_sum, token_loss_sum

    batch = _batch(64)
    ref = token_loss_sum(
        lora_llama(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits, batch["labels"]
    )
    got = chunked_token_loss_sum(
        lora_llama, batch["input_ids"], batch["attention_mask"], batch["labels"], chunk_tokens=4
    )
    assert float(got) == pytest.approx(float(ref), rel=1e-6)
    rep = check_chunked_loss(lora_llama, batch, chunk_tokens=4)  # 18 supervised positions in chunks of 4
    assert rep["passed"] is True and rep["tensors"] == 8  # q and v LoRA A/B in 2 layers
    assert rep["loss_rel_diff"] <= 1e-5 and rep["grad_max_rel_diff"] <= 1e-4
    assert all(p.grad is None for p in lora_llama.parameters())  # the check leaves no gradient behind


def test_a_model_that_scales_its_logits_fails_the_check(lora_llama):
    from tuneproof.training.loss import check_chunked_loss

    base = lora_llama.get_base_model()
    original = base.forward

    def scaled_forward(*args, **kwargs):  # e.g. a logit scale or soft-capping applied inside forward
        out = original(*args, **kwargs)
        out.logits = out.logits * 0.5
        return out

    base.forward = scaled_forward
    rep = check_chunked_loss(lora_llama, _batch(64))
    assert rep["passed"] is False and rep["loss_rel_diff"] > 1e-3
    assert "leave training.chunked_loss off" in rep["message"]


def test_a_run_with_the_chunked_loss_trains_like_the_reference_and_records_its_check(tiny_base, tmp_path):
    from tiny_study import losses_by_step, make_study, train_dir
    from tuneproof.context import StudyContext
    from tuneproof.io import read_json
    from tuneproof.recipes.train import run_train

    losses = {}
    for chunked in (False, True):
        study = make_study(tmp_path / f"s{int(chunked)}", tiny_base, chunked_loss=chunked, max_steps=4)
        run_train(StudyContext.open(study))
        losses[chunked] = losses_by_step(train_dir(study))
        summary = read_json(train_dir(study) / "summary.json")
        assert ("speedups" in summary) is chunked
    assert list(losses[True]) == [1, 2, 3, 4]
    for step, ref in losses[False].items():
        assert losses[True][step] == pytest.approx(ref, rel=1e-4), step
    assert summary["speedups"]["chunked_loss"]["grad_max_rel_diff"] <= 1e-4


def test_token_loss_sum_shifts_the_labels_not_the_logits_and_gives_the_textbook_terms():
    """The reference loss shifts the labels (no copy of the [batch, seq, vocab] logits): gradients
    bitwise equal to the textbook ``logits[:, :-1]`` / ``labels[:, 1:]`` form, the sum within fp32
    summation order; a position whose next label is ignored adds nothing."""
    import torch.nn.functional as F

    from tuneproof.training.loss import token_loss_sum

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 11, generator=g, requires_grad=True)
    labels = torch.randint(0, 11, (3, 7), generator=g)
    labels[:, :3] = -100
    labels[1, 5] = -100
    textbook = F.cross_entropy(
        logits[:, :-1].reshape(-1, 11), labels[:, 1:].reshape(-1), ignore_index=-100, reduction="sum"
    )
    (g_ref,) = torch.autograd.grad(textbook, logits)
    got = token_loss_sum(logits, labels)
    (g_got,) = torch.autograd.grad(got, logits)
    assert torch.equal(g_got, g_ref)
    assert float(got) == pytest.approx(float(textbook), rel=1e-6)
    assert torch.count_nonzero(g_got[:, -1]) == 0  # the last position predicts nothing
    by_hand = sum(
        -torch.log_softmax(logits[i, t - 1], -1)[labels[i, t]]
        for i in range(3)
        for t in range(1, 7)
        if labels[i, t] != -100
    )
    assert float(got) == pytest.approx(float(by_hand), rel=1e-6)
