"""Gradient accumulation equals the concatenated batch (docs/PROTOCOL.md step 5, docs/CASES.md C1)."""

import json
import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from transformers import BertConfig, BertForSequenceClassification, LlamaConfig, LlamaForCausalLM

from tuneproof.errors import TuneproofError
from tuneproof.preflight.accumulation import check_accumulation, concat_micro_batches
from tuneproof.training.loss import NORMALISATION, window_losses


class TableLM(nn.Module):
    """logits[b, t] = table[input_ids[b, t]]: the loss of each position is set by hand."""

    def __init__(self):
        super().__init__()
        # vocab 3, target token 0: CE(row) = log(1 + 2 e^x) for a row [0, x, x]
        x2 = math.log((math.e**2 - 1) / 2)  # input token 1 -> loss 2.0
        x1 = math.log((math.e - 1) / 2)  # input token 2 -> loss 1.0
        self.table = nn.Parameter(torch.tensor([[0.0, 0.0, 0.0], [0.0, x2, x2], [0.0, x1, x1]], dtype=torch.float64))

    def forward(self, input_ids, attention_mask=None):
        return SimpleNamespace(logits=self.table[input_ids])


def c1_window():
    a = {
        "input_ids": torch.tensor([[1, 0]]),
        "attention_mask": torch.tensor([[1, 1]]),
        "labels": torch.tensor([[-100, 0]]),
    }
    b = {
        "input_ids": torch.tensor([[2, 2, 2, 0]]),
        "attention_mask": torch.ones(1, 4, dtype=torch.long),
        "labels": torch.tensor([[-100, 0, 0, 0]]),
    }
    return [a, b]


def test_c1_window_losses_exact():
    r = window_losses([2.0, 3.0], [1, 3])
    assert r["per_token"] == 1.25 and r["mean_of_means"] == 1.5


def test_c1_check_on_the_exact_case():
    r = check_accumulation(TableLM(), c1_window(), atol=1e-7)
    assert r["passed"], r["message"]
    json.dumps(r)
    assert r["tokens_per_micro_batch"] == [1, 3] and r["window_tokens"] == 4
    assert r["loss_sums"] == pytest.approx([2.0, 3.0], abs=1e-6)  # token_loss_sum computes in fp32
    assert r["loss_accumulated"] == pytest.approx(1.25, abs=1e-6)
    assert r["loss_concatenated"] == pytest.approx(1.25, abs=1e-6)
    assert r["loss_mean_of_means"] == pytest.approx(1.5, abs=1e-6)
    assert r["normalisation"] == NORMALISATION
    assert "mean of means would be 1.5" in r["message"]


def test_concatenation_right_pads_with_ignored_labels():
    cat = concat_micro_batches(c1_window())
    assert cat["input_ids"].tolist() == [[1, 0, 0, 0], [2, 2, 2, 0]]
    assert cat["attention_mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert cat["labels"].tolist() == [[-100, 0, -100, -100], [-100, 0, 0, 0]]


def test_tiny_llama_accumulated_grads_equal_concatenated_batch():
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=128,
        )
    )
    g = torch.Generator().manual_seed(3)
    a_ids = torch.randint(0, 128, (1, 6), generator=g)
    a_lab = torch.full_like(a_ids, -100)
    a_lab[0, 5] = a_ids[0, 5]  # 1 supervised token
    b_ids = torch.randint(0, 128, (2, 9), generator=g)
    b_lab = torch.full_like(b_ids, -100)
    b_lab[:, 6:] = b_ids[:, 6:]  # 6 supervised tokens
    mbs = [
        {"input_ids": a_ids, "attention_mask": torch.ones_like(a_ids), "labels": a_lab},
        {"input_ids": b_ids, "attention_mask": torch.ones_like(b_ids), "labels": b_lab},
    ]
    model.train()
    r = check_accumulation(model, mbs)
    assert r["passed"], r["message"]
    assert r["tokens_per_micro_batch"] == [1, 6] and r["window_tokens"] == 7
    assert r["grad_tensors"] == len(list(model.parameters())) and r["grad_mismatches"] == []
    assert r["grad_max_abs_diff"] < 1e-5
    assert r["loss_accumulated"] == pytest.approx(sum(r["loss_sums"]) / 7, rel=1e-12)
    assert abs(r["loss_mean_of_means"] - r["loss_accumulated"]) > 1e-3  # the two normalisations differ here
    assert model.training and all(p.grad is None for p in model.parameters())  # mode and grads restored


def test_classifier_window_normalises_per_example():
    torch.manual_seed(0)
    model = BertForSequenceClassification(
        BertConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            vocab_size=100,
            max_position_embeddings=64,
            num_labels=2,
        )
    )
    mbs = [
        {
            "input_ids": torch.randint(1, 100, (1, 5)),
            "attention_mask": torch.ones(1, 5, dtype=torch.long),
            "labels": torch.tensor([1]),
        },
        {
            "input_ids": torch.randint(1, 100, (3, 8)),
            "attention_mask": torch.ones(3, 8, dtype=torch.long),
            "labels": torch.tensor([0, 1, 0]),
        },
    ]
    r = check_accumulation(model, mbs)
    assert r["passed"], r["message"]
    assert r["tokens_per_micro_batch"] == [1, 3] and r["normalisation"].startswith("per-example mean")


def test_window_without_supervised_tokens_is_a_user_error():
    window = c1_window()
    for mb in window:
        mb["labels"][:] = -100
    with pytest.raises(TuneproofError, match="no supervised tokens"):
        check_accumulation(TableLM(), window)


def test_last_window_of_an_epoch_holds_what_is_left():
    from tuneproof.preflight.accumulation import last_window_micro_batches

    assert last_window_micro_batches(6, 1, 4) == 2  # docs/CASES.md C18: windows of 4 and 2
    assert last_window_micro_batches(10, 2, 2) == 1  # 5 micro-batches: 2, 2, 1
    assert last_window_micro_batches(24, 4, 2) == 2  # 6 micro-batches: every window full
    assert last_window_micro_batches(10, 2, 2, world_size=2) == 1  # 5 examples per process: 3 micro-batches


def test_check_windows_covers_a_short_last_window():
    from tuneproof.preflight.accumulation import check_windows

    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=128,
        )
    )
    g = torch.Generator().manual_seed(5)

    def mb(b, t, supervised):
        ids = torch.randint(0, 128, (b, t), generator=g)
        lab = torch.full_like(ids, -100)
        lab[:, t - supervised :] = ids[:, t - supervised :]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": lab}

    first = [mb(1, 6, 2), mb(1, 8, 3), mb(1, 5, 1), mb(1, 7, 4)]
    last = [mb(1, 9, 5), mb(1, 4, 1)]  # the 2 micro-batches left at the end of the epoch
    r = check_windows(model, first, last)
    assert r["passed"], r["message"]
    assert r["micro_batches"] == 4 and r["window_tokens"] == 10
    assert r["last_window"]["micro_batches"] == 2 and r["last_window"]["tokens_per_micro_batch"] == [5, 1]
    assert r["last_window"]["loss_accumulated"] == pytest.approx(sum(r["last_window"]["loss_sums"]) / 6, rel=1e-12)
    assert r["last_window"]["grad_max_abs_diff"] < 1e-5
    assert "last window of an epoch (2 micro-batches, 6 supervised)" in r["message"]
    full = check_windows(model, first)
    assert (
        full["passed"] and full["last_window"] is None and full["message"].endswith("every window of an epoch is full")
    )
