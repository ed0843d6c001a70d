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
Within the same read, a trained candidate is paired with the base model on the test split (the
baseline's procedure; ``baseline_outputs.jsonl``, ``test_compare.json``): each metric of both, the
delta with its paired bootstrap 95% interval and the success criterion's verdict, rounded on screen
(with ``eval.backend: vllm`` the pairing is left to ``compare``).
"""

from __future__ import annotations

from tuneproof import hypothesis as hyp
from tuneproof.context import StudyContext
from tuneproof.errors import TuneproofError
from tuneproof.evaluation.compare import paired_compare
from tuneproof.evaluation.metrics import score
from tuneproof.evaluation.predict import predict
from tuneproof.evaluation.screen import metric_short, reuse_line
from tuneproof.io import read_jsonl, write_jsonl
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
from tuneproof.ui import console, fmt, heartbeat, table, user_text


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
        try:  # run order is the runs' numbers, not the clock (a clock stepped back would hide a later train run)
            seq = ctx.registry.get(accesses[0]["run"]).seq
            later = [r.id for r in ctx.registry.list(kind="train") if r.seq > seq]
        except TuneproofError:  # the test run's record is gone: its recorded time
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
    with (
        evaluation_run(ctx, "test", parent=None if cand == "base" else cand) as run,
        heartbeat("test", "loading the model") as beat,
    ):
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
        beat.update(f"evaluating {len(examples)} examples")
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
        console.print(f"  scored with the {judging.judged_against} hypothesis: {rounded(headline(ctx.task, metrics))}")
        for k, v in extra.items():
            console.print(f"  scored with the {k.removeprefix('metrics_')} hypothesis: {rounded(v)}")
        versus = None
        if cand != "base":
            del model
            versus = versus_base(ctx, run, examples, view)
            if versus is not None:
                extra["versus_base"] = versus
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


def rounded(metrics: dict[str, float]) -> str:
    """Headline metrics for the screen: ``accuracy 0.026, macro-F1 0.012`` (display names, 3 decimals)."""
    return ", ".join(f"{metric_short(k)} {fmt(v)}" for k, v in metrics.items()) or "-"


def versus_base(ctx: StudyContext, run, examples: list, view: dict) -> dict | None:
    """The base model on the same test examples, in the same read, paired with the candidate's
    ``outputs.jsonl``: ``{"n", "metrics": {key: {"base", "cand", "delta", "ci"}}, "verdict", "success"}``
    (headline metrics only; the whole comparison in ``test_compare.json``), printed as a table.
    None with ``eval.backend: vllm`` (its backend check would run a second time; ``compare`` pairs)."""
    if ctx.study.eval.backend == "vllm":
        console.print("[dim]the pairing with the base model on the test split needs eval.backend: transformers[/]")
        return None
    device, _, _ = ctx.torch_setup()
    with heartbeat("test", "loading the base model"):
        base = load_model(ctx.base, ctx.head, labels=ctx.head_labels)
        model = cast_base_for_inference(base, ctx.base_weights).to(device)
    preds = predict(ctx, model, examples, "test base model")
    rows = [
        {"id": e.id, "category": e.label, "input": e.text, "reference": e.target, "prediction": p}
        for e, p in zip(examples, preds)
    ]
    write_jsonl(run.path("baseline_outputs.jsonl"), rows)
    result = paired_compare(
        rows,
        read_jsonl(run.path("outputs.jsonl")),
        ctx.task,
        required_fields=view["required_fields"],
        eval_cfg=hyp.eval_for(view, ctx.study.eval),
        hypothesis=hyp.as_hypothesis(view),
        iterations=ctx.study.eval.bootstrap_iterations,
        seed=ctx.study.eval.seed,
        labels=task_config(ctx).labels,
    )
    run.write_json("test_compare.json", result)
    keys = [
        k for k in headline(ctx.task, {k: v["cand"] for k, v in result["metrics"].items()}) if k in result["metrics"]
    ]
    keys = keys or list(result["metrics"])
    shown = {k: result["metrics"][k] for k in keys}
    rows_ = [
        [
            metric_short(k),
            fmt(v["base"]),
            fmt(v["cand"]),
            fmt(v["delta"]),
            "[" + ", ".join(fmt(x) for x in v["ci"] or [None, None]) + "]",
        ]
        for k, v in shown.items()
    ]
    console.print(
        table(
            f"test split: candidate vs base model on {result['n']} paired examples "
            "(95% paired bootstrap CI of the delta)",
            ["metric", "base model", "candidate", "delta", "95% CI"],
            rows_,
        )
    )
    success = next((v for v in result.get("verdicts") or [] if v["kind"] == "success"), None)
    if success:
        console.print(
            f"  {success['verdict']}: {user_text(success['name'])} on the test split ({user_text(success['detail'])})"
        )
    return {
        "n": result["n"],
        "metrics": shown,
        "verdict": (result.get("overall") or {}).get("verdict"),
        "success": None if success is None else success["verdict"],
    }
