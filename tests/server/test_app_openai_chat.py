"""The openai-chat engine in the real server (in-process, tests/inproc.py): a chat
server that fails gives the client the failed-turn error of each wire protocol, and
the session answers the next turn. The engine alone: tests/model/test_openai_chat.py;
against llama.cpp end to end: tests/e2e/test_openai_chat_llama.py."""

from __future__ import annotations

import asyncio
import json

import pytest
from websockets.asyncio.client import connect

from model.openai_chat import ChatServerOptions, OpenAIChatGenerator
from server.runtime import reply_threads
from tests.chatserver import DONE, Answer, ScriptedChatServer, chunk, closed_port
from tests.inproc import serving, started, until

pytestmark = pytest.mark.models

LOADING = json.dumps({"error": {"message": "the model is still loading"}}).encode()
PARIS = [chunk("Paris is the capital"), chunk(" of France."), chunk("", "stop"), DONE]


async def test_a_failing_chat_server_fails_the_turn_and_the_session_goes_on() -> None:
    answers = [Answer(503, body=LOADING), Answer(events=PARIS)]
    with ScriptedChatServer(answers).running() as chat:
        engine = OpenAIChatGenerator(ChatServerOptions(chat.url, "big-model"))
        async with serving(replies=engine) as (url, _):
            ws, _ = await started(url)
            await ws.send(json.dumps({"type": "text", "text": "What is the capital of France?"}))
            error = await asyncio.wait_for(until(ws, "error"), 30)
            assert error["code"] == "turn_failed"
            assert "503" in error["message"] and "the model is still loading" in error["message"]
            await ws.send(json.dumps({"type": "text", "text": "And now?"}))
            audio: list[bytes] = []
            done = await asyncio.wait_for(until(ws, "reply_done", audio), 30)
            assert done["text"] == "Paris is the capital of France." and audio
            await ws.close()
    # the second request carried the whole conversation, the failed question included
    said = [m["content"] for m in chat.requests[1].body["messages"][1:]]
    assert said[0] == "What is the capital of France?" and said[-1] == "And now?"


async def test_one_session_s_slow_reply_does_not_hold_up_another_s() -> None:
    """Session A's reply stalls after its first words (the server holds it open); session
    B's question is answered meanwhile, on a reply thread of its own. With one reply
    thread, as the local models have, B would wait out A's minute."""
    answers = [Answer(events=[chunk("Let me think")], hold=True), Answer(events=PARIS)]
    with ScriptedChatServer(answers).running() as chat:
        options = ChatServerOptions(chat.url, "big-model", first_token_timeout_s=60)
        threads = reply_threads("openai-chat")
        async with serving(replies=OpenAIChatGenerator(options), reply_threads=threads) as (
            url,
            _,
        ):
            a, _ = await started(url)
            b, _ = await started(url)
            await a.send(json.dumps({"type": "text", "text": "Tell me a long story."}))
            await asyncio.to_thread(chat.requested.wait, 30)  # A's request is the first
            await b.send(json.dumps({"type": "text", "text": "What is the capital of France?"}))
            done = await asyncio.wait_for(until(b, "reply_done"), 30)
            assert done["text"] == "Paris is the capital of France."
            assert not chat.client_gone.is_set()  # A's reply is still being written
            await a.close()
            await b.close()


async def test_a_chat_server_that_is_down_fails_the_realtime_response() -> None:
    engine = OpenAIChatGenerator(ChatServerOptions(f"http://127.0.0.1:{closed_port()}/v1", "m"))
    content = [{"type": "input_text", "text": "Hi"}]
    item = {"type": "message", "role": "user", "content": content}
    async with (
        serving(replies=engine) as (url, _),
        connect(url.replace("/v1/voice", "/v1/realtime")) as ws,
    ):
        await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
        await ws.send(json.dumps({"type": "response.create"}))
        done = await asyncio.wait_for(until(ws, "response.done"), 30)
        assert done["response"]["status"] == "failed"
        error = await asyncio.wait_for(until(ws, "error"), 30)
        assert error["error"]["code"] == "turn_failed"
        assert "refused the connection" in error["error"]["message"]
