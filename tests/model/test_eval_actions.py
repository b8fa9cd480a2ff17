"""``quicksilver eval actions``: matching calls, the summary, and one turn of the engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model.engine import ChatMessage, drain
from model.tools import CALL_OPEN, DEFAULT_TOOLS, ToolCall
from training.eval_actions import Case, read_cases, run_case, same_call, session_tools, summarize

from .test_actions import CallsFirst
from .test_diffusion import tiny_diffusion, tiny_generator


def test_a_call_matches_on_tool_and_arguments_as_said() -> None:
    want = ToolCall("navigation.start", {"destination": "the nearest gas station"})
    assert same_call(
        ToolCall("navigation.start", {"destination": "The nearest gas station."}), want
    )
    assert not same_call(ToolCall("navigation.start", {"destination": "gas station"}), want)
    assert not same_call(ToolCall("media.play", {"destination": "the nearest gas station"}), want)
    assert same_call(
        ToolCall("timer.set", {"seconds": 300}), ToolCall("timer.set", {"seconds": 300.0})
    )
    assert same_call(None, None) and not same_call(None, want) and not same_call(want, None)


def test_held_out_rows_give_their_expected_calls(tmp_path: Path) -> None:
    call = '<tool_call>{"name": "timer.set", "arguments": {"seconds": %d}}</tool_call>Done.'
    rows = [
        {"question": "Set a timer for 5 minutes.", "reply": call % 300},
        {"question": "Timer, two minutes.", "reply": call % 120},
        {"question": "Why is the sky blue?", "reply": "Because of scattering."},
    ]
    path = tmp_path / "held.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cases = read_cases(path)
    assert cases[0] == Case("Set a timer for 5 minutes.", ToolCall("timer.set", {"seconds": 300}))
    assert cases[2].expected is None
    assert [c.text for c in read_cases(path, limit_per_tool=1)] == [
        rows[0]["question"],
        rows[2]["question"],
    ]


def test_the_summary_counts_exact_calls_per_tool_and_false_triggers() -> None:
    call = {"name": "timer.set", "arguments": {"seconds": 300}}
    commands = [
        {"expected": call, "call": call, "exact": True, "passes": 3, "action_ms": 90.0},
        {"expected": call, "call": None, "exact": False, "passes": None, "action_ms": None},
    ]
    chat = [{"call": None}, {"call": call}, {"call": None}, {"call": None}]
    s = summarize(commands, chat)
    assert s["exact_rate"] == 0.5 and s["called_rate"] == 0.5 and s["passes_p50"] == 3
    assert s["false_triggers"] == 1 and s["false_trigger_rate"] == 0.25
    assert s["per_tool"]["timer.set"]["n"] == 2
    other = {"name": "timer.cancel", "arguments": {}}
    wrong = {"expected": call, "call": other, "exact": False, "passes": 2, "action_ms": 80.0}
    assert s["wrong_calls"] == 0 and summarize([*commands, wrong], chat)["wrong_calls"] == 1


def test_a_line_s_session_has_the_set_its_own_tool_alone_or_the_set_less_it() -> None:
    timer = Case("Set a timer for 5 minutes.", ToolCall("timer.set", {"seconds": 300}))
    names = [t.name for t in DEFAULT_TOOLS]
    assert [t.name for t in session_tools(timer, "default", 0)] == names
    assert [t.name for t in session_tools(timer, "own", 0)] == ["timer.set"]
    assert [t.name for t in session_tools(timer, "without", 0)] == [
        n for n in names if n != "timer.set"
    ]
    chat = Case("Why is the sky blue?", None)  # a tool of the set in turn
    assert [t.name for t in session_tools(chat, "own", 1)] == [names[1]]
    assert len(session_tools(chat, "without", 1)) == len(names) - 1
    with pytest.raises(ValueError, match="one of default, own, without"):
        session_tools(timer, "some", 0)


def test_one_turn_through_the_engine_reports_its_call_and_reply() -> None:
    gen, _ = tiny_generator()
    backend = CallsFirst(tiny_diffusion(4), max_len=1024)
    backend.open_id = gen.tokenizer.encode_plain(CALL_OPEN)[0]  # type: ignore[attr-defined]
    gen.backend = gen.prefixes.backend = backend
    text = "set a timer for 5 minutes"
    row = run_case(gen, Case(text, ToolCall("timer.set", {"seconds": 300})), 24)
    # the same turn through the engine directly: the row reports its call and words
    items, stats = drain(
        gen.generate([ChatMessage("user", text)], 24, lambda: False, DEFAULT_TOOLS)
    )
    (made,) = [i for i in items if isinstance(i, ToolCall)]
    assert row["call"] == {"name": made.name, "arguments": dict(made.arguments)}
    assert row["passes"] == made.passes > 0 and row["action_ms"] is not None
    assert row["reply"] == "".join(i for i in items if isinstance(i, str)).strip()
    assert row["reply_passes"] == stats.forward_passes
    # exact when the expected call is the one made; not when another tool was expected
    assert run_case(gen, Case(text, made), 24)["exact"] is True
    other = "media.pause" if made.name != "media.pause" else "media.next"
    assert run_case(gen, Case(text, ToolCall(other)), 24)["exact"] is False
    # a session without the command's tool: any call is wrong, none is right
    (tool,) = [t for t in DEFAULT_TOOLS if t.name == made.name]
    others = [t for t in DEFAULT_TOOLS if t is not tool]
    row = run_case(gen, Case(text, made), 24, others)
    assert row["exact"] is (row["call"] is None) and len(row["tools"]) == len(others)
