"""The hypothesis as it was fixed before training (docs/PROTOCOL.md step 1: the first train run
freezes the hypothesis and its guards; every later verdict is judged against the frozen version).

The first ``train`` run freezes the hypothesis: behaviour, task, success criterion, guards,
required fields and the format rule (``eval.json_schema``, ``eval.regex``,
``eval.allow_fenced_json``: they define what a valid output is). It is stored with its sha256
in ``hypothesis.frozen.json`` in the study folder (schema-versioned, created atomically and only
once: a second train run never replaces it). ``compare``, ``test``, ``report`` and ``export``
judge against that record. When the study file's hypothesis differs they show the change key by
key (old -> new) and give both verdicts; judging against the edited hypothesis alone needs
``--use-edited-hypothesis REASON``, and every such use is appended to
``hypothesis.overrides.jsonl`` (shown in the dossier) and recorded in the artifact it produced.

A study whose first train run predates this record is read from that run's ``config.json``.

The record is sealed: the train run that freezes it stores the sha256 of the file's bytes as written in
its own summary (``hypothesis_sha256``, kept in the index, ``summary.json`` and ``run.json``). Every
reader that judges (:func:`frozen_record`, so :func:`resolve`: ``compare``, ``test``, ``report``,
``export``) recomputes it and refuses (exit 3, :class:`SealBroken`) a file that was edited, deleted or
made unreadable since, naming the file and both hashes (:func:`check_sealed`). The seal outlives the file and
the run: it is also kept in the registry index (``meta.hypothesis_seal``, carried over by ``registry rebuild``),
and ``train`` refuses (exit 3, before any run) while the file is not the one sealed, whatever the freezing run's
status now (:func:`require_sealed`): deleting the file never lets a train run freeze another hypothesis.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuneproof.errors import CheckFailed, TuneproofError
from tuneproof.evaluation.compare import judge, overall_verdict
from tuneproof.io import SCHEMA_VERSION, append_jsonl, read_json, read_jsonl, sha256_file, sha256_json
from tuneproof.study import Eval, Hypothesis, keys_with_role
from tuneproof.tasks import get_task
from tuneproof.tasks.parsing import parse_json_output

FROZEN_FILE = "hypothesis.frozen.json"
OVERRIDES_FILE = "hypothesis.overrides.jsonl"
FLAG = "--use-edited-hypothesis"
#: the key of the freezing train run's summary that holds the sha256 of ``hypothesis.frozen.json`` as written
SEAL_KEY = "hypothesis_sha256"
#: the registry index's ``meta`` key that keeps a copy of the seal (``{"run", "sha256"}``), carried over by a rebuild
SEAL_META = "hypothesis_seal"
#: ``eval`` keys that belong to the hypothesis: the format rule (what counts as a valid output), the ``eval``
#: keys whose role is ``scores`` (:data:`tuneproof.study.ROLES`), with their defaults.
FORMAT_KEYS = {k: Eval.model_fields[k].get_default(call_default_factory=True) for k in keys_with_role("scores", "eval")}
#: the format keys every frozen hypothesis holds; a later ``scores`` key joins only when set away from its default,
#: so a hypothesis frozen before that key existed reads the same (``eval.answer_from``)
ALWAYS_FORMAT = ("allow_fenced_json", "json_schema", "regex", "grammar")
#: ``hypothesis.success.against``'s default; in a view only when set away from it (older views keep their hash)
AGAINST_DEFAULT = "baseline"


# --------------------------------------------------------------------------- the frozen part
def _normalise(hyp: dict[str, Any], eval_section: dict[str, Any]) -> dict[str, Any]:
    try:
        h = Hypothesis.model_validate(hyp).model_dump(mode="json")  # defaults filled: old records compare key by key
    except Exception:  # noqa: BLE001 - a record from an older schema is kept as it was
        h = dict(hyp)
    success = h.get("success")
    if isinstance(success, dict) and success.get("against", AGAINST_DEFAULT) == AGAINST_DEFAULT:
        success.pop(
            "against", None
        )  # the default stays out of the view: hypotheses frozen before the key keep their hash
    h["format"] = {
        k: eval_section.get(k, default)
        for k, default in FORMAT_KEYS.items()
        if k in ALWAYS_FORMAT or eval_section.get(k, default) != default
    }
    return h


def hypothesis_view(study: Any) -> dict[str, Any]:
    """The part of a study that is frozen: ``hypothesis`` (behaviour, task, success, guards,
    required_fields) plus ``format`` (:data:`FORMAT_KEYS`: ``eval.allow_fenced_json``, ``eval.json_schema``,
    ``eval.regex``, ``eval.grammar``)."""
    return _normalise(study.hypothesis.model_dump(mode="json"), study.eval.model_dump(mode="json"))


def view_from_config(config: dict[str, Any]) -> dict[str, Any]:
    """:func:`hypothesis_view` of a run's resolved ``config.json``."""
    return _normalise(config.get("hypothesis") or {}, config.get("eval") or {})


def view_hash(view: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of a view (sorted keys)."""
    return sha256_json(view)


def freeze(study_dir: str | Path, study: Any, run_id: str, *, against: dict[str, Any] | None = None) -> dict[str, Any]:
    """Freeze the study's hypothesis with train run ``run_id`` unless one is frozen already.

    The record ``{"schema_version", "hash", "run", "frozen_at" (s since the epoch), "hypothesis"}``
    is written to a temp file and hard-linked into place, so it is complete when it exists and a
    concurrent first train run cannot replace it. Returns the record in force.

    ``against``: the control ``hypothesis.success.against: strongest`` chose at this moment
    (:func:`tuneproof.evaluation.controls.strongest_control`: its run id, label, metric and value, the controls
    considered), recorded as the record's ``"against"``: outside the view, so not in ``hash``, but sealed with the file.
    """
    path = Path(study_dir) / FROZEN_FILE
    if path.exists():
        return read_json(path)
    view = hypothesis_view(study)
    record = {
        "schema_version": SCHEMA_VERSION,
        "hash": view_hash(view),
        "run": run_id,
        "frozen_at": round(time.time(), 3),
        "hypothesis": view,
        **({"against": against} if against is not None else {}),
    }
    fd, tmp = tempfile.mkstemp(prefix=".hypothesis.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(record, fh, indent=2, ensure_ascii=False)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)  # fails if another process froze first: its record stays
        except FileExistsError:
            return read_json(path)
        except OSError:  # a file system without hard links: rename, unless a record appeared meanwhile
            if path.exists():
                return read_json(path)
            os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return record


def freeze_and_seal(study_dir: str | Path, study: Any, run, *, against: dict[str, Any] | None = None) -> dict[str, Any]:
    """:func:`freeze` with train run ``run`` (``against``: the control chosen for ``success.against: strongest``,
    recorded in the file); when this run froze the record, the sha256 of the file as
    written goes into the run's own summary (``hypothesis_sha256``) and into the registry index
    (``meta.hypothesis_seal``: ``{"run", "sha256"}``), the seal :func:`check_sealed` compares with.
    Returns the record in force.

    Raises:
        SealBroken: (exit 3) a seal exists and the file is not the one it sealed (:func:`require_sealed`):
            the hypothesis is never frozen a second time.
    """
    require_sealed(study_dir, run.registry, "train")
    record = freeze(study_dir, study, run.id, against=against)
    if record.get("run") == run.id:
        digest = sha256_file(Path(study_dir) / FROZEN_FILE)
        run.update_summary(**{SEAL_KEY: digest})
        run.registry.set_meta(SEAL_META, json.dumps({"run": run.id, "sha256": digest}))
    return record


class SealBroken(CheckFailed):
    """The frozen hypothesis is not the one sealed before training (edited, deleted or unreadable).

    ``what`` is the headline's short form (``the frozen hypothesis hypothesis.frozen.json was edited ...``).
    """

    def __init__(self, message: str, *, what: str, hint: str):
        super().__init__(message, hint=hint)
        self.what = what


def _seal(registry: Any) -> tuple[str, str] | None:
    """``(train run id, sha256)`` recorded by the train run that froze the hypothesis, whatever its status
    (invalidating it does not unfreeze the hypothesis), else the copy the registry index keeps
    (``meta.hypothesis_seal``, which outlives the run's row); None when neither holds one (studies frozen
    before the seal existed)."""
    if registry is None:
        return None
    for rec in registry.list(kind="train"):
        digest = (rec.summary or {}).get(SEAL_KEY)
        if isinstance(digest, str):
            return rec.id, digest
    try:
        kept = json.loads(registry.meta(SEAL_META) or "null")
    except (ValueError, AttributeError):
        kept = None
    if isinstance(kept, dict) and isinstance(kept.get("sha256"), str):
        return str(kept.get("run")), kept["sha256"]
    return None


def require_sealed(study_dir: str | Path, registry: Any, command: str = "train") -> None:
    """Refuse ``command`` (``train``: it would freeze the hypothesis again) while a seal exists and
    ``hypothesis.frozen.json`` is not the file it sealed: deleted, edited or unreadable. The seal outlives the
    file and the run that froze it: invalidating that run and deleting the file never lets a train run write a
    new frozen hypothesis. Nothing happens when no seal exists (a study not trained yet).

    Raises:
        SealBroken: (exit 3, before any run starts) names what happened (the file, the freezing run and its
            status, both hashes) and the two ways on: restore the file, or start a new study.
    """
    seal = _seal(registry)
    if seal is None:
        return
    try:
        check_sealed(study_dir, registry)
    except SealBroken as err:
        status = " (no longer in the registry)"
        with contextlib.suppress(Exception):
            rec = registry.get(seal[0])
            status = (
                "" if rec.status == "completed" else f", now {rec.status}" + (f": {rec.reason}" if rec.reason else "")
            )
        raise SealBroken(
            f"{command} refused: the hypothesis was frozen by train run {seal[0]}{status}, and {err.message}; "
            "a study freezes its hypothesis once: invalidating that run or deleting the file does not unfreeze it",
            what=err.what,
            hint=f"restore {FROZEN_FILE} (sha256 {seal[1][:12]}...) from a backup or version control; to test "
            "another hypothesis, start a new study: `tuneproof init NEW_FOLDER`, copy tuneproof.yaml there with "
            "the new hypothesis, then its data check, baseline and train (this study's runs and verdicts stay as "
            "they are)",
        ) from None


def check_sealed(study_dir: str | Path, registry: Any = None) -> dict[str, Any] | None:
    """The frozen record after checking it is the one fixed before training; None when there is no
    ``hypothesis.frozen.json`` and no train run sealed one (a study not trained yet, or trained before
    the record existed: :func:`frozen_record` then reads the first train run's ``config.json``).

    Two checks, the first only where the seal exists:

    - the sha256 of the file's bytes equals the one the freezing train run recorded in its summary
      (``hypothesis_sha256``). Studies frozen before this seal existed have none: for them only the
      second check applies;
    - the record's own ``hash`` equals :func:`view_hash` of its ``hypothesis``.

    Raises:
        SealBroken: (exit 3) the file was edited after it was frozen (with or without its stored hash
            recomputed), it is missing while a train run sealed it, or it cannot be read or parsed;
            names the file and both hashes, and what to do.
    """
    path = Path(study_dir) / FROZEN_FILE
    seal = _seal(registry)
    restore = (
        "restore it from a backup or version control: every verdict is judged against the hypothesis fixed "
        f"before training; to judge against another, edit tuneproof.yaml and pass {FLAG} REASON (recorded)"
    )
    sealed = f"the sha256 {seal[1]} recorded by the first train run {seal[0]}" if seal else None
    if not path.exists():
        if seal is None:
            return None
        raise SealBroken(
            f"{path}: the frozen hypothesis is missing; {sealed}",
            what=f"the frozen hypothesis {FROZEN_FILE} is missing",
            hint=restore,
        )
    try:
        found = sha256_file(path)
    except OSError as err:
        raise SealBroken(
            f"{path}: the frozen hypothesis is unreadable ({err.strerror or err})" + (f"; {sealed}" if seal else ""),
            what=f"the frozen hypothesis {FROZEN_FILE} is unreadable",
            hint=restore,
        ) from None
    if seal is not None and found != seal[1]:
        raise SealBroken(
            f"{path}: sha256 {found} differs from {sealed} when it froze the hypothesis",
            what=f"the frozen hypothesis {FROZEN_FILE} was edited after the first train run {seal[0]} "
            f"(sha256 {found[:12]}, recorded {seal[1][:12]})",
            hint=restore,
        )
    try:
        rec = read_json(path)
        stored, content = rec["hash"], view_hash(rec["hypothesis"])
    except (TuneproofError, KeyError, TypeError) as err:
        why = err.message if isinstance(err, TuneproofError) else f"no {err}"
        raise SealBroken(
            f"{path}: the frozen hypothesis is unreadable ("
            f"{why.removeprefix(str(path) + ':').strip()}; sha256 {found})",
            what=f"the frozen hypothesis {FROZEN_FILE} is unreadable",
            hint=restore,
        ) from None
    if stored != content:
        raise SealBroken(
            f"{path}: its stored hash {stored} does not match its content (sha256 {content} of its hypothesis)",
            what=f"the frozen hypothesis {FROZEN_FILE} does not match its stored hash "
            f"(content {content[:12]}, stored {str(stored)[:12]})",
            hint=restore,
        )
    return {**rec, "file_sha256": found}


def frozen_record(study_dir: str | Path, registry: Any = None) -> dict[str, Any] | None:
    """The frozen record, checked by :func:`check_sealed`, or (studies trained before the record
    existed) one rebuilt from the first train run's ``config.json`` (``"source"`` says which); None
    before any train run.

    Raises:
        SealBroken: see :func:`check_sealed` (exit 3).
    """
    rec = check_sealed(study_dir, registry)
    if rec is not None:
        return {**rec, "source": FROZEN_FILE}
    if registry is None:
        return None
    trains = registry.list(kind="train")
    for rec in trains[:1]:
        cfg_path = registry.runs_dir / rec.id / "config.json"
        if cfg_path.exists():
            view = view_from_config(read_json(cfg_path))
            return {
                "hash": view_hash(view),
                "run": rec.id,
                "frozen_at": rec.created,
                "hypothesis": view,
                "source": f"runs/{rec.id}/config.json",
            }
    return None


# --------------------------------------------------------------------------- differences
def _leaves(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict) and obj:
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(_leaves(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(obj, list) and obj and all(isinstance(x, dict) for x in obj):
        out = {}
        for i, v in enumerate(obj):
            out.update(_leaves(v, f"{prefix}[{i}]"))
        return out
    return {prefix: obj}


def changes(old: dict[str, Any], new: dict[str, Any]) -> list[dict[str, Any]]:
    """Key-by-key differences ``[{"key", "old", "new"}]`` between two views, keys named as in the
    study file (``hypothesis.guards[0].floor``, ``eval.regex``); a key present on one side only has
    ``"(absent)"`` on the other."""
    a, b = _leaves(old), _leaves(new)
    out = []
    for k in sorted(set(a) | set(b)):
        if a.get(k, "(absent)") != b.get(k, "(absent)") or (k in a) != (k in b):
            name = "eval." + k[len("format.") :] if k.startswith("format.") else "hypothesis." + k
            out.append({"key": name, "old": a.get(k, "(absent)"), "new": b.get(k, "(absent)")})
    return out


def _short(v: Any) -> str:
    text = json.dumps(v, ensure_ascii=False) if not isinstance(v, str) else v
    return text if len(text) <= 80 else text[:77] + "..."


def change_lines(diff: list[dict[str, Any]]) -> list[str]:
    """``"key: old -> new"`` for each change."""
    return [f"{c['key']}: {_short(c['old'])} -> {_short(c['new'])}" for c in diff]


# --------------------------------------------------------------------------- what a command judges against
def as_hypothesis(view: dict[str, Any]):
    """The :class:`tuneproof.study.Hypothesis` of a view."""
    return Hypothesis.model_validate({k: v for k, v in view.items() if k != "format"})


def eval_for(view: dict[str, Any], eval_cfg: Any):
    """A copy of the study's ``eval`` section with the view's format rule."""
    return eval_cfg.model_copy(update=dict(view.get("format") or {}))


def scoring(view: dict[str, Any]) -> dict[str, Any]:
    """The parts of a view that change per-example scores (not only the verdict)."""
    return {"required_fields": view.get("required_fields") or [], "format": view.get("format") or {}}


@dataclass
class Judging:
    """What a command judges against.

    ``frozen`` is None before the first train run (the study file's hypothesis is then the one in
    force). ``primary`` is the view of THE verdict: the frozen one, or the edited one when
    ``reason`` (``--use-edited-hypothesis``) was given; ``other`` is the second view when they differ.
    """

    current: dict[str, Any]
    frozen: dict[str, Any] | None = None
    frozen_hash: str | None = None
    frozen_run: str | None = None
    source: str | None = None
    file_sha256: str | None = None  # sha256 of hypothesis.frozen.json's bytes, checked against the seal
    reason: str | None = None
    diff: list[dict[str, Any]] = field(default_factory=list)
    against_control: dict[str, Any] | None = None  # the frozen record's ``against`` (success.against: strongest)

    @property
    def changed(self) -> bool:
        return bool(self.diff)

    @property
    def primary(self) -> dict[str, Any]:
        return self.current if (self.frozen is None or self.reason) else self.frozen

    @property
    def judged_against(self) -> str:
        if self.frozen is None:
            return "study file (nothing frozen yet: no train run)"
        return "edited" if self.reason else "frozen"

    @property
    def other(self) -> dict[str, Any] | None:
        if not self.changed:
            return None
        return self.frozen if self.reason else self.current

    @property
    def other_name(self) -> str:
        return "frozen" if self.reason else "edited"

    def to_json(self) -> dict[str, Any]:
        return {
            "judged_against": self.judged_against,
            "frozen_hash": self.frozen_hash,
            "frozen_run": self.frozen_run,
            "frozen_source": self.source,
            "frozen_file_sha256": self.file_sha256,
            "study_hash": view_hash(self.current),
            "changed": self.changed,
            "changes": self.diff,
            "use_edited_reason": self.reason,
            **({"against_control": self.against_control} if self.against_control else {}),
        }

    def lines(self) -> list[str]:
        """What to print before a verdict: the change key by key, and which one is judged."""
        if not self.changed:
            return []
        out = [
            f"the study file's hypothesis differs from the one frozen with the first train run {self.frozen_run} "
            f"({len(self.diff)} change{'s' if len(self.diff) != 1 else ''}, frozen -> study file):"
        ]
        out += ["  " + line for line in change_lines(self.diff)]
        if self.reason:
            out.append(
                f"judged against the EDITED hypothesis ({FLAG}: {self.reason}); the frozen one's verdict is shown too"
            )
        else:
            out.append(
                f"judged against the FROZEN hypothesis; the edited one's verdict is shown too "
                f"(judging against the edited one alone: {FLAG} REASON)"
            )
        return out


def resolve(study_dir: str | Path, study: Any, registry: Any = None, use_edited: str | None = None) -> Judging:
    """The :class:`Judging` of a command.

    Raises:
        SealBroken: the frozen hypothesis is not the one sealed before training (exit 3; :func:`check_sealed`).
        TuneproofError: ``--use-edited-hypothesis`` with an empty reason; ``hypothesis.task``
            changed after the first train run (runs of one task cannot be judged as another).
    """
    if use_edited is not None and not use_edited.strip():
        raise TuneproofError(
            f"{FLAG} needs a reason", hint=f'e.g. {FLAG} "floor agreed with the product owner on 2026-12-01"'
        )
    current = hypothesis_view(study)
    rec = frozen_record(study_dir, registry)
    if rec is None:
        return Judging(current=current)
    frozen = rec["hypothesis"]
    diff = changes(frozen, current)
    if frozen.get("task") != current.get("task"):
        raise TuneproofError(
            f"{Path(study_dir) / 'tuneproof.yaml'}: hypothesis.task changed from '{frozen.get('task')}' to "
            f"'{current.get('task')}' after the first train run {rec.get('run')}",
            hint="runs of one task cannot be judged as another: restore the task, or start a new study",
        )
    reason = use_edited.strip() if (use_edited is not None and diff) else None
    return Judging(
        current=current,
        frozen=frozen,
        frozen_hash=rec.get("hash"),
        frozen_run=rec.get("run"),
        source=rec.get("source"),
        file_sha256=rec.get("file_sha256"),
        reason=reason,
        diff=diff,
        against_control=rec.get("against"),
    )


def record_override(study_dir: str | Path, judging: Judging, command: str, run_id: str | None) -> None:
    """Append one use of ``--use-edited-hypothesis`` to ``hypothesis.overrides.jsonl``."""
    if not judging.reason:
        return
    append_jsonl(
        Path(study_dir) / OVERRIDES_FILE,
        {
            "schema_version": SCHEMA_VERSION,
            "time": round(time.time(), 3),
            "command": command,
            "run": run_id,
            "reason": judging.reason,
            "frozen_hash": judging.frozen_hash,
            "study_hash": view_hash(judging.current),
            "changes": judging.diff,
        },
    )


def overrides(study_dir: str | Path) -> list[dict[str, Any]]:
    """Every recorded use of ``--use-edited-hypothesis`` (oldest first); [] when none or unreadable."""
    path = Path(study_dir) / OVERRIDES_FILE
    try:
        return read_jsonl(path) if path.exists() else []
    except Exception:  # noqa: BLE001 - the dossier still renders
        return []


def rejudge(entry: dict[str, Any], view: dict[str, Any]) -> tuple[list[dict], dict] | None:
    """``(verdicts, overall)`` of a recorded comparison entry (one candidate of ``compare.json``)
    under ``view``: the recorded ones when it was judged with that view, else
    :func:`tuneproof.evaluation.compare.judge` on its recorded metrics when the scoring (required
    fields, format rule) is the one it was scored with; None when it needs re-scoring
    (``tuneproof compare``)."""
    h = view_hash(view)
    for block in (entry, entry.get("alternative") or {}):
        if block.get("hypothesis_hash") == h and block.get("verdicts") is not None:
            return block["verdicts"], block["overall"]
    scored = entry.get("scoring")
    if scored is not None and scored != scoring(view):
        return None
    try:
        verdicts = judge(as_hypothesis(view), entry)
    except (TuneproofError, KeyError, TypeError):
        return None
    return verdicts, overall_verdict(verdicts)


# --------------------------------------------------------------------------- the hypothesis against the data
def check_against_data(study: Any, splits: dict[str, list], path: str | Path) -> list[str]:
    """Check the hypothesis against the examples before any run (``data check``, ``baseline``).

    - every class named by a guard (``hypothesis.guards[i].classes``) is a label of the data
      (classification: the ``label`` column; extraction: labels and the targets' ``intent``);
    - a format study's rule matches at least one gold target: ``eval.regex`` (``re.fullmatch`` on
      the stripped target, as the scorer applies it to outputs), ``eval.json_schema`` (strict JSON
      that validates). Gold targets that do not comply are counted in the returned notes.

    Args:
        splits: ``{split: [Example]}`` (every split; only labels and targets are read).
        path: the study file, named in the errors.

    Returns:
        notes (warnings) such as ``"eval.regex matches 40 of 50 gold targets"``.

    Raises:
        TuneproofError: names the key (``hypothesis.guards[i].classes``, ``eval.regex``,
            ``eval.json_schema``) and what to do.
    """
    h, ev = study.hypothesis, study.eval
    examples = [e for items in splits.values() for e in items]
    known = {str(e.label) for e in examples if e.label is not None}
    known |= set(get_task(h.task).label_set(examples) or [])  # e.g. the labels of multi-label targets
    if h.task == "extraction":
        for e in examples:
            obj, err = parse_json_output(e.target) if e.target is not None else (None, "none")
            if err is None and isinstance(obj, dict) and obj.get("intent") is not None:
                intent = obj["intent"]  # one label, or a list of labels (multi-intent)
                known.update(str(x) for x in intent) if isinstance(intent, list) else known.add(str(intent))
    for i, g in enumerate(h.guards):
        missing = [c for c in (g.classes or []) if c not in known]
        if missing:
            shown = ", ".join(sorted(known)[:20]) + (" ..." if len(known) > 20 else "")
            raise TuneproofError(
                f"{path}: hypothesis.guards[{i}].classes: {', '.join(repr(c) for c in missing)} "
                f"{'is' if len(missing) == 1 else 'are'} not a label of the data",
                hint=f"labels: {shown or 'none (no label column: data.fields.label)'}",
            )
    notes: list[str] = []
    if h.task != "format":
        return notes
    targets = [str(e.target) for e in examples if e.target is not None]
    if not targets:
        return notes

    def judge_rule(key: str, ok: int) -> None:
        if ok == 0:
            raise TuneproofError(
                f"{path}: {key} matches none of the {len(targets)} gold targets (first: {targets[0][:60]!r})",
                hint=f"the gold answers must satisfy the format rule: fix {key} (or the targets)",
            )
        if ok < len(targets):
            notes.append(f"{key} matches {ok} of {len(targets)} gold targets")

    if ev.regex is not None:
        try:
            pattern = re.compile(ev.regex)
        except re.error as err:
            raise TuneproofError(f"{path}: eval.regex: not a valid regular expression ({err})") from None
        judge_rule("eval.regex", sum(pattern.fullmatch(t.strip()) is not None for t in targets))
    if ev.json_schema is not None:
        import jsonschema  # noqa: PLC0415 - jsonschema loads only when check_against_data() runs

        try:
            cls = jsonschema.validators.validator_for(ev.json_schema)
            cls.check_schema(ev.json_schema)
        except jsonschema.SchemaError as err:
            raise TuneproofError(f"{path}: eval.json_schema: not a valid JSON Schema ({err.message})") from None
        validator = cls(ev.json_schema)
        ok = 0
        for t in targets:
            obj, err = parse_json_output(t)
            ok += err is None and validator.is_valid(obj)
        judge_rule("eval.json_schema", ok)
    return notes
