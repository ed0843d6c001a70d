"""The chat template as the model family writes it: one place that renders every message list
(training text, inference prompt, data check, ``data inspect``, baseline, eval) and one place that
reads an answer back out of a generation.

Rendering: the tokenizer's Jinja template (or ``model.chat_template``, a file or the text itself)
compiled by transformers' sandboxed environment (``ImmutableSandboxedEnvironment``, the one
``apply_chat_template`` uses; never remote code), given the tokenizer's special tokens and
``model.chat_template_kwargs`` at every render. A ``strftime_now`` entry of the kwargs holding a
date (``'2026-01-31'``) replaces the template's clock, so a template that writes today's date into
every prompt (Llama-3.2, gpt-oss, SmolLM3) renders the same text on every day. Any error the template
raises (``raise_exception``, a syntax error, an undefined call) becomes one
:class:`~tuneproof.errors.TuneproofError` naming the template and the key to set, never a traceback.

System role (probed once, :attr:`ChatTemplate.system_role`): ``native`` (the template renders a
system message in the inference prompt and in the training text), ``folded`` (the template refuses
one, as Gemma-2's does, or renders it in only one of the two, as Mistral v0.3's does, only with the
last user turn: the system text goes at the head of the first user turn followed by a blank line, the
way Gemma-3's and Mistral's own templates place it), ``dropped`` (the template renders without error
but the text is not in the output: a data-check fault naming the message).

End of turn (``model.end_of_turn``, default ``auto``): the first special token the template puts
after an assistant's content (``<|im_end|>``, ``<|eot_id|>``, ``<end_of_turn>``, ``<|end|>``,
``<|return|>``), else eos. It is the one token supervised at the end of every answer and, with eos,
the generation's stop tokens.

Answers (``eval.answer_from``, :func:`parse_answer`): ``auto`` takes the text after a closed think
block (``</think>``) or inside the final channel of the harmony format (``<|channel|>final<|message|>``),
else the whole generation; ``raw`` the whole generation; any other value is a regular expression
searched in the generation with its special tokens kept. The generation is cut at the first stop
token and decoded with its special tokens kept (channel markers are special tokens), so
:func:`split_generation` is what evaluation and the data check's gold chain both call.
"""

from __future__ import annotations

import difflib
import hashlib
import re
import signal
import threading
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from tuneproof import patterns
from tuneproof.errors import TuneproofError
from tuneproof.study import RENDER_ARGUMENTS

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
#: the harmony (gpt-oss) final channel: the answer follows it, up to the end of the message
FINAL_CHANNEL = "<|channel|>final<|message|>"
#: two clocks the data check renders the same example under: any difference is injected text
PROBE_CLOCKS = (datetime(2001, 2, 3, 4, 5, 6), datetime(2019, 11, 28, 21, 30, 45))
_SYS, _USR, _ANS = "\u2039tp-system\u203a", "\u2039tp-user\u203a", "\u2039tp-answer\u203a"
KWARGS_KEY = "model.chat_template_kwargs"
TEMPLATE_KEY = "model.chat_template"
EOT_KEY = "model.end_of_turn"


def _clock(when: datetime):
    def strftime_now(fmt: str) -> str:
        return when.strftime(fmt)

    return strftime_now


def template_file(value: str | None) -> str | None:
    """The file ``model.chat_template`` names (as written), or None for Jinja text or no value
    (the rule of :func:`load_template_text`)."""
    return None if value is None or "{%" in value or "{{" in value else value


def load_template_text(value: str | None, study_dir: str | Path | None = None) -> str | None:
    """``model.chat_template`` as Jinja text: the value itself when it holds ``{%`` or ``{{``, else the
    file it names (relative to ``study_dir``), read as UTF-8.

    Raises:
        TuneproofError: the file does not exist or cannot be read (names the key and the path).
    """
    if template_file(value) is None:
        return value
    path = Path(value)
    if not path.is_absolute() and study_dir is not None:
        path = Path(study_dir) / path
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise TuneproofError(
            f"{TEMPLATE_KEY}: cannot read the template file {path} ({type(err).__name__}: {err})",
            hint="give a path relative to the study folder, or the Jinja text itself",
        ) from None


class ChatTemplate:
    """A tokenizer's chat template with the study's settings.

    Args:
        tokenizer: a Hugging Face tokenizer.
        template: Jinja text overriding ``tokenizer.chat_template`` (``model.chat_template`` already read,
            :func:`load_template_text`); None: the tokenizer's.
        kwargs: ``model.chat_template_kwargs``.
        end_of_turn: ``model.end_of_turn`` (``auto`` or a token of the vocabulary).
        plain: render no template at all (a sequence classifier's text is tokenised alone).

    Attributes:
        text: the template rendered (None: the tokenizer has none; prompts are the plain user message).
        system_role: ``native``, ``folded`` or ``dropped`` (see the module docstring); None without a template.
        end_of_turn, end_of_turn_id: the token that ends an answer; ``end_of_turn_from`` says how it was chosen.
        stop_ids: the generation's stop token ids (end of turn, then eos when different).

    Raises:
        TuneproofError: the template does not compile (its file and line named) or fails on a plain user turn,
            ``model.chat_template_kwargs`` sets a variable every render gives (:data:`RENDER_ARGUMENTS`), or
            ``model.end_of_turn`` is not one token of the vocabulary.
    """

    def __init__(
        self,
        tokenizer,
        template: str | None = None,
        kwargs: dict[str, Any] | None = None,
        end_of_turn="auto",
        *,
        plain: bool = False,
        source: str | None = None,
    ):
        self.tok = tokenizer
        self.source = source  # the file model.chat_template names (None: inline text or the tokenizer's)
        self.text = template if template is not None else getattr(tokenizer, "chat_template", None) or None
        if plain:  # a sequence classifier: its text is tokenised alone, no template is rendered
            self.text = None
        self.overridden = template is not None
        self.kwargs = dict(kwargs or {})
        taken = sorted(set(self.kwargs) & RENDER_ARGUMENTS)
        if taken:
            raise TuneproofError(
                f"{KWARGS_KEY}.{taken[0]}: tuneproof gives the template '{taken[0]}' itself at every render "
                f"({', '.join(sorted(RENDER_ARGUMENTS))}); it cannot be set here",
                hint=f"remove it from {KWARGS_KEY}; give only the template's own variables (enable_thinking, ...)",
            )
        pinned = self.kwargs.pop("strftime_now", None)
        self.pinned_date = pinned
        self._pinned_clock = None
        if pinned is not None:
            try:
                self._pinned_clock = _clock(datetime.fromisoformat(str(pinned)))
            except ValueError:
                raise TuneproofError(
                    f"{KWARGS_KEY}.strftime_now: {pinned!r} is not a date (YYYY-MM-DD)",
                    hint="pin the template's clock with a date such as '2026-01-31'",
                ) from None
        self._compiled = None
        self.system_role: str | None = None
        self.system_why = ""  # why a system message is folded
        if self.text is not None:
            self._compile()
            self.system_role = self._probe_system()
        self.end_of_turn_setting = end_of_turn
        self.end_of_turn, self.end_of_turn_from = self._end_of_turn(end_of_turn)
        self.end_of_turn_id = None if self.end_of_turn is None else tokenizer.convert_tokens_to_ids(self.end_of_turn)
        eos = tokenizer.eos_token_id
        self.stop_ids = [i for i in dict.fromkeys([self.end_of_turn_id, eos]) if i is not None]

    # ------------------------------------------------------------------ rendering
    @property
    def where(self) -> str:
        if self.source:
            return f"{TEMPLATE_KEY} {self.source}"
        return TEMPLATE_KEY if self.overridden else "the tokenizer's chat template"

    def _compile(self) -> None:
        import jinja2  # noqa: PLC0415  (jinja only where a template is rendered)
        from transformers.utils.chat_template_utils import _compile_jinja_template  # noqa: PLC0415 - transformers loads at the first render

        try:
            self._compiled = _compile_jinja_template(self.text)
        except jinja2.TemplateError as err:
            line = getattr(err, "lineno", None)
            raise TuneproofError(
                f"{self.where}{f' line {line}' if line else ''} does not compile: {type(err).__name__}: {err}",
                hint=f"fix the template, or set {TEMPLATE_KEY} to a file holding a valid one",
            ) from None

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool, clock=None) -> str:
        from transformers.utils.chat_template_utils import _plain_template_data  # noqa: PLC0415 - transformers loads at the first render

        special = {k: v for k, v in self.tok.special_tokens_map.items() if isinstance(v, str)}
        clock = clock or self._pinned_clock
        extra = {"strftime_now": clock} if clock is not None else {}
        chunks = self._compiled.generate(
            messages=_plain_template_data(messages),
            tools=None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **_plain_template_data({**special, **self.kwargs}),
            **extra,
        )
        return _bounded(chunks, self.where)

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool, *, clock=None) -> str:
        """The template applied to ``messages`` (``[{"role", "content"}]``), system folded where the
        template has no system role; ``clock`` replaces ``strftime_now`` (a function of a format).

        Raises:
            TuneproofError: the template raised (``raise_exception``, an undefined call, a type error):
                one line naming the template and the keys that change it.
        """
        import jinja2  # noqa: PLC0415 - jinja2 (a transformers dependency) loads at the first render

        msgs = fold_system(messages) if self.system_role == "folded" else messages
        try:
            return self._render(msgs, add_generation_prompt, clock)
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError, IndexError) as err:
            roles = "/".join(m.get("role", "?") for m in msgs)
            raise TuneproofError(
                f"{self.where} fails on the messages {roles} (add_generation_prompt={add_generation_prompt}): "
                f"{type(err).__name__}: {err}",
                hint=f"set {KWARGS_KEY} to the variables it needs, or {TEMPLATE_KEY} to a template that renders "
                "these roles, or leave out of the data the turns it refuses (a tool turn is prompt context only)",
            ) from None

    def _probe_system(self) -> str:
        import jinja2  # noqa: PLC0415 - jinja2 (a transformers dependency) loads at the first render

        user = [{"role": "system", "content": _SYS}, {"role": "user", "content": _USR}]
        try:
            prompt = self._render(user, True)
            train = self._render([*user, {"role": "assistant", "content": _ANS}], False)
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError, IndexError):
            self.render(user[1:], True)  # a template that fails on a user turn alone is named here
            self.system_why = "the template has no system role (it refuses a system message)"
            return "folded"
        if _SYS in prompt and _SYS in train:
            return "native"
        self.system_why = (
            "the template renders a system message in the inference prompt but not in the training text"
            if _SYS in prompt
            else "the template renders a system message in the training text but not in the inference prompt"
        )
        # rendered in one and not the other (Mistral's puts it only in the last user turn): fold it, so both
        # the inference prompt and the training text hold it at the head of the user turn
        return "folded" if _SYS in prompt or _SYS in train else "dropped"

    def _special_texts(self) -> list[str]:
        return special_texts(self.tok)

    def _end_of_turn(self, setting: str) -> tuple[str | None, str]:
        eos = self.tok.eos_token
        if setting != "auto":
            vocab = self.tok.get_vocab()
            if setting not in vocab:
                near = difflib.get_close_matches(setting, self._special_texts(), n=3, cutoff=0.5)
                raise TuneproofError(
                    f"{EOT_KEY}: {setting!r} is not a token of this tokenizer's vocabulary"
                    + (f" (special tokens like it: {', '.join(near)})" if near else ""),
                    hint=f"set {EOT_KEY} to the one token the template puts after an assistant's answer, or auto",
                )
            return setting, EOT_KEY
        if self.text is None:
            return eos, "eos (no chat template)"
        rendered = self.render([{"role": "user", "content": _USR}, {"role": "assistant", "content": _ANS}], False)
        at = rendered.find(_ANS)
        after = rendered[at + len(_ANS) :] if at >= 0 else ""
        hits = [(after.find(s), -len(s), s) for s in self._special_texts() if s in after]
        if hits:  # the first one after the answer (the longest where two start at the same place)
            return min(hits)[2], "auto: the special token the chat template puts after an assistant's content"
        return eos, "auto: eos (the chat template puts no special token after an assistant's content)"

    # ------------------------------------------------------------------ what the data check reads
    def opened_think(self, prompt: str) -> str | None:
        """The think block the generation prompt leaves open (``'<think>\\n'``), else None."""
        at = prompt.rfind(THINK_OPEN)
        if at < 0 or prompt.find(THINK_CLOSE, at) >= 0:
            return None
        return prompt[at:]

    def switch(self) -> str | None:
        """``model.chat_template_kwargs: {enable_thinking: false}`` when the template reads that variable."""
        if self.text and "enable_thinking" in self.text:
            return f"{KWARGS_KEY}: {{enable_thinking: false}}"
        return None

    def date_pin(self) -> str:
        """The key that pins an injected date in this template."""
        if self.text and "date_string" in self.text:
            return f"{KWARGS_KEY}: {{date_string: '26 Jul 2024'}} (or strftime_now: '2026-01-31')"
        return f"{KWARGS_KEY}: {{strftime_now: '2026-01-31'}} (the template's clock, pinned)"

    def injected(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> dict[str, str] | None:
        """Text that differs between two renders of the same messages under two clocks
        (:data:`PROBE_CLOCKS`) or twice in a row: ``{"first", "second"}`` (the two differing stretches,
        40 characters of context), else None."""
        if self.text is None:
            return None
        a = self.render(messages, add_generation_prompt, clock=self._pinned_clock or _clock(PROBE_CLOCKS[0]))
        b = self.render(messages, add_generation_prompt, clock=self._pinned_clock or _clock(PROBE_CLOCKS[1]))
        if a == b:
            return None
        i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        j = 0
        while j < min(len(a), len(b)) - i and a[len(a) - 1 - j] == b[len(b) - 1 - j]:
            j += 1
        return {"first": a[max(0, i - 20) : len(a) - j + 20], "second": b[max(0, i - 20) : len(b) - j + 20]}

    def record(self) -> dict[str, Any]:
        """What a run records of the template: its sha256, whether it overrides the tokenizer's, the kwargs,
        the end of turn and how it was chosen, the system role."""
        return {
            "sha256": hashlib.sha256((self.text or "").encode()).hexdigest(),
            "override": self.overridden,
            "kwargs": {**self.kwargs, **({"strftime_now": self.pinned_date} if self.pinned_date else {})},
            "end_of_turn": self.end_of_turn,
            "end_of_turn_from": self.end_of_turn_from,
            "system_role": self.system_role,
        }


def fingerprint_part(chat: ChatTemplate | None) -> dict[str, Any]:
    """The study's template settings that differ from the defaults, for the evaluation and data fingerprints:
    ``{"sha256"}`` of an overriding ``model.chat_template``, ``{"kwargs"}``, ``{"end_of_turn"}`` when not auto.
    Empty with the defaults, so fingerprints recorded before these keys existed keep their hash."""
    if chat is None:
        return {}
    rec = chat.record()
    return {
        **({"sha256": rec["sha256"]} if chat.overridden else {}),
        **({"kwargs": rec["kwargs"]} if rec["kwargs"] else {}),
        **({"end_of_turn": chat.end_of_turn_setting} if chat.end_of_turn_setting != "auto" else {}),
    }


#: a render past these bounds is a template that loops (far beyond any real conversation's prompt)
RENDER_LIMIT_S = 10.0
RENDER_LIMIT_CHARS = 16 << 20


class _RenderTimeout(Exception):
    pass


def _alarm(signum, frame):  # noqa: ARG001 - signal handler signature
    raise _RenderTimeout


def _bounded(chunks, where: str) -> str:
    """The text of a template's render (``Template.generate``'s chunks), stopped past
    :data:`RENDER_LIMIT_S` seconds or :data:`RENDER_LIMIT_CHARS` characters: a loop that writes is
    stopped at its next chunk; in the main thread a SIGALRM timer also stops a loop that writes nothing.

    Raises:
        TuneproofError: past a bound (names the template and the bound).
    """
    out: list[str] = []
    size, start, stopped = 0, time.monotonic(), False
    timer = threading.current_thread() is threading.main_thread() and signal.getitimer(signal.ITIMER_REAL)[0] == 0
    previous = signal.signal(signal.SIGALRM, _alarm) if timer else None
    try:
        try:
            if timer:
                signal.setitimer(signal.ITIMER_REAL, RENDER_LIMIT_S)
            for chunk in chunks:
                out.append(chunk)
                size += len(chunk)
                if size > RENDER_LIMIT_CHARS or time.monotonic() - start > RENDER_LIMIT_S:
                    raise _RenderTimeout
        finally:
            if timer:  # an alarm that fires before this line is caught below
                signal.setitimer(signal.ITIMER_REAL, 0)
    except _RenderTimeout:
        stopped = True
    finally:
        if timer:
            signal.signal(signal.SIGALRM, previous if previous is not None else signal.SIG_DFL)
    if stopped:
        raise TuneproofError(
            f"{where} renders more than {RENDER_LIMIT_CHARS >> 20} M characters or for more than "
            f"{RENDER_LIMIT_S:g} s for one conversation ({size:,} characters so far): a loop that does not end",
            hint=f"fix the template's loops, or set {TEMPLATE_KEY} to a file holding one that ends",
        )
    return "".join(out)


def fold_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """System messages folded into the head of the next user turn (``system + "\\n\\n" + user``), the
    way Gemma-3's and Mistral's own templates place a system prompt; a system message with no user turn
    after it becomes a user turn; an empty (or whitespace) system message is left out."""
    out: list[dict[str, Any]] = []
    pending: list[str] = []
    for m in messages:
        if m.get("role") == "system":
            if str(m.get("content") or "").strip():  # an empty system message adds nothing to the user turn
                pending.append(str(m["content"]))
            continue
        if m.get("role") == "user" and pending:
            m = {**m, "content": "\n\n".join([*pending, str(m.get("content") or "")])}
            pending = []
        out.append(m)
    if pending:
        out.append({"role": "user", "content": "\n\n".join(pending)})
    return out


# --------------------------------------------------------------------------- answers
def special_texts(tokenizer) -> list[str]:
    """The tokenizer's special tokens (added special tokens included), longest first."""
    specials = set(tokenizer.all_special_tokens)
    specials |= {str(t) for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if getattr(t, "special", 0)}
    return sorted((s for s in specials if s), key=len, reverse=True)


def _strip_specials(text: str, specials: Sequence[str]) -> str:
    for s in specials:
        text = text.replace(s, "")
    return text.strip()


def parse_answer(raw: str, plain: str, answer_from: str, specials: Sequence[str]) -> str:
    """The answer that is scored, from a generation (rules in the module docstring).

    Args:
        raw: the generation decoded with its special tokens, cut before the stop token.
        plain: the same tokens decoded without special tokens, stripped (the answer of ``raw`` mode).
        answer_from: ``eval.answer_from``.
        specials: :func:`special_texts` (removed from a parsed answer).

    Returns:
        The answer, surrounding whitespace stripped; ``""`` when ``auto`` finds a think block left open or
        the regular expression does not match.
    """
    if answer_from == "raw":
        return plain
    if answer_from == "auto":
        close = raw.rfind(THINK_CLOSE)
        if close >= 0:
            return _strip_specials(raw[close + len(THINK_CLOSE) :], specials)
        if THINK_OPEN in raw:
            return ""  # the model is still thinking: no answer yet
        final = raw.rfind(FINAL_CHANNEL)
        if final >= 0:
            body = re.split(r"<\|(?:end|return|call)\|>", raw[final + len(FINAL_CHANNEL) :], maxsplit=1)[0]
            return _strip_specials(body, specials)
        return plain
    m = patterns.search(answer_from, raw, "eval.answer_from", flags=patterns.DOTALL)
    if m is None:
        return ""
    if "answer" in m.re.groupindex:
        got = m.group("answer")
    else:
        got = m.group(1) if m.re.groups else m.group(0)
    return _strip_specials(got or "", specials)


def regex_miss(raw: str, answer_from: str) -> str | None:
    """Why the regular expression ``answer_from`` (``eval.answer_from``) reads an empty answer out of
    ``raw``: ``"it does not match"``, ``"it matches an empty text"`` or its group 1 that takes no part in
    the match; None for ``auto`` / ``raw`` or a non-empty answer."""
    if answer_from in ("auto", "raw"):
        return None
    m = patterns.search(answer_from, raw, "eval.answer_from", flags=patterns.DOTALL)
    if m is None:
        return "the expression does not match"
    name = "answer" if "answer" in m.re.groupindex else (1 if m.re.groups else 0)
    got = m.group(name)
    if got is None:
        return (
            f"its group {name!r} takes no part in the match: name the answer's group (?P<answer>...)"
            if name != 0
            else None
        )
    if not got.strip():
        what = "the whole match" if name == 0 else f"its group {name!r}"
        return f"{what} is empty (at character {m.start(name)})"
    return None


def split_generation(
    tokenizer, ids: Sequence[int], stop_ids: Sequence[int], answer_from: str, specials: Sequence[str] | None = None
) -> tuple[str, str]:
    """``(raw, answer)`` of generated token ids: cut before the first stop id, decoded with special tokens
    kept (``raw``, stripped) and parsed by :func:`parse_answer`. Padding after the stop is never read."""
    ids = [int(i) for i in ids]
    stops = set(stop_ids)
    cut = next((k for k, t in enumerate(ids) if t in stops), len(ids))
    ids = ids[:cut]
    raw = tokenizer.decode(ids, skip_special_tokens=False)
    plain = tokenizer.decode(ids, skip_special_tokens=True).strip()
    specials = special_texts(tokenizer) if specials is None else specials
    return raw.strip(), parse_answer(raw, plain, answer_from, specials)
