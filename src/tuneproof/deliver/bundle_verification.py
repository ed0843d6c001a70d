"""Verify an export bundle in a fresh process: files, base identity, tokenizer, reload, predictions.

Order of the checks (each later check is skipped once one fails, so a tampered file is never
loaded):

0. ``manifest``: ``manifest.json`` has the sha256 written beside it in ``manifest.sha256``;
1. ``files``: every file listed in the manifest exists and has its recorded sha256 (names the
   missing or altered file with both hashes), and no file is there that the manifest does not list
   (named: an added tokenizer or weights file changes what is loaded);
1b. ``claims``: every metric, the comparison (verdict, counts, deltas, guards) and the training
   claims (steps, first/final loss) recomputed from the per-example outputs and the training log
   shipped in the bundle (:mod:`tuneproof.deliver.claims`); a claim that does not match is named
   by its manifest field;
2. ``base weights``: every weight file and ``config.json`` of the base (``--base`` or the recorded
   path) has the recorded sha256, and no file is missing or added (docs/CASES.md C13: names both hashes;
   weight hashes are cached by path, size and mtime, ``tuneproof --rehash verify`` recomputes them);
   a base of another vocabulary size than the one recorded before resizing names both sizes first (docs/CASES.md C6
   kind);
3. ``adapter config``: ``adapter_config.json`` carries the recorded base revision;
4. ``tokenizer``: the base's tokenizer has the recorded class, vocabulary size and token -> id map
   (``vocab_sha256``), added tokens, chat template and probe-text token ids;
5. ``reload``: the base + adapter load with the standard ``PeftModel.from_pretrained`` (or the
   full model with ``from_pretrained``); modules_to_save come from the saved file (docs/CASES.md C6);
6. ``predictions``: the K stored examples are predicted again by the stored procedure and
   compared with the predictions recorded at export;
7. ``merged`` (bundles exported with ``--merge``): the merged model reproduces its own recorded
   predictions.

Tolerance: verification runs in fp32 with greedy decoding on the device the export recorded
(CPU by default), so predictions must be identical; logits (classification) and next-token logits
(generation) may differ by at most :data:`DEVICE_ATOL` of that device: 1e-4 on CPU (another CPU's
kernels can change the last bits; on the exporting machine the difference is 0.0), 1e-3 on CUDA
(TF32 off; another GPU model or library version can reorder sums). The largest difference is
reported. Verifying on another device than the one recorded is refused (re-export instead).

A run trained with ``training.bf16_base_weights`` was evaluated with its base weights in bf16
under bf16 autocast; its export records ``procedure.base_weights: "bf16"`` and ``procedure.dtype:
"bf16"``, and the stored predictions and verification are made the same way (base weights cast to
bf16, the adapter in fp32, bf16 autocast), never compared with an fp32 reload. The logit tolerance
is then :data:`BF16_ATOL` (0.05: bf16 keeps 8 significant bits, 2**-8 relative rounding of logits
of magnitude ~10; on the exporting machine the difference is 0.0).

Steps 1 to 4 need no torch, so a wrong file or a wrong base is refused within about a second.
:func:`verify_in_fresh_process` runs :func:`verify_bundle` through the entry point
``python -m tuneproof.deliver.verify BUNDLE [--base PATH] [--device D] --out FILE`` (:mod:`tuneproof.deliver.verify`,
the module an exported bundle's ``procedure.tolerance`` names).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tuneproof.deliver.bundle import MANIFEST, MANIFEST_SHA, check_files, check_manifest_sha, read_manifest
from tuneproof.deliver.claims import check_claims
from tuneproof.errors import CheckFailed, TuneproofError
from tuneproof.io import read_json, read_jsonl, sha256_file
from tuneproof.modalities import modality_for
from tuneproof.models.base_model import BaseModelRef, load_model
from tuneproof.models.build import load_trained_model
from tuneproof.models.identity import compare_vocabulary, compare_weights
from tuneproof.models.method import cast_base_for_inference

DEVICE_ATOL = {"cpu": 1e-4, "cuda": 1e-3}  # largest allowed |logit difference| in fp32, see the module docstring
BF16_ATOL = 5e-2  # largest allowed |logit difference| of a bf16-base procedure (see the module docstring)
EXAMPLES_FILE = "verify/examples.jsonl"
ENTRY_MODULE = "tuneproof.deliver.verify"  # ``python -m`` entry of the fresh process; bundles name it


# --------------------------------------------------------------------------- loading
def _ref(path: Path, manifest: dict[str, Any]):
    b = manifest["base_model"]
    trust = bool(
        ((manifest.get("config") or {}).get("model") or {}).get("trust_remote_code", False)
    )  # as the study set it
    return BaseModelRef(
        b.get("name", str(path)),
        Path(path),
        b.get("revision", ""),
        manifest["procedure"]["model_kind"],
        "bundle",
        trust_remote_code=trust,
    )


def load_tokenizer_at(path: Path, manifest: dict[str, Any]):
    """The tokenizer of the model folder ``path``, prepared exactly as training prepared it (an
    image classifier: its image processor), by the modality of ``procedure.model_kind``."""
    return modality_for(manifest["procedure"]["model_kind"]).load_processor(_ref(path, manifest))


def procedure_atol(procedure: dict[str, Any], device: str) -> float:
    """The logit tolerance of a stored procedure: :data:`DEVICE_ATOL` of ``device`` in fp32,
    :data:`BF16_ATOL` when its base weights are held in bf16 (``procedure.base_weights``)."""
    return BF16_ATOL if procedure.get("base_weights") == "bf16" else DEVICE_ATOL[device]


def load_bundle_model(bundle: Path, manifest: dict[str, Any], base_path: Path, which: str = "payload"):
    """The model a bundle delivers, in eval mode, on the manifest's ``procedure.device``: in fp32,
    or with the base's weights in bf16 and the adapter's in fp32 when ``procedure.base_weights`` is
    ``bf16`` (the run was trained and evaluated so, ``training.bf16_base_weights``).

    Args:
        which: ``payload`` (base + ``adapter/`` through ``PeftModel.from_pretrained``, or the full
            ``model/``) or ``merged`` (the ``merged/`` folder).
    """
    proc = manifest["procedure"]
    held = proc.get("base_weights", "fp32")
    head = modality_for(proc["model_kind"]).head(proc["model_kind"])
    labels = manifest.get("labels") if head.labels_from is not None else None
    if which == "merged":
        merged = load_model(_ref(bundle / "merged", manifest), head, labels=labels, saved=True)
        model = cast_base_for_inference(merged, held)
    else:
        # the full model/, or the adapter/ onto the base held as trained (qlora: the unquantized base
        # quantized to 4-bit with the recorded config, as it was trained and evaluated)
        model = load_trained_model(
            _ref(base_path, manifest),
            head,
            bundle / manifest["payload"],
            labels=labels,
            quantization=manifest.get("quantization"),
            base_weights=held,
            source="bundle",
        )
    return model.to(proc.get("device", "cpu")).eval()


def procedure_autocast(procedure: dict[str, Any]):
    """The autocast of a stored procedure: bf16 when ``procedure.dtype`` is ``bf16``, else none (fp32)."""

    import torch  # noqa: PLC0415 - torch loads only when procedure_autocast() runs

    if procedure.get("dtype") == "bf16":
        device_type = torch.device(procedure.get("device", "cpu")).type
        return lambda: torch.autocast(device_type=device_type, dtype=torch.bfloat16)
    return contextlib.nullcontext


# --------------------------------------------------------------------------- predictions
def reproduce(
    model, tokenizer, examples: list[dict[str, Any]], procedure: dict[str, Any], root: Path | None = None
) -> list[dict[str, Any]]:
    """Predict the stored examples by the stored procedure (fp32, or bf16 autocast when
    ``procedure["dtype"]`` is ``bf16``; greedy, one batch of K, on ``procedure["device"]``: ``cpu``
    or ``cuda``, TF32 off).

    Returns one dict per example, from the modality of ``procedure.model_kind``
    (:meth:`tuneproof.modalities.modality.Modality.reproduce`; ``root``: the bundle, which holds an image
    study's ``verify/images/``): ``prediction`` and, for a classification head, ``logits`` (list of
    floats, one per label), for generation ``next_token`` (the
    :data:`~tuneproof.modalities.text.TOP_TOKENS` highest next-token logits after the prompt, as
    ``[[token id, logit], ...]``).
    """
    import torch  # noqa: PLC0415 - torch loads only when reproduce() runs

    model.eval()
    device = torch.device(procedure.get("device", "cpu"))
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    kind = procedure["model_kind"]
    return modality_for(kind).reproduce(
        model,
        tokenizer,
        examples,
        procedure,
        Path(root) if root is not None else None,
        device=device,
        autocast=procedure_autocast(procedure),
    )


def _scores(rec: dict[str, Any]) -> list[float]:
    if "logits" in rec:
        return list(rec["logits"])
    return [v for _, v in rec.get("next_token", [])]


def compare_outputs(
    stored: list[dict[str, Any]],
    fresh: list[dict[str, Any]],
    *,
    key: str = "prediction",
    scores_key: str = "",
    atol: float = DEVICE_ATOL["cpu"],
) -> dict[str, Any]:
    """Compare fresh outputs with the stored ones.

    Returns ``{"passed", "n", "identical", "mismatches": [{"id", "expected", "found"}],
    "max_abs_logit_diff", "tolerance"}``; passes when every prediction is identical and every
    logit is within ``atol`` (for generation the next-token ids must be the same too).
    """
    mism, worst, ids_differ = [], 0.0, []
    for s, f in zip(stored, fresh):
        exp = s.get(key)
        if exp != f["prediction"]:
            mism.append({"id": s["id"], "expected": exp, "found": f["prediction"]})
        ref = s.get(scores_key or ("logits" if "logits" in f else "next_token"))
        if ref is not None:
            a = list(ref) if "logits" in f else [v for _, v in ref]
            b = _scores(f)
            if "next_token" in f and [i for i, _ in ref] != [i for i, _ in f["next_token"]]:
                ids_differ.append(s["id"])
            if len(a) == len(b):
                worst = max([worst] + [abs(x - y) for x, y in zip(a, b)])
            else:
                worst = float("inf")
    passed = not mism and not ids_differ and worst <= atol
    return {
        "passed": passed,
        "n": len(stored),
        "identical": len(stored) - len(mism),
        "mismatches": mism,
        "next_token_ids_differ": ids_differ,
        "max_abs_logit_diff": worst,
        "tolerance": atol,
    }


# --------------------------------------------------------------------------- the checks
def _check(report: dict, name: str, passed: bool, detail: str, problems: list[str] | None = None) -> bool:
    report["checks"].append({"name": name, "passed": bool(passed), "detail": detail, "problems": problems or []})
    return passed


def verify_bundle(bundle: str | Path, base: str | Path | None = None, device: str | None = None) -> dict[str, Any]:
    """Run every check on ``bundle`` in this process (see the module docstring for the order).

    Args:
        device: ``cpu`` or ``cuda``; must be the device the export recorded (default: that one).

    Returns ``{"bundle", "passed", "checks": [{"name", "passed", "detail", "problems"}],
    "examples": [...fresh outputs], "merged_examples", "base_path", "seconds"}``.

    Raises:
        TuneproofError: the bundle folder or its manifest is missing/unreadable, the base model
            folder does not exist (pass ``--base``), or another device than the recorded one.
    """
    t0 = time.perf_counter()
    bundle = Path(bundle)
    man = read_manifest(bundle)
    dev = _device(man, device)
    report: dict[str, Any] = {
        "bundle": str(bundle),
        "run": man.get("run"),
        "checks": [],
        "examples": [],
        "passed": False,
    }

    problems = check_manifest_sha(bundle)
    if not _check(
        report,
        "manifest",
        not problems,
        f"{MANIFEST} sha256 " + ("matches" if not problems else "differs from") + f" {MANIFEST_SHA}",
        problems,
    ):
        return _done(report, t0)

    files = check_files(bundle, man.get("files", {}))
    problems = [f"missing file: {p}" for p in files["missing"]]
    problems += [
        f"altered file: {a['path']} (expected sha256 {a['expected']}, found {a['found']})" for a in files["altered"]
    ]
    problems += [f"extra file not in the manifest: {p}" for p in files["extra"]]
    if not _check(
        report,
        "files",
        not problems,
        f"{len(man.get('files', {}))} files listed, {len(files['missing'])} missing, {len(files['altered'])} altered"
        + (
            f", {len(files['extra'])} extra file(s) not in the manifest: {', '.join(files['extra'][:5])}"
            + (f" and {len(files['extra']) - 5} more" if len(files["extra"]) > 5 else "")
            if files["extra"]
            else ""
        ),
        problems,
    ):
        return _done(report, t0)

    problems = check_claims(bundle, man)
    if not _check(
        report,
        "claims",
        not problems,
        "metrics, comparison and training claims "
        + (
            "recomputed from the shipped outputs and log: all match"
            if not problems
            else "do not match the shipped evidence"
        ),
        problems,
    ):
        return _done(report, t0)

    bm = man["base_model"]
    base_path = Path(base) if base is not None else Path(bm["path"])
    report["base_path"] = str(base_path)
    if man["payload"] == "adapter" or base is not None:
        if not (base_path / "config.json").is_file():
            raise TuneproofError(
                f"base model not found at {base_path} (the bundle was exported from "
                f"{bm.get('name')}, revision {bm.get('revision')})",
                hint="pass --base PATH to the folder holding that exact base model",
            )
        problems = compare_vocabulary(man.get("vocabulary"), base_path) + compare_weights(bm["weight_files"], base_path)
        if bm.get("config_sha256"):
            found_cfg = sha256_file(base_path / "config.json")
            if found_cfg != bm["config_sha256"]:
                problems.append(f"config.json of {base_path}: expected sha256 {bm['config_sha256']}, found {found_cfg}")
        if not _check(
            report,
            "base weights",
            not problems,
            f"{len(bm['weight_files'])} weight file(s) and config.json of {base_path}"
            + (" identical" if not problems else " differ from the export's base"),
            problems,
        ):
            return _done(report, t0)
    else:
        _check(
            report, "base weights", True, "full model: the base is not needed to load it (pass --base to check it too)"
        )

    if man["payload"] == "adapter":
        cfg = read_json(bundle / "adapter" / "adapter_config.json")
        rev_ok = cfg.get("revision") == bm.get("revision")
        if not _check(
            report,
            "adapter config",
            rev_ok,
            f"adapter_config.json revision {cfg.get('revision')!r}"
            + (" = " if rev_ok else " != ")
            + f"base revision {bm.get('revision')!r}",
            []
            if rev_ok
            else [f"adapter_config.json revision: expected {bm.get('revision')!r}, found {cfg.get('revision')!r}"],
        ):
            return _done(report, t0)

    tok_path = base_path if man["payload"] == "adapter" else bundle / "model"
    try:
        tokenizer = load_tokenizer_at(tok_path, man)
    except TuneproofError as err:  # no tokenizer files left in the base copy, or one that cannot pad
        rec = man.get("tokenizer") or {}
        name = "image processor" if "config_sha256" in rec else "tokenizer"
        problem = f"{name} class: expected {rec.get('class')!r}, found none: {err.message}"
        _check(report, name, False, problem, [problem])
        return _done(report, t0)
    # the tokenizer check, or the image processor's: the modality of procedure.model_kind
    name, problems, detail = modality_for(man["procedure"]["model_kind"]).verify_processor(man, tokenizer)
    if not _check(report, name, not problems, detail, problems):
        return _done(report, t0)

    stored = read_jsonl(bundle / EXAMPLES_FILE)
    try:
        model = load_bundle_model(bundle, man, base_path)
    except Exception as err:  # noqa: BLE001 - any loading error is the verdict of this check
        _check(report, "reload", False, f"{type(err).__name__}: {err}".splitlines()[0], [str(err)[:500]])
        return _done(report, t0)
    how = "PeftModel.from_pretrained(base, adapter/)" if man["payload"] == "adapter" else "from_pretrained(model/)"
    if man.get("quantization"):  # qlora: the base quantized while loading, with the recorded config
        how += f" on the base in 4-bit {man['quantization']['bnb_4bit_quant_type']} (the recorded BitsAndBytesConfig)"
    mts = man.get("modules_to_save") or {}
    _check(report, "reload", True, how + (f"; modules_to_save from the saved file: {', '.join(mts)}" if mts else ""))

    fresh = reproduce(model, tokenizer, stored, man["procedure"], root=bundle)
    del model
    report["examples"] = [{"id": s["id"], **f} for s, f in zip(stored, fresh)]
    atol = procedure_atol(man["procedure"], dev)
    held = man["procedure"].get("base_weights", "fp32")
    cmp = compare_outputs(stored, fresh, atol=atol)
    report["predictions"] = cmp
    if not _check(
        report,
        "predictions",
        cmp["passed"],
        f"{cmp['identical']} of {cmp['n']} predictions identical on {dev}; max "
        f"|logit diff| {cmp['max_abs_logit_diff']:.3g} "
        f"(tolerance {atol})"
        + (
            " with the base weights in bf16 and bf16 autocast, as the run was trained and evaluated"
            if held == "bf16"
            else ""
        ),
        [f"{m['id']}: expected {m['expected']!r}, found {m['found']!r}" for m in cmp["mismatches"]]
        + [f"{i}: next-token ranking differs" for i in cmp["next_token_ids_differ"]],
    ):
        return _done(report, t0)

    if man.get("merged"):
        merged = load_bundle_model(bundle, man, base_path, which="merged")
        fresh_m = reproduce(merged, tokenizer, stored, man["procedure"], root=bundle)
        del merged
        report["merged_examples"] = [{"id": s["id"], **f} for s, f in zip(stored, fresh_m)]
        ms = [
            {
                "id": s["id"],
                "prediction": s.get("merged_prediction"),
                "logits": s.get("merged_logits"),
                "next_token": s.get("merged_next_token"),
            }
            for s in stored
        ]
        ms = [{k: v for k, v in m.items() if v is not None} for m in ms]
        cmp_m = compare_outputs(ms, fresh_m, atol=atol)
        report["merged"] = cmp_m
        _check(
            report,
            "merged",
            cmp_m["passed"],
            f"merged/: {cmp_m['identical']} of {cmp_m['n']} predictions identical to those recorded at export; "
            f"max |logit diff| {cmp_m['max_abs_logit_diff']:.3g}",
            [f"{m['id']}: expected {m['expected']!r}, found {m['found']!r}" for m in cmp_m["mismatches"]],
        )
    return _done(report, t0)


def _device(man: dict[str, Any], asked: str | None) -> str:
    """The device verification runs on: the one the stored predictions were made on."""
    dev = man["procedure"].get("device", "cpu")
    if dev not in DEVICE_ATOL:
        raise TuneproofError(f"manifest.json: procedure.device {dev!r} is not one of {sorted(DEVICE_ATOL)}")
    if asked is not None and asked != dev:
        raise TuneproofError(
            f"the stored predictions of this bundle were made on {dev}; verification compares on the same device",
            hint=f"verify with --device {dev}, or re-export with --device {asked}",
        )
    if dev == "cuda":
        import torch  # noqa: PLC0415 - torch loads only when _device() runs

        if not torch.cuda.is_available():
            raise TuneproofError(
                "this bundle's stored predictions were made on cuda and no CUDA GPU is visible",
                hint="verify on a machine with a GPU, or re-export with --device cpu",
            )
    return dev


def _done(report: dict[str, Any], t0: float) -> dict[str, Any]:
    report["passed"] = bool(report["checks"]) and all(c["passed"] for c in report["checks"])
    report["seconds"] = round(time.perf_counter() - t0, 2)
    return report


def failure_message(report: dict[str, Any]) -> str:
    """One short paragraph naming the failed check and its problems."""
    bad = [c for c in report["checks"] if not c["passed"]]
    if not bad:
        return "verified"
    c = bad[0]
    lines = [f"verify {report['bundle']}: check '{c['name']}' failed: {c['detail']}"]
    lines += [f"  {p}" for p in c["problems"][:8]]
    return "\n".join(lines)


# --------------------------------------------------------------------------- the fresh process
def verify_in_fresh_process(
    bundle: str | Path, base: str | Path | None = None, timeout: float | None = None, device: str | None = None
) -> dict[str, Any]:
    """Run :func:`verify_bundle` in a new Python process (nothing of this process's memory is
    reused: the adapter must load from the files alone) and return its report.

    Raises:
        TuneproofError / CheckFailed: re-raised from the child (missing bundle, missing base).
        TuneproofError: the child crashed (its last output lines are shown).
    """
    with tempfile.TemporaryDirectory(prefix="tuneproof-verify-") as tmp:
        out = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", ENTRY_MODULE, str(Path(bundle).resolve()), "--out", str(out)]
        if base is not None:
            cmd += ["--base", str(Path(base).resolve())]
        if device is not None:
            cmd += ["--device", device]
        env = dict(
            os.environ, TUNEPROOF_PARENT_PID=str(os.getpid()), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false"
        )
        if device != "cuda" and _recorded_device(bundle) != "cuda":
            env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU verification never initialises a GPU
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
        if not out.exists():
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
            raise TuneproofError(f"verify process exited with code {proc.returncode} without a report:\n{tail}")
        report = read_json(out)
    err = report.get("error")
    if err:
        cls = CheckFailed if err.get("exit_code") == CheckFailed.exit_code else TuneproofError
        raise cls(err["message"], hint=err.get("hint"))
    return report


def _recorded_device(bundle: str | Path) -> str | None:
    try:
        return read_manifest(Path(bundle))["procedure"].get("device")
    except Exception:  # noqa: BLE001 - the child reports a broken manifest
        return None
