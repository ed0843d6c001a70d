"""Which config keys a passed preflight stands for (``train`` refuses without a matching preflight).

A preflight measures one configuration: the model and method (what is trained, the update), the
optimisation and step options (micro-batch, accumulation, precision, activation checkpointing,
max_length, learning rate...), the data through the trainer's preprocessing, and the study's
evaluation procedure in its smoke pass (prompt, split, decoding, eval batch size). A change of
any of these keys invalidates it.

Each key's role is declared once, on its field in :mod:`tuneproof.study` (:data:`tuneproof.study.ROLES`):
a change of a key that ``trains`` or ``decodes`` invalidates a passed preflight; every other key (:data:`EXEMPT`)
cannot change what the preflight measured, so changing it keeps a passed preflight valid:

- ``judges`` and ``scores`` (``hypothesis.*``, ``eval.allow_fenced_json``, ``eval.json_schema``, ``eval.regex``,
  ``eval.grammar``, ``eval.bootstrap_iterations``, ``eval.seed``): what is claimed and how outputs are scored
  and summarised after generation;
- ``budget`` (``training.max_steps``, ``training.epochs``, ``eval.max_examples``, ``eval.repeat``): the
  preflight runs its own fixed number of steps and predicts a fixed handful; its time estimate is for the
  budget at the time;
- ``bookkeeping`` (``name``, ``schema_version``, ``training.checkpoint_every``, ``training.eval_every``,
  ``distributed.timeout_s``): names and cadence;
- ``serves`` (``eval.backend``, ``eval.backend_check_examples``, ``eval.backend_check_min_agreement``): the
  serving engine of baseline/eval/test (the preflight measures the transformers path; a vLLM evaluation is
  checked against it on a sample at every evaluation, ``evaluation/backends.py``);
- ``tracking`` (``tracking.*``, ``report_to``): where copies of the runs go (``tracking/``), never what a run does.

``training.speedups: auto`` stands for what it resolved to in that preflight (its summary's
``speedups_auto``): changing ``auto`` to that list, in any order, keeps the preflight valid; any
other list, or ``auto`` after a preflight of a list, invalidates it (auto may resolve otherwise).

Everything else invalidates, in particular ``model.*``, ``method.*``, every other
``training.*`` key, ``data.*``, ``eval.split``, ``eval.prompt.*``, ``eval.max_new_tokens``,
``eval.do_sample``, ``eval.temperature``, ``eval.batch_size``, and any key the schema does not know.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from tuneproof.io import flatten_keys
from tuneproof.study import PREFLIGHT_ROLES, Study, declared_roles, role_of

#: the keys (and sections) whose change keeps a passed preflight valid: every role but ``trains`` and ``decodes``
EXEMPT: tuple[str, ...] = tuple(k for k, r in declared_roles().items() if r not in PREFLIGHT_ROLES)


def is_exempt(key: str) -> bool:
    """True when a change of the dotted ``key`` cannot invalidate a passed preflight (its role,
    :func:`tuneproof.study.role_of`, is neither ``trains`` nor ``decodes``)."""
    found = role_of(key)
    return found is not None and found not in PREFLIGHT_ROLES


_MISSING = object()


def schema_defaults() -> dict[str, Any]:
    """Dotted key -> default value of every study key that has one (``tuneproof.study``'s pydantic
    models, nested sections flattened like :func:`tuneproof.io.flatten_keys`). A config recorded by
    an earlier tuneproof lacks the keys added since; absent there and at its default now, a key
    describes the same configuration."""
    out: dict[str, Any] = {}

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            key = f"{prefix}{name}"
            ann = field.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                walk(ann, key + ".")
            elif not field.is_required():
                value = field.get_default(call_default_factory=True)
                out[key] = value.model_dump(mode="json") if isinstance(value, BaseModel) else value

    walk(Study, "")
    return out


def _as_resolved(recorded: dict[str, Any], current: dict[str, Any], auto_used: list[str] | None) -> dict[str, Any]:
    """``recorded`` as a list when ``current`` names one: the boolean keys of what ``training.speedups:
    auto`` resolved to (``auto_used``, what the preflight measured), and ``speedups`` itself replaced by
    ``current``'s list when that list is exactly the resolution (any order)."""
    r_train, c_train = recorded.get("training") or {}, current.get("training") or {}
    listed = c_train.get("speedups")
    if r_train.get("speedups") != "auto" or auto_used is None or not isinstance(listed, list):
        return recorded
    same = sorted(listed) == sorted(auto_used)
    return {
        **recorded,
        "training": {**r_train, **dict.fromkeys(auto_used, True), **({"speedups": listed} if same else {})},
    }


def preflight_changes(
    recorded: dict[str, Any], current: dict[str, Any], auto_used: list[str] | None = None
) -> list[dict[str, Any]]:
    """The changes between the config a preflight ran on and the current one that invalidate it.

    Args:
        recorded, current: resolved configs (``runs/<preflight>/config.json``, ``ctx.config``).
        auto_used: the speed-ups ``training.speedups: auto`` resolved to in that preflight (its
            summary's ``speedups_auto.used``); None: it recorded none.

    Returns:
        ``[{"key", "from", "to"}]`` sorted by key, exempt keys left out (``from``/``to`` None
        where the key is absent on that side). Empty: the preflight stands for ``current``.
    """
    a, b = flatten_keys(_as_resolved(recorded, current, auto_used)), flatten_keys(current)
    defaults = schema_defaults()
    out = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key, _MISSING), b.get(key, _MISSING)
        if va is _MISSING and key in defaults and vb == defaults[key]:
            continue  # a key added by a later tuneproof, at its default: the configuration the preflight measured
        if va != vb and not is_exempt(key):
            out.append({"key": key, "from": None if va is _MISSING else va, "to": None if vb is _MISSING else vb})
    return out


def describe_changes(changes: list[dict[str, Any]], limit: int = 6) -> str:
    """``method.r: 4 -> 8, training.learning_rate: 0.01 -> 0.02`` (at most ``limit``, then ``and N more``)."""
    text = ", ".join(
        f"{c['key']}: {json.dumps(c['from'], default=str)} -> {json.dumps(c['to'], default=str)}"
        for c in changes[:limit]
    )
    return text + (f" and {len(changes) - limit} more" if len(changes) > limit else "")
