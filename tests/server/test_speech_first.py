"""SpeechFirst: when a reply's model may start its next forward pass (no models needed).

A model thread here is a plain thread calling ``ReplyPasses.wait``, watched
(tests/passes.py) so that the test acts only once it sleeps.
"""

from __future__ import annotations

import threading

from server.speech import SpeechFirst
from tests.passes import LONG, Watched


def _waiting(passes: Watched) -> threading.Thread:
    """A model thread waiting at ``passes``, already asleep when this returns."""
    passes.expect_wait()
    thread = threading.Thread(target=passes.wait)
    thread.start()
    assert passes.asleep()
    return thread


def test_a_reply_passes_while_nothing_holds_it() -> None:
    passes = SpeechFirst().reply(speaks=True)
    assert passes.ready()
    passes.wait()  # returns at once


def test_in_lockstep_a_pass_waits_until_the_consumer_took_every_piece() -> None:
    passes = Watched(SpeechFirst())
    passes.wrote()
    passes.wrote()
    thread = _waiting(passes)
    passes.took()
    assert not passes.ready()  # one piece still untaken
    passes.took()
    thread.join(LONG)
    assert not thread.is_alive() and passes.ready()


def test_released_the_model_runs_ahead_of_its_consumer() -> None:
    passes = Watched(SpeechFirst())
    passes.wrote()
    thread = _waiting(passes)
    passes.release()  # the first phrase is synthesized
    thread.join(LONG)
    assert not thread.is_alive()
    passes.wrote()
    assert passes.ready()


def test_a_reply_that_is_not_spoken_does_not_wait_for_its_consumer() -> None:
    passes = SpeechFirst().reply(speaks=False)
    passes.wrote()
    assert passes.ready()


def test_a_first_phrase_being_synthesized_holds_every_reply() -> None:
    speech = SpeechFirst()
    mine, text_only = Watched(speech), Watched(speech, lockstep=False)
    with speech.synthesizing():
        assert speech.holding and not mine.ready() and not text_only.ready()
        threads = [_waiting(mine), _waiting(text_only)]
        with speech.synthesizing():  # a second session's first phrase
            pass
        assert speech.holding and not text_only.ready()  # the outer one still holds
    for thread in threads:
        thread.join(LONG)
        assert not thread.is_alive()
    assert not speech.holding


def test_a_closed_reply_stops_waiting() -> None:
    """A cancelled reply must not wait for someone else's speech."""
    speech = SpeechFirst()
    passes = Watched(speech)
    with speech.synthesizing():
        thread = _waiting(passes)
        passes.close()
        thread.join(LONG)
        assert not thread.is_alive() and speech.holding
        assert passes.ready()


def test_disabled_nothing_waits() -> None:
    """A GPU host: the model does not need the cores."""
    speech = SpeechFirst(enabled=False)
    passes = speech.reply(speaks=True)
    passes.wrote()
    with speech.synthesizing():
        assert not speech.holding and passes.ready()
        passes.wait()


def test_a_failing_synthesis_still_lets_the_models_go() -> None:
    speech = SpeechFirst()
    try:
        with speech.synthesizing():
            raise RuntimeError("synthesis failed")
    except RuntimeError:
        pass
    assert not speech.holding and speech.reply(speaks=False).ready()
