"""The car client: push-to-talk at 8 kHz, a tunnel, and resumption with its token."""

from __future__ import annotations

import numpy as np
import pytest

from audio.resample import float32_to_int16
from audio.speech import SpeechFactory, word_error_rate
from clients.car import Car, CarOptions
from clients.common import Pcm
from tests.speech import AUSTRALIA, SPIDER

from .conftest import Proxy, ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.models]

FIRST, SECOND = AUSTRALIA.text, SPIDER.text


def pcm(audio: np.ndarray) -> Pcm:
    return Pcm(float32_to_int16(audio), 16000)


async def test_push_to_talk_then_a_tunnel_then_resume(proxy: Proxy, speech: SpeechFactory) -> None:
    """No trailing silence is ever sent: only end_of_input can end these turns."""
    options = CarOptions(proxy.url, rate=8000, turn_timeout_s=180)
    quiet = lambda *_: None  # noqa: E731
    async with Car(options, on_frame=quiet) as car:
        first = await car.ask(pcm(speech.piper(FIRST, lead_s=0.2)))
        proxy.drop()  # into the tunnel
        second = await car.ask(pcm(speech.piper(SECOND, lead_s=0.2)))

    assert word_error_rate(FIRST, first.transcript) <= 0.25, first.transcript
    assert word_error_rate(SECOND, second.transcript) <= 0.25, second.transcript
    AUSTRALIA.check(first.reply)
    SPIDER.check(second.reply)
    assert len(first.audio) > 16000 and len(second.audio) > 16000
    assert car.log.drops == 1 and proxy.accepted == 2
    readies = car.log.readies
    assert [r.input_sample_rate for r in readies] == [8000, 8000]
    assert [r.resumed for r in readies] == [False, True]  # the same conversation goes on


async def test_a_wrong_resume_token_is_refused_and_a_new_session_starts(
    server: ServerProcess,
) -> None:
    options = CarOptions(server.url, rate=16000)
    async with Car(options, on_frame=lambda *_: None, resume_token="not-a-real-token") as car:
        assert car.log.refused == ["bad_resume_token"]
        [ready] = car.log.readies
        assert not ready.resumed and ready.resume_token not in ("", "not-a-real-token")
        assert car.resume_token == ready.resume_token
