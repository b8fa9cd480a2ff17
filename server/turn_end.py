"""The end-of-turn decision's text side: does what the user said so far read as finished?

The endpointer (:mod:`audio.endpoint`) finds pauses from voice activity alone; the
session makes a pause the end of the turn once its transcript is known, and waits
longer when the transcript stops mid-sentence ("Add milk, eggs, and").
"""

from __future__ import annotations

import re

# Words after which an English sentence (almost) never ends: articles, possessives,
# conjunctions, a few prepositions that are never particles ("turn it on" ends in one),
# fillers. Deliberately short: a false "unfinished" costs
# the session's incomplete_end_of_turn_ms of waiting, a false "finished" answers half a
# question.
_DANGLING = frozenset(
    [
        *("a", "an", "the", "my", "your", "our", "their", "its"),
        *("and", "or", "but", "because", "if", "while", "than", "whether"),
        *("of", "to", "at", "into"),
        *("um", "uh", "er", "erm"),
    ]
)


def looks_incomplete(text: str) -> bool:
    """Heuristic on a (speculative) transcript: does it stop mid-sentence?

    True when it is empty of words, ends with a comma, dash or ellipsis, or ends with a
    word no English sentence ends with. The session (server/session.py) holds a turn
    whose transcript looks incomplete open for longer before it answers
    (``SessionConfig.incomplete_end_of_turn_ms``).
    """
    t = text.strip()
    if t.endswith((",", "-", "\u2014", "...", "\u2026", ";", ":")):
        return True
    words = re.findall(r"[a-z']+", t.lower())
    return not words or words[-1] in _DANGLING
