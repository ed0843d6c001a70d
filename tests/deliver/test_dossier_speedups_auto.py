"""What ``training.speedups: auto`` used and why each other speed-up stayed off, in the dossier: the
preflight's quantities table dropped every text of 200 characters or more, so the length-grouping
reason (the one a reader needs: auto never turns it on) was missing while its ``used false`` row stayed."""

from __future__ import annotations

from types import SimpleNamespace

from tuneproof.deliver.dossier import preflight_tables, speedups_auto_rows
from tuneproof.deliver.dossier.preflight import _preflight
from tuneproof.deliver.dossier.training import _training
from tuneproof.modalities.text import TEXT

GROUPING_WHY = (
    "would lower the padding 14.8% -> 2.1% but changes which examples share an optimizer step (another "
    "trajectory, as another seed; docs/speedups.md): auto uses only what leaves each step unchanged; list "
    "length_grouping in training.speedups to accept that"
)
AUTO = {
    "used": ["chunked_loss"],
    "decisions": {
        "packing": {"used": False, "reason": "pays only with varlen (flash) attention on a GPU"},
        "length_grouping": {"used": False, "reason": GROUPING_WHY},
        "chunked_loss": {"used": True, "reason": "check passed (loss rel. diff 0.0e+00, gradients 0.0e+00)"},
    },
}
ROWS = [
    ["packing", "off", "pays only with varlen (flash) attention on a GPU"],
    ["length_grouping", "off", GROUPING_WHY],
    ["chunked_loss", "used", "check passed (loss rel. diff 0.0e+00, gradients 0.0e+00)"],
]


def test_each_speedup_is_one_row_with_its_whole_reason():
    assert len(GROUPING_WHY) >= 200
    assert speedups_auto_rows(AUTO) == ROWS
    assert speedups_auto_rows(None) == [] and speedups_auto_rows({"used": []}) == []


def test_preflight_section_has_the_auto_table_and_no_split_rows():
    run = SimpleNamespace(id="r0003", status="completed", reason=None, summary={"speedups_auto": AUTO})
    ev = SimpleNamespace(latest=lambda kind, any_status=False: run)
    blocks = _preflight(ev, plots=False, modality=TEXT)
    assert {"type": "p", "text": "r0003: training.speedups auto, each speed-up used or left off and why:"} in blocks
    table = next(b for b in blocks if b.get("cols") == ["speed-up", "auto", "why"])
    assert table["rows"] == ROWS
    _, quantities = preflight_tables({"speedups_auto": AUTO})
    assert [q for q in quantities if "speedups auto" in q[0]] == []


def test_training_section_has_each_train_runs_own_resolution():
    runs = [
        SimpleNamespace(id="r0004", kind="train", status="completed", summary={"steps": 3, "speedups_auto": AUTO}),
        SimpleNamespace(id="r0005", kind="train", status="completed", summary={"steps": 3}),
    ]
    ev = SimpleNamespace(runs=runs, rows=lambda run_id, name: [])
    blocks = _training(ev, plots=False, modality=TEXT)
    assert blocks[1] == {"type": "p", "text": "r0004: training.speedups auto, each speed-up used or left off and why:"}
    assert blocks[2]["rows"] == ROWS
    assert not any("r0005: training.speedups auto" in str(b.get("text")) for b in blocks)
