"""The model card (``README.md`` of a bundle), written from the manifest's facts only.

The header is the Hugging Face model card metadata block (YAML between ``---`` lines; keys from
the Hub's model card specification: ``base_model``, ``library_name``, ``tags``,
``pipeline_tag``); the body says what the model is bound to, how to load it, what was measured
against the baseline, the guards' verdict and the observed limits.
"""

from __future__ import annotations

from typing import Any

import yaml

from tuneproof.deliver.limits import limits_lines

# the Hub ids of the built-in aliases (the alias weights may be a conversion: the card says so)
ALIAS_HUB_ID = {
    "smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "minilm-l6": "sentence-transformers/all-MiniLM-L6-v2",
}
PIPELINE_TAG = {"causal-lm": "text-generation", "sequence-classification": "text-classification"}


def _fmt(x: Any) -> str:
    """A value as the card prints it: 3 decimals for floats, ``-`` for None."""
    return f"{x:.3f}" if isinstance(x, float) else ("-" if x is None else str(x))


def model_card(man: dict[str, Any]) -> str:
    """The README.md text for a manifest (before its ``files`` list is added)."""
    b = man["base_model"]
    proc = man["procedure"]
    base_id = ALIAS_HUB_ID.get(b["name"], b["name"])
    meta = {
        "base_model": base_id,
        "library_name": "peft" if man["payload"] == "adapter" else "transformers",
        "tags": ["tuneproof", man["config"]["hypothesis"]["task"]]
        + (["peft", "lora"] if man["payload"] == "adapter" else ["full-fine-tuning"]),
        "pipeline_tag": PIPELINE_TAG.get(proc["model_kind"], "text-generation"),
    }
    cfg = man["config"]
    lines = [
        "---",
        yaml.safe_dump(meta, sort_keys=False).strip(),
        "---",
        "",
        f"# {cfg['name']}: {man['run']} ({'LoRA adapter' if man['payload'] == 'adapter' else 'full model'})",
        "",
        f"Behaviour: {cfg['hypothesis']['behaviour']}",
        "",
    ]
    if man.get("forced"):
        lines += [
            f"**Exported with --force: the train run is {man['forced']['status']}"
            + (f" ({man['forced']['reason']})" if man["forced"].get("reason") else "")
            + ".**",
            "",
        ]
    lines += [
        "## Base model (exact)",
        "",
        f"- id or path: `{b['name']}`" + (f" (Hub id {base_id})" if base_id != b["name"] else ""),
        f"- revision: `{b['revision']}`",
        f"- weights sha256 (combined over {len(b['weight_files'])} file(s)): `{b['weights_sha256']}`",
    ]
    lines += [f"  - `{k}`: `{v}`" for k, v in b["weight_files"].items()]
    if b.get("source_weight_sha256") and b["source_weight_sha256"] != b["weight_files"]:
        lines.append(
            "- converted from: "
            + ", ".join(f"`{k}` sha256 `{v}`" for k, v in b["source_weight_sha256"].items())
            + " (the weights above are that conversion, not the Hub's original files)"
        )
    t = man["tokenizer"]
    lines += [
        f"- tokenizer: {t.get('class')}, vocabulary {t.get('vocab_size')}, "
        f"probe-text token ids sha256 `{t.get('probe_hash')}`",
        "",
    ]
    lines += ["## Load", "", "```python"]
    loader = (
        "AutoModelForSequenceClassification"
        if proc["model_kind"] == "sequence-classification"
        else "AutoModelForCausalLM"
    )
    q = man.get("quantization")
    if man["payload"] == "adapter" and q:  # qlora: the unquantized base above, quantized to 4-bit while loading
        extra = (
            f", num_labels={len(man.get('labels') or [])}" if proc["model_kind"] == "sequence-classification" else ""
        )
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
            f'base = {loader}.from_pretrained("{b["path"]}"{extra}, '
            "quantization_config=bnb)  # the exact base above, in 4-bit",
            'model = PeftModel.from_pretrained(base, "adapter")',
        ]
    elif man["payload"] == "adapter":
        extra = (
            f", num_labels={len(man.get('labels') or [])}" if proc["model_kind"] == "sequence-classification" else ""
        )
        lines += [
            "from peft import PeftModel",
            f"from transformers import {loader}",
            "",
            f'base = {loader}.from_pretrained("{b["path"]}"{extra})  # the exact base above',
            'model = PeftModel.from_pretrained(base, "adapter")',
        ]
        if proc.get("base_weights") == "bf16":  # trained and evaluated so (training.bf16_base_weights)
            lines += [
                "# trained and evaluated with the base weights in bf16 (the adapter in fp32) under bf16 autocast:",
                "# cast every base (non-adapter) weight to torch.bfloat16 to reproduce the recorded results",
            ]
    else:
        lines += [f"from transformers import {loader}", f'model = {loader}.from_pretrained("model")']
    lines += ["```", ""]
    if q:
        lines += [
            "QLoRA: the adapter was trained on this base loaded in 4-bit by "
            f"bitsandbytes {q.get('bitsandbytes_version')} "
            f"({q['bnb_4bit_quant_type']}, double quantization "
            f"{'on' if q['bnb_4bit_use_double_quant'] else 'off'}, compute dtype "
            f"{q['bnb_4bit_compute_dtype']}, storage {q['bnb_4bit_quant_storage']}). The hashes above are those of the "
            "unquantized files; the 4-bit weights are made from them while loading, so load the base with this config "
            "(`pip install 'tuneproof[qlora]'`) to get the model that was "
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
                f"| {k} | {_fmt(v.get('base'))} | {_fmt(v.get('cand'))} | "
                f"{_fmt(v.get('delta'))} | [{_fmt(ci[0])}, {_fmt(ci[1])}] |"
            )
        lines += ["", f"Verdict of the hypothesis and its guards: **{comp.get('verdict')}** ({comp.get('detail')})", ""]
        for v in comp.get("verdicts") or []:
            lines.append(f"- {v['kind']} {v['verdict']}: {v['name']}")
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
    lines += [f"- {x}" for x in lim] if lim else ["- none recorded"]
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
        lines += [f"- `{c['key']}`: {c['old']} -> {c['new']}" for c in h.get("changes", [])]
        lines += [
            "",
            f"Verdict with the {other} hypothesis: **{comp.get('verdict_' + other)}** ({comp.get('detail_' + other)})",
        ]
    if h.get("use_edited_reason"):
        lines += [
            "",
            "Judged against the edited hypothesis at the user's request "
            f"(--use-edited-hypothesis): {h['use_edited_reason']}",
        ]
    return lines + [""]
