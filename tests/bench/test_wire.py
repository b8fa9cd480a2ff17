"""bench.wire runs a whole turn through both wires (its figures are not judged)."""

from __future__ import annotations

from bench.wire import one_turn


def test_both_wires_carry_a_turn_to_its_first_audio() -> None:
    for kind in ("v1", "realtime"):
        path, whole = one_turn(kind, seconds=0.5)
        assert 0 < path <= whole
