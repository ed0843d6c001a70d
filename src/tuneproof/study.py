"""The study file ``tuneproof.yaml``: hypothesis and guards first, then data, model, method,
training and evaluation. Validated with pydantic; unknown keys are an error (nanoGPT's rule:
a typo must never be silently ignored), and every error names the file and the key path.
"""

from __future__ import annotations

import copy
import difflib
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from tuneproof.errors import TuneproofError
from tuneproof.patterns import pattern_error

STUDY_FILE = "tuneproof.yaml"
TaskKind = Literal["classification", "multi-label", "extraction", "format", "image-classification"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


# --------------------------------------------------------------------------- roles
#: what a study key does, declared once on its field (``json_schema_extra=role(...)``); a field whose value is
#: a section declares the role of every key under it. What the other modules derive from it:
#: the preflight's scope (:mod:`tuneproof.preflight.scope`: a change of a ``trains`` or ``decodes`` key
#: invalidates a passed preflight, any other keeps it), the evaluation fingerprint
#: (:mod:`tuneproof.evaluation.fingerprint`: ``decodes`` keys in its ``decoding`` part, ``scores`` keys in its
#: ``metrics`` part, ``serves`` in its ``backend`` part), the frozen hypothesis's ``format``
#: (:data:`tuneproof.hypothesis.FORMAT_KEYS`: the ``eval`` keys that ``scores``) and the variant groups
#: (:func:`tuneproof.recipes.variants.group_of`: ``bookkeeping`` and ``tracking`` are no change of a variant).
ROLES: dict[str, str] = {
    "trains": "what is trained: data and its preprocessing, base model, method, optimisation, the prompt",
    "decodes": "what an evaluation generates: its split and decoding settings",
    "scores": "how outputs are scored: the task's metric definitions and the format rule",
    "judges": "the claim and the statistics that judge it: behaviour, success, guards, bootstrap",
    "serves": "the engine that serves baseline, eval and test generations (vLLM), and its check",
    "budget": "how much is run: optimizer steps or epochs, examples evaluated",
    "bookkeeping": "names and cadence: the study's name, checkpoint and evaluation-loss cadence, timeouts",
    "tracking": "where copies of the runs go (MLflow, W&B, Trackio, the remote copy), never what a run does",
}
#: the roles whose keys change what a preflight measured (the model, its steps, the smoke evaluation)
PREFLIGHT_ROLES = ("trains", "decodes")


def role(name: str) -> dict[str, str]:
    """``json_schema_extra`` of a field whose key plays the role ``name`` (one of :data:`ROLES`); the role
    shows in the JSON Schema (``"role"``) and in docs/study-file.md."""
    if name not in ROLES:
        raise ValueError(f"unknown role {name!r}; one of {', '.join(ROLES)}")
    return {"role": name}


# --------------------------------------------------------------------------- hypothesis
class Criterion(_Strict):
    metric: str = Field(description="metric name as reported by the evaluation, e.g. 'macro_f1', 'field_f1'")
    min_gain: float = Field(0.0, description="minimum gain over the baseline (absolute, same unit as the metric)")
    against: Literal["baseline", "strongest"] = Field(
        "baseline",
        description="the control the gain is measured against; baseline: the base model under the "
        "study's prompt; strongest: the best completed control on this metric when the first train run freezes the "
        "hypothesis (the baseline or a `baseline --few-shot K` control of the same procedure), recorded in "
        "hypothesis.frozen.json",
        json_schema_extra=role("judges"),
    )


#: the metric of a guard on an ``eval.sets`` entry that compares the candidate's outputs with the base's
AGREEMENT = "agreement"


class Guard(_Strict):
    """What must not regress. ``metric`` names an aggregate metric, or ``per_class_recall`` /
    ``per_class_f1`` / ``per_field_f1`` to apply the rule to every category or field."""

    metric: str = Field(description="metric (or per_class_* / per_field_*) that must not regress")
    max_drop: float | None = Field(
        None, description="largest allowed drop vs the baseline (absolute); unset: no drop rule"
    )
    floor: float | None = Field(None, description="absolute minimum value for the candidate; unset: no floor")
    classes: list[str] | None = Field(
        None,
        description="per_class_* guards: only these classes (default: every class); each must be a label of the data",
    )
    min_support: int = Field(
        1, ge=1, description="per_class_* / per_field_*: examples a class/field needs in the split to be judged"
    )
    correction: Literal["auto", "holm", "none"] = Field(
        "auto",
        description="per_class_* guards: multiplicity correction of the per-class drop decisions; holm: a class "
        "fails only if its exact McNemar p-value stays <= 0.05 after Holm (1979) over the judged classes; none: "
        "each class on its own 95% CI; auto: holm when the guard judges >= 10 classes, else none",
    )

    set: str | None = Field(
        None,
        description="judge the guard on this eval.sets entry instead of the eval split: metric agreement (share of "
        "the set's examples where the candidate's answer equals the base's, docs/eval-sets.md) with floor, or a "
        "task metric with max_drop / floor where the set has references",
    )

    @model_validator(mode="after")
    def _has_a_rule(self) -> Guard:
        if self.max_drop is None and self.floor is None:
            raise ValueError(f"guard on '{self.metric}' sets neither max_drop nor floor: write the condition it checks")
        if self.metric == AGREEMENT and self.set is None:
            raise ValueError(
                "metric agreement compares the candidate's outputs with the base's on an eval.sets entry: "
                "set hypothesis.guards[].set to the set's name"
            )
        if self.metric == AGREEMENT and self.max_drop is not None:
            raise ValueError(
                "max_drop does not apply to metric agreement (it is no base-vs-candidate delta: the base agrees with "
                "itself); write the least share that must agree as floor, e.g. floor: 0.8"
            )
        return self

    @model_serializer(mode="wrap")
    def _without_unset_set(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """``set`` is written only when given, so a guard without it dumps (and a frozen hypothesis hashes) exactly as
        before the key existed."""
        out = handler(self)
        if isinstance(out, dict) and out.get("set") is None:
            out.pop("set", None)
        return out


class Hypothesis(_Strict):
    behaviour: str = Field(description="the behaviour to improve, in one sentence", json_schema_extra=role("judges"))
    task: TaskKind = Field(
        description="the task kind: what the data holds, how outputs are scored and which metrics exist",
        json_schema_extra=role("scores"),
    )
    success: Criterion = Field(
        description="metric and minimum gain over the baseline", json_schema_extra=role("judges")
    )
    guards: list[Guard] = Field(
        default_factory=list, description="what must not get worse", json_schema_extra=role("judges")
    )
    required_fields: list[str] = Field(
        default_factory=list,
        description="extraction/format: top-level JSON keys every output must have",
        json_schema_extra=role("scores"),
    )


# --------------------------------------------------------------------------- data
class Source(_Strict):
    path: str = Field(
        description="file or folder, or a glob pattern (folds/fold*.json); relative paths are resolved from the "
        "study folder; '$DATA/...' from the data root"
    )
    format: Literal[
        "csv",
        "json",
        "jsonl",
        "parquet",
        "chat",
        "lines",
        "hf",
        "snips",
        "banking77",
        "imagefolder",
        "image-csv",
        "image-jsonl",
    ] = Field(
        description="file format or a built-in dataset reader; chat: one conversation per row (messages, "
        "ShareGPT conversations or TRL prompt/completion) in .jsonl/.json/.parquet; "
        "hf: a datasets folder or a dataset id + revision; "
        "lines: a split folder of line-aligned files (seq.in, label); "
        "imagefolder: root/[split/]class/image; image-csv / image-jsonl: path,label rows"
    )
    split: str | None = Field(
        None,
        description="the split this file holds (train, validation, test), or None to split it "
        "(format lines: default the folder's name)",
    )
    revision: str | None = Field(
        None,
        description="format hf with a dataset id: the commit sha or tag read from the local Hugging Face cache "
        "(required for an id; nothing downloads unless TUNEPROOF_ALLOW_DOWNLOAD=1)",
    )
    name: str | None = Field(None, description="format hf with a dataset id: the dataset's configuration name")


class FieldMap(_Strict):
    """Column (or key, or file for ``format: lines``) names. A dotted name is a path into nested
    JSON objects; ``target`` may be a mapping ``{out_key: column}`` building a JSON object."""

    text: str | list[str] = Field(
        "text",
        description="column holding the input text (format lines: the text file, default seq.in), or a list of "
        "columns whose non-empty values are joined by a blank line, in order (Alpaca's [instruction, input])",
    )
    label: str | None = Field(
        None, description="column holding the class label / category (format lines: default label)"
    )
    target: str | dict[str, str] | None = Field(
        None,
        description="column holding the expected output (extraction/format), or a "
        "mapping {key: column} building a JSON object",
    )
    id: str | None = Field(None, description="column holding a stable id (default: file and line)")
    image: str | None = Field(
        None, description="image-csv / image-jsonl: column holding the image path (default 'path')"
    )
    optional: list[str] = Field(
        default_factory=list, description="columns (or target keys) that may be absent: null, counted by data check"
    )

    @field_validator("text")
    @classmethod
    def _text_columns(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, list) and (not v or len(set(v)) != len(v) or not all(v)):
            raise ValueError("a list of columns must name at least one column, each once")
        return v


class SplitPolicy(_Strict):
    seed: int = Field(13, description="seed of the split")
    fractions: dict[str, float] = Field(
        default_factory=lambda: {"train": 0.8, "validation": 0.1, "test": 0.1},
        description="fractions for sources without a given split (stratified by label)",
    )
    max_examples: dict[str, int] = Field(
        default_factory=dict, description="cap per split (a subset drawn as `subset` says), e.g. {validation: 70}"
    )
    subset: Literal["stratified", "balanced"] = Field(
        "stratified",
        description="how max_examples draws: stratified (each class keeps its share, at least 1 example when the "
        "cap allows) or balanced (the same number per class; class shares not kept); recorded in splits.json",
    )
    carve_from: str | None = Field(
        None,
        description="splits named in fractions that the sources do not give are carved out of this split (stratified)",
    )

    @field_validator("fractions")
    @classmethod
    def _fractions(cls, v: dict[str, float]) -> dict[str, float]:
        """Each fraction in [0, 1] and all of them summing to 1 (within 1e-6); the keys at fault are named."""
        bad = [f"{k} = {x:g}" for k, x in v.items() if not 0.0 <= x <= 1.0]
        if bad:
            raise ValueError(
                f"{' and '.join(bad)} {'is' if len(bad) == 1 else 'are'} outside [0, 1]; each split's fraction is "
                "a share of the examples, e.g. {train: 0.8, validation: 0.1, test: 0.1}"
            )
        total = sum(v.values())
        if v and abs(total - 1.0) > 1e-6:
            parts = " + ".join(f"{k} {x:g}" for k, x in v.items())
            raise ValueError(f"{parts} = {total:g}, not 1; make the fractions sum to 1")
        return v

    @field_validator("max_examples")
    @classmethod
    def _caps(cls, v: dict[str, int]) -> dict[str, int]:
        bad = [f"{k} = {x}" for k, x in v.items() if x < 1]
        if bad:
            raise ValueError(f"{' and '.join(bad)}: a cap must be at least 1 (leave the split out for no cap)")
        return v


class SemanticDedup(_Strict):
    """The paraphrase pass over train and the evaluated splits (sentence encoder all-MiniLM-L6-v2); see
    docs/semantic-dedup.md for its cost and the precision of the threshold on BANKING77 and SNIPS."""

    threshold: float = Field(
        0.95, ge=-1.0, le=1.0, description="cosine similarity (all-MiniLM-L6-v2, mean pooling, L2) of a paraphrase"
    )
    policy: Literal["report", "drop-from-train"] = Field(
        "report", description="what to do with train examples that paraphrase an evaluated example"
    )
    batch_size: int = Field(64, ge=1, description="texts per encoder forward pass (CPU)")


class Dedup(_Strict):
    policy: Literal["report", "drop-from-train"] = Field(
        "report", description="what to do with train examples that collide with another split"
    )
    threshold: float = Field(0.8, ge=0.0, le=1.0, description="Jaccard threshold of near-duplicates (MinHash LSH)")
    shingles: Literal["word", "char"] = Field("word", description="shingle kind for MinHash")
    ngram: int = Field(3, ge=1, description="shingle size (words or characters)")
    num_perm: int = Field(128, ge=16, description="MinHash permutations")
    semantic: SemanticDedup | None = Field(
        None,
        description="paraphrase pass with a sentence encoder across train and the evaluated splits (off when unset)",
    )


#: default of ``data.image.max_pixels``: 50 megapixels covers a 48 MP phone camera, and an image classifier sees
#: every image resized to a few hundred pixels a side; Pillow's own decompression-bomb error comes only at twice
#: its 89.5 MP warning (``PIL.Image.MAX_IMAGE_PIXELS``), once a small file may already need gigabytes decoded
MAX_IMAGE_PIXELS = 50_000_000


class ImageTransforms(_Strict):
    """Image transforms, in this order; the model's own image processor does the rest (resize to its
    size unless ``resize`` is set, rescale, normalisation with its mean/std). ``max_pixels`` and
    ``allow_outside_paths`` say which image files are read at all."""

    mode: Literal["RGB", "L"] = Field("RGB", description="PIL mode every image is converted to before the processor")
    resize: int | None = Field(
        None, ge=1, description="square size in pixels the processor resizes to (default: the processor's own size)"
    )
    center_crop: int | None = Field(
        None, ge=1, description="square centre crop in pixels after resizing (default: none)"
    )
    horizontal_flip: bool = Field(
        False, description="train split only: mirror a fixed, seeded half of the images (training.seed)"
    )
    max_pixels: int = Field(
        MAX_IMAGE_PIXELS,
        ge=1,
        description="largest image accepted, in pixels (width x height, read from the file's header before "
        "decoding); a larger one is skipped and named: the model sees it resized anyway, and decoding it costs "
        "3 bytes per pixel (50 MP: 150 MB) and seconds per file",
    )
    allow_outside_paths: bool = Field(
        False,
        description="image-csv / image-jsonl / imagefolder: accept image paths (absolute, ../, or symlinks) "
        "that resolve outside the source's folder; refused by default so that a row cannot pull in files "
        "that are not part of the data",
    )


class ChatData(_Strict):
    train_on: Literal["last", "all_assistant"] = Field(
        "last",
        description="format chat: the assistant turns supervised: the final one (last) or every one "
        "(all_assistant, each with its end token); earlier turns are prompt context, evaluation judges the final turn",
    )
    messages: str | None = Field(
        None, description="format chat: the key holding the turns (default: 'messages', else 'conversations')"
    )


class Data(_Strict):
    sources: list[Source] = Field(description="where the examples come from")
    fields: FieldMap = Field(default_factory=FieldMap, description="column mapping")
    cleaning: list[Literal["strip", "collapse_whitespace", "nfkc", "remove_invisible", "drop_empty"]] = Field(
        default_factory=lambda: ["strip", "collapse_whitespace", "drop_empty"], description="ordered cleaning rules"
    )
    split: SplitPolicy = Field(default_factory=SplitPolicy, description="split policy")
    test_split: str = Field("test", description="the reserved split; only `tuneproof test` reads it")
    dedup: Dedup = Field(default_factory=Dedup, description="cross-split duplicate detection")
    chat: ChatData = Field(default_factory=ChatData, description="format chat: which turns are trained")
    image: ImageTransforms = Field(
        default_factory=ImageTransforms, description="image-classification: declared transforms"
    )
    max_chars: int = Field(
        100_000, ge=1, description="longest text or target accepted, in characters (checked before tokenising)"
    )
    min_class_examples: int = Field(
        10, ge=1, description="data check warns about classes with fewer examples in train or eval.split"
    )


# --------------------------------------------------------------------------- model & method
#: the variables every chat-template render gives the template itself (transformers' ``apply_chat_template``)
RENDER_ARGUMENTS = frozenset({"messages", "tools", "documents", "add_generation_prompt"})


class ModelSpec(_Strict):
    base: str = Field(description="built-in alias (smollm2-135m-instruct, minilm-l6), local folder, or hub id")
    revision: str | None = Field(
        None, description="exact revision (commit sha) for a hub id; checked against the local copy"
    )
    kind: Literal["auto", "causal-lm", "sequence-classification", "image-classification"] = Field(
        "auto", description="model head; auto: from the alias or the model's config"
    )
    trust_remote_code: bool = Field(
        False, description="let transformers run Python code shipped with the model (recorded in every run's config)"
    )
    chat_template: str | None = Field(
        None,
        description="a chat template overriding the tokenizer's: a file path (relative to the study folder) or the "
        "Jinja text itself; recorded by hash, rendered in transformers' sandbox (never remote code)",
    )
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="variables passed to every render of the chat template, training and inference (e.g. "
        "enable_thinking: false; date_string or strftime_now: '2026-01-31' pins an injected date); part of the "
        "evaluation fingerprint",
    )
    end_of_turn: str = Field(
        "auto",
        description="the token that ends an answer: supervised once at the end of every answer and the generation "
        "stop token; auto: the special token the template puts after an assistant's content, else eos",
    )

    @field_validator("chat_template_kwargs")
    @classmethod
    def _own_variables(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        taken = sorted(set(kwargs) & RENDER_ARGUMENTS)
        if taken:
            raise ValueError(
                f"'{taken[0]}' is given to the template by every render ({', '.join(sorted(RENDER_ARGUMENTS))}) "
                "and cannot be set here: give only the template's own variables (enable_thinking, ...)"
            )
        return kwargs


class Method(_Strict):
    kind: Literal["lora", "full", "qlora"] = Field(
        "lora",
        description="full fine-tuning, LoRA, or QLoRA (LoRA on a base loaded in 4-bit by "
        "bitsandbytes: python -m pip install -e '.[qlora]' in the tuneproof clone)",
    )
    r: int = Field(8, ge=1, description="LoRA rank")
    alpha: float = Field(16, gt=0, description="LoRA alpha (scale = alpha / r)")
    dropout: float = Field(0.05, ge=0.0, lt=1.0, description="LoRA dropout")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "v_proj"],
        description="module name patterns (suffix match, as PEFT); each must match",
    )
    modules_to_save: list[str] = Field(
        default_factory=list, description="extra modules trained and saved in full (e.g. classifier)"
    )
    # qlora only; names as in transformers' BitsAndBytesConfig (tuneproof.models.quant)
    bnb_4bit_quant_type: Literal["nf4", "fp4"] = Field(
        "nf4", description="qlora: 4-bit data type (NF4, QLoRA's NormalFloat, or FP4)"
    )
    bnb_4bit_use_double_quant: bool = Field(
        True, description="qlora: quantize the quantization constants again (QLoRA's double quantization)"
    )
    bnb_4bit_quant_storage: Literal["uint8", "int8", "bfloat16", "float16", "float32"] = Field(
        "uint8",
        description="qlora: dtype the packed 4-bit values are stored in; FSDP needs "
        "a float dtype equal to the compute dtype",
    )

    @model_validator(mode="after")
    def _quant_keys_need_qlora(self) -> Method:
        if self.kind != "qlora":
            for key, default in (
                ("bnb_4bit_quant_type", "nf4"),
                ("bnb_4bit_use_double_quant", True),
                ("bnb_4bit_quant_storage", "uint8"),
            ):
                if getattr(self, key) != default:
                    raise ValueError(
                        f"method.{key} applies to method.kind: qlora only (kind is {self.kind!r}); "
                        "remove it or set method.kind: qlora"
                    )
        return self


#: The step budget when neither ``training.max_steps`` nor ``training.epochs`` is set: one pass over train.
DEFAULT_EPOCHS = 1


#: The speed-ups ``training.speedups`` may list, in the order ``auto`` tries them
#: (:func:`tuneproof.training.speedups.resolve_auto`); each is also a boolean key of ``training``.
SPEEDUPS = ("packing", "length_grouping", "chunked_loss", "bf16_base_weights", "compile")
SpeedupName = Literal["packing", "length_grouping", "chunked_loss", "bf16_base_weights", "compile"]


def turn_off(training: Any, key: str) -> str:
    """How to turn the speed-up ``key`` off, as a hint: ``remove KEY from training.speedups`` when the study
    lists it there (the list sets the boolean key, so ``training.KEY: false`` beside it changes nothing:
    ``Training._speedups_list``), else ``set training.KEY: false``. ``training``: a :class:`Training`."""
    listed = getattr(training, "speedups", None)
    if isinstance(listed, list) and key in listed:
        rest = "[" + ", ".join(k for k in listed if k != key) + "]" if len(listed) > 1 else "off"
        return f"remove {key} from training.speedups (training.speedups: {rest})"
    return f"set training.{key}: false"


class Training(_Strict):
    seed: int = Field(0, description="seed of initialisation, data order and dropout", json_schema_extra=role("trains"))
    max_steps: int | None = Field(
        None, ge=1, description="optimizer steps of the run; exclusive with epochs", json_schema_extra=role("budget")
    )
    epochs: float | None = Field(
        None,
        gt=0,
        description=f"passes over train (an optimizer step never spans two epochs); "
        f"exclusive with max_steps; neither set: {DEFAULT_EPOCHS} epoch",
        json_schema_extra=role("budget"),
    )
    micro_batch_size: int = Field(
        8, ge=1, description="examples per forward/backward pass, per process", json_schema_extra=role("trains")
    )
    gradient_accumulation_steps: int = Field(
        1, ge=1, description="micro-batches per optimizer step", json_schema_extra=role("trains")
    )
    learning_rate: float = Field(
        2e-4,
        gt=0,
        lt=3.4e38,
        allow_inf_nan=False,
        description="peak learning rate (below fp32's largest value, the largest step AdamW can apply)",
        json_schema_extra=role("trains"),
    )
    lr_scheduler: Literal["linear", "cosine", "constant", "constant_with_warmup"] = Field(
        "linear", description="schedule (transformers.get_scheduler)", json_schema_extra=role("trains")
    )
    warmup_steps: int = Field(0, ge=0, description="linear warmup steps", json_schema_extra=role("trains"))
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay", json_schema_extra=role("trains"))
    max_grad_norm: float | None = Field(
        1.0, description="gradient clipping (None: off)", json_schema_extra=role("trains")
    )
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto", description="compute dtype; auto: bf16 where native, else fp32", json_schema_extra=role("trains")
    )
    activation_checkpointing: bool = Field(
        False, description="recompute activations in backward to save memory", json_schema_extra=role("trains")
    )
    chunked_loss: bool = Field(
        False,
        description="causal LM: loss over chunks of supervised positions without the full logits; "
        "used only after it matches the reference loss and gradients on a micro-batch",
        json_schema_extra=role("trains"),
    )
    length_grouping: bool = Field(
        False,
        description="micro-batches of examples of similar length (less padding); a seeded "
        "order within each process's DistributedSampler share, resumable; changes which examples share "
        "a step, so speedups: auto never turns it on",
        json_schema_extra=role("trains"),
    )
    packing: bool = Field(
        False,
        description="causal LM: several examples per row, position ids restarting per example, no "
        "attention across examples; used only after the packing check passes",
        json_schema_extra=role("trains"),
    )
    packing_length: int | None = Field(
        None,
        ge=8,
        description="tokens per packed row (training.packing); None: "
        "micro_batch_size x max_length, one row per micro-batch",
        json_schema_extra=role("trains"),
    )
    bf16_base_weights: bool = Field(
        False,
        description="LoRA: the frozen base weights held in bf16 (2 bytes per element instead of 4), "
        "trainable ones in fp32; needs native bf16 and training.precision bf16; used "
        "only after the loss and LoRA gradients match fp32 frozen weights on a micro-batch",
        json_schema_extra=role("trains"),
    )
    compile: bool = Field(
        False,
        description="torch.compile of the decoder (forward and backward of the training step); used only "
        "after the loss and gradients match eager mode on the first micro-batch; its compile seconds "
        "are recorded and counted in the plan",
        json_schema_extra=role("trains"),
    )
    speedups: Literal["auto", "off"] | list[SpeedupName] | None = Field(
        None,
        description="auto: each speed-up that applies here is checked on the study's micro-batches and used "
        "when its check passes (the run records which and why); off: none; a list: exactly those "
        "(each still checked); None: the boolean keys decide",
        json_schema_extra=role("trains"),
    )
    max_length: int = Field(
        128, ge=8, description="tokens per example after truncation", json_schema_extra=role("trains")
    )
    loss: Literal["answer_only", "full_sequence"] = Field(
        "answer_only", description="which tokens are supervised", json_schema_extra=role("trains")
    )
    checkpoint_every: int = Field(
        50,
        ge=1,
        description="save a resumable checkpoint every N optimizer steps",
        json_schema_extra=role("bookkeeping"),
    )
    eval_every: int | None = Field(
        None, description="evaluation loss every N steps (None: at the end only)", json_schema_extra=role("bookkeeping")
    )

    @model_validator(mode="before")
    @classmethod
    def _speedups_list(cls, data: Any) -> Any:
        # training.speedups sets the boolean keys (every reader of training.chunked_loss & co. sees them);
        # a key set true beside auto/off or outside the list is a contradiction, refused by name
        if not isinstance(data, dict) or data.get("speedups") is None:
            return data
        chosen = data["speedups"]
        listed = set(chosen) if isinstance(chosen, list) else set()
        for key in SPEEDUPS:
            if data.get(key) and key not in listed:
                raise ValueError(
                    f"training.{key}: true and training.speedups: {chosen} both set; "
                    f"list {key} in training.speedups, or remove training.{key}"
                )
        if isinstance(chosen, list):
            unknown = [k for k in chosen if k not in SPEEDUPS]
            if unknown:
                raise ValueError(f"training.speedups: unknown speed-up {unknown[0]!r}; known: {', '.join(SPEEDUPS)}")
            data = {**data, **dict.fromkeys(chosen, True)}
        return data

    @model_validator(mode="after")
    def _one_budget(self) -> Training:
        if self.max_steps is not None and self.epochs is not None:
            raise ValueError(
                f"training.max_steps ({self.max_steps}) and training.epochs ({self.epochs:g}) are both set: "
                "the step budget comes from one of them; remove one (or set it to null)"
            )
        return self

    @model_validator(mode="after")
    def _packing_rows(self) -> Training:
        # a row shorter than max_length cannot hold an example of max_length tokens: the rows would be
        # widened to the longest example, and with rows shorter than every example nothing is packed
        # while the run records packing as used
        if self.packing_length is None:
            return self
        if not self.packing and self.speedups != "auto":  # under auto it applies if auto turns packing on
            raise ValueError(
                f"training.packing_length ({self.packing_length}) applies to training.packing: true; "
                "remove it or set training.packing: true"
            )
        if self.packing_length < self.max_length:
            raise ValueError(
                f"training.packing_length {self.packing_length} is below training.max_length {self.max_length}: "
                f"a packed row must hold an example of max_length tokens; set it to at least {self.max_length} "
                f"(unset: micro_batch_size x max_length = {self.micro_batch_size * self.max_length}, one row per "
                "micro-batch)"
            )
        return self


# --------------------------------------------------------------------------- distributed
class Distributed(_Strict):
    """How ``tuneproof train --nproc-per-node N`` (N > 1, or --nnodes > 1) trains under torchrun."""

    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description="ddp: DistributedDataParallel (weights replicated); fsdp: FSDP2 "
        "fully_shard, one unit per decoder block + root",
        json_schema_extra=role("trains"),
    )
    backend: Literal["auto", "nccl", "gloo"] = Field(
        "auto",
        description="process-group backend; auto: nccl on CUDA GPUs, gloo on CPU",
        json_schema_extra=role("trains"),
    )
    timeout_s: float = Field(
        600.0,
        gt=0,
        description="seconds a rank waits in a collective before the run fails (a hung rank)",
        json_schema_extra=role("bookkeeping"),
    )


# --------------------------------------------------------------------------- eval
PROMPT_FIELDS = ("text",)  # the names a prompt template may use; every other brace is literal text


def render_prompt(template: str, text: str) -> str:
    """The user message: ``template`` with each ``{text}`` replaced by the example's input.

    Only the names in :data:`PROMPT_FIELDS` are substituted; any other brace is literal, so a
    template can show JSON (``Reply as {"intent": ...} for {text}``) without doubling braces
    (``{{`` stays ``{{``: this is not ``str.format``).
    """
    return template.replace("{text}", text)


class Prompt(_Strict):
    system: str | None = Field(
        None, description="system message (None: none is sent, the chat template may add its default)"
    )
    template: str = Field("{text}", description="user message; {text} is the example's input, other braces are literal")

    @field_validator("template")
    @classmethod
    def _has_text(cls, v: str) -> str:
        if "{text}" not in v:
            raise ValueError(
                "has no {text}: every example would get the same prompt; put {text} where the example's input goes"
            )
        return v


class EvalSetFields(_Strict):
    """Column (or key; format lines: file) names of an ``eval.sets`` entry; a dotted name is a path into nested JSON."""

    text: str = Field(description="column holding the prompt's input text (the prompt template's {text})")
    target: str | None = Field(
        None, description="column holding the reference output; unset: the set has no references (agreement only)"
    )
    id: str | None = Field(None, description="column holding a stable id (default: file and line)")


class EvalSet(_Strict):
    """A second evaluation set (docs/eval-sets.md): prompts outside the task (e.g. general instructions in the
    user's language) that baseline, eval and test generate after the eval split, with the same model, prompt
    template and decoding; ``hypothesis.guards[].set`` judges the candidate's outputs against the base's on it."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        description="the set's name (letters, digits, _ . -): hypothesis.guards[].set names it; its outputs go to "
        "runs/<id>/sets/<name>/outputs.jsonl",
    )
    path: str = Field(
        description="file (or folder for format lines); relative paths are resolved from the study folder, "
        "'$DATA/...' from the data root"
    )
    format: Literal["csv", "json", "jsonl", "parquet", "chat", "lines"] = Field(
        "jsonl", description="file format, read by the readers of data.sources"
    )
    fields: EvalSetFields = Field(description="column mapping: text (required), target (optional), id")


class Eval(_Strict):
    split: str = Field(
        "validation",
        description="split used by baseline and eval (never the reserved test split)",
        json_schema_extra=role("decodes"),
    )
    prompt: Prompt = Field(
        default_factory=Prompt, description="prompt used for training and generation", json_schema_extra=role("trains")
    )
    max_new_tokens: int = Field(64, ge=1, description="generation budget, tokens", json_schema_extra=role("decodes"))
    do_sample: bool = Field(False, description="sampling (False: greedy decoding)", json_schema_extra=role("decodes"))
    temperature: float = Field(
        1.0, gt=0, description="sampling temperature (eval.do_sample: true only)", json_schema_extra=role("decodes")
    )
    batch_size: int = Field(16, ge=1, description="generation batch (left padding)", json_schema_extra=role("decodes"))
    max_examples: int | None = Field(
        None,
        ge=1,
        description="evaluate a fixed class-balanced subset of this size (the same number per class)",
        json_schema_extra=role("budget"),
    )
    repeat: int = Field(
        1,
        ge=1,
        description="evaluate the same model this many times (baseline, eval, test): repeat 1 in the canonical "
        "order gives the run's outputs; each other repeat a seeded permutation of the examples (another batch "
        "order and padding) and, with eval.do_sample, its own sampling seed; each metric's spread over the "
        "repeats is the noise floor compare judges a gain above (noise.json)",
        json_schema_extra=role("budget"),
    )
    allow_fenced_json: bool = Field(
        False, description="accept ```json fenced output as valid JSON", json_schema_extra=role("scores")
    )
    json_schema: dict[str, Any] | None = Field(
        None, description="format: JSON Schema every output must satisfy", json_schema_extra=role("scores")
    )
    regex: str | None = Field(
        None,
        description="format: regular expression every output must fully match; named groups are scored parts",
        json_schema_extra=role("scores"),
    )
    grammar: Literal["function_slots"] | None = Field(
        None,
        description="format: a meaning-representation grammar, function_slots = name(slot[value], slot[v1, v2])",
        json_schema_extra=role("scores"),
    )
    sets: list[EvalSet] = Field(
        default_factory=list,
        description="extra evaluation sets, each generated after the split by baseline, eval and test with the same "
        "model, prompt and decoding (docs/eval-sets.md); each set's sha256 and size are in the evaluation fingerprint",
        json_schema_extra=role("decodes"),
    )
    bootstrap_iterations: int = Field(
        1000, ge=100, description="paired bootstrap iterations", json_schema_extra=role("judges")
    )
    seed: int = Field(
        0, description="seed of the bootstrap (and of the backend check's sample)", json_schema_extra=role("judges")
    )
    answer_from: str = Field(
        "auto",
        description="the answer scored in a generation: auto (the text after a closed think block or in the final "
        "channel, else the whole generation), raw (the whole generation), or a regular expression searched in the "
        "generation with special tokens kept (group 'answer', else group 1, else the match)",
        json_schema_extra=role("scores"),
    )
    backend: Literal["transformers", "vllm"] = Field(
        "transformers",
        description="generation backend of baseline/eval/test: transformers, or vllm (CUDA, installed separately; "
        "its outputs are checked against transformers' on a sample before its numbers are used)",
        json_schema_extra=role("serves"),
    )
    backend_check_examples: int = Field(
        16,
        ge=1,
        description="eval.backend vllm: examples of the seeded sample generated by both backends",
        json_schema_extra=role("serves"),
    )
    backend_check_min_agreement: float = Field(
        0.9,
        ge=0.0,
        le=1.0,
        description="eval.backend vllm: least share of sampled greedy outputs that must be identical in both backends",
        json_schema_extra=role("serves"),
    )

    @field_validator("answer_from")
    @classmethod
    def _answer_from(cls, v: str) -> str:
        if v not in ("auto", "raw") and (err := pattern_error(v)) is not None:
            raise ValueError(f"is neither auto, raw nor a valid regular expression ({err})")
        return v

    @field_validator("sets")
    @classmethod
    def _set_names(cls, v: list[EvalSet]) -> list[EvalSet]:
        seen: dict[str, int] = {}
        for i, s in enumerate(v):
            if s.name in seen:
                raise ValueError(
                    f"eval.sets[{i}].name: '{s.name}' is also the name of eval.sets[{seen[s.name]}]; each set needs "
                    "its own name (guards and run folders name it)"
                )
            seen[s.name] = i
        return v

    @model_validator(mode="after")
    def _backend_greedy(self) -> Eval:
        if self.backend == "vllm" and self.do_sample:
            raise ValueError(
                "eval.backend vllm needs greedy decoding (eval.do_sample: false): its check compares greedy outputs "
                "with transformers' before the numbers are used"
            )
        if self.backend == "vllm" and self.repeat > 1:
            raise ValueError(
                "eval.repeat > 1 needs eval.backend: transformers (the repeats of the noise floor are not "
                "implemented for vllm); set eval.repeat: 1 or eval.backend: transformers"
            )
        return self


# --------------------------------------------------------------------------- tracking


def is_tracker_key(key: str) -> bool:
    """True for a dotted key whose role is ``tracking`` (``tracking.mlflow.uri``, ``report_to``)."""
    return role_of(key) == "tracking"


def mlflow_folder_store(uri: str) -> bool:
    """True when ``uri`` names MLflow's folder store (``file:///.../mlruns`` or a plain path), which
    MLflow 3 keeps in maintenance mode and refuses to write runs to."""
    scheme = uri.split("://", 1)[0].lower() if "://" in uri else ""
    return scheme in ("", "file") or uri.lower().startswith("file:")


#: the refusal of a folder store, shared by the study file and $MLFLOW_TRACKING_URI
MLFLOW_FOLDER_FIX = (
    "is MLflow's folder store, which MLflow no longer writes runs to; use a database such as "
    "sqlite:///mlflow.db (or leave tracking.mlflow.uri out: sqlite:///<study>/mlflow.db) or a server such as "
    "http://127.0.0.1:5000"
)


class MlflowTracking(_Strict):
    uri: str | None = Field(
        None,
        description="MLflow tracking URI: a database (sqlite:///mlflow.db) or a server (http://host:5000); "
        "a folder (file://.../mlruns) is refused (default $MLFLOW_TRACKING_URI, else sqlite:///<study>/mlflow.db)",
    )
    experiment: str | None = Field(None, description="MLflow experiment (default: the study name)")

    @field_validator("uri")
    @classmethod
    def _not_a_folder(cls, uri: str | None) -> str | None:
        if uri is not None and mlflow_folder_store(uri):
            raise ValueError(f"'{uri}' {MLFLOW_FOLDER_FIX}")
        return uri


class WandbTracking(_Strict):
    project: str | None = Field(None, description="W&B project (default: the study name)")
    mode: Literal["online", "offline"] | None = Field(None, description="W&B mode (default: W&B's own)")


class TrackioTracking(_Strict):
    project: str | None = Field(None, description="Trackio project (default: the study name)")


class Tracking(_Strict):
    """Trackers that get a copy of every run; the registry stays the source of truth."""

    mlflow: MlflowTracking | None = Field(None, description="mirror runs to MLflow")
    wandb: WandbTracking | None = Field(None, description="mirror runs to Weights & Biases (when installed)")
    trackio: TrackioTracking | None = Field(None, description="mirror runs to Trackio (when installed)")


#: files (one example of each kind) a restored study cannot do without: ``storage.exclude`` may not name them
#: (the study file, hypothesis.FROZEN_FILE, data.split.MANIFEST, deliver.rental.RENTAL_FILE, a run's records)
EVIDENCE_PATHS = (
    "tuneproof.yaml",
    "hypothesis.frozen.json",
    "splits.json",
    "rental.json",
    "runs/r0001/run.json",
    "runs/r0001/summary.json",
    "runs/r0001/metrics.jsonl",
    "runs/r0001/outputs.jsonl",
)

_REMOTE_SCHEMES = ("s3", "gs", "gcs", "az", "abfs", "sftp", "file", "memory")


class Storage(_Strict):
    """Where the study is copied while commands run (``tuneproof.storage``); credentials never go here."""

    remote: str | None = Field(
        None,
        description="fsspec URI of the remote copy: s3://bucket/prefix, gs://, az://, sftp://user@host/path, "
        "file:///mnt/disk/study; credentials come from the environment or the store's own config, never this file",
    )
    exclude: list[str] = Field(
        default_factory=list,
        description="glob patterns (relative to the study folder) of files never copied, e.g. 'models/**'",
    )
    flush_s: float = Field(
        60.0, ge=0.0, description="seconds a command waits at its end for the last uploads (the rest: tuneproof sync)"
    )

    @field_validator("remote")
    @classmethod
    def _remote_uri(cls, uri: str | None) -> str | None:
        return None if uri is None else remote_uri(uri)

    @field_validator("exclude")
    @classmethod
    def _records_stay(cls, patterns: list[str]) -> list[str]:
        import fnmatch  # noqa: PLC0415 - only for studies with storage.exclude

        for pattern in patterns:
            hit = next((rel for rel in EVIDENCE_PATHS if fnmatch.fnmatch(rel, pattern)), None)
            if hit is not None:
                raise ValueError(
                    f"'{pattern}' would leave {hit} out of the remote copy: a restored study needs the study file, the "
                    "frozen hypothesis, the frozen splits, the rental window and every run's records; exclude other "
                    "files only (models/**, a data cache)"
                )
        return patterns


def remote_uri(uri: str) -> str:
    """``uri`` as a remote copy's URI (the scheme lower-cased, RFC 3986 3.1; no trailing ``/``).

    Raises:
        ValueError: not ``scheme://...`` of a known store; ``file://`` with a host (``file://dir/x`` reads as a
            path relative to the current folder: three slashes name an absolute path); ``sftp://`` without a
            path on the host; a password in the URI (credentials come from the environment).
    """
    scheme, sep, rest = uri.strip().partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in _REMOTE_SCHEMES or not rest.strip("/"):
        raise ValueError(
            f"'{uri}' is not a remote URI: use s3://bucket/prefix, gs://bucket/prefix, az://container/prefix, "
            "sftp://user@host/path or file:///path"
        )
    netloc, _, path = rest.partition("/")
    if ":" in netloc.rsplit("@", 1)[0] and "@" in netloc:
        raise ValueError(
            f"the URI holds a password ('{scheme}://{netloc.split(':', 1)[0]}:***@...'): credentials come "
            "from the environment or the store's own config (AWS_*, ~/.ssh keys), never from the study file or the "
            "command line"
        )
    if scheme == "file" and netloc not in ("", "localhost"):
        raise ValueError(
            f"'{uri}' names the host '{netloc}': a file:// URI takes an absolute path after three slashes "
            f"(file:///{netloc}/{path} for the folder /{netloc}/{path})"
        )
    if scheme == "sftp" and not path.strip("/"):
        raise ValueError(
            f"'{uri}' names no folder on {netloc}: the remote copy would be written at the top of the login's home; "
            f"name one: sftp://{netloc}/path/to/study"
        )
    return f"{scheme}://{rest}".rstrip("/")


class Study(_Strict):
    schema_version: int = Field(1, description="study file schema version", json_schema_extra=role("bookkeeping"))
    name: str = Field(description="study name", json_schema_extra=role("bookkeeping"))
    hypothesis: Hypothesis = Field(description="what the study sets out to show, frozen with the first train run")
    data: Data = Field(
        description="where the examples come from and how they are split and checked", json_schema_extra=role("trains")
    )
    model: ModelSpec = Field(description="the base model, pinned to an exact copy", json_schema_extra=role("trains"))
    method: Method = Field(
        default_factory=Method,
        description="how the base is adapted: LoRA, QLoRA or full",
        json_schema_extra=role("trains"),
    )
    training: Training = Field(default_factory=Training, description="the training run and its speed-ups")
    distributed: Distributed = Field(
        default_factory=Distributed, description="more than one process: torchrun with DDP or FSDP2"
    )
    eval: Eval = Field(default_factory=Eval, description="the one evaluation procedure of baseline, eval and test")
    tracking: Tracking = Field(
        default_factory=Tracking,
        description="trackers that get a copy of every run",
        json_schema_extra=role("tracking"),
    )
    report_to: list[Literal["mlflow", "wandb", "trackio"]] = Field(
        default_factory=list,
        description="shorthand for tracking.<name> with its defaults (transformers' report_to names)",
        json_schema_extra=role("tracking"),
    )
    storage: Storage = Field(
        default_factory=Storage,
        description="a remote copy of the study kept while commands run (tuneproof sync)",
        json_schema_extra=role("tracking"),
    )

    @model_validator(mode="after")
    def _consistent(self) -> Study:
        sets = [s.name for s in self.eval.sets]
        for i, g in enumerate(self.hypothesis.guards):
            if g.set is not None and g.set not in sets:
                raise ValueError(
                    f"hypothesis.guards[{i}].set: '{g.set}' names no eval.sets entry "
                    f"({'sets: ' + ', '.join(sets) if sets else 'eval.sets is empty'}); add the set to eval.sets or "
                    "fix the name"
                )
        if self.eval.split == self.data.test_split:
            raise ValueError(
                f"eval.split is the reserved test split '{self.data.test_split}': baseline/eval must use another split"
            )
        if self.method.kind == "qlora" and self.eval.backend == "vllm":
            raise ValueError(
                "eval.backend vllm with method.kind qlora: vLLM would serve the adapter on the unquantized base, "
                "not the 4-bit base it was trained on (not checked yet); set eval.backend: transformers"
            )
        if self.training.bf16_base_weights and self.method.kind == "full":
            raise ValueError(
                "training.bf16_base_weights holds the frozen base weights in bf16, and method.kind full freezes none: "
                "every weight is trained and keeps fp32 master weights; set training.bf16_base_weights: false "
                "(or method.kind: lora)"
            )
        if self.training.bf16_base_weights and self.method.kind == "qlora":
            raise ValueError(
                "training.bf16_base_weights with method.kind qlora: the frozen base is already held in 4 bits "
                "(its other tensors as prepare_model_for_kbit_training sets "
                "them); set training.bf16_base_weights: false"
            )
        if self.training.bf16_base_weights and (self.training.chunked_loss or self.training.packing):
            other = "chunked_loss" if self.training.chunked_loss else "packing"
            raise ValueError(
                f"training.bf16_base_weights together with training.{other} is not checked yet (each is proven "
                f"against fp32 frozen weights alone); set one of them to false"
            )
        return self


def _section_of(annotation: Any) -> type[BaseModel] | None:
    """The section model inside a field's annotation (``Guard`` in ``list[Guard]``, ``X`` in ``X | None``)."""
    todo = [annotation]
    while todo:
        t = todo.pop()
        if isinstance(t, type) and issubclass(t, BaseModel):
            return t
        todo.extend(typing.get_args(t))
    return None


def role_of(key: str) -> str | None:
    """The role (:data:`ROLES`) of a dotted study key (``eval.regex``, ``tracking.mlflow.uri``, a key inside a
    mapping value such as ``eval.json_schema.properties``): the role declared on it or on the section field
    above it. None for a key the schema does not have."""
    model: type[BaseModel] | None = Study
    for part in key.split("."):
        field = model.model_fields.get(part) if model is not None else None
        if field is None:
            return None
        extra = field.json_schema_extra
        if isinstance(extra, dict) and "role" in extra:
            return str(extra["role"])
        model = _section_of(field.annotation)
    return None


def declared_roles() -> dict[str, str]:
    """Dotted key -> role of every key that declares one (a section field stands for the keys under it)."""
    out: dict[str, str] = {}

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            extra = field.json_schema_extra
            if isinstance(extra, dict) and "role" in extra:
                out[prefix + name] = str(extra["role"])
            elif (sub := _section_of(field.annotation)) is not None:
                walk(sub, f"{prefix}{name}.")

    walk(Study, "")
    return out


def keys_with_role(name: str, section: str | None = None) -> tuple[str, ...]:
    """The keys (dotted, in schema order) whose role is ``name``; with ``section``, only the keys of that
    section, without its prefix (``keys_with_role("scores", "eval")`` -> ``("allow_fenced_json", ...)``)."""
    keys = [k for k, r in declared_roles().items() if r == name]
    if section is None:
        return tuple(keys)
    return tuple(k[len(section) + 1 :] for k in keys if k.startswith(section + "."))


#: the top-level keys that say where copies of the runs go (``tuneproof.tracking``, ``tuneproof.storage``)
TRACKER_KEYS = keys_with_role("tracking")


def _format_loc(loc: tuple) -> str:
    return ".".join(str(p) for p in loc) or "<root>"


#: names other fine-tuning configs (Axolotl, TRL, PEFT) use for a key this schema names otherwise;
#: suggested for an unknown key when the key they map to exists at the same place
KNOWN_ALIASES = {
    "rank": "r",
    "lora_r": "r",
    "lora_alpha": "alpha",
    "lora_dropout": "dropout",
    "lora_target_modules": "target_modules",
    "num_epochs": "epochs",
    "num_train_epochs": "epochs",
    "sequence_len": "max_length",
    "max_seq_length": "max_length",
    "per_device_train_batch_size": "micro_batch_size",
    "base_model": "base",
}


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The schema model that holds the keys at ``loc`` (a pydantic error location: key names and
    list indices), or None where ``loc`` leaves the schema's models (a dict value, a scalar)."""
    for part in loc:
        if isinstance(part, int):  # a list index: the list's item type was unwrapped below
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        todo, found = [field.annotation], None
        while todo and found is None:
            t = todo.pop()
            if isinstance(t, type) and issubclass(t, BaseModel):
                found = t
            else:
                todo.extend(typing.get_args(t))
        if found is None:
            return None
        model = found
    return model


def did_you_mean(loc: tuple) -> str:
    """``" (did you mean 'training.micro_batch_size'?)"`` for an unknown key at ``loc`` close to a
    key of the same section (difflib's ratio >= 0.75) or named as another library names it
    (:data:`KNOWN_ALIASES`); ``""`` when none is close."""
    if not loc:
        return ""
    holder = _model_at(Study, tuple(loc[:-1]))
    if holder is None:
        return ""
    key, keys = str(loc[-1]), list(holder.model_fields)
    alias = KNOWN_ALIASES.get(key)
    close = [alias] if alias in keys else difflib.get_close_matches(key, keys, n=1, cutoff=0.75)
    return f" (did you mean '{_format_loc((*loc[:-1], close[0]))}'?)" if close else ""


def validate_study(raw: Any, path: str | Path = STUDY_FILE) -> Study:
    """Validate a parsed YAML mapping against the schema (keys, values, rules over several keys).
    The rules that need the task kinds or the installed packages are checked on top of it by
    :func:`tuneproof.context.parse_study`, the loader every command uses.

    Raises:
        TuneproofError: names the file and the key path.
    """
    if not isinstance(raw, dict):
        raise TuneproofError(f"{path}: the study file must be a YAML mapping, got {type(raw).__name__}")
    try:
        study = Study.model_validate(raw)
    except ValidationError as err:
        lines = []
        for e in err.errors()[:5]:
            loc = _format_loc(e["loc"])
            if e["type"] == "extra_forbidden":
                lines.append(f"{path}: unknown key '{loc}'{did_you_mean(e['loc'])}")
            elif e["type"] == "missing":
                lines.append(f"{path}: missing key '{loc}'")
            elif e["type"] == "value_error":  # a rule over several keys: the message names them, not the whole mapping
                lines.append(f"{path}: {loc}: {e['msg'].removeprefix('Value error, ')}")
            else:
                msg = e["msg"].removeprefix("Value error, ")
                lines.append(f"{path}: {loc}: {msg} (got {e.get('input')!r})")
        raise TuneproofError(
            "\n".join(lines), hint="fix the study file; `tuneproof init` writes a commented template"
        ) from None
    return study


def read_study(path: str | Path) -> tuple[Any, Path]:
    """Read ``tuneproof.yaml`` (or a folder holding it): ``(the parsed YAML, the file's path)``;
    a ``method.bnb_4bit_*`` key without ``method.kind: qlora`` is refused here, before validation
    (:func:`tuneproof.context.load_study` reads and validates).

    Raises:
        TuneproofError: file missing, YAML syntax error (with line), not UTF-8, a quant key without qlora.
    """
    path = Path(path)
    if path.is_dir():
        path = path / STUDY_FILE
    if not path.exists():
        raise TuneproofError(
            f"{path}: study file not found", hint="run `tuneproof init DIR --task ...` or pass --study"
        )
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise TuneproofError(f"{path}{where}: YAML syntax error ({getattr(err, 'problem', err)})") from None
    except UnicodeDecodeError as err:
        raise TuneproofError(f"{path}: not UTF-8 at byte offset {err.start}") from None
    _quant_keys_written_need_qlora(raw, path)
    return raw, path


def _quant_keys_written_need_qlora(raw: Any, path: Path) -> None:
    """A ``method.bnb_4bit_*`` key written in the study file without ``method.kind: qlora`` is refused,
    even at its default value (``Method`` itself can only see values that differ from the default: a
    resolved config of a LoRA run records every key)."""
    method = raw.get("method") if isinstance(raw, dict) else None
    if not isinstance(method, dict) or method.get("kind", "lora") == "qlora":
        return
    written = [k for k in method if isinstance(k, str) and k.startswith("bnb_4bit_")]
    if written:
        raise TuneproofError(
            f"{path}: method: method.{written[0]} applies to method.kind: qlora "
            f"only (kind is {method.get('kind', 'lora')!r}); "
            "remove it or set method.kind: qlora",
            hint="fix the study file; `tuneproof init` writes a commented template",
        )


def resolved_config(study: Study) -> dict[str, Any]:
    """The fully resolved config (defaults filled in) as a plain dict, for runs and diffs."""
    return study.model_dump(mode="json")


def set_key(config: dict[str, Any], dotted: str, value: str, path: str = "--set") -> dict[str, Any]:
    """Return a copy of ``config`` with ``dotted`` (e.g. ``method.r``) set to ``value`` parsed as YAML.

    Raises:
        TuneproofError: the key does not exist in the resolved config.
    """
    out = copy.deepcopy(config)
    node = out
    parts = dotted.split(".")
    for i, p in enumerate(parts[:-1]):
        if not isinstance(node, dict) or p not in node:
            raise TuneproofError(
                f"{path}: unknown key '{'.'.join(parts[: i + 1])}'", hint="see `tuneproof init` for the keys"
            )
        node = node[p]
    if not isinstance(node, dict) or parts[-1] not in node:
        raise TuneproofError(f"{path}: unknown key '{dotted}'", hint="see `tuneproof init` for the keys")
    node[parts[-1]] = yaml.safe_load(value)
    return out


#: the file ``init`` writes beside the study file; templates name it on their first line for editors
#: (yaml-language-server, used by VS Code's YAML extension and others)
SCHEMA_FILE = "tuneproof.schema.json"
SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def study_json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of ``tuneproof.yaml``, generated by pydantic from :class:`Study`:
    every key with its type, default and description; unknown keys are refused
    (``additionalProperties: false``), as the loader refuses them. Rules over several keys (e.g.
    ``training.max_steps`` vs ``epochs``) are the loader's alone: a file the schema accepts can still be
    refused by :func:`validate_study`."""
    schema = Study.model_json_schema()
    return {"$schema": SCHEMA_DIALECT, "title": "tuneproof study file (tuneproof.yaml)", **schema}
