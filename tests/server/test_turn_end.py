"""The end-of-turn text heuristic (no models)."""

from __future__ import annotations

import pytest

from server.turn_end import looks_incomplete


@pytest.mark.parametrize(
    ("text", "incomplete"),
    [
        ("Add milk, eggs, and", True),
        ("If I leave now,", True),
        ("Remind me to call my", True),
        ("um", True),
        ("", True),
        ("What is the capital of Australia?", False),
        ("Turn the lights on.", False),
        ("Set a timer for twenty minutes", False),
    ],
)
def test_looks_incomplete(text: str, incomplete: bool) -> None:
    assert looks_incomplete(text) is incomplete
