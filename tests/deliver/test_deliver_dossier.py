"""The dossier: every section from the recorded evidence, failed and invalid runs with their
reasons, "not run yet" for missing parts, one self-contained HTML page with the plots and every
user text escaped."""

from __future__ import annotations

import base64
import re

from deliver_tiny import HOSTILE, NEG
from tuneproof.context import StudyContext
from tuneproof.recipes.report import build_markdown

SECTIONS = [
    "Summary",
    "Hypothesis and guards",
    "Baseline",
    "Runs (all of them)",
    "Variants (lineage)",
    "Data check",
    "Preflight",
    "Training",
    "Comparisons with the baseline",
    "Test split access log",
    "Verdict",
    "Limits observed",
    "Exports",
    "Rental plan",
    "Rental",
    "Environment",
]


def test_parts_not_run_say_so(cls_bundle):
    md = build_markdown(StudyContext.open(cls_bundle["dir"]))
    assert [line[3:] for line in md.splitlines() if line.startswith("## ")] == SECTIONS
    assert (
        "## Data check\n\nr0001: completed; passed: true; hard faults: 0" in md
    )  # run inline by the baseline (protocol order)
    assert "## Preflight\n\nnot run yet (`tuneproof preflight`)" in md
    assert "## Rental plan\n\nnot run yet (`tuneproof plan --days 7 --hourly-rate 2.5`)" in md
    assert "## Rental\n\nnot run yet (`tuneproof rental start --days 7`)" in md
    assert "the reserved test split has not been read." in md
    assert "no variants yet: 1 train run(s)" in md
    assert "every run completed." in md


def test_markdown_holds_every_run_and_the_evidence(dossier_study):
    md, v, t = dossier_study["md"], dossier_study["variant"], dossier_study["train"]
    assert [line[3:] for line in md.splitlines() if line.startswith("## ")] == SECTIONS
    assert "not run yet" not in md.split("## Exports")[0]  # every part before exports was run
    assert f"{dossier_study['failed']} (train) failed: RuntimeError: CUDA out of memory while allocating 2.00 GiB" in md
    assert f"{v} (train) invalid: evaluated on the wrong split (was completed)" in md
    assert f"`- {v} [invalid] method.r: 4 -> 8" in md  # lineage with the change the variant made
    assert "| train | 5.000 | 7.000 | 8 | 0.000 |" in md and "suggested max_length: 8 (configured: 16)" in md
    assert (
        "| update check | true | 4 of 4 LoRA tensors changed |" in md  # the number that matters
        and "| time per optimizer step | 0.500 | s |" in md
    )
    assert (
        "| 37 | 1.50 | 1.25 | 0.50 | 0.40 | 0.49 | 0.98 |" in md
    )  # step memory: estimate next to measured, GiB, and their ratio
    # docs/CASES.md C8: the estimate itemised (MiB) next to the measured step
    assert (
        "| activations: MLP gate, silu, up (3i per block) | 120.500 |" in md
        and "| measured / estimate (the step's tensors / the step's part) | 0.980 |" in md
    )
    assert "micro-batch 4" in md.split("## Preflight")[1].split("## Training")[0]
    assert "| measured peak memory | 2.98 | GiB |" in md and "| training throughput | 1200.0 | tokens/s |" in md
    assert "L37_" not in md.split("## Preflight")[1].split("## Training")[0]  # no raw keys
    assert "| train/test | across splits | 6 | 1 (16.7%) | 1 (16.7%) | 2 (33.3%) (Jaccard >= 0.8) |" in md
    assert "| train/train | inside the split | 32 | 0 (0.0%) | 0 (0.0%) | 0 (0.0%) (Jaccard >= 0.8) |" in md
    assert md.index("| train/test |") < md.index("| train/train |")  # cross-split first
    assert "| exact | train:c001 | test:c201 | 1.000 | good film |" in md
    assert "the test split was read 2 times" in md and f"| {t} |" in md
    assert "| experiment |" in md and "variants of the configured budget that fit:" in md
    assert re.search(r"\| accuracy \| 0\.\d{3} \| 0\.\d{3} \| -?0\.\d{3} \| \[-?\d\.\d{3}, -?\d\.\d{3}\] \|", md)
    assert (
        NEG not in md and "| \\<i>neg\\</i>& | 0.833 | 0.333 | -0.500 |" in md
    )  # a '<' that could open a tag is escaped
    assert "typical failure:" in md and "## Verdict\n\n**" in md
    assert "exports/" + t in md and "| libraries.torch |" in md


def test_a_text_dossier_keeps_the_text_sections(dossier_study):
    """The sections the text modality declares (``Modality.dossier_sections``): token lengths,
    suggested max_length, the rate in tokens/s, the loop's loss normalisation (an image dossier
    has none of them: tests/images/test_image_protocol.py)."""
    md = dossier_study["md"]
    training = md.split("## Training")[1].split("## ")[0]
    assert "| split | p50 tokens | p95 tokens | max tokens | share truncated |" in md
    assert "suggested max_length: 8" in md
    assert "| tokens/s |" in training and "loss normalisation: " in training


def test_html_is_self_contained_escaped_and_has_the_plots(dossier_study):
    page = dossier_study["html"]
    assert "<script" not in page.lower() and "http://" not in page and "https://" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; &lt;b&gt;bold&lt;/b&gt;" in page
    assert HOSTILE not in page and NEG not in page and "&lt;i&gt;neg&lt;/i&gt;&amp;" in page
    imgs = re.findall(r'<img alt="([^"]*)" src="data:image/png;base64,([A-Za-z0-9+/=]+)">', page)
    assert len(imgs) == page.count("<img") == 6
    for _, data in imgs:
        assert base64.b64decode(data)[:8] == b"\x89PNG\r\n\x1a\n"
    alts = " | ".join(a for a, _ in imgs)
    for what in (
        "training loss curves",
        "per-class recall",
        "confusion matrix of the baseline",
        "confusion matrix of the candidate",
        "token lengths per split",
        "step memory and throughput",
    ):
        assert what in alts


def test_first_screen_stands_alone(dossier_study):
    import json

    md, t = dossier_study["md"], dossier_study["train"]
    first = md.split("## Summary")[1].split("## Hypothesis and guards")[0]
    runs = dossier_study["dir"] / "runs"
    compare = sorted(p for p in runs.iterdir() if (p / "compare.json").exists())[-1]
    data = json.loads((compare / "compare.json").read_text())
    cand = next(iter(data["candidates"].values()))
    succ = next(v for v in cand["verdicts"] if v["kind"] == "success")
    assert first.lstrip().startswith(f"**verdict (frozen hypothesis): {data['verdict'].upper()} (")
    lo, hi = succ["ci"]
    assert (
        f"| success: macro_f1 gain >= 0 | {succ['verdict']} | {succ['base']:.3f} | "
        f"{succ['cand']:.3f} | {succ['delta']:.3f} [{lo:.3f}, {hi:.3f}] |" in first
    )
    assert (
        f"- the candidate changed against the baseline: {t} trained lora r 4, "
        "alpha 8.0 on query, value (also trains classifier); "
        "12 optimizer steps of 8 x 1 examples, learning rate 0.05; final loss "
    ) in first
    assert (
        f"- did not complete: {dossier_study['failed']} (train) failed: "
        "RuntimeError: CUDA out of memory while allocating 2.00 GiB" in first
    )
    assert (
        f"- did not complete: {dossier_study['variant']} (train) invalid: evaluated on the wrong split (was completed)"
        in first
    )
    limits = first.split("limits observed of ")[1].split("\n\n")[1].splitlines()
    assert 1 <= len(limits) <= 5 and limits[0].startswith("- regressed: ")  # at most 5, one line each
    assert all(len(line) < 200 for line in limits)
    assert "- test split: read 2 time(s) (" in first and "wears out its value as a control" in first
    assert "details: [Hypothesis and guards](#hypothesis) · [Baseline](#baseline)" in first
    assert '<a id="data-check"></a>\n\n## Data check' in md
    page = dossier_study["html"]
    assert page.index('<section id="summary">') < page.index("<nav>details: ") < page.index('<section id="hypothesis">')


def test_many_classes_changed_first_rest_folded_and_top_confusions():
    from tuneproof.deliver.dossier import per_class_blocks, top_confusions
    from tuneproof.deliver.dossier.render import _md_blocks

    pc = {
        f"c{i:02d}": {"recall": {"base": 0.5, "cand": 0.5 + d, "delta": d, "ci": [d - 0.1, d + 0.1], "support": 10}}
        for i, d in enumerate([0.0] * 70 + [-0.3, 0.2, -0.1, 0.4, 0.1, 0.0, 0.0])
    }
    blocks = per_class_blocks(pc, "recall", failing={"c75"})
    assert blocks[0]["text"] == (
        "6 of 77 classes changed or fail a guard, sorted by delta (most negative first); "
        "the 71 unchanged are folded below."
    )
    assert [r[0] for r in blocks[1]["rows"]] == ["c70", "c72", "c75", "c74", "c71", "c73"]
    assert blocks[1]["rows"][2][-1] == "fails a guard"
    assert (
        blocks[2]["type"] == "details"
        and blocks[2]["summary"] == "71 unchanged classes"
        and len(blocks[2]["blocks"][0]["rows"]) == 71
    )
    md = "\n".join(_md_blocks(blocks))
    assert "<details><summary>71 unchanged classes</summary>" in md and md.rstrip().endswith("</details>")
    small = per_class_blocks({k: pc[k] for k in ("c00", "c70")}, "recall", set())
    assert len(small) == 1 and [r[0] for r in small[0]["rows"]] == ["c70", "c00"]  # few classes: one table
    conf = {
        "labels": ["a", "b", "c"],
        "columns": ["a", "b", "c", "<invalid>"],
        "matrix": [[5, 3, 0, 1], [4, 2, 4, 0], [0, 0, 9, 0]],
    }
    assert top_confusions(conf, 3) == [("b", "a", 4, 10), ("b", "c", 4, 10), ("a", "b", 3, 9)]


def test_hypothesis_section_states_each_guard_rule_as_written():
    """A floor-only guard read 'per_class_recall must not get worse (floor 0.0)': it has no drop rule
    (only the conditions written apply), so the dossier says what each guard does hold."""
    from tuneproof.deliver.dossier.hypothesis import _hypothesis_items

    h = {
        "behaviour": "b",
        "task": "classification",
        "success": {"metric": "accuracy", "min_gain": 0.05},
        "guards": [
            {"metric": "per_class_recall", "floor": 0.0, "max_drop": None},
            {"metric": "macro_f1", "max_drop": 0.02, "floor": None},
            {"metric": "per_class_recall", "max_drop": 0.1, "floor": 0.5, "classes": ["bug", "feature"]},
        ],
    }
    items = _hypothesis_items(h)
    assert items[3:6] == [
        "guard: per_class_recall must stay at or above 0.0",
        "guard: macro_f1 must not drop by more than 0.02 vs the baseline",
        "guard: per_class_recall for bug, feature must not drop by more than "
        "0.1 vs the baseline and must stay at or above 0.5",
    ]


def test_training_table_names_the_speedups_each_run_used():
    """The dossier's training table said nothing of training.packing / chunked_loss / length_grouping /
    bf16_base_weights: a reader could not tell how the candidate was trained."""
    from types import SimpleNamespace

    from tuneproof.deliver.dossier.training import _training
    from tuneproof.modalities.text import TEXT

    runs = [
        SimpleNamespace(
            id="r0004",
            kind="train",
            status="completed",
            summary={
                "steps": 4,
                "speedups": {"chunked_loss": {}, "packing": {}, "length_grouping": {}},
                "padding": {"before": 0.040026, "after": 0.0},
            },
        ),
        SimpleNamespace(
            id="r0005",
            kind="train",
            status="completed",
            summary={"steps": 3, "padding": {"before": 0.04, "after": 0.04}},
        ),
        SimpleNamespace(id="r0006", kind="train", status="interrupted", summary={}),
    ]
    ev = SimpleNamespace(runs=runs, rows=lambda run_id, name: [])
    table = _training(ev, plots=False, modality=TEXT)[0]
    assert table["cols"][-1] == "speed-ups"
    assert [r[-1] for r in table["rows"]] == [
        "chunked_loss, packing, length_grouping (padding 4.0% -> 0.0%)",
        "none",
        "-",
    ]


def test_first_screen_says_a_one_class_collapse(dossier_study, tmp_path):
    """A candidate that predicts one class for every example is said on the first screen, as on the
    compare screen (the verdict alone would not show it)."""
    import json
    import shutil

    d = tmp_path / "study"
    shutil.copytree(dossier_study["dir"], d, ignore=shutil.ignore_patterns("exports", "*.safetensors", "*.bin"))
    path = sorted(p for p in (d / "runs").iterdir() if (p / "compare.json").exists())[-1] / "compare.json"
    data = json.loads(path.read_text())
    cand = next(iter(data["candidates"].values()))
    cand["dominant"] = {
        "flagged": True,
        "detail": "predicts 'warranty' for 120 of 120 examples (100%; 3.1% of the references)",
    }
    path.write_text(json.dumps(data))
    first = build_markdown(StudyContext.open(d)).split("## Summary")[1].split("## Hypothesis and guards")[0]
    table_end = first.index("\n\n", first.index("| criterion |"))
    assert (
        first[table_end:]
        .lstrip()
        .startswith(
            "**warning: the candidate predicts 'warranty' for 120 of 120 examples (100%; 3.1% of the references)**"
        )
    )


def test_a_resumed_candidate_is_said_on_the_first_screen_and_in_runs_training_and_verdict(dossier_study, tmp_path):
    """The candidate's train run was killed and resumed (``tuneproof resume``): its status is ``completed``, and
    the dossier says from which step it was resumed (fix item 2)."""
    import json
    import shutil

    from tuneproof.registry import Registry

    d = tmp_path / "study"
    shutil.copytree(dossier_study["dir"], d, ignore=shutil.ignore_patterns("exports", "*.safetensors", "*.bin"))
    t = dossier_study["train"]
    reg = Registry(d)
    resumes = [
        {
            "from_step": 2,
            "checkpoint": "step-000002",
            "skipped": [],
            "previous_status": "interrupted",
            "previous_reason": "killed (SIGKILL)",
            "time": 1.0,
        }
    ]
    reg._update(t, summary=json.dumps({**reg.get(t).summary, "resumes": resumes}))
    reg.close()
    metrics = d / "runs" / t / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    steps = [r for r in rows if isinstance(r.get("step"), int)]
    # the dead process had logged steps 1-3; the resume logs from step 3 again
    rows = steps[:3] + [{"event": "resume", "from_step": 2, "checkpoint": "step-000002"}] + steps[2:]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    md = build_markdown(StudyContext.open(d))
    line = f"{t} was interrupted after step 3 (killed (SIGKILL)) and resumed exactly from its checkpoint at step 2"
    first = md.split("## Summary")[1].split("## Hypothesis and guards")[0]
    assert f"- {line}\n" in first
    runs = md.split("## Runs (all of them)")[1].split("## Variants")[0]
    row = next(r for r in runs.splitlines() if r.startswith(f"| {t} | train |"))
    assert "| completed |" in row and "resumed x1 (from step 2)" in row
    assert f"1 run(s) were interrupted and resumed (`tuneproof resume`):\n\n- {line}" in runs
    training = md.split("## Training")[1].split("## Comparisons")[0]
    assert "| run | status | resumed from step | steps |" in training
    assert next(r for r in training.splitlines() if r.startswith(f"| {t} |")).startswith(f"| {t} | completed | 2 |")
    assert f"- {line}" in training
    assert line in md.split("## Verdict")[1].split("## Limits observed")[0]
    # a run never resumed says nothing of it
    assert "resumed" not in build_markdown(StudyContext.open(dossier_study["dir"])).split("## Hypothesis")[0]


def test_report_prints_the_first_screen_then_the_path(dossier_study, capsys, monkeypatch):
    """`tuneproof report` printed only `dossier: PATH`: now the verdict screen, as dossier.md begins, then the path."""
    import pytest

    from tuneproof.cli import main
    from tuneproof.deliver.dossier import first_screen
    from tuneproof.ui import console

    monkeypatch.setattr(console, "_width", 250)
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["report", "--study", str(dossier_study["dir"])])
    assert e.value.code == 0
    out = capsys.readouterr().out
    md = (dossier_study["dir"] / "dossier.md").read_text()
    screen = first_screen(md)
    assert screen.startswith("# ") and "## Summary\n\n**verdict (frozen hypothesis): " in screen
    assert "## Hypothesis and guards" not in screen and "<a id=" not in screen
    assert screen.rstrip().endswith("· [Environment](#environment)")
    body = md.split('<a id="summary"></a>\n\n')[1].split('<a id="hypothesis">')[0].strip()
    assert body in screen  # the same text as dossier.md's first screen
    assert out == screen + f"\ndossier: {dossier_study['dir'] / 'dossier.md'}\n"  # a blank line, then the path


def test_seconds_have_one_format_in_the_dossier(dossier_study):
    """The baseline line printed `88.642033 s` while tables printed `91.6 s`."""
    from tuneproof.deliver.dossier.blocks import seconds_text

    assert (seconds_text(88.642033), seconds_text(150), seconds_text(9000), seconds_text(None)) == (
        "88.6 s",
        "2.5 min",
        "2.5 h",
        "?",
    )
    md = dossier_study["md"]
    baseline = md.split("## Baseline\n\n")[1].splitlines()[0]
    assert re.search(r" examples, \d+\.\d (s|min|h)\.$", baseline), baseline
    training = md.split("## Training\n\n")[1].split("\n\n")[0].splitlines()
    assert "| train time |" in training[0]
    col = training[0].split(" | ").index("train time")
    cells = [row.split(" | ")[col].strip() for row in training[2:]]
    assert all(re.fullmatch(r"\d+\.\d (s|min|h)|\\-", c) for c in cells), cells  # "\-": not recorded
    assert any(c.endswith(" s") for c in cells), cells
