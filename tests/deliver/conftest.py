"""Fixtures of the deliverable tests: the tiny classification study, run once per session
(baseline, train, eval, compare) and exported once with --merge; see deliver_tiny.py."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest

from deliver_tiny import build_bert_base, make_cls_study

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def bert_base(tmp_path_factory) -> Path:
    return build_bert_base(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def cls_study(tmp_path_factory, bert_base) -> dict:
    """The classification study after baseline, train, eval and compare (shared, do not modify;
    copy it with :func:`copy_study` to change it)."""
    import tuneproof.recipes.train as train_recipe
    from tuneproof.context import StudyContext
    from tuneproof.recipes.baseline import run_baseline
    from tuneproof.recipes.compare import run_compare
    from tuneproof.recipes.evaluate import run_eval
    from tuneproof.recipes.train import run_train

    d = make_cls_study(tmp_path_factory.mktemp("cls-study"), bert_base)
    ctx = StudyContext.open(d)
    ids = {"baseline": run_baseline(ctx)}
    snapshot = {}
    orig = train_recipe.save_trained

    def save_and_snapshot(model, *args, **kw):  # the trained model as it is in memory, before saving (docs/CASES.md C6)
        snapshot["model"] = copy.deepcopy(model).eval()
        return orig(model, *args, **kw)

    train_recipe.save_trained = save_and_snapshot
    try:
        ids["train"] = run_train(ctx)
    finally:
        train_recipe.save_trained = orig
    ids["eval"] = run_eval(ctx, ids["train"])
    ids["compare"] = run_compare(ctx, [ids["eval"]], against=ids["baseline"])
    ctx.registry.close()
    return {"dir": d, "ids": ids, "base": bert_base, "model_before_save": snapshot["model"]}


@pytest.fixture(scope="session")
def cls_bundle(cls_study) -> dict:
    """The classification study's train run exported with --merge (verified in a fresh process)."""
    from tuneproof.context import StudyContext
    from tuneproof.recipes.export import run_export

    ctx = StudyContext.open(cls_study["dir"])
    export_id = run_export(ctx, cls_study["ids"]["train"], merge=True, k=6)
    ctx.registry.close()
    return {**cls_study, "export": export_id, "bundle": cls_study["dir"] / "exports" / cls_study["ids"]["train"]}


@pytest.fixture(scope="session")
def dossier_study(cls_bundle, tmp_path_factory) -> dict:
    """A copy of the exported classification study with every other kind of evidence added: a
    failed and an invalid run, a variant, a data check and a preflight summary (in the shape those
    commands write), two reads of the test split, a rental plan; then ``report --html``."""
    import shutil

    from tuneproof.cli import main
    from tuneproof.registry import Registry

    d = tmp_path_factory.mktemp("dossier") / "study"
    shutil.copytree(cls_bundle["dir"], d)
    reg = Registry(d)
    train_id = cls_bundle["ids"]["train"]
    with reg.run("data-check") as r:
        r.update_summary(
            passed=True,
            hard_faults=0,
            sizes={"train": 32, "validation": 12, "test": 6},
            lengths={
                "train": {"p50": 5.0, "p95": 7.0, "max": 8, "truncated_share": 0.0},
                "validation": {"p50": 5.0, "p95": 12.5, "max": 18, "truncated_share": 0.083},
            },
            suggest_max_length=8,
            duplicates=["train/test: 0 exact, 0 near-duplicates"],
        )
        counts = {
            lv: {"pairs": k, "first_colliding": k, "second_colliding": k, "fraction": k / 6}
            for lv, k in (("exact", 1), ("normalised", 1), ("near", 2))
        }
        none = {
            lv: {"pairs": 0, "first_colliding": 0, "second_colliding": 0, "fraction": 0.0}
            for lv in ("exact", "normalised", "near")
        }
        r.write_json(
            "data_check.json",
            {
                "lengths": {
                    "splits": {
                        "train": {"p50": 5.0, "p95": 7.0, "p99": 8.0, "max": 8},
                        "validation": {"p50": 5.0, "p95": 12.5, "p99": 17.0, "max": 18},
                    }
                },
                "dedup": {
                    "settings": {"threshold": 0.8},
                    "split_sizes": {"train": 32, "validation": 12, "test": 6},
                    "pairs": {
                        "train/train": {
                            "first": "train",
                            "second": "train",
                            "n_first": 32,
                            "n_second": 32,
                            "counts": none,
                            "collisions": [],
                        },
                        "train/test": {
                            "first": "train",
                            "second": "test",
                            "n_first": 32,
                            "n_second": 6,
                            "counts": counts,
                            "collisions": [
                                {
                                    "kind": "exact",
                                    "id_a": "train:c001",
                                    "id_b": "test:c201",
                                    "text_a": "x",
                                    "text_b": "good film",
                                    "similarity": 1.0,
                                    "minhash_estimate": 1.0,
                                }
                            ],
                        },
                    },
                },
            },
        )
    with reg.run("preflight") as r:
        r.update_summary(
            passed=True,
            checks=[
                {"name": "update check", "passed": True, "detail": "4 of 4 LoRA tensors changed"},
                {"name": "accumulation", "passed": True, "detail": "max |grad diff| 1e-7"},
            ],
            memory={
                "peak_bytes": 3_200_000_000,
                "estimate": {"weights_bytes": 1_100_000_000, "optimizer_bytes": 900_000_000},
                "L37_estimate_gib": 1.5,
                "L37_peak_gib": 1.25,
                "L37_step_peak_gib": 0.4,
                "L37_estimate_in_step_gib": 0.5,
                "L37_allocated_step_peak_gib": 0.49,
                "L37_measured_over_estimate": 0.98,
            },
            memory_breakdown={
                "lengths": [37],
                "micro_batch": 4,
                "rows": [
                    ["weights", 1049.0],
                    ["activations: MLP gate, silu, up (3i per block)", 120.5],
                    ["measured: the step's tensors at the peak", 501.8],
                    ["measured / estimate (the step's tensors / the step's part)", 0.98],
                ],
            },
            throughput={"s_per_step": 0.5, "tokens_per_s": 1200.0},
            smoke={"eval_seconds": 2.0, "n_eval": 8},
        )
    with pytest.raises(RuntimeError):
        with reg.run("train", name="oom") as failed:
            raise RuntimeError("CUDA out of memory while allocating 2.00 GiB")
    variant = reg.create("train", parent=train_id, name="lora-r8")
    cfg = (d / "runs" / train_id / "config.json").read_text().replace('"r": 4', '"r": 8')
    (d / "runs" / variant.id / "config.json").write_text(cfg)
    variant.update_summary(
        variant={"parent": train_id, "change": {"method.r": {"from": 4, "to": 8}}}, steps=12, final_loss=0.6
    )
    reg.finish(variant.id, "completed")
    reg.invalidate(variant.id, "evaluated on the wrong split")
    reg.log_test_access(cls_bundle["ids"]["eval"], train_id, {"metrics": {"accuracy": 0.5, "macro_f1": 0.4}})
    reg.log_test_access(cls_bundle["ids"]["eval"], variant.id, {"metrics": {"accuracy": 0.6, "macro_f1": 0.55}})
    reg.close()
    with pytest.raises(SystemExit) as e:
        main(["plan", "--days", "7", "--hourly-rate", "2.5", "--study", str(d)])
    assert e.value.code == 0
    with pytest.raises(SystemExit) as e:
        main(["report", "--html", "--study", str(d)])
    assert e.value.code == 0
    return {
        "dir": d,
        "train": train_id,
        "variant": variant.id,
        "failed": failed.id,
        "md": (d / "dossier.md").read_text(),
        "html_path": d / "dossier.html",
        "html": (d / "dossier.html").read_text(),
    }
