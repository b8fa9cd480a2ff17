"""Requests for live information that no offered tool gives: said so, never made up.

A reply model knows no weather, clock, news, score, price or traffic of today: asked
"What's the temperature outside?", the served model answered "The temperature
outside is currently 100 degrees Fahrenheit.", "What time is it?" "It's 2:30 AM.",
"What's the weather like in Paris tomorrow?" in French, and its training replies do
the same ("The weather today is mostly sunny with a light breeze."). :func:`unavailable`
reads the user's words: where they ask for one of :data:`TOPICS` *now* (today,
tomorrow, outside, latest, ...) and no tool the session offers names the topic, a
reply that calls nothing is replaced by what it cannot do ("Sorry, I can't check the
weather from here."; server/turn.py). A call is never replaced: "Text Sam that the
weather is lovely today." sends the message. A question about the topic in general ("What is the
weather like in Rome in January?", "Why does it rain?", "What time is it in the
universe?") is the model's, as are the project's held-out lines: none of them is
caught (tests/model/test_live.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from model.tools import Tool


@dataclass(frozen=True)
class Topic:
    name: str  # what the answer says cannot be checked
    asks: re.Pattern[str]  # the user's words ask for it as it is now
    words: tuple[str, ...]  # a tool whose name or description has one gives it
    unless: re.Pattern[str] | None = None  # ... but these words ask about it in general


def _pattern(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.I)


# when, said of weather: today and the days around it, not a month or a season
_SOON = (
    r"(?:today|tonight|tomorrow|right now|now|currently|at the moment|later|outside|"
    r"this (?:morning|afternoon|evening|week|weekend))"
)
TOPICS: tuple[Topic, ...] = (
    Topic(
        "the weather",
        _pattern(
            rf"\bweather\b[^.?!]*\b{_SOON}\b|\b(?:what(?:'s| is)|how(?:'s| is)) the weather\b"
            r"|\bforecast\b"
            rf"|\b(?:is|will) it (?:going to )?(?:rain|snow|be (?:sunny|cloudy|windy|cold|hot|"
            rf"warm|nice))\b[^.?!]*\b{_SOON}\b"
            rf"|\b(?:is|will) it (?:going to )?(?:rain|snow)\s*[?.!]*$"
            rf"|\b(?:temperature|how (?:hot|cold|warm) is it) (?:is it )?{_SOON}\b"
            r"|\btemperature (?:is it )?outside\b"
        ),
        ("weather", "forecast"),
        _pattern(
            r"\b(?:january|february|march|april|may|june|july|august|september|october|"
            r"november|december|spring|summer|autumn|fall|winter|usually|typically|"
            r"generally|on average|climate|ago|last year|history)\b|\b(?:1[0-9]|20)\d\d\b"
        ),
    ),
    Topic(
        "the time",
        _pattern(
            r"\bwhat time is it\b(?! in the universe)|\bwhat(?:'s| is) the time\b"
            r"|\bwhat(?:'s| is) (?:the date|today's date)\b|\bwhat day is (?:it|today)\b"
            r"|\bwhat(?:'s| is) the date today\b"
        ),
        ("time", "clock", "date", "calendar"),
    ),
    Topic(
        "the news",
        _pattern(
            r"\b(?:latest|today's|breaking) (?:news|headlines)\b|\bnews (?:today|this morning)\b"
            r"|\b(?:read|tell) me the (?:news|headlines)\b|\bwhat(?:'s| is) in the news\b"
        ),
        ("news", "headline"),
    ),
    Topic(
        "live scores",
        _pattern(
            r"\b(?:the )?score (?:of|in) (?:the|tonight's|today's|last night's) \w+(?: \w+)? "
            r"(?:game|match)\b|\bwho (?:won|is winning|'s winning) (?:the game|the match|"
            r"last night|tonight)\b"
        ),
        ("score", "sport"),
    ),
    Topic(
        "stock prices",
        _pattern(
            r"\b(?:stock|share) price\b|\bprice of \w+(?: \w+)? (?:stock|shares)\b"
            r"|\bhow (?:is|are) (?:the )?(?:stock market|markets|stocks) doing\b"
        ),
        ("stock", "market", "finance", "quote"),
    ),
    Topic(
        "traffic",
        _pattern(
            r"\bhow(?:'s| is) (?:the )?traffic\b|\bwhat(?:'s| is) the traffic like\b"
            r"|\bis there (?:any |much |a lot of )?traffic\b|\btraffic (?:report|update)\b"
        ),
        ("traffic",),
    ),
)


def unavailable(text: str, tools: Sequence[Tool]) -> str | None:
    """What is said to ``text`` when it asks for live information no tool in ``tools``
    gives (:data:`TOPICS`): "Sorry, I can't check the weather from here."; None for
    anything else, a turn the reply model answers."""
    for topic in TOPICS:
        if topic.asks.search(text) is None or (topic.unless and topic.unless.search(text)):
            continue
        if any(_names(tool, topic) for tool in tools):
            return None  # the session offers a tool for it: the model calls it
        return f"Sorry, I can't check {topic.name} from here."
    return None


def _names(tool: Tool, topic: Topic) -> bool:
    said = f"{tool.name} {tool.description}".lower()
    return any(re.search(rf"\b{w}s?\b", said) for w in topic.words)
