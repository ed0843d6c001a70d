"""Recipe ``export``: the trained adapter (or full model) bound to its exact base model, verified.

Features (option that turns each on):
- one folder ``exports/<train run>/`` (``--out`` elsewhere), built in a temp folder and renamed
  into place only after it verified (never a half or unverified bundle); one export per bundle folder
  at a time (a lock file ``.<folder>.lock`` beside it: a second export refuses in one line, naming the
  first's pid); the temp folder ``.<folder>.<export run>.tmp-export`` is recorded in the export run
  before it is made, so a killed export's folder is removed by the next run wherever ``--out`` put it;
- the adapter in the standard PEFT layout (``PeftModel.from_pretrained(base, "adapter")`` loads it
  unchanged; its ``adapter_config.json`` carries the base revision), or ``model/`` for full
  fine-tuning; ``--merge`` adds ``merged/``, the base with the adapter merged in (safetensors);
- modules_to_save (e.g. the classification head) checked to be in the saved file (docs/CASES.md C6); the
  base vocabulary size before resizing and the added tokens apart from the special tokens recorded
  (``vocabulary``), so loading onto a base of another size names both sizes;
- ``results/outputs.jsonl`` and ``results/baseline_outputs.jsonl``: the per-example outputs the
  metrics and the comparison were computed from (each checked against the sha256 its run recorded),
  from which ``verify`` recomputes every claim; ``manifest.sha256``: the manifest's own hash;
- ``manifest.json`` (schema-versioned): base identity (id/path, revision, sha256 of every weight
  file, tokenizer class, vocabulary, added tokens, probe-text token-id hash), resolved config,
  environment, data and evaluation fingerprints, the comparison with the baseline, the guards'
  verdict, the observed limits, the verification procedure and the sha256 of every bundle file;
- ``README.md``: a model card with the Hugging Face metadata header;
- ``verify/examples.jsonl``: K evaluation inputs (``--verify-examples``) with the predictions (and
  logits) of the bundle, made in fp32 with greedy decoding on ``--device`` (cpu by default, or
  cuda; a run trained with ``training.bf16_base_weights``: base weights in bf16 under bf16 autocast,
  as it was evaluated, ``procedure.base_weights``), which ``tuneproof verify`` must reproduce; the export runs that
  verification itself, in a fresh process, before the export run is completed;
- a train run that is not completed (failed, interrupted, invalid) is refused unless ``--force``;
  a forced export says so in the manifest, the model card and the export run;
- a base whose weights changed since training is refused (docs/CASES.md C13), and so is a tokenizer that
  differs from the one the train run and its baseline recorded (vocabulary map, probe ids; docs/CASES.md C13 kind);
- what is exported is what was evaluated (tests/faults/test_faults_evidence.py): the adapter (or
  model) files are hashed and compared with the sha256 the eval run recorded when it loaded them
  (else the one training recorded when it saved them); a file that differs is refused (exit 3)
  naming it and both hashes. A run recorded before these hashes existed is exported with a warning
  that it was not compared (``trained_weights.checked_against: null`` in the manifest). The bundle's
  own predictions on the K stored examples must equal the evaluated predictions: one that differs
  fails the export (exit 3);
- the verdict in the manifest and the model card follows the hypothesis frozen with the first train
  run; when the study file's differs, the change and both verdicts are stated;
  ``--use-edited-hypothesis REASON`` makes the edited one's verdict the verdict, with the reason in
  the manifest (``hypothesis.use_edited_reason``) and the model card.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from tuneproof import clock
from tuneproof import hypothesis as hyp
from tuneproof.context import StudyContext
from tuneproof.deliver.bundle import (
    BUNDLE_KIND,
    MANIFEST,
    file_hashes,
    safetensors_keys,
    saved_modules,
    write_manifest_sha,
)
from tuneproof.deliver.bundle_verification import (
    DEVICE_ATOL,
    EXAMPLES_FILE,
    failure_message,
    load_bundle_model,
    load_tokenizer_at,
    procedure_atol,
    reproduce,
    verify_in_fresh_process,
)
from tuneproof.deliver.card import model_card
from tuneproof.deliver.claims import BASELINE_SET_OUTPUTS, SET_OUTPUTS, SETS_DIR
from tuneproof.deliver.headline import against_baseline
from tuneproof.deliver.limits import observed_limits
from tuneproof.errors import CheckFailed, TuneproofError
from tuneproof.evaluation.eval_sets import read_set_outputs
from tuneproof.evaluation.outputs import check_complete, check_outputs, read_outputs
from tuneproof.evaluation.trained_run import check_base, check_tokenizer, check_trained_weights, trained_base_weights
from tuneproof.io import SCHEMA_VERSION, Held, atomic_write_text, exclusive_lock, read_json, write_json, write_jsonl
from tuneproof.models.identity import base_identity
from tuneproof.recipes.common import note_library_drift, record_inputs
from tuneproof.recipes.compare import print_judging
from tuneproof.registry import RELATIVE_PATHS, study_relative
from tuneproof.ui import Heartbeat, console, heartbeat, user_text

DEFAULT_K = 8  # stored verification examples


def _eval_of(ctx: StudyContext, train_id: str):
    evals = [r for r in ctx.registry.list(kind="eval", status="completed") if r.parent == train_id]
    return evals[-1] if evals else None


def _comparison_of(ctx: StudyContext, eval_id: str | None) -> tuple[Any, dict | None, dict | None]:
    """``(compare record, full compare.json, this candidate's entry)`` of the latest comparison of ``eval_id``
    against a baseline run (:func:`tuneproof.deliver.headline.against_baseline`): a comparison with another
    candidate (``compare r0008 --against r0005``) is never the bundle's claim."""
    if eval_id is None:
        return None, None, None
    runs = ctx.registry.list()
    for c in reversed([r for r in runs if r.kind == "compare" and r.status == "completed"]):
        data = ctx.registry.run_json(c.id, "compare.json") or {}
        if eval_id in (data.get("candidates") or {}) and against_baseline(runs, data.get("baseline")):
            return c, data, data["candidates"][eval_id]
    return None, None, None


def pick_examples(outputs: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    """K examples round-robin over categories (sorted), keeping file order inside a category, so
    the stored set covers as many classes as K allows."""
    by_cat: dict[str, list[dict]] = defaultdict(list)
    for r in outputs:
        by_cat[str(r.get("category"))].append(r)
    picked, i = [], 0
    cats = sorted(by_cat)
    while len(picked) < k and any(i < len(by_cat[c]) for c in cats):
        picked += [by_cat[c][i] for c in cats if i < len(by_cat[c])]
        i += 1
    return picked[:k]


def _check_base_unchanged(ctx: StudyContext, rec) -> None:
    """Refuse when the study's base model differs from the one the run was trained on (docs/CASES.md C13): the
    weight and ``config.json`` sha256 recorded at train start, the weight hashes and the revision."""
    check_base(ctx, rec.id)
    trained = rec.summary.get("base") or {}
    now = ctx.base.identity()
    if trained.get("weight_sha256") and trained["weight_sha256"] != now["weight_sha256"]:
        raise CheckFailed(
            f"run {rec.id} was trained on base weights {json.dumps(trained['weight_sha256'])} but the study's base "
            f"{now['path']} now has {json.dumps(now['weight_sha256'])}",
            hint="point model.base at the exact base the run was trained on",
        )
    if trained.get("revision") and trained["revision"] != now["revision"]:
        raise CheckFailed(
            f"run {rec.id} was trained on base revision {trained['revision']}, "
            f"the study's base is now {now['revision']}",
            hint="point model.base at the exact base the run was trained on",
        )


def check_exported_weights(ctx: StudyContext, rec, ev) -> dict[str, Any]:
    """The adapter (or model) of ``rec`` as exported, checked against the sha256 the eval run ``ev``
    recorded when it loaded it, else the one ``rec`` recorded when training saved it
    (tests/faults/test_faults_evidence.py).

    Returns:
        :func:`tuneproof.models.identity.trained_weights_record` of the files, with
        ``checked_against`` (``"eval run r0004"``, ``"train run r0003"`` or None: recorded by neither,
        a run made before the hashes existed; said on screen, nothing is refused).

    Raises:
        CheckFailed: a file differs (exit 3), named with both hashes.
    """
    recorded = (ev.summary.get("trained_weights") if ev is not None else None) or None
    if recorded:
        found = check_trained_weights(ctx, rec.id, "export", recorded, by=f"eval run {ev.id} evaluated")
        return {**found, "checked_against": f"eval run {ev.id}"}
    found = check_trained_weights(ctx, rec.id, "export")
    if rec.summary.get("trained_weights"):
        return {**found, "checked_against": f"train run {rec.id}"}
    console.print(
        f"[yellow]warning[/]: run {rec.id} recorded no sha256 of its saved {user_text(found['folder'])} ("
        + ("made before tuneproof recorded it" if rec.status == "completed" else f"the run is {rec.status}")
        + "): the exported files are not compared with the evaluated ones",
        soft_wrap=True,
    )
    return {**found, "checked_against": None}


def _disagreement(chosen: list[dict[str, Any]], ev, evaluated: dict | None, procedure: dict) -> str | None:
    """None when every stored example's bundle prediction equals its evaluated prediction, else one
    line naming how many differ, the first one, and how the evaluation and the bundle predicted."""
    compared = [c for c in chosen if c.get("eval_prediction") is not None]
    differ = [c for c in compared if c["eval_prediction"] != c["prediction"]]
    if not differ:
        return None
    c = differ[0]
    how = ""
    choice = (evaluated or {}).get("device_choice") or {}
    if choice and (choice.get("torch_device"), choice.get("dtype")) != (procedure["device"], procedure["dtype"]):
        how = (
            f" (the evaluation ran in {choice.get('dtype')} on {choice.get('torch_device')}, the bundle predicted in "
            f"{procedure['dtype']} on {procedure['device']}: export with --device {choice.get('torch_device')})"
        )
    return (
        f"the bundle's predictions differ from those of eval run {ev.id} on {len(differ)} of {len(compared)} "
        f"stored examples (e.g. {c['id']}: evaluated {json.dumps(c['eval_prediction'])[:80]}, bundle "
        f"{json.dumps(c['prediction'])[:80]}){how}"
    )


def _embeddings(base: dict[str, Any], tmp: Path, payload: str) -> dict[str, Any]:
    """Embedding rows of the base vs tokens of the tokenizer, and the embedding tensors the adapter
    saves. Added tokens without saved embeddings would be random after a reload: refused."""
    cfg = read_json(Path(base["path"]) / "config.json")
    rows = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
    size = base["tokenizer"].get("vocab_size")
    saved = []
    if payload == "adapter":
        saved = [
            k
            for k in safetensors_keys(tmp / "adapter" / "adapter_model.safetensors")
            if any(x in k for x in ("embed_tokens", "word_embeddings", "lm_head", "trainable_tokens"))
            and "lora_" not in k
        ]
    rec = {
        "base_rows": rows,
        "tokenizer_size": size,
        "resized": bool(rows and size and size > rows),
        "saved_tensors": saved,
    }
    if rec["resized"] and payload == "adapter" and not saved:
        raise CheckFailed(
            f"the tokenizer has {size} tokens but the base embeddings have {rows} "
            "rows, and the adapter saves no embedding tensor",
            hint="the added tokens would be random after a reload; add the embedding layer to method.modules_to_save",
        )
    return rec


def _comparison(crec, compare_json: dict, entry: dict, judging: hyp.Judging) -> dict[str, Any]:
    """The manifest's ``comparison``: the recorded comparison judged against the hypothesis in force
    (:attr:`Judging.primary`) and, when the study file's differs, the other one's verdict too."""
    out = {
        "compare_run": crec.id,
        "baseline_run": compare_json.get("baseline"),
        "counts": entry.get("counts"),
        "mcnemar": entry.get("mcnemar"),
        "metrics": entry.get("metrics"),
        "judged_against": judging.judged_against,
    }
    stale = (
        "the recorded comparison was scored with other required fields or format rule; run `tuneproof compare` again"
    )
    got = hyp.rejudge(entry, judging.primary)
    verdicts, overall = got if got else (None, {"verdict": None, "detail": stale})
    out.update(verdict=overall.get("verdict"), detail=overall.get("detail"), verdicts=verdicts)
    if judging.other is not None:
        got = hyp.rejudge(entry, judging.other)
        other = got[1] if got else {"verdict": None, "detail": stale}
        out[f"verdict_{judging.other_name}"], out[f"detail_{judging.other_name}"] = (
            other.get("verdict"),
            other.get("detail"),
        )
    return out


def _scoring(ctx: StudyContext, ev, entry: dict | None, judging: hyp.Judging) -> dict[str, Any]:
    """How the claims were computed, so ``verify`` recomputes them the same way: the eval run's
    scoring (required fields and ``eval`` section of its recorded config), and for the comparison
    the scoring it was made with and the hypothesis views its verdicts are judged under."""
    evcfg = (ctx.registry.run_json(ev.id, "config.json") if ev else None) or ctx.config
    return {
        "task": ctx.task,
        "labels": ctx.labels if ctx.task == "classification" else None,
        "eval_run": {
            "required_fields": (evcfg.get("hypothesis") or {}).get("required_fields"),
            "eval": evcfg.get("eval") or {},
        },
        "comparison": {
            "eval": ctx.study.eval.model_dump(mode="json"),
            "scored_with": (entry or {}).get("scoring") or hyp.scoring(judging.primary),
            "view": judging.primary,
            "other_view": judging.other,
            "other_name": judging.other_name,
            "noise": (entry or {}).get("noise"),  # both runs' noise floors (eval.repeat), None: not measured
            # the control the success criterion was judged against when it is not the compared baseline
            # (hypothesis.success.against: strongest); its outputs ship as results/control_outputs.jsonl
            "judged_control": _judged_control(entry),
        },
    }


def _judged_control(entry: dict | None) -> dict[str, Any] | None:
    """``{"run", "label", "noise"}`` of the control the recorded comparison judged the success criterion against,
    when it is another run than the compared baseline (:func:`tuneproof.evaluation.controls.judge_against_control`);
    None otherwise."""
    judged = (entry or {}).get("judged_control") or {}
    block = ((entry or {}).get("controls") or {}).get(judged.get("run") or "")
    if not judged.get("run") or block is None or not (entry or {}).get("verdicts_vs_baseline"):
        return None
    return {"run": judged["run"], "label": judged.get("label") or block.get("label"), "noise": block.get("noise")}


def build_bundle(
    ctx: StudyContext,
    rec,
    tmp: Path,
    *,
    merge: bool,
    k: int,
    forced: dict | None,
    export_run: str,
    device: str = "cpu",
    judging: hyp.Judging | None = None,
    trained: dict[str, Any] | None = None,
    beat: Heartbeat | None = None,
) -> dict[str, Any]:
    """Write every file of the bundle into ``tmp`` and return the manifest (also written).

    ``trained``: the checked sha256 of the exported files (:func:`check_exported_weights`), recorded in
    the manifest as ``trained_weights``. ``beat``: told which part is being written (the lines off a
    terminal, :func:`tuneproof.ui.heartbeat`).

    Raises:
        CheckFailed: a module_to_save without a tensor, added tokens without saved embeddings, or
            the bundle's predictions differ from the evaluated ones (:func:`_disagreement`).
    """
    if judging is None:
        judging = hyp.resolve(ctx.study_dir, ctx.study, ctx.registry)
    beat = beat or Heartbeat("export")
    src = ctx.registry.runs_dir / rec.id
    payload = "adapter" if (src / "adapter" / "adapter_config.json").exists() else "model"
    if not (src / payload).exists():
        raise TuneproofError(
            f"{src}: the run saved neither adapter/ nor model/",
            hint="only a train run that finished saving can be exported",
        )
    if merge and payload != "adapter":
        raise TuneproofError("--merge applies to a LoRA adapter; this run saved a full model (model/)")
    quantization = rec.summary.get("quantization")  # qlora: the 4-bit config the run trained on
    shutil.copytree(src / payload, tmp / payload)
    base = base_identity(ctx.base, ctx.tokenizer_identity)
    kind = ctx.model_kind
    labels = ctx.head_labels

    mts: dict[str, list[str]] = {}
    if payload == "adapter":
        cfg_path = tmp / "adapter" / "adapter_config.json"
        acfg = read_json(cfg_path)
        if acfg.get("revision") != base["revision"]:  # bind the adapter to the exact base revision
            acfg["revision"] = base["revision"]
            atomic_write_text(cfg_path, json.dumps(acfg, indent=2, sort_keys=True) + "\n")
        run_cfg = read_json(src / "config.json") if (src / "config.json").exists() else ctx.config
        requested = list(run_cfg.get("method", {}).get("modules_to_save") or [])
        # PEFT adds its default head names for SEQ_CLS ("classifier", "score"); only those that exist get saved
        found = saved_modules(tmp / "adapter", sorted(set(acfg.get("modules_to_save") or []) | set(requested)))
        mts = {m: keys for m, keys in found.items() if keys}
        empty = [m for m in requested if not found.get(m)]
        if empty:
            raise CheckFailed(
                f"modules_to_save {empty} have no tensor in {src / 'adapter' / 'adapter_model.safetensors'}",
                hint="the trained module would be lost on reload; check method.modules_to_save",
            )
        if labels is not None and not mts:  # a classification head (sequence or image classifier)
            raise CheckFailed(
                "the classification head is not in the saved adapter (modules_to_save is empty)",
                hint="set method.modules_to_save: [classifier] (the head's module name) and train again",
            )

    # docs/CASES.md C6 kind: base size before resizing, added tokens (an image classifier has no vocabulary)
    vocabulary = ctx.modality.vocabulary_record(base["path"], ctx.tokenizer)
    embeddings = None if vocabulary is None else _embeddings(base, tmp, payload)

    # evidence: eval, comparison, limits
    ev = _eval_of(ctx, rec.id)
    eval_json = ctx.registry.run_json(ev.id, "eval.json") if ev else None
    outputs = (
        read_outputs(ctx.registry.runs_dir / ev.id / "outputs.jsonl", ev)
        if ev and (ctx.registry.runs_dir / ev.id / "outputs.jsonl").exists()
        else []
    )
    crec, compare_json, entry = _comparison_of(ctx, ev.id if ev else None)
    limits = observed_limits(
        ctx.task,
        eval_metrics=(eval_json or {}).get("metrics"),
        outputs=outputs,
        comparison=entry,
        test_accesses=ctx.registry.test_accesses(),
        forced=forced,
    )
    results = tmp / "results"
    if compare_json:
        write_json(results / "compare.json", compare_json)
    if eval_json:
        write_json(results / "eval.json", eval_json)
    write_json(results / "limits.json", limits)
    for name in ("method.json", "summary.json"):
        if (src / name).exists():
            shutil.copy2(src / name, results / ("train_" + name if name == "summary.json" else name))
    if (src / "metrics.jsonl").exists():
        shutil.copy2(src / "metrics.jsonl", results / "train_metrics.jsonl")
    if outputs:  # the per-example outputs behind the claims, as their runs recorded them (hash-checked above)
        shutil.copy2(ctx.registry.runs_dir / ev.id / "outputs.jsonl", results / "outputs.jsonl")
    if compare_json and compare_json.get("baseline"):
        brec = ctx.registry.get(compare_json["baseline"])
        bpath = ctx.registry.runs_dir / brec.id / "outputs.jsonl"
        check_outputs(bpath, brec)
        shutil.copy2(bpath, results / "baseline_outputs.jsonl")
        control = _judged_control(entry)
        if control is not None:  # the success criterion was judged against this control: the claims check needs it
            crec = ctx.registry.get(control["run"])
            cpath = ctx.registry.runs_dir / crec.id / "outputs.jsonl"
            check_outputs(cpath, crec)
            shutil.copy2(cpath, results / "control_outputs.jsonl")
        # the outputs on eval.sets the comparison judged its set guards on (sha256 checked), for the claims check
        for name in sorted((entry or {}).get("sets") or {}):
            for rec_, file in ((brec, BASELINE_SET_OUTPUTS), (ev, SET_OUTPUTS)):
                rows = read_set_outputs(ctx.registry.runs_dir, rec_, name)
                write_jsonl(results / SETS_DIR / name / file, rows)

    # the K stored examples and the bundle's own predictions on them (CPU, fp32, greedy)
    if outputs:
        chosen = [
            {
                "id": r["id"],
                "category": r.get("category"),
                "input": r["input"],
                "reference": r.get("reference"),
                "eval_prediction": r.get("prediction"),
            }
            for r in pick_examples(outputs, k)
        ]
    else:
        rows = [
            {"id": e.id, "category": e.label, "input": e.text, "reference": e.target, "eval_prediction": None}
            for e in ctx.eval_examples()
        ]
        chosen = pick_examples(rows, k)
    extras = ctx.modality.bundle_extras(ctx, chosen, tmp)  # the exact prompts, or the images themselves
    held = trained_base_weights(ctx, rec.id)  # training.bf16_base_weights: trained and evaluated with the base in bf16
    procedure = {
        "model_kind": kind,
        "task": ctx.task,
        "labels": labels,
        "max_length": ctx.study.training.max_length,
        "max_new_tokens": ctx.study.eval.max_new_tokens,
        "decoding": "greedy",
        "device": device,
        "dtype": "bf16" if held == "bf16" else "fp32",
        "base_weights": held,
        "k": len(chosen),
        **generation_stops(ctx),
    }
    # the entry module of the fresh-process verification (deliver/verify.py), named in every bundle
    procedure["tolerance"] = (
        f"predictions identical; logits within {procedure_atol(procedure, device)} (see tuneproof.deliver.verify)"
    )
    procedure.update(extras)
    man: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "kind": BUNDLE_KIND,
        "created": clock.now(),
        "run": rec.id,
        "export_run": export_run,
        "payload": payload,
        "merged": bool(merge),
        "procedure": procedure,
        "base_model": base,
        "tokenizer": base["tokenizer"],
        "labels": labels,
        "quantization": quantization,
    }
    t0 = time.perf_counter()
    beat.update(f"predicting {len(chosen)} verification examples with the bundle")
    model = load_bundle_model(tmp, man, Path(base["path"]))
    tok = load_tokenizer_at(Path(base["path"]) if payload == "adapter" else tmp / "model", man)
    ref = reproduce(model, tok, chosen, procedure, root=tmp)
    for c, r in zip(chosen, ref):
        c.update(r)
    agree = sum(1 for c in chosen if c.get("eval_prediction") is not None and c["eval_prediction"] == c["prediction"])
    differ = _disagreement(chosen, ev, ctx.registry.run_json(ev.id, "env.json") if ev else None, procedure)
    if differ:  # what is exported is what was evaluated
        raise CheckFailed(
            f"export refused: {differ}", hint="the bundle was not kept; evaluate the run again, then export"
        )
    merge_info = None
    if merge:
        beat.update("merging the adapter into the base and predicting again")
        merged = model.merge_and_unload()
        merged.save_pretrained(tmp / "merged", safe_serialization=True)
        tok.save_pretrained(tmp / "merged")
        del merged, model
        mref = reproduce(
            load_bundle_model(tmp, man, Path(base["path"]), which="merged"), tok, chosen, procedure, root=tmp
        )
        diff = 0.0
        for c, r in zip(chosen, mref):
            c["merged_prediction"] = r["prediction"]
            if "logits" in r:
                c["merged_logits"] = r["logits"]
                diff = max([diff] + [abs(a - b) for a, b in zip(c["logits"], r["logits"])])
            else:
                c["merged_next_token"] = r["next_token"]
                diff = max([diff] + [abs(a[1] - b[1]) for a, b in zip(c["next_token"], r["next_token"])])
        merge_info = {
            "agree_with_adapter": sum(c["merged_prediction"] == c["prediction"] for c in chosen),
            "n": len(chosen),
            "max_abs_logit_diff_vs_adapter": diff,
            "note": "merging sums W + scale*B@A once, so logits can differ from the adapter's in the last bits",
        }
    else:
        del model
    write_jsonl(tmp / EXAMPLES_FILE, chosen)
    procedure["reference_seconds"] = round(time.perf_counter() - t0, 2)

    train_summary = dict(rec.summary)
    man.update(
        {
            "forced": forced,
            "modules_to_save": mts,
            "embeddings": embeddings,
            "vocabulary": vocabulary,
            "adapter": (
                {
                    k2: v
                    for k2, v in read_json(tmp / "adapter" / "adapter_config.json").items()
                    if k2
                    in (
                        "peft_type",
                        "r",
                        "lora_alpha",
                        "lora_dropout",
                        "target_modules",
                        "modules_to_save",
                        "revision",
                        "base_model_name_or_path",
                        "task_type",
                    )
                }
                if payload == "adapter"
                else None
            ),
            "train": {
                k2: train_summary.get(k2)
                for k2 in (
                    "steps",
                    "first_loss",
                    "final_loss",
                    "train_seconds",
                    "tokens_per_s",
                    "trainable",
                    "total_params",
                    "dtype",
                    "loss_normalisation",
                    "base_weights",
                )
            },
            "config": read_json(src / "config.json") if (src / "config.json").exists() else ctx.config,
            "environment": ctx.registry.run_json(rec.id, "env.json"),
            "data_fingerprint": ctx.registry.run_json(rec.id, "data.json") or {"hash": rec.data_fingerprint},
            "eval_run": ev.id if ev else None,
            "trained_weights": trained,
            "eval_fingerprint": (eval_json or {}).get("fingerprint"),
            "metrics": ev.summary.get("metrics") if ev else None,
            "comparison": _comparison(crec, compare_json, entry, judging) if entry else None,
            "hypothesis": {**judging.to_json(), "frozen": judging.frozen},
            "limits": limits,
            "reference": {
                "eval_predictions_agree": agree,
                "n": len(chosen),
                "merge": merge_info,
                "base_weights": held,
                # the dtype the eval behind the claims held the base in: a different one is said, not hidden
                "eval_base_weights": (eval_json or {}).get("base_weights", "fp32") if eval_json else None,
            },
            "test_accesses": ctx.registry.test_accesses(),
            "scoring": _scoring(
                ctx, ev, entry, judging
            ),  # what `verify` recomputes the claims with (deliver/claims.py)
        }
    )
    atomic_write_text(tmp / "README.md", model_card(man))
    man["files"] = file_hashes(tmp)
    write_json(tmp / MANIFEST, man)
    write_manifest_sha(tmp)
    return man


def run_export(
    ctx: StudyContext,
    train_run: str,
    *,
    force: bool = False,
    out_dir: Path | None = None,
    merge: bool = False,
    k: int = DEFAULT_K,
    device: str = "cpu",
    use_edited_hypothesis: str | None = None,
) -> str:
    """Export a train run as a verified bundle; returns the export run id.

    Raises:
        TuneproofError: not a train run, a run that is not completed without ``force``, the bundle
            folder exists, nothing saved.
        CheckFailed: the base changed since training, the evaluation the claims rest on is incomplete (its
            folder, ``eval.json`` or ``outputs.jsonl`` gone: :func:`check_complete`), the adapter (or model) files
            differ from the evaluated ones (:func:`check_exported_weights`), a module_to_save missing from the saved
            file, the bundle's predictions differ from the evaluated ones, or the bundle failed its
            verification in a fresh process.
    """
    rec = ctx.registry.check_record(train_run)  # the status and hashes export relies on: an edited run.json is refused
    if rec.kind != "train":
        raise TuneproofError(f"run {rec.id} is a {rec.kind} run; export takes a train run")
    forced = None
    if rec.status != "completed":
        if not force:
            raise TuneproofError(
                f"train run {rec.id} is {rec.status}" + (f" ({rec.reason})" if rec.reason else ""),
                hint="export a completed run, or pass --force (recorded in the manifest and the model card)",
            )
        forced = {"status": rec.status, "reason": rec.reason}
    if k < 1:
        raise TuneproofError(f"--verify-examples must be at least 1 (got {k})")
    if device not in DEVICE_ATOL:
        raise TuneproofError(f"--device {device!r}: use one of {', '.join(sorted(DEVICE_ATOL))}")
    if device == "cuda":
        import torch  # noqa: PLC0415 - torch loads only when run_export() runs

        if not torch.cuda.is_available():
            raise TuneproofError("--device cuda: no CUDA GPU is visible", hint="export with --device cpu (the default)")
    src = ctx.registry.runs_dir / rec.id
    if merge and not (src / "adapter" / "adapter_config.json").exists():
        raise TuneproofError(
            f"--merge applies to a LoRA adapter; run {rec.id} saved "
            + ("a full model (model/)" if (src / "model").exists() else "no adapter")
        )
    if merge and rec.summary.get("quantization"):  # refused before any run or folder is made
        raise TuneproofError(
            f"--merge: run {rec.id} is QLoRA (method.kind: qlora, its base in 4-bit); merging into the 4-bit "
            "weights would round the adapter away",
            hint="export without --merge: the adapter binds to the unquantized base + its recorded 4-bit config",
        )
    dest = Path(out_dir) if out_dir else ctx.study_dir / "exports" / rec.id
    if dest.exists():
        raise TuneproofError(f"{dest} already exists", hint="remove it or pass another --out")
    _check_base_unchanged(ctx, rec)
    check_tokenizer(ctx, rec.id, "export")
    evaluated = _eval_of(ctx, rec.id)
    if evaluated is not None:  # the claims rest on its outputs: a run folder whose evidence is gone is refused
        check_complete(ctx.registry, evaluated)
    trained = check_exported_weights(ctx, rec, evaluated)
    judging = hyp.resolve(ctx.study_dir, ctx.study, ctx.registry, use_edited_hypothesis)
    dest.parent.mkdir(parents=True, exist_ok=True)
    lock_path = dest.parent / f".{dest.name}.lock"
    with contextlib.ExitStack() as held:
        try:  # one export per bundle folder at a time (two at once: the second's rename found the first's folder)
            held.enter_context(exclusive_lock(lock_path))
        except Held as other:
            raise TuneproofError(
                f"{dest}: another export is writing this bundle now (pid {other.pid or '?'}, lock {lock_path})",
                hint="wait for it to end (tuneproof runs), then run the command again if you need another bundle",
            ) from None
        if dest.exists():  # written by an export that ended while this one checked
            raise TuneproofError(f"{dest} already exists", hint="remove it or pass another --out")
        return _export_locked(ctx, rec, dest, lock_path, forced, merge, k, device, judging, trained)


def _forget_temp(run) -> None:
    """The export ended (either way): its temp folder and lock are gone, nothing for the cleanup to find."""
    run.summary.pop("temp_folder", None)
    run.summary.pop("lock_file", None)
    run.update_summary()


def _export_locked(ctx, rec, dest, lock_path, forced, merge, k, device, judging, trained) -> str:
    """The export run of :func:`run_export`, under the bundle's lock."""
    with ctx.registry.run("export", parent=rec.id) as run, heartbeat("export", "writing the bundle") as beat:
        # the temp folder is named and recorded before it exists: after a kill -9 the next run's cleanup
        # (Registry.clean_stale_temps) finds it wherever --out put it
        tmp = dest.parent / f".{dest.name}.{run.id}.tmp-export"
        note_library_drift(ctx, run, rec.id, record_inputs(ctx, run, with_data=False)["env"])
        run.update_summary(
            train_run=rec.id,
            forced=forced,
            merge=merge,
            temp_folder=study_relative(ctx.study_dir, tmp),
            **{RELATIVE_PATHS: True},
            lock_file=study_relative(ctx.study_dir, lock_path),
        )
        if forced:
            run.note(f"forced export of the {rec.status} run {rec.id} ({rec.reason})")
            console.print(f"[yellow]warning[/]: exporting {rec.id} although it is {rec.status} (--force, recorded)")
        tmp.mkdir()
        try:
            print_judging(judging)
            man = build_bundle(
                ctx,
                rec,
                tmp,
                merge=merge,
                k=k,
                forced=forced,
                export_run=run.id,
                device=device,
                judging=judging,
                trained=trained,
                beat=beat,
            )
            console.print(
                f"[bold]{run.id}[/] bundle of {rec.id} written ("
                f"{len(man['files'])} files); verifying in a fresh process"
            )
            beat.update("verifying the bundle in a fresh process")
            report = verify_in_fresh_process(tmp)
            run.write_json("verify.json", report)
            if not report["passed"]:
                raise CheckFailed(
                    failure_message(report), hint="the bundle was not kept; see " + str(run.path("verify.json"))
                )
            try:
                os.replace(tmp, dest)
            except OSError as err:
                if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                raise TuneproofError(
                    f"{dest} appeared while this bundle was written (another process wrote it)",
                    hint="the bundle was not kept; remove the folder or pass another --out",
                ) from None
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            with contextlib.suppress(Exception):
                _forget_temp(run)
            raise
        run.update_summary(
            bundle=study_relative(ctx.study_dir, dest),  # exports/r0003: a copied study names its own copy
            verified=True,
            verify_seconds=report["seconds"],
            files=len(man["files"]),
            payload=man["payload"],
            eval_run=man["eval_run"],
            verdict=(man.get("comparison") or {}).get("verdict"),
            judged_against=judging.judged_against,
            use_edited_hypothesis=judging.reason,
        )
        _forget_temp(run)
        hyp.record_override(ctx.study_dir, judging, "export", run.id)
        for c in report["checks"]:
            console.print(f"  [green]pass[/] {c['name']}: {user_text(c['detail'])}", soft_wrap=True)
        console.print(f"[bold]{run.id}[/] exported {rec.id} to {user_text(dest)} (verified)", soft_wrap=True)
        return run.id


def generation_stops(ctx) -> dict:
    """The generation's stop tokens and answer parsing where they differ from eos and ``eval.answer_from: auto``
    (``model.end_of_turn``: Gemma's ``<end_of_turn>``, Llama-3's ``<|eot_id|>``): ``verify`` generates with them,
    so the bundle's predictions are read as the evaluation read them. Empty otherwise (older bundles unchanged)."""
    stops = list(getattr(ctx.pipeline, "stop_ids", None) or [])
    eos = getattr(ctx.tokenizer, "eos_token_id", None)
    out: dict = {}
    if stops and stops != [eos]:
        out["stop_ids"] = stops
    if ctx.study.eval.answer_from != "auto":
        out["answer_from"] = ctx.study.eval.answer_from
    return out
