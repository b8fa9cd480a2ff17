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
from tests.chatserver import DONE, Answer, ScriptedChatServer, call_chunk, chunk, closed_port
from tests.inproc import serving, started, until

pytestmark = pytest.mark.models

LOADING = json.dumps({"error": {"message": "the model is still loading"}}).encode()
PARIS = [chunk("Paris is the capital"), chunk(" of France."), chunk("", "stop"), DONE]
TIMER = {"type": "object", "properties": {"seconds": {"type": "integer", "minimum": 1}}}


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


TIMER_CALL = [call_chunk(0, "timer_set", '{"seconds": '), call_chunk(0, None, "300}", "tool_calls")]
BAD_CALL = [call_chunk(0, "timer_set", '{"seconds": "five minutes"}', "tool_calls"), DONE]


async def test_a_tool_call_is_an_action_and_its_result_goes_back_as_a_tool_message() -> None:
    answers = [Answer(events=[*TIMER_CALL, DONE]), Answer(events=PARIS)]
    with ScriptedChatServer(answers).running() as chat:
        engine = OpenAIChatGenerator(ChatServerOptions(chat.url, "big-model"))
        async with serving(replies=engine) as (url, _):
            ws, _ = await started(url, tools=[{"name": "timer.set", "parameters": TIMER}])
            await ws.send(json.dumps({"type": "text", "text": "Set a timer for five minutes."}))
            action = await asyncio.wait_for(until(ws, "action"), 30)
            assert action["name"] == "timer.set" and action["arguments"] == {"seconds": 300}
            await asyncio.wait_for(until(ws, "reply_done"), 30)
            result = {"type": "action_result", "call_id": action["call_id"], "output": "started"}
            await ws.send(json.dumps(result))
            await ws.send(json.dumps({"type": "text", "text": "Thanks."}))
            await asyncio.wait_for(until(ws, "reply_done"), 30)
            await ws.close()
    first, second = (r.body for r in chat.requests)
    assert [t["function"]["name"] for t in first["tools"]] == ["timer_set"]
    _, _, acted, tool, thanks = second["messages"]
    (call,) = acted["tool_calls"]
    assert call["function"] == {"name": "timer_set", "arguments": '{"seconds": 300}'}
    assert tool == {"role": "tool", "tool_call_id": call["id"], "content": "started"}
    assert thanks == {"role": "user", "content": "Thanks."}


async def test_a_call_after_the_model_s_words_acts_too() -> None:
    """OpenAI's models may speak before they call: the call comes once the stream is
    whole, and the client still gets it with the reply."""
    events = [chunk("Setting a five minute timer."), *TIMER_CALL, DONE]
    with ScriptedChatServer([Answer(events=events)]).running() as chat:
        engine = OpenAIChatGenerator(ChatServerOptions(chat.url, "big-model"))
        async with serving(replies=engine) as (url, _):
            ws, _ = await started(url)  # the default tools
            await ws.send(json.dumps({"type": "text", "text": "Set a timer for five minutes."}))
            action = await asyncio.wait_for(until(ws, "action"), 30)
            assert action["name"] == "timer.set" and action["arguments"] == {"seconds": 300}
            done = await asyncio.wait_for(until(ws, "reply_done"), 30)
            assert done["text"] == "Setting a five minute timer."
            await ws.close()


async def test_a_call_that_does_not_fit_its_schema_fails_the_turn_without_acting() -> None:
    with ScriptedChatServer([Answer(events=BAD_CALL)]).running() as chat:
        engine = OpenAIChatGenerator(ChatServerOptions(chat.url, "big-model"))
        async with serving(replies=engine) as (url, _):
            ws, _ = await started(url)  # the default tools
            await ws.send(json.dumps({"type": "text", "text": "Set a timer for five minutes."}))
            seen: list[str] = []
            while (message := json.loads(await asyncio.wait_for(ws.recv(), 30)))["type"] != "error":
                seen.append(message["type"])
            assert message["code"] == "turn_failed"
            assert "not acted on: timer.set: seconds must be integer" in message["message"]
            assert "action" not in seen, seen
            await ws.close()


async def test_a_tool_call_is_a_realtime_function_call() -> None:
    with ScriptedChatServer([Answer(events=[*TIMER_CALL, DONE])]).running() as chat:
        engine = OpenAIChatGenerator(ChatServerOptions(chat.url, "big-model"))
        tool = {"type": "function", "name": "timer.set", "parameters": TIMER}
        content = [{"type": "input_text", "text": "Set a timer for five minutes."}]
        item = {"type": "message", "role": "user", "content": content}
        async with (
            serving(replies=engine) as (url, _),
            connect(url.replace("/v1/voice", "/v1/realtime")) as ws,
        ):
            session = {"type": "realtime", "tools": [tool]}
            await ws.send(json.dumps({"type": "session.update", "session": session}))
            await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
            await ws.send(json.dumps({"type": "response.create"}))
            call = await asyncio.wait_for(until(ws, "response.function_call_arguments.done"), 30)
            assert call["name"] == "timer.set" and json.loads(call["arguments"]) == {"seconds": 300}
            done = await asyncio.wait_for(until(ws, "response.done"), 30)
            assert done["response"]["status"] == "completed"
