"""One behavioural matrix over every modality (PEFT's lesson: the same invariants for every variant).

Each row is a tiny local study of one model kind (nothing is downloaded): a causal LM and a
sequence classifier (text), a ViT on 8x8 digits (image). Adding a modality = one module in
``tuneproof.modalities`` + one row in ``ROWS`` below (docs/ARCHITECTURE.md, "One seam per modality").
"""

from __future__ import annotations

import contextlib
import json
import sys
import typing
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
for sub in ("training", "deliver", "images"):
    sys.path.insert(0, str(TESTS / sub))

from tuneproof.context import StudyContext  # noqa: E402
from tuneproof.errors import TuneproofError  # noqa: E402
from tuneproof.modalities import MODALITIES, modality_for  # noqa: E402
from tuneproof.modalities.modality import (  # noqa: E402
    IMAGE_FORM,
    LOSS_NORMALISATION,
    SUGGESTED_MAX_LENGTH,
    TEXT_CHECKS,
    TOKEN_LENGTHS,
)
from tuneproof.study import ModelSpec  # noqa: E402


def _causal(root: Path) -> Path:
    from tiny_study import build_base, make_study

    return make_study(root / "study", build_base(root / "base"), prepare=False)


def _sequence_classifier(root: Path) -> Path:
    from deliver_tiny import build_bert_base, make_cls_study

    return make_cls_study(root / "study", build_bert_base(root / "base"))


def _image(root: Path) -> Path:
    from image_tiny import build_vit, make_image_study

    return make_image_study(root / "study", build_vit(root / "base"))


# row -> (study builder, model kind, modality name)
ROWS = {
    "text-causal-lm": (_causal, "causal-lm", "text"),
    "text-sequence-classification": (_sequence_classifier, "sequence-classification", "text"),
    "image-classification": (_image, "image-classification", "image"),
}
CPU = "cpu"
NO_AUTOCAST = contextlib.nullcontext


@pytest.fixture(scope="module", params=list(ROWS))
def row(request, tmp_path_factory):
    """``(name, ctx, model)``: the row's study opened, its base loaded on the CPU in fp32, eval mode."""
    from tuneproof.models.base_model import load_model

    build, kind, _ = ROWS[request.param]
    ctx = StudyContext.open(build(tmp_path_factory.mktemp(request.param)))
    assert ctx.model_kind == kind
    model = load_model(ctx.base, ctx.head, labels=ctx.head_labels).eval()
    yield request.param, ctx, model
    ctx.registry.close()


def test_every_model_kind_has_one_modality_and_a_row():
    kinds = [k for k in typing.get_args(ModelSpec.model_fields["kind"].annotation) if k != "auto"]
    assert sorted(k for m in MODALITIES for k in m.model_kinds) == sorted(kinds)  # each kind served once
    assert sorted(kind for _, kind, _ in ROWS.values()) == sorted(kinds)
    assert {m.name for m in MODALITIES} == {name for _, _, name in ROWS.values()}
    with pytest.raises(TuneproofError, match="no modality serves 'audio-classification'"):
        modality_for("audio-classification")


def test_declared_sections_and_checks_are_known_names():
    known = {TOKEN_LENGTHS, SUGGESTED_MAX_LENGTH, TEXT_CHECKS, LOSS_NORMALISATION, IMAGE_FORM}
    for m in MODALITIES:
        assert set(m.dossier_sections) <= known, m.name
        assert m.unit and m.logit, m.name


def test_every_preflight_check_runs_or_is_skipped_with_why_on_every_modality():
    """A new modality gets a function or a stated reason in the preflight table's rows; the rows a modality
    neither runs nor lists are the token-length ones (an image has no tokens to pack, chunk or measure)."""
    from tuneproof.preflight.checks import CHECKS

    silent = {m.name: set() for m in MODALITIES}
    for check in CHECKS:
        assert check.run, check.name
        for m in MODALITIES:
            assert not (m.name in check.run and m.name in check.skipped_for), (check.name, m.name)
            assert check.skipped_for.get(m.name, "x").strip(), (check.name, m.name)
            if m.name not in check.run and m.name not in check.skipped_for:
                silent[m.name].add(check.name)
    assert silent == {"text": set(), "image": {"max micro-batch", "packing", "chunked loss"}}


def test_the_context_asks_the_modality_of_its_model_kind(row):
    name, ctx, _ = row
    assert ctx.modality is modality_for(ctx.model_kind) and ctx.modality.name == ROWS[name][2]
    assert not hasattr(ctx, "is_image")


def test_pipeline_encodes_and_collates_one_row_per_example(row):
    _, ctx, _ = row
    m = ctx.modality
    train = ctx.split("train")[:4]
    encoded = m.encode_for_training(ctx.pipeline, train)
    assert [e.id for e in encoded] == [e.id for e in train] and not any(e.faults for e in encoded)
    batch = m.collate(encoded, getattr(ctx.tokenizer, "pad_token_id", 0) or 0)
    assert "labels" in batch and all(v.shape[0] == len(train) for v in batch.values())
    if m.name == "image":
        assert list(batch["pixel_values"].shape) == [4, 3, 16, 16]
        assert batch["labels"].tolist() == [e.class_index for e in encoded]
    else:
        assert batch["input_ids"].shape == batch["attention_mask"].shape
        assert batch["input_ids"].shape[1] <= ctx.study.training.max_length


def test_predict_gives_one_answer_per_example_whatever_the_batch_size(row):
    _, ctx, model = row
    examples = ctx.eval_examples()
    done = []
    preds = ctx.modality.predict(ctx, model, examples, device=CPU, autocast=NO_AUTOCAST, progress=done.append)
    assert len(preds) == len(examples) and all(isinstance(p, str) for p in preds) and sum(done) == len(examples)
    if ctx.head_labels is not None:
        assert set(preds) <= set(ctx.head_labels)
    # docs/CASES.md C22
    assert ctx.modality.predict(ctx, model, examples, device=CPU, autocast=NO_AUTOCAST, batch_size=1) == preds


def test_scores_give_one_row_of_logits_per_example(row):
    _, ctx, model = row
    examples = ctx.eval_examples()[:3]
    scores = ctx.modality.scores(ctx, model, examples)
    assert len(scores) == len(examples)
    width = len(ctx.head_labels) if ctx.head_labels is not None else 5
    assert all(len(s) == width and all(isinstance(v, float) for _, v in s) for s in scores)
    assert ctx.modality.scores(ctx, model, examples) == scores


def test_processor_identity_is_stable_and_json(row):
    _, ctx, _ = row
    again = StudyContext.open(ctx.study_dir)
    assert again.tokenizer is not ctx.tokenizer
    assert ctx.modality.processor_identity(again) == ctx.modality.processor_identity(ctx) == ctx.tokenizer_identity
    assert json.loads(json.dumps(ctx.tokenizer_identity)) == ctx.tokenizer_identity
    vocabulary = ctx.modality.vocabulary_record(ctx.base.path, ctx.tokenizer)
    assert (vocabulary is None) == (ctx.modality.name == "image")
    again.registry.close()


def test_duplicate_input_keeps_every_split(row):
    _, ctx, _ = row
    dup = ctx.modality.duplicate_input(ctx.all_splits)
    assert set(dup) == set(ctx.all_splits)
    # an image study's duplicates are found on the pixels, by the image audit
    assert dup == ({n: [] for n in ctx.all_splits} if ctx.modality.name == "image" else ctx.all_splits)


def test_bundle_extras_round_trip_through_the_bundle_side(row, tmp_path):
    """What export stores (the extras, the processor identity) is enough to reproduce the
    predictions and to check the processor with nothing but the bundle folder."""
    _, ctx, model = row
    m = ctx.modality
    examples = ctx.eval_examples()[:4]
    chosen = [{"id": e.id, "category": e.label, "input": e.text, "reference": e.target} for e in examples]
    extras = m.bundle_extras(ctx, chosen, tmp_path)
    procedure = {
        "model_kind": ctx.model_kind,
        "labels": ctx.head_labels,
        "max_length": ctx.study.training.max_length,
        "max_new_tokens": ctx.study.eval.max_new_tokens,
        "device": CPU,
        **extras,
    }
    stored = json.loads(json.dumps(chosen))  # as verify reads them back from verify/examples.jsonl
    processor = m.load_processor(ctx.base)
    fresh = m.reproduce(model, processor, stored, procedure, tmp_path, device=CPU, autocast=NO_AUTOCAST)
    assert [f["prediction"] for f in fresh] == m.predict(ctx, model, examples, device=CPU, autocast=NO_AUTOCAST)
    assert all(("logits" in f) == (ctx.head_labels is not None) for f in fresh)
    manifest = {"tokenizer": ctx.tokenizer_identity, "procedure": procedure}
    name, problems, detail = m.verify_processor(manifest, processor)
    assert problems == [] and detail.endswith(" identical")
    if m.name == "image":
        assert all((tmp_path / c["image"]).is_file() for c in chosen)


def test_inspect_writes_one_html_page(row, tmp_path):
    _, ctx, _ = row
    page = tmp_path / "inspect.html"
    assert ctx.modality.inspect(ctx, ctx.split("train"), 1, "train", page) == page
    text = page.read_text()
    assert text.startswith("<!doctype html>")


# row -> the FSDP units the launch check finds on the meta device (the head's Auto class, never a kind string)
FSDP_UNITS = {
    "text-causal-lm": ["LlamaDecoderLayer"],
    "text-sequence-classification": ["BertLayer", "BertEmbeddings"],
    "image-classification": ["ViTLayer", "ViTEmbeddings"],
}


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_the_distributed_launch_check_builds_the_heads_model_class(row, strategy):
    """``check_launch`` (no torchrun) for every model kind: the layout, and under FSDP the block
    classes of the model class the head names (an image study used to crash on a causal-LM class)."""
    from tuneproof.recipes.torchrun import check_launch

    name, ctx, _ = row
    study = ctx.study
    ctx.study = study.model_copy(
        update={"distributed": study.distributed.model_copy(update={"strategy": strategy, "backend": "gloo"})}
    )
    try:
        layout = check_launch(ctx, 1)
    finally:
        ctx.study = study
    assert layout["world_size"] == 1 and layout["strategy"] == strategy and layout["backend"] == "gloo"
    assert layout["n_train"] == len(ctx.split("train"))
    assert sorted(layout["fsdp_units"]) == sorted(FSDP_UNITS[name] if strategy == "fsdp" else [])


def test_each_source_format_belongs_to_one_modality():
    from tuneproof.study import Source

    formats = typing.get_args(Source.model_fields["format"].annotation)
    owned = [f for m in MODALITIES for f in m.source_formats]
    assert sorted(owned) == sorted(formats)  # every format of the study file read by exactly one modality


def test_a_source_format_of_another_modality_is_refused(row):
    """A text model given an image folder (or an image classifier a CSV of texts) is refused with
    one line naming the source entry, before anything is loaded."""
    name, ctx, _ = row
    other = next(m for m in MODALITIES if m is not ctx.modality).source_formats[0]
    study = ctx.study
    source = study.data.sources[0].model_copy(update={"format": other})
    bad = StudyContext(
        ctx.study_dir, study.model_copy(update={"data": study.data.model_copy(update={"sources": [source]})})
    )
    with pytest.raises(TuneproofError) as err:
        bad.modality
    msg = str(err.value).splitlines()[0]
    assert msg.endswith(
        f"data.sources[0].format {other}: model.kind {ROWS[name][1]} ({ROWS[name][2]}) reads "
        + ", ".join(ctx.modality.source_formats)
    )
