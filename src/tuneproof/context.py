"""A study assembled from its components: the study file, the registry, the prepared data (cleaned,
split with the frozen manifest, reserved test split withheld), the resolved base model, the
tokenizer and the single preprocessing pipeline. Recipes build one and use its pieces.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from tuneproof.data.chat_template import fingerprint_part
from tuneproof.data.cleaning import clean, validate
from tuneproof.data.dedup import apply_policy, find_duplicates
from tuneproof.data.eval_sets import EvalSetData, load_eval_sets
from tuneproof.data.examples import Example
from tuneproof.data.semantic_dedup import (
    apply_semantic_policy,
    find_semantic_duplicates,
    minilm_embed,
    semantic_settings,
)
from tuneproof.data.sources import load_source, source_files
from tuneproof.data.split import (
    MANIFEST,
    balanced_take,
    build_splits,
    check_unique_ids,
    freeze_or_reuse,
    split_order,
    split_settings,
)
from tuneproof.errors import TuneproofError
from tuneproof.io import sha256_file, sha256_json
from tuneproof.modalities import Modality, detect_kind, modality_for
from tuneproof.models.base_model import model_kind, resolve_base
from tuneproof.models.build import build_model
from tuneproof.models.device import bf16_base_rule, choose_dtype, detect_device
from tuneproof.models.heads import Head
from tuneproof.models.quant import quantization_record, require_bitsandbytes
from tuneproof.registry import Registry
from tuneproof.storage import attach as attach_storage
from tuneproof.study import STUDY_FILE, ChatData, Study, read_study, resolved_config, validate_study
from tuneproof.tasks import check_hypothesis_metrics, check_set_references
from tuneproof.tracking import attach
from tuneproof.ui import console, heartbeat


def parse_study(raw: Any, path: str | Path = STUDY_FILE) -> Study:
    """Validate a parsed YAML mapping as a study: the schema (:func:`tuneproof.study.validate_study`),
    then every metric the hypothesis names against its task (:func:`tuneproof.tasks.check_hypothesis_metrics`),
    then, for ``method.kind: qlora``, that bitsandbytes is installed.

    Raises:
        TuneproofError: naming the file and the key path.
    """
    study = validate_study(raw, path)
    check_hypothesis_metrics(study, path)
    if study.method.kind == "qlora":
        require_bitsandbytes(str(path))
    return study


def load_study(path: str | Path) -> Study:
    """Read and validate ``tuneproof.yaml`` (or a folder holding it): :func:`tuneproof.study.read_study`,
    then :func:`parse_study`.

    Raises:
        TuneproofError: file missing, YAML syntax error (with line), unknown/missing key or bad value (with key path).
    """
    raw, path = read_study(path)
    return parse_study(raw, path)


@dataclass
class StudyContext:
    """Everything a recipe needs, loaded lazily (the model is only loaded on demand)."""

    study_dir: Path
    study: Study
    data_root: Path | None = None
    repairs: list[str] = field(default_factory=list)

    @classmethod
    def open(
        cls, study_dir: str | Path = ".", data_root: str | Path | None = None, config: dict | None = None
    ) -> StudyContext:
        """Open the study in ``study_dir``; ``config`` (a resolved dict) overrides the file (variants)."""
        study_dir = Path(study_dir).resolve()
        study = parse_study(config, study_dir / STUDY_FILE) if config is not None else load_study(study_dir)
        return cls(study_dir, study, Path(data_root) if data_root else None)

    @cached_property
    def registry(self) -> Registry:
        registry = Registry(self.study_dir)
        attach(registry, self.study, self.study_dir, self.config)  # tracking.* / report_to: runs sent as they run
        attach_storage(registry, self.study, self.study_dir)  # storage.remote: the study copied as it runs
        return registry

    @property
    def config(self) -> dict[str, Any]:
        return resolved_config(self.study)

    @property
    def task(self) -> str:
        return self.study.hypothesis.task

    # ------------------------------------------------------------------ data
    @cached_property
    def all_splits(self) -> dict[str, list[Example]]:
        """Every split including the reserved test split. Only `test` and `data check` may use the test split."""
        data = self.study.data
        examples: list[Example] = []
        for src in data.sources:
            ex, rep = load_source(
                src,
                data.fields,
                self.study_dir,
                self.data_root,
                max_chars=data.max_chars,
                image=data.image,
                chat=data.chat,
            )
            examples += ex
            self.repairs += rep
        # cleaning acts before validation: dropped empty texts are listed (file:line), what is left is checked
        examples, self.dropped_empty = clean(examples, data.cleaning)
        validate(examples)
        check_unique_ids(examples)
        self.split_info: dict[str, Any] = {}
        splits, self.manifest_created = freeze_or_reuse(
            self.study_dir,
            lambda: build_splits(examples, data.split, data.test_split, data.dedup, self.split_info),
            examples,
            grouping=lambda: self.split_info.get("grouping"),
            subset=lambda: self.split_info.get("subset"),
            info=self.split_info,
            settings=split_settings(data.split, data.test_split, data.dedup),
            runs_using=self.runs_using_splits,
        )
        if self.split_info.get("resplit"):
            console.print(
                f"[yellow]{MANIFEST} cut again[/] (no run had used it): " + "; ".join(self.split_info["resplit"]),
                soft_wrap=True,
            )
        self.dedup_dropped: list[str] = []
        if self.study.data.dedup.policy == "drop-from-train":
            d = self.study.data.dedup
            report = find_duplicates(
                splits, threshold=d.threshold, shingles=d.shingles, ngram=d.ngram, num_perm=d.num_perm
            )
            splits["train"], self.dedup_dropped = apply_policy(splits, report, d.policy)
        sem = self.study.data.dedup.semantic
        if sem is not None and sem.policy == "drop-from-train":  # paraphrases of evaluated examples leave train
            with heartbeat("data", "semantic dedup (all-MiniLM-L6-v2)"):
                sem_report = find_semantic_duplicates(
                    splits, sem.threshold, minilm_embed(sem.batch_size), settings=semantic_settings(sem)
                )
            splits["train"], dropped = apply_semantic_policy(splits["train"], sem_report, sem.policy)
            self.dedup_dropped += dropped
        if self.study.eval.split not in splits:
            raise TuneproofError(
                f"{self.study_dir / STUDY_FILE}: eval.split '"
                f"{self.study.eval.split}' does not exist (splits: {sorted(splits)})"
            )
        if "train" not in splits:
            raise TuneproofError(f"{self.study_dir / STUDY_FILE}: no 'train' split (splits: {sorted(splits)})")
        # one order on every screen and record, whatever the manifest or the sources gave
        return {n: splits[n] for n in split_order(splits, self.study.eval.split, self.study.data.test_split)}

    def runs_using_splits(self) -> list[str]:
        """Ids of the runs that used the frozen split manifest: every ended run but a data check (which
        only reads); a running one is this command's own (it reads the splits as it starts)."""
        return [r.id for r in self.registry.list() if r.kind != "data-check" and r.status != "running"]

    def split(self, name: str, *, allow_test: bool = False) -> list[Example]:
        """One split. The reserved test split raises unless ``allow_test`` (only `tuneproof test` sets it).

        Raises:
            TuneproofError: the test split asked for without ``allow_test``, or an unknown split.
        """
        if name == self.study.data.test_split and not allow_test:
            raise TuneproofError(
                f"split '{name}' is the reserved test split",
                hint="only `tuneproof test RUN` reads it, and every read is logged",
            )
        if name not in self.all_splits:
            raise TuneproofError(f"split '{name}' does not exist (splits: {sorted(self.all_splits)})")
        return self.all_splits[name]

    @property
    def labels(self) -> list[str]:
        """Sorted class names seen in train (classification/categories)."""
        return sorted({e.label for e in self.all_splits["train"] if e.label is not None})

    def eval_examples(self) -> list[Example]:
        """The evaluation split, capped by ``eval.max_examples``: a fixed class-balanced subset (the same
        number per class, :func:`~tuneproof.data.split.balanced_take`; e.g. 5 per intent)."""
        items = self.split(self.study.eval.split)
        if self.study.eval.max_examples:
            items = balanced_take(items, self.study.eval.max_examples, self.study.data.split.seed)
        return items

    def test_examples(self) -> list[Example]:
        """The reserved test split as ``tuneproof test`` reads it, capped by ``eval.max_examples`` as the
        evaluation split is (the same class-balanced draw and seed, :func:`~tuneproof.data.split.balanced_take`).
        Only ``test`` and the data check may call it."""
        items = self.split(self.study.data.test_split, allow_test=True)
        if self.study.eval.max_examples:
            items = balanced_take(items, self.study.eval.max_examples, self.study.data.split.seed)
        return items

    @cached_property
    def eval_sets(self) -> list[EvalSetData]:
        """The study's ``eval.sets``, read and checked (:func:`tuneproof.data.eval_sets.load_eval_sets`); [] when
        it has none."""
        if self.study.eval.sets:
            self.modality  # noqa: B018 - refuses a set in a format the model's modality does not read
        sets = load_eval_sets(self.study, self.study_dir, self.data_root)
        # a reference the task's scorer refuses is refused here, not first by compare after the runs
        check_set_references(
            self.task, sets, self.study.hypothesis.required_fields, self.study.eval, self.study_dir / STUDY_FILE
        )
        return sets

    # ------------------------------------------------------------------ model
    @cached_property
    def base(self):
        return resolve_base(self.study.model, detect_kind)

    @property
    def model_kind(self) -> str:
        return model_kind(self.study.model, self.base)

    @cached_property
    def modality(self) -> Modality:
        """Text or image, chosen once from the model kind (:func:`tuneproof.modalities.modality_for`);
        everything that differs between them is asked of it.

        Raises:
            TuneproofError: a ``data.sources`` or ``eval.sets`` entry in a format this modality does not read (an
                image folder for a text model, a CSV of texts for an image classifier).
        """
        modality = modality_for(self.model_kind)
        for i, src in enumerate(self.study.data.sources):
            if src.format not in modality.source_formats:
                raise TuneproofError(
                    f"{self.study_dir / STUDY_FILE}: data.sources[{i}].format {src.format}: model.kind "
                    f"{self.model_kind} ({modality.name}) reads {', '.join(modality.source_formats)}",
                    hint="use a data format of the model's modality, or a model.kind that reads this data",
                )
        for i, spec in enumerate(self.study.eval.sets):  # eval.sets: prompts the same model reads
            if spec.format not in modality.source_formats:
                raise TuneproofError(
                    f"{self.study_dir / STUDY_FILE}: eval.sets[{i}].format {spec.format}: model.kind "
                    f"{self.model_kind} ({modality.name}) reads {', '.join(modality.source_formats)}",
                    hint="an evaluation set holds inputs of the model's modality; remove the set or change its format",
                )
        return modality

    @property
    def head(self) -> Head:
        """How the base is loaded and adapted (:class:`tuneproof.models.heads.Head` of the model kind)."""
        return self.modality.head(self.model_kind)

    @property
    def head_labels(self) -> list[str] | None:
        """The labels of a classification head (sequence or image classifier), else None."""
        return self.labels if self.head.labels_from is not None else None

    @cached_property
    def tokenizer(self):
        """The tokenizer, or for an image classifier its image processor (saved beside adapters the same way)."""
        return self.modality.load_processor(self.base)

    @cached_property
    def pipeline(self):
        """The one preprocessing pipeline (:meth:`tuneproof.modalities.modality.Modality.pipeline`)."""
        return self.modality.pipeline(self)

    @cached_property
    def tokenizer_identity(self) -> dict[str, Any]:
        """The processor's identity (:meth:`tuneproof.modalities.modality.Modality.processor_identity`): for
        a tokenizer its class, vocabulary size and hash, special and added tokens, chat template hash,
        the ids of a fixed probe text and of a fixed sample of the evaluation split's inputs and
        references; for an image processor its class, config hash and the declared transforms."""
        return self.modality.processor_identity(self)

    # ------------------------------------------------------------------ fingerprints
    def data_fingerprint(self) -> dict[str, Any]:
        """sha256 of the cleaned examples of every split + the ordered cleaning rules + the
        preprocessing config (prompt, tokenizer identity, max_length, loss). Stored in every run."""
        parts = {
            # image examples add the sha256 of the image bytes: a changed pixel changes the fingerprint
            "examples": sha256_json(
                {
                    n: [
                        [e.id, e.text, e.label, e.target]
                        + ([e.meta["image_sha256"]] if e.meta.get("image_sha256") else [])
                        # chat data: the row's system message and earlier turns are part of the example
                        + ([e.context] if e.context else [])
                        for e in v
                    ]
                    for n, v in sorted(self.all_splits.items())
                }
            ),
            "cleaning": sha256_json(self.study.data.cleaning),
            "preprocessing": sha256_json(
                {
                    "prompt": self.study.eval.prompt.model_dump(),
                    "max_length": self.study.training.max_length,
                    "loss": self.study.training.loss,
                    "tokenizer": self.tokenizer_identity,
                    **(
                        {"chat_template": part}
                        if (part := fingerprint_part(getattr(self.pipeline, "chat", None)))
                        else {}
                    ),
                }
                # which chat turns are trained (kept out when default, so flat-row fingerprints stay as they were)
                | ({"chat": self.study.data.chat.model_dump()} if self.study.data.chat != ChatData() else {})
            ),
        }
        return {
            "hash": sha256_json(parts),
            "parts": parts,
            "sizes": {n: len(v) for n, v in sorted(self.all_splits.items())},
            "repairs": self.repairs,
            "files": self.source_files,
        }

    @cached_property
    def source_files(self) -> list[dict[str, Any]]:
        """Every file the sources read (globs expanded): ``[{"path", "bytes", "sha256"}]``, paths
        relative to the study folder when inside it. Listed in the data fingerprint (not hashed
        into it: the examples' content is)."""
        out = []
        for src in self.study.data.sources:
            for p in source_files(src, self.study_dir, self.data_root, self.study.data.fields):
                if not p.is_file():
                    continue
                try:
                    shown = p.resolve().relative_to(self.study_dir).as_posix()
                except ValueError:
                    shown = str(p)
                out.append({"path": shown, "bytes": p.stat().st_size, "sha256": sha256_file(p)})
        return out

    @property
    def base_weights(self) -> str:
        """dtype the base model's weights are held in for this study: ``bf16`` with
        ``training.bf16_base_weights`` (every weight of a bare base, the frozen ones under an
        adapter), else ``fp32``. Under ``training.speedups: auto`` ``bf16`` where auto tries them
        (LoRA on a classifier, native bf16 and bf16 compute, :func:`tuneproof.models.device.bf16_base_rule`,
        :func:`tuneproof.training.speedups.static_rules`), so the baseline is evaluated as the candidate
        will be when their check passes (docs/speedups.md)."""
        t = self.study.training
        if t.speedups == "auto" and self.study.method.kind == "lora" and not self.head.token_labels:
            return "bf16" if bf16_base_rule(self.device_choice.get("dtype"), detect_device())[0] else "fp32"
        return "bf16" if t.bf16_base_weights else "fp32"

    # ------------------------------------------------------------------ device
    @cached_property
    def device_choice(self) -> dict[str, Any]:
        """Device and dtype for this machine and the study's precision (docs/CASES.md C9: reason recorded)."""
        dev = detect_device()
        choice = choose_dtype(
            self.study.training.precision, dev, bf16_base_weights=self.study.training.bf16_base_weights
        )
        if not choice["passed"]:
            raise TuneproofError(choice["message"], hint=choice.get("hint") or "set training.precision to auto or fp32")
        return {**choice, "torch_device": "cuda" if dev.type in ("cuda", "rocm") else "cpu"}

    @cached_property
    def quantization(self) -> dict[str, Any] | None:
        """``method.kind: qlora``: the 4-bit config the base is loaded with
        (:func:`tuneproof.models.quant.quantization_record`, compute dtype from the resolved
        precision); None for the other kinds."""
        if self.study.method.kind != "qlora":
            return None
        return quantization_record(self.study.method, self.device_choice["dtype"])

    def build_model(self):
        """The model this study trains, on its device (:func:`tuneproof.models.build.build_model`).
        Returns ``(model, report)``."""
        device, _, _ = self.torch_setup()
        labels = self.head_labels
        model, report = build_model(
            self.base,
            self.head,
            self.study.method,
            device=device,
            labels=labels,
            quantization=self.quantization,
            activation_checkpointing=self.study.training.activation_checkpointing,
        )
        vocabulary = self.modality.vocabulary_record(self.base.path, self.tokenizer)
        if vocabulary is not None:  # base rows before resizing, added tokens (docs/CASES.md C6 kind)
            report["vocabulary"] = vocabulary
        return model, report

    def torch_setup(self):
        """``(device, dtype, autocast_factory)``: weights stay fp32, bf16/fp16 run under autocast."""
        import torch  # noqa: PLC0415 - torch loads only when torch_setup() runs

        c = self.device_choice
        device = torch.device(c["torch_device"])
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(c["dtype"])
        if dtype is None:
            return device, torch.float32, contextlib.nullcontext
        return device, dtype, lambda: torch.autocast(device_type=device.type, dtype=dtype)
