"""Task kind ``image-classification``: one class per image (a folder per class, or a CSV/JSONL of
``path,label``), an ``AutoModelForImageClassification`` with a new head for the study's labels.

Parts in the order every task module has them (see :mod:`tuneproof.tasks.task`). The scorer,
bootstrap statistics, per-example rule and label set are those of ``classification`` (a predicted
label against the reference label; scikit-learn metrics, macro over the labels present), and so
is the audit of the labels; the reader is the image one. The audit of the images themselves
(per-class form, duplicates by file and perceptual hash, the shortcut check) is the image
modality's (:meth:`tuneproof.modalities.image.ImageModality.audit`), as is everything else that
differs from text.
"""

from __future__ import annotations

from tuneproof.tasks.classification import Classification
from tuneproof.tasks.task import ReaderHints


class ImageClassification(Classification):
    name = "image-classification"
    template = "image-classification.yaml"
    reader = ReaderHints(
        label="the class folder name (imagefolder) or data.fields.label (image-csv / image-jsonl)",
        target="the label text itself",
        model_kinds=("image-classification",),
    )


TASK = ImageClassification()
