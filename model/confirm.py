"""A call's spoken confirmation, checked against the call before it is spoken.

The model writes the confirmation after the call's tokens (``model/actions.py``), and
a 135M adapter says things the call did not do: ``climate.set {temperature_c: 19}``
confirmed "Okay, the car is now ninety degrees degrees.", ``reminder.create`` "I
cancelled the reminder.". The call is what the device does, so the sentence must say
only what the call holds. :func:`problems` reads a sentence for what a call can be
checked on, all without a model:

* every number it says is one of the call's (in any spelling, read by
  ``model/spoken.py``), and every duration equals one the call holds (a ``seconds``
  parameter, or a time said in a string argument: "in ten minutes");
* no word said twice in a row ("minutes minutes");
* no verb that undoes what the tool does ("cancelled" for ``reminder.create``, "playing"
  for ``media.pause``), and no refusal ("I can't", "sorry") after a call that was made;
* an enum or on/off value it names is the call's ("down" for ``change: up``);
* where the call has string arguments, the names it says (a capitalised word past the
  first, a family word such as "mom") are in them, and a message or a call is not said
  to go to the user ("I'll send you some milk.").

A sentence that fails is replaced by :func:`template`, the call said plainly from its
arguments ("Timer set for thirty minutes."), and the rest of the confirmation is
dropped. :class:`Confirmation` does this on a stream, one whole sentence at a time, so
nothing unchecked reaches the speech synthesiser.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from model.spoken import (
    UNIT_PARAMS,
    bare_numbers,
    say_duration,
    say_number,
    say_quantity,
    spoken_duration,
    spoken_numbers,
)
from model.tools import Tool, ToolCall

# Verbs that undo: wrong in the confirmation of a call that does not
_UNDO = re.compile(r"\b(cancel\w*|delet\w*|remov\w*|clear(ed|ing)?)\b", re.I)
# Verbs that make: wrong in the confirmation of a call that undoes
_MAKE = re.compile(r"\b(creat\w*|start(ed|ing)?|add(ed|ing)?)\b", re.I)
# A call was made: a confirmation that says it was not contradicts it
_REFUSAL = re.compile(r"\b(can't|cannot|couldn't|can not|unable|not able|sorry)\b", re.I)
# What a default tool's opposite does ("Okay, I'm now playing again." after a pause)
_OPPOSITE = {
    "media.pause": re.compile(r"\b(play(s|ing)?|resum\w*)\b", re.I),
    "media.play": re.compile(r"\bpaus\w*\b", re.I),
}
# A message or a call to someone, said as sent to the user ("I'll send you some milk.")
_RECIPIENTS = ("to", "contact")
_TO_USER = re.compile(r"\b(send|sending|sent|call|calling|messag\w*|text\w*)\s+you\b", re.I)
_UNDOING_TOOL = re.compile(r"cancel|delete|remove|clear|stop", re.I)
_DOUBLED = re.compile(r"\b(\w+)\s+\1\b", re.I)
# Names said without a capital: who a message or a call goes to
_FAMILY = frozenset(
    [
        "mom",
        "mum",
        "mother",
        "dad",
        "father",
        "sister",
        "brother",
        "wife",
        "husband",
        "son",
        "daughter",
        "grandma",
        "grandpa",
        "grandmother",
        "grandfather",
        "aunt",
        "uncle",
        "cousin",
        "boss",
    ]
)
# Capitalised words that name nobody
_NOT_NAMES = frozenset(["i", "i'm", "i've", "i'll", "i'd", "okay", "ok", "sure", "done", "alright"])
_WORD = re.compile(r"[A-Za-z][A-Za-z'\u2019]*")
# a sentence's end inside a stream: its mark followed by a space (at the stream's end,
# any mark): "1800." may yet go on as "1800.5"
_SENTENCE_END = re.compile(r"[.!?\u2026]+\s")


def problems(call: ToolCall, sentence: str, tool: Tool | None = None) -> list[str]:
    """What in ``sentence`` contradicts ``call`` (of ``tool``, where known: its enum
    values); empty when it may be spoken."""
    found = [f"number {say_number(n)}" for n in bare_numbers(sentence) if not _holds(call, n)]
    said = spoken_duration(sentence)
    if said is not None and not any(abs(said - d) < 0.5 for d in _durations(call)):
        found.append(f"duration {say_duration(said)}")
    strings = " ".join(v.lower() for v in call.arguments.values() if isinstance(v, str))
    found += [  # "Playing Duran Duran." says the call's own words
        f"doubled {m.group(1)!r}"
        for m in _DOUBLED.finditer(sentence)
        if m.group(0).lower() not in strings
    ]
    verbs = _MAKE if _UNDOING_TOOL.search(call.name) else _UNDO
    found += [f"verb {m.group(0)!r}" for m in verbs.finditer(sentence)]
    found += [f"refusal {m.group(0)!r}" for m in _REFUSAL.finditer(sentence)]
    if (opposite := _OPPOSITE.get(call.name)) is not None:
        found += [f"verb {m.group(0)!r}" for m in opposite.finditer(sentence)]
    if any(k in call.arguments for k in _RECIPIENTS):
        found += [f"name {m.group(0)!r}" for m in _TO_USER.finditer(sentence)]
    found += [f"value {w!r}" for w in _other_values(call, tool, sentence)]
    found += [f"name {w!r}" for w in _strange_names(call, sentence)]
    return found


def template(call: ToolCall) -> str:
    """The call said plainly from its arguments: a sentence per default tool
    (``model.tools.DEFAULT_TOOLS``), "Done: <name> with <arguments>." for any other or
    for a default name called with other arguments."""
    said = _said(_TEMPLATES, call)
    return _generic(call) if said is None else said


def confirmed(call: ToolCall, sentence: str, tool: Tool | None = None) -> str:
    """``sentence`` if it may be spoken after ``call``, else :func:`template`."""
    return template(call) if problems(call, sentence, tool) else sentence


class Confirmation:
    """A call's confirmation streamed through the check: :meth:`feed` the model's
    text pieces and speak what it returns, then :meth:`flush` at the end. A sentence
    is held until it is complete; the first one that fails is replaced by the
    template and everything after it is dropped (the model was wrong about the call).
    A confirmation with no words is the template."""

    def __init__(self, call: ToolCall, tool: Tool | None = None) -> None:
        self.call, self.tool = call, tool
        self.replaced = False
        self._buffer = ""
        self._said = False  # some text was released

    def feed(self, piece: str) -> list[str]:
        self._buffer += piece
        out = []
        while (m := _SENTENCE_END.search(self._buffer)) is not None:
            sentence, self._buffer = self._buffer[: m.end()], self._buffer[m.end() :]
            out += self._judge(sentence)
        return out

    def flush(self) -> list[str]:
        """The rest, checked; the template where the model said nothing at all (a
        call made in silence leaves the user guessing)."""
        rest, self._buffer = self._buffer, ""
        if not rest.strip():
            return [] if self._said else self._judge(template(self.call))
        return self._judge(rest)

    def _judge(self, sentence: str) -> list[str]:
        if self.replaced:
            return []
        if problems(self.call, sentence, self.tool):
            self.replaced = True
            sentence = (" " if self._said else "") + template(self.call)
        self._said = True
        return [sentence]


# ---------------------------------------------------------------- facts of a call


def _numbers(call: ToolCall) -> set[float]:
    """Every number the call holds: its numeric arguments (with their sign dropped:
    "minus three" reads as three) and the numbers said in its strings ("at 6 pm")."""
    out: set[float] = set()
    for v in call.arguments.values():
        if isinstance(v, bool):
            continue
        if isinstance(v, int | float):
            out.add(abs(float(v)))
        elif isinstance(v, str):
            out.update(spoken_numbers(v))
    return out


def _holds(call: ToolCall, n: float) -> bool:
    return any(abs(n - v) < 1e-6 for v in _numbers(call))


def _durations(call: ToolCall) -> list[float]:
    """The durations the call holds, in seconds: a parameter named for a unit, and a
    time said in a string ("in ten minutes")."""
    out = []
    for k, v in call.arguments.items():
        if k in UNIT_PARAMS and isinstance(v, int | float) and not isinstance(v, bool):
            out.append(float(v) * UNIT_PARAMS[k])
        elif isinstance(v, str) and (d := spoken_duration(v)) is not None:
            out.append(d)
    return out


def _other_values(call: ToolCall, tool: Tool | None, sentence: str) -> list[str]:
    """Enum or on/off words the sentence says for a parameter while not saying the
    call's own value ("Lights off." for ``on: true``)."""
    words = {w.lower() for w in _WORD.findall(sentence)}
    out = []
    for k, v in call.arguments.items():
        if isinstance(v, bool) and k == "on":
            values, own = {"on", "off"}, "on" if v else "off"
        elif tool is not None and (p := tool.param(k)) is not None and p.enum:
            values, own = {e.lower() for e in p.enum}, str(v).lower()
        else:
            continue
        if own not in words:
            out += sorted((values - {own}) & words)
    return out


def _strange_names(call: ToolCall, sentence: str) -> list[str]:
    """Names the sentence says that no string argument of the call holds (only for a
    call with string arguments: a name is checked where the call names something)."""
    strings = [v.lower() for v in call.arguments.values() if isinstance(v, str)]
    if not strings:
        return []
    held = set(_WORD.findall(" ".join(strings)))
    out = []
    for i, m in enumerate(_WORD.finditer(sentence)):
        w = m.group(0)
        lower = w.lower().replace("\u2019", "'")
        first = i == 0 or sentence[: m.start()].rstrip().endswith((".", "!", "?", ":"))
        named = (w[0].isupper() and not first and lower not in _NOT_NAMES) or lower in _FAMILY
        if named and lower not in held and lower.removesuffix("'s") not in held:
            out.append(w)
    return out


# ---------------------------------------------------------------- templates


def _volume(a: Mapping[str, Any]) -> str:
    if "level" in a:
        return f"Volume set to {say_number(a['level'])}."
    if "change" in a:
        return f"Turning the volume {a['change']}."
    return "Volume set."


def _reminder(a: Mapping[str, Any]) -> str:
    when = f" {_theirs(a['when'])}" if a.get("when") else ""
    return f"Reminder set: {_theirs(a['text'])}{when}."


_TEMPLATES: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "timer.set": lambda a: f"Timer set for {say_duration(a['seconds'])}.",
    "timer.cancel": lambda a: "Timer cancelled.",
    "navigation.start": lambda a: f"Starting directions to {_theirs(a['destination'])}.",
    "media.play": lambda a: f"Playing {_theirs(a['query'])}.",
    "media.pause": lambda a: "Paused.",
    "media.next": lambda a: "Skipping to the next track.",
    "message.send": lambda a: f"Sending {_theirs(a['to'])} your message: {_clause(a['text'])}.",
    "call.start": lambda a: f"Calling {_theirs(a['contact'])}.",
    "climate.set": lambda a: (
        f"Setting the temperature to {say_quantity(a['temperature_c'], 'degree')}."
    ),
    "reminder.create": _reminder,
    "lights.set": lambda a: f"Turning the lights {'on' if a['on'] else 'off'}.",
    "volume.set": _volume,
}


def _volume_question(a: Mapping[str, Any]) -> str:
    if "level" in a:
        return f"Set the volume to {say_number(a['level'])}?"
    return f"Turn the volume {a['change']}?"


def _reminder_question(a: Mapping[str, Any]) -> str:
    when = f" {_theirs(a['when'])}" if a.get("when") else ""
    return f"Set a reminder: {_clause(_theirs(a['text']))}{when}?"


# Every default tool's: a call the router was unsure to make is asked about too
# (model.ask.asked), whatever its tool
_QUESTIONS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "message.send": lambda a: f"Send '{_clause(a['text'])}' to {_theirs(a['to'])}?",
    "call.start": lambda a: f"Call {_theirs(a['contact'])}?",
    "timer.set": lambda a: f"Set a timer for {say_duration(a['seconds'])}?",
    "timer.cancel": lambda a: "Cancel the timer?",
    "navigation.start": lambda a: f"Start directions to {_clause(_theirs(a['destination']))}?",
    "media.play": lambda a: f"Play {_clause(_theirs(a['query']))}?",
    "media.pause": lambda a: "Pause what's playing?",
    "media.next": lambda a: "Skip to the next track?",
    "climate.set": lambda a: (
        f"Set the temperature to {say_quantity(a['temperature_c'], 'degree')}?"
    ),
    "reminder.create": _reminder_question,
    "lights.set": lambda a: f"Turn the lights {'on' if a['on'] else 'off'}?",
    "volume.set": _volume_question,
}


# The questions of _QUESTIONS and question's fallback, as a client that answers them
# (the spoken eval) tells them from a reply's other sentences
_ASKED = re.compile(
    r"^(Send .+ to .+|Call .+|Set a timer for .+|Cancel the timer|Start directions to .+"
    r"|Play .+|Pause what's playing|Skip to the next track|Set the temperature to .+"
    r"|Set a reminder: .+|Turn the lights (on|off)|Set the volume to .+|Turn the volume .+"
    r"|Should I do .+)\?$"
)


def is_question(said: str) -> bool:
    """Whether ``said`` is a call asked about (:func:`question`), which a yes makes."""
    return _ASKED.match(said.strip()) is not None


def _said(
    sentences: Mapping[str, Callable[[Mapping[str, Any]], str]], call: ToolCall
) -> str | None:
    """The call's own sentence from ``sentences`` (by tool name), or None when there is
    none or its arguments are not the ones the sentence reads."""
    write = sentences.get(call.name)
    try:
        return write(call.arguments) if write is not None else None
    except (KeyError, TypeError, ValueError):
        return None


def question(call: ToolCall) -> str:
    """The call asked about before it is made (its tool is marked ``confirm``): "Send
    'I'm running late' to your sister?", "Call your sister?"; "Should I do <name> with
    <arguments>?" for a tool without a question of its own. The words are the call's
    arguments, the user's own said back to them ("my" -> "your")."""
    said = _said(_QUESTIONS, call)
    return f"Should I do {_described(call)}?" if said is None else said


def _clause(text: Any) -> str:
    """A string argument inside a sentence: its own end marks dropped."""
    if not isinstance(text, str):
        raise TypeError(text)
    return text.strip().rstrip(".!?")


_PERSON = {"my": "your", "me": "you", "i": "you", "mine": "yours", "myself": "yourself"}


def _theirs(text: Any) -> str:
    """The user's words said back to them: "call my mom" -> "call your mom"."""
    return re.sub(
        r"\b(my|me|I|mine|myself)\b", lambda m: _PERSON[m.group(1).lower()], _clause(text)
    )


def _say(v: Any) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, int | float):
        return say_number(v)
    return _clause(str(v))


def _generic(call: ToolCall) -> str:
    """ "Done: notes add with text milk." (a name's dots and underscores read as spaces)."""
    return f"Done: {_described(call)}."


def _described(call: ToolCall) -> str:
    """ "notes add with text milk" """
    name = re.sub(r"[._-]+", " ", call.name).strip()
    args = ", ".join(f"{re.sub(r'[._-]+', ' ', k)} {_say(v)}" for k, v in call.arguments.items())
    return f"{name} with {args}" if args else name


def tool_named(tools: Sequence[Tool], name: str) -> Tool | None:
    return next((t for t in tools if t.name == name), None)
