"""``data.split.max_examples`` draws what it says (docs/PROTOCOL.md step 3): stratified by default (a class
that is 60% of a split stays 60% of its subset; before, a round robin made it 25%), class-balanced under
``subset: balanced`` (the extraction template's 200 per intent), and ``splits.json`` records which."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import yaml

from tuneproof.data.examples import Example
from tuneproof.data.split import (
    balanced_take,
    build_splits,
    freeze_or_reuse,
    split_settings,
    stratified_quotas,
    stratified_take,
    subset_line,
)
from tuneproof.errors import TuneproofError
from tuneproof.recipes.init import template_text
from tuneproof.study import SplitPolicy

SHARES = {"a": 60, "b": 30, "c": 6, "d": 4}


def _examples(split="validation"):
    return [
        Example(id=f"{split}-{lab}{i:03d}", text=f"{lab} {split} text {i}", label=lab, split=split)
        for lab, n in SHARES.items()
        for i in range(n)
    ]


def test_stratified_keeps_each_class_share_and_balanced_does_not():
    ex = _examples()
    strat = Counter(e.label for e in stratified_take(ex, 20, seed=13))
    assert strat == {"a": 12, "b": 6, "c": 1, "d": 1}  # 60% -> 12 of 20; d (0.8 of an example) keeps one
    bal = Counter(e.label for e in balanced_take(ex, 20, seed=13))
    assert bal == {"a": 6, "b": 5, "c": 5, "d": 4}  # d has only 4: the round robin gives its turn to a
    assert stratified_take(ex, 20, seed=13) == stratified_take(ex, 20, seed=13)  # seeded: the same subset
    assert stratified_quotas([5, 5, 5], 2) == [1, 1, 0]  # fewer than one per class: largest remainders, in order
    assert stratified_quotas([97, 1, 1, 1], 4) == [1, 1, 1, 1]  # one per class first, taken back from the largest
    assert stratified_quotas([3, 1], 10) == [3, 1]


def test_the_manifest_records_the_draw_and_the_data_check_states_it(tmp_path):
    ex = _examples("train") + _examples()
    for rule, want in (
        ("stratified", {"a": 12, "b": 6, "c": 1, "d": 1}),
        ("balanced", {"a": 6, "b": 5, "c": 5, "d": 4}),
    ):
        policy = SplitPolicy(max_examples={"validation": 20}, subset=rule)
        info: dict = {}
        folder = tmp_path / rule
        folder.mkdir()
        splits, created = freeze_or_reuse(
            folder,
            lambda policy=policy, info=info: build_splits(ex, policy, "test", None, info),
            ex,
            subset=lambda info=info: info.get("subset"),
        )
        assert created and Counter(e.label for e in splits["validation"]) == want
        manifest = json.loads((folder / "splits.json").read_text())
        assert manifest["subset"]["rule"] == rule and manifest["subset"]["max_examples"] == {"validation": 20}
        assert subset_line(manifest, policy).startswith(
            f"split caps (data.split.max_examples): validation 20, drawn {rule}"
        )
    # a manifest written before the rule was recorded: drawn class-balanced, and the study's rule now differs
    del manifest["subset"]
    assert subset_line(manifest, SplitPolicy(max_examples={"validation": 20})) == (
        "split caps (data.split.max_examples): validation 20, drawn balanced: the same number of examples per "
        "class (round robin), class shares not kept (splits.json was written before the rule was recorded); "
        "data.split.subset is now stratified: the frozen splits.json keeps its draw"
    )
    assert subset_line({"splits": {}}, SplitPolicy()) is None


def test_the_quickstart_template_keeps_its_balanced_draw():
    """The quickstart's numbers rest on 200 and 20 examples per intent: its template says `balanced`."""
    split = yaml.safe_load(template_text("extraction"))["data"]["split"]
    assert split["subset"] == "balanced" and split["max_examples"] == {"train": 1400, "test": 140}


def _freeze(folder, ex, policy, runs):
    info: dict = {}
    splits, created = freeze_or_reuse(
        folder,
        lambda: build_splits(ex, policy, "test", None, info),
        ex,
        subset=lambda: info.get("subset"),
        info=info,
        settings=split_settings(policy, "test"),
        runs_using=lambda: list(runs),
    )
    return splits, created, info


def test_changed_split_settings_cut_again_before_any_run_and_are_refused_after(tmp_path):
    ex = _examples("train") + _examples()
    runs: list[str] = []  # what the registry says used the manifest
    splits, created, _ = _freeze(tmp_path, ex, SplitPolicy(max_examples={"validation": 20}), runs)
    assert created and len(splits["validation"]) == 20
    assert json.loads((tmp_path / "splits.json").read_text())["settings"]["data.split.max_examples"] == {
        "validation": 20
    }
    # a data check (passed or failed) wrote it; no run used it: the new cap re-splits, saying why
    splits, created, info = _freeze(tmp_path, ex, SplitPolicy(max_examples={"validation": 50}), runs)
    assert created and len(splits["validation"]) == 50
    assert info["resplit"] == ["data.split.max_examples: {'validation': 20} -> {'validation': 50}"]
    manifest = json.loads((tmp_path / "splits.json").read_text())
    assert manifest["subset"]["max_examples"] == {"validation": 50} and len(manifest["splits"]["validation"]) == 50
    # the same settings again: reused as frozen
    splits, created, info = _freeze(tmp_path, ex, SplitPolicy(max_examples={"validation": 50}), runs)
    assert not created and len(splits["validation"]) == 50 and "resplit" not in info
    # a run used it: a changed setting is refused, naming the file, the setting and the run
    runs.append("r0002")
    with pytest.raises(TuneproofError) as err:
        _freeze(tmp_path, ex, SplitPolicy(max_examples={"validation": 50}, seed=7), runs)
    assert str(tmp_path / "splits.json") in err.value.message
    assert "data.split.seed: 13 -> 7" in err.value.message and "r0002" in err.value.message
    assert len(json.loads((tmp_path / "splits.json").read_text())["splits"]["validation"]) == 50  # untouched


def test_a_manifest_from_before_settings_were_recorded_is_compared_on_its_caps(tmp_path):
    ex = _examples("train") + _examples()
    _freeze(tmp_path, ex, SplitPolicy(max_examples={"validation": 20}), [])
    path = tmp_path / "splits.json"
    old = json.loads(path.read_text())
    del old["settings"]
    path.write_text(json.dumps(old))
    with pytest.raises(TuneproofError, match=r"data.split.max_examples: \{'validation': 20\} -> \{\}"):
        _freeze(tmp_path, ex, SplitPolicy(), ["r0001"])
    splits, created, info = _freeze(tmp_path, ex, SplitPolicy(), [])
    assert created and len(splits["validation"]) == 100


def test_data_that_lost_ids_is_split_again_when_no_run_used_the_manifest(tmp_path):
    ex = _examples("train") + _examples()
    _freeze(tmp_path, ex, SplitPolicy(), [])
    fewer = [e for e in ex if e.id != "validation-a000"]
    splits, created, info = _freeze(tmp_path, fewer, SplitPolicy(), [])
    assert created and len(splits["validation"]) == 99
    assert info["resplit"] == ["1 example ids it names are not in the data any more"]
    with pytest.raises(TuneproofError, match="example ids of split 'train' are not in the data any more"):
        _freeze(tmp_path, [e for e in fewer if e.id != "train-a000"], SplitPolicy(), ["r0001"])


def test_the_balanced_eval_subset_counts_each_class_of_a_list_label():
    # drawn per distinct list ('["a", "b"]', '["a"]', '["b"]', '["c"]' in sorted order), 3 examples never hold 'c'
    ex = [Example(id="ab", text="t ab", label='["a", "b"]', split="validation")]
    for lab in "abc":
        ex += [
            Example(id=f"{lab}{i:02d}", text=f"t {lab} {i}", label=f'["{lab}"]', split="validation") for i in range(10)
        ]
    picked = balanced_take(ex, 3, seed=13)
    held = Counter(c for e in picked for c in json.loads(e.label))
    assert len(picked) == 3 and set(held) == {"a", "b", "c"}  # each draw goes to the class held least so far
    many = Counter(c for e in balanced_take(ex, 15, seed=13) for c in json.loads(e.label))
    assert max(many.values()) - min(many.values()) <= 1
    assert balanced_take(ex, 3, seed=13) == picked  # seeded
    # single labels draw exactly as before
    assert Counter(e.label for e in balanced_take(_examples(), 20, seed=13)) == {"a": 6, "b": 5, "c": 5, "d": 4}
