"""The text modality: a tokenizer and :class:`~tuneproof.data.preprocess.TextPipeline` for causal
LMs (generative tasks) and sequence classifiers (encoders).

Prediction (the study's evaluation procedure, the same for baseline and candidates): generative
models decode greedily (or sample) in batches with left padding, the KV cache and
``torch.inference_mode``; prompts are sorted by length so a batch wastes little padding, and the
outputs are put back in the original order (:func:`~tuneproof.modalities.batching.length_sorted_batches`;
the outputs equal those of the unsorted batches and of one example at a time, checked in
``tests/evaluation/test_eval_sorted_batches.py`` and by the preflight's check of docs/CASES.md C22). Encoders: argmax
of the classification head, batches sorted the same way. This is the ``transformers`` generation
backend; ``evaluation/backends.py`` puts it and vLLM behind one interface.

Parts in the order of :mod:`tuneproof.modalities.modality`; the sequence-classification vs causal-LM
differences stay inside this module.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tuneproof.data.chat_template import (
    ChatTemplate,
    load_template_text,
    special_texts,
    split_generation,
    template_file,
)
from tuneproof.data.examples import Example
from tuneproof.data.inspect import LEGEND_CAUSAL, LEGEND_CLS, choose_examples, render_html, render_rich, token_rows
from tuneproof.data.preprocess import TextPipeline, collate
from tuneproof.data.sources import TEXT_FORMATS
from tuneproof.io import atomic_write_text
from tuneproof.modalities.batching import length_sorted_batches
from tuneproof.modalities.modality import LOSS_NORMALISATION, SUGGESTED_MAX_LENGTH, TEXT_CHECKS, TOKEN_LENGTHS, Modality
from tuneproof.models.base_model import load_tokenizer
from tuneproof.models.heads import Head
from tuneproof.models.identity import (
    compare_tokenizer,
    study_tokenizer_identity,
    tokenizer_identity,
    vocab_sha256,
    vocabulary_record,
)
from tuneproof.ui import console, user_text

CAUSAL_LM = Head(
    "causal-lm",
    "AutoModelForCausalLM",
    peft_task_type="CAUSAL_LM",
    architectures=("CausalLM", "LMHead"),
    pipeline_tag="text-generation",
    generative=True,
    token_labels=True,
)
SEQUENCE_CLASSIFIER = Head(
    "sequence-classification",
    "AutoModelForSequenceClassification",
    peft_task_type="SEQ_CLS",
    what="sequence classification",
    labels_from="data.fields.label",
    pipeline_tag="text-classification",
    adapter_effect=False,  # the smoke pass does not measure it for a sequence classifier
    model_types=frozenset(
        {"bert", "roberta", "distilbert", "deberta", "deberta-v2", "electra", "xlm-roberta", "modernbert"}
    ),
)
SEQUENCE_CLASSIFICATION = SEQUENCE_CLASSIFIER.kind
TOP_TOKENS = 5  # next-token logits kept per generative example (smoke pass, reload, export and verify)


# --------------------------------------------------------------------------- prediction loops
def generate(
    model,
    tokenizer,
    pipeline,
    examples: list[Example],
    eval_cfg,
    *,
    device,
    autocast,
    progress: Callable[[int], None] | None = None,
    sort_by_length: bool = True,
    token_progress: Callable[[int], None] | None = None,
    raw_out: list[str] | None = None,
) -> list[str]:
    """Generated answers, one per example: the generation up to its stop token, parsed by
    ``eval.answer_from`` (:func:`tuneproof.data.chat_template.split_generation`), whitespace stripped.

    Args:
        pipeline: the study's :class:`~tuneproof.data.preprocess.TextPipeline` (its prompt is the inference prompt,
            its ``stop_ids`` the end of turn and eos).
        eval_cfg: the study's ``eval`` section (batch_size, max_new_tokens, do_sample, temperature, answer_from).
        progress: called with the number of examples finished after each batch.
        sort_by_length: batch the prompts in length order (less padding; the outputs are returned
            in the order of ``examples`` either way).
        token_progress: called at each decoding step with the rows of the batch (one token slot
            each), and after a batch with the slots it left unused (a batch that ended early), so
            the calls add up to ``len(examples) x eval_cfg.max_new_tokens``.
        raw_out: when given, extended with each raw generation (special tokens kept), in the order of ``examples``.
    """
    return generate_prompts(
        model,
        tokenizer,
        [pipeline.prompt_text(ex) for ex in examples],
        eval_cfg,
        device=device,
        autocast=autocast,
        progress=progress,
        sort_by_length=sort_by_length,
        token_progress=token_progress,
        stop_ids=getattr(pipeline, "stop_ids", None),
        raw_out=raw_out,
    )


def _token_counter(report: Callable[[int], None]):
    """A transformers ``StoppingCriteria`` that never stops: it reports the batch rows at each decoding
    step (``__call__(input_ids [B, T], scores) -> BoolTensor [B]`` of False) and counts the steps."""
    import torch  # noqa: PLC0415 - torch on first use: the study context imports this module
    from transformers import StoppingCriteria  # noqa: PLC0415 - transformers on first use, as torch

    class TokenCounter(StoppingCriteria):
        def __init__(self) -> None:
            self.steps = 0

        def __call__(self, input_ids, scores, **kwargs):
            self.steps += 1
            report(int(input_ids.shape[0]))
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    return TokenCounter()


def generate_prompts(
    model,
    tokenizer,
    prompts: list[str],
    eval_cfg,
    *,
    device,
    autocast,
    progress: Callable[[int], None] | None = None,
    sort_by_length: bool = True,
    token_progress: Callable[[int], None] | None = None,
    stop_ids: list[int] | None = None,
    raw_out: list[str] | None = None,
) -> list[str]:
    """:func:`generate` on prompt texts already rendered (``pipeline.prompt_text``): each prompt is
    tokenized without added special tokens (the chat template holds them), batches of
    ``eval_cfg.batch_size`` are left-padded, generation stops at any of ``stop_ids`` (default eos; the study's
    are its end of turn and eos); returns one answer per prompt, in their order, parsed by
    ``eval_cfg.answer_from`` (default auto); ``raw_out`` (when given) is extended with the raw generations."""
    import torch  # noqa: PLC0415 - torch on first use: the study context imports this module

    with torch.inference_mode():
        model.eval()
        enc = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        out: list[str] = [""] * len(prompts)
        raw: list[str] = [""] * len(prompts)
        stops = list(stop_ids) if stop_ids else [tokenizer.eos_token_id]
        answer_from = getattr(eval_cfg, "answer_from", "auto")
        specials = special_texts(tokenizer)
        pad = tokenizer.pad_token_id
        for idx in length_sorted_batches([len(e) for e in enc], eval_cfg.batch_size, sort_by_length):
            width = max(len(enc[i]) for i in idx)
            ids = torch.full((len(idx), width), pad, dtype=torch.long)
            mask = torch.zeros((len(idx), width), dtype=torch.long)
            for r, i in enumerate(idx):  # left padding: the generated tokens follow every prompt directly
                ids[r, width - len(enc[i]) :] = torch.tensor(enc[i])
                mask[r, width - len(enc[i]) :] = 1
            kwargs = dict(
                max_new_tokens=eval_cfg.max_new_tokens,
                do_sample=eval_cfg.do_sample,
                pad_token_id=pad,
                eos_token_id=stops if len(stops) > 1 else stops[0],
                use_cache=True,
            )
            if eval_cfg.do_sample:
                kwargs["temperature"] = eval_cfg.temperature
            else:
                kwargs.update(temperature=None, top_p=None, top_k=None)
            counter = None
            if token_progress is not None:
                from transformers import StoppingCriteriaList  # noqa: PLC0415 - transformers on first use

                counter = _token_counter(token_progress)
                kwargs["stopping_criteria"] = StoppingCriteriaList([counter])
            with autocast():
                gen = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), **kwargs)
            for r, i in enumerate(idx):
                raw[i], out[i] = split_generation(tokenizer, gen[r, width:].tolist(), stops, answer_from, specials)
            if counter is not None and counter.steps < eval_cfg.max_new_tokens:  # ended early: the slots left
                token_progress(len(idx) * (eval_cfg.max_new_tokens - counter.steps))
            if progress:
                progress(len(idx))
    if raw_out is not None:
        raw_out.extend(raw)
    return out


def classify(
    model,
    tokenizer,
    examples: list[Example],
    labels: list[str],
    *,
    max_length: int,
    batch_size: int,
    device,
    autocast,
    progress: Callable[[int], None] | None = None,
    sort_by_length: bool = True,
) -> list[str]:
    """Predicted label names from a sequence-classification head (argmax of the logits), in the
    order of ``examples``; batched in length order unless ``sort_by_length`` is False."""
    import torch  # noqa: PLC0415 - torch on first use: the study context imports this module

    with torch.inference_mode():
        model.eval()
        texts = [e.text for e in examples]
        lengths = [len(ids) for ids in tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]]
        out: list[str] = [""] * len(examples)
        for idx in length_sorted_batches(lengths, batch_size, sort_by_length):
            enc = tokenizer(
                [examples[i].text for i in idx],
                padding=True,
                truncation=True,
                max_length=max_length,
                return_tensors="pt",
            )
            with autocast():
                logits = model(**{k: v.to(device) for k, v in enc.items()}).logits
            for i, k in zip(idx, logits.argmax(-1).tolist()):
                out[i] = labels[k]
            if progress:
                progress(len(idx))
    return out


def next_token_scores(model, ids, top: int = TOP_TOKENS) -> list[list]:
    """The ``top`` highest next-token logits after ``ids`` (``[1, T]``), as ``[[token id, logit], ...]`` (fp32)."""
    import torch  # noqa: PLC0415 - torch on first use: the study context imports this module

    last = model(input_ids=ids).logits[0, -1].float().cpu()
    best = torch.topk(last, min(top, last.numel()))
    return [[int(i), float(v)] for i, v in zip(best.indices, best.values)]


class _StoredPrompts:
    """Stands in for the study's TextPipeline: the exact prompt text stored at export, by example id
    (two chat examples may end with the same user turn after different earlier turns), and the stop tokens."""

    def __init__(self, prompts: dict[str, str], stop_ids: list[int] | None = None):
        self.prompts = prompts
        self.stop_ids = stop_ids

    def prompt_text(self, ex: Example) -> str:
        return self.prompts[ex.id]


# --------------------------------------------------------------------------- the modality
class TextModality(Modality):
    name = "text"
    unit = "tokens"
    logit = "next-token"
    heads = (CAUSAL_LM, SEQUENCE_CLASSIFIER)
    source_formats = TEXT_FORMATS
    dossier_sections = (TOKEN_LENGTHS, SUGGESTED_MAX_LENGTH, TEXT_CHECKS, LOSS_NORMALISATION)
    smoke_eval_note = ", an upper bound when the smoke model generates up to eval.max_new_tokens"

    # 1. processor, pipeline, collate
    def load_processor(self, base):
        """The base's tokenizer (:func:`tuneproof.models.base_model.load_tokenizer`: pad token = eos
        when it has none)."""
        return load_tokenizer(base)

    def pipeline(self, ctx) -> TextPipeline:
        """The study's :class:`~tuneproof.data.preprocess.TextPipeline` (its labels only for a sequence classifier)."""
        t = ctx.study.training
        labels = ctx.labels if ctx.model_kind == SEQUENCE_CLASSIFICATION else None
        m = ctx.study.model
        chat = (
            ChatTemplate(
                ctx.tokenizer,
                load_template_text(m.chat_template, ctx.study_dir),
                m.chat_template_kwargs,
                m.end_of_turn,
                source=template_file(m.chat_template),
            )
            if labels is None
            else None  # a sequence classifier renders no template
        )
        return TextPipeline(
            ctx.tokenizer,
            ctx.study.eval.prompt,
            t.max_length,
            t.loss,
            labels,
            ctx.study.data.chat.train_on,
            chat=chat,
            answer_from=ctx.study.eval.answer_from,
        )

    def encode_for_training(self, pipeline, examples: list[Example]) -> list:
        """:meth:`TextPipeline.encode_all` (train and evaluation encode alike)."""
        return pipeline.encode_all(examples)

    def units(self, encoded) -> int:
        """Its tokens after truncation."""
        return len(encoded.input_ids)

    def collate(self, batch: list, pad_id: int) -> dict:
        """:func:`tuneproof.data.preprocess.collate`: right-padded ``input_ids``, ``attention_mask``, ``labels``."""
        return collate(batch, pad_id)

    # 2. identity
    def processor_identity(self, ctx) -> dict[str, Any]:
        """Class, vocabulary size and hash, special and added tokens, chat template hash, the ids of a
        fixed probe text and of a fixed sample of the evaluation split's inputs and references
        (:func:`tuneproof.models.identity.study_tokenizer_identity`)."""
        # the whole evaluation split (not the eval.max_examples subset): the sample is data, not eval settings
        texts = [t for e in ctx.split(ctx.study.eval.split) for t in (e.text, e.target) if isinstance(t, str)]
        return study_tokenizer_identity(ctx.tokenizer, texts)

    def vocabulary_record(self, base_path: str | Path, processor) -> dict[str, Any]:
        """:func:`tuneproof.models.identity.vocabulary_record`: base rows before resizing, added tokens
        (docs/CASES.md C6 kind)."""
        return vocabulary_record(base_path, processor)

    # 3. data check
    def duplicate_input(self, splits: dict[str, list[Example]]) -> dict[str, list[Example]]:
        """Every split's texts."""
        return splits

    def audit(self, task, splits: dict[str, list[Example]], cfg, pipeline) -> dict[str, Any]:
        """The task kind's audit alone (the text form is checked by the encoding, see ``data check``)."""
        return task.audit(splits, cfg)

    # 4. prediction
    def progress_tokens(self, ctx, examples: list[Example]) -> int | None:
        """``len(examples) x eval.max_new_tokens`` for generation; None for a sequence classifier."""
        if ctx.model_kind == SEQUENCE_CLASSIFICATION:
            return None
        return len(examples) * ctx.study.eval.max_new_tokens

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
        """:func:`classify` for a sequence classifier, else :func:`generate` (``eval.batch_size`` or ``batch_size``;
        ``raw_out``, when given, gets the raw generations before ``eval.answer_from`` parsed them; batched in
        length order unless ``sort_by_length`` is False)."""
        ev = ctx.study.eval
        if ctx.model_kind == SEQUENCE_CLASSIFICATION:
            return classify(
                model,
                ctx.tokenizer,
                examples,
                ctx.labels,
                max_length=ctx.study.training.max_length,
                batch_size=batch_size or ev.batch_size,
                device=device,
                autocast=autocast,
                progress=progress,
                sort_by_length=sort_by_length,
            )
        if batch_size is not None:
            ev = ev.model_copy(update={"batch_size": batch_size})
        return generate(
            model,
            ctx.tokenizer,
            ctx.pipeline,
            examples,
            ev,
            device=device,
            autocast=autocast,
            progress=progress,
            token_progress=token_progress,
            raw_out=raw_out,
            sort_by_length=sort_by_length,
        )

    def eval_inputs(self, ctx, examples: list[Example]) -> list[str]:
        """The inference prompts (``pipeline.prompt_text``) of a generative head, the texts of a classifier."""
        if ctx.head.generative:
            return [ctx.pipeline.prompt_text(e) for e in examples]
        return [e.text for e in examples]

    def scores(self, ctx, model, examples: list[Example]) -> list[list]:
        """Per example: the :data:`TOP_TOKENS` highest next-token logits after the prompt
        (``[[id, logit], ...]``), or the class logits of a sequence classifier (``[[index, logit], ...]``)."""
        import torch  # noqa: PLC0415 - torch on first use: the study context imports this module

        device, _, autocast = ctx.torch_setup()
        model.eval()
        out = []
        with torch.inference_mode():
            for ex in examples:
                if ctx.model_kind == SEQUENCE_CLASSIFICATION:
                    enc = ctx.tokenizer(
                        ex.text, truncation=True, max_length=ctx.study.training.max_length, return_tensors="pt"
                    )
                    with autocast():
                        logits = model(**{k: v.to(device) for k, v in enc.items()}).logits[0].float()
                    out.append([[i, float(v)] for i, v in enumerate(logits.cpu())])
                    continue
                prompt = ctx.pipeline.prompt_text(ex)
                ids = torch.tensor([ctx.tokenizer(prompt, add_special_tokens=False)["input_ids"]], device=device)
                with autocast():
                    out.append(next_token_scores(model, ids))
        return out

    # 5. data inspect
    def inspect(self, ctx, examples: list[Example], n: int, split: str, html_path: Path | None) -> Path | None:
        """Token by token: supervised tokens and the token each is scored against (causal LM), or the
        class index and name the head is trained on; the training prefix vs the inference prompt."""
        encoded = ctx.pipeline.encode_all(examples)
        classes = ctx.pipeline.labels
        chosen = choose_examples(examples, encoded, n, seed=ctx.study.data.split.seed)
        if html_path is not None:
            items = [(encoded[i], token_rows(encoded[i], ctx.tokenizer)) for i in chosen]
            atomic_write_text(html_path, render_html(items, f"{ctx.study.name}: {split} after preprocessing", classes))
            console.print(f"wrote {user_text(html_path)}", soft_wrap=True)
            return html_path
        console.print(LEGEND_CLS if classes is not None else LEGEND_CAUSAL, soft_wrap=True, markup=False)
        for line in ctx.pipeline.template_report(encoded)["lines"]:  # the template, end of turn, gold chain
            console.print(user_text(line), soft_wrap=True)
        console.print()
        for i in chosen:
            console.print(render_rich(encoded[i], ctx.tokenizer, classes), soft_wrap=True)
            console.print()
        return None

    # 6. export and verify
    def bundle_extras(self, ctx, chosen: list[dict[str, Any]], bundle: Path) -> dict[str, Any]:
        """A generative model's examples keep the exact prompt text (verify renders nothing again)."""
        if ctx.model_kind != SEQUENCE_CLASSIFICATION:
            # by id: a chat example's prompt holds its earlier turns and its own system message
            by_id = {e.id: e for items in ctx.all_splits.values() for e in items}
            for c in chosen:
                c["prompt"] = ctx.pipeline.prompt_text(by_id.get(c["id"]) or c["input"])
        return {}

    def verify_processor(self, manifest: dict[str, Any], processor) -> tuple[str, list[str], str]:
        """The ``tokenizer`` check: class, vocabulary and its hash, added tokens, chat template, probe ids."""
        rec = manifest["tokenizer"]
        problems = compare_tokenizer(rec, {**tokenizer_identity(processor), "vocab_sha256": vocab_sha256(processor)})
        detail = (
            f"{rec.get('class')}, vocabulary {rec.get('vocab_size')}, probe hash "
            f"{str(rec.get('probe_hash'))[:16]}" + (" identical" if not problems else " differs")
        )
        return "tokenizer", problems, detail

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
        """A sequence classifier: ``prediction`` and ``logits`` (one per label) in one padded batch;
        generation: ``prediction`` (greedy, one batch of K, the stored prompts) and ``next_token``
        (the :data:`TOP_TOKENS` highest next-token logits after the prompt, ``[[token id, logit], ...]``)."""
        import torch  # noqa: PLC0415 - torch on first use: the study context imports this module

        out: list[dict[str, Any]] = []
        with torch.inference_mode():
            if procedure["model_kind"] == SEQUENCE_CLASSIFICATION:
                enc = processor(
                    [e["input"] for e in examples],
                    padding=True,
                    truncation=True,
                    max_length=procedure["max_length"],
                    return_tensors="pt",
                )
                with autocast():
                    logits = model(**{k: v.to(device) for k, v in enc.items()}).logits.float().cpu()
                labels = procedure["labels"]
                return [{"prediction": labels[int(row.argmax())], "logits": [float(x) for x in row]} for row in logits]
            exs = [Example(id=e["id"], text=e["input"]) for e in examples]
            cfg = SimpleNamespace(
                batch_size=max(1, len(exs)),
                max_new_tokens=procedure["max_new_tokens"],
                do_sample=False,
                temperature=1.0,
                answer_from=procedure.get("answer_from", "auto"),
            )
            preds = generate(
                model,
                processor,
                _StoredPrompts({e["id"]: e["prompt"] for e in examples}, procedure.get("stop_ids")),
                exs,
                cfg,
                device=device,
                autocast=autocast,
            )
            for e, p in zip(examples, preds):
                ids = torch.tensor([processor(e["prompt"], add_special_tokens=False)["input_ids"]], device=device)
                with autocast():
                    out.append({"prediction": p, "next_token": next_token_scores(model, ids)})
        return out


TEXT = TextModality()
