"""Recipe ``eval``: evaluate a trained run with exactly the baseline's procedure.

Features: the adapter (or full model) of a completed train run is loaded onto the same base;
the evaluation split, prompt, decoding and metrics are the study's, and the evaluation
fingerprint is stored so ``compare`` can check it matches the baseline's. A tokenizer that differs
from the one the train run and its baseline recorded is refused, naming both (docs/CASES.md C13 kind);
so is an adapter whose sha256 differs from the one training recorded, and the eval run records the sha256 of
the adapter (or model) it loaded (``trained_weights``), which ``export`` checks
(tests/faults/test_faults_evidence.py).
``eval.repeat: N`` evaluates it N times and records the noise floor in ``noise.json``
(:mod:`tuneproof.evaluation.noise`). With ``eval.backend: vllm`` the run's adapter is served by vLLM once the
backend check passed (``evaluation/backends.py``).
"""

from __future__ import annotations

from tuneproof.context import StudyContext
from tuneproof.evaluation.recording import (
    evaluate_into,
    evaluation_run,
    print_metrics,
    print_noise,
    require_backend,
    served_paths,
)
from tuneproof.evaluation.trained_run import check_tokenizer, check_trained_weights, load_trained
from tuneproof.recipes.common import note_library_drift, record_inputs
from tuneproof.ui import console, heartbeat, user_text


def run_eval(ctx: StudyContext, train_run: str) -> str:
    """Evaluate ``train_run`` on the eval split; returns the eval run id (its parent is the train run).

    Raises:
        CheckFailed: the tokenizer differs from the one recorded by the train run or its baseline
            (exit 3, before any eval run; :func:`~tuneproof.evaluation.trained_run.check_tokenizer`), the saved
            adapter (or model) differs from what the train run recorded when it saved it (exit 3, before any
            eval run; :func:`~tuneproof.evaluation.trained_run.check_trained_weights`), or the backend check
            refused ``eval.backend: vllm`` (exit 3; the run is invalid, no numbers).
        TuneproofError: ``eval.backend`` cannot run here (exit 2, before any run).
    """
    rec = ctx.registry.get(train_run)
    check_tokenizer(ctx, rec.id, "eval")
    trained = check_trained_weights(ctx, rec.id, "eval")
    require_backend(ctx)
    with evaluation_run(ctx, "eval", parent=rec.id) as run, heartbeat("eval", f"loading {rec.id}") as beat:
        inputs = record_inputs(ctx, run)
        note_library_drift(ctx, run, rec.id, inputs["env"])
        run.update_summary(trained_weights=trained)  # the adapter this eval loaded; export compares it
        model = load_trained(ctx, rec.id)
        examples = ctx.eval_examples()
        beat.update(f"evaluating {len(examples)} examples")
        console.print(
            f"[bold]{run.id}[/] eval of {rec.id} on {len(examples)} '{user_text(ctx.study.eval.split)}' examples",
            soft_wrap=True,
        )
        served = served_paths(ctx, rec.id)
        print_metrics(ctx, evaluate_into(ctx, run, model, examples, f"eval {rec.id}", served=served, beat=beat))
        print_noise(ctx, run)
        return run.id
