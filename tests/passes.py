"""The real pauses of a reply's model (``server.speech.ReplyPasses``), watched.

:class:`Watched` notes when a model thread has found it may not pass. That thread holds
the condition's lock until it sleeps in ``Condition.wait``, and every method that could
let it go takes that lock, so whatever a test does once :meth:`Watched.asleep` returns
happens while the model sleeps: only a notification can wake it, and no assertion
depends on how long anything takes.
"""

from __future__ import annotations

import threading

from server.speech import ReplyPasses, SpeechFirst

LONG = 30  # seconds a waiter is given: only a lost wake-up (a failure) takes that long


class Watched(ReplyPasses):
    def __init__(self, speech_first: SpeechFirst, lockstep: bool = True) -> None:
        super().__init__(speech_first, lockstep)
        self._refused = threading.Event()

    def _may_pass(self) -> bool:
        ok = super()._may_pass()
        if not ok:
            self._refused.set()
        return ok

    def expect_wait(self) -> None:
        """Call before the model thread's next wait: :meth:`asleep` then waits for it
        (a test's own ``ready()`` calls may already have been refused)."""
        self._refused.clear()

    def asleep(self) -> bool:
        """Whether a model thread has been refused (and is asleep) since
        :meth:`expect_wait`, waiting up to :data:`LONG` for it."""
        return self._refused.wait(LONG)
