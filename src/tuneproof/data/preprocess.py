"""The single preprocessing path: what ``train`` feeds the model, what ``data inspect`` shows and
what ``baseline``/``eval`` prompt with all come from here.

Causal LM (generative tasks): the prompt is the chat template applied to (system, user) with the
generation prompt; the training text is the chat template applied to (system, user, assistant).
Chat data (``format: chat``, :mod:`tuneproof.data.chat`) puts the row's own system message and its
earlier turns before the final user turn; with ``data.chat.train_on: all_assistant`` the earlier
assistant turns are supervised too, each with its end token, at their place in the inference prompt.
The answer boundary is found from character offsets (never by re-tokenising a marker, which can
tokenise differently in context, docs/CASES.md C3); the supervised tokens are the answer and its
end-of-turn token (docs/CASES.md C2: the end token is supervised even when pad == eos, because padding is
masked by position, not by token id).

Sequence classification (encoders): the text is tokenised alone, the label is the class index.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tuneproof.data.chat import as_example, context_answer_spans, prompt_messages, rendered_marks, rendered_target
from tuneproof.data.chat_template import (
    KWARGS_KEY,
    TEMPLATE_KEY,
    ChatTemplate,
    regex_miss,
    special_texts,
    split_generation,
)
from tuneproof.data.examples import Example
from tuneproof.data.image_pipeline import collate_images
from tuneproof.errors import CheckFailed, TuneproofError
from tuneproof.study import render_prompt
from tuneproof.ui import visible_text

if TYPE_CHECKING:
    import torch

#: label id of a position the loss does not supervise (the prompt, padding): PyTorch's
#: ``cross_entropy`` ``ignore_index`` default
IGNORE_INDEX = -100
#: how the fault of a chat template that renders no generation prompt starts (the data check's template
#: report reads it to name the cause instead of a switch for the text supervised before the answer)
NO_GENERATION_PROMPT = "the chat template renders no generation prompt"


@dataclass
class Encoded:
    """One example after the exact preprocessing of the trainer.

    Attributes:
        input_ids: token ids after truncation, length <= max_length.
        labels: same length; the target id where supervised, -100 elsewhere (for sequence
            classification: empty, see ``class_index``).
        prompt_tokens: tokens before the answer boundary (before truncation).
        answer_tokens: tokens of the answer incl. the end-of-turn token (before truncation).
        full_length: tokens before truncation.
        n_supervised: supervised tokens after truncation (what the loss actually sees).
        faults: hard faults found while encoding (strings naming the problem).
        notes: what the data check does not refuse but `data inspect` shows (a merge across the answer
            boundary, text the template adds before the answer).
        boundary_char: character offset of the answer in the training text.
        answer_lost: supervised (answer) tokens removed by truncation at ``max_length``.
        end_cut: the answer's end token is among the tokens removed by truncation.
        prefix_diff: when the training text does not start with the inference prompt (docs/CASES.md C3
            kind): ``{"prompt", "training_prefix", "first_difference", "diff"}`` from the
            template's own rendering, see :func:`char_diff`; else None.
        before_answer, before_tokens: text the template supervises between the inference prompt and the
            answer (an empty think block, channel markers) and its supervised tokens.
        gold_answer: the supervised span decoded and parsed as the evaluation does (``eval.answer_from``),
            None for sequence classification: a model that emits exactly the supervised tokens is scored on it.
        gold_roundtrip: False when ``gold_answer`` differs from the reference because the tokenizer itself does
            not decode the reference's tokens back to its text (a warning; a difference the template or the
            parsing makes is a fault).
        context_supervised: chat data under ``data.chat.train_on: all_assistant``: the supervised
            tokens of the earlier assistant turns (inside the prompt), end tokens included.
    """

    id: str
    category: str | None
    input_ids: list[int]
    labels: list[int]
    prompt_tokens: int
    answer_tokens: int
    full_length: int
    n_supervised: int
    truncated: bool
    text: str
    boundary_char: int
    offsets: list[tuple[int, int]] = field(default_factory=list)
    class_index: int | None = None
    faults: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    answer_lost: int = 0
    end_cut: bool = False
    prefix_diff: dict[str, Any] | None = None
    before_answer: str = ""
    before_tokens: int = 0
    gold_answer: str | None = None
    gold_roundtrip: bool = True
    context_supervised: int = 0


def visible(text: str) -> str:
    """Whitespace made visible: newline ``\\n``, tab ``\\t``, space ``·``; other control characters
    as escapes (``\\x1b``, :func:`tuneproof.ui.visible_text`), never cut."""
    return visible_text(text.replace(" ", "·"), one_line=True, limit=None)


def char_diff(a: str, b: str) -> tuple[int | None, str]:
    """Character-level diff of ``a`` (removed) against ``b`` (added), from
    ``difflib.SequenceMatcher`` (autojunk off). Returns ``(first differing character offset or
    None, marked text)``; the marked text is ``b``'s view with ``[-only in a-]`` and ``{+only in
    b+}``, whitespace made visible (:func:`visible`)."""
    sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
    parts: list[str] = []
    first = None
    for op, i1, i2, j1, j2 in sm.get_opcodes():
        if op == "equal":
            parts.append(visible(a[i1:i2]))
            continue
        first = i1 if first is None else first
        if i2 > i1:
            parts.append(f"[-{visible(a[i1:i2])}-]")
        if j2 > j1:
            parts.append(f"{{+{visible(b[j1:j2])}+}}")
    return first, "".join(parts)


class TextPipeline:
    """Prompt building and tokenisation for one study.

    Args:
        tokenizer: a Hugging Face tokenizer (fast tokenizer: offsets are needed).
        prompt: the study's ``eval.prompt`` (system, template).
        max_length: tokens per example after truncation.
        loss: ``answer_only`` or ``full_sequence``.
        labels: class names for sequence classification (index = position), else None.
        chat: the study's :class:`~tuneproof.data.chat_template.ChatTemplate` (``model.chat_template``,
            ``model.chat_template_kwargs``, ``model.end_of_turn``); default: the tokenizer's template as is.
        answer_from: ``eval.answer_from`` (how the data check reads the gold answer back, as eval does).

    Every render (training text, inference prompt, data check, inspect, baseline, eval) is
    ``chat.render(self._messages(...))``: the message list is built in one method, the template applied in one.

    Raises:
        TuneproofError: the chat template cannot be compiled or rendered, or ``model.end_of_turn`` is no token.
        train_on: ``data.chat.train_on`` (``last`` or ``all_assistant``): which assistant turns of
            chat data are supervised.
    """

    def __init__(
        self,
        tokenizer,
        prompt,
        max_length: int,
        loss: str = "answer_only",
        labels: list[str] | None = None,
        train_on: str = "last",
        *,
        chat: ChatTemplate | None = None,
        answer_from: str = "auto",
    ):
        self.tok = tokenizer
        self.prompt = prompt
        self.max_length = max_length
        self.loss = loss
        self.labels = labels
        self.train_on = train_on
        self.answer_from = answer_from
        self.chat = chat if chat is not None else ChatTemplate(tokenizer, plain=labels is not None)
        self.use_chat = self.chat.text is not None
        self.end_token = self.chat.end_of_turn
        self.stop_ids = self.chat.stop_ids
        self._specials = special_texts(tokenizer)

    # ------------------------------------------------------------------ text
    def _messages(self, ex: Example) -> list[dict[str, str]]:
        """The one place an example becomes the message list of its prompt (system, earlier turns
        of chat data, the user turn), :func:`tuneproof.data.chat.prompt_messages`."""
        return prompt_messages(ex, self.prompt)

    def _render(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        """The chat template applied to ``messages`` (text, not tokens): :meth:`ChatTemplate.render
        <tuneproof.data.chat_template.ChatTemplate.render>` (``model.chat_template``, its kwargs, the system
        folded where the template has no system role; a template error is one line)."""
        return self.chat.render(messages, add_generation_prompt)

    def prompt_text(self, ex: Example | str) -> str:
        """The exact text the model is given at inference time (ends with the generation prompt).
        ``ex``: the example (a bare input text: one without chat context)."""
        ex = as_example(ex)
        if self.use_chat:
            return self._render(self._messages(ex), True)
        return self._plain_context(ex) + render_prompt(self.prompt.template, ex.text) + "\n"

    def _plain_context(self, ex: Example) -> str:
        """Without a chat template, the earlier turns of an example's context as the plain layout writes a turn:
        a user turn followed by a newline, an answer followed by the end token, as the training text puts them
        (the few-shot control's shots, :mod:`tuneproof.data.few_shot`; the system message is left out, like
        ``eval.prompt.system`` in this layout). Empty without context."""
        end = self.end_token or ""
        return "".join(
            t["content"] + ("\n" if t["role"] == "user" else end) for t in ex.context if t["role"] != "system"
        )

    def training_text(self, ex: Example | str, target: str) -> tuple[str, int, int]:
        """``(text, answer_start_char, answer_end_char)``; the answer span includes the end token."""
        ex = as_example(ex)
        prompt = self.prompt_text(ex)
        if self.use_chat:
            full = self._render(self._messages(ex) + [{"role": "assistant", "content": target}], False)
        else:
            full = prompt + target + (self.end_token or "")
        start = len(prompt) if full.startswith(prompt) else -1
        target = rendered_target(full, target)
        # the answer ends after the first end-of-turn token that follows the target text
        t_pos = full.find(target, max(start, 0))
        end_tok = self.end_token or ""
        e_pos = full.find(end_tok, t_pos + len(target)) if end_tok and t_pos >= 0 else -1
        end = e_pos + len(end_tok) if e_pos >= 0 else (t_pos + len(target) if t_pos >= 0 else len(full))
        return full, start, end

    # ------------------------------------------------------------------ encoding
    def encode(self, ex: Example) -> Encoded:
        """Encode one example exactly as the trainer sees it. Never raises for data faults: they are
        collected in ``Encoded.faults`` so the data check can list them all.

        The prompt and the answer are tokenised separately and concatenated, so the tokens before
        the first supervised position are exactly the inference prompt's tokens even when the
        tokenizer would merge across the boundary in one pass (docs/CASES.md C3); such a merge is recorded
        in ``notes`` with the tokens on each side.
        """
        if self.labels is not None:
            return self._encode_cls(ex)
        target = ex.target if ex.target is not None else ""
        try:
            prompt = self.prompt_text(ex)
            full, start, end = self.training_text(ex, target)
        except TuneproofError as err:  # a template that fails on this example: named with its row
            where = f" (row {ex.source})" if getattr(ex, "source", None) else ""
            raise TuneproofError(f"example {ex.id}{where}: {err.message}", hint=err.hint) from None
        target = rendered_target(full, target)  # a template that trims the answer (Llama-3, Gemma) trains it trimmed
        faults: list[str] = []
        if ex.context and not self.use_chat:
            faults.append(
                "a chat example (earlier turns or its own system message) but the tokenizer has no chat template: "
                "its context would not be in the prompt; use a base with a chat template"
            )
        notes: list[str] = []
        prefix_diff = None
        user_text = ex.text.strip()
        answer_missing = bool(target) and target not in full
        if not prompt.strip():
            faults.append(
                "the inference prompt is empty (the chat template renders nothing for the system and user messages "
                "with add_generation_prompt=True): the model would be asked nothing at inference, and the prompt "
                "tokens of the training text are supervised"
            )
        elif user_text and user_text not in prompt:
            faults.append(
                "the inference prompt does not contain the example's input text (the chat template drops the user's "
                "content when add_generation_prompt=True): the model would be asked without its input"
            )
        faults += self._text_faults(ex, target, prompt)
        if answer_missing:
            faults.append(
                "the training text does not contain the answer (the chat template drops the assistant's content): "
                "nothing of the target would be supervised"
            )
        elif start < 0:
            t_pos = full.find(target) if target else -1
            prefix = full[:t_pos] if t_pos >= 0 else full[: len(prompt)]
            first, marked = char_diff(prompt, prefix)
            prefix_diff = {"prompt": prompt, "training_prefix": prefix, "first_difference": first, "diff": marked}
            opened = self.chat.opened_think(prompt)
            if opened is not None and opened not in prefix:
                switch = self.chat.switch()
                faults.append(
                    f"the generation prompt opens a think block ('{visible(opened)}') that the training render does "
                    "not close: the model would be trained to answer where it is given an open think block; either "
                    "keep the reasoning in the target (targets written as 'reasoning</think>answer', with a "
                    f"{TEMPLATE_KEY} that keeps them), or switch the block off: "
                    + (switch or f"{TEMPLATE_KEY}: a template whose generation prompt does not open it")
                )
            else:
                faults.append(
                    "the training text does not start with the inference prompt (the chat template changes the "
                    f"prompt when an answer follows; first difference at character {first}); the model would be "
                    "trained on a prefix it never sees at inference"
                )
            start = len(prompt)
            full = prompt + target + (self.end_token or "")
            end = len(full)
        if target and not answer_missing and full.find(target, start) < 0:
            faults.append("answer boundary not found: the target text does not appear after the prompt")
        # supervised text before the answer that the inference prompt does not end with (docs/CASES.md C3 kind)
        t_at = full.find(target, start) if target else -1
        before = full[start:t_at] if t_at >= 0 else ""
        # the whole user message, at least 4 characters long: a short input can be a piece of a role header
        user_msg = render_prompt(self.prompt.template, ex.text).strip()
        # a template that ignores add_generation_prompt: the inference prompt lacks the assistant's role header,
        # which the training text puts before the answer (so the answer is supervised after a header the model
        # never sees when it answers, and generates that header first at inference)
        no_generation_prompt = (
            self.use_chat and prompt.strip() and before.strip() and self._render(self._messages(ex), False) == prompt
        )
        if no_generation_prompt:
            faults.append(
                f"{NO_GENERATION_PROMPT} (the prompt with add_generation_prompt=True equals the prompt without "
                f"it): the inference prompt ends without the assistant's role header '{visible(before)}' that the "
                "training text puts before the answer, so the model is trained to write that header first and "
                f"the evaluation reads it as part of the answer; set {TEMPLATE_KEY} to a template that renders the "
                "generation prompt when add_generation_prompt is true"
            )
        elif self.loss == "answer_only" and len(user_msg) >= 4 and prompt.strip() and user_msg in before:
            faults.append(
                "prompt tokens are supervised: the supervised span before the answer holds the example's input "
                f"text ('{visible(before[:60])}'...); the inference prompt is not where the template puts the answer"
            )
        elif before.strip() and prompt.strip():
            notes.append(
                f"the model is also trained to generate '{visible(before)}' before the answer "
                "(the chat template adds it when an answer follows, the inference prompt does not end with it)"
            )
        # text after the answer's end token is never generated at inference: the sequence ends there
        full = full[:end]
        p_enc = self.tok(prompt, add_special_tokens=False, return_offsets_mapping=True)
        p_ids = list(p_enc["input_ids"])
        a_enc = self.tok(full[start:], add_special_tokens=False, return_offsets_mapping=True)
        a_ids = list(a_enc["input_ids"])
        a_off = [(a + start, b + start) for a, b in a_enc["offset_mapping"]]
        # what a model that emits exactly the supervised tokens generates, read back as the evaluation reads it
        emitted = [tid for tid, (a, b) in zip(a_ids, a_off) if a >= start and b <= end and b > a]
        before_tokens = sum(1 for a, b in a_off if a >= start and b <= t_at and b > a) if t_at >= 0 else 0
        gold_raw, gold = split_generation(self.tok, emitted, self.stop_ids, self.answer_from, self._specials)
        if self.loss == "answer_only":
            a_labels = [
                tid if (a >= start and b <= end and b > a) else IGNORE_INDEX for tid, (a, b) in zip(a_ids, a_off)
            ]
            labels = [IGNORE_INDEX] * len(p_ids) + a_labels
        else:
            labels = p_ids + a_ids
        context_sup = 0
        if self.train_on == "all_assistant" and ex.context and self.use_chat and self.loss == "answer_only":
            context_sup = self._supervise_context(ex, prompt, p_ids, p_enc["offset_mapping"], labels, faults)
        joint = self.tok(full, add_special_tokens=False, return_offsets_mapping=True)
        if list(joint["input_ids"][: len(p_ids)]) != p_ids:
            k = next((i for i, (a, b) in enumerate(joint["offset_mapping"]) if a < start < b), None)
            if k is not None:
                a, b = joint["offset_mapping"][k]
                notes.append(
                    f"in one pass the tokenizer merges across the answer boundary ({full[a:b]!r}); prompt and answer "
                    f"are tokenised separately: ... {full[max(0, start - 12) : start]!r} | "
                    f"{full[start : start + 12]!r} ..."
                )
        ids = p_ids + a_ids
        offsets = [tuple(o) for o in p_enc["offset_mapping"]] + a_off
        prompt_tokens = len(p_ids)
        answer_tokens = (
            sum(1 for lab in labels if lab != IGNORE_INDEX) - context_sup if self.loss == "answer_only" else len(a_ids)
        )
        full_len = len(ids)
        truncated = full_len > self.max_length
        # tokens of the answer (incl. its end token, the last one) that truncation removes; supervised tokens of
        # earlier turns (data.chat.train_on: all_assistant) sit in the prompt's positions and are counted apart
        answer_lost = (
            sum(1 for lab in labels[max(self.max_length, prompt_tokens) :] if lab != IGNORE_INDEX)
            if self.loss == "answer_only"
            else max(0, full_len - max(self.max_length, prompt_tokens))
        )
        context_lost = sum(1 for lab in labels[self.max_length : prompt_tokens] if lab != IGNORE_INDEX)
        end_cut = answer_lost > 0
        ids, labels, offsets = ids[: self.max_length], labels[: self.max_length], offsets[: self.max_length]
        # position 0 is never a prediction target (nothing precedes it), see loss.token_loss_sum
        n_sup = sum(1 for lab in labels[1:] if lab != IGNORE_INDEX)
        if answer_missing or not prompt.strip():
            pass  # the cause is named above; the counts below would only repeat it
        elif n_sup == 0 and not truncated:
            faults.append(
                f"0 supervised tokens although nothing was truncated (prompt {prompt_tokens} + answer "
                f"{answer_tokens} tokens <= max_length {self.max_length}): the training text ends where the "
                "inference prompt ends"
            )
        elif n_sup == 0:
            faults.append(
                f"0 supervised tokens after truncation (prompt {prompt_tokens} + answer "
                f"{answer_tokens} tokens > max_length {self.max_length}): raise training.max_length to at least "
                f"{prompt_tokens + answer_tokens}" + (", or keep fewer earlier turns in the row" if ex.context else "")
            )
        elif end_cut and self.end_token is not None:
            faults.append(
                f"the answer is cut by max_length {self.max_length}: "
                f"{answer_lost} of {answer_tokens} answer tokens lost, "
                f"the end token {self.end_token!r} among them (the model would never learn to stop)"
                + (f"; and {context_lost} supervised tokens of earlier assistant turns" if context_lost else "")
            )
        elif not truncated and self.end_token is not None:
            end_id = self.tok.convert_tokens_to_ids(self.end_token)
            sup = [lab for lab in labels if lab != IGNORE_INDEX]
            if sup and sup[-1] != end_id:
                faults.append(
                    f"the end token {self.end_token!r} ({self.chat.end_of_turn_from}) is not supervised (the model "
                    "would never learn to stop): set model.end_of_turn to the one token the chat template puts after "
                    f"an assistant's answer, or {TEMPLATE_KEY} to a template that puts one there (such as "
                    "{{ eos_token }})"
                )
        roundtrip = True
        if not faults and target and gold != target.strip():
            alone = self.tok.decode(self.tok(target, add_special_tokens=False)["input_ids"], skip_special_tokens=True)
            roundtrip = alone.strip() == target.strip()
        if not roundtrip:  # the tokenizer itself does not give the text back: a warning of the data check
            notes.append(
                f"the tokenizer decodes the reference as '{visible(gold[:80])}', not "
                f"'{visible(target.strip()[:80])}': a model that learned exactly its training tokens would answer so"
            )
        elif not faults and target and gold != target.strip():
            miss = regex_miss(gold_raw, self.answer_from) if not gold else None
            faults.append(
                f"the supervised answer, decoded and parsed as the evaluation does (eval.answer_from: "
                f"{self.answer_from}{': ' + miss if miss else ''}), gives '{visible(gold[:80])}', not the reference "
                f"'{visible(target.strip()[:80])}': "
                "a model that learned exactly its training tokens would be scored wrong"
            )
        if (
            self.loss == "answer_only"
            and not context_sup
            and any(lab != IGNORE_INDEX for lab in labels[:prompt_tokens])
        ):
            faults.append("prompt tokens are supervised although training.loss is answer_only")
        return Encoded(
            id=ex.id,
            category=ex.label,
            input_ids=ids,
            labels=labels,
            prompt_tokens=prompt_tokens,
            answer_tokens=answer_tokens,
            full_length=full_len,
            n_supervised=n_sup,
            truncated=truncated,
            text=full,
            boundary_char=start,
            offsets=offsets,
            faults=faults,
            notes=notes,
            answer_lost=answer_lost,
            end_cut=end_cut,
            prefix_diff=prefix_diff,
            context_supervised=context_sup,
            before_answer=before if before.strip() else "",
            before_tokens=before_tokens if before.strip() else 0,
            gold_answer=gold if target else None,
            gold_roundtrip=roundtrip,
        )

    def _text_faults(self, ex: Example, target: str, prompt: str) -> list[str]:
        """Faults of the texts themselves, before any token is counted: a special token's text inside a target or
        an input (the tokenizer turns it into that token: an end of turn inside an answer is learned as the place
        to stop), a system message the rendered prompt does not hold, text injected by the template that changes
        between two renders of the same example (today's date)."""
        faults = []
        where = f" (row {ex.source})" if getattr(ex, "source", None) else ""
        messages = self._messages(ex)
        # what an end of turn inside the text does, per place: in the target the answer ends there (the model
        # learns to stop early); in the input or a context turn the prompt's turn is cut short there
        earlier = [
            (
                f"{m.get('role')} turn of its context",
                str(m.get("content") or ""),
                f", so that {m.get('role')} turn is cut short there: the model sees a turn boundary inside "
                f"the {m.get('role')}'s text, in training and at inference",
            )
            for m in messages[:-1]
        ]
        places = (
            ("target", target, ", so the answer ends there and the model learns to stop early"),
            (
                "input",
                ex.text,
                ", so the prompt's user turn is cut short there: the model sees a turn boundary inside the user's "
                "text, in training and at inference",
            ),
            *earlier,
        )
        for what, text, eot_effect in places:
            inside = [t for t in self._specials if t and text and t in text]
            if inside:
                eot = self.end_token in inside
                faults.append(
                    f"the {what} holds the text of the special token {inside[0]!r}"
                    + (" (the end of turn)" if eot else "")
                    + f"{where}: the tokenizer turns it into that token"
                    + (eot_effect if eot else "")
                    + "; remove or escape it in the data"
                )
        if not self.use_chat:
            return faults
        for what, text, way in rendered_marks(messages):
            if text.strip() not in prompt:
                faults.append(
                    f"the {what} '{visible(text.strip()[:60])}'{where} does not appear in the rendered prompt (the "
                    f"chat template drops it): it would never be seen in training or inference; set {TEMPLATE_KEY} to "
                    f"a template that renders it, or {way}"
                )
        injected = self.chat.injected(messages)
        if injected is not None:
            faults.append(
                f"the chat template injects text that changes between two renders of this example "
                f"('{visible(injected['first'])}' vs '{visible(injected['second'])}', e.g. today's date): an "
                f"evaluation on another day would see another prompt than training; pin it: {self.chat.date_pin()}"
            )
        return faults

    def template_report(self, encoded: list[Encoded]) -> dict[str, list[str]]:
        """The data check's ``{"lines", "warnings"}`` on the chat template: which template, end of turn and
        system role; text supervised before the answer with its token count and the key that removes it; the
        gold chain (each reference given back by decode + parse of its supervised span; references the
        tokenizer itself does not decode back are a warning). Causal LM only (empty lists otherwise)."""
        if self.labels is not None:
            return {"lines": [], "warnings": []}
        rec = self.chat.record()
        lines = [
            (
                f"chat template: {TEMPLATE_KEY} (sha256 {rec['sha256'][:12]})"
                if rec["override"]
                else (
                    f"chat template: the tokenizer's (sha256 {rec['sha256'][:12]})"
                    if self.use_chat
                    else "chat template: none (the prompt is the user message and a newline)"
                )
            )
            + (f", {KWARGS_KEY} {rec['kwargs']}" if rec["kwargs"] else "")
            + f"; end of turn {self.end_token!r} ({self.chat.end_of_turn_from})"
            + {
                "native": "; system role: rendered",
                "folded": f"; system role: {self.chat.system_why}, so the system text is folded into the first "
                "user turn (system, blank line, user), as the family's own templates do",
                "dropped": "; system role: the template drops system messages",
                None: "",
            }[self.chat.system_role]
        ]
        no_gen = [e for e in encoded if any(f.startswith(NO_GENERATION_PROMPT) for f in e.faults)]
        if no_gen:  # the text before the answer is the missing generation prompt: no switch removes it
            lines.append(
                f"supervised before the answer in {len(no_gen)} of {len(encoded)} examples: "
                f"'{visible(no_gen[0].before_answer)}' ({no_gen[0].before_tokens} tokens), the role header the "
                "inference prompt lacks: the chat template renders no generation prompt (see faults)"
            )
        lacking = {id(e) for e in no_gen}
        before = [e for e in encoded if e.before_answer and id(e) not in lacking]
        if before:
            text = max((e.before_answer for e in before), key=lambda t: sum(b.before_answer == t for b in before))
            n_tok = next(e.before_tokens for e in before if e.before_answer == text)
            switch = self.chat.switch()
            lines.append(
                f"supervised before the answer in {len(before)} of {len(encoded)} examples: '{visible(text)}' "
                f"({n_tok} tokens); "
                + (
                    f"{switch} removes it"
                    if switch
                    else "the template offers no switch; eval.answer_from reads the answer after it"
                )
            )
        judged = [e for e in encoded if e.gold_answer is not None]
        wrong = [e for e in encoded if id(e) in lacking or any("parsed as the evaluation does" in f for f in e.faults)]
        lossy = [e for e in encoded if not e.gold_roundtrip]
        warnings = []
        if judged:
            lines.append(
                f"gold chain (eval.answer_from {self.answer_from}): the supervised span, decoded and parsed as the "
                f"evaluation does, gives back {len(judged) - len(wrong) - len(lossy)} of {len(judged)} references "
                "exactly"
                + (f"; {len(wrong)} lost by the template or the parsing, first {wrong[0].id}" if wrong else "")
                + (f"; {len(lossy)} not decoded back by the tokenizer itself, first {lossy[0].id}" if lossy else "")
            )
        if lossy:
            warnings.append(
                f"the tokenizer does not decode {len(lossy)} of {len(judged)} references back to their text (first "
                f"{lossy[0].id}: '{visible((lossy[0].gold_answer or '')[:60])}'): a model that learned them exactly "
                "would be scored on that text"
            )
        return {"lines": lines, "warnings": warnings}

    def _supervise_context(self, ex: Example, prompt: str, p_ids: list[int], p_off, labels: list[int], faults) -> int:
        """``data.chat.train_on: all_assistant``: label the prompt tokens of each earlier assistant
        turn (content and end token, :func:`tuneproof.data.chat.context_answer_spans`) in ``labels``
        (in place); the per-turn faults (prefix check, end token) go to ``faults``. Returns the
        tokens labelled."""
        spans, turn_faults = context_answer_spans(
            lambda msgs: self._render(msgs, True), self._messages(ex), prompt, self.end_token
        )
        faults += turn_faults
        end_id = self.tok.convert_tokens_to_ids(self.end_token) if self.end_token else None
        n = 0
        for k, (_, s, e) in enumerate(spans):
            inside = [i for i, (a, b) in enumerate(p_off) if b > a and s <= a and b <= e]
            for i in inside:
                labels[i] = p_ids[i]
            n += len(inside)
            if end_id is not None and (not inside or p_ids[inside[-1]] != end_id):
                faults.append(
                    f"assistant turn {k + 1} (train_on all_assistant): the end token {self.end_token!r} is not "
                    "supervised after it (the model would not learn to stop there)"
                )
        return n

    def _encode_cls(self, ex: Example) -> Encoded:
        enc = self.tok(ex.text, truncation=False, return_offsets_mapping=True)
        ids = list(enc["input_ids"])
        faults = []
        if ex.label not in self.labels:
            faults.append(f"label {ex.label!r} is not one of the {len(self.labels)} classes")
        full_len = len(ids)
        truncated = full_len > self.max_length
        if truncated:  # keep the end token the tokenizer adds ([SEP]), as its own truncation at evaluation does
            end = ids[-1:] if ids[-1] in set(self.tok.all_special_ids) else []
            ids = ids[: self.max_length - len(end)] + end
        return Encoded(
            id=ex.id,
            category=ex.label,
            input_ids=ids,
            labels=[],
            prompt_tokens=full_len,
            answer_tokens=0,
            full_length=full_len,
            n_supervised=1,
            truncated=truncated,
            text=ex.text,
            boundary_char=0,
            offsets=[tuple(o) for o in enc["offset_mapping"]][: len(ids)],
            class_index=self.labels.index(ex.label) if ex.label in self.labels else None,
            faults=faults,
        )

    def encode_all(self, examples: list[Example]) -> list[Encoded]:
        return [self.encode(ex) for ex in examples]


def raise_on_faults(encoded: list[Encoded], what: str = "train") -> None:
    """Stop before any compute when an example has a hard fault (names up to 5 ids).

    Raises:
        CheckFailed: at least one example has a fault.
    """
    bad = [e for e in encoded if e.faults]
    if not bad:
        return
    lines = [f"{len(bad)} of {len(encoded)} {what} examples have hard faults:"]
    for e in bad[:5]:
        lines.append(f"  {e.id} (prompt {e.prompt_tokens}, answer {e.answer_tokens} tokens): {e.faults[0]}")
    raise CheckFailed("\n".join(lines), hint="see `tuneproof data check`; raise training.max_length or fix the data")


def collate(batch: list[Encoded], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded batch for training.

    Returns ``input_ids [B, T]``, ``attention_mask [B, T]`` and ``labels`` (``[B, T]`` with -100
    on padding *positions*, or ``[B]`` class indices for sequence classification). Padding is
    masked by position, so an end token equal to the pad token stays supervised (docs/CASES.md C2).
    """
    import torch  # noqa: PLC0415  (torch only once a batch is built: importing the study context stays light)

    if hasattr(batch[0], "pixel_values"):  # image classification: see tuneproof.data.image_pipeline
        return collate_images(batch)
    width = max(len(e.input_ids) for e in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    cls = batch[0].class_index is not None or not batch[0].labels
    labels = torch.full((len(batch), width), IGNORE_INDEX, dtype=torch.long)
    for i, e in enumerate(batch):
        n = len(e.input_ids)
        ids[i, :n] = torch.tensor(e.input_ids)
        mask[i, :n] = 1
        if not cls:
            labels[i, :n] = torch.tensor(e.labels)
    if cls:
        return {
            "input_ids": ids,
            "attention_mask": mask,
            "labels": torch.tensor([e.class_index for e in batch], dtype=torch.long),
        }
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def pack_rows(lengths: list[int], capacity: int) -> list[list[int]]:
    """Rows of a padding-free packed micro-batch: first-fit decreasing of the examples (positions
    in ``lengths``) into rows of at most ``max(capacity, max(lengths))`` tokens. Deterministic
    (ties keep the micro-batch order); each row lists its examples in micro-batch order.

    Source: first-fit decreasing bin packing (Johnson 1973), as in the packing of Krell et al.,
    "Efficient Sequence Packing without Cross-contamination" (2021).
    """
    cap = max([capacity, *lengths])
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for r, free in enumerate(room):
            if lengths[i] <= free:
                rows[r].append(i)
                room[r] -= lengths[i]
                break
        else:
            rows.append([i])
            room.append(cap - lengths[i])
    return [sorted(r) for r in rows]


def collate_packed(batch: list[Encoded], pad_id: int, capacity: int) -> dict[str, torch.Tensor]:
    """Padding-free packed micro-batch of a causal LM (``training.packing``,
    tests/training/test_length_grouping_packing.py): the examples of ``batch`` laid end to end in rows of at most
    ``capacity`` tokens (:func:`pack_rows`), rows right-padded to the longest row.

    Returns ``input_ids``, ``labels``, ``position_ids`` and ``attention_mask`` (1 on real tokens;
    for counting, not given to the model), all ``[R, W]``. Position ids restart at 0 for every
    example and for the padding run at the end of a row, so the model's own mask builder
    (transformers ``masking_utils.find_packed_sequence_indices``: a position that is not the
    previous one + 1 starts a new sequence) lets no token attend across examples when the model
    is called with ``position_ids``, ``attention_mask=None`` and no cache. The label at the first
    token of each example is -100: after the causal shift it would be predicted from the previous
    example's last token (unpacked, that position is never supervised), so the supervised tokens
    and the per-token losses equal those of :func:`collate`.

    Raises:
        ValueError: a classification batch (labels per example, not per token).
    """
    import torch  # noqa: PLC0415 - torch loads only when collate_packed() runs

    if batch[0].class_index is not None or not batch[0].labels:
        raise ValueError("packing applies to causal LMs (token labels), not to sequence classification")
    rows = pack_rows([len(e.input_ids) for e in batch], capacity)
    width = max(sum(len(batch[i].input_ids) for i in r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    pos = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for r, members in enumerate(rows):
        at = 0
        for i in members:
            e = batch[i]
            n = len(e.input_ids)
            ids[r, at : at + n] = torch.tensor(e.input_ids)
            labels[r, at : at + n] = torch.tensor(e.labels)
            labels[r, at] = IGNORE_INDEX
            pos[r, at : at + n] = torch.arange(n)
            mask[r, at : at + n] = 1
            at += n
        pos[r, at:] = torch.arange(width - at)  # the padding run: a sequence of its own, unsupervised
    return {"input_ids": ids, "attention_mask": mask, "labels": labels, "position_ids": pos}


def packed_padding(lengths: list[int], capacity: int) -> tuple[int, int]:
    """``(padded positions, all positions)`` of :func:`collate_packed` on examples of these lengths."""
    rows = pack_rows(lengths, capacity)
    width = max(sum(lengths[i] for i in r) for r in rows)
    return len(rows) * width - sum(lengths), len(rows) * width
