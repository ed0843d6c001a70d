"""Task kind ``image-classification``: one class per image (a folder per class, or a CSV/JSONL of
``path,label``), an ``AutoModelForImageClassification`` with a new head for the study's labels.

Parts in the order every task module has them (see :mod:`tuneproof.tasks.base`). The scorer,
bootstrap statistics, per-example rule and label set are those of ``classification`` (a predicted
label against the reference label; scikit-learn metrics, macro over the labels present); the
reader and the audit are the image ones: per-class form (size, aspect, mode, format, and the
tensor after the study's transform), duplicates across splits by file hash and perceptual hash,
and the shortcut check (:mod:`tuneproof.data.image_audit`).
"""

from __future__ import annotations

from typing import Any

from tuneproof.data.image_audit import audit_image_study
from tuneproof.tasks.base import ReaderHints, TaskConfig
from tuneproof.tasks.classification import Classification


class ImageClassification(Classification):
    name = "image-classification"
    template = "image-classification.yaml"
    reader = ReaderHints(
        label="the class folder name (imagefolder) or data.fields.label (image-csv / image-jsonl)",
        target="the label text itself",
        model_kinds=("image-classification",),
    )

    def audit(self, splits: dict[str, list], cfg: TaskConfig, pipeline=None) -> dict[str, Any]:
        """The label audit of ``classification`` plus the image audit; ``pipeline`` (the study's
        :class:`~tuneproof.data.image_pipeline.ImagePipeline`) adds the after-transform form."""
        out = super().audit(splits, cfg)
        images = audit_image_study(splits, pipeline)
        out["images"] = images
        out["hard_faults"] += images["hard_faults"]
        out["warnings"] += images["warnings"]
        return out


TASK = ImageClassification()
