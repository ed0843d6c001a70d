"""The ``tuneproof`` command line (Typer). One plain, typed function per command; each delegates
to a recipe in :mod:`tuneproof.recipes`. User-caused errors print one or two lines and exit 2
(3 when a protocol check failed); Ctrl-C exits 130 and SIGTERM 143 (128 + signal number), with
the run marked interrupted; a fault of the machine (disk full, read-only folder) prints one line
naming the folder and the cause and exits 2. Output to a closed pipe (``tuneproof runs | head -1``)
is dropped: the command's work and its run are not failed by it.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import typer
import typer.core

from tuneproof.errors import TuneproofError
from tuneproof.ui import console, json_stdout, print_json, user_text

#: an error message quotes the user's values (paths, keys, rows): shown through user_text, cut after this
ERROR_LIMIT = 10_000

#: `tuneproof --help` lists commands in the order of the protocol (docs/PROTOCOL.md steps), tools last
PROTOCOL_ORDER = (
    "init",
    "data",
    "baseline",
    "env",
    "preflight",
    "train",
    "resume",
    "eval",
    "compare",
    "show",
    "test",
    "export",
    "verify",
    "report",
    "plan",
    "rental",
    "runs",
    "registry",
    "invalidate",
    "track",
    "sync",
    "restore",
    "quickstart",
    "schema",
)


class _ProtocolOrder(typer.core.TyperGroup):
    def list_commands(self, ctx) -> list[str]:  # noqa: ARG002
        rank = {name: i for i, name in enumerate(PROTOCOL_ORDER)}
        return sorted(self.commands, key=lambda name: (rank.get(name, len(rank)), name))


_typer_type_column = typer.core.TyperOption.display_type_rich


def _flag_type_column(self, ctx) -> str | None:
    """A flag's help reads as a flag: ``--merge`` and its help, without Typer's ``<bool>`` type
    column (a flag takes no value; tests/test_cli_screen.py)."""
    return None if self.is_flag else _typer_type_column(self, ctx)


typer.core.TyperOption.display_type_rich = _flag_type_column  # every option Typer builds, --help included

app = typer.Typer(
    cls=_ProtocolOrder,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Make a fine-tuning experiment provably sound: baseline, data checks, "
    "preflight, runs, paired comparison, bound export, dossier.",
)
data_app = typer.Typer(
    no_args_is_help=True, help="Data protocol: versions, splits, duplicates, audits, token-level inspection."
)
app.add_typer(data_app, name="data")
runs_app = typer.Typer(
    invoke_without_command=True,
    help="Every run, failed, interrupted and invalid ones included; `runs mark-interrupted`.",
)
app.add_typer(runs_app, name="runs")
registry_app = typer.Typer(
    no_args_is_help=True, help="The run registry (tuneproof.sqlite): rebuild it from the run folders."
)
app.add_typer(registry_app, name="registry")


def _study_folder(value: Path) -> Path:
    """``--study``: the study folder; its study file names the folder too (``--study s/tuneproof.yaml``)."""
    if value.name == "tuneproof.yaml" and value.is_file():
        return value.parent
    if value.exists() and not value.is_dir():
        raise TuneproofError(
            f"--study {value}: a file, not a study folder", hint="name the folder that holds tuneproof.yaml"
        )
    return value


StudyOpt = typer.Option(Path("."), "--study", "-s", help="study folder (holds tuneproof.yaml)", callback=_study_folder)
EditedHypothesisOpt = typer.Option(
    None,
    "--use-edited-hypothesis",
    metavar="REASON",
    help="judge against the study file's edited hypothesis instead of the one frozen with the first "
    "train run; the reason is recorded (compare.json, dossier, export bundle)",
)
DataOpt = typer.Option(
    None,
    "--data",
    help="data root holding banking77/ and snips/ (else $TUNEPROOF_DATA, ../shared/data, cache, download)",
)
NprocOpt = typer.Option(
    None,
    "--nproc-per-node",
    help="processes on this machine (GPUs, or CPU cores with gloo): train under torchrun with distributed.strategy",
)
NnodesOpt = typer.Option(1, "--nnodes", help="machines taking part (each runs the same command with its --node-rank)")
NodeRankOpt = typer.Option(0, "--node-rank", help="this machine's rank among --nnodes (0 creates and records the run)")
RdzvOpt = typer.Option(None, "--rdzv-endpoint", help="HOST:PORT of node 0 for --nnodes > 1 (torchrun rendezvous)")


UseReserveOpt = typer.Option(
    None,
    "--use-reserve",
    metavar="REASON",
    help="run even though the rental's estimate passes into the reserve kept for evaluation and export; "
    "the reason is recorded (rental.json, the run, the dossier)",
)


def _rental(study: Path, command: str, override: str | None, **kw):
    """The rental's hold on a command that spends hours (a no-op without ``rental.json``)."""
    if override is None and not (Path(study) / "rental.json").exists():  # no window: nothing to import or check
        return _nothing()
    from tuneproof.recipes.rental import spend  # noqa: PLC0415

    return spend(study, command, override=override, **kw)


def _distributed(nproc: int | None, nnodes: int) -> bool:
    return (nproc is not None and nproc > 1) or nnodes > 1


@app.callback()
def _global(
    rehash: bool = typer.Option(
        False,
        "--rehash",
        help="recompute the sha256 of base model files instead of using the hash cache (by path, size, mtime)",
    ),
) -> None:
    """Global options (before the command: tuneproof --rehash resume r0003)."""
    if rehash:
        import os  # noqa: PLC0415

        os.environ["TUNEPROOF_REHASH"] = "1"  # inherited by the fresh verify process


def _to_uri(to: str | None) -> str | None:
    """``--to URI`` checked by the rule of ``storage.remote`` (:func:`tuneproof.study.remote_uri`)."""
    if to is None:
        return None
    from tuneproof.study import remote_uri  # noqa: PLC0415 - the study schema loads with the command

    try:
        return remote_uri(to)
    except ValueError as err:
        raise TuneproofError(
            f"--to: {err}", hint="give the store as s3://bucket/prefix, sftp://host/path or file:///path"
        ) from None


def _ctx(study: Path, data: Path | None = None):
    from tuneproof.context import StudyContext  # noqa: PLC0415

    return StudyContext.open(study, data)


@app.command()
def init(
    directory: Path = typer.Argument(..., help="folder to create the study in"),
    task: str = typer.Option(
        "extraction", "--task", help="classification | multi-label | extraction | format | image-classification"
    ),
    force: bool = typer.Option(False, help="overwrite an existing tuneproof.yaml"),
) -> None:
    """Write DIRECTORY/tuneproof.yaml from the template of the task kind."""
    from tuneproof.recipes.init import reader_lines, run_init  # noqa: PLC0415

    path = run_init(directory, task, force=force)
    console.print(f"wrote {user_text(path)}; edit the hypothesis and guards before the first run")
    for line in reader_lines(task):
        console.print(user_text(line), soft_wrap=True)
    console.print(f"next: tuneproof data check --study {user_text(directory)}")


@app.command()
def schema(
    out: Path | None = typer.Option(None, "--out", help="write the JSON Schema to this file instead of printing it"),
    docs: Path | None = typer.Option(
        None, "--docs", help="write the generated key tables into this reference (docs/study-file.md) in place"
    ),
) -> None:
    """The JSON Schema of tuneproof.yaml (draft 2020-12), for editors that validate and complete it."""
    from tuneproof.recipes.schema import schema_text, write_reference, write_schema  # noqa: PLC0415

    if docs is not None:
        changed = write_reference(docs)
        console.print(f"{'wrote' if changed else 'unchanged:'} {user_text(docs)}")
    if out is not None:
        write_schema(out)
        console.print(f"wrote {user_text(out)}")
    if out is None and docs is None:
        sys.stdout.write(schema_text())


SkipDataCheckOpt = typer.Option(
    None, "--skip-data-check", help="go on without a passed data check for this data; give the reason (recorded)"
)


@app.command()
def baseline(
    study: Path = StudyOpt,
    data: Path | None = DataOpt,
    skip_data_check: str | None = SkipDataCheckOpt,
    use_reserve: str | None = UseReserveOpt,
    few_shot: int | None = typer.Option(
        None,
        "--few-shot",
        help="a control run: K training examples (drawn once by eval.seed, stratified by class, recorded in "
        "shots.json) shown as earlier turns before each evaluated one; the same procedure otherwise",
    ),
) -> None:
    """Evaluate the base model on the evaluation split and keep its per-example outputs; refuses when the data check failed."""  # noqa: E501 (the command list prints it as written)
    from tuneproof.recipes.baseline import run_baseline  # noqa: PLC0415

    ctx = _ctx(study, data)
    with _rental(study, "baseline", use_reserve, ctx=ctx):
        run_id = run_baseline(ctx, data_check_override=skip_data_check, few_shot=few_shot)
    what = "baseline" if few_shot is None else f"few-shot control (K={few_shot})"
    console.print(f"{what} run [bold]{run_id}[/] completed")


@app.command()
def train(
    study: Path = StudyOpt,
    data: Path | None = DataOpt,
    name: str | None = typer.Option(None, help="suffix of the run id, e.g. lora-r16"),
    skip_preflight: str | None = typer.Option(
        None, "--skip-preflight", help="train without a passed preflight; give the reason (recorded)"
    ),
    skip_data_check: str | None = SkipDataCheckOpt,
    skip_baseline: str | None = typer.Option(
        None,
        "--skip-baseline",
        help="train without a baseline for this evaluation procedure; give the reason (recorded)",
    ),
    from_run: str | None = typer.Option(
        None, "--from", help="make a variant of this train run (its resolved config + --set/--grid)"
    ),
    set_: list[str] = typer.Option(
        [], "--set", help="with --from: KEY=VALUE change (YAML value), e.g. method.r=16; repeatable"
    ),
    grid: str | None = typer.Option(
        None, "--grid", help="with --from: KEY=V1,V2,... one variant per value, run in sequence"
    ),
    allow_multi_change: bool = typer.Option(
        False, "--allow-multi-change", help="with --from: allow a variant that changes more than one group (flagged)"
    ),
    nproc_per_node: int | None = NprocOpt,
    nnodes: int = NnodesOpt,
    node_rank: int = NodeRankOpt,
    rdzv_endpoint: str | None = RdzvOpt,
    use_reserve: str | None = UseReserveOpt,
) -> None:
    """Train with the study's method (LoRA by default) and record the run; with --from, a variant of a train run.

    The step budget is set in tuneproof.yaml: training.max_steps or training.epochs (one of them),
    with training.micro_batch_size x training.gradient_accumulation_steps examples per optimizer step.
    Needs a passed data check and preflight for this configuration (each runs inline first when missing;
    --skip-data-check / --skip-preflight REASON go without, recorded) and a baseline matching the evaluation procedure.
    """
    from tuneproof.recipes.train_command import TrainCommand, run_train_command  # noqa: PLC0415

    run_train_command(
        study,
        data,
        TrainCommand(
            name=name,
            skip_preflight=skip_preflight,
            skip_data_check=skip_data_check,
            skip_baseline=skip_baseline,
            from_run=from_run,
            sets=set_,
            grid=grid,
            allow_multi_change=allow_multi_change,
            nproc_per_node=nproc_per_node,
            nnodes=nnodes,
            node_rank=node_rank,
            rdzv_endpoint=rdzv_endpoint,
            use_reserve=use_reserve,
        ),
    )


def _nothing():
    import contextlib  # noqa: PLC0415

    return contextlib.nullcontext()


def _require_preflight(ctx, override: str | None) -> str | None:
    try:
        from tuneproof.recipes.preflight import require_preflight  # noqa: PLC0415
    except ImportError:
        return None
    return require_preflight(ctx, override)


@app.command()
def preflight(
    study: Path = StudyOpt,
    data: Path | None = DataOpt,
    memory_budget: str | None = typer.Option(
        None,
        "--memory-budget",
        help="memory one training step may use, e.g. 80GiB, 512MiB, 16GB (default: the GPU's memory, RAM on CPU)",
    ),
    find_max_micro_batch: bool = typer.Option(
        False, "--find-max-micro-batch", help="also find the largest micro-batch whose measured step fits the budget"
    ),
    from_run: str | None = typer.Option(
        None,
        "--from",
        help="preflight the variant of this train run given by --set (what `train --from ... --set ...` will check)",
    ),
    set_: list[str] = typer.Option([], "--set", help="with --from: KEY=VALUE change, repeatable"),
    allow_multi_change: bool = typer.Option(
        False, "--allow-multi-change", help="with --from: allow a change of more than one group"
    ),
    nproc_per_node: int | None = NprocOpt,
    nnodes: int = NnodesOpt,
    node_rank: int = NodeRankOpt,
    rdzv_endpoint: str | None = RdzvOpt,
    use_reserve: str | None = UseReserveOpt,
) -> None:
    """Every check before the rental hours are spent: environment, backend, what is trained, update, step memory, accumulation, checkpointing, smoke pass, throughput."""  # noqa: E501 (the command list prints it as written)
    if _distributed(
        nproc_per_node, nnodes
    ):  # the checks only N processes can make (shares, DDP/FSDP2 step, per-rank memory)
        from tuneproof.recipes.torchrun import run_preflight_distributed  # noqa: PLC0415

        with _rental(study, "preflight", use_reserve, data=data) if node_rank == 0 else _nothing():
            run_id = run_preflight_distributed(
                _ctx(study, data),
                nproc=nproc_per_node or 1,
                nnodes=nnodes,
                node_rank=node_rank,
                rdzv_endpoint=rdzv_endpoint,
            )
        console.print(f"distributed preflight run [bold]{run_id}[/] passed")
        return
    from tuneproof.preflight.environment import parse_memory  # noqa: PLC0415
    from tuneproof.recipes.preflight import run_preflight  # noqa: PLC0415

    budget = parse_memory(memory_budget) if memory_budget is not None else None
    if from_run is not None:
        from tuneproof.recipes.variants import plan_variant, variant_context  # noqa: PLC0415
        from tuneproof.registry import Registry  # noqa: PLC0415

        plan = plan_variant(Registry(study), from_run, set_, allow_multi_change=allow_multi_change)
        ctx = variant_context(study, data, plan)
    elif set_:
        raise TuneproofError("--set needs --from RUN", hint="e.g. tuneproof preflight --from r0004 --set method.r=16")
    else:
        ctx = _ctx(study, data)
    with _rental(study, "preflight", use_reserve, data=data):
        run_id = run_preflight(ctx, memory_budget=budget, find_max_micro_batch=find_max_micro_batch)
    console.print(f"preflight run [bold]{run_id}[/] passed; next: tuneproof train")


@app.command()
def env(json_: bool = typer.Option(False, "--json", help="print the snapshot as JSON")) -> None:
    """What this machine is (Python, torch and its CUDA/ROCm build, devices, libraries), as recorded in every run."""
    from tuneproof.recipes.env import run_env  # noqa: PLC0415

    with json_stdout() if json_ else contextlib.nullcontext():
        run_env(as_json=json_)


@app.command("eval")
def eval_(
    run: str = typer.Argument(..., help="a completed train run"),
    study: Path = StudyOpt,
    data: Path | None = DataOpt,
    use_reserve: str | None = UseReserveOpt,
) -> None:
    """Evaluate a trained run with the baseline's exact procedure."""
    from tuneproof.recipes.evaluate import run_eval  # noqa: PLC0415

    ctx = _ctx(study, data)
    with _rental(study, "eval", use_reserve, ctx=ctx):
        run_id = run_eval(ctx, run)
    console.print(f"eval run [bold]{run_id}[/] completed; next: tuneproof compare {run_id}")


@runs_app.callback()
def runs(
    ctx: typer.Context,
    study: Path = StudyOpt,
    tree: bool = typer.Option(False, "--tree", help="show lineage as a tree"),
    json_: bool = typer.Option(False, "--json", help="print every run record as JSON (for scripts)"),
) -> None:
    """Every run, failed, interrupted and invalid ones included."""
    if ctx.invoked_subcommand is not None:
        return
    from tuneproof.recipes.runs import show_runs  # noqa: PLC0415

    with json_stdout() if json_ else contextlib.nullcontext():
        show_runs(study, tree=tree, as_json=json_)


@runs_app.command("mark-interrupted")
def runs_mark_interrupted(
    run: str = typer.Argument(
        ..., help="a run shown as running whose process is gone (e.g. its machine was restarted)"
    ),
    why: str = typer.Option(..., "--why", help="the reason, recorded with the last heartbeat, host and pid"),
    study: Path = StudyOpt,
) -> None:
    """Mark a running run interrupted now, without waiting for its heartbeat to go stale; a train run can then be resumed."""  # noqa: E501 (the command list prints it as written)
    from tuneproof.registry import Registry  # noqa: PLC0415
    from tuneproof.tracking import attach_study_file  # noqa: PLC0415

    reg = Registry(study)
    attach_study_file(reg, study)  # the trackers get the new status
    rec = reg.mark_interrupted(run, why)
    console.print(
        f"{rec.id}: interrupted ({user_text(rec.reason)})"
        + (f"; next: tuneproof resume {rec.id}" if rec.kind == "train" else ""),
        soft_wrap=True,
    )


@registry_app.command("rebuild")
def registry_rebuild(study: Path = StudyOpt) -> None:
    """Rebuild tuneproof.sqlite from the run folders (runs/*/run.json); the old file is kept as tuneproof.sqlite.damaged-TIME."""  # noqa: E501 (the command list prints it as written)
    from tuneproof.registry import Registry  # noqa: PLC0415

    out = Registry.rebuild(study)
    console.print(
        f"rebuilt {user_text(study / 'tuneproof.sqlite')} from {len(out['runs'])} run folder(s)"
        + (f", {out['test_accesses']} test-split read(s)" if out["test_accesses"] else "")
        + (f"; old index kept as {user_text(out['kept'])}" if out["kept"] else ""),
        soft_wrap=True,
    )
    if out["lost"]:
        console.print(
            f"[yellow]warning[/]: {len(out['lost'])} folder(s) had no readable "
            f"run.json, listed as invalid: {user_text(', '.join(out['lost']))}",
            soft_wrap=True,
        )
    if out["edited"]:
        console.print(
            f"[yellow]warning[/]: {len(out['edited'])} run.json edited after it was written (record_sha256 "
            f"missing or not matching its fields), listed as invalid with the status it claimed: "
            f"{user_text(', '.join(out['edited']))} (`tuneproof runs` gives each reason)",
            soft_wrap=True,
        )
    if out["stale"]:
        console.print(f"found stale and marked interrupted: {', '.join(out['stale'])}")


@app.command()
def resume(
    run: str = typer.Argument(..., help="an interrupted (or failed) train run"),
    study: Path = StudyOpt,
    data: Path | None = DataOpt,
    checkpoint: str | None = typer.Option(
        None, "--checkpoint", help="a checkpoint in runs/RUN/checkpoints/ (step-NNNNNN) or a path (default: the latest)"
    ),
    fallback: bool = typer.Option(
        False,
        "--fallback",
        help="if the checkpoint is refused (sha256 differs, damaged, not a checkpoint "
        "folder), continue from the newest valid older one",
    ),
    nproc_per_node: int | None = NprocOpt,
    nnodes: int = NnodesOpt,
    node_rank: int = NodeRankOpt,
    rdzv_endpoint: str | None = RdzvOpt,
    use_reserve: str | None = UseReserveOpt,
) -> None:
    """Continue an interrupted train run from its checkpoint, in this process, into the same run id."""
    from tuneproof.recipes.resume import run_resume  # noqa: PLC0415

    launch = {"nproc": nproc_per_node or 1, "nnodes": nnodes, "node_rank": node_rank, "rdzv_endpoint": rdzv_endpoint}
    with _rental(study, "resume", use_reserve, data=data, run=run) if node_rank == 0 else _nothing():
        run_id = run_resume(study, data, run, checkpoint=checkpoint, fallback=fallback, launch=launch)
    console.print(f"train run [bold]{run_id}[/] completed; next: tuneproof eval {run_id}")
    if run_id is not None:
        from tuneproof.registry import trained_paths_line  # noqa: PLC0415

        console.print(user_text(trained_paths_line(study, run_id)), soft_wrap=True)


@app.command()
def invalidate(
    run: str,
    why: str = typer.Option(..., "--why", help="the reason, shown in runs and the dossier"),
    study: Path = StudyOpt,
) -> None:
    """Mark a run invalid (it stays listed, with the reason)."""
    from tuneproof.registry import Registry  # noqa: PLC0415
    from tuneproof.tracking import attach_study_file  # noqa: PLC0415

    reg = Registry(study)
    attach_study_file(reg, study)  # the trackers get the new status
    rec = reg.invalidate(run, why)
    console.print(f"{rec.id}: invalid ({user_text(rec.reason)})", soft_wrap=True)


@app.command()
def compare(
    runs: list[str] = typer.Argument(..., help="candidate eval runs (or train runs with an eval)"),
    against: str | None = typer.Option(None, "--against", help="baseline run (default: the latest completed baseline)"),
    allow_different_procedure: bool = typer.Option(
        False, "--allow-different-procedure", help="compare anyway (marked in the result)"
    ),
    use_edited_hypothesis: str | None = EditedHypothesisOpt,
    study: Path = StudyOpt,
    json_: bool = typer.Option(
        False,
        "--json",
        help="print the comparison (compare.json with the run id) as JSON instead of the screen (for scripts)",
    ),
) -> None:
    """Candidates vs the baseline, paired per example; guards and success criterion judged (frozen hypothesis)."""
    from tuneproof.recipes.compare import run_compare  # noqa: PLC0415

    ctx = _ctx(study)
    quiet = console.quiet
    console.quiet = quiet or json_  # the screen is off; stdout carries only the JSON (json_stdout)
    try:
        with json_stdout() if json_ else contextlib.nullcontext():
            run_id = run_compare(
                ctx,
                runs,
                against=against,
                allow_different_procedure=allow_different_procedure,
                use_edited_hypothesis=use_edited_hypothesis,
            )
            verdict = ctx.registry.get(run_id).summary.get("verdict")
            if json_:
                from tuneproof.io import read_json  # noqa: PLC0415

                print_json({"run": run_id, **read_json(ctx.registry.runs_dir / run_id / "compare.json")})
    finally:
        console.quiet = quiet
    if verdict == "fail":  # the comparison ran; the hypothesis did not hold: a failed protocol check
        if not json_:
            console.print(f"compare run [bold]{run_id}[/]: verdict fail (exit 3)")
        raise typer.Exit(3)


@app.command("test")
def test_(
    run: str = typer.Argument(..., help="a completed train run, or 'base'"),
    study: Path = StudyOpt,
    data: Path | None = DataOpt,
    use_edited_hypothesis: str | None = EditedHypothesisOpt,
    use_reserve: str | None = UseReserveOpt,
) -> None:
    """Evaluate on the reserved test split; every access is logged and reuse is stated."""
    from tuneproof.recipes.test_read import run_test  # noqa: PLC0415

    ctx = _ctx(study, data)
    with _rental(study, "test", use_reserve, ctx=ctx):
        run_test(ctx, run, use_edited_hypothesis=use_edited_hypothesis)


@app.command()
def show(
    run: str,
    regressed: bool = typer.Option(
        False, "--regressed", help="examples the candidate broke (right in the baseline, wrong now)"
    ),
    fixed: bool = typer.Option(False, "--fixed", help="examples the candidate fixed"),
    category: str | None = typer.Option(None, "--class", help="only this class / intent"),
    field: str | None = typer.Option(
        None, "--field", help="only examples whose reference or prediction has this field"
    ),
    against: str | None = typer.Option(None, "--against", help="baseline run"),
    limit: int = typer.Option(20, help="rows to show"),
    study: Path = StudyOpt,
    json_: bool = typer.Option(False, "--json", help="print the selected examples as JSON (for scripts)"),
) -> None:
    """Per-example outputs of an evaluation run, filtered."""
    from tuneproof.recipes.show import run_show  # noqa: PLC0415

    with json_stdout() if json_ else contextlib.nullcontext():
        run_show(
            _ctx(study),
            run,
            regressed=regressed,
            fixed=fixed,
            category=category,
            field=field,
            against=against,
            limit=limit,
            as_json=json_,
        )


@data_app.command("check")
def data_check(study: Path = StudyOpt, data: Path | None = DataOpt, use_reserve: str | None = UseReserveOpt) -> None:
    """Versions, splits, duplicates, label/field audits, lengths; exits 3 on hard faults."""
    from tuneproof.recipes.data_check import run_data_check  # noqa: PLC0415

    ctx = _ctx(study, data)
    with _rental(study, "data-check", use_reserve, ctx=ctx):
        run_data_check(ctx)


@data_app.command("inspect")
def data_inspect(
    study: Path = StudyOpt,
    data: Path | None = DataOpt,
    n: int = typer.Option(
        3,
        "-n",
        min=1,
        help="examples per category (in total when the examples have no category); the longest is one of them",
    ),
    split: str = typer.Option("train", help="split to inspect (not the reserved test split)"),
    html: bool = typer.Option(False, "--html", help="write one self-contained HTML page instead"),
    out: Path | None = typer.Option(None, help="HTML path (default: STUDY/inspect.html)"),
) -> None:
    """Examples per category after the exact preprocessing: tokens, ids, supervised positions, truncation."""
    from tuneproof.recipes.inspect import run_inspect  # noqa: PLC0415

    ctx = _ctx(study, data)
    run_inspect(ctx, n, split, (out or ctx.study_dir / "inspect.html") if html else None)


@app.command()
def export(
    run: str = typer.Argument(..., help="a completed train run"),
    study: Path = StudyOpt,
    data: Path | None = DataOpt,
    merge: bool = typer.Option(
        False, "--merge", help="also write merged/: the base with the adapter merged in (safetensors)"
    ),
    force: bool = typer.Option(
        False,
        "--force",
        help="export a failed, interrupted or invalid run anyway (recorded in the manifest and model card)",
    ),
    out: Path | None = typer.Option(None, "--out", help="bundle folder (default: exports/RUN in the study)"),
    verify_examples: int = typer.Option(
        8, "--verify-examples", help="K evaluation examples stored with their predictions for verify"
    ),
    device: str = typer.Option(
        "cpu", "--device", help="cpu | cuda: where the stored predictions are made (verify must use the same)"
    ),
    use_edited_hypothesis: str | None = EditedHypothesisOpt,
    to: str | None = typer.Option(
        None, "--to", metavar="URI", help="then upload the bundle there and check every sha256 read back"
    ),
) -> None:
    """Export a train run as a bundle bound to its exact base model, verified in a fresh process."""
    from tuneproof.recipes.export import run_export  # noqa: PLC0415

    to = _to_uri(to)  # a mistyped URI is refused before the export's minutes are spent
    ctx = _ctx(study, data)
    with _rental(study, "export", None, ctx=ctx):  # never refused: the reserve is kept for it
        export_id = run_export(
            ctx,
            run,
            force=force,
            out_dir=out,
            merge=merge,
            k=verify_examples,
            device=device,
            use_edited_hypothesis=use_edited_hypothesis,
        )
    if to is not None:
        from tuneproof.recipes.sync import send_export  # noqa: PLC0415

        send_export(ctx, export_id, to)


@app.command()
def verify(
    bundle: Path = typer.Argument(..., help="an export bundle folder (exports/RUN)"),
    base: Path | None = typer.Option(
        None, "--base", help="the base model folder to check and load (default: the path recorded at export)"
    ),
    json_out: Path | None = typer.Option(None, "--json", help="write the full report to this JSON file"),
    device: str | None = typer.Option(None, "--device", help="cpu | cuda (default: the device the export recorded)"),
) -> None:
    """Check a bundle in a fresh process: file hashes, base weights and tokenizer, reload, predictions."""
    from tuneproof.recipes.verify import run_verify  # noqa: PLC0415

    run_verify(bundle, base, json_out=json_out, device=device)


@app.command()
def report(
    study: Path = StudyOpt,
    html: bool = typer.Option(False, "--html", help="also write dossier.html: one self-contained page with plots"),
    use_edited_hypothesis: str | None = EditedHypothesisOpt,
) -> None:
    """Write the dossier (dossier.md, and dossier.html with --html) from the recorded evidence."""
    from tuneproof.recipes.report import HTML_FILE, run_report  # noqa: PLC0415

    path = run_report(_ctx(study), html=html, use_edited_hypothesis=use_edited_hypothesis)
    console.print(f"dossier: {user_text(path)}" + (f" and {user_text(path.with_name(HTML_FILE))}" if html else ""))


@app.command()
def plan(
    days: float = typer.Option(..., "--days", help="rental length in days (3, 7 or 30 usually)"),
    hourly_rate: float | None = typer.Option(
        None, "--hourly-rate", help="price of one hour of the machine (adds the cost; without it: hours only)"
    ),
    variants: int | None = typer.Option(None, "--variants", help="variants to plan for (default: as many as fit)"),
    study: Path = StudyOpt,
) -> None:
    """The rental plan from this study's measured throughput: phases, variants that fit, cost."""
    from tuneproof.recipes.plan import run_plan  # noqa: PLC0415

    run_plan(_ctx(study), days=days, hourly_rate=hourly_rate, variants=variants)


rental_app = typer.Typer(
    no_args_is_help=True,
    help="The rental window, held to its plan: start, status, deliver (a verified export before the end).",
)
app.add_typer(rental_app, name="rental")


@rental_app.command("start")
def rental_start(
    days: float = typer.Option(..., "--days", help="rental length in days (3, 7 or 30 usually)"),
    ends: str | None = typer.Option(
        None, "--ends", metavar="ISO-TIME", help="when the rental ends, e.g. 2026-12-05T12:00Z (default: now + days)"
    ),
    study: Path = StudyOpt,
) -> None:
    """Record the rental window in the study, with the plan at this moment and where each rate came from."""
    from tuneproof.recipes.rental import run_start  # noqa: PLC0415

    run_start(_ctx(study), days=days, ends=ends)


@rental_app.command("status")
def rental_status(
    study: Path = StudyOpt,
    json_: bool = typer.Option(False, "--json", help="print the status as JSON (for scripts)"),
) -> None:
    """Each phase planned vs used, hours left, the reserve still needed, the next protocol step."""
    from tuneproof.recipes.rental import run_status  # noqa: PLC0415

    with json_stdout() if json_ else contextlib.nullcontext():
        run_status(_ctx(study), as_json=json_)


@rental_app.command("deliver")
def rental_deliver(
    study: Path = StudyOpt,
    data: Path | None = DataOpt,
    run: str | None = typer.Option(None, "--run", help="the train run to deliver (default: the best passed candidate)"),
    html: bool = typer.Option(False, "--html", help="also write dossier.html"),
    to: str | None = typer.Option(
        None, "--to", metavar="URI", help="then upload bundle + dossier there and check every sha256 read back"
    ),
) -> None:
    """Export the best passed candidate, verify the bundle in a fresh process, write the dossier, in that order."""
    from tuneproof.recipes.rental import run_deliver  # noqa: PLC0415

    to = _to_uri(to)  # a mistyped URI is refused before the export's minutes are spent
    run_deliver(_ctx(study, data), run=run, html=html, to=to)


@app.command()
def quickstart(
    directory: Path = typer.Option(Path("quickstart-study"), "--dir", help="study folder to create"),
    data: Path | None = DataOpt,
    fast: bool = typer.Option(
        False,
        "--fast",
        help="a wiring test: tiny subset, few steps and the full preflight (most of the minutes); no gain expected",
    ),
    preflight: bool = typer.Option(
        False, "--preflight", help="also run the full preflight before training (adds minutes on a CPU)"
    ),
    task: str = typer.Option(
        "extraction", "--task", help="extraction (SNIPS + SmolLM2 + LoRA) or image-classification (digits + ViT)"
    ),
    speedups: str = typer.Option(
        "auto",
        "--speedups",
        help="training.speedups of the study written: auto (each checked speed-up that applies here) or off",
    ),
) -> None:
    """The whole protocol on real data: SNIPS extraction to JSON with SmolLM2-135M-Instruct + LoRA, or
    (--task image-classification) handwritten digits with a small ViT."""
    from tuneproof.recipes.quickstart import run_quickstart  # noqa: PLC0415

    run_quickstart(directory, data, fast=fast, preflight=preflight, task=task, speedups=speedups)


@app.command()
def sync(
    study: Path = StudyOpt,
    wait: bool = typer.Option(False, "--wait", help="retry an unreachable store until it answers (Ctrl-C stops)"),
    take_over: bool = typer.Option(
        False, "--take-over", help="take the remote prefix over from another host (that machine is gone)"
    ),
) -> None:
    """Send what the remote copy (storage.remote) lacks; say what is safe off this machine and what is local only."""
    from tuneproof.recipes.sync import run_sync  # noqa: PLC0415

    run_sync(_ctx(study), wait=wait, take_over=take_over)


@app.command()
def restore(
    uri: str = typer.Argument(..., help="the remote copy: s3://bucket/prefix, sftp://user@host/path, file:///path"),
    directory: Path | None = typer.Argument(None, help="a new folder (default: the prefix's last name, here)"),
) -> None:
    """Download a study's remote copy into a new folder, check every sha256 the records hold, rebuild the registry."""
    from tuneproof.recipes.restore import run_restore  # noqa: PLC0415

    run_restore(uri, directory)


track_app = typer.Typer(
    no_args_is_help=True, help="Experiment trackers (tracking.* / report_to in the study): MLflow, W&B, Trackio."
)
app.add_typer(track_app, name="track")


@track_app.command("sync")
def track_sync(
    study: Path = StudyOpt,
    all_: bool = typer.Option(False, "--all", help="mirror every ended run again, not only pending ones"),
) -> None:
    """Mirror the runs the trackers have not received yet (a tracker was down) to every tracker."""
    from tuneproof.tracking import sync, trackers_for  # noqa: PLC0415

    ctx = _ctx(study)
    trackers = trackers_for(ctx.study, ctx.study_dir)
    if not trackers:
        raise TuneproofError(
            f"{ctx.study_dir / 'tuneproof.yaml'}: no tracker set",
            hint="add tracking: {mlflow: {uri: sqlite:///mlflow.db}} or report_to: [mlflow]",
        )
    down: dict[str, str] = {}
    done = sync(trackers, ctx.registry, only_pending=not all_, down=down)
    console.print(
        f"mirrored {len(done['mirrored'])} run(s) to {', '.join(t.name for t in trackers)}"
        + (f"; still pending: {', '.join(done['pending'])}" if done["pending"] else ""),
        soft_wrap=True,
        markup=False,
    )
    for name, error in down.items():
        console.print(f"{name}: {user_text(error, one_line=True)}")
    if done["pending"]:
        sys.exit(2)


class _PipeSafe:
    """``sys.stdout`` that survives a closed pipe: on ``BrokenPipeError`` the rest of the output
    goes to ``/dev/null`` (Python's documented recipe: dup2 devnull onto the descriptor, so the
    final flush at exit does not fail either) and the command goes on."""

    def __init__(self, stream):
        self._stream = stream
        self.broken = False

    def write(self, text):
        if self.broken:
            return len(text)
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._drop()
            return len(text)

    def flush(self):
        if self.broken:
            return
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._drop()

    def _drop(self):
        import os  # noqa: PLC0415

        self.broken = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _on_sigterm(signum, frame):  # noqa: ARG001
    from tuneproof.errors import Terminated  # noqa: PLC0415

    raise Terminated(f"signal {signum}")


def _machine_fault(err: BaseException) -> TuneproofError | None:
    """A one-line error for a fault of the machine or a damaged index met outside a run."""
    import sqlite3  # noqa: PLC0415

    from tuneproof.io import fault_cause, fault_message  # noqa: PLC0415

    cause = fault_cause(err)
    if cause is not None:
        return TuneproofError(
            fault_message(err, cause), hint="free space or make the folder writable, then run the command again"
        )
    if isinstance(err, sqlite3.DatabaseError) and not isinstance(err, sqlite3.OperationalError):
        return TuneproofError(
            f"the run registry (tuneproof.sqlite in the study folder) is damaged ({err})",
            hint="rebuild it from the run folders: tuneproof registry rebuild",
        )
    return None


def main(argv: list[str] | None = None) -> None:
    """Console entry point: runs the app and turns user errors into short messages + exit codes."""
    import logging  # noqa: PLC0415
    import os  # noqa: PLC0415
    import signal  # noqa: PLC0415
    import warnings  # noqa: PLC0415

    from tuneproof.errors import Terminated  # noqa: PLC0415

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    # bitsandbytes (imported by PEFT for every LoRA run once installed) warns at import on an AVX512-BF16
    # CPU that it could not fetch a kernel from the hub ("pip install kernels"): noise, and tuneproof
    # downloads no code at run time
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    try:
        from transformers.utils import logging as hf_logging  # noqa: PLC0415

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except Exception:  # noqa: BLE001
        pass
    wrapped = None
    if not isinstance(sys.stdout, _PipeSafe):
        sys.stdout = wrapped = _PipeSafe(sys.stdout)
    old_term = None
    try:
        old_term = signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread
        pass
    try:
        code = _main(argv, Terminated)
        _close_storage()
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
        if wrapped is not None and sys.stdout is wrapped:
            if not wrapped.broken:
                sys.stdout = wrapped._stream  # noqa: SLF001
    if argv is None:  # the console command, not a caller in the same process (tests)
        _quiet_shutdown(code)
    sys.exit(code)


def _close_storage() -> None:
    """The remote copy's last push and its one line (storage.remote), before the interpreter shuts down."""
    from tuneproof import storage  # noqa: PLC0415

    try:
        storage.close_all()
    except (KeyboardInterrupt, Exception) as err:  # noqa: BLE001 - the command's result stands
        print(
            f"warning: the remote copy's last push was cut short ({type(err).__name__}); tuneproof sync",
            file=sys.stderr,
        )


def _quiet_shutdown(code: int) -> None:
    """From here to the end of the process, a Ctrl-C ends it at once with ``code`` and one line, instead of
    interrupting the interpreter's shutdown (the atexit callbacks of torch, MLflow or concurrent.futures,
    the join of their threads), which Python prints as a traceback ("Exception ignored in atexit
    callback"). The run was recorded already: nothing is left to save."""
    import os  # noqa: PLC0415
    import signal  # noqa: PLC0415

    def _now(signum, frame):  # noqa: ARG001
        with contextlib.suppress(OSError):
            os.write(2, b"Ctrl-C again: exiting without waiting for the libraries' cleanup\n")
        os._exit(code)

    with contextlib.suppress(ValueError):  # not the main thread
        signal.signal(signal.SIGINT, _now)


def _say_stopped(argv: list[str] | None, fallback: str) -> None:
    """One line on stderr per run a signal stopped in this command: the run, the signal, the step and
    how to go on (``run r0003 interrupted by SIGTERM at step 3; resume with: tuneproof resume r0003``)."""
    import shlex  # noqa: PLC0415

    from tuneproof import registry  # noqa: PLC0415
    from tuneproof.ui import err_console  # noqa: PLC0415

    command = "tuneproof " + shlex.join(sys.argv[1:] if argv is None else list(argv))
    for line in [s.line(command) for s in registry.STOPPED] or [fallback]:
        err_console.print(user_text(line), soft_wrap=True)  # the command line quotes what the user typed


def _main(argv: list[str] | None, Terminated) -> int:  # noqa: N803
    from tuneproof import registry  # noqa: PLC0415

    registry.STOPPED.clear()
    registry.CARRY.clear()
    try:
        rv = app(args=argv, standalone_mode=False)
        if isinstance(rv, int) and not isinstance(rv, bool) and rv:  # typer turns Ctrl-C into Exit(130) and returns it
            if rv == 130:
                _say_stopped(argv, "interrupted by Ctrl-C; no run was in progress")
                if any(s.how.startswith("stopped:") for s in registry.STOPPED):  # errors.Stopped: a rule, exit 3
                    return 3
            return rv
    except TuneproofError as err:
        console.print(
            f"[bold red]error[/]: {user_text(err, limit=ERROR_LIMIT)}", soft_wrap=True
        )  # messages quote data: [..] is not markup
        return err.exit_code
    except Terminated:
        _say_stopped(argv, "terminated by SIGTERM; no run was in progress")
        return 143
    except KeyboardInterrupt as err:
        _say_stopped(argv, "interrupted by Ctrl-C; no run was in progress")
        return getattr(err, "exit_code", 130)  # errors.Stopped (a rule stopped a run at a checkpoint): 3
    except typer.Exit as err:
        return err.exit_code
    except typer.Abort as err:  # click turns KeyboardInterrupt (and errors.Stopped) into Abort
        _say_stopped(argv, "interrupted by Ctrl-C; no run was in progress")
        return getattr(err.__cause__, "exit_code", 130)
    except Exception as err:  # usage errors of Typer's click: missing argument, unknown option...
        if callable(getattr(err, "show", None)) and isinstance(getattr(err, "exit_code", None), int):
            err.show()
            return 2
        fault = _machine_fault(err)
        if fault is not None:
            console.print(f"[bold red]error[/]: {user_text(fault, limit=ERROR_LIMIT)}", soft_wrap=True)
            return fault.exit_code
        raise
    return 0
