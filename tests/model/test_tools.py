"""Tool schemas, the default device set, a call's text (model/tools.py)."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from model.tools import (
    DEFAULT_TOOLS,
    Tool,
    ToolCall,
    ToolError,
    call_pieces,
    parse_tools,
    render_call,
    split_call,
    tools_system_prompt,
    validate,
)
from tests.schema import assert_fits_schema

EXAMPLES: dict[str, dict[str, Any]] = {
    "timer.set": {"seconds": 300},
    "timer.cancel": {},
    "navigation.start": {"destination": "the nearest gas station"},
    "media.play": {"query": "some jazz"},
    "media.pause": {},
    "media.next": {},
    "message.send": {"to": "Anna", "text": "I'm running late"},
    "call.start": {"contact": "mom"},
    "climate.set": {"temperature_c": 21.5},
    "reminder.create": {"text": "buy milk", "when": "tomorrow at 9"},
    "lights.set": {"on": False},
    "volume.set": {"change": "up"},
}


def test_the_default_set_is_the_issue_s_twelve_tools_and_each_example_is_valid() -> None:
    assert [t.name for t in DEFAULT_TOOLS] == list(EXAMPLES)
    for tool in DEFAULT_TOOLS:
        validate(tool, EXAMPLES[tool.name])
        assert_fits_schema(tool, EXAMPLES[tool.name])  # and by a validator of another hand
        assert parse_tools([tool.schema()]) == (tool,)  # the wire form round-trips


@pytest.mark.parametrize("tool", DEFAULT_TOOLS, ids=lambda t: t.name)
def test_a_call_renders_as_json_in_tags_and_parses_back(tool: Tool) -> None:
    args = EXAMPLES[tool.name]
    text = render_call(tool, args)
    assert text == "".join(t for t, _ in call_pieces(tool, args))
    call, rest = split_call(f"{text} Done, {tool.name}.")
    assert call == ToolCall(tool.name, args) and rest == f"Done, {tool.name}."


def test_values_are_pieces_of_their_own() -> None:
    tool = next(t for t in DEFAULT_TOOLS if t.name == "reminder.create")
    values = [t for t, is_value in call_pieces(tool, EXAMPLES["reminder.create"]) if is_value]
    assert values == ["buy milk", "tomorrow at 9"]


def test_a_reply_without_a_valid_call_is_all_speech() -> None:
    assert split_call("Paris is the capital.") == (None, "Paris is the capital.")
    bad = "<tool_call>{not json}</tool_call> Sure."
    assert split_call(bad) == (None, bad)


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        ("nope", "tools must be a list"),
        ([{"name": "a b"}], "tools[0].name"),
        ([{"name": "x", "colour": 1}], "unknown field"),
        ([{"name": "x"}, {"name": "x"}], "unique"),
        ([{"name": "x", "parameters": {"type": "array"}}], "JSON Schema object"),
        (
            [{"name": "x", "parameters": {"properties": {"n": {"type": "integer", "enum": [1]}}}}],
            "enum",
        ),
        ([{"name": "x", "parameters": {"properties": {"n": {"type": "list"}}}}], ".type"),
        ([{"name": "x", "parameters": {"properties": {}, "required": ["n"]}}], "required"),
    ],
)
def test_bad_tool_lists_say_what_is_wrong(raw: Any, where: str) -> None:
    with pytest.raises(ToolError, match=None) as err:
        parse_tools(raw)
    assert where in str(err.value)


@pytest.mark.parametrize(
    ("args", "why"),
    [
        ({}, "missing seconds"),
        ({"seconds": "5"}, "must be integer"),
        ({"seconds": True}, "must be integer"),
        ({"seconds": 0}, "out of range"),
        ({"seconds": 5, "minutes": 1}, "unknown argument"),
    ],
)
def test_arguments_outside_the_schema_are_refused(args: dict[str, Any], why: str) -> None:
    timer = DEFAULT_TOOLS[0]
    with pytest.raises(ToolError) as err:
        validate(timer, args)
    assert why in str(err.value)
    with pytest.raises(jsonschema.ValidationError):  # the wire schema refuses them too
        assert_fits_schema(timer, args)


def test_the_system_prompt_lists_the_tools_and_only_then() -> None:
    assert tools_system_prompt("Be brief.", ()) == "Be brief."
    prompt = tools_system_prompt("Be brief.", DEFAULT_TOOLS)
    assert prompt.startswith("Be brief.\nTools: timer.set(seconds); ")
    assert "reminder.create(text, when?)" in prompt and "change?: up|down" in prompt
    lamp = Tool("lamp.dim", "Dim the lamp.")
    assert tools_system_prompt("", [lamp]).endswith("lamp.dim(): Dim the lamp.")
