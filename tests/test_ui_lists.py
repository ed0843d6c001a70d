"""Lists on screens and in the dossier are capped: 10 items, then "and N more" (tuneproof.ui)."""

from __future__ import annotations

from tuneproof.ui import LIST_CAP, capped, capped_items


def test_a_long_list_names_ten_then_says_how_many_more():
    names = [f"class_{i:02d}" for i in range(77)]
    assert LIST_CAP == 10
    assert capped_items(names) == names[:10] + ["and 67 more"]
    assert capped(names, where="compare.json") == ", ".join(names[:10]) + " and 67 more (in compare.json)"
    assert capped(names, cap=2, sep="; ") == "class_00; class_01 and 75 more"


def test_a_short_list_is_unchanged():
    assert capped([]) == "" and capped_items([]) == []
    assert capped(["a", 2, None]) == "a, 2, None"
    assert capped_items(list("abcdefghij")) == list("abcdefghij")  # exactly 10: no "and 0 more"
