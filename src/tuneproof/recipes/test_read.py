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

What is read: the test split capped by ``eval.max_examples`` as the evaluation split is (the same
class-balanced draw, :meth:`~tuneproof.context.StudyContext.test_examples`). Before any model is
loaded, one line states the passes (the candidate; the base model for the pairing, unless an
earlier test read already holds the base model's outputs on the same examples under the same
procedure, which are then reused: the base model is not run again) and an estimate of their time
from the throughput measured by the study's own evaluations (:func:`estimate_line`; the candidate's pass times
``eval.repeat``: the test read repeats it as baseline and eval do and records ``noise.json``).
"""

from __future__ import annotations

from tuneproof import hypothesis as hyp
from tuneproof.context import StudyContext
from tuneproof.errors import TuneproofError
from tuneproof.evaluation.compare import paired_compare
from tuneproof.evaluation.fingerprint import study_eval_fingerprint
from tuneproof.evaluation.metrics import score
from tuneproof.evaluation.noise import comparison_floor, read_noise
from tuneproof.evaluation.predict import predict
from tuneproof.evaluation.recording import (
    evaluate_into,
    evaluation_run,
    headline,
    print_metrics,
    print_noise,
    require_backend,
    served_paths,
)
from tuneproof.evaluation.screen import metric_short, reuse_line
from tuneproof.evaluation.trained_run import check_trained_weights, load_trained
from tuneproof.io import read_jsonl, sha256_json, write_jsonl
from tuneproof.models.base_model import load_model
from tuneproof.models.method import cast_base_for_inference
from tuneproof.recipes.common import note_library_drift, record_inputs
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
        examples = ctx.test_examples()
        whole = len(ctx.split(ctx.study.data.test_split, allow_test=True))
        base_key = base_outputs_key(ctx, examples)
        reused = None if cand == "base" else reusable_base_outputs(ctx, base_key, examples)
        pair = cand != "base" and ctx.study.eval.backend != "vllm"
        console.print(estimate_line(ctx, cand, len(examples), whole, pair and reused is None, reused), soft_wrap=True)
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
            beat=beat,
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
                labels=task_config(ctx, examples=examples).labels,
            )
            extra[f"metrics_{judging.other_name}"] = headline(ctx.task, m2)
        print_metrics(ctx, metrics)
        print_noise(ctx, run)
        print_judging(judging)
        console.print(f"  scored with the {judging.judged_against} hypothesis: {rounded(headline(ctx.task, metrics))}")
        for k, v in extra.items():
            console.print(f"  scored with the {k.removeprefix('metrics_')} hypothesis: {rounded(v)}")
        versus = None
        if cand != "base":
            del model
            versus = versus_base(ctx, run, examples, view, reused)
            if versus is not None:
                extra["versus_base"] = versus
        run.update_summary(
            base_outputs_key=base_key if cand == "base" or versus is not None else None,
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


def base_outputs_key(ctx: StudyContext, examples: list) -> str:
    """What the base model's outputs on ``examples`` depend on: the evaluation fingerprint of these
    examples (procedure, tokenizer, precision, base weights' dtype) and the base revision (sha256 hex)."""
    efp = study_eval_fingerprint(ctx, examples, base_weights=ctx.base_weights)
    return sha256_json({"eval_fingerprint": efp["hash"], "base_revision": ctx.base.revision})


def reusable_base_outputs(ctx: StudyContext, key: str, examples: list) -> dict | None:
    """``{"run", "rows"}``: the base model's outputs on ``examples`` from the latest completed test
    run with the same :func:`base_outputs_key` (a ``test base`` read's ``outputs.jsonl``, or a
    pairing's ``baseline_outputs.jsonl``) whose ids are these examples' ids; None when there is none."""
    ids = [e.id for e in examples]
    for rec in reversed(ctx.registry.list(kind="test", status="completed")):
        if rec.summary.get("base_outputs_key") != key:
            continue
        name = "outputs.jsonl" if rec.summary.get("candidate") == "base" else "baseline_outputs.jsonl"
        path = ctx.registry.runs_dir / rec.id / name
        if not path.exists():
            continue
        rows = [{k: r.get(k) for k in ("id", "category", "input", "reference", "prediction")} for r in read_jsonl(path)]
        if [r["id"] for r in rows] == ids:
            return {"run": rec.id, "rows": rows}
    return None


def measured_rate(ctx: StudyContext, kinds: tuple[str, ...], parent: str | None = None) -> tuple[float, str] | None:
    """``(examples per second, run id)`` of the latest completed run of ``kinds`` (of ``parent`` when
    given) whose summary records ``eval_examples_per_s``; None when no evaluation was measured."""
    for rec in reversed(ctx.registry.list()):
        if rec.kind not in kinds or rec.status != "completed" or (parent is not None and rec.parent != parent):
            continue
        rate = rec.summary.get("eval_examples_per_s")
        if isinstance(rate, (int, float)) and rate > 0:
            return float(rate), rec.id
    return None


def estimate_line(ctx: StudyContext, cand: str, n: int, whole: int, base_pass: bool, reused: dict | None) -> str:
    """The line printed before the test split is read: how many examples (and the cap), the passes,
    and their time from the measured throughput of the study's evaluations (the candidate's own eval
    run first, else the baseline's; seconds per pass = ``n`` / examples per second; the prompts of ``eval.sets``
    once more, for the candidate), e.g.
    ``test: 60 of 3080 'test' examples (eval.max_examples 60, class-balanced); 2 passes (r0004, then
    the base model to pair with): about 2 min 10 s (r0005 evaluated 0.92 examples/s)``. With ``eval.repeat: N`` the
    candidate's pass counts N times (``r0004 x 3 repeats (eval.repeat)``); a run's recorded rate is predictions
    per second over all its repeats."""
    split = user_text(ctx.study.data.test_split)
    cap = ctx.study.eval.max_examples
    head = f"test: {n} of {whole} '{split}' examples" + (
        f" (eval.max_examples {cap}, class-balanced)" if cap and n < whole else ""
    )
    repeat = ctx.study.eval.repeat if ctx.study.eval.backend == "transformers" else 1
    passes = [user_text(cand) if cand != "base" else "the base model"]
    if repeat > 1:
        passes[0] += f" x {repeat} repeats (eval.repeat)"
    if base_pass:
        passes.append("the base model to pair with")
    elif reused is not None:
        head += f"; the base model's outputs on these examples are reused from {reused['run']}"
    rate = (measured_rate(ctx, ("eval",), cand) if cand != "base" else None) or measured_rate(
        ctx, ("baseline", "eval", "test")
    )
    what = f"{len(passes)} pass{'es' if len(passes) > 1 else ''} ({', then '.join(passes)})"
    extra = sum(len(s.examples) for s in ctx.eval_sets)  # eval.sets: the candidate generates them after the split
    if extra:
        what += f" + {extra} prompts of eval.sets"
    if rate is None:
        return f"{head}; {what}: no evaluation of this study measured yet, no estimate"
    # the candidate's pass repeated, the pairing's once; eval.sets generated once
    seconds = ((len(passes) - 1 + repeat) * n + extra) / rate[0]
    return f"{head}; {what}: about {duration(seconds)} ({rate[1]} evaluated {rate[0]:.3g} examples/s)"


def duration(seconds: float) -> str:
    """``"45 s"``, ``"2 min 10 s"``, ``"1 h 05 min"`` (rounded to whole seconds)."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def versus_base(ctx: StudyContext, run, examples: list, view: dict, reused: dict | None = None) -> dict | None:
    """The base model on the same test examples, in the same read, paired with the candidate's
    ``outputs.jsonl``: ``{"n", "metrics": {key: {"base", "cand", "delta", "ci"}}, "verdict", "success",
    "base_outputs_from"}`` (headline metrics only; the whole comparison in ``test_compare.json``), printed
    as a table. ``reused`` (:func:`reusable_base_outputs`): the base model's outputs of an earlier read,
    used instead of running the base model again. None with ``eval.backend: vllm`` (its backend check
    would run a second time; ``compare`` pairs)."""
    if ctx.study.eval.backend == "vllm":
        console.print("[dim]the pairing with the base model on the test split needs eval.backend: transformers[/]")
        return None
    if reused is not None:
        rows = reused["rows"]
    else:
        device, _, _ = ctx.torch_setup()
        with heartbeat("test", "loading the base model"):
            base = load_model(ctx.base, ctx.head, labels=ctx.head_labels)
            model = cast_base_for_inference(base, ctx.base_weights).to(device)
        raw: list[str] = []
        preds = predict(ctx, model, examples, "test base model", raw_out=raw)
        rows = [
            {"id": e.id, "category": e.label, "input": e.text, "reference": e.target, "prediction": p}
            | ({"raw": raw[k]} if len(raw) == len(preds) else {})
            for k, (e, p) in enumerate(zip(examples, preds))
        ]
    write_jsonl(run.path("baseline_outputs.jsonl"), rows)
    cand_noise = read_noise(run.dir, run)  # eval.repeat: the candidate's floor on the test split (the base's: once)
    result = paired_compare(
        rows,
        read_jsonl(run.path("outputs.jsonl")),
        ctx.task,
        required_fields=view["required_fields"],
        eval_cfg=hyp.eval_for(view, ctx.study.eval),
        hypothesis=hyp.as_hypothesis(view),
        iterations=ctx.study.eval.bootstrap_iterations,
        seed=ctx.study.eval.seed,
        labels=task_config(ctx, examples=examples).labels,
        noise=None if cand_noise is None else comparison_floor(None, cand_noise, "base", run.id),
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
        "base_outputs_from": run.id if reused is None else reused["run"],
    }
