"""The one path from an image file to the tensor the model receives, shared by ``data inspect``,
training, evaluation, the preflight and ``verify`` (the image counterpart of
:class:`tuneproof.data.preprocess.TextPipeline`).

Order: decode + EXIF orientation (:func:`tuneproof.data.image_sources.open_image`) -> convert to
``data.image.mode`` -> (train split, ``data.image.horizontal_flip``) mirror a fixed, seeded half
of the images -> the model's image processor (``AutoImageProcessor``: resize to
``data.image.resize`` or its own size, optional centre crop, rescale, normalise with its
mean/std) -> ``pixel_values [C, H, W]`` float32.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from PIL import ImageOps

from tuneproof.data.examples import Example
from tuneproof.data.image_sources import open_image
from tuneproof.errors import TuneproofError

if TYPE_CHECKING:
    import torch


@dataclass
class ImageEncoded:
    """One image after the exact preprocessing of the trainer.

    Attributes:
        pixel_values: ``[C, H, W]`` float32 tensor, what the model's ``pixel_values`` input gets.
        class_index: index of the label in the study's sorted label list (the head's output), or None.
        flipped: whether the train-time horizontal flip was applied.
        n_supervised: 1 (one class target per image; the loss is a per-image mean).
    """

    id: str
    category: str | None
    pixel_values: torch.Tensor
    class_index: int | None
    flipped: bool = False
    original_size: tuple[int, int] = (0, 0)
    original_mode: str = ""
    n_supervised: int = 1
    prompt_tokens: int = 0
    answer_tokens: int = 0
    full_length: int = 0
    truncated: bool = False
    faults: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _flip_this(seed: int, example_id: str) -> bool:
    """A fixed half of the images, chosen by ``sha256(seed:id)`` (same on every machine and run)."""
    return hashlib.sha256(f"{seed}:{example_id}".encode()).digest()[0] % 2 == 1


class ImagePipeline:
    """Image decoding and the processor for one study.

    Args:
        processor: the base model's ``AutoImageProcessor``.
        transforms: the study's ``data.image`` section.
        labels: the sorted label list (the head's classes).
        seed: ``training.seed`` (which images are flipped).
    """

    def __init__(self, processor, transforms, labels: list[str] | None, seed: int = 0):
        self.processor = processor
        self.transforms = transforms
        self.labels = list(labels or [])
        self.label_index = {label: i for i, label in enumerate(self.labels)}
        self.seed = seed
        self.kwargs: dict[str, Any] = {}
        if transforms.resize:
            self.kwargs["size"] = {"height": transforms.resize, "width": transforms.resize}
        if transforms.center_crop:
            self.kwargs["do_center_crop"] = True
            self.kwargs["crop_size"] = {"height": transforms.center_crop, "width": transforms.center_crop}

    def identity(self) -> dict[str, Any]:
        """Processor class + its config hash + the declared transforms (part of the data fingerprint)."""
        cfg = self.processor.to_dict() if hasattr(self.processor, "to_dict") else {}
        return {
            "class": type(self.processor).__name__,
            "config_sha256": hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest(),
            # which files are read (max_pixels, allow_outside_paths) is not a transform: the examples show it
            "transforms": self.transforms.model_dump(exclude={"max_pixels", "allow_outside_paths"}),
        }

    def image(self, example: Example, *, train: bool = False):
        """The PIL image the processor receives (after mode conversion and the train-time flip)."""
        path = example.meta.get("image") if example.meta else None
        if not path:
            raise TuneproofError(
                f"{example.id}: not an image example (no image path)",
                hint="use format imagefolder, image-csv or image-jsonl",
            )
        im = open_image(path, self.transforms.max_pixels)
        original = (im.width, im.height, im.mode)
        im = im.convert(self.transforms.mode)
        flipped = bool(train and self.transforms.horizontal_flip and _flip_this(self.seed, example.id))
        if flipped:
            im = ImageOps.mirror(im)
        return im, flipped, original

    def encode(self, example: Example, *, train: bool = False) -> ImageEncoded:
        im, flipped, (w, h, mode) = self.image(example, train=train)
        try:
            out = self.processor(images=im, return_tensors="pt", **self.kwargs)
        except Exception as err:  # noqa: BLE001 - the processor's own message, named
            raise TuneproofError(
                f"{example.meta.get('image')}: the image processor failed ({type(err).__name__}: {str(err)[:160]})",
                hint="check data.image (mode, resize, center_crop)",
            ) from None
        import torch  # noqa: PLC0415  (torch only once an image is encoded: importing the study context stays light)

        pixels = out["pixel_values"][0].to(torch.float32)
        enc = ImageEncoded(
            example.id,
            example.label,
            pixels,
            self.label_index.get(example.label) if example.label is not None else None,
            flipped,
            (w, h),
            mode,
        )
        if example.label is not None and enc.class_index is None and self.labels:
            enc.faults.append(f"label '{example.label}' is not among the {len(self.labels)} train labels")
        crop = self.transforms.center_crop
        if crop and (w < crop or h < crop) and not self.transforms.resize:
            enc.notes.append(f"image {w}x{h} is smaller than the {crop}px crop")
        return enc

    def encode_all(self, examples: list[Example], *, train: bool = False) -> list[ImageEncoded]:
        return [self.encode(e, train=train) for e in examples]


def collate_images(batch: list[ImageEncoded]) -> dict[str, torch.Tensor]:
    """``pixel_values [B, C, H, W]`` and, when every image has a class, ``labels [B]`` (class indices)."""
    import torch  # noqa: PLC0415  (as in encode)

    shapes = {tuple(e.pixel_values.shape) for e in batch}
    if len(shapes) > 1:
        raise TuneproofError(f"images of several shapes in one batch ({sorted(shapes)})", hint="set data.image.resize")
    out = {"pixel_values": torch.stack([e.pixel_values for e in batch])}
    if all(e.class_index is not None for e in batch):  # unlabelled images (verify, predict): pixels only
        out["labels"] = torch.tensor([e.class_index for e in batch], dtype=torch.long)
    return out
