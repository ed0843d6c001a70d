"""The whole protocol on an image classifier (tiny ViT, real 8x8 digits): data check, baseline,
train, eval, compare, test, export verified in a fresh process, dossier; same commands and
evidence as the text tasks."""

from __future__ import annotations

import json

import pytest

from image_tiny import make_image_study


def _cli(args, study, capsys):
    from tuneproof.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(args + ["--study", str(study)])
    return exit_.value.code, capsys.readouterr().out


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_vit):
    study = make_image_study(tmp_path_factory.mktemp("img") / "s", tiny_vit, max_steps=12, learning_rate=0.02)
    from tuneproof.cli import main

    codes = []
    for args in (["data", "check"], ["baseline"], ["train", "--skip-preflight", "tiny test study"], ["eval", "r0003"]):
        try:
            main(args + ["--study", str(study)])
        except SystemExit as e:
            codes.append(e.code)
    assert codes == [0, 0, 0, 0]
    return study


def test_data_check_reports_image_form_duplicates_and_shortcuts(trained):
    from tuneproof.io import read_json

    rep = read_json(trained / "runs" / "r0001" / "data_check.json")
    assert rep["passed"] is True and rep["sizes"] == {"test": 12, "train": 36, "validation": 12}
    images = rep["images"]
    assert images["duplicates"]["summary"] == "image duplicates: none across test/train/validation"
    assert images["shortcut"]["flag"] is False  # every digit is an 8x8 grayscale PNG: the form says nothing
    train_form = images["form"]["train"]["categories"]["7"]
    assert train_form["n"] == 12 and train_form["width"]["median"] == 8.0 and train_form["modes"] == {"L": 12}
    assert images["form"]["train"]["categories"]["7"]["after_transform"]["outputs"] == {"array float32 3x16x16": 12}


def test_train_eval_and_compare_record_classification_evidence(trained, capsys):
    from tuneproof.registry import Registry

    reg = Registry(trained)
    train = reg.get("r0003")
    assert train.status == "completed" and train.summary["budget"]["total_steps"] == 12
    ev = reg.get("r0004")
    assert set(ev.summary["metrics"]) >= {"accuracy", "macro_f1"}
    outputs = [json.loads(x) for x in (trained / "runs" / "r0004" / "outputs.jsonl").read_text().splitlines()]
    assert len(outputs) == 12 and {o["reference"] for o in outputs} == {"0", "1", "7"}
    assert all(o["prediction"] in {"0", "1", "7"} for o in outputs)
    code, out = _cli(["compare", "r0004"], trained, capsys)
    assert code in (0, 3) and "12 paired examples" in out and "macro over 3 of 3 labels present" in out


def test_export_binds_the_adapter_and_processor_and_verifies_in_a_fresh_process(trained, capsys):
    code, out = _cli(["export", "r0003"], trained, capsys)
    assert code == 0, out
    bundle = trained / "exports" / "r0003"
    man = json.loads((bundle / "manifest.json").read_text())
    assert man["procedure"]["model_kind"] == "image-classification" and man["labels"] == ["0", "1", "7"]
    assert (
        man["tokenizer"]["class"].startswith("ViTImageProcessor")
        and man["procedure"]["image_transforms"]["mode"] == "RGB"
    )
    assert (bundle / "adapter" / "preprocessor_config.json").is_file()
    assert len(list((bundle / "verify" / "images").glob("*.png"))) == man["procedure"]["k"]
    from huggingface_hub import ModelCard

    card = ModelCard.load(bundle / "README.md")  # as the Hub reads it: an image classifier, its results
    assert card.data.pipeline_tag == "image-classification" and card.data.base_model is None
    assert {r.metric_type for r in card.data.eval_results} >= {"accuracy", "macro_f1"}
    assert (
        "AutoModelForImageClassification.from_pretrained(" in card.content
        and ", num_labels=3, id2label=dict(enumerate(labels))" in card.content
    )
    assert "pass predictions: 8 of 8 predictions identical on cpu; max |logit diff| 0" in " ".join(out.split())
    from tuneproof.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["verify", str(bundle)])
    assert exit_.value.code == 0
    first = sorted((bundle / "verify" / "images").glob("*.png"))[0]
    first.write_bytes(first.read_bytes()[:-10] + b"0123456789")  # a stored image altered after export
    with pytest.raises(SystemExit) as exit_:
        main(["verify", str(bundle)])
    assert exit_.value.code != 0
    assert first.name in capsys.readouterr().out


def test_init_writes_the_image_template_that_validates(tmp_path):
    from tuneproof.context import load_study
    from tuneproof.recipes.init import run_init

    path = run_init(tmp_path / "pets", "image-classification")
    study = load_study(path)
    assert study.hypothesis.task == "image-classification" and study.model.kind == "image-classification"
    assert study.method.modules_to_save == ["classifier"] and study.data.sources[0].format == "imagefolder"


def test_preflight_runs_the_image_checks_and_passes(tmp_path, tiny_vit, capsys):
    study = make_image_study(tmp_path / "s", tiny_vit)
    for args in (["data", "check"], ["baseline"]):
        assert _cli(args, study, capsys)[0] == 0
    code, out = _cli(["preflight"], study, capsys)
    assert code == 0, out
    from tuneproof.io import read_json

    rep = read_json(study / "runs" / "r0003" / "preflight.json")
    status = {c["name"]: c["passed"] for c in rep["checks"]}
    for name in (
        "training data",
        "target modules",
        "update check",
        "step memory",
        "eval memory",
        "gradient accumulation",
        "activation checkpointing",
        "eval batch size",
    ):
        assert status[name] is True, name
    assert status["smoke pass"] is True and status["configured combination"] is True  # reloaded in a fresh process
    assert status["embedding size"] is None  # skipped, with the reason, not passed
    update = next(c for c in rep["checks"] if c["name"] == "update check")
    assert update["numbers"]["trainable_changed"] == update["numbers"]["trainable_tensors"] == 10
    train = _cli(["train"], study, capsys)  # the passed preflight lets train start without an override
    assert train[0] == 0, train[1]


def test_dossier_shows_only_what_applies_to_images(trained):
    """An image study's dossier showed a token-length table of zeros, "suggested max_length: 8",
    training "tokens/s" and the loop's "loss normalisation: per-token mean" (the preflight says
    per-example): the image modality declares none of those sections (``Modality.dossier_sections``)."""
    from tuneproof.context import StudyContext
    from tuneproof.deliver.dossier import collect, to_markdown

    ctx = StudyContext.open(trained)
    try:
        md = to_markdown(collect(ctx, plots=False))
    finally:
        ctx.registry.close()
    for text in (
        "p50 tokens",
        "suggested max_length",
        "tokens/s",
        "loss normalisation",
        "supervised tokens",
        "max_length",
    ):
        assert text not in md, text
    assert "images/s" in md and "split sizes: train 36, validation 12, test 12" in md
