"""Requests for live information no offered tool gives (model.live)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.spoken import NOT_COMMANDS
from model.live import unavailable
from model.tools import DEFAULT_TOOLS, Tool

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("text", "topic"),
    [
        ("What's the temperature outside?", "the weather"),
        ("What's the weather like in Paris tomorrow?", "the weather"),
        ("What's the weather like?", "the weather"),
        ("How is the weather in Berlin?", "the weather"),
        ("Will it rain today?", "the weather"),
        ("Is it going to snow?", "the weather"),
        ("What's the forecast for the weekend?", "the weather"),
        ("How cold is it outside right now?", "the weather"),
        ("What time is it?", "the time"),
        ("What's today's date?", "the time"),
        ("What day is it today?", "the time"),
        ("What's the latest news?", "the news"),
        ("Read me the headlines.", "the news"),
        ("What's the score of the Lakers game?", "live scores"),
        ("Who won the game last night?", "live scores"),
        ("What's the price of Apple stock?", "stock prices"),
        ("How is the stock market doing?", "stock prices"),
        ("How is the traffic on my way to work?", "traffic"),
        ("Is there any traffic on the highway?", "traffic"),
    ],
)
def test_a_request_for_live_information_is_said_to_be_out_of_reach(text: str, topic: str) -> None:
    assert unavailable(text, DEFAULT_TOOLS) == f"Sorry, I can't check {topic} from here."
    assert unavailable(text, ()) == f"Sorry, I can't check {topic} from here."


@pytest.mark.parametrize(
    "text",
    [
        "What is the weather like in Rome in January?",
        "What is the weather usually like in France?",
        "What was the weather like in 1999?",
        "What was the weather like a hundred years ago?",
        "What is the difference between weather and climate?",
        "Why does it rain?",
        "What time is it in the universe?",
        "How do stock markets work?",
        "Set a timer for ten minutes.",
        "Set the temperature to twenty one degrees.",
        "Could you write to Alex I'm stuck in traffic now?",
        "What is the capital of France?",
    ],
)
def test_a_question_about_the_topic_in_general_is_the_model_s(text: str) -> None:
    assert unavailable(text, DEFAULT_TOOLS) is None


def test_a_tool_that_gives_it_leaves_the_request_to_the_model() -> None:
    """A client's tool naming the topic; the default tools name none (``timer.set``
    is no clock, ``climate.set``'s cabin temperature no weather)."""
    weather = Tool("weather.get", "Get the forecast for a place.")
    clock = Tool("clock.now", "The current time and date.")
    assert unavailable("Will it rain tomorrow?", (*DEFAULT_TOOLS, weather)) is None
    assert unavailable("What time is it?", (*DEFAULT_TOOLS, clock)) is None
    assert unavailable("What time is it?", (*DEFAULT_TOOLS, weather)) is not None


def test_no_held_out_or_dev_line_is_caught() -> None:
    """The evals' lines (held out and dev, commands and chat; eval sessions' turns; the
    spoken eval's lines that act on nothing) ask for nothing live:
    their replies stay the model's, and their figures cannot move."""
    files = sorted((ROOT / "data").glob("*/heldout*.jsonl")) + sorted(
        (ROOT / "data").glob("*/dev_*.jsonl")
    )
    texts = [
        str(e.get("question") or e.get("text"))
        for f in files
        for e in map(json.loads, f.read_text().splitlines())
    ]
    assert len(texts) > 500
    sessions = json.loads((ROOT / "training/prompts/sessions.json").read_text())
    texts += [m for m in _strings(sessions)]  # eval sessions' user turns
    texts += list(NOT_COMMANDS)  # the spoken eval's lines that act on nothing
    assert [t for t in texts if unavailable(t, DEFAULT_TOOLS)] == []


def _strings(x: object) -> list[str]:
    if isinstance(x, str):
        return [x]
    values = x.values() if isinstance(x, dict) else x if isinstance(x, list) else []
    return [s for v in values for s in _strings(v)]
