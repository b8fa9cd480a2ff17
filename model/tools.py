"""Tools the assistant can call: their schemas, the default device set, a call's text.

A tool is ``{name, description, parameters}`` where ``parameters`` is a JSON Schema
object of scalar properties (integer, number, string, boolean; ``enum``, ``minimum``
and ``maximum`` honoured; ``required`` lists the ones that must be given). That covers
every device action a glasses or car client exposes, and it is what lets the reply
model write calls whose arguments are valid by construction (``model/actions.py``).

A call is written in the reply as Hermes-style JSON between tags, then the spoken
confirmation::

    <tool_call>{"name": "timer.set", "arguments": {"seconds": 300}}</tool_call>Timer set.

Its token ids are always made piece by piece (:func:`call_pieces`): the fixed JSON
text and each value are encoded separately, so training data and the constrained
decoder see the same token boundaries around every value (byte-level BPE would
otherwise merge a closing quote into its neighbours differently for every value).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

ParamType = Literal["integer", "number", "string", "boolean"]
PARAM_TYPES: tuple[ParamType, ...] = ("integer", "number", "string", "boolean")
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
MAX_TOOLS = 32
MAX_PARAMS = 8
MAX_STRING_CHARS = 200  # a string argument the decoder may write
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")


class Encoder(Protocol):
    """What :func:`call_ids` needs of a tokenizer (``model.tokenizer.Tokenizer``)."""

    def encode_plain(self, text: str) -> list[int]: ...


class ToolError(ValueError):
    """A tool list or a call that does not fit its schema; the message says where."""


@dataclass(frozen=True)
class Param:
    name: str
    type: ParamType
    required: bool = True
    description: str = ""
    enum: tuple[str, ...] = ()  # strings only
    minimum: float | None = None
    maximum: float | None = None

    def within(self, v: float) -> bool:
        """``v`` is inside the parameter's ``minimum`` / ``maximum`` (either may be unset)."""
        return (self.minimum is None or v >= self.minimum) and (
            self.maximum is None or v <= self.maximum
        )


@dataclass(frozen=True)
class Tool:
    name: str
    description: str = ""
    params: tuple[Param, ...] = ()
    # A call is asked about before it is made ("Call your sister?"), and made only
    # after a yes (docs/actions.md, "Asking first"): a message or a call placed on a
    # misheard word costs more than a question.
    confirm: bool = False

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)

    def schema(self) -> dict[str, Any]:
        """The tool as the wire gives it: ``{name, description, parameters}``, and
        ``confirm`` when it is asked about first."""
        props: dict[str, Any] = {}
        for p in self.params:
            prop: dict[str, Any] = {"type": p.type}
            if p.description:
                prop["description"] = p.description
            if p.enum:
                prop["enum"] = list(p.enum)
            if p.minimum is not None:
                prop["minimum"] = _plain(p.minimum)
            if p.maximum is not None:
                prop["maximum"] = _plain(p.maximum)
            props[p.name] = prop
        required = [p.name for p in self.params if p.required]
        parameters = {"type": "object", "properties": props, "required": required}
        wire = {"name": self.name, "description": self.description, "parameters": parameters}
        return {**wire, "confirm": True} if self.confirm else wire


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    passes: int = 0  # model passes the call took to write (0: not written by a model)
    # the router's log-odds of acting on the request (model.router.ToolRouter.margin);
    # None where no router weighed it. model.ask.asked reads it: below SURE_TO_ACT the
    # call is asked about, not made
    margin: float | None = field(default=None, compare=False)
    # a second hearing of the user's words (server/turn.py, --asr-check) heard other
    # words: model.ask.asked reads it, and the call is asked about, not made
    doubted: bool = field(default=False, compare=False)


def _plain(x: float) -> int | float:
    return int(x) if float(x).is_integer() else float(x)


# ---------------------------------------------------------------- the default tool set


def _p(name: str, type: ParamType, required: bool = True, **kw: Any) -> Param:
    return Param(name, type, required, **kw)


DEFAULT_TOOLS: tuple[Tool, ...] = (
    Tool("timer.set", "Start a countdown timer.", (_p("seconds", "integer", minimum=1),)),
    Tool("timer.cancel", "Cancel the running timer."),
    Tool("navigation.start", "Start route guidance.", (_p("destination", "string"),)),
    Tool("media.play", "Play music or a podcast.", (_p("query", "string"),)),
    Tool("media.pause", "Pause what is playing."),
    Tool("media.next", "Skip to the next track."),
    Tool(
        "message.send",
        "Send a text message.",
        (_p("to", "string"), _p("text", "string")),
        confirm=True,
    ),
    Tool("call.start", "Phone a contact.", (_p("contact", "string"),), confirm=True),
    # a car's climate control sets 16-32 degrees: a number outside was misheard or made up
    Tool(
        "climate.set",
        "Set the cabin temperature.",
        (_p("temperature_c", "number", minimum=16, maximum=32),),
    ),
    Tool(
        "reminder.create",
        "Create a reminder.",
        (_p("text", "string"), _p("when", "string", required=False)),
    ),
    Tool("lights.set", "Switch the lights on or off.", (_p("on", "boolean"),)),
    Tool(
        "volume.set",
        "Set the volume to a level, or turn it up or down.",
        (
            _p("level", "integer", required=False, minimum=0, maximum=10),
            _p("change", "string", required=False, enum=("up", "down")),
        ),
    ),
)


# ---------------------------------------------------------------- parsing and checking


def parse_tools(raw: Any) -> tuple[Tool, ...]:
    """Tools from the wire (a list of ``{name, description, parameters, confirm}``;
    ``confirm``, a boolean, false when not given)."""
    if not isinstance(raw, list):
        raise ToolError("tools must be a list")
    if len(raw) > MAX_TOOLS:
        raise ToolError(f"at most {MAX_TOOLS} tools")
    tools = tuple(parse_tool(t, i) for i, t in enumerate(raw))
    names = [t.name for t in tools]
    if dup := sorted({n for n in names if names.count(n) > 1}):
        raise ToolError(f"tool names must be unique: {', '.join(dup)}")
    return tools


def parse_tool(raw: Any, i: int = 0) -> Tool:
    where = f"tools[{i}]"
    if not isinstance(raw, dict):
        raise ToolError(f"{where} must be an object")
    if unknown := sorted(set(raw) - {"name", "description", "parameters", "type", "confirm"}):
        raise ToolError(f"{where}: unknown field(s) {', '.join(unknown)}")
    name, desc = raw.get("name"), raw.get("description", "")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ToolError(f"{where}.name must match {_NAME.pattern}")
    if not isinstance(desc, str) or len(desc) > 500:
        raise ToolError(f"{where}.description must be a string of at most 500 characters")
    confirm = raw.get("confirm", False)
    if not isinstance(confirm, bool):
        raise ToolError(f"{where}.confirm must be a boolean")
    schema = raw.get("parameters", {"type": "object", "properties": {}})
    return Tool(name, desc, _parse_params(schema, f"{where}.parameters"), confirm)


def _parse_params(schema: Any, where: str) -> tuple[Param, ...]:
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        raise ToolError(f"{where} must be a JSON Schema object")
    props, required = schema.get("properties", {}), schema.get("required", [])
    if not isinstance(props, dict) or len(props) > MAX_PARAMS:
        raise ToolError(f"{where}.properties must be an object of at most {MAX_PARAMS}")
    if not isinstance(required, list) or not set(required) <= set(props):
        raise ToolError(f"{where}.required must list property names")
    return tuple(
        _parse_param(k, v, k in required, f"{where}.properties.{k}") for k, v in props.items()
    )


def _parse_param(name: str, prop: Any, required: bool, where: str) -> Param:
    if not _NAME.match(name) or not isinstance(prop, dict):
        raise ToolError(f"{where}: a property is a name and a schema object")
    kind = prop.get("type")
    if kind not in PARAM_TYPES:
        raise ToolError(f"{where}.type must be one of {', '.join(PARAM_TYPES)}")
    enum = prop.get("enum", [])
    if enum and (kind != "string" or not all(isinstance(e, str) and e for e in enum)):
        raise ToolError(f"{where}.enum: only non-empty strings, for a string")
    lo, hi = prop.get("minimum"), prop.get("maximum")
    for b in (lo, hi):
        if b is not None and (isinstance(b, bool) or not isinstance(b, int | float)):
            raise ToolError(f"{where}: minimum and maximum must be numbers")
    desc = prop.get("description", "")
    return Param(name, kind, required, str(desc), tuple(enum), lo, hi)


def validate(tool: Tool, arguments: Mapping[str, Any]) -> None:
    """Raise :class:`ToolError` unless ``arguments`` fit ``tool``'s schema."""
    if unknown := sorted(set(arguments) - {p.name for p in tool.params}):
        raise ToolError(f"{tool.name}: unknown argument(s) {', '.join(unknown)}")
    for p in tool.params:
        if p.name not in arguments:
            if p.required:
                raise ToolError(f"{tool.name}: missing {p.name}")
            continue
        _check_value(tool.name, p, arguments[p.name])


def _check_value(tool: str, p: Param, v: Any) -> None:
    ok = {
        "integer": isinstance(v, int) and not isinstance(v, bool),
        "number": isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v),
        "string": isinstance(v, str),
        "boolean": isinstance(v, bool),
    }[p.type]
    if not ok:
        raise ToolError(f"{tool}: {p.name} must be {p.type}")
    if p.enum and v not in p.enum:
        raise ToolError(f"{tool}: {p.name} must be one of {', '.join(p.enum)}")
    if not p.within(v):
        raise ToolError(f"{tool}: {p.name} out of range")


# ---------------------------------------------------------------- a call as text


def value_text(p: Param, v: Any) -> str:
    """The JSON text of one argument value, without a string's quotes (they are part
    of the fixed text around it)."""
    if p.type == "boolean":
        return "true" if v else "false"
    if p.type == "string":
        return json.dumps(v, ensure_ascii=False)[1:-1]
    return str(_plain(v)) if p.type == "number" else str(int(v))


def shape_name(tool: Tool, arguments: Mapping[str, Any]) -> str:
    """How a call of ``tool`` is laid out, without its free values: the tool, the
    parameters present and each boolean or enum value, e.g. ``volume.set(change=down)``,
    ``timer.set(seconds)``. ``arguments``: the call's (free values are not read)."""
    parts = []
    for p in tool.params:
        if p.name not in arguments:
            continue
        fixed = p.type == "boolean" or p.enum
        parts.append(f"{p.name}={value_text(p, arguments[p.name])}" if fixed else p.name)
    return f"{tool.name}({','.join(parts)})"


def key_text(p: Param, first: bool) -> str:
    """The fixed text before a value: ``"seconds": `` (``, `` before all but the first;
    a string value's opening quote included)."""
    quote = '"' if p.type == "string" else ""
    return f'{"" if first else ", "}"{p.name}": {quote}'


def after_value(p: Param) -> str:
    return '"' if p.type == "string" else ""


def layout(tool: Tool, present: Sequence[Param]) -> list[str | Param]:
    """A call of ``tool`` with the ``present`` parameters (schema order) as fixed JSON
    text with the parameters whose values go between; neighbouring texts are merged."""
    items: list[str | Param] = [f'{CALL_OPEN}{{"name": "{tool.name}", "arguments": {{']
    for i, p in enumerate(present):
        items += [key_text(p, i == 0), p, after_value(p)]
    items.append(f"}}}}{CALL_CLOSE}")
    merged: list[str | Param] = []
    for item in items:
        if isinstance(item, str) and merged and isinstance(merged[-1], str):
            merged[-1] += item
        elif item != "":
            merged.append(item)
    return merged


def call_pieces(tool: Tool, arguments: Mapping[str, Any]) -> list[tuple[str, bool]]:
    """The call's text in pieces ``(text, is_value)``: :func:`layout` with the values
    written in; concatenated they are :func:`render_call`'s text."""
    present = [p for p in tool.params if p.name in arguments]
    return [
        (item, False) if isinstance(item, str) else (value_text(item, arguments[item.name]), True)
        for item in layout(tool, present)
    ]


def render_call(tool: Tool, arguments: Mapping[str, Any]) -> str:
    return "".join(text for text, _ in call_pieces(tool, arguments))


def kept_reply(call_text: str, words: str) -> str:
    """A reply as the conversation keeps it: the call it made (``render_call``; "" for
    none), then the words the user heard. The server keeps replies so, and the session
    eval and the router's fit (``training``) must show the model the same."""
    return " ".join(x for x in (call_text, words) if x)


def call_ids(tok: Encoder, tool: Tool, arguments: Mapping[str, Any]) -> list[int]:
    """Token ids of the call, piece by piece (see the module docstring)."""
    return [i for text, _ in call_pieces(tool, arguments) for i in tok.encode_plain(text)]


_CALL = re.compile(re.escape(CALL_OPEN) + r"(.*?)" + re.escape(CALL_CLOSE), re.S)


def split_call(text: str) -> tuple[ToolCall | None, str]:
    """A reply's call (None if it starts with none) and its spoken rest. A call that is
    not valid JSON of the right shape counts as none (the text is then all spoken)."""
    m = _CALL.match(text.lstrip())
    if m is None:
        return None, text
    try:
        obj = json.loads(m.group(1))
    except ValueError:
        return None, text
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None, text
    args = obj.get("arguments", {})
    if not isinstance(args, dict):
        return None, text
    return ToolCall(obj["name"], args), text.lstrip()[m.end() :].lstrip()


# ---------------------------------------------------------------- the system prompt

# The list is all the model is told: the call's layout comes from training and from
# the constrained decoder, and every token of this prompt is prefilled on a session's
# first turn.
TOOLS_HEADER = "Tools:"


def tool_line(tool: Tool) -> str:
    """``timer.set(seconds)``; optional parameters end in ``?``, an enum lists its
    values; the description follows for tools outside the default set (the model was
    trained on those)."""
    args = ", ".join(
        f"{p.name}{'' if p.required else '?'}" + (f": {'|'.join(p.enum)}" if p.enum else "")
        for p in tool.params
    )
    line = f"{tool.name}({args})"
    return line if is_default(tool) or not tool.description else f"{line}: {tool.description}"


def is_default(tool: Tool) -> bool:
    """A default tool as defined there, asked about first or not (``confirm`` aside): a
    session's own tool of the same name may mean something else."""
    return any(replace(tool, confirm=t.confirm) == t for t in DEFAULT_TOOLS)


# The words that say an enum's value of a default tool, where the value is a choice the
# decoder makes rather than words it copies: a direction the words do not have ("Put
# the volume at nine." heard "But the volume at the eye" -> volume.set {change: down})
# is the decoder's guess, and one they have is not its to reverse ("Could you make it
# quieter?" -> {change: up}). Every volume change among the commands of data/actions
# has one, and none has only the other's (tests/model/test_router.py).
_UP = r"\b(up|loud\w*|raise|increase|crank|blast|pump|boost|higher|more|barely hear|can't hear)\b"
_DOWN = r"\b(down|quiet\w*|soft\w*|lower|reduce|decrease|less|too loud|notch)\b"
VALUE_WORDS: dict[tuple[str, str, Any], re.Pattern[str]] = {
    ("volume.set", "change", "up"): re.compile(_UP),
    ("volume.set", "change", "down"): re.compile(_DOWN),
}


def said_value(tool: Tool, p: Param, text: str) -> Any | None:
    """The value of a default tool's enum ``p`` that ``text`` says in words
    (:data:`VALUE_WORDS`): None where it says none of them, or more than one ("take it
    up a notch"), or the tool is not the default one."""
    if not is_default(tool):
        return None
    said = [
        value
        for (name, param, value), words in VALUE_WORDS.items()
        if name == tool.name and param == p.name and words.search(text.lower())
    ]
    return said[0] if len(said) == 1 else None


def tools_system_prompt(base: str, tools: Sequence[Tool]) -> str:
    """``base`` (the spoken-answer system prompt) with the tools appended; ``base``
    alone when there are none."""
    if not tools:
        return base
    return f"{base}\n{TOOLS_HEADER} " + "; ".join(map(tool_line, tools))
