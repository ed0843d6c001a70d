"""The evaluation fingerprint: proof that two runs were evaluated the same way.

docs/PROTOCOL.md step 7: the evaluation procedure stays fixed across variants. A baseline and a
candidate are comparable only when they were evaluated on the same examples, with the same
prompt, decoding, metric definitions and tokenizer. Each of these parts is hashed on its
own (sha256 of its canonical JSON: sorted keys, no whitespace, UTF-8), so a mismatch names
the part that changed instead of only saying "different".

The generation backend (``eval.backend``, tests/evaluation/test_eval_backends.py) is part of the procedure: an
evaluation by vLLM has a ``backend`` part that one by transformers lacks, so the two are never the same
evaluation, whatever their backend check found. The check (``evaluation/backends.py``) shows on a
seeded sample that vLLM serves the same model and adapter; it does not prove that every output
of the split is identical (greedy outputs of two engines differ at near-ties in reduced
precision), so ``train`` wants a baseline evaluated by the same backend and ``compare`` names the
``backend`` part (``--allow-different-procedure`` pairs them anyway, recorded). A transformers
evaluation has no ``backend`` part, so fingerprints recorded before it existed keep their hash.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tuneproof.data.chat_template import fingerprint_part
from tuneproof.data.eval_sets import fingerprint_part as sets_fingerprint_part
from tuneproof.errors import TuneproofError
from tuneproof.io import sha256_json
from tuneproof.study import Eval, keys_with_role

if TYPE_CHECKING:
    from tuneproof.context import StudyContext
    from tuneproof.data.examples import Example

PARTS = ("eval_ids", "prompt", "decoding", "metrics", "tokenizer")
#: present only when not the default (``backend``: transformers; ``eval_sets``: none), so older fingerprints keep
#: their hash
OPTIONAL_PARTS = ("backend", "eval_sets")
#: the ``eval`` keys whose role (:data:`tuneproof.study.ROLES`) puts them in a part: every ``decodes`` key in
#: ``decoding``, every ``scores`` key in ``metrics``. Of those, the keys below every fingerprint has held since
#: its first version; any other joins its part only when set away from its default, so that fingerprints
#: recorded before the key existed keep their hash
ALWAYS = ("max_new_tokens", "do_sample", "temperature", "allow_fenced_json", "json_schema", "regex")
#: ``decodes`` keys hashed another way: the split through the ids it yields (``eval_ids``), the batch size in
#: ``decoding`` only where it can change the outputs (:func:`batch_size_matters`), ``eval.sets`` through each set's
#: content (``eval_sets``: name, sha256, bytes, examples, references)
ELSEWHERE = ("split", "batch_size", "sets")


def eval_fingerprint(
    example_ids: Sequence[str],
    eval_cfg: Any,
    task: str,
    required_fields: Sequence[str] | None,
    tokenizer_identity: dict,
    *,
    precision: str | None = None,
    base_weights: str | None = None,
    chat_template: dict | None = None,
    eval_sets: list[dict] | None = None,
) -> dict:
    """Fingerprint of an evaluation procedure.

    Args:
        example_ids: ids of the evaluated examples (order does not matter; hashed sorted).
        eval_cfg: the study's :class:`tuneproof.study.Eval` (or a dict of it).
        task: a task kind (``classification``, ``multi-label``, ``extraction``, ``format``).
        required_fields: hypothesis.required_fields (part of the metric definition).
        tokenizer_identity: whatever identifies the tokenizer (e.g. ``{"name_or_path",
            "revision", "vocab_sha256", "chat_template_sha256"}``); hashed as given.
        precision: the compute dtype of the evaluation (``fp32``, ``bf16``, ``fp16``; None = fp32).
        base_weights: the dtype the base model's weights were held in (``training.bf16_base_weights``:
            ``bf16``; None or ``fp32``: fp32, the default, which leaves the fingerprint as before).
        chat_template: the template settings that differ from the defaults
            (:func:`tuneproof.data.chat_template.fingerprint_part`: an overriding ``model.chat_template``'s
            sha256, ``model.chat_template_kwargs``, ``model.end_of_turn``), hashed in the ``prompt`` part;
            empty or None leaves the fingerprint as before.
        eval_sets: the study's ``eval.sets`` as read (:func:`tuneproof.data.eval_sets.fingerprint_part`: each
            ``{"name", "sha256", "bytes", "n", "references"}``), hashed in the ``eval_sets`` part; empty or None
            (a study without sets) leaves the fingerprint as before.

    Returns:
        ``{"hash": sha256 hex, "parts": {name: sha256 hex}}`` with parts ``eval_ids`` (sorted
        ids), ``prompt`` (template, system), ``decoding`` (the ``decodes`` keys: max_new_tokens, do_sample,
        temperature; as configured, even when greedy decoding ignores temperature; plus
        ``batch_size`` where it can change the outputs: sampling (the random stream depends on
        the batch) or bf16/fp16 (reduced-precision kernels differ with the batch shape); greedy
        fp32 outputs do not depend on it, which the preflight checks, docs/CASES.md C22; plus
        ``base_weights: "bf16"`` when the base weights were held in bf16: other weights, other
        outputs, so a bf16-base evaluation never matches an fp32-base one),
        ``metrics`` (task, required_fields, allow_fenced_json, json_schema, regex, and grammar when set) and
        ``tokenizer``; with ``eval.backend`` other than ``transformers`` also ``backend``
        (``{"name": "vllm"}``); with ``eval.sets`` also ``eval_sets``. ``hash`` is the sha256 of the lines
        ``"<part>=<part hash>\\n"`` in the order above.

    Raises:
        TuneproofError: duplicate example ids.
    """
    cfg = Eval.model_validate(eval_cfg) if isinstance(eval_cfg, dict) else (eval_cfg or Eval())
    ids = sorted(str(i) for i in example_ids)
    dupes = sorted({a for a, b in zip(ids, ids[1:]) if a == b})
    if dupes:
        raise TuneproofError(
            f"the eval split holds duplicate example ids: {dupes[:5]}", hint="ids must be unique within a study"
        )
    content = {
        "eval_ids": ids,
        "prompt": {
            "template": cfg.prompt.template,
            "system": cfg.prompt.system,
            **({"chat_template": chat_template} if chat_template else {}),
        },
        "decoding": {
            **_role_part(cfg, "decodes"),
            **({"batch_size": cfg.batch_size} if batch_size_matters(cfg, precision) else {}),
            **({"base_weights": base_weights} if base_weights not in (None, "fp32") else {}),
        },
        "metrics": {
            "task": task,
            "required_fields": list(required_fields or []),
            **_role_part(cfg, "scores"),
        },
        "tokenizer": dict(tokenizer_identity or {}),
    }
    backend = getattr(cfg, "backend", "transformers")
    if backend != "transformers":
        content["backend"] = {"name": backend}
    if eval_sets:
        content["eval_sets"] = list(eval_sets)
    names = PARTS + tuple(p for p in OPTIONAL_PARTS if p in content)
    parts = {name: sha256_json(content[name]) for name in names}
    combined = "".join(f"{name}={parts[name]}\n" for name in names)
    return {"hash": hashlib.sha256(combined.encode("utf-8")).hexdigest(), "parts": parts}


def _role_part(cfg: Eval, role: str) -> dict[str, Any]:
    """The ``eval`` keys of ``role`` that a fingerprint part holds (:data:`ALWAYS`, any other when not at its
    default; :data:`ELSEWHERE` left out), with their values in ``cfg``."""
    out = {}
    for key in keys_with_role(role, "eval"):
        value = getattr(cfg, key)
        if key not in ELSEWHERE and (key in ALWAYS or value != Eval.model_fields[key].get_default()):
            out[key] = value
    return out


def study_eval_fingerprint(
    ctx: StudyContext, examples: list[Example] | None = None, *, base_weights: str | None = None
) -> dict:
    """:func:`eval_fingerprint` of a study's evaluation of ``examples`` (default its eval examples,
    :meth:`~tuneproof.context.StudyContext.eval_examples`): its eval section, task, required fields,
    tokenizer identity and compute dtype; ``base_weights``: the dtype the evaluated model's base
    weights were held in (default the study's, :attr:`~tuneproof.context.StudyContext.base_weights`); with
    ``eval.sets``, each set's content (:attr:`~tuneproof.context.StudyContext.eval_sets`).

    Raises:
        TuneproofError: duplicate example ids, a precision refused on this machine, or an ``eval.sets`` entry that
            cannot be read (:func:`tuneproof.data.eval_sets.load_eval_sets`).
    """
    examples = examples if examples is not None else ctx.eval_examples()
    return eval_fingerprint(
        [e.id for e in examples],
        ctx.study.eval,
        ctx.task,
        ctx.study.hypothesis.required_fields,
        ctx.tokenizer_identity,
        precision=ctx.device_choice.get("dtype"),
        base_weights=base_weights or ctx.base_weights,
        chat_template=fingerprint_part(getattr(ctx.pipeline, "chat", None)),
        eval_sets=sets_fingerprint_part(ctx.eval_sets) if ctx.study.eval.sets else None,
    )


def batch_size_matters(eval_cfg: Any, precision: str | None) -> bool:
    """Whether ``eval.batch_size`` can change the outputs: sampling, or reduced precision."""
    return bool(eval_cfg.do_sample) or precision in ("bf16", "fp16")


def diff_fingerprints(a: dict, b: dict) -> list[str]:
    """Names of the parts whose hashes differ (a part present on one side only counts), in
    the order of :data:`PARTS`, then any other names sorted. Empty when identical."""
    pa, pb = a.get("parts", {}), b.get("parts", {})
    names = [p for p in PARTS if p in pa or p in pb] + sorted((set(pa) | set(pb)) - set(PARTS))
    return [p for p in names if pa.get(p) != pb.get(p)]
