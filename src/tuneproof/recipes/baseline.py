"""Recipe ``baseline``: evaluate the base model before any training (docs/PROTOCOL.md step 2).

Features:
- the same evaluation procedure every later ``eval`` uses (split, prompt, decoding, metrics);
  its fingerprint is stored so ``compare`` can refuse runs evaluated differently;
- ``eval.repeat: N`` evaluates the base model N times (batch order and padding permuted by seed; sampling
  seeds with ``eval.do_sample``): ``runs/<id>/noise.json`` records the noise floor (:mod:`tuneproof.evaluation.noise`);
- per-example outputs in ``runs/<id>/outputs.jsonl``; resolved config, environment and data
  fingerprint recorded;
- never reads the reserved test split;
- refuses unless the data check of the current data fingerprint passed (run inline when there is
  none; ``--skip-data-check REASON`` overrides, recorded in the run), see :mod:`tuneproof.recipes.protocol`.
"""

from __future__ import annotations

from tuneproof.context import StudyContext
from tuneproof.evaluation.recording import (
    evaluate_into,
    evaluation_run,
    print_metrics,
    print_noise,
    require_backend,
)
from tuneproof.hypothesis import check_against_data
from tuneproof.models.base_model import load_model
from tuneproof.models.identity import base_hashes
from tuneproof.models.method import cast_base_for_inference
from tuneproof.recipes.common import record_inputs
from tuneproof.recipes.protocol import require_data_check
from tuneproof.study import STUDY_FILE
from tuneproof.ui import console, heartbeat, user_text


def run_baseline(ctx: StudyContext, *, data_check_override: str | None = None) -> str:
    """Evaluate the base model; returns the run id.

    Raises:
        TuneproofError: the hypothesis does not fit the data, or ``eval.backend`` cannot run here (exit 2, before any
        run). CheckFailed: the data check of the current data failed (exit 3; no baseline run is started), or the
            backend check refused ``eval.backend: vllm`` (exit 3; the run is invalid, no numbers).
    """
    check_against_data(ctx.study, ctx.all_splits, ctx.study_dir / STUDY_FILE)  # bad input: exit 2 before any run
    require_backend(ctx)  # eval.backend vllm without vllm or CUDA: exit 2 before any run
    data_check = require_data_check(ctx, "baseline", data_check_override)
    with evaluation_run(ctx, "baseline") as run, heartbeat("baseline", "hashing the base model's weights") as beat:
        record_inputs(ctx, run)
        run.write_json("base.json", base_hashes(ctx.base))  # compare refuses candidates trained on another base
        run.update_summary(
            data_check_run=data_check,
            **({"data_check_override": data_check_override.strip()} if data_check_override else {}),
        )
        examples = ctx.eval_examples()
        device, _, _ = ctx.torch_setup()
        console.print(
            f"[bold]{run.id}[/] baseline of {user_text(ctx.base.display_name)} on {len(examples)} "
            f"'{user_text(ctx.study.eval.split)}' examples",
            soft_wrap=True,
        )
        labels = ctx.head_labels
        beat.update("loading the base model")
        # training.bf16_base_weights: the base evaluated as the candidate's will be, its weights in bf16
        model = cast_base_for_inference(load_model(ctx.base, ctx.head, labels=labels), ctx.base_weights).to(device)
        if labels is not None:
            console.print(
                "[yellow]note[/]: an encoder's classification head is untrained "
                "before fine-tuning; its baseline is chance level"
            )
        beat.update(f"evaluating {len(examples)} examples")
        print_metrics(ctx, evaluate_into(ctx, run, model, examples, "baseline", beat=beat))
        print_noise(ctx, run)
        run.update_summary(base=ctx.base.identity())
        return run.id
