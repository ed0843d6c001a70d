"""Modalities, one module each, behind one interface (:class:`~tuneproof.modalities.modality.Modality`).

:func:`modality_for` is the one place where text vs image is decided, from the model kind; the
study context keeps the answer (``StudyContext.modality``) and deliver reads it from a bundle's
``procedure.model_kind``. Adding a modality = one module here, one entry in :data:`MODALITIES`,
one row of ``tests/modalities/test_modality_matrix.py`` (docs/ARCHITECTURE.md, "One seam per modality").
"""

from __future__ import annotations

from typing import Any

from tuneproof.errors import TuneproofError
from tuneproof.modalities.image import IMAGE, IMAGE_CLASSIFIER
from tuneproof.modalities.modality import Modality
from tuneproof.modalities.text import CAUSAL_LM, SEQUENCE_CLASSIFIER, TEXT
from tuneproof.models.heads import Head, kind_from_config

MODALITIES: tuple[Modality, ...] = (TEXT, IMAGE)
#: the order a ``config.json`` is recognised in (the first head it matches); none matches: a causal LM
DETECTION: tuple[Head, ...] = (IMAGE_CLASSIFIER, CAUSAL_LM, SEQUENCE_CLASSIFIER)

__all__ = ["DETECTION", "MODALITIES", "Modality", "detect_kind", "modality_for"]


def detect_kind(config: dict[str, Any]) -> str:
    """The model kind a base's ``config.json`` names (``model.kind: auto``), by :data:`DETECTION`."""
    return kind_from_config(config, DETECTION, CAUSAL_LM)


def modality_for(model_kind: str) -> Modality:
    """The modality that serves ``model_kind`` (``causal-lm``, ``sequence-classification``: text;
    ``image-classification``: image).

    Raises:
        TuneproofError: a model kind no modality serves (names the known kinds).
    """
    for m in MODALITIES:
        if model_kind in m.model_kinds:
            return m
    known = [k for m in MODALITIES for k in m.model_kinds]
    raise TuneproofError(f"model.kind: no modality serves '{model_kind}'", hint=f"use one of {', '.join(known)}")
