"""Chat data (``format: chat``): one conversation per row, read into one
:class:`~tuneproof.data.examples.Example`, and rendered back into the message list a chat template takes.

A row holds its turns under ``messages`` (``[{"role": ..., "content": ...}]``, roles ``system``,
``user``, ``assistant``: the layout of the OpenAI chat API and of Hugging Face chat templates) or
under ShareGPT's ``conversations`` (``[{"from": ..., "value": ...}]``, ``from`` ``system``,
``human``, ``gpt``), read by the same code (``data.chat.messages`` names another key). The example:

- ``target``: the final assistant turn (what evaluation judges);
- ``text``: the user turn just before it (``eval.prompt.template`` is applied to it);
- ``context``: the row's own system message, when it has one (it replaces ``eval.prompt.system``
  for that row), then every earlier user and assistant turn, in order: prompt context.

``data.chat.train_on``: ``last`` supervises the final assistant turn only; ``all_assistant`` also
supervises every earlier assistant turn, each with its end-of-turn token, at the place it has in
the rendered conversation (:func:`context_answer_spans`); evaluation still judges the final turn.

A row is refused (all refused rows of a file named in one error, :class:`~tuneproof.data.rows.BadRows`)
when its turns are missing or not a list, a turn is not an object or lacks its role or content, a
role is unknown, a content is not a string or is empty (a user or assistant turn; an empty system message
is the row's own system message, rendered as given and counted by the data check), a system message is not the
first turn, the last turn is not an assistant's, or the turn before it is not a user's.
"""

from __future__ import annotations

from typing import Any

from tuneproof.data.examples import Example
from tuneproof.errors import TuneproofError
from tuneproof.study import render_prompt
from tuneproof.ui import visible_text

#: roles of the ``messages`` layout
ROLES = ("system", "user", "assistant")
#: ShareGPT's ``from`` values and the role each means (the chat roles are accepted there too)
SHAREGPT_ROLES = {"system": "system", "human": "user", "gpt": "assistant", "user": "user", "assistant": "assistant"}
#: keys looked up for the turns when ``data.chat.messages`` is not set, in this order
MESSAGE_KEYS = ("messages", "conversations")
_HINT = "fix the row, or set data.chat.messages to the key holding the turns"


def _turn(raw: Any, where: str, key: str, k: int, max_chars: int) -> dict[str, str]:
    at = f"{where}: {key}[{k}]"
    if not isinstance(raw, dict):
        raise TuneproofError(f"{at} is {type(raw).__name__}, not an object with role and content", hint=_HINT)
    if "role" in raw or "content" in raw:
        role_key, content_key, known = "role", "content", dict(zip(ROLES, ROLES))
    elif "from" in raw or "value" in raw:
        role_key, content_key, known = "from", "value", SHAREGPT_ROLES
    else:
        raise TuneproofError(
            f"{at} has no role (keys: {', '.join(map(str, raw)) or 'none'}; "
            "expected role/content or ShareGPT from/value)",
            hint=_HINT,
        )
    if role_key not in raw:
        raise TuneproofError(f"{at} has no '{role_key}'", hint=_HINT)
    role = raw[role_key]
    if role not in known:
        raise TuneproofError(
            f"{at}: unknown role {role!r} (known: {', '.join(known)})",
            hint="only system, user and assistant turns are trained; drop or rename the other turns",
        )
    content = raw.get(content_key)
    if not isinstance(content, str):
        shown = "no content" if content is None else f"a {type(content).__name__} content, not text"
        raise TuneproofError(f"{at} ({role}) has {shown}", hint="every turn needs a text content")
    if not content.strip() and known[role] != "system":  # an empty system message is the row's own, empty
        raise TuneproofError(f"{at} ({role}) has an empty content", hint="fill or drop the row")
    if len(content) > max_chars:
        raise TuneproofError(
            f"{at} ({role}) is {len(content):,} characters, over data.max_chars {max_chars:,}",
            hint="fix the row, or raise data.max_chars in tuneproof.yaml",
        )
    return {"role": known[role], "content": content}


def parse_turns(row: dict[str, Any], where: str, key: str | None, max_chars: int) -> list[dict[str, str]]:
    """The turns of one row as ``[{"role", "content"}]`` (ShareGPT's ``from``/``value`` mapped to roles).

    Args:
        row: one record (a JSON object, a Parquet or ``datasets`` row).
        where: ``file:line`` (or ``file#index``) of the row, for the error.
        key: ``data.chat.messages``; None looks up :data:`MESSAGE_KEYS`.
        max_chars: ``data.max_chars``, per turn.

    Raises:
        TuneproofError: the row is refused (see the module docstring); the message starts with ``where``.
    """
    keys = (key,) if key else MESSAGE_KEYS
    name = next((k for k in keys if k in row), None)
    if name is None:
        raise TuneproofError(
            f"{where}: no {' or '.join(repr(k) for k in keys)} list of turns (keys: {', '.join(map(str, row))})",
            hint=_HINT,
        )
    raw = row[name]
    if not isinstance(raw, list) or not raw:
        what = "an empty list" if isinstance(raw, list) else f"{type(raw).__name__}, not a list of turns"
        raise TuneproofError(f"{where}: '{name}' is {what}", hint=_HINT)
    turns = [_turn(t, where, name, k, max_chars) for k, t in enumerate(raw)]
    for k, t in enumerate(turns):
        if t["role"] == "system" and k > 0:
            raise TuneproofError(
                f"{where}: {name}[{k}] is a system message after the first turn",
                hint="a row may have one system message, first",
            )
    if turns[-1]["role"] != "assistant":
        raise TuneproofError(
            f"{where}: the last turn ({name}[{len(turns) - 1}]) is {turns[-1]['role']!r}, not the assistant answer",
            hint="each row ends with the assistant turn to train and judge",
        )
    if len(turns) < 2 or turns[-2]["role"] != "user":
        got = turns[-2]["role"] if len(turns) >= 2 else "nothing"
        raise TuneproofError(
            f"{where}: the final assistant turn follows {got!r}, not a user turn",
            hint="each row's final answer answers a user turn",
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
        if m["role"] != "assistant":
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
        if not prompt_text.startswith(m["content"], start):
            faults.append(
                f"{turn} (train_on all_assistant): its content does not follow its generation prompt in the "
                f"training text ('{visible_text(prompt_text[start : start + 40], one_line=True, limit=None)}'...); "
                "set data.chat.train_on: last"
            )
            continue
        end = start + len(m["content"])
        if end_token:
            e = prompt_text.find(end_token, end)
            if e < 0:
                faults.append(
                    f"{turn} (train_on all_assistant): the end token {end_token!r} does not follow its content "
                    "(the model would not learn to stop after it)"
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

    Returns ``{"conversations", "own_system", "empty_system", "multi_turn", "max_turns", "train_on",
    "context_supervised_tokens", "examples_counted", "examples_with_faults", "line"}``.
    """
    chats = [e for v in splits.values() for e in v if "chat_turns" in e.meta]
    if not chats:
        return None
    own = sum(1 for e in chats if e.system is not None)
    empty = sum(1 for e in chats if e.system is not None and not e.system.strip())
    multi = sum(1 for e in chats if any(t["role"] == "assistant" for t in e.context))
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
        f"turns); data.chat.train_on {train_on}: "
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
        "max_turns": most,
        "train_on": train_on,
        "context_supervised_tokens": sup,
        "examples_counted": len(clean),
        "examples_with_faults": faulty,
        "line": line,
    }
