"""What an export bundle of an image classifier holds beyond the text bundles: the stored
examples' image files (``verify/images/``), the image processor's identity in place of a
tokenizer's, and the reproduction of the stored predictions through the same
:class:`~tuneproof.data.image_pipeline.ImagePipeline` the study used (its declared transforms are
in ``procedure.image_transforms``)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from tuneproof.data.examples import Example
from tuneproof.study import ImageTransforms

IMAGES_DIR = "verify/images"


def pipeline_for(processor, procedure: dict[str, Any]):
    """The study's image pipeline rebuilt from the bundle: the processor + the declared transforms."""
    from tuneproof.data.image_pipeline import ImagePipeline  # noqa: PLC0415 - imports torch

    return ImagePipeline(
        processor, ImageTransforms(**(procedure.get("image_transforms") or {})), procedure.get("labels")
    )


def processor_identity(processor, procedure: dict[str, Any]) -> dict[str, Any]:
    """Class, config sha256 and transforms of the image processor (what ``tokenizer`` holds for text)."""
    return pipeline_for(processor, procedure).identity()


def compare_processor(expected: dict[str, Any], found: dict[str, Any]) -> list[str]:
    """Problems between two image-processor identities, one per differing key, naming both values."""
    return [
        f"image processor {k}: expected {expected.get(k)!r}, found {found.get(k)!r}"
        for k in ("class", "config_sha256", "transforms")
        if k in expected and expected.get(k) != found.get(k)
    ]


def copy_images(chosen: list[dict[str, Any]], examples: dict[str, Any], bundle: Path) -> None:
    """Copy each chosen example's image into ``bundle/verify/images/`` and set its ``image`` to the
    path relative to the bundle (the bundle verifies without the study's data folder)."""
    folder = bundle / IMAGES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    for i, c in enumerate(chosen):
        src = Path(examples[c["id"]].meta["image"])
        dest = folder / f"{i:03d}-{src.name}"
        shutil.copy2(src, dest)
        c["image"] = dest.relative_to(bundle).as_posix()


def reproduce_images(
    model, processor, examples: list[dict[str, Any]], procedure: dict[str, Any], root: Path
) -> list[dict[str, Any]]:
    """Predicted label and logits (one per label) of each stored image, one batch, fp32."""
    import torch  # noqa: PLC0415

    from tuneproof.data.image_pipeline import collate_images  # noqa: PLC0415 - imports torch

    pipe = pipeline_for(processor, procedure)
    device = torch.device(procedure.get("device", "cpu"))
    encoded = [
        pipe.encode(Example(id=e["id"], text=e["image"], meta={"image": str(Path(root) / e["image"])}))
        for e in examples
    ]
    with torch.inference_mode():
        logits = model(pixel_values=collate_images(encoded)["pixel_values"].to(device)).logits.float().cpu()
    labels = procedure["labels"]
    return [{"prediction": labels[int(row.argmax())], "logits": [float(x) for x in row]} for row in logits]
