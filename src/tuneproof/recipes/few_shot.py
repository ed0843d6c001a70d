"""``tuneproof baseline --few-shot K``: the few-shot control prepared before its run starts (the draw, the
rendered examples, the context check) and recorded into it (``shots.json``, the summary's ``control``,
``few_shot``, ``few_shot_fit``). The rules are in :mod:`tuneproof.data.few_shot`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuneproof.context import StudyContext
from tuneproof.data.examples import Example
from tuneproof.data.few_shot import (
    FEW_SHOT,
    SHOTS_FILE,
    check_fit,
    context_length,
    draw_shots,
    shots_record,
    with_shots,
)
from tuneproof.errors import TuneproofError
from tuneproof.io import read_json
from tuneproof.registry import Run
from tuneproof.study import STUDY_FILE
from tuneproof.ui import console, user_text


@dataclass
class FewShot:
    """A few-shot control ready to run: K, the shots in the order shown, the evaluated examples with them, and
    what the run records."""

    k: int
    shots: list[Example]
    examples: list[Example]
    shots_file: dict[str, Any]

    @property
    def fingerprint_part(self) -> dict[str, Any]:
        """The fingerprint's ``control`` part: the control, K, the seed and the shots' ids in order."""
        return {
            "kind": FEW_SHOT,
            "k": self.k,
            "seed": self.shots_file["seed"],
            "shots": [s.id for s in self.shots],
        }

    def record(self, run: Run) -> None:
        """``shots.json`` and the summary's ``control``, ``few_shot``, ``few_shot_ids``, ``few_shot_fit``."""
        run.write_json(SHOTS_FILE, self.shots_file)
        run.update_summary(
            control=FEW_SHOT,
            few_shot=self.k,
            few_shot_seed=self.shots_file["seed"],
            few_shot_ids=[s.id for s in self.shots],
            few_shot_fit={k: v for k, v in self.shots_file["fit"].items() if k != "line"},
        )


def prepare_few_shot(ctx: StudyContext, k: int) -> FewShot:
    """Draw the shots (``eval.seed``, from the train split, never an evaluated example), render them into each
    evaluated example's prompt, and check the longest prompt fits the context with ``eval.max_new_tokens``.

    Raises:
        TuneproofError: (exit 2, before any run) ``k < 1``; a classification head or image classifier (it reads no
            prompt); a train split with fewer than ``k`` examples; the longest prompt does not fit the context.
    """
    where = ctx.study_dir / STUDY_FILE
    if k < 1:
        raise TuneproofError(f"--few-shot {k}: K must be at least 1", hint="e.g. --few-shot 5")
    if ctx.head_labels is not None:
        raise TuneproofError(
            f"--few-shot {k}: model.kind {ctx.model_kind} ({where}) classifies with a head and reads no prompt, so "
            "there is nowhere to show demonstrations",
            hint="a few-shot control needs a generative model (causal-lm); run `tuneproof baseline` without it",
        )
    ev = ctx.study.eval
    evaluated = ctx.eval_examples()
    shots = draw_shots(ctx.split("train"), k, ev.seed, exclude_ids=[e.id for e in evaluated], exclude=evaluated)
    examples = with_shots(evaluated, shots, ev.prompt.template)
    tok = ctx.tokenizer

    def tokens(exs: list[Example]) -> list[int]:
        texts = [ctx.pipeline.prompt_text(e) for e in exs]
        return [len(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"]]

    cfg_path = Path(ctx.base.path) / "config.json"
    limit, limit_from = context_length(read_json(cfg_path) if cfg_path.is_file() else {}, tok)
    plain = tokens(evaluated)
    fit = check_fit(
        tokens(examples), [e.id for e in examples], k, ev.max_new_tokens, limit, limit_from, max(plain, default=0)
    )
    console.print(f"[dim]{user_text(fit['line'])}[/]", soft_wrap=True)
    record = shots_record(shots, k, ev.seed, "train", fit)
    return FewShot(k=k, shots=shots, examples=examples, shots_file=record)
