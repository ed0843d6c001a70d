"""Export of a LoRA classifier with modules_to_save [classifier] (docs/CASES.md C6): the bundle layout,
the manifest, the model card, and logits identical before saving and after a reload in a new
process."""

from __future__ import annotations

import json

import torch

from tuneproof.deliver.bundle import file_hashes, safetensors_keys
from tuneproof.deliver.bundle_verification import reproduce
from tuneproof.io import read_json, read_jsonl, sha256_file
from tuneproof.models.identity import combined_weights_hash


def test_c6_logits_before_saving_equal_logits_after_reload_in_a_new_process(cls_bundle):
    bundle = cls_bundle["bundle"]
    man = read_json(bundle / "manifest.json")
    stored = read_jsonl(bundle / "verify" / "examples.jsonl")
    assert len(stored) == 6 and {s["category"] for s in stored} == {"pos", "<i>neg</i>&"}  # round-robin over classes
    # the fresh process that export started (tuneproof.deliver.verify in a subprocess)
    report = read_json(cls_bundle["dir"] / "runs" / cls_bundle["export"] / "verify.json")
    assert report["passed"] is True
    assert [c["name"] for c in report["checks"]] == [
        "manifest",
        "files",
        "claims",
        "base weights",
        "adapter config",
        "tokenizer",
        "reload",
        "predictions",
        "merged",
    ]
    fresh = {e["id"]: e["logits"] for e in report["examples"]}
    # the trained model as it was in memory before save_pretrained, same inputs, same batch
    from tuneproof.deliver.bundle_verification import load_tokenizer_at

    tok = load_tokenizer_at(cls_bundle["base"], man)
    before = reproduce(cls_bundle["model_before_save"], tok, stored, man["procedure"])
    for s, b in zip(stored, before):
        assert len(b["logits"]) == 2
        assert fresh[s["id"]] == b["logits"]  # bitwise identical floats
        assert s["logits"] == b["logits"]  # and what export stored
    assert report["predictions"]["max_abs_logit_diff"] == 0.0
    assert report["predictions"]["identical"] == 6


def test_c6_saved_files_contain_the_trained_head(cls_bundle):
    bundle = cls_bundle["bundle"]
    keys = safetensors_keys(bundle / "adapter" / "adapter_model.safetensors")
    assert "base_model.model.classifier.weight" in keys and "base_model.model.classifier.bias" in keys
    man = read_json(bundle / "manifest.json")
    assert man["modules_to_save"] == {
        "classifier": ["base_model.model.classifier.bias", "base_model.model.classifier.weight"]
    }
    from safetensors.torch import load_file

    saved = load_file(str(bundle / "adapter" / "adapter_model.safetensors"))
    head = cls_bundle["model_before_save"].base_model.model.classifier.modules_to_save["default"]
    assert torch.equal(saved["base_model.model.classifier.weight"], head.weight.detach())
    assert torch.equal(saved["base_model.model.classifier.bias"], head.bias.detach())


def test_standard_peft_layout_loads_unchanged_and_carries_the_revision(cls_bundle):
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    bundle = cls_bundle["bundle"]
    man = read_json(bundle / "manifest.json")
    cfg = json.loads((bundle / "adapter" / "adapter_config.json").read_text())
    assert cfg["revision"] == man["base_model"]["revision"] and cfg["revision"].startswith("sha256:")
    assert sorted(set(cfg["modules_to_save"])) == [
        "classifier",
        "score",
    ]  # PEFT's SEQ_CLS defaults; classifier is the one saved
    base = AutoModelForSequenceClassification.from_pretrained(cls_bundle["base"], num_labels=2)
    model = PeftModel.from_pretrained(base, bundle / "adapter").eval()
    stored = read_jsonl(bundle / "verify" / "examples.jsonl")
    from tuneproof.deliver.bundle_verification import load_tokenizer_at

    out = reproduce(model, load_tokenizer_at(cls_bundle["base"], man), stored, man["procedure"])
    assert [o["logits"] for o in out] == [s["logits"] for s in stored]
    assert [o["prediction"] for o in out] == [s["prediction"] for s in stored]


def test_manifest_binds_the_exact_base_and_lists_every_file(cls_bundle):
    bundle = cls_bundle["bundle"]
    man = read_json(bundle / "manifest.json")
    assert man["schema_version"] == 1 and man["kind"] == "tuneproof-export" and man["payload"] == "adapter"
    b = man["base_model"]
    assert b["weight_files"] == {"model.safetensors": sha256_file(cls_bundle["base"] / "model.safetensors")}
    assert b["weights_sha256"] == combined_weights_hash(b["weight_files"])
    t = man["tokenizer"]
    assert t["class"] == "BertTokenizer" and t["vocab_size"] == 41 and len(t["probe_hash"]) == 64
    assert man["files"] == file_hashes(bundle)  # every file but the manifest, with its sha256
    assert {
        "README.md",
        "adapter/adapter_model.safetensors",
        "adapter/adapter_config.json",
        "merged/model.safetensors",
        "results/compare.json",
        "results/eval.json",
        "results/limits.json",
        "verify/examples.jsonl",
    } <= set(man["files"])
    ids = cls_bundle["ids"]
    assert man["run"] == ids["train"] and man["eval_run"] == ids["eval"]
    assert man["comparison"]["compare_run"] == ids["compare"] and man["comparison"]["baseline_run"] == ids["baseline"]
    assert man["comparison"]["verdict"] in ("pass", "fail", "inconclusive")
    assert man["data_fingerprint"]["hash"] and man["eval_fingerprint"]["hash"]
    assert man["config"]["method"]["modules_to_save"] == ["classifier"]
    assert man["environment"]["torch"] == torch.__version__
    assert man["forced"] is None and man["merged"] is True
    assert man["reference"]["merge"]["n"] == 6
    lim = man["limits"]
    assert set(lim) >= {"regressed", "weak", "failures", "broken", "test_set", "notes"}
    assert lim["test_set"] == {"reads": 0, "candidates": {}, "reused": False, "note": lim["test_set"]["note"]}
    # typical failures are "<true> predicted as <pred>" with example ids, counted on the eval outputs
    outputs = read_jsonl(cls_bundle["dir"] / "runs" / ids["eval"] / "outputs.jsonl")
    assert sum(f["count"] for f in lim["failures"]) == sum(1 for o in outputs if not o["correct"])


def test_model_card_has_the_hugging_face_header(cls_bundle):
    from huggingface_hub import ModelCard

    text = (cls_bundle["bundle"] / "README.md").read_text()
    card = ModelCard.load(cls_bundle["bundle"] / "README.md")  # as the Hub reads it
    data = card.data
    # a local base has no Hub id: no base_model, and the card names its folder, never its path here
    assert data.library_name == "peft" and data.base_model is None and str(cls_bundle["base"]) not in text
    assert {"tuneproof", "classification", "peft", "lora"} <= set(data.tags)
    assert data.pipeline_tag == "text-classification"
    man = read_json(cls_bundle["bundle"] / "manifest.json")
    assert man["base_model"]["revision"] in text and man["base_model"]["weights_sha256"] in text
    results = {r.metric_type: (r.metric_value, r.dataset_split) for r in data.eval_results}
    split = man["config"]["eval"]["split"]
    assert results == {k: (v["cand"], split) for k, v in man["comparison"]["metrics"].items()}
    labels = len(man["labels"])
    assert f'from_pretrained("{cls_bundle["base"].name}", num_labels={labels}, id2label=dict(enumerate(labels))' in text
    assert f"labels = {json.dumps(man['labels'])}  # class names, in the order of the model's outputs" in text
    assert 'PeftModel.from_pretrained(base, "adapter")' in text and "## Limits observed" in text


def test_merged_model_reproduces_its_predictions(cls_bundle):
    report = read_json(cls_bundle["dir"] / "runs" / cls_bundle["export"] / "verify.json")
    assert report["merged"]["passed"] and report["merged"]["identical"] == 6
    from tuneproof.deliver.bundle import safetensors_keys as keys

    merged = keys(cls_bundle["bundle"] / "merged" / "model.safetensors")
    assert "classifier.weight" in merged and not any("lora_" in k for k in merged)
