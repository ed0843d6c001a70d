"""The image modality: the base's ``AutoImageProcessor`` and
:class:`~tuneproof.data.image_pipeline.ImagePipeline` for image classifiers
(``AutoModelForImageClassification``, a new head for the study's labels).

What differs from text: the train split is encoded with the train-time transforms
(``data.image.horizontal_flip``); there is no vocabulary; duplicates are found by the image audit
on the pixels (file hash and perceptual hash, :mod:`tuneproof.data.image_audit`), not by the text
finder on the paths; the data check adds the per-class form, the duplicates and the shortcut
check; an export bundle holds the stored examples' image files (``verify/images/``), the image
processor's identity in place of a tokenizer's and the declared transforms
(``procedure.image_transforms``), and verify reproduces the stored predictions through the same
pipeline. Parts in the order of :mod:`tuneproof.modalities.modality`.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuneproof.data import image_inspect
from tuneproof.data.examples import Example
from tuneproof.data.image_audit import audit_image_study
from tuneproof.data.image_pipeline import ImagePipeline, collate_images
from tuneproof.data.image_sources import IMAGE_FORMATS, inside
from tuneproof.data.inspect import choose_examples
from tuneproof.errors import TuneproofError
from tuneproof.io import atomic_write_text
from tuneproof.modalities.modality import IMAGE_FORM, Modality
from tuneproof.models.base_model import load_image_processor
from tuneproof.models.heads import Head
from tuneproof.study import ImageTransforms
from tuneproof.ui import console, user_text

IMAGES_DIR = "verify/images"  # the stored examples' image files inside an export bundle
#: model types read as image classifiers when config.json names no architecture
IMAGE_MODEL_TYPES = frozenset(
    {
        "vit",
        "deit",
        "beit",
        "convnext",
        "convnextv2",
        "resnet",
        "swin",
        "swinv2",
        "efficientnet",
        "mobilenet_v2",
        "mobilevit",
        "regnet",
        "dinov2",
    }
)
# no PEFT task type: the PeftModel passes pixel_values through
IMAGE_CLASSIFIER = Head(
    "image-classification",
    "AutoModelForImageClassification",
    what="image classification",
    labels_from="class folders or data.fields.label",
    new_head="image classifier",
    token_inputs=False,
    architectures=("ForImageClassification",),
    model_types=IMAGE_MODEL_TYPES,
    pipeline_tag="image-classification",
)


# --------------------------------------------------------------------------- prediction loop
def classify_images(
    model,
    pipeline,
    examples: list[Example],
    labels: list[str],
    *,
    batch_size: int,
    device,
    autocast,
    progress: Callable[[int], None] | None = None,
) -> list[str]:
    """Predicted label names of an image classifier (argmax of the logits), on the pipeline's
    evaluation tensors (no train-time flip): ``pixel_values [B, C, H, W]`` per batch."""
    import torch  # noqa: PLC0415 - torch on first use: the study context imports this module

    with torch.inference_mode():
        model.eval()
        out: list[str] = []
        for s in range(0, len(examples), batch_size):
            chunk = examples[s : s + batch_size]
            batch = collate_images([pipeline.encode(e) for e in chunk])
            with autocast():
                logits = model(pixel_values=batch["pixel_values"].to(device)).logits
            out += [labels[i] for i in logits.argmax(-1).tolist()]
            if progress:
                progress(len(chunk))
    return out


# --------------------------------------------------------------------------- the bundle side
def pipeline_for(processor, procedure: dict[str, Any]) -> ImagePipeline:
    """The study's image pipeline rebuilt from a bundle: the processor + the declared transforms."""
    transforms = ImageTransforms(**(procedure.get("image_transforms") or {}))
    return ImagePipeline(processor, transforms, procedure.get("labels"))


def compare_processor(expected: dict[str, Any], found: dict[str, Any]) -> list[str]:
    """Problems between two image-processor identities, one per differing key, naming both values."""
    return [
        f"image processor {k}: expected {expected.get(k)!r}, found {found.get(k)!r}"
        for k in ("class", "config_sha256", "transforms")
        if k in expected and expected.get(k) != found.get(k)
    ]


def copy_images(chosen: list[dict[str, Any]], examples: dict[str, Example], bundle: Path) -> None:
    """Copy each chosen example's image into ``bundle/verify/images/`` and set its ``image`` to the
    path relative to the bundle (the bundle verifies without the study's data folder)."""
    folder = bundle / IMAGES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    for i, c in enumerate(chosen):
        src = Path(examples[c["id"]].meta["image"])
        dest = folder / f"{i:03d}-{src.name}"
        shutil.copy2(src, dest)
        c["image"] = dest.relative_to(bundle).as_posix()


def bundle_image(root: Path, name: str) -> Path:
    """The stored image ``name`` (``verify/examples.jsonl``'s ``image``) inside the bundle ``root``.

    Raises:
        TuneproofError: the path resolves outside the bundle (``../``, an absolute path, a symlink): a
            bundle's examples name only the images it ships, nothing is read from elsewhere.
    """
    path = Path(root) / name
    if not inside(path, root):
        raise TuneproofError(
            f"{Path(root) / 'verify' / 'examples.jsonl'}: image {name!r} is outside the bundle {root}; not read",
            hint="a bundle verifies from its own files (verify/images/); export it again",
        )
    return path


# --------------------------------------------------------------------------- the modality
class ImageModality(Modality):
    name = "image"
    unit = "images"
    logit = "class"
    heads = (IMAGE_CLASSIFIER,)
    source_formats = IMAGE_FORMATS
    dossier_sections = (IMAGE_FORM,)

    # 1. processor, pipeline, collate
    def load_processor(self, base):
        """The base's ``AutoImageProcessor`` (:func:`tuneproof.models.base_model.load_image_processor`)."""
        return load_image_processor(base)

    def pipeline(self, ctx) -> ImagePipeline:
        """The study's :class:`~tuneproof.data.image_pipeline.ImagePipeline` (``data.image``, the
        labels, ``training.seed``)."""
        return ImagePipeline(ctx.tokenizer, ctx.study.data.image, ctx.labels, ctx.study.training.seed)

    def encode_for_training(self, pipeline, examples: list[Example]) -> list:
        """The train-time transforms (``data.image.horizontal_flip``) apply to the train split only."""
        return pipeline.encode_all(examples, train=True)

    def units(self, encoded) -> int:
        """One image (the rate is in images/s)."""
        return 1

    def collate(self, batch: list, pad_id: int) -> dict:
        """:func:`tuneproof.data.image_pipeline.collate_images` (``pad_id`` unused: images are not padded)."""
        return collate_images(batch)

    # 2. identity
    def processor_identity(self, ctx) -> dict[str, Any]:
        """The image processor's class, its config hash and the declared transforms."""
        return ctx.pipeline.identity()

    def vocabulary_record(self, base_path: str | Path, processor) -> None:
        """None: an image processor has no vocabulary."""
        return None

    # 3. data check
    def duplicate_input(self, splits: dict[str, list[Example]]) -> dict[str, list[Example]]:
        """No example: an image study's duplicates are found by the image audit, on the pixels, not the paths."""
        return {n: [] for n in splits}

    def audit(self, task, splits: dict[str, list[Example]], cfg, pipeline) -> dict[str, Any]:
        """The task kind's label audit plus the image audit (form per class before and after the
        pipeline's transform, duplicates across splits, shortcuts:
        :func:`tuneproof.data.image_audit.audit_image_study`)."""
        out = task.audit(splits, cfg)
        images = audit_image_study(splits, pipeline)
        out["images"] = images
        out["hard_faults"] += images["hard_faults"]
        out["warnings"] += images["warnings"]
        return out

    # 4. prediction
    def predict(
        self,
        ctx,
        model,
        examples: list[Example],
        *,
        device,
        autocast,
        progress=None,
        batch_size: int | None = None,
        token_progress=None,
        raw_out: list[str] | None = None,
        sort_by_length: bool = True,
    ) -> list[str]:
        """:func:`classify_images` at ``eval.batch_size`` (or ``batch_size``), batched in the order of ``examples``
        (images are not sorted: ``sort_by_length`` changes nothing)."""
        return classify_images(
            model,
            ctx.pipeline,
            examples,
            ctx.labels,
            batch_size=batch_size or ctx.study.eval.batch_size,
            device=device,
            autocast=autocast,
            progress=progress,
        )

    def eval_inputs(self, ctx, examples: list[Example]) -> list[str]:
        """The image files' paths (``meta["image"]``)."""
        return [e.meta["image"] for e in examples]

    def scores(self, ctx, model, examples: list[Example]) -> list[list]:
        """Per image the class logits ``[[index, logit], ...]``, one image at a time."""
        import torch  # noqa: PLC0415 - torch on first use: the study context imports this module

        device, _, autocast = ctx.torch_setup()
        model.eval()
        out = []
        with torch.inference_mode():
            for ex in examples:
                pixels = collate_images([ctx.pipeline.encode(ex)])["pixel_values"].to(device)
                with autocast():
                    logits = model(pixel_values=pixels).logits[0].float()
                out.append([[i, float(v)] for i, v in enumerate(logits.cpu())])
        return out

    # 5. data inspect
    def inspect(self, ctx, examples: list[Example], n: int, split: str, html_path: Path | None) -> Path | None:
        """Per class: the original image and the tensor the model receives (train split: with the train-time flip)."""
        train = split == "train"
        encoded = ctx.pipeline.encode_all(examples, train=train)
        chosen = choose_examples(examples, encoded, n, seed=ctx.study.data.split.seed)
        classes = ctx.pipeline.labels
        if html_path is not None:
            items = [(examples[i], encoded[i], ctx.pipeline.image(examples[i], train=train)[0]) for i in chosen]
            title = f"{ctx.study.name}: {split} after preprocessing"
            atomic_write_text(html_path, image_inspect.render_html(items, title, classes))
            console.print(f"wrote {user_text(html_path)}", soft_wrap=True)
            return html_path
        for i in chosen:
            for line in image_inspect.describe(examples[i], encoded[i], classes):
                console.print(user_text(line), soft_wrap=True)
            console.print()
        return None

    # 6. export and verify
    def bundle_extras(self, ctx, chosen: list[dict[str, Any]], bundle: Path) -> dict[str, Any]:
        """The images themselves travel with the bundle (:func:`copy_images`); ``procedure.image_transforms``."""
        copy_images(chosen, {e.id: e for e in ctx.all_splits[ctx.study.eval.split]}, bundle)
        declared = ctx.study.data.image.model_dump(mode="json", exclude={"max_pixels", "allow_outside_paths"})
        return {"image_transforms": declared}

    def verify_processor(self, manifest: dict[str, Any], processor) -> tuple[str, list[str], str]:
        """The ``image processor`` check: class, config sha256 and the declared transforms."""
        rec = manifest["tokenizer"]
        problems = compare_processor(rec, pipeline_for(processor, manifest["procedure"]).identity())
        return (
            "image processor",
            problems,
            (
                f"{rec.get('class')}, config sha256 {str(rec.get('config_sha256'))[:16]}"
                + (" identical" if not problems else " differs")
            ),
        )

    def reproduce(
        self,
        model,
        processor,
        examples: list[dict[str, Any]],
        procedure: dict[str, Any],
        root: Path,
        *,
        device,
        autocast,
    ) -> list[dict[str, Any]]:
        """Predicted label and logits (one per label) of each stored image (``root``: the bundle
        holding ``verify/images/``), one batch."""
        import torch  # noqa: PLC0415 - torch on first use: the study context imports this module

        pipe = pipeline_for(processor, procedure)
        encoded = [
            pipe.encode(Example(id=e["id"], text=e["image"], meta={"image": str(bundle_image(root, e["image"]))}))
            for e in examples
        ]
        with torch.inference_mode(), autocast():
            logits = model(pixel_values=collate_images(encoded)["pixel_values"].to(device)).logits.float().cpu()
        labels = procedure["labels"]
        return [{"prediction": labels[int(row.argmax())], "logits": [float(x) for x in row]} for row in logits]


IMAGE = ImageModality()
