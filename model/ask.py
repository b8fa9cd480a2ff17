"""Asking before acting: the user's yes or no to a question, and calls that name
someone by a reference to an earlier call.

A tool marked ``confirm`` (``model.tools.Tool``) is asked about before its call is
made ("Send 'I'm running late' to your sister?", ``model.confirm.question``); the
user's next words answer it. :func:`answer` reads them: a plain yes or no, said alone
(with "please" or "thanks" around it), and nothing else: "No, call my brother" is a new
request, not a no, and is answered as one.

A call's string argument that names someone may be a reference ("text her instead"):
:func:`resolve` puts in the name the conversation's latest earlier call gave ("my
sister" from ``call.start {contact: "my sister"}``), or says whom to ask about when no
earlier call named anyone. All pure: the turn pipeline and the session read the same
words the same way (server/turn.py, server/session.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Literal

from model.engine import ChatMessage
from model.tools import Tool, ToolCall, split_call

Answer = Literal["yes", "no"]
DECLINED = "Okay, I won't."  # said to a no: the call asked about is dropped

_YES = frozenset(
    [
        "yes",
        "yeah",
        "yea",
        "yep",
        "yup",
        "sure",
        "ok",
        "okay",
        "do it",
        "do that",
        "please do",
        "yes please",
        "send it",
        "call",
        "call them",
        "go ahead",
        "go for it",
        "correct",
        "right",
        "that's right",
        "absolutely",
        "of course",
        "sounds good",
        "sure thing",
        "yes do it",
        "yes send it",
        "yes go ahead",
    ]
)
_NO = frozenset(
    [
        "no",
        "nope",
        "nah",
        "don't",
        "do not",
        "no don't",
        "don't do it",
        "don't send it",
        "don't call",
        "cancel",
        "cancel it",
        "cancel that",
        "never mind",
        "nevermind",
        "forget it",
        "stop",
        "no thanks",
        "no thank you",
        "not now",
    ]
)
_POLITE = frozenset(["please", "thanks", "thank you", "um", "uh", "oh", "well"])
_CLAUSES = re.compile(r"[.,!?;:\u2026]+")
_SPACES = re.compile(r"\s+")

# Who a call goes to, by parameter: where a reference ("her") names someone
_WHO = {
    "to": "Who should I send it to?",
    "contact": "Who should I call?",
    "recipient": "Who should I send it to?",
}
_REFERENCE = re.compile(
    r"^(her|him|them|they|it|that person|this person|the same person|that one|that contact)"
    r"(\s+instead)?[.!?]?$",
    re.I,
)
_INSTEAD = re.compile(r"\s+instead[.!?]?$", re.I)


def answer(text: str) -> Answer | None:
    """ "yes", "no", or None for anything else (a new request, or both at once)."""
    clauses = [_SPACES.sub(" ", c).strip() for c in _CLAUSES.split(text.lower())]
    clauses = [c.replace("\u2019", "'") for c in clauses if c]
    said = {c for c in clauses if c not in _POLITE}
    if not said:
        return None
    if said <= _YES:
        return "yes"
    if said <= _NO:
        return "no"
    return None


def earlier_calls(history: Iterable[ChatMessage]) -> list[ToolCall]:
    """The calls the conversation's replies made, oldest first (a reply is kept as its
    call's text, then its words: ``model.tools.kept_reply``)."""
    calls = []
    for message in history:
        if message.role == "assistant":
            call, _ = split_call(message.content)
            if call is not None:
                calls.append(call)
    return calls


def resolve(call: ToolCall, tool: Tool, earlier: Sequence[ToolCall]) -> ToolCall | str:
    """``call`` with a reference in a parameter that names someone (``to``,
    ``contact``, ``recipient``) replaced by the name the latest of the ``earlier``
    calls gave; what to ask instead ("Who should I send it to?") when none did. A
    name that is no reference keeps its words, a trailing "instead" dropped."""
    args = dict(call.arguments)
    for p in tool.params:
        value = args.get(p.name)
        if p.name not in _WHO or not isinstance(value, str):
            continue
        if _REFERENCE.match(value.strip()) is None:
            args[p.name] = _INSTEAD.sub("", value.strip()) or value
            continue
        named = _named(earlier)
        if named is None:
            return _WHO[p.name]
        args[p.name] = named
    return ToolCall(call.name, args, call.passes)


def _named(earlier: Sequence[ToolCall]) -> str | None:
    for call in reversed(earlier):
        for key in _WHO:
            value = call.arguments.get(key)
            if isinstance(value, str) and value.strip() and not _REFERENCE.match(value.strip()):
                return value
    return None
