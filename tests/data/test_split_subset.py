"""``data.split.max_examples`` draws what it says (docs/PROTOCOL.md step 3): stratified by default (a class
that is 60% of a split stays 60% of its subset; before, a round robin made it 25%), class-balanced under
``subset: balanced`` (the extraction template's 200 per intent), and ``splits.json`` records which."""

from __future__ import annotations

import json
from collections import Counter

import yaml

from tuneproof.data.examples import Example
from tuneproof.data.split import (
    balanced_take,
    build_splits,
    freeze_or_reuse,
    stratified_quotas,
    stratified_take,
    subset_line,
)
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
