"""``training.warmup_steps`` covering all or most of the run's optimizer steps is a named finding before
compute (the data check and the train screen), with the peak LR fraction the schedule really reaches."""

from __future__ import annotations

import pytest
import torch
import yaml
from transformers import get_scheduler

from tuneproof.context import StudyContext
from tuneproof.study import Training
from tuneproof.training.budget import total_steps, warmup_finding


def _lrs(cfg: Training, steps: int) -> list[float]:
    """The learning rate each optimizer step uses under transformers' scheduler (what the loop builds)."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=cfg.learning_rate)
    sched = get_scheduler(cfg.lr_scheduler, opt, num_warmup_steps=cfg.warmup_steps, num_training_steps=steps)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_warmup_longer_than_the_run_names_the_key_steps_and_peak_fraction():
    cfg = Training(max_steps=3, warmup_steps=5, learning_rate=0.002)
    assert _lrs(cfg, 3) == [0.0, 0.0004, 0.0008]  # the defect's metrics.jsonl: the run never reaches 0.002
    line = warmup_finding(cfg, 3)
    assert line == (
        "training.warmup_steps 5 covers all of the run's 3 optimizer steps: the learning rate peaks at 40% of "
        "training.learning_rate (0.0008 of 0.002) and never reaches it; step 1 updates at lr 0 (a no-op update, "
        "warmup starts at 0); set training.warmup_steps to 0 (about 10% of the run) or raise the budget"
    )


def test_warmup_over_half_the_run_is_a_finding_and_a_short_one_is_not():
    most = warmup_finding(Training(max_steps=10, warmup_steps=6), 10)
    assert most is not None and most.startswith(
        "training.warmup_steps 6 covers most of the run's 10 optimizer steps: 6 of 10 steps at a reduced"
    )
    assert warmup_finding(Training(max_steps=10, warmup_steps=5), 10) is None
    assert warmup_finding(Training(max_steps=3, warmup_steps=0), 3) is None


def test_warmup_under_a_constant_schedule_is_said_to_be_ignored():
    cfg = Training(max_steps=10, warmup_steps=2, lr_scheduler="constant", learning_rate=0.01)
    assert _lrs(cfg, 3) == [0.01, 0.01, 0.01]  # transformers' constant schedule has no warmup
    assert warmup_finding(cfg, 10) == (
        "training.warmup_steps 2 is ignored by lr_scheduler constant (no warmup happens); "
        "set training.lr_scheduler: constant_with_warmup, or training.warmup_steps: 0"
    )


def test_data_check_warns_on_warmup_covering_the_budget(tmp_path, tiny_model_dir):
    rows = ["text,label"] + [f"sentence {i} about {'ab'[i % 2]} number {i * 7},{'ab'[i % 2]}" for i in range(40)]
    (tmp_path / "d.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "tuneproof.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "w",
                "hypothesis": {"behaviour": "b", "task": "classification", "success": {"metric": "macro_f1"}},
                "data": {
                    "sources": [{"path": "d.csv", "format": "csv"}],
                    "fields": {"label": "label"},
                    "split": {"fractions": {"train": 0.5, "validation": 0.5}},
                },
                "model": {"base": str(tiny_model_dir), "kind": "causal-lm"},
                "training": {"max_steps": 3, "warmup_steps": 5, "learning_rate": 0.002},
            }
        )
    )
    from tuneproof.recipes.data_check import data_report  # noqa: PLC0415

    ctx = StudyContext.open(tmp_path)
    assert total_steps(ctx.study.training, len(ctx.all_splits["train"])) == 3
    rep = data_report(ctx)
    assert warmup_finding(ctx.study.training, 3) in rep["warnings"]
    assert rep["passed"] is True


def test_train_warns_before_compute_and_the_metrics_show_the_reduced_lr(tiny_base, tmp_path, capsys):
    from tiny_study import make_study, rows, train_dir  # noqa: PLC0415
    from tuneproof.cli import main  # noqa: PLC0415

    study = make_study(tmp_path / "s", tiny_base, max_steps=3, warmup_steps=5, learning_rate=0.002)
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--skip-preflight", "tiny study", "--study", str(study)])
    out = " ".join(capsys.readouterr().out.split())
    assert exit_.value.code == 0, out
    assert "warning: training.warmup_steps 5 covers all of the run's 3 optimizer steps: the learning rate peaks " in out
    assert out.index("warning: training.warmup_steps") < out.index("train run r0003 completed")
    lrs = [r["lr"] for r in rows(train_dir(study)) if "lr" in r]
    assert lrs == pytest.approx([0.0, 0.0004, 0.0008])
