"""Recipe ``train --from``: variants of a train run, one explainable change at a time (docs/PROTOCOL.md step 7).

Features (CLI option that turns each on):
- a variant of a train run (``--from RUN``): its resolved config (``runs/<id>/config.json``) with
  the ``--set key=value`` changes applied (values parsed as YAML; an unknown key or a value of the
  wrong type stops before any compute, naming the key); the new run's parent is RUN;
- the exact diff of the resolved config is stored in ``runs/<id>/variant.json`` and the run's
  summary (``variant``), every changed key with its group, old and new value;
- config keys belong to named groups (:func:`group_of`, from each key's role in ``tuneproof.study``): model,
  method, optimisation, data, eval,
  budget, seed (and ``bookkeeping``: checkpoint/eval cadence, which does not change the result and
  does not count as a change). A variant that changes more than one group needs
  ``--allow-multi-change`` and is flagged (``multi_change`` in the summary; shown by ``runs``);
- seed, budget, data and evaluation procedure are inherited from the parent; a change to any of
  them is stated in ``variant.json`` (``statements``), and so is a data fingerprint that differs
  from the parent's although no data key changed (the data files changed on disk);
- the hypothesis and guards are fixed before the first training run (docs/PROTOCOL.md step 1): a variant
  may not change them;
- sweep (``--grid key=v1,v2,v3``): one variant per value, validated (config and preflight) all
  together first, then run in sequence; each is one change. A value equal to the parent's is skipped (the parent is that
  variant). A variant stopped by a protocol check (NaN loss: invalid) does not stop the sweep;
  Ctrl-C or any other error does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuneproof.context import StudyContext, parse_study
from tuneproof.errors import CheckFailed, TuneproofError
from tuneproof.io import flatten_keys, read_json, sha256_json
from tuneproof.recipes.protocol import require_order
from tuneproof.recipes.train import TrainOptions, run_train
from tuneproof.registry import Registry, RunRecord
from tuneproof.study import resolved_config, role_of, set_key
from tuneproof.ui import console, user_text

#: the groups of the keys that train (role ``trains``, :data:`tuneproof.study.ROLES`), by dotted-key prefix;
#: the first match wins, so specific keys come before their section
TRAINS_GROUPS: tuple[tuple[str, str], ...] = (
    ("training.seed", "seed"),
    ("training.max_length", "data"),
    ("training.loss", "data"),
    ("eval.prompt", "data"),  # the prompt is also the training input
    ("training", "optimisation"),
    ("model", "model"),
    ("method", "method"),
    ("data", "data"),
    ("distributed", "distributed"),
)
#: the group of every other role: ``bookkeeping`` and ``tracking`` do not change the trained result (not counted);
#: ``budget`` is the training budget in ``training`` and part of the evaluation procedure in ``eval``
#: (``eval.max_examples`` chooses the examples evaluated)
ROLE_GROUPS = {
    "decodes": "eval",
    "scores": "eval",
    "judges": "eval",
    "serves": "eval",
    "budget": "budget",
    "bookkeeping": "bookkeeping",
    "tracking": "bookkeeping",
}
FROZEN_KEYS = {"hypothesis": "hypothesis", "name": "study", "schema_version": "study"}  # never changed by a variant
FROZEN_GROUPS = ("hypothesis", "study")
UNCOUNTED_GROUPS = ("bookkeeping",)  # changes that do not alter the trained result
INHERITED = {"seed": "seed", "budget": "training budget", "data": "data", "eval": "evaluation procedure"}


def _under(key: str, prefix: str) -> bool:
    return key == prefix or key.startswith(prefix + ".")


def group_of(key: str) -> str:
    """The group of a dotted config key, from its role (:func:`tuneproof.study.role_of`), e.g.
    ``training.learning_rate`` -> ``optimisation``, ``eval.regex`` -> ``eval``, ``training.checkpoint_every``
    -> ``bookkeeping``; ``other`` for a key the schema does not know."""
    top = key.split(".")[0]
    if top in FROZEN_KEYS:
        return FROZEN_KEYS[top]
    found = role_of(key)
    if found == "trains":
        return next(group for prefix, group in TRAINS_GROUPS if _under(key, prefix))
    if found == "budget" and top == "eval":
        return "eval"
    return ROLE_GROUPS.get(found or "", "other")


flatten = flatten_keys  # dotted keys -> leaf values (lists and empty mappings are leaves)


_MISSING = object()


def config_diff(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """Every leaf key whose value differs: ``[{key, group, from, to}]`` sorted by key
    (``from``/``to`` is None where the key is absent on that side)."""
    a, b = flatten(before), flatten(after)
    out = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key, _MISSING), b.get(key, _MISSING)
        if va != vb:
            out.append(
                {
                    "key": key,
                    "group": group_of(key),
                    "from": None if va is _MISSING else va,
                    "to": None if vb is _MISSING else vb,
                }
            )
    return out


def describe(changes: list[dict[str, Any]]) -> str:
    """``method.r: 8 -> 16; training.learning_rate: 0.0002 -> 0.001``."""
    return "; ".join(f"{c['key']}: {json.dumps(c['from'])} -> {json.dumps(c['to'])}" for c in changes)


def overrides(changes: list[dict[str, Any]]) -> list[str]:
    """``["method.r=16", "training.learning_rate=0.001"]``: each changed key with the variant's value
    (what ``--set`` would write; a string as is, anything else as compact JSON), as ``runs`` shows them."""
    return [
        f"{c['key']}={c['to'] if isinstance(c['to'], str) else json.dumps(c['to'], separators=(',', ':'))}"
        for c in changes
    ]


def counted_groups(changes: list[dict[str, Any]]) -> list[str]:
    return sorted({c["group"] for c in changes if c["group"] not in UNCOUNTED_GROUPS})


@dataclass
class VariantPlan:
    """One variant, validated, ready to train."""

    parent: RunRecord
    parent_config: dict[str, Any]
    config: dict[str, Any]
    changes: list[dict[str, Any]]
    assignments: list[str]
    name: str | None
    allow_multi_change: bool
    grid: dict[str, Any] | None = None
    statements: list[str] = field(default_factory=list)

    @property
    def groups(self) -> list[str]:
        return counted_groups(self.changes)

    @property
    def multi_change(self) -> bool:
        return len(self.groups) > 1

    def record(self) -> dict[str, Any]:
        """The content of ``variant.json`` (the data fingerprint statement is added once the run has one)."""
        p, pcfg = self.parent, self.parent_config
        return {
            "parent": p.id,
            "parent_status": p.status,
            "set": self.assignments,
            "grid": self.grid,
            "changes": self.changes,
            "change": describe(self.changes),
            "groups": self.groups,
            "multi_change": self.multi_change,
            "allow_multi_change": self.allow_multi_change,
            "inherited": {
                "seed": pcfg["training"]["seed"],
                "budget": {"max_steps": pcfg["training"]["max_steps"], "epochs": pcfg["training"]["epochs"]},
                "data_fingerprint": p.data_fingerprint,
                "eval_procedure_sha256": sha256_json({"eval": pcfg["eval"], "task": pcfg["hypothesis"]["task"]}),
            },
            "statements": list(self.statements),
            "config_sha256": {"parent": sha256_json(pcfg), "variant": sha256_json(self.config)},
        }


def _parent(reg: Registry, run_id: str) -> tuple[RunRecord, dict[str, Any]]:
    rec = reg.get(run_id)
    if rec.kind != "train":
        hint = f"its parent is {rec.parent}" if rec.parent else "pick a train run (see `tuneproof runs`)"
        raise TuneproofError(f"--from {rec.id}: a variant starts from a train run, this is a {rec.kind} run", hint=hint)
    path = reg.runs_dir / rec.id / "config.json"
    if not path.exists():
        raise TuneproofError(
            f"{path}: the resolved config of {rec.id} is missing", hint="a variant needs its parent's config.json"
        )
    cfg = resolved_config(parse_study(read_json(path), path))  # the parent's config must still be a valid study
    return rec, cfg


def _assignment(text: str, what: str = "--set") -> tuple[str, str]:
    if "=" not in text:
        raise TuneproofError(f"{what} '{text}': expected KEY=VALUE, e.g. method.r=16")
    key, value = text.split("=", 1)
    key = key.strip()
    if not key:
        raise TuneproofError(f"{what} '{text}': the key is empty")
    return key, value


def split_values(text: str) -> list[str]:
    """Comma-separated values; commas inside [...] or {...} or quotes do not split."""
    out, depth, cur, quote = [], 0, "", None
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
            continue
        cur += ch
    out.append(cur.strip())
    return [v for v in out if v != ""]


def plan_variant(
    reg: Registry,
    parent_id: str,
    sets: list[str],
    *,
    name: str | None = None,
    allow_multi_change: bool = False,
    grid: dict[str, Any] | None = None,
) -> VariantPlan:
    """Apply ``sets`` (``KEY=VALUE`` strings) to the parent's resolved config and validate.

    Raises:
        TuneproofError: the parent is not a train run or has no config.json; a ``--set`` without
            ``=``; an unknown key (named); a value of the wrong type (the key and pydantic's
            message); no change at all; a change to the hypothesis or study name; more than one
            group changed without ``allow_multi_change`` (lists the groups and keys).
    """
    rec, pcfg = _parent(reg, parent_id)
    cfg = pcfg
    for text in sets:
        key, value = _assignment(text)
        cfg = set_key(cfg, key, value, path=f"--set {text}")
    where = " ".join(f"--set {s}" for s in sets)
    cfg = resolved_config(parse_study(cfg, where))
    changes = config_diff(pcfg, cfg)
    if not changes:
        raise TuneproofError(
            f"{where}: the variant equals its parent {rec.id} (nothing changed)",
            hint="a variant changes at least one value; to repeat a run use `tuneproof train`",
        )
    frozen = [c for c in changes if c["group"] in FROZEN_GROUPS]
    if frozen:
        raise TuneproofError(
            f"{where}: '{frozen[0]['key']}' is fixed for the whole study, a variant may not change it",
            hint="the hypothesis and guards are set before the first training run (protocol step 1); start a new study",
        )
    plan = VariantPlan(rec, pcfg, cfg, changes, list(sets), name, allow_multi_change, grid)
    if plan.multi_change and not allow_multi_change:
        by_group = "; ".join(f"{g}: {', '.join(c['key'] for c in changes if c['group'] == g)}" for g in plan.groups)
        raise TuneproofError(
            f"{where}: the variant changes {len(plan.groups)} groups ({by_group})",
            hint="change one group at a time, or pass --allow-multi-change (the run is flagged as multi-change)",
        )
    for c in changes:
        if c["group"] in INHERITED:
            plan.statements.append(
                f"{INHERITED[c['group']]} not inherited from {rec.id}: {c['key']} "
                f"{json.dumps(c['from'])} -> {json.dumps(c['to'])}"
            )
    if plan.multi_change:
        plan.statements.append(
            f"multi-change variant: {len(plan.groups)} groups changed ({', '.join(plan.groups)}); "
            "its effect cannot be attributed to one change"
        )
    return plan


def _on_start(plan: VariantPlan, started: list[str]) -> Callable:
    def hook(run) -> None:
        started.append(run.id)
        record = plan.record()
        fp = run.registry.get(run.id).data_fingerprint
        parent_fp = plan.parent.data_fingerprint
        if fp and parent_fp and fp != parent_fp:
            if "data" in plan.groups:
                record["statements"].append(
                    f"data fingerprint changed with the data settings: {parent_fp[:12]} -> {fp[:12]}"
                )
            else:
                record["statements"].append(
                    f"data fingerprint differs from {plan.parent.id} although no data key changed "
                    f"({parent_fp[:12]} -> {fp[:12]}): the data files changed since the parent ran"
                )
        record["data_fingerprint"] = fp
        run.write_json("variant.json", record)
        run.update_summary(
            variant={
                "parent": plan.parent.id,
                "change": record["change"],
                "overrides": overrides(plan.changes),
                "groups": plan.groups,
                "statements": record["statements"],
            },
            multi_change=plan.multi_change,
        )
        for s in record["statements"]:
            run.note(s)
            console.print(f"[yellow]note[/]: {user_text(s)}", soft_wrap=True)

    return hook


def variant_context(study_dir: Path, data_root: Path | None, plan: VariantPlan):
    """The :class:`StudyContext` of a planned variant (its config instead of the study file's)."""
    return StudyContext.open(study_dir, data_root, config=plan.config)


def train_variant(
    ctx,
    plan: VariantPlan,
    *,
    preflight_override: str | None = None,
    stop_after: int | None = None,
    started: list[str] | None = None,
    order: dict | None = None,
) -> str:
    """Train one planned variant in its context; returns its run id (parent = the plan's parent).
    ``started`` receives the run id as soon as the run exists.

    Raises whatever training raises (the run is recorded failed/interrupted/invalid first).
    """
    console.print(
        f"variant of [bold]{plan.parent.id}[/]: {user_text(describe(plan.changes))}"
        + (" [magenta](multi-change)[/]" if plan.multi_change else "")
    )
    options = TrainOptions(
        parent=plan.parent.id,
        name=plan.name,
        stop_after=stop_after,
        preflight_override=preflight_override,
        on_start=_on_start(plan, started if started is not None else []),
        order=order,
    )
    return run_train(ctx, options)


def _grid_name(name: str | None, key: str, value: str) -> str:
    suffix = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{key.split('.')[-1]}{value}").strip("_") or "v"
    return f"{name}-{suffix}" if name else suffix


def plan_grid(
    reg: Registry,
    parent_id: str,
    grid: str,
    sets: list[str],
    *,
    name: str | None = None,
    allow_multi_change: bool = False,
) -> tuple[list[VariantPlan], list[str]]:
    """One plan per value of ``grid`` (``KEY=v1,v2,...``), all validated before any training.

    Returns ``(plans, skipped)``; ``skipped`` names values equal to the parent's.

    Raises:
        TuneproofError: as :func:`plan_variant`, for the first bad value (named); no values.
    """
    key, raw = _assignment(grid, "--grid")
    values = split_values(raw)
    if not values:
        raise TuneproofError(f"--grid {grid}: no values", hint="e.g. --grid method.r=8,16,32")
    if len(set(values)) != len(values):
        raise TuneproofError(f"--grid {grid}: a value is repeated")
    plans, skipped = [], []
    for i, v in enumerate(values):
        try:
            plan = plan_variant(
                reg,
                parent_id,
                [*sets, f"{key}={v}"],
                name=_grid_name(name, key, v),
                allow_multi_change=allow_multi_change,
                grid={"key": key, "values": values, "index": i},
            )
        except TuneproofError as err:
            if "nothing changed" in str(err):
                skipped.append(f"{key}={v} is the value of {parent_id}: no variant")
                continue
            raise
        plans.append(plan)
    if not plans:
        raise TuneproofError(f"--grid {grid}: every value equals the parent's")
    return plans, skipped


def run_variants(
    study_dir: Path,
    data_root: Path | None,
    parent: str,
    *,
    sets: list[str] | None = None,
    grid: str | None = None,
    name: str | None = None,
    allow_multi_change: bool = False,
    preflight: Callable | None = None,
    preflight_override: str | None = None,
    data_check_override: str | None = None,
    baseline_override: str | None = None,
) -> list[dict[str, Any]]:
    """``train --from PARENT [--set ...] [--grid ...]``: plan, then train each variant in sequence.
    Every variant passes the protocol gates (data check, baseline: :func:`~tuneproof.recipes.protocol.require_order`;
    then ``preflight``) before the first one trains.

    Returns ``[{"run", "status", "change"}]`` (one entry for ``--set``, one per value for ``--grid``).
    """
    reg = Registry(study_dir)
    sets = list(sets or [])
    if grid:
        plans, skipped = plan_grid(reg, parent, grid, sets, name=name, allow_multi_change=allow_multi_change)
        for s in skipped:
            console.print(f"[yellow]skip[/]: {user_text(s)}", soft_wrap=True)
    else:
        if not sets:
            raise TuneproofError(f"--from {parent}: say what changes with --set KEY=VALUE or --grid KEY=V1,V2")
        plans = [plan_variant(reg, parent, sets, name=name, allow_multi_change=allow_multi_change)]
    contexts = [variant_context(study_dir, data_root, plan) for plan in plans]
    # every variant is cleared before the first one trains: data check and baseline, then preflight
    orders = [
        require_order(ctx, data_check_override=data_check_override, baseline_override=baseline_override)
        for ctx in contexts
    ]
    if preflight is not None:
        for ctx, order in zip(contexts, orders):
            order["preflight_run"] = preflight(ctx, preflight_override)
    results = []
    for plan, ctx, order in zip(plans, contexts, orders):
        started: list[str] = []
        try:
            run_id = train_variant(ctx, plan, preflight_override=preflight_override, started=started, order=order)
        except CheckFailed as err:
            if not grid or not started:
                raise
            rec = reg.get(started[0])
            console.print(
                f"[magenta]{rec.id} {rec.status}[/]: {user_text(str(err).splitlines()[0])}; the sweep goes on",
                soft_wrap=True,
            )
            results.append({"run": rec.id, "status": rec.status, "change": describe(plan.changes)})
            continue
        results.append({"run": run_id, "status": reg.get(run_id).status, "change": describe(plan.changes)})
    return results
