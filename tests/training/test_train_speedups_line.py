"""``tuneproof train`` says on the terminal which speed-ups it used and, under auto, which it left off:
that was only in runs/ID/log.txt and the summary, so a user of ``speedups: auto`` did not see that
length grouping stayed off."""

from __future__ import annotations

from tuneproof.recipes.train import speedups_line

AUTO = {
    "used": ["chunked_loss"],
    "decisions": {
        "packing": {"used": False, "reason": "pays only with varlen attention"},
        "length_grouping": {"used": False, "reason": "changes which examples share an optimizer step"},
        "chunked_loss": {"used": True, "reason": "check passed"},
    },
}


def test_auto_names_what_it_used_and_left_off():
    assert speedups_line("r0004", {"speedups": {"chunked_loss": {}}, "speedups_auto": AUTO}) == (
        "speed-ups (training.speedups auto): used chunked_loss; off: packing, length_grouping "
        "(why each: runs/r0004/summary.json speedups_auto, the dossier)"
    )


def test_a_list_names_the_checked_ones_and_none_says_nothing():
    summary = {"speedups": {"length_grouping": {}, "chunked_loss": {}}}
    assert speedups_line("r0002", summary) == (
        "speed-ups: length_grouping, chunked_loss, each checked before the loop (runs/r0002/summary.json speedups)"
    )
    assert speedups_line("r0002", {"steps": 3}) is None
