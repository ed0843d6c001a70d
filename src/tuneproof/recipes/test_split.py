"""Recipe ``test``: the only way the reserved test split is read (docs/PROTOCOL.md step 2).

Features: the candidate (a completed train run, or ``base`` for the base model) is evaluated on
the test split with the study's procedure; every access is logged in the registry (run, time,
candidate, result) and shown in the dossier. A second candidate evaluated on the test split, or
a test result followed by more training, is recorded as test reuse (``test_reuse`` in the
summary, with the reason) because choosing settings on the test split wears out its value as a
control. The metrics are scored with the hypothesis frozen with the first train run (required
fields, format rule); when the study file's differs, the change is shown key by key and the
headline under the edited definition is given too; ``--use-edited-hypothesis REASON`` scores with
the edited one (recorded in the summary, the test access log and ``hypothesis.overrides.jsonl``).
"""

from __future__ import annotations

from tuneproof import hypothesis as hyp
from tuneproof.context import StudyContext
from tuneproof.evaluation.metrics import score
from tuneproof.evaluation.screen import reuse_line
from tuneproof.io import read_jsonl
from tuneproof.models.base import load_model
from tuneproof.models.method import cast_base_for_inference
from tuneproof.recipes.common import (
    check_trained_weights,
    evaluate_into,
    evaluation_run,
    headline,
    load_trained,
    note_library_drift,
    print_metrics,
    record_inputs,
    require_backend,
    served_paths,
)
from tuneproof.recipes.compare import print_judging
from tuneproof.registry import iso
from tuneproof.tasks import task_config
from tuneproof.ui import console, user_text


def test_reuse(ctx: StudyContext, candidate: str) -> list[str]:
    """Reasons why reading the test split now counts as reuse (empty list: first, clean use)."""
    reasons = []
    accesses = ctx.registry.test_accesses()
    others = sorted({a["candidate"] for a in accesses if a["candidate"] != candidate})
    if others:
        reasons.append(f"the test split was already used for {', '.join(others)}")
    if any(a["candidate"] == candidate for a in accesses):
        reasons.append(f"{candidate} was already evaluated on the test split")
    if accesses:
        first = accesses[0]["time"]
        later = [r.id for r in ctx.registry.list(kind="train") if r.created > first]
        if later:
            reasons.append(f"training continued after the first test read ({iso(first)}): {', '.join(later)}")
    return reasons


def run_test(ctx: StudyContext, candidate: str, *, use_edited_hypothesis: str | None = None) -> str:
    """Evaluate ``candidate`` (train run id or ``base``) on the reserved test split; returns the test run id."""
    judging = hyp.resolve(ctx.study_dir, ctx.study, ctx.registry, use_edited_hypothesis)

    cand = "base" if candidate == "base" else ctx.registry.get(candidate).id
    if cand != "base" and ctx.registry.get(cand).kind == "eval":
        cand = ctx.registry.get(cand).parent
    reasons = test_reuse(ctx, cand)
    trained = (
        None if cand == "base" else check_trained_weights(ctx, cand, "test")
    )  # tests/faults/test_faults_evidence.py
    require_backend(ctx)
    with evaluation_run(ctx, "test", parent=None if cand == "base" else cand) as run:
        inputs = record_inputs(ctx, run)
        if trained is not None:
            note_library_drift(ctx, run, cand, inputs["env"])
            run.update_summary(trained_weights=trained)
        examples = ctx.split(ctx.study.data.test_split, allow_test=True)
        device, _, _ = ctx.torch_setup()
        if cand == "base":
            labels = ctx.head_labels
            model = cast_base_for_inference(load_model(ctx.base, ctx.head, labels=labels), ctx.base_weights).to(device)
        else:
            model = load_trained(ctx, cand)
        console.print(
            f"[bold]{run.id}[/] test of {user_text(cand)} on {len(examples)} "
            f"'{user_text(ctx.study.data.test_split)}' examples (logged)"
        )
        console.print(user_text(reuse_line(reasons)).replace("REUSE", "[bold yellow]REUSE[/]"), soft_wrap=True)
        view = judging.primary
        metrics = evaluate_into(
            ctx,
            run,
            model,
            examples,
            f"test {cand}",
            required_fields=view["required_fields"],
            eval_cfg=hyp.eval_for(view, ctx.study.eval),
            served=served_paths(ctx, None if cand == "base" else cand),
            check_examples=ctx.eval_examples(),
        )  # the backend check never reads the test split
        extra: dict = {}
        if judging.other is not None and hyp.scoring(judging.other) != hyp.scoring(view):
            other = judging.other
            rows = [
                {k: r.get(k) for k in ("id", "category", "reference", "prediction")}
                for r in read_jsonl(run.path("outputs.jsonl"))
            ]
            _, m2 = score(
                ctx.task,
                rows,
                required_fields=other["required_fields"],
                eval_cfg=hyp.eval_for(other, ctx.study.eval),
                labels=task_config(ctx).labels,
            )
            extra[f"metrics_{judging.other_name}"] = headline(ctx.task, m2)
        print_metrics(ctx, metrics)
        print_judging(judging)
        console.print(f"  scored with the {judging.judged_against} hypothesis: {headline(ctx.task, metrics)}")
        for k, v in extra.items():
            console.print(f"  scored with the {k.removeprefix('metrics_')} hypothesis: {v}")
        run.update_summary(
            candidate=cand,
            test_reuse=reasons,
            judged_against=judging.judged_against,
            hypothesis=judging.to_json(),
            **extra,
        )
        ctx.registry.log_test_access(
            run.id,
            cand,
            {
                "metrics": headline(ctx.task, metrics),
                "test_reuse": reasons,
                "judged_against": judging.judged_against,
                "use_edited_reason": judging.reason,
                **extra,
            },
        )
        hyp.record_override(ctx.study_dir, judging, "test", run.id)
        return run.id
