"""PassGate: the reply model's pause between forward passes (no models needed)."""

from __future__ import annotations

import threading

from server.speech import PassGate


def _waiter(gate: PassGate, stop: threading.Event) -> tuple[threading.Thread, threading.Event]:
    through = threading.Event()

    def run() -> None:
        gate.wait(stop.is_set, poll_s=0.005)
        through.set()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, through


def test_an_open_gate_lets_passes_through() -> None:
    gate = PassGate()
    assert not gate.held
    gate.wait(lambda: False)  # returns at once


def test_a_disabled_gate_never_holds() -> None:
    gate = PassGate(enabled=False)
    with gate.hold():
        assert not gate.held
        gate.wait(lambda: False)


def test_waiters_pass_only_when_every_holder_has_let_go() -> None:
    gate, stop = PassGate(), threading.Event()
    with gate.hold():
        with gate.hold():
            thread, through = _waiter(gate, stop)
            assert not through.wait(0.1)
        assert gate.held and not through.wait(0.1)  # the outer hold still holds
    thread.join(2)
    assert through.is_set() and not gate.held


def test_a_stopped_reply_does_not_wait_for_the_gate() -> None:
    gate, stop = PassGate(), threading.Event()
    with gate.hold():
        thread, through = _waiter(gate, stop)
        assert not through.wait(0.05)
        stop.set()
        thread.join(2)
        assert through.is_set() and gate.held


def test_a_failing_holder_still_opens_the_gate() -> None:
    gate = PassGate()
    try:
        with gate.hold():
            raise RuntimeError("synthesis failed")
    except RuntimeError:
        pass
    assert not gate.held
