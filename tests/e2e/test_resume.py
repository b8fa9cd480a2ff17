"""A conversation survives a dropped connection: the client resumes with its token and
the reply model still has the earlier turns (docs/protocol.md, Resumption)."""

from __future__ import annotations

import pytest
from websockets.asyncio.client import ClientConnection, connect

from server import protocol as p
from tests.serverproc import ServerProcess, next_event
from tests.speech import Question

pytestmark = [pytest.mark.e2e, pytest.mark.models]

# Told the user's brother's name, the served default model answers "My brother's name is
# Peter."; asked without that turn it makes one up ("My brother's name is Alex."), so
# only a reply that was given the earlier turn passes. Whisper hears both sentences
# exactly from Piper, so the spoken tests (test_fleet.py) use them too. The words are
# the ones the reply can copy: a 135M model's greedy reply turns on near ties, and on
# the AMD EPYC with AVX2 only "My brother is called Peter." then "What is my brother
# called?" was answered "My brother is Alex." (docs/results/2026-12-avx2-host.md).
# ("I live in Toronto." is taken for a message to send to Toronto: issue 39.)
FACT = "My brother's name is Peter."
RECALL = Question("What is my brother's name?", ("Peter",))


async def start(ws: ClientConnection, token: str | None = None) -> p.ServerMessage:
    await ws.send(p.encode(p.Start(sample_rate=16000, client="test", resume_token=token)))
    return await next_event(ws, 120)


async def reply_to(ws: ClientConnection, text: str) -> str:
    await ws.send(p.encode(p.Text(text)))
    while not isinstance(event := await next_event(ws, 120), p.ReplyDone):
        assert not isinstance(event, p.ReplyCancelled | p.Error), event
    return event.text


async def test_the_conversation_survives_a_drop_and_a_resume(server: ServerProcess) -> None:
    async with connect(server.url) as ws:
        first = await start(ws)
        assert isinstance(first, p.Ready) and not first.resumed and first.history == 0
        await reply_to(ws, FACT)
        ws.transport.abort()  # the network goes: no close frame
    await server.idle_stats()  # the server saw the drop and parked the conversation

    async with connect(server.url) as ws:
        resumed = await start(ws, first.resume_token)
        assert isinstance(resumed, p.Ready), resumed
        answer = await reply_to(ws, RECALL.text)
    assert resumed.resumed and resumed.history == 2  # the user's turn and the reply
    assert resumed.resume_token not in ("", first.resume_token)
    RECALL.check(answer)

    async with connect(server.url) as ws:
        refused = await start(ws, first.resume_token)  # tokens are single use
        assert isinstance(refused, p.Error) and refused.code == "bad_resume_token", refused
        fresh = await start(ws)
        assert isinstance(fresh, p.Ready) and not fresh.resumed and fresh.history == 0
        guess = await reply_to(ws, RECALL.text)
    assert not RECALL.answered_by(guess), f"guessed without the history: {guess!r}"
