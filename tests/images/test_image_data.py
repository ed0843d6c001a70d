"""Image data: layouts, decoding faults named and counted, EXIF orientation, the fingerprint over
image bytes and transforms, the one pipeline, duplicates across splits, shortcuts."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from PIL import Image

from image_tiny import make_image_study, write_digits


def _ctx(study):
    from tuneproof.context import StudyContext

    return StudyContext.open(study)


def test_imagefolder_with_split_folders_gives_splits_classes_and_hashes(tmp_path, tiny_vit):
    ctx = _ctx(make_image_study(tmp_path / "s", tiny_vit))
    assert {k: len(v) for k, v in ctx.all_splits.items()} == {"test": 12, "train": 36, "validation": 12}
    assert ctx.labels == ["0", "1", "7"] and ctx.model_kind == "image-classification"
    ex = ctx.split("train")[0]
    assert ex.id == "train/0/000.png" and ex.label == "0" and ex.meta["width"] == 8 and ex.meta["mode"] == "L"
    assert len(ex.meta["image_sha256"]) == 64


def test_an_unreadable_or_truncated_image_is_named_and_counted_not_fatal(tmp_path, tiny_vit):
    study = make_image_study(tmp_path / "s", tiny_vit)
    good = study / "images" / "train" / "0" / "000.png"
    (study / "images" / "train" / "0" / "zz-not-an-image.png").write_bytes(b"this is text")
    (study / "images" / "train" / "1" / "zz-truncated.png").write_bytes(good.read_bytes()[:40])
    ctx = _ctx(study)
    assert len(ctx.split("train")) == 36
    skipped = [r for r in ctx.repairs if r.startswith("skipped unreadable image")]
    assert len(skipped) == 2
    assert any("zz-not-an-image.png" in r for r in skipped) and any("zz-truncated.png" in r for r in skipped)


def test_a_class_folder_without_images_and_a_csv_naming_a_missing_image_are_clear_errors(tmp_path, tiny_vit):
    from tuneproof.errors import TuneproofError

    study = make_image_study(tmp_path / "s", tiny_vit)
    (study / "images" / "train" / "9").mkdir()
    with pytest.raises(TuneproofError, match=r"images/train/9: class folder has no images"):
        _ctx(study).all_splits
    study2 = tmp_path / "s2"
    make_image_study(study2, tiny_vit)
    (study2 / "labels.csv").write_text("path,label\nimages/train/0/000.png,0\nimages/nope.png,1\n")
    cfg = yaml.safe_load((study2 / "tuneproof.yaml").read_text())
    cfg["data"]["sources"] = [{"path": "labels.csv", "format": "image-csv", "split": "train"}]
    (study2 / "tuneproof.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(TuneproofError, match=r"labels.csv:3: image not found: .*images/nope.png"):
        _ctx(study2).all_splits


def test_exif_orientation_is_applied_when_decoding(tmp_path):
    from tuneproof.data.image_sources import open_image

    im = Image.new("RGB", (30, 10), "red")
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 CW to display
    im.save(tmp_path / "rot.jpg", exif=exif.tobytes())
    out = open_image(tmp_path / "rot.jpg")
    assert (out.width, out.height) == (10, 30)


def test_the_fingerprint_covers_image_bytes_and_declared_transforms(tmp_path, tiny_vit):
    study = make_image_study(tmp_path / "s", tiny_vit)
    before = _ctx(study).data_fingerprint()["hash"]
    path = study / "images" / "validation" / "7" / "012.png"
    arr = np.asarray(Image.open(path)).copy()
    arr[0, 0] = 255 - arr[0, 0]  # one pixel
    Image.fromarray(arr).save(path)
    after_pixel = _ctx(study).data_fingerprint()["hash"]
    cfg = yaml.safe_load((study / "tuneproof.yaml").read_text())
    cfg["data"]["image"]["resize"] = 24
    (study / "tuneproof.yaml").write_text(yaml.safe_dump(cfg))
    after_transform = _ctx(study).data_fingerprint()["hash"]
    assert len({before, after_pixel, after_transform}) == 3


def test_one_pipeline_gives_the_model_tensor_and_a_seeded_train_only_flip(tmp_path, tiny_vit):
    study = make_image_study(tmp_path / "s", tiny_vit)
    cfg = yaml.safe_load((study / "tuneproof.yaml").read_text())
    cfg["data"]["image"]["horizontal_flip"] = True
    (study / "tuneproof.yaml").write_text(yaml.safe_dump(cfg))
    ctx = _ctx(study)
    train = ctx.split("train")
    enc = ctx.pipeline.encode_all(train, train=True)
    assert tuple(enc[0].pixel_values.shape) == (3, 16, 16) and enc[0].class_index == 0
    flipped = [e.flipped for e in enc]
    assert 0 < sum(flipped) < len(flipped)  # a fixed part of the images, not all, not none
    assert flipped == [e.flipped for e in _ctx(study).pipeline.encode_all(train, train=True)]  # same every run
    i = flipped.index(True)
    plain = ctx.pipeline.encode(train[i])  # evaluation: never flipped
    assert not plain.flipped
    assert np.allclose(enc[i].pixel_values.numpy(), plain.pixel_values.numpy()[:, :, ::-1], atol=1e-6)


def test_duplicates_across_splits_exact_and_near(tmp_path):
    from tuneproof.data.image_audit import image_duplicates
    from tuneproof.data.image_sources import load_imagefolder

    root = write_digits(tmp_path / "images")
    src = root / "train" / "1" / "003.png"
    (root / "test" / "1" / "copy.png").write_bytes(src.read_bytes())  # exact copy
    arr = np.asarray(Image.open(src)).astype(np.int16)
    Image.fromarray(np.clip(arr + 3, 0, 255).astype(np.uint8)).save(root / "validation" / "1" / "brighter.png")  # near
    examples, _ = load_imagefolder(root, None)
    splits = {}
    for e in examples:
        splits.setdefault(e.split, []).append(e)
    rep = image_duplicates(splits)
    assert rep["pairs"]["test/train"]["exact"] == [["test/1/copy.png", "train/1/003.png"]]
    near = [p[:2] for p in rep["pairs"]["train/validation"]["near"]]
    assert ["train/1/003.png", "validation/1/brighter.png"] in near
    assert rep["summary"].startswith("image duplicates across splits: 1 exact")
    # a second copy in train: the test image now matches two train images, one image in two pairs
    (root / "train" / "1" / "again.png").write_bytes(src.read_bytes())
    examples, _ = load_imagefolder(root, None)
    splits = {}
    for e in examples:
        splits.setdefault(e.split, []).append(e)
    rep = image_duplicates(splits)
    assert len(rep["pairs"]["test/train"]["exact"]) == 2 and len(rep["pairs"]["train/validation"]["near"]) == 2
    assert rep["counts"]["test/train"] == {"split": "test", "n": 13, "exact": 1, "near": 0}
    assert rep["counts"]["train/validation"] == {"split": "validation", "n": 13, "exact": 0, "near": 1}
    assert (rep["n_exact"], rep["n_near"], rep["n_exact_pairs"], rep["n_near_pairs"]) == (1, 2, 2, 3)
    assert rep["summary"] == (
        "image duplicates across splits: 1 exact, 0 near of 13 test images (test/train); "
        "0 exact, 1 near of 13 test images (test/validation); 0 exact, 1 near of 13 validation images "
        "(train/validation) (5 pairs listed in data_check.json)"
    )


def test_shortcut_check_names_the_feature_that_predicts_the_class(tmp_path):
    from tuneproof.data.image_audit import shortcut_check
    from tuneproof.data.image_sources import load_imagefolder

    root = tmp_path / "images"
    rng = np.random.default_rng(0)
    for label, size in (("cat", 32), ("dog", 48)):  # every dog photo is larger: size gives the class away
        (root / label).mkdir(parents=True)
        for i in range(10):
            Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(root / label / f"{i}.png")
    examples, _ = load_imagefolder(root, "train")
    rep = shortcut_check(examples)
    assert rep["flag"] is True and rep["cv_accuracy"] == 1.0 and rep["chance"] == 0.5
    assert rep["feature"] == "width" and "shortcut: image width alone predicts the class" in rep["message"]
    fair = shortcut_check([e for e in load_imagefolder(write_digits(tmp_path / "d", splits=("train",)), None)[0]])
    assert fair["flag"] is False and fair["message"].startswith("shortcut check: none")


def test_inspect_shows_per_class_the_original_and_the_model_tensor(tmp_path, tiny_vit, capsys):
    from tuneproof.recipes.inspect import run_inspect

    ctx = _ctx(make_image_study(tmp_path / "s", tiny_vit))
    run_inspect(ctx, n=1)
    out = capsys.readouterr().out
    assert out.count("the head is trained on this index") == 3  # one per class
    import re

    assert re.search(r"train/7/\d{3}\.png  class 2 = '7' \(of 3\)", out)
    assert "original 8x8 L PNG" in out and "model input pixel_values [3, 16, 16] float32, range [-1.000" in out
    page = run_inspect(ctx, n=2, html_path=tmp_path / "inspect.html").read_text()
    assert page.count("<img alt='original'") == 6 and page.count("<img alt='model input'") == 6
    assert "<script" not in page


def test_eval_sets_of_text_prompts_are_refused_for_an_image_model(tmp_path, tiny_vit):
    """eval.sets (docs/eval-sets.md) hold inputs of the model's modality: a JSONL of prompts for an image classifier
    is refused before any run, naming the key."""
    import yaml

    from image_tiny import make_image_study
    from tuneproof.context import StudyContext
    from tuneproof.errors import TuneproofError

    study = make_image_study(tmp_path / "s", tiny_vit)
    raw = yaml.safe_load((study / "tuneproof.yaml").read_text())
    raw["eval"]["sets"] = [{"name": "general", "path": "general.jsonl", "fields": {"text": "q"}}]
    (study / "tuneproof.yaml").write_text(yaml.safe_dump(raw))
    (study / "general.jsonl").write_text('{"q": "hello"}\n')
    with pytest.raises(TuneproofError) as err:
        StudyContext.open(study).eval_sets  # noqa: B018
    assert "eval.sets[0].format jsonl: model.kind image-classification (image) reads imagefolder" in err.value.message
