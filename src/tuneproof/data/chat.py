"""Chat data (``format: chat``): one conversation per row, read into one
:class:`~tuneproof.data.examples.Example`, and rendered back into the message list a chat template takes.

A row holds its turns in one of :data:`LAYOUTS` (tried in order; ``data.chat.messages`` names another key
holding a list of turns):

- ``messages`` (``[{"role": ..., "content": ...}]``: the OpenAI chat API's and Hugging Face chat templates'
  layout, TRL's conversational language-modeling rows);
- ShareGPT's ``conversations`` (``[{"from": ..., "value": ...}]``);
- TRL's prompt-completion rows: standard (``prompt`` and ``completion`` two strings: one user turn and its
  answer, as ``format: jsonl`` with ``fields: {text: prompt, target: completion}`` reads them) or
  conversational (``prompt`` a list of messages, ``completion`` a list of the one assistant message).

A row-level ``system`` string beside the turns (LLaMA-Factory's ShareGPT) is the row's system message; an empty
system message is kept as written (a template renders it unlike none). An assistant turn with OpenAI's
``weight: 0`` is context that is never trained, also under ``all_assistant``. A turn whose
``reasoning_content`` (or ``reasoning``, ``thinking``) is not empty is refused: that text would not be trained.

Role spellings (:data:`ROLE_SPELLINGS`, any case) map to ``system``, ``user``, ``assistant`` or ``tool``; a
content given as a list of parts is its text parts joined by a newline (:data:`PART_SEPARATOR`), a non-text part
(an image) refuses the row naming it. Tool turns (a tool's result; an assistant's ``tool_calls`` or ShareGPT's
``function_call``) are prompt context: the data check refuses them when the chat template drops them. The example:

- ``target``: the final assistant turn (what evaluation judges);
- ``text``: the user turn just before it (``eval.prompt.template`` is applied to it);
- ``context``: the row's own system message, when it has one (it replaces ``eval.prompt.system``
  for that row), then every earlier user, assistant and tool turn, in order: prompt context.

``data.chat.train_on``: ``last`` supervises the final assistant turn only; ``all_assistant`` also
supervises every earlier assistant turn, each with its end-of-turn token, at the place it has in
the rendered conversation (:func:`context_answer_spans`); evaluation still judges the final turn.

A row is refused (all refused rows of a file named in one error, :class:`~tuneproof.data.rows.BadRows`)
when its turns are missing or not a list, a turn is not an object or lacks its role or content, a
role is unknown, a content is empty or holds a non-text part, a system message is not the first turn, the
last turn is not an assistant's answer (a tool call is not one), or the turn before it is not a user's; a
preference row (``chosen``/``rejected``) or a prompt-only row is refused with the way on.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tuneproof.data.examples import Example
from tuneproof.errors import TuneproofError
from tuneproof.study import render_prompt
from tuneproof.ui import visible_text

#: the roles a parsed turn has (``tool``: a tool's result, kept as prompt context)
ROLES = ("system", "user", "assistant", "tool")
#: role spellings found in chat data and the role each means, matched case-insensitively in both layouts: the
#: chat roles; the chat API's ``developer`` (its newer name for the system message); ShareGPT's
#: ``human``/``gpt``/``observation`` (LLaMA-Factory's ShareGPT adds ``function_call``, an
#: assistant's tool call, and ``observation``, the tool's result); Gemma's ``model``; ``bot``; OpenAI's older
#: ``function``; Llama-3.1's ``ipython`` (a tool's output)
ROLE_SPELLINGS = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "model": "assistant",
    "bot": "assistant",
    "function_call": "assistant",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
    "ipython": "tool",
}
#: spellings whose content is an assistant's tool call (``{"name", "arguments"}`` as JSON text), read into the
#: message's ``tool_calls`` the way Hugging Face chat templates take it
TOOL_CALL_SPELLINGS = ("function_call",)
#: a row-level system prompt beside the turns (LLaMA-Factory's ShareGPT and Alpaca layouts): the row's system message
ROW_SYSTEM_KEY = "system"
#: turn keys holding reasoning that the message list would not carry: refused when not empty (the reasoning would be
#: silently left out of training)
REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")
#: OpenAI's fine-tuning key of an assistant message: 0 = not trained (kept as prompt context only, also under
#: ``data.chat.train_on: all_assistant``); the final answer, trained and judged, cannot have 0
WEIGHT_KEY = "weight"
#: keys of a tool's result kept for the template (the tool's name; the id of the call it answers, which Mistral's
#: templates read)
TOOL_RESULT_KEYS = ("name", "tool_call_id")
#: content-part types read as text: the chat API's ``text``, the Responses API's ``input_text`` / ``output_text``
TEXT_PART_TYPES = ("text", "input_text", "output_text")
#: what joins a turn's text parts (as vLLM joins a message's text parts into one string content)
PART_SEPARATOR = "\n"
_HINT = "fix the row, or set data.chat.messages to the key holding the turns"


def _content_text(content: Any, at: str, role: str) -> str:
    """A turn's content as text: a string as is, a list of content parts (``[{"type": "text", "text": ...}]``)
    joined by :data:`PART_SEPARATOR` when every part is text.

    Raises:
        TuneproofError: a part that is not text (an image, audio, a file), named with its index and type.
    """
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        shown = "no content" if content is None else f"a {type(content).__name__} content, not text"
        raise TuneproofError(f"{at} ({role}) has {shown}", hint="every turn needs a text content")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if isinstance(part, str):
            texts.append(part)
        elif kind in TEXT_PART_TYPES and isinstance(part.get("text"), str):
            texts.append(part["text"])
        else:
            what = f"a {kind!r} part" if kind else f"a {type(part).__name__} part without a type"
            raise TuneproofError(
                f"{at}.content[{j}] ({role}) is {what}: only text parts ({', '.join(TEXT_PART_TYPES)}) are trained",
                hint="tuneproof fine-tunes on text; drop the row or its non-text parts",
            )
    return PART_SEPARATOR.join(texts)


def _tool_calls(raw: dict[str, Any], content: str, at: str, spelled: str) -> list[dict[str, Any]] | None:
    """An assistant's tool calls: the message's own ``tool_calls``, or a ``function_call`` turn's content
    (``{"name", "arguments"}`` JSON) as one call; None when the turn calls nothing.

    Raises:
        TuneproofError: a ``function_call`` content that is not such JSON, or ``tool_calls`` not a list.
    """
    if spelled in TOOL_CALL_SPELLINGS:
        try:
            call = json.loads(content)
        except json.JSONDecodeError:
            call = None
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise TuneproofError(
                f"{at} ({spelled}) is not a JSON object with the tool's name and arguments",
                hint='write the call as {"name": ..., "arguments": {...}}, or drop the row',
            )
        return [{"type": "function", "function": {"name": call["name"], "arguments": call.get("arguments", {})}}]
    calls = raw.get("tool_calls")
    if calls is None:
        return None
    if not isinstance(calls, list) or not calls:
        raise TuneproofError(f"{at}.tool_calls is not a list of calls", hint="fix the row")
    return calls


def _turn(raw: Any, at: str, max_chars: int) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise TuneproofError(f"{at} is {type(raw).__name__}, not an object with role and content", hint=_HINT)
    if "role" in raw or "content" in raw:
        role_key, content_key = "role", "content"
    elif "from" in raw or "value" in raw:
        role_key, content_key = "from", "value"
    else:
        raise TuneproofError(
            f"{at} has no role (keys: {', '.join(map(str, raw)) or 'none'}; "
            "expected role/content or ShareGPT from/value)",
            hint=_HINT,
        )
    if role_key not in raw:
        raise TuneproofError(f"{at} has no '{role_key}'", hint=_HINT)
    spelled = raw[role_key]
    key = spelled.strip().casefold() if isinstance(spelled, str) else None
    if key not in ROLE_SPELLINGS:
        raise TuneproofError(
            f"{at}: unknown role {spelled!r} (known, any case: {', '.join(ROLE_SPELLINGS)})",
            hint="rename the turn's role to one of these, or drop the row",
        )
    role = ROLE_SPELLINGS[key]
    kept_out = next((k for k in REASONING_KEYS if raw.get(k)), None)
    if kept_out:
        raise TuneproofError(
            f"{at} ({role}) has a '{kept_out}' that would be left out of training",
            hint="write the reasoning into the answer as 'reasoning</think>answer' (docs/chat-templates.md), or drop "
            f"the '{kept_out}' key",
        )
    content = raw.get(content_key)
    if role == "assistant" and content is None and raw.get("tool_calls") is not None:
        content = ""  # an assistant message that only calls tools (the chat API's content null)
    content = _content_text(content, at, role)
    calls = _tool_calls(raw, content, at, key) if role == "assistant" else None
    if key in TOOL_CALL_SPELLINGS:
        content = ""
    if not content.strip() and not calls and role != "system":  # an empty system message is kept as written
        raise TuneproofError(f"{at} ({role}) has an empty content", hint="fill or drop the row")
    weight = raw.get(WEIGHT_KEY)  # null (OpenHermes writes it on every turn) is no weight
    if role == "assistant" and weight not in (None, 0, 1):
        raise TuneproofError(f"{at}: {WEIGHT_KEY} {weight!r} is not 0 or 1", hint="fix the row")
    if len(content) > max_chars:
        raise TuneproofError(
            f"{at} ({role}) is {len(content):,} characters, over data.max_chars {max_chars:,}",
            hint="fix the row, or raise data.max_chars in tuneproof.yaml",
        )
    turn: dict[str, Any] = {"role": role, "content": content}
    if calls:
        turn["tool_calls"] = calls
    if role == "assistant" and raw.get(WEIGHT_KEY) == 0:
        turn[WEIGHT_KEY] = 0
    for extra in TOOL_RESULT_KEYS if role == "tool" else ():
        if isinstance(raw.get(extra), str):
            turn[extra] = raw[extra]
    return turn


def _list_of_turns(row: dict[str, Any], name: str, where: str) -> list[tuple[str, Any]]:
    raw = row[name]
    if isinstance(raw, str) and raw.lstrip().startswith("["):  # turns stored as JSON text (a Parquet or CSV export)
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as err:
            raise TuneproofError(f"{where}: '{name}' is text that is not a JSON list of turns ({err.msg})") from None
    if not isinstance(raw, list) or not raw:
        what = "an empty list" if isinstance(raw, list) else f"{type(raw).__name__}, not a list of turns"
        raise TuneproofError(f"{where}: '{name}' is {what}", hint=_HINT)
    return [(f"{where}: {name}[{k}]", t) for k, t in enumerate(raw)]


def _prompt_completion(row: dict[str, Any], where: str) -> list[tuple[str, Any]]:
    """TRL's prompt-completion rows: standard (two strings: one user turn, one assistant answer) or
    conversational (``prompt`` a list of messages, ``completion`` a list holding the one assistant answer)."""
    prompt, completion = row["prompt"], row["completion"]
    if isinstance(prompt, str) and isinstance(completion, str):
        return [
            (f"{where}: prompt", {"role": "user", "content": prompt}),
            (f"{where}: completion", {"role": "assistant", "content": completion}),
        ]
    if isinstance(prompt, list) and isinstance(completion, list):
        if len(completion) != 1:
            raise TuneproofError(
                f"{where}: 'completion' holds {len(completion)} messages, not the one assistant answer",
                hint="each row trains and judges one answer: move the earlier messages into 'prompt'",
            )
        return _list_of_turns(row, "prompt", where) + [(f"{where}: completion[0]", completion[0])]
    kinds = f"{type(prompt).__name__} and {type(completion).__name__}"
    raise TuneproofError(
        f"{where}: 'prompt' and 'completion' are {kinds}: both strings (standard) or both lists of messages "
        "(conversational)",
        hint="fix the row",
    )


def _refused(reason: str, hint: str) -> Callable[[dict[str, Any], str], list[tuple[str, Any]]]:
    def read(_row: dict[str, Any], where: str) -> list[tuple[str, Any]]:
        raise TuneproofError(f"{where}: {reason}", hint=hint)

    return read


@dataclass(frozen=True)
class RowLayout:
    """One layout of conversation rows: a row holding all of ``keys`` is read by ``read(row, where)`` into
    ``[(where it is, raw turn)]`` (every layout's turns then pass the same checks)."""

    name: str
    keys: tuple[str, ...]
    read: Callable[[dict[str, Any], str], list[tuple[str, Any]]]


#: the layouts ``format: chat`` reads, tried in this order (``data.chat.messages`` names another turns key)
LAYOUTS = (
    RowLayout("chat messages", ("messages",), lambda row, where: _list_of_turns(row, "messages", where)),
    RowLayout(
        "ShareGPT conversations", ("conversations",), lambda row, where: _list_of_turns(row, "conversations", where)
    ),
    RowLayout("TRL prompt-completion", ("prompt", "completion"), _prompt_completion),
)
#: layouts that hold no single answer to train, tried after :data:`LAYOUTS` in ``format: chat`` only: the row is
#: refused with the way on (a ``format: hf`` dataset with such columns is mapped by ``data.fields`` instead)
REFUSED_LAYOUTS = (
    RowLayout(
        "TRL preference",
        ("chosen", "rejected"),
        _refused(
            "a preference row (chosen and rejected answers): tuneproof fine-tunes and judges one answer per row",
            "write the chosen answer as 'completion' beside 'prompt' (TRL's prompt-completion), or as the last "
            "assistant message",
        ),
    ),
    RowLayout(
        "TRL prompt-only",
        ("prompt",),
        _refused("a prompt-only row: no answer to train or judge", "add the answer as 'completion'"),
    ),
)


def row_layout(row: Any, key: str | None = None) -> str | None:
    """The name of the layout (:data:`LAYOUTS`) a row (or the columns of a dataset) holds, else None."""
    if key:
        return key if key in row else None
    return next((lay.name for lay in LAYOUTS if all(k in row for k in lay.keys)), None)


def parse_turns(row: dict[str, Any], where: str, key: str | None, max_chars: int) -> list[dict[str, Any]]:
    """The turns of one row as ``[{"role", "content"}]`` (role spellings mapped by :data:`ROLE_SPELLINGS`, content
    parts joined; an assistant's tool calls kept under ``tool_calls``, a tool result's :data:`TOOL_RESULT_KEYS` kept).

    Args:
        row: one record (a JSON object, a Parquet or ``datasets`` row), in one of :data:`LAYOUTS`.
        where: ``file:line`` (or ``file#index``) of the row, for the error.
        key: ``data.chat.messages``; None tries :data:`LAYOUTS`.
        max_chars: ``data.max_chars``, per turn.

    Raises:
        TuneproofError: the row is refused (see the module docstring); the message starts with ``where``.
    """
    if key:
        if key not in row:
            raise TuneproofError(
                f"{where}: no {key!r} list of turns (data.chat.messages; keys: {', '.join(map(str, row))})", hint=_HINT
            )
        raw = _list_of_turns(row, key, where)
    else:
        layout = next((lay for lay in LAYOUTS + REFUSED_LAYOUTS if all(k in row for k in lay.keys)), None)
        if layout is None:
            raise TuneproofError(
                f"{where}: no 'messages' or 'conversations' list of turns, nor 'prompt' and 'completion' "
                f"(keys: {', '.join(map(str, row))})",
                hint=_HINT,
            )
        raw = layout.read(row, where)
    turns = [_turn(t, at, max_chars) for at, t in raw]
    ats = [at[len(where) + 2 :] for at, _ in raw]
    system = row.get(ROW_SYSTEM_KEY)
    if isinstance(system, str) and system.strip():  # LLaMA-Factory's ShareGPT/Alpaca rows: the system prompt beside
        if turns[0]["role"] == "system":
            raise TuneproofError(
                f"{where}: two system messages: the row's '{ROW_SYSTEM_KEY}' and {ats[0]}",
                hint="keep one of them",
            )
        turns.insert(0, _turn({"role": "system", "content": system}, f"{where}: {ROW_SYSTEM_KEY}", max_chars))
        ats.insert(0, ROW_SYSTEM_KEY)
    for k, t in enumerate(turns):
        if t["role"] == "system" and k > 0:
            raise TuneproofError(
                f"{where}: {ats[k]} is a system message after the first turn",
                hint="a row may have one system message, first",
            )
    if turns[-1].get(WEIGHT_KEY) == 0:
        raise TuneproofError(
            f"{where}: the final assistant turn ({ats[-1]}) has {WEIGHT_KEY} 0 (not trained), but it is the answer "
            "trained and judged",
            hint="end the row with the answer to train, or drop the row",
        )
    if turns[-1]["role"] != "assistant" or "tool_calls" in turns[-1]:
        what = "a tool call" if turns[-1]["role"] == "assistant" else repr(turns[-1]["role"])
        raise TuneproofError(
            f"{where}: the last turn ({ats[-1]}) is {what}, not the assistant answer",
            hint="each row ends with the assistant turn to train and judge",
        )
    if len(turns) < 2 or turns[-2]["role"] != "user":
        got = turns[-2]["role"] if len(turns) >= 2 else "nothing"
        raise TuneproofError(
            f"{where}: the final assistant turn follows {got!r}, not a user turn",
            hint="each row's final answer answers a user turn (a tool result before it: end the row with a user "
            "turn and its answer, or drop the row)",
        )
    return turns


def chat_example(
    row: dict[str, Any],
    where: str,
    default_id: str,
    split: str | None,
    fields,
    chat_cfg,
    max_chars: int,
) -> Example:
    """One conversation row as an :class:`Example` (see the module docstring). ``data.fields.id``
    and ``data.fields.label`` name row keys when set (a label, e.g. a category, for stratified
    splits and per-category audits).

    Raises:
        TuneproofError: the row is refused (the message starts with ``where``).
    """
    turns = parse_turns(row, where, getattr(chat_cfg, "messages", None), max_chars)
    ex_id, label = default_id, None
    for attr in ("id", "label"):
        name = getattr(fields, attr, None) if fields is not None else None
        if not name:
            continue
        if name not in row or row[name] is None:
            raise TuneproofError(f"{where}: key '{name}' (data.fields.{attr}) not found", hint="fix data.fields")
        if attr == "id":
            ex_id = str(row[name])
        else:
            label = str(row[name])
    return Example(
        id=ex_id,
        text=turns[-2]["content"],
        label=label,
        target=turns[-1]["content"],
        source=where,
        split=split,
        context=turns[:-2],
        meta={"chat_turns": len(turns)},
    )


def refuse_flat_fields(fields) -> None:
    """``data.fields.text`` / ``target`` do not apply to chat rows (the turns say what is input and answer).

    Raises:
        TuneproofError: one of them is set.
    """
    set_ = [k for k in ("target",) if getattr(fields, k, None) is not None]
    if getattr(fields, "text", "text") != "text":
        set_.insert(0, "text")
    if set_:
        raise TuneproofError(
            f"data.fields.{set_[0]} does not apply to format 'chat': the input is the final user turn and the "
            "answer the final assistant turn",
            hint=f"remove data.fields.{set_[0]} (data.chat.messages names the key holding the turns)",
        )


# --------------------------------------------------------------------------- rendering
def as_example(ex: Example | str) -> Example:
    """An :class:`Example`; a bare input text becomes one without context (older callers, tests)."""
    return ex if isinstance(ex, Example) else Example(id="", text=ex)


def prompt_messages(ex: Example, prompt) -> list[dict[str, str]]:
    """The message list of the inference prompt: the system message (the row's own, else
    ``eval.prompt.system``, else none), the earlier turns, and the final user turn with
    ``eval.prompt.template`` applied. Earlier user turns are given as written."""
    system = ex.system if ex.system is not None else prompt.system
    msgs = [{"role": "system", "content": system}] if system is not None else []
    msgs += [dict(t) for t in ex.context if t["role"] != "system"]
    msgs.append({"role": "user", "content": render_prompt(prompt.template, ex.text)})
    return msgs


def rendered_target(full: str, target: str) -> str:
    """The target as the chat template writes it into the training text ``full``: itself, or, when the template
    trims an answer (``{{ m['content'] | trim }}``: Llama-3, Gemma, Mistral, Llama-2) and the target has surrounding
    whitespace (TRL's standard completions start with a space), the target stripped."""
    if not target or target in full:
        return target
    stripped = target.strip()
    return stripped if stripped and stripped in full else target


def context_answer_spans(
    render, msgs: list[dict[str, str]], prompt_text: str, end_token: str | None
) -> tuple[list, list[str]]:
    """Where the earlier assistant turns of a conversation lie in its inference prompt
    (``data.chat.train_on: all_assistant``), each from its content to its end-of-turn token.

    Args:
        render: ``render(messages) -> str``, the template with the generation prompt (the
            pipeline's own rendering, so the check proves what training does).
        msgs: the example's message list as the pipeline builds it (:func:`prompt_messages`); its
            assistant turns are the earlier answers.
        prompt_text: the example's inference prompt (the final turn's).
        end_token: the end-of-turn token text supervised after each answer (None: none).

    Returns:
        ``(spans, faults)``: ``[(turn index in the message list, start char, end char)]`` inside
        ``prompt_text``, and one fault per turn whose own inference prompt (the conversation up
        to it, with the generation prompt) is not where the training render puts it: that turn
        would be trained after a prefix the model never sees when it answers there (the prefix
        check, per turn), or whose end token is not found after it.
    """
    spans, faults = [], []
    for k, m in enumerate(msgs):
        if m["role"] != "assistant" or m.get(WEIGHT_KEY) == 0:  # weight 0: context, never trained
            continue
        turn = f"assistant turn {sum(1 for x in msgs[:k] if x['role'] == 'assistant') + 1}"
        before = render(msgs[:k])
        if not prompt_text.startswith(before):
            at = next(
                (i for i, (a, b) in enumerate(zip(before, prompt_text)) if a != b), min(len(before), len(prompt_text))
            )
            faults.append(
                f"{turn} (train_on all_assistant): the conversation up to it, rendered with the generation prompt, "
                f"is not the start of the training text (first difference at character {at}): that turn would be "
                "trained after a prefix the model never sees when it answers there; set data.chat.train_on: last"
            )
            continue
        start = len(before)
        # whitespace between the generation prompt and the content (Llama-2 writes ' ' + answer after [/INST]) is
        # supervised with the answer, as it is for the final turn
        content = rendered_target(prompt_text[start:], m["content"])  # trimmed where the template trims it
        at = prompt_text.find(content, start) if content else start
        if at < 0 or prompt_text[start:at].strip():
            faults.append(
                f"{turn} (train_on all_assistant): its content does not follow its generation prompt in the "
                f"training text ('{visible_text(prompt_text[start : start + 40], one_line=True, limit=None)}'...); "
                "set data.chat.train_on: last"
            )
            continue
        end = at + len(content)
        if end_token:
            e = prompt_text.find(end_token, end)
            if e < 0:
                faults.append(
                    f"{turn} (train_on all_assistant): the end token {end_token!r} does not follow its content "
                    "(the model would not learn to stop after it); set data.chat.train_on: last"
                )
                continue
            end = e + len(end_token)
        spans.append((k, start, end))
    return spans, faults


def chat_summary(splits: dict[str, list[Example]], encoded: dict[str, list], train_on: str) -> dict[str, Any] | None:
    """The data check's chat line: conversations, those with their own system message, multi-turn
    ones, and what ``data.chat.train_on`` supervises (``encoded``: the trainer's encodings per
    split, :class:`~tuneproof.data.preprocess.Encoded`). None when no example is a chat row.

    Under ``all_assistant`` the supervised tokens of earlier turns are counted over the examples without
    faults only; the line says how many examples were left out (their faults, such as a template that drops
    think blocks from history, are listed beside it).

    Returns ``{"conversations", "own_system", "empty_system", "multi_turn", "with_tool_turns", "max_turns", "train_on",
    "context_supervised_tokens", "examples_counted", "examples_with_faults", "line"}``.
    """
    chats = [e for v in splits.values() for e in v if "chat_turns" in e.meta]
    if not chats:
        return None
    own = sum(1 for e in chats if e.system is not None)
    empty = sum(1 for e in chats if e.system is not None and not e.system.strip())
    multi = sum(1 for e in chats if any(t["role"] == "assistant" for t in e.context))
    tools = sum(1 for e in chats if any(t["role"] == "tool" or "tool_calls" in t for t in e.context))
    most = max(e.meta["chat_turns"] for e in chats)
    clean = [x for v in encoded.values() for x in v if not getattr(x, "faults", None)]
    faulty = sum(len(v) for v in encoded.values()) - len(clean)
    sup = sum(getattr(x, "context_supervised", 0) for x in clean)
    counted = (
        f"{sup} tokens in earlier turns of the {len(clean)} examples without faults, end tokens included; "
        f"{faulty} example{'s' if faulty != 1 else ''} with faults not counted (see faults)"
        if faulty
        else f"{sup} tokens in earlier turns, end tokens included"
    )
    line = (
        f"chat: {len(chats)} conversations ({own} with their own system message"
        + (f", {empty} of them empty: rendered empty, eval.prompt.system not used" if empty else "")
        + f", {multi} multi-turn, up to {most} "
        f"turns{f', {tools} with tool turns in the context' if tools else ''}); data.chat.train_on {train_on}: "
        + (
            f"every assistant turn supervised ({counted})"
            if train_on == "all_assistant"
            else "the final assistant turn supervised, earlier turns are prompt context"
        )
    )
    return {
        "conversations": len(chats),
        "own_system": own,
        "empty_system": empty,
        "multi_turn": multi,
        "with_tool_turns": tools,
        "max_turns": most,
        "train_on": train_on,
        "context_supervised_tokens": sup,
        "examples_counted": len(clean),
        "examples_with_faults": faulty,
        "line": line,
    }


#: what a context turn of each role must leave in the rendered prompt: ``(role, what it is called, the way on
#: besides a template that renders it)``; the text checked is the turn's content, or each tool call's name
MARKS = (
    ("system", "system message", "remove it"),
    ("tool", "tool result", "drop the tool turns from the rows (they are prompt context only)"),
)


def rendered_marks(messages: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """``[(what, text, way on)]``: the texts of a prompt's message list that its render must hold (a system
    message, a tool's result, the name of each tool an assistant calls); a template that drops one is a
    data-check fault naming it (:data:`MARKS`)."""
    out = []
    for m in messages:
        for role, what, way in MARKS:
            if m.get("role") == role and str(m.get("content") or "").strip():
                out.append((what, str(m["content"]), way))
        for call in m.get("tool_calls") or []:
            name = (call.get("function") or {}).get("name") if isinstance(call, dict) else None
            if isinstance(name, str) and name.strip():
                out.append(("tool call", name, "drop the tool turns from the rows (they are prompt context only)"))
    return out
