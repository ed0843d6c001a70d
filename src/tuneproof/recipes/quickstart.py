"""Recipe ``quickstart``: the whole protocol on real data, on a CPU-only machine.

SNIPS (7 intents, slots) turned into strict JSON extraction with SmolLM2-135M-Instruct + LoRA:
init -> data check -> baseline (fixed class-balanced subset of the validation split) -> few-shot control
(``baseline --few-shot 3``: 3 training examples of 3 intents in each prompt; the extraction quickstart only) ->
preflight (with ``--fast`` or ``--preflight``) -> train -> eval (same procedure) -> compare (paired, guards judged;
the candidate against the baseline and the few-shot control) -> export (bound to the base) -> dossier; the last
lines say whether LoRA beat the few-shot prompt (the paired delta of the success metric and its 95% CI).
``--fast`` shrinks everything for tests (no gain is expected there).

Run again in the same folder (after Ctrl-C, a crash, a reboot), the quickstart resumes its study: the
study file must be the one these options write (else it is refused, naming the file); each step whose
run completed after the step before it is kept and said so, an interrupted train run continues from
its checkpoint (``tuneproof resume``), and the steps after run. When the 1-minute load average is
above the usable cores, one line says the machine is overloaded (the times quoted assume an idle one).
"""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from tuneproof.context import StudyContext
from tuneproof.data.digits import write_digits_folder
from tuneproof.data.locate import find_data_root
from tuneproof.errors import TuneproofError
from tuneproof.evaluation.controls import control_kind
from tuneproof.evaluation.screen import metric_short
from tuneproof.io import atomic_write_text
from tuneproof.models.base_model import MODEL_CACHE
from tuneproof.models.vision import build_init_vit
from tuneproof.procs import overload_line
from tuneproof.recipes.baseline import run_baseline
from tuneproof.recipes.compare import run_compare
from tuneproof.recipes.data_check import run_data_check
from tuneproof.recipes.evaluate import run_eval
from tuneproof.recipes.export import run_export
from tuneproof.recipes.init import template_text
from tuneproof.recipes.preflight import run_preflight
from tuneproof.recipes.report import run_report
from tuneproof.recipes.resume import run_resume
from tuneproof.recipes.train import TrainOptions, run_train
from tuneproof.study import STUDY_FILE
from tuneproof.ui import console, fmt, table, user_text

FAST_OVERRIDES = {
    "data": {"split": {"max_examples": {"train": 48, "validation": 14}}},
    "training": {"max_steps": 3, "micro_batch_size": 4, "checkpoint_every": 2, "warmup_steps": 1},
    "eval": {"max_examples": 7, "max_new_tokens": 24, "batch_size": 8},
}


def _merge(base: dict, over: dict) -> dict:
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _merge(base[k], v)
        else:
            base[k] = v
    return base


def write_quickstart_study(directory: Path, *, fast: bool, speedups: str = "auto") -> Path:
    """Write the quickstart study file (the extraction template, shrunk when ``fast``; ``speedups``:
    its ``training.speedups``, ``auto`` as the template writes it, or ``off``)."""
    return atomic_write_text(directory / STUDY_FILE, quickstart_study_text(fast=fast, speedups=speedups))


def quickstart_study_text(*, fast: bool, speedups: str = "auto") -> str:
    """The text :func:`write_quickstart_study` writes."""
    text = template_text("extraction")
    if fast or speedups != "auto":
        raw = yaml.safe_load(text)
        raw["training"]["speedups"] = speedups
        if fast:
            raw = _merge(raw, FAST_OVERRIDES)
            raw["name"] = "snips-extraction-fast"
        head = "# quickstart --fast: tiny subset and few steps (a wiring test, not a quality result)\n" if fast else ""
        text = head + yaml.safe_dump(raw, sort_keys=False)
    return text


#: K of the quickstart's few-shot control: 3 SNIPS queries of 3 intents (a few hundred prompt tokens more per example)
QUICKSTART_SHOTS = 3
#: the quickstart steps whose run is of another kind, with the control it is (``_earlier_run`` keeps them apart)
STEP_RUNS = {"few-shot": ("baseline", "few_shot")}

IMAGE_OVERRIDES = {  # a ViT initialised from a config learns the digits from scratch: full fine-tuning, more steps
    "method": {"kind": "full"},
    "training": {
        "max_steps": 600,
        "micro_batch_size": 32,
        "learning_rate": 0.002,
        "warmup_steps": 30,
        "lr_scheduler": "cosine",
        "checkpoint_every": 200,
    },
    "eval": {"batch_size": 64},
}
IMAGE_FAST = {
    "training": {"max_steps": 20, "checkpoint_every": 10},
    "data": {"split": {"max_examples": {"train": 200, "validation": 60}, "subset": "balanced"}},  # 20 and 6 per digit
}


def write_image_quickstart_study(directory: Path, *, fast: bool, speedups: str = "auto") -> Path:
    """The image quickstart: scikit-learn's 8x8 digits as ``images/<digit>/*.png`` (1,797 real images,
    10 classes, split 70/15/15 by tuneproof), a seeded ViT (hidden 64, 4 layers, 16x16 input)
    built from a config in the cache, fully fine-tuned."""
    directory.mkdir(parents=True, exist_ok=True)
    write_digits_folder(directory / "images")
    return atomic_write_text(directory / STUDY_FILE, image_study_text(fast=fast, speedups=speedups))


def image_study_text(*, fast: bool, speedups: str = "auto") -> str:
    """The text :func:`write_image_quickstart_study` writes (builds the seeded ViT in the cache if missing)."""
    base = build_init_vit(MODEL_CACHE / "vit-digits-init-s0", num_labels=10, seed=0)
    raw = yaml.safe_load(template_text("image-classification"))
    raw["model"]["base"] = str(base)
    _merge(raw, IMAGE_OVERRIDES)
    raw["training"]["speedups"] = speedups
    if fast:
        _merge(raw, IMAGE_FAST)
        raw["name"] = "digits-image-classification-fast"
    head = (
        "# tuneproof quickstart --task image-classification: real 8x8 digits "
        "(scikit-learn's copy of the UCI set), a ViT\n"
        "# initialised from a config (not pretrained: its baseline is chance), fully fine-tuned on the CPU\n"
    )
    return head + yaml.safe_dump(raw, sort_keys=False)


def run_quickstart(
    directory: Path,
    data: Path | None = None,
    *,
    fast: bool = False,
    preflight: bool = False,
    task: str = "extraction",
    speedups: str = "auto",
) -> dict:
    """Run every step (the preflight with ``--fast`` or ``--preflight``: on a 2-core CPU it adds minutes; always for
    ``task="image-classification"``, where it takes seconds); returns ``{"runs": {...}, "compare": ..., "dossier": path,
    "seconds": s}``.

    ``speedups``: the study's ``training.speedups`` (``auto``, the template's, or ``off``). Without the
    preflight ``auto`` is resolved by the train loop's own checks only (docs/speedups.md).

    Run again in a folder that holds its study with runs, it resumes it (see the module docstring).

    Raises:
        TuneproofError: the folder holds another study (its study file is not the one these options
            write), ``task`` has no quickstart, or ``speedups`` is neither ``auto`` nor ``off``.
    """
    t0 = time.perf_counter()
    directory = Path(directory)
    if task not in ("extraction", "image-classification"):
        raise TuneproofError(
            f"--task {task}: the quickstarts are 'extraction' (SNIPS + "
            "SmolLM2) and 'image-classification' (digits + ViT)"
        )
    if speedups not in ("auto", "off"):
        raise TuneproofError(f"--speedups {speedups}: auto or off")
    image = task == "image-classification"
    resuming = (directory / STUDY_FILE).exists() and any((directory / "runs").glob("*"))
    if resuming:
        want = (
            image_study_text(fast=fast, speedups=speedups)
            if image
            else quickstart_study_text(fast=fast, speedups=speedups)
        )
        if (directory / STUDY_FILE).read_text(encoding="utf-8") != want:
            raise TuneproofError(
                f"{directory / STUDY_FILE} is not the study this quickstart writes (another --task, --fast or "
                "--speedups, or the file was edited): it is not resumed",
                hint="run the quickstart with the options it was started with to resume it, or pass another --dir",
            )
    if image:
        root = None
        preflight = True
        header(f"tuneproof quickstart --task image-classification {'resumed ' if resuming else ''}in {directory}")
        if not resuming:
            write_image_quickstart_study(directory, fast=fast, speedups=speedups)
    else:
        root = find_data_root(data, "snips")
        header(f"tuneproof quickstart {'resumed ' if resuming else ''}in {directory} (data: {root})")
        if not resuming:
            write_quickstart_study(directory, fast=fast, speedups=speedups)
    overloaded = overload_line()
    if overloaded:
        console.print(f"[yellow]{overloaded}[/]", soft_wrap=True)
    ctx = StudyContext.open(directory, root)
    out: dict = {"runs": {}}

    steps = []
    try:
        steps.append(("data-check", lambda: run_data_check(ctx)))
    except ImportError:
        pass
    steps.append(("baseline", lambda: run_baseline(ctx)))
    if not image:  # an image classifier reads no prompt: no few-shot control
        steps.append(("few-shot", lambda: run_baseline(ctx, few_shot=QUICKSTART_SHOTS)))
    if fast or preflight:
        steps.append(("preflight", lambda: run_preflight(ctx)))
    # without the preflight step the train run says so (recorded like `train --skip-preflight`)
    skipped = (
        None if (fast or preflight) else "quickstart without --preflight (the full preflight adds minutes on a CPU)"
    )
    steps.append(("train", lambda: run_train(ctx, TrainOptions(preflight_override=skipped))))
    steps.append(("eval", lambda: run_eval(ctx, out["runs"]["train"])))
    steps.append(("compare", lambda: run_compare(ctx, [out["runs"]["eval"]], against=out["runs"]["baseline"])))
    steps.append(("export", lambda: run_export(ctx, out["runs"]["train"])))
    steps.append(("report", lambda: run_report(ctx)))

    after = 0  # seq of the run of the step before: a kept run must be newer (the chain of a resumed study)
    for name, fn in steps:
        console.rule(name)
        t = time.perf_counter()
        kept = _earlier_run(ctx, name, after, out["runs"]) if resuming else None
        if kept is not None and kept.status == "completed":
            console.print(f"{name}: {kept.id} completed before, kept")
            out["runs"][name] = kept.id
        elif kept is not None:  # an interrupted or failed train run: it continues from its checkpoint
            console.print(f"{name}: {kept.id} was {kept.status}; continuing it from its checkpoint")
            out["runs"][name] = run_resume(directory, root, kept.id)
        else:
            out["runs"][name] = fn()
        if name != "report":
            after = ctx.registry.get(out["runs"][name]).seq
        console.print(f"[dim]{name}: {time.perf_counter() - t:.1f} s[/]")
    out["seconds"] = round(time.perf_counter() - t0, 1)
    _print_outcome(ctx, out)
    return out


def _earlier_run(ctx: StudyContext, name: str, after: int, runs: dict):
    """The run a resumed quickstart keeps for step ``name``: the latest one of its kind newer than the
    step before (``seq > after``) that completed (a data check that passed, an eval of the kept train
    run), or, for ``train``, one interrupted or failed with a checkpoint to continue from; None:
    the step runs again (``report`` always does)."""
    if name == "report":
        return None
    kind, control = STEP_RUNS.get(name, (name, None))
    candidates = [r for r in ctx.registry.list(kind=kind) if r.seq > after and control_kind(r) == control]
    if name == "eval":
        candidates = [r for r in candidates if r.parent == runs.get("train")]
    for rec in reversed(candidates):
        if rec.status == "completed" and (name != "data-check" or rec.summary.get("passed")):
            return rec
        if name == "train" and rec.status in ("interrupted", "failed"):
            return rec if list((ctx.registry.runs_dir / rec.id / "checkpoints").glob("step-*")) else None
    return None


def header(text: str) -> None:
    """The quickstart's first line, whole at any width (a rule's title is cut with "..." to fit),
    then a rule."""
    console.print(f"[bold]{user_text(text, limit=None)}[/]", soft_wrap=True)
    console.rule()


def _print_outcome(ctx: StudyContext, out: dict) -> None:
    base = ctx.registry.get(out["runs"]["baseline"]).summary.get("metrics", {})
    cand = ctx.registry.get(out["runs"]["eval"]).summary.get("metrics", {})
    rows = [
        [
            metric_short(k),
            fmt(base.get(k)),
            fmt(cand.get(k)),
            fmt(
                float(cand[k]) - float(base[k])
                if isinstance(cand.get(k), (int, float)) and isinstance(base.get(k), (int, float))
                else None
            ),
        ]
        for k in cand
    ]
    console.print(
        table("baseline vs candidate (eval split, same procedure)", ["metric", "baseline", "candidate", "delta"], rows)
    )
    cmp = ctx.registry.run_json(out["runs"]["compare"], "compare.json") or {}
    if cmp.get("verdict"):
        console.print(f"verdict: [bold]{cmp['verdict']}[/]")
    if "few-shot" in out["runs"]:
        line = beat_line((cmp.get("candidates") or {}).get(out["runs"]["eval"]) or {}, out["runs"]["few-shot"])
        console.print(user_text(line), soft_wrap=True)
    console.print(f"dossier: [bold]{user_text(out['runs']['report'])}[/]", soft_wrap=True)
    console.print(f"total time: {out['seconds']:.0f} s")


def beat_line(entry: dict, control_id: str) -> str:
    """One line: whether the candidate (LoRA) beat the few-shot control ``control_id``, from its compare entry's
    comparison with that control (the success metric's paired delta, its 95% bootstrap CI, the success rule)."""
    b = (entry.get("controls") or {}).get(control_id)
    s = (b or {}).get("success") or {}
    if not s:
        return f"few-shot control {control_id}: not compared (see the compare run's notes)"
    said = {
        "pass": "LoRA beat",
        "fail": "LoRA did not beat",
        "inconclusive": "LoRA is not shown to beat",
    }.get(s.get("verdict"), "LoRA vs")
    ci = s.get("ci") or [None, None]
    return (
        f"{said} the {b.get('label')} {control_id}: {s.get('metric')} {fmt(s.get('base'))} -> {fmt(s.get('cand'))}, "
        f"paired delta {fmt(s.get('delta'))} (95% CI [{fmt(ci[0])}, {fmt(ci[1])}]; gain required "
        f"{fmt(s.get('threshold'))})"
    )
