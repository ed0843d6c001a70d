"""The model card (``README.md`` of a bundle), written from the manifest's facts only.

The header is built with ``huggingface_hub``'s ``ModelCardData`` (the Hub's model card
specification): ``base_model`` (a Hub id checked with ``huggingface_hub.utils.validate_repo_id``),
``base_model_relation``, ``library_name``, ``tags``, ``pipeline_tag`` (the model kind's Hub task,
``models/heads.py: Head.pipeline_tag``), ``license`` (the base's own card, or the built-in alias's),
``datasets`` (Hub ids of the built-in readers) and ``model-index`` (the evaluation results, on their
split). A base without a Hub id (a local folder) is named by its folder name in the body, never by a
path of this machine, and has no ``base_model``. The body says what the model is bound to, how to
load it, what was measured against the baseline, the guards' verdict and the observed limits. Text
from the study (its name, the behaviour, labels in verdicts and limits, reasons) goes through
``tuneproof.ui.markdown_text``, a folder or file name in code through :func:`_code`, and into the
Python snippet as a string literal (``json.dumps``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCardData
from huggingface_hub.repocard import metadata_load
from huggingface_hub.utils import HFValidationError, validate_repo_id

from tuneproof.deliver.limits import limits_lines
from tuneproof.modalities import modality_for
from tuneproof.ui import markdown_text, visible_text

# the Hub ids of the built-in aliases (the alias weights may be a conversion: the card says so)
ALIAS_HUB_ID = {
    "smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "minilm-l6": "sentence-transformers/all-MiniLM-L6-v2",
}
# their licences, as their Hub cards state them
ALIAS_LICENSE = {"smollm2-135m-instruct": "apache-2.0", "minilm-l6": "apache-2.0"}
# the Hub ids of the data sets the built-in readers read (data.sources[].format)
DATASET_HUB_ID = {"banking77": "PolyAI/banking77"}
# a folder of the Hugging Face cache: .../models--ORG--NAME/snapshots/<commit>
_SNAPSHOT = re.compile(r"models--(?P<org>[^/]+?)--(?P<name>[^/]+)/snapshots/(?P<rev>[0-9a-f]{40})/?$")
_COMMIT = re.compile(r"[0-9a-f]{40}")


def _fmt(x: Any) -> str:
    """A value as the card prints it: 3 decimals for floats, ``-`` for None."""
    return f"{x:.3f}" if isinstance(x, float) else ("-" if x is None else str(x))


def _md(x: Any, one_line: bool = True) -> str:
    return markdown_text(x, one_line=one_line, limit=None)


def _code(x: Any) -> str:
    """``x`` as a Markdown code span: fenced by more backticks than any run inside it, controls visible."""
    text = visible_text(x, one_line=True, limit=None)
    fence = "`" * (1 + max((len(run) for run in re.findall(r"`+", text)), default=0))
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _repo_id(name: str | None) -> str | None:
    """``name`` when it is a valid Hub model id (``org/name``), else None."""
    if not name or "/" not in name or name.startswith((".", "/", "~")):
        return None
    try:
        validate_repo_id(name)
    except HFValidationError:
        return None
    return name


def hub_base(b: dict[str, Any]) -> tuple[str | None, str | None]:
    """``(Hub id, Hub commit)`` of the manifest's base model: a built-in alias's Hub id (no commit:
    its weights are a conversion), a Hub id with its pinned commit, or a folder of the Hugging Face
    cache (``models--ORG--NAME/snapshots/<commit>``); ``(None, None)`` for any other local folder."""
    if b["name"] in ALIAS_HUB_ID:
        return ALIAS_HUB_ID[b["name"]], None
    rev = b.get("revision") if isinstance(b.get("revision"), str) and _COMMIT.fullmatch(b["revision"]) else None
    if b.get("source") == "hub" and _repo_id(b["name"]):
        return b["name"], rev
    m = _SNAPSHOT.search(str(b.get("path", "")).replace("\\", "/"))
    if m and _repo_id(f"{m['org']}/{m['name']}"):
        return f"{m['org']}/{m['name']}", m["rev"]
    return None, None


def base_license(b: dict[str, Any]) -> str | None:
    """The base model's licence: the alias's, else the ``license`` of the base folder's own model
    card (``README.md`` metadata), else None."""
    if b["name"] in ALIAS_LICENSE:
        return ALIAS_LICENSE[b["name"]]
    card = Path(str(b.get("path", ""))) / "README.md"
    try:
        meta = metadata_load(card) if card.is_file() else None
    except (OSError, ValueError, UnicodeDecodeError):
        meta = None
    value = (meta or {}).get("license")
    return value if isinstance(value, str) and value else None


def local_name(b: dict[str, Any]) -> str:
    """A base without a Hub id, named plainly: its folder's name (never a path of this machine)."""
    return Path(str(b["name"]).rstrip("/\\")).name or str(b["name"])


def card_metadata(man: dict[str, Any]) -> ModelCardData:
    """The card's metadata block (see the module docstring)."""
    b, proc, cfg = man["base_model"], man["procedure"], man["config"]
    head = next(h for h in modality_for(proc["model_kind"]).heads if h.kind == proc["model_kind"])
    hub_id, _ = hub_base(b)
    adapter = man["payload"] == "adapter"
    datasets = sorted({DATASET_HUB_ID[s["format"]] for s in cfg["data"]["sources"] if s["format"] in DATASET_HUB_ID})
    results = []
    comp = man.get("comparison")
    scores = {k: v.get("cand") for k, v in comp["metrics"].items()} if comp else dict(man.get("metrics") or {})
    split = cfg["eval"]["split"]
    for metric, value in scores.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            results.append(
                EvalResult(
                    task_type=head.pipeline_tag or proc["model_kind"],
                    dataset_type=datasets[0] if datasets else "local",
                    dataset_name=datasets[0] if datasets else f"{cfg['name']} data",
                    dataset_split=split,
                    metric_type=metric,
                    metric_name=metric,
                    metric_value=float(value),
                )
            )
    tags = ["tuneproof", cfg["hypothesis"]["task"]] + (["peft", "lora"] if adapter else ["full-fine-tuning"])
    return ModelCardData(
        base_model=hub_id,
        base_model_relation=("adapter" if adapter else "finetune") if hub_id else None,
        library_name="peft" if adapter else "transformers",
        license=base_license(b),
        datasets=datasets or None,
        tags=tags,
        pipeline_tag=head.pipeline_tag,
        model_name=f"{cfg['name']}-{man['run']}",
        eval_results=results or None,
    )


def model_card(man: dict[str, Any]) -> str:
    """The README.md text for a manifest (before its ``files`` list is added)."""
    b = man["base_model"]
    proc = man["procedure"]
    hub_id, hub_rev = hub_base(b)
    head = next(h for h in modality_for(proc["model_kind"]).heads if h.kind == proc["model_kind"])
    cfg = man["config"]
    lines = [
        "---",
        card_metadata(man).to_yaml(),
        "---",
        "",
        f"# {_md(cfg['name'])}: {man['run']} ({'LoRA adapter' if man['payload'] == 'adapter' else 'full model'})",
        "",
        f"Behaviour: {_md(cfg['hypothesis']['behaviour'], one_line=False)}",
        "",
    ]
    if man.get("forced"):
        lines += [
            f"**Exported with --force: the train run is {man['forced']['status']}"
            + (f" ({_md(man['forced']['reason'])})" if man["forced"].get("reason") else "")
            + ".**",
            "",
        ]
    where = (
        f"- Hub id: `{hub_id}`" + (f" (commit `{hub_rev}`)" if hub_rev else "")
        if hub_id
        else f"- local folder {_code(local_name(b))} (no Hub id: the copy whose hashes follow)"
    )
    if b["name"] in ALIAS_HUB_ID:
        where += f", tuneproof's built-in {_code(b['name'])}"
    lines += [
        "## Base model (exact)",
        "",
        where,
        f"- revision: `{b['revision']}`",
        f"- weights sha256 (combined over {len(b['weight_files'])} file(s)): `{b['weights_sha256']}`",
    ]
    lines += [f"  - {_code(k)}: `{v}`" for k, v in b["weight_files"].items()]
    if b.get("source_weight_sha256") and b["source_weight_sha256"] != b["weight_files"]:
        lines.append(
            "- converted from: "
            + ", ".join(f"{_code(k)} sha256 `{v}`" for k, v in b["source_weight_sha256"].items())
            + " (the weights above are that conversion, not the Hub's original files)"
        )
    licence = base_license(b)
    lines.append(
        f"- licence: {_md(licence)} (the base's)"
        if licence
        else "- licence: not recorded (the base folder has no model card): the base model's own licence applies"
    )
    t = man["tokenizer"]
    if t.get("class") and head.token_inputs:
        lines += [
            f"- tokenizer: {t.get('class')}, vocabulary {t.get('vocab_size')}, "
            f"probe-text token ids sha256 `{t.get('probe_hash')}`",
        ]
    elif t.get("class"):
        lines.append(f"- image processor: {t.get('class')}")
    lines.append("")
    lines += ["## Load", "", "```python"]
    loader = head.auto_class
    # the base by its Hub id (pinned to its commit when known), else by its folder name: never a path of this machine
    source = f'"{hub_id}"' + (f', revision="{hub_rev}"' if hub_rev else "") if hub_id else json.dumps(local_name(b))
    labelled = f", num_labels={len(man.get('labels') or [])}" if head.labels_from else ""
    q = man.get("quantization")
    if man["payload"] == "adapter" and q:  # qlora: the unquantized base above, quantized to 4-bit while loading
        extra = labelled
        lines += [
            "import torch",
            "from peft import PeftModel",
            f"from transformers import BitsAndBytesConfig, {loader}",
            "",
            f'bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="{q["bnb_4bit_quant_type"]}", '
            f"bnb_4bit_use_double_quant={q['bnb_4bit_use_double_quant']},",
            f"                         bnb_4bit_compute_dtype=torch.{q['bnb_4bit_compute_dtype']}, "
            f"bnb_4bit_quant_storage=torch.{q['bnb_4bit_quant_storage']}"
            + (f", llm_int8_skip_modules={q['llm_int8_skip_modules']!r}" if q.get("llm_int8_skip_modules") else "")
            + ")",
            f"base = {loader}.from_pretrained({source}{extra}, quantization_config=bnb)  # the base above, in 4-bit",
            'model = PeftModel.from_pretrained(base, "adapter")',
        ]
    elif man["payload"] == "adapter":
        extra = labelled
        lines += [
            "from peft import PeftModel",
            f"from transformers import {loader}",
            "",
            f"base = {loader}.from_pretrained({source}{extra})  # the exact base above",
            'model = PeftModel.from_pretrained(base, "adapter")',
        ]
        if proc.get("base_weights") == "bf16":  # trained and evaluated so (training.bf16_base_weights)
            lines += [
                "# trained and evaluated with the base weights in bf16 (the adapter in fp32) under bf16 autocast:",
                "# cast every base (non-adapter) weight to torch.bfloat16 to reproduce the recorded results",
            ]
    else:
        lines += [f"from transformers import {loader}", f'model = {loader}.from_pretrained("model")']
    if b.get("source_weight_sha256") and b["source_weight_sha256"] != b["weight_files"]:
        lines.append("# the base trained on is a conversion (see above): check your copy with tuneproof verify")
    lines += ["```", ""]
    if q:
        lines += [
            "QLoRA: the adapter was trained on this base loaded in 4-bit by "
            f"bitsandbytes {q.get('bitsandbytes_version')} "
            f"({q['bnb_4bit_quant_type']}, double quantization "
            f"{'on' if q['bnb_4bit_use_double_quant'] else 'off'}, compute dtype "
            f"{q['bnb_4bit_compute_dtype']}, storage {q['bnb_4bit_quant_storage']}). The hashes above are those of the "
            "unquantized files; the 4-bit weights are made from them while loading, so load the base with this config "
            "(`pip install bitsandbytes==0.50.2`) to get the model that was "
            "evaluated. Loaded without it, the adapter sits on "
            "full-precision weights it was not trained on. The baseline is the "
            "unquantized base: the deltas below include "
            "the effect of the 4-bit quantization.",
            "",
        ]
    lines += ["Check the base and the predictions first: `tuneproof verify BUNDLE --base PATH`.", ""]
    if man.get("merged"):
        lines += [
            "`merged/` holds the base with the adapter merged in "
            '(safetensors); load it with `from_pretrained("merged")`.',
            "",
        ]
    m = cfg["method"]
    lines += [
        "## Training",
        "",
        f"- method: {m['kind']}"
        + (
            f", r {m['r']}, alpha {m['alpha']}, dropout {m['dropout']}, target modules {', '.join(m['target_modules'])}"
            if m["kind"] in ("lora", "qlora")
            else ""
        ),
    ]
    if man.get("modules_to_save"):
        lines.append(
            "- modules_to_save (saved in full): "
            + ", ".join(f"{k} ({len(v)} tensors)" for k, v in man["modules_to_save"].items())
        )
    tr = cfg["training"]
    lines += [
        f"- steps {man.get('train', {}).get('steps')}, micro-batch {tr['micro_batch_size']}, gradient accumulation "
        f"{tr['gradient_accumulation_steps']}, learning rate "
        f"{tr['learning_rate']}, max_length {tr['max_length']}, seed {tr['seed']}",
        f"- data fingerprint `{(man.get('data_fingerprint') or {}).get('hash')}`",
        f"- evaluation fingerprint `{(man.get('eval_fingerprint') or {}).get('hash')}`",
        "",
    ]
    lines += ["## Results (evaluation split, same procedure as the baseline)", ""]
    comp = man.get("comparison")
    if comp:
        lines += ["| metric | baseline | this model | delta | 95% CI |", "|---|---|---|---|---|"]
        for k, v in comp["metrics"].items():
            ci = v.get("ci") or [None, None]
            lines.append(
                f"| {_md(k)} | {_fmt(v.get('base'))} | {_fmt(v.get('cand'))} | "
                f"{_fmt(v.get('delta'))} | [{_fmt(ci[0])}, {_fmt(ci[1])}] |"
            )
        verdict = f"**{comp.get('verdict')}** ({_md(comp.get('detail'))})"
        lines += ["", f"Verdict of the hypothesis and its guards: {verdict}", ""]
        for v in comp.get("verdicts") or []:
            lines.append(f"- {v['kind']} {v['verdict']}: {_md(v['name'])}")
        lines.append("")
        lines += _hypothesis_lines(man.get("hypothesis") or {}, comp)
    elif man.get("metrics"):
        lines += (
            ["No comparison with the baseline was run.", ""]
            + [f"- {k}: {_fmt(v)}" for k, v in man["metrics"].items()]
            + [""]
        )
    else:
        lines += ["Not evaluated.", ""]
    lines += ["## Limits observed", ""]
    lim = limits_lines(man.get("limits") or {})
    lines += [f"- {_md(x)}" for x in lim] if lim else ["- none recorded"]
    lines.append("")
    return "\n".join(lines)


def _hypothesis_lines(h: dict[str, Any], comp: dict[str, Any]) -> list[str]:
    """Which hypothesis the verdict follows, and the changes made to it after training."""
    if not h.get("frozen_hash"):
        return []
    lines = [
        f"Judged against the {h.get('judged_against')} hypothesis; the hypothesis was frozen with the first train run "
        f"{h.get('frozen_run')} (sha256 `{str(h.get('frozen_hash'))[:16]}`)."
    ]
    if h.get("changed"):
        other = "edited" if h.get("judged_against") == "frozen" else "frozen"
        lines += ["", "The study file's hypothesis was changed after training (frozen -> edited):", ""]
        lines += [f"- `{c['key']}`: {_md(str(c['old']))} -> {_md(str(c['new']))}" for c in h.get("changes", [])]
        lines += [
            "",
            f"Verdict with the {other} hypothesis: **{comp.get('verdict_' + other)}** "
            f"({_md(comp.get('detail_' + other))})",
        ]
    if h.get("use_edited_reason"):
        lines += [
            "",
            "Judged against the edited hypothesis at the user's request "
            f"(--use-edited-hypothesis): {_md(h['use_edited_reason'])}",
        ]
    return lines + [""]
