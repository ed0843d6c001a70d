"""Issue 15: length-grouped micro-batches (``training.length_grouping``) and padding-free packing
(``training.packing``, docs/CASES.md C23): the order keeps the DistributedSampler semantics per rank and
resumes exactly; packed rows give the per-token losses of each example alone, and a row whose
examples see each other fails the check."""

from __future__ import annotations

import contextlib

import pytest
import torch

from tiny_study import LoopRun
from tuneproof.data.preprocess import Encoded, collate, collate_packed, pack_rows, packed_padding
from tuneproof.study import Training
from tuneproof.training.data_order import (
    GROUP_MEGABATCH,
    epoch_micro_batches,
    epoch_order,
    micro_batch_at,
    micro_batches_per_epoch,
    padding_share,
    window_at,
)


def _enc(i: int, ids: list[int], supervised_from: int) -> Encoded:
    labels = [-100] * supervised_from + ids[supervised_from:]
    return Encoded(
        id=f"ex{i}",
        category=None,
        input_ids=ids,
        labels=labels,
        prompt_tokens=supervised_from,
        answer_tokens=len(ids) - supervised_from,
        full_length=len(ids),
        n_supervised=len(ids) - supervised_from,
        truncated=False,
        text="",
        boundary_char=0,
    )


def _dataset(n: int = 24, vocab: int = 64, seed: int = 0) -> list[Encoded]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = 4 + (i * 7) % 13  # 4..16 tokens
        ids = torch.randint(3, vocab, (length,), generator=g).tolist()
        out.append(_enc(i, ids, supervised_from=length // 2))
    return out


# ---------------------------------------------------------------- length-grouped order
def test_grouped_order_exact_values_and_padding():
    lengths = [5, 1, 5, 1, 5, 1, 5, 1]  # two lengths: grouped micro-batches of 2 hold equal lengths
    plain = epoch_micro_batches(8, 2, 0, 0)
    grouped = epoch_micro_batches(8, 2, 0, 0, lengths=lengths)
    assert plain == [[4, 0], [7, 3], [2, 5], [1, 6]]  # DistributedSampler(seed 0) order, cut in order
    assert grouped == [[4, 0], [2, 6], [5, 1], [7, 3]]
    assert all(len({lengths[i] for i in b}) == 1 for b in grouped)
    # two mixed micro-batches (5, 1): 24 real tokens in 2x5 + 2x1 + 2x5 + 2x5 = 32 positions; grouped: no padding
    assert padding_share(plain, lengths) == 0.25 and padding_share(grouped, lengths) == 0.0
    assert sorted(i for b in grouped for i in b) == list(range(8))


def test_grouped_order_keeps_sampler_shares_per_rank_and_changes_per_epoch():
    n, mb, world = 1000, 4, 3
    lengths = [(i * 37) % 101 + 1 for i in range(n)]
    for epoch in (0, 1):
        shares = []
        for rank in range(world):
            batches = epoch_micro_batches(n, mb, 5, epoch, world_size=world, rank=rank, lengths=lengths)
            assert len(batches) == micro_batches_per_epoch(n, mb, world) == 84  # ceil(334 / 4)
            assert (
                sorted(len(b) for b in batches)[0] == 2 and sum(len(b) < mb for b in batches) == 1
            )  # 334 = 83 x 4 + 2
            flat = [i for b in batches for i in b]
            assert sorted(flat) == sorted(
                epoch_order(n, world_size=world, rank=rank, seed=5, epoch=epoch)
            )  # same share
            shares.append(set(flat))
        assert shares[0].isdisjoint(shares[1]) and shares[1].isdisjoint(shares[2]) or n % world  # padded share repeats
        assert set().union(*shares) == set(range(n))
    e0 = epoch_micro_batches(n, mb, 5, 0, lengths=lengths)
    assert e0 != epoch_micro_batches(n, mb, 5, 1, lengths=lengths)
    assert e0 == epoch_micro_batches(n, mb, 5, 0, lengths=lengths)  # pure function: exact resume
    # inside a megabatch of 64 micro-batches the lengths are sorted: the spread inside a micro-batch is small
    plain = epoch_micro_batches(n, mb, 5, 0)
    assert padding_share(e0, lengths) < 0.05 < 0.3 < padding_share(plain, lengths)
    assert GROUP_MEGABATCH == 64


def test_window_and_micro_batch_positions_follow_the_grouped_order():
    n, mb, accum = 10, 2, 2
    lengths = [3, 9, 1, 7, 5, 2, 8, 4, 6, 10]
    e1 = epoch_micro_batches(n, mb, 3, 1, lengths=lengths)
    # 5 micro-batches per epoch in windows of 2 + 2 + 1: steps 0-2 are epoch 0, step 3 is epoch 1's first window
    assert window_at(n, mb, accum, 3, 3, lengths=lengths) == e1[0:2]
    assert window_at(n, mb, accum, 3, 5, lengths=lengths) == e1[4:5]  # the last window of an epoch holds what is left
    assert micro_batch_at(n, mb, 3, 7, lengths=lengths) == e1[2]  # global micro-batch 7 = epoch 1's third
    with pytest.raises(ValueError, match="lengths has 3 entries for 10 examples"):
        epoch_micro_batches(n, mb, 3, 0, lengths=[1, 2, 3])


# ---------------------------------------------------------------- packing layout
def test_pack_rows_and_collate_packed_exact_layout():
    assert pack_rows([5, 3, 4, 2], 8) == [[0, 1], [2, 3]]  # first-fit decreasing: 5 | 4 | 3 joins 5 | 2 joins 4
    batch = [_enc(0, [10, 11, 12], 1), _enc(1, [20, 21], 0), _enc(2, [30, 31, 32, 33], 2)]
    assert pack_rows([3, 2, 4], 6) == [[1, 2], [0]]  # 4 | 3 opens a row | 2 joins 4
    out = collate_packed(batch, pad_id=0, capacity=6)
    assert out["input_ids"].tolist() == [[20, 21, 30, 31, 32, 33], [10, 11, 12, 0, 0, 0]]
    assert out["position_ids"].tolist() == [[0, 1, 0, 1, 2, 3], [0, 1, 2, 0, 1, 2]]
    assert out["labels"].tolist() == [[-100, 21, -100, -100, 32, 33], [-100, 11, 12, -100, -100, -100]]
    assert out["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]]
    # the supervised tokens after the causal shift are those of the padded batch: 1 + 2 + 2 = 5
    ref = collate(batch, 0)["labels"]
    assert int((ref[:, 1:] != -100).sum()) == int((out["labels"][:, 1:] != -100).sum()) == 5
    assert packed_padding([3, 2, 4], 6) == (3, 12)


# ---------------------------------------------------------------- the packing check (docs/CASES.md C23)
@pytest.fixture()
def tiny_lm():
    from tinymodels import make_llama

    return make_llama(64)


def test_c23_packed_rows_equal_each_example_alone(tiny_lm):
    from tuneproof.training.packing import check_packing

    examples = _dataset(8)
    rep = check_packing(tiny_lm, examples, pad_id=2, capacity=32)
    assert rep["passed"] is True, rep["message"]
    assert (
        rep["examples"] == 8 and rep["rows"] == 3 and rep["tokens"] == 38
    )  # sum of L - L//2 over lengths 4, 11, 5, 12, 6, 13, 7, 14
    assert rep["max_abs_diff"] <= 1e-4
    assert rep["control_max_abs_diff"] > 1e-2  # the neighbour-visible row differs: the check can see contamination


def test_c23_a_row_where_an_example_sees_its_neighbour_fails(tiny_lm):
    from tuneproof.training.packing import check_packing, neighbour_visible_forward

    examples = _dataset(8)
    rep = check_packing(tiny_lm, examples, pad_id=2, capacity=32, forward=neighbour_visible_forward)
    assert rep["passed"] is False and rep["max_abs_diff"] > 1e-2
    assert "attend across examples" in rep["message"] and "training.packing off" in rep["message"]

    def with_cache(model, batch):  # a cache disables transformers' packed-sequence detection: plain causal row
        return model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=True).logits

    rep = check_packing(tiny_lm, examples, pad_id=2, capacity=32, forward=with_cache)
    assert rep["passed"] is False and rep["max_abs_diff"] > 1e-2


# ---------------------------------------------------------------- the training loop
def _train_stop(examples, tmp, stop_after):
    return _train(0, examples, tmp, length_grouping=True, stop_after=stop_after)


def _train(model_seed: int, examples, tmp=None, resume=None, stop_after=None, **over):
    from peft import LoraConfig, get_peft_model

    from tinymodels import make_llama
    from tuneproof.training.loop import train

    model = get_peft_model(
        make_llama(64, seed=model_seed),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0),
    )
    cfg = Training(
        micro_batch_size=4, gradient_accumulation_steps=2, epochs=2, learning_rate=1e-2, max_length=32, **over
    )

    run = LoopRun(tmp) if tmp is not None else None
    out = train(
        model,
        examples,
        cfg,
        pad_id=2,
        device=torch.device("cpu"),
        autocast=contextlib.nullcontext,
        run=run,
        resume=resume,
        stop_after=stop_after,
    )
    return out, model, run, cfg


def test_packing_gives_the_losses_of_the_padded_run(tmp_path):
    examples = _dataset(24)
    ref, _, _, _ = _train(0, examples)
    got, _, run, _ = _train(0, examples, tmp_path, packing=True)
    assert len(ref["losses"]) == len(got["losses"]) == 6  # 6 micro-batches / 2 per step, 2 epochs
    assert got["losses"] == pytest.approx(ref["losses"], abs=2e-5)
    assert got["tokens"] == ref["tokens"] == 2 * 234  # real tokens only, padding not counted
    used = run.summary["speedups"]["packing"]  # the run records the speed-up and its proof
    assert used["examples"] == 4 and used["max_abs_diff"] <= 1e-4 < used["control_max_abs_diff"]
    pad = run.summary["padding"]
    assert pad["layout"] == "packing" and pad["tokens"] == 234 and pad["after"] < pad["before"]


def test_the_packing_check_runs_the_loops_own_micro_batch_function_and_a_changed_mask_fails_it(tmp_path, monkeypatch):
    from tuneproof.errors import CheckFailed
    from tuneproof.training import micro_batch

    examples = _dataset(24)
    seen, real_logits = [], micro_batch.logits

    def spy(model, batch, *a, **kw):
        seen.append(("position_ids" in batch, model.training))
        return real_logits(model, batch, *a, **kw)

    monkeypatch.setattr(micro_batch, "logits", spy)
    _train(0, examples, tmp_path, packing=True)
    # the check (eval mode: 4 examples alone, their packed rows), then training (12 packed micro-batches): one function
    assert seen == [(False, False)] * 4 + [(True, False)] + [(True, True)] * 12
    monkeypatch.setattr(micro_batch, "logits", real_logits)

    real_inputs = micro_batch.model_inputs

    def planted(batch):  # the loop passes a plain causal mask over each packed row: examples see their neighbours
        inputs = real_inputs(batch)
        if "position_ids" in batch:
            inputs["attention_mask"] = torch.ones_like(batch["input_ids"])
        return inputs

    monkeypatch.setattr(micro_batch, "model_inputs", planted)
    with pytest.raises(CheckFailed, match="training.packing: packed rows differ from the examples run alone"):
        _train(0, examples, tmp_path / "planted", packing=True)
    from tinymodels import make_llama
    from tuneproof.training.packing import check_packing

    rep = check_packing(make_llama(64), examples[:8], pad_id=2, capacity=32)  # what the preflight's check calls
    assert rep["passed"] is False and rep["max_abs_diff"] > 1e-2


def test_length_grouping_trains_on_the_grouped_order_and_resumes_exactly(tmp_path):
    from tuneproof.training.resume_state import latest_checkpoint, load_checkpoint

    examples = _dataset(24)
    full, model_full, run, cfg = _train(0, examples, tmp_path / "full", length_grouping=True)
    grouped = run.summary["speedups"]["length_grouping"]
    assert (grouped["padding_before"], grouped["padding_after"]) == (
        run.summary["padding"]["before"],
        run.summary["padding"]["after"],
    )
    assert grouped["loss_rel_diff"] < 1e-5 and grouped["grad_max_rel_diff"] < 1e-4  # its check ran before the loop
    assert run.summary["padding"]["after"] < run.summary["padding"]["before"]
    plain, _, _, _ = _train(0, examples)
    assert full["losses"] != plain["losses"]  # another order of the same examples
    assert full["tokens"] == plain["tokens"]
    # interrupted after step 2 and resumed: the same losses, bit for bit, and the same adapter
    with pytest.raises(KeyboardInterrupt):
        _train_stop(examples, tmp_path / "cut", stop_after=2)
    ckpt = load_checkpoint(latest_checkpoint(tmp_path / "cut"))
    assert ckpt["step"] == 2 and "length-grouped" in ckpt["data"]["order"]
    resumed, model_res, _, _ = _train(0, examples, tmp_path / "cut", length_grouping=True, resume=ckpt)
    assert resumed["losses"] == full["losses"]
    for (name, a), (_, b) in zip(model_full.named_parameters(), model_res.named_parameters()):
        assert torch.equal(a, b), name
    with pytest.raises(Exception, match="data order"):  # a grouped checkpoint does not resume an ungrouped run
        _train(0, examples, tmp_path / "cut", resume=ckpt)


def test_padding_report_before_and_after_exact():
    from tuneproof.training.speedups import padding_report

    examples = _dataset(24)
    lengths = [len(e.input_ids) for e in examples]
    assert sum(lengths) == 234  # 4 + (7i mod 13): 130 for i < 13, 104 for the 11 after
    plain = Training(micro_batch_size=4, max_length=32)
    rep = padding_report(examples, plain)
    assert rep["layout"] == "padded" and rep["before"] == rep["after"]
    positions = sum(len(b) * max(lengths[i] for i in b) for b in epoch_micro_batches(24, 4, 0, 0))
    assert rep["positions_before"] == positions and rep["before"] == round(1 - 234 / positions, 6)
    grouped = padding_report(examples, plain.model_copy(update={"length_grouping": True}))
    assert grouped["after"] < grouped["before"] and grouped["layout"] == "length_grouping"
    assert grouped["positions_after"] == sum(
        len(b) * max(lengths[i] for i in b) for b in epoch_micro_batches(24, 4, 0, 0, lengths=lengths)
    )
    packed = padding_report(examples, plain.model_copy(update={"packing": True}))
    assert packed["after"] < grouped["before"] and packed["layout"] == "packing"


def test_c23_two_examples_in_one_row_and_positions_not_reset(tiny_lm):
    """docs/CASES.md C23 as written: two examples in one row equal each alone; the same row with positions
    not reset (0..W-1: the mask builder then sees one sequence, the second attends to the first) fails."""
    from tuneproof.training.packing import check_packing

    two = _dataset(2)  # lengths 4 and 11: one row of 15 at capacity 32
    rep = check_packing(tiny_lm, two, pad_id=2, capacity=32)
    assert rep["passed"] is True and rep["rows"] == 1 and rep["tokens"] == 2 + 6 and rep["max_abs_diff"] <= 1e-4

    def not_reset(model, batch):
        pos = torch.arange(batch["input_ids"].shape[1]).expand_as(batch["input_ids"])
        return model(input_ids=batch["input_ids"], position_ids=pos, use_cache=False).logits

    bad = check_packing(tiny_lm, two, pad_id=2, capacity=32, forward=not_reset)
    assert bad["passed"] is False and bad["max_abs_diff"] > 1e-2 and bad["worst_example"] == "ex1"  # the second one


def test_packing_rows_default_to_one_per_micro_batch_and_short_rows_add_padding():
    """Rows of max_length hold one example each when every example is longer than half of it: the
    rows are padded to the longest and packing adds padding (SNIPS at max_length 144: 20.6 % -> 26.3 %).
    The default row capacity, micro_batch_size x max_length, leaves no padding at all."""
    from tuneproof.training.speedups import packing_capacity, padding_report

    lengths = [20, 20, 24, 22, 21, 23, 18, 19]  # one micro-batch of 8, 167 tokens, padded to 8 x 24 = 192 positions
    examples = [_enc(i, list(range(3, 3 + n)), supervised_from=n - 2) for i, n in enumerate(lengths)]
    cfg = Training(micro_batch_size=8, max_length=40, packing=True)
    assert packing_capacity(cfg) == 320
    default = padding_report(examples, cfg)
    assert (
        default["positions_before"] == 192
        and default["after"] == 0.0
        and default["positions_after"] == default["tokens"] == 167
    )
    # rows of 40: 24 | 23 | 22+18 | 21+19 | 20+20, each padded to 40 -> 200 positions, more than unpacked
    short = padding_report(examples, cfg.model_copy(update={"packing_length": 40}))
    assert short["positions_after"] == 200 and short["after"] == round(1 - 167 / 200, 6) > short["before"]


def test_packing_with_chunked_loss_gives_the_losses_of_the_padded_run(tmp_path):
    examples = _dataset(24)
    ref, _, _, _ = _train(0, examples)
    got, _, run, _ = _train(0, examples, tmp_path, packing=True, chunked_loss=True)
    assert got["losses"] == pytest.approx(ref["losses"], abs=2e-5)
    used = run.summary["speedups"]
    assert set(used) == {"packing", "chunked_loss"}
    assert used["chunked_loss"]["loss_rel_diff"] <= 1e-5 and used["chunked_loss"]["grad_max_rel_diff"] <= 1e-4


def test_packing_length_below_max_length_or_without_packing_is_refused_naming_the_keys(tiny_base):
    """A row of training.packing_length 16 held none of 35-38-token examples (max_length 64): each was
    its own row, nothing was packed, and the run still recorded packing as used; refused in the study file."""
    from tiny_study import study_config
    from tuneproof.context import parse_study
    from tuneproof.errors import TuneproofError

    raw = study_config(tiny_base)
    raw["training"].update(max_length=64, micro_batch_size=4, packing=True, packing_length=16)
    with pytest.raises(TuneproofError) as e:
        parse_study(raw, "s/tuneproof.yaml")
    assert str(e.value).splitlines()[0] == (
        "s/tuneproof.yaml: training: training.packing_length 16 is below "
        "training.max_length 64: a packed row must hold an "
        "example of max_length tokens; set it to at least 64 (unset: "
        "micro_batch_size x max_length = 256, one row per micro-batch)"
    )
    raw["training"].update(packing=False, packing_length=128)
    with pytest.raises(TuneproofError, match=r"training.packing_length \(128\) applies to training.packing: true"):
        parse_study(raw, "s/tuneproof.yaml")
    raw["training"].update(packing=True, packing_length=64)
    assert parse_study(raw, "s/tuneproof.yaml").training.packing_length == 64
    raw["training"].update(packing=False, packing_length=None)  # a resolved config of a run without packing
    assert parse_study(raw, "s/tuneproof.yaml").training.packing_length is None
