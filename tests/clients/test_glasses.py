"""The smart-glasses client against the real server, through a network that drops."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from audio.resample import float32_to_int16
from audio.speech import SpeechFactory, word_error_rate
from clients.common import ClientError, Pcm, read_wav
from clients.devices import WavMicrophone, WavSpeaker
from clients.glasses import Glasses, GlassesOptions
from server import protocol as p
from tests.speech import JAPAN

from .conftest import Proxy

pytestmark = [pytest.mark.e2e, pytest.mark.models]

QUESTION = JAPAN.text


async def test_glasses_reconnect_after_a_drop_and_finish_the_turn(
    proxy: Proxy, speech: SpeechFactory, tmp_path: Path
) -> None:
    """The connection is cut while the user speaks: reconnect, resume, ask again."""
    question = Pcm(float32_to_int16(speech.piper(QUESTION, lead_s=0.3)), 16000)
    events: list[p.ServerMessage] = []

    def on_frame(message: p.ServerMessage | None, _raw: str | bytes) -> None:
        if message is None:
            return
        events.append(message)
        if isinstance(message, p.SpeechStarted) and proxy.drops == 0:
            proxy.drop()

    out = tmp_path / "reply.wav"
    speaker = WavSpeaker(16000, out)
    glasses = Glasses(GlassesOptions(proxy.url, timeout_s=180), WavMicrophone(question), speaker)
    glasses.on_frame = on_frame
    results = await glasses.run()
    speaker.close()

    assert proxy.drops == 1 and proxy.accepted == 2 and glasses.connections == 2
    readies = [e for e in events if isinstance(e, p.Ready)]
    assert [r.resumed for r in readies] == [False, True]
    assert readies[0].resume_token != readies[1].resume_token  # tokens are single use
    [result] = results
    assert word_error_rate(QUESTION, result.transcript) <= 0.2, result.transcript
    JAPAN.check(result.reply)
    reply = read_wav(out)
    assert reply.rate == 16000 and reply.seconds > 0.3
    assert np.abs(reply.samples).max() > 1000


async def test_glasses_give_up_when_the_server_stays_away(proxy: Proxy) -> None:
    """After a drop the client retries with backoff, then says plainly what happened."""
    quiet = Pcm(np.zeros(16000 * 30, np.int16), 16000)
    events: list[p.ServerMessage] = []

    def on_frame(message: p.ServerMessage | None, _raw: str | bytes) -> None:
        if isinstance(message, p.Ready):
            events.append(message)
            proxy.refuse = True  # the server becomes unreachable ...
            proxy.drop()  # ... and the live connection goes

    options = GlassesOptions(proxy.url, timeout_s=60, retries=2)
    glasses = Glasses(options, WavMicrophone(quiet), WavSpeaker(16000), on_frame)
    with pytest.raises(ClientError, match="gave up after 2 reconnections"):
        await glasses.run()
    assert len(events) == 1
