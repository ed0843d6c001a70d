"""Recipe ``resume``: continue an interrupted (or failed) train run in a new process, exactly.

Features:
- continues from the run's latest checkpoint (``runs/<id>/checkpoints/step-NNNNNN/``,
  safetensors + JSON, see :mod:`tuneproof.training.resume_state`), or the one named by
  ``--checkpoint``, into the same run id: status back to ``running``, then completed
  (or interrupted/failed/invalid again); global step, learning-rate schedule, optimizer moments,
  trainable weights, RNG states (Python, NumPy, torch) and data position are restored, so the
  per-step losses and final weights equal those of an uninterrupted run (docs/CASES.md C12; tested on CPU
  with dropout on);
- the run keeps its recorded config (``runs/<id>/config.json``), and resume refuses, before
  anything is written, when:
  - the run is completed, invalid, still running, or not a train run;
  - the checkpoint is missing, damaged or incomplete (the file is named; nothing is overwritten);
  - the checkpoint's files differ from the sha256 recorded when it was written (``index.json``;
    names the file and both hashes), or it is not a checkpoint folder at all, e.g. a planted
    pickle ``step-999999.pt``, which is refused without being loaded (docs/CASES.md C21);
    ``--fallback`` continues from the newest older checkpoint that passes instead, listing those skipped;
  - the checkpoint's config differs from ``config.json``, or (for a run made from the study file,
    not a variant) the study file changed since (the keys are listed; the tracker keys
    ``tracking.*`` and ``report_to`` may change: the resumed run goes to the trackers the study
    file names now, its earlier steps first);
  - the data fingerprint or the base model revision differs from the checkpoint's, or the base's
    weight files or ``config.json`` differ from the sha256 recorded at train start (both hashes named);
- a distributed run (``--nproc-per-node N``) resumes under torchrun with the same world size only
  (the data order of each rank depends on it): another world size is refused before anything is
  written; each rank gets back its own RNG states;
- ``metrics.jsonl`` gets a ``{"event": "resume", "from_step": k}`` row; steps logged after the
  checkpoint by the dead process are logged again by the resume (the last row of a step wins);
  the summary lists every resume.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tuneproof import clock, procs
from tuneproof.context import StudyContext, load_study, parse_study
from tuneproof.errors import TuneproofError
from tuneproof.io import read_json
from tuneproof.models.identity import compare_base
from tuneproof.recipes.torchrun import HealthOnRank, check_launch, launch_ranks
from tuneproof.recipes.train import run_train
from tuneproof.recipes.variants import config_diff, describe
from tuneproof.registry import Registry, RunRecord
from tuneproof.study import STUDY_FILE, is_tracker_key, resolved_config
from tuneproof.tracking import attach
from tuneproof.training.health import HealthFault
from tuneproof.training.resume_state import check_against_metrics, list_checkpoints, load_checkpoint, step_of
from tuneproof.ui import console, user_text


def _refuse_status(rec: RunRecord, reg: Registry | None = None) -> None:
    if rec.kind != "train":
        raise TuneproofError(f"run {rec.id} is a {rec.kind} run: only train runs are resumed")
    if rec.status == "completed":
        raise TuneproofError(
            f"run {rec.id} is completed: there is nothing to resume",
            hint=f"to train longer, make a variant: tuneproof train --from {rec.id} --set training.max_steps=N",
        )
    if rec.status == "invalid":
        raise TuneproofError(
            f"run {rec.id} is invalid ({rec.reason}): an invalid run is not continued",
            hint="start a new run (or a variant with --from) once the cause is fixed",
        )
    if rec.status == "running":
        where = f" ({reg.where_running(rec.id)})" if reg is not None else " in a live process"
        raise TuneproofError(
            f"run {rec.id} is still running{where}",
            hint=f"stop it first (Ctrl-C or SIGTERM writes a checkpoint); if its machine is gone: "
            f"tuneproof runs mark-interrupted {rec.id} --why '...'",
        )
    if reg is not None:
        _refuse_live(rec, reg.runs_dir / rec.id)


def _refuse_live(rec: RunRecord, run_dir: Path) -> None:
    """Refuse while a process of the run's last launch still lives on this host (torchrun or a rank that
    outlived its launcher, ``proc-<name>.json``): a resume then would write the same run twice.

    Raises:
        TuneproofError: naming each live process and how to stop it (exit 2).
    """
    live = procs.live_processes(run_dir)
    if live:
        names = ", ".join(f"{p['name']} (pid {p['pid']})" for p in live)
        raise TuneproofError(
            f"run {rec.id} is {rec.status}, but processes of its last launch still run on this host: {names}",
            hint="wait for them to end, or stop them: kill -TERM " + " ".join(str(p["pid"]) for p in live),
        )


def find_checkpoint(run_dir: Path, checkpoint: str | None) -> Path:
    """The checkpoint to resume from: ``checkpoint`` (a name in the run's ``checkpoints/`` or a
    path), else the latest ``step-*`` entry (which :func:`load_checkpoint` may still refuse).

    Raises:
        TuneproofError: no checkpoint (with the step of the first periodic one), or the named one is missing.
    """
    folder = run_dir / "checkpoints"
    if checkpoint:
        path = Path(checkpoint)
        if not path.is_absolute() and not path.exists():
            path = folder / checkpoint
        if not path.exists():
            have = ", ".join(p.name for p in list_checkpoints(run_dir)) or "none"
            raise TuneproofError(f"{path}: checkpoint not found", hint=f"checkpoints of this run: {have}")
        return path
    ckpts = list_checkpoints(run_dir)
    if not ckpts:
        raise TuneproofError(
            f"{folder}: no checkpoint (step-*) to resume from",
            hint="the run stopped before its first checkpoint (training.checkpoint_every); start it again",
        )
    return ckpts[-1]


def _load(run_dir: Path, path: Path) -> dict[str, Any]:
    """A checkpoint loaded (hashes, its step cross-checked) and checked against the run's metrics."""
    ckpt = load_checkpoint(path)
    check_against_metrics(run_dir, path, ckpt)
    return ckpt


def load_with_fallback(run_dir: Path, first: Path, *, fallback: bool) -> tuple[Path, dict[str, Any], list[str]]:
    """Load (and sha256-verify) ``first``; with ``fallback``, when it is refused, the next older
    checkpoint of the run that loads, newest first.

    Returns ``(path, checkpoint, skipped)`` where ``skipped`` lists ``"<name>: <why>"`` of the
    refused ones.

    Raises:
        TuneproofError: ``first`` is refused and ``fallback`` is off, or no checkpoint is valid
            (every one is named with its reason).
    """
    try:
        return first, _load(run_dir, first), []
    except TuneproofError as err:
        if not fallback:
            raise TuneproofError(
                err.message,
                hint=(err.hint or "")
                + ("; " if err.hint else "")
                + "`tuneproof resume RUN --fallback` continues from the newest valid older checkpoint",
            ) from None
        skipped = [f"{first.name}: {err.message}"]
    limit = step_of(first)
    for path in reversed(list_checkpoints(run_dir)):
        if path.resolve() == first.resolve() or (limit is not None and (step_of(path) or 0) >= limit):
            continue
        try:
            return path, _load(run_dir, path), skipped
        except TuneproofError as err:
            skipped.append(f"{path.name}: {err.message}")
    raise TuneproofError(
        "no valid checkpoint to fall back to:\n  " + "\n  ".join(skipped), hint="start the run again (tuneproof train)"
    )


def check_config(study_dir: Path, rec: RunRecord, run_dir: Path, ckpt: dict[str, Any], ckpt_path: Path) -> None:
    """Refuse when the run's config or (for a run made from the study file) the study file differs
    from the checkpoint's config.

    Raises:
        TuneproofError: lists the keys that differ and says what to do.
    """
    # both sides with defaults filled: a key added since the checkpoint (with its default) is no change
    saved = resolved_config(parse_study(ckpt["config"], ckpt_path / "state.json"))
    recorded = resolved_config(parse_study(read_json(run_dir / "config.json"), run_dir / "config.json"))
    diff = config_diff(saved, recorded)
    if diff:
        raise TuneproofError(
            f"{run_dir / 'config.json'} differs from the config of {ckpt_path.name}: {describe(diff)}",
            hint="the run folder was edited or the checkpoint belongs to another run; restore it",
        )
    if not (run_dir / "variant.json").exists():
        current = resolved_config(load_study(study_dir))
        # a tracker added or changed since (tracking.*, report_to) changes where copies go, not the run
        diff = [d for d in config_diff(saved, current) if not is_tracker_key(d["key"])]
        if diff:
            raise TuneproofError(
                f"{study_dir / STUDY_FILE} changed since the checkpoint of {rec.id}: {describe(diff)}",
                hint=f"resume continues the recorded config exactly: revert the change, or train a variant "
                f"(tuneproof train --from {rec.id} --set KEY=VALUE)",
            )


def check_inputs(rec: RunRecord, ckpt: dict[str, Any], ckpt_path: Path, ctx) -> None:
    """Refuse when the data fingerprint, the base model's weight/config sha256 or its revision
    differs from the checkpoint's.

    Raises:
        TuneproofError: names both fingerprints or revisions and what to do.
    """
    for key in ("data_fingerprint", "base_revision"):
        if key not in ckpt:
            raise TuneproofError(
                f"{ckpt_path}: checkpoint has no '{key}'", hint="it is damaged or was not written by `tuneproof train`"
            )
    fp = ctx.data_fingerprint()["hash"]
    if fp != ckpt["data_fingerprint"]:
        raise TuneproofError(
            f"the data changed since the checkpoint of {rec.id}: fingerprint "
            f"{ckpt['data_fingerprint'][:16]} -> {fp[:16]}",
            hint="restore the data the run was trained on (see runs/<id>/data.json), or start a new run",
        )
    problems = compare_base(ckpt.get("base") or {}, ctx.base)
    if problems:
        raise TuneproofError(
            f"the base model {ctx.base.path} changed since the checkpoint of {rec.id}: " + "; ".join(problems),
            hint="restore the exact base weights the run started from (or `tuneproof "
            "--rehash resume` if the hash cache is stale)",
        )
    if ctx.base.revision != ckpt["base_revision"]:
        raise TuneproofError(
            f"the base model changed since the checkpoint of {rec.id}: revision "
            f"{ckpt['base_revision']} -> {ctx.base.revision}",
            hint=f"point model.base at the revision the run started from ({ckpt['base_revision']})",
        )


def run_resume(
    study_dir: str | Path,
    data_root: str | Path | None,
    run_id: str,
    *,
    checkpoint: str | None = None,
    fallback: bool = False,
    launch: dict[str, Any] | None = None,
) -> str:
    """Continue ``run_id`` from its checkpoint; returns the run id. ``fallback``: when the
    checkpoint is refused (altered, damaged, not a checkpoint folder), use the newest valid older one.
    ``launch``: ``{"nproc", "nnodes", "node_rank", "rdzv_endpoint"}`` (default one process); the
    world size must be the checkpoint's.

    Raises:
        TuneproofError: see the module docstring; nothing is written when refused.
        HealthFault: a health rule fired after the resume (the run is marked invalid).
    """
    study_dir = Path(study_dir).resolve()
    reg = Registry(study_dir)  # marks runs of dead processes interrupted first
    rec = reg.get(run_id)
    _refuse_status(rec, reg)
    run_dir = reg.runs_dir / rec.id
    ckpt_path = find_checkpoint(run_dir, checkpoint)
    ckpt_path, ckpt, skipped = load_with_fallback(run_dir, ckpt_path, fallback=fallback)
    for line in skipped:
        console.print(f"[yellow]skipped[/] {user_text(line)}", soft_wrap=True)
    check_config(study_dir, rec, run_dir, ckpt, ckpt_path)
    ctx = StudyContext.open(study_dir, data_root, config=ckpt["config"])
    check_inputs(rec, ckpt, ckpt_path, ctx)
    try:  # the trackers the study file names now (one added since the checkpoint included)
        tracked = load_study(study_dir)
    except TuneproofError:  # a variant's study file may have moved on: its own config names them
        tracked = ctx.study
    attach(reg, tracked, study_dir, ctx.config)
    step = int(ckpt["step"])
    launch = launch or {"nproc": 1, "nnodes": 1, "node_rank": 0, "rdzv_endpoint": None}
    world_size = int(launch["nproc"]) * int(launch["nnodes"])
    saved_ws = int(ckpt["data"].get("world_size", 1))
    if saved_ws != world_size:
        raise TuneproofError(
            f"{ckpt_path.name} of {rec.id} was trained by {saved_ws} process(es); this resume asks for {world_size}",
            hint="resume with the same world size (--nproc-per-node x --nnodes = "
            f"{saved_ws}): each rank's data order depends on it",
        )
    layout = None
    if world_size > 1:
        layout = check_launch(ctx, int(launch["nproc"]), int(launch["nnodes"]))
    console.print(
        # the reason may quote a recorded error (a gloo message "[/pytorch/...gloo...]"): shown, never parsed as markup
        f"resume [bold]{rec.id}[/] ({rec.status}{': ' + user_text(rec.reason) if rec.reason else ''}) "
        f"from {user_text(ckpt_path.name)}: step {step} of {ckpt['total_steps']}",
        soft_wrap=True,
    )
    try:
        with reg.reopen(rec.id, note=f"resume from {ckpt_path.name} (step {step})") as run:
            for line in skipped:
                run.note(f"resume --fallback skipped {line}")
            run.metric(event="resume", from_step=step, checkpoint=ckpt_path.name)
            resumes = list(run.summary.get("resumes", []))
            resumes.append(
                {
                    "from_step": step,
                    "checkpoint": ckpt_path.name,
                    "skipped": skipped,
                    "previous_status": rec.status,
                    "previous_reason": rec.reason,
                    "time": round(clock.now(), 3),
                }
            )
            run.update_summary(resumes=resumes)
            if layout is not None:
                launch_ranks(ctx, run, layout, launch, resume_path=ckpt_path)
            else:
                run_train(ctx, run=run, resume_from=ckpt)
    except (HealthFault, HealthOnRank) as fault:
        reg.invalidate(rec.id, fault.reason)
        raise
    return rec.id
