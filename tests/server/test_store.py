"""The fleet's shared store (server/store.py): two in-process nodes (tests/inproc.py)
and one real redis-server (tests/redis_server.py), never a mock of it."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import threading
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pytest
import redis
from websockets.asyncio.client import ClientConnection, connect

from clients.car import Car, CarOptions
from model.engine import ChatMessage, GenerationStats
from model.tools import Tool, ToolCall
from server import protocol as p
from server.app import Limits, ServerConfig
from server.auth import AuthConfig, owner_of
from server.protocol import ProtocolError
from server.resume import Parked
from server.store import Fleet, RedisStore, TextBudget, check_url
from server.turn import Pacing
from tests.inproc import ScriptedReplies, serving, started, until, within
from tests.redis_server import RedisServer

pytestmark = pytest.mark.models


def http(url: str, path: str) -> tuple[int, bytes]:
    """GET ``path`` of the server whose voice URL is ``url``."""
    base = url.replace("ws://", "http://").rsplit("/v1/", 1)[0]
    try:
        with urllib.request.urlopen(base + path, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


async def get(url: str, path: str) -> tuple[int, bytes]:
    return await asyncio.to_thread(http, url, path)


async def turn(ws: ClientConnection, text: str = "Where is Paris?") -> dict[str, Any]:
    await ws.send(json.dumps({"type": "text", "text": text}))
    return await asyncio.wait_for(until(ws, "reply_done"), 30)


async def first(url: str, **start: Any) -> tuple[ClientConnection, dict[str, Any]]:
    """A connection and its first message after ``start`` (ready, or an error)."""
    ws = await connect(url)
    await ws.send(json.dumps({"type": "start", "sample_rate": 16_000, **start}))
    return ws, json.loads(await ws.recv())


async def eventually(condition: Callable[[], bool], timeout_s: float = 10) -> None:
    """Wait for something a background task does (the store's once-a-second beat)."""
    async with asyncio.timeout(timeout_s):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.02)


def parked(server: RedisServer, token: str) -> dict[str, Any] | None:
    value = redis.Redis.from_url(server.url).get(f"quicksilver:parked:{token}")
    return None if value is None else json.loads(value)


async def test_a_conversation_parked_on_one_node_resumes_on_the_other_once(
    redis_server: RedisServer,
) -> None:
    config = ServerConfig(store=redis_server.url)
    async with serving(config=config) as (a, _), serving(config=config) as (b, _):
        ws, ready = await started(a)
        token = ready["resume_token"]
        assert token
        await turn(ws)
        await ws.close()
        await ws.wait_closed()
        again, resumed = await started(b, resume_token=token)
        assert resumed["resumed"] and resumed["history"] == 2
        await again.close()
        for node in (a, b):  # single use, fleet-wide
            ws, error = await first(node, resume_token=token)
            assert (error["type"], error["code"]) == ("error", "bad_resume_token")
            await ws.close()


async def test_every_completed_turn_is_in_redis_while_the_session_is_open(
    redis_server: RedisServer,
) -> None:
    """Write-through: the turn is in Redis before the client hears ``reply_done``, so
    the node may be lost right after it and the turn is kept."""
    config = ServerConfig(store=redis_server.url)
    async with serving(config=config) as (a, _), serving(config=config) as (b, _):
        ws, ready = await started(a)
        token = ready["resume_token"]
        done = await turn(ws)
        stored = parked(redis_server, token)  # no waiting: written before the done event
        assert stored is not None and stored["conversation"][1] == ["assistant", done["text"]]
        # the client moves to the other node while the first still holds the session
        moved, resumed = await started(b, resume_token=token)
        assert resumed["resumed"] and resumed["history"] == 2
        await turn(moved, "And Rome?")
        await moved.close()
        await ws.close()  # the old node's session ends: the spent token is not parked again
        await ws.wait_closed()
        await asyncio.sleep(0.2)
        assert parked(redis_server, token) is None
        replay, error = await first(a, resume_token=token)
        assert error["code"] == "bad_resume_token"
        await replay.close()
        # the moved session wrote its four messages under its own new token
        assert len((parked(redis_server, resumed["resume_token"]) or {})["conversation"]) == 4


MESSAGE = ToolCall("message.send", {"to": "my sister", "text": "I'm running late"})


@dataclass
class AsksToText:
    """A TextGenerator that texts the sister when asked to, and says "Okay." else."""

    name: str = "asks"
    supports_tools: bool = True

    def generate(
        self,
        conversation: Sequence[ChatMessage],
        max_tokens: int,
        should_stop: Callable[[], bool],
        tools: Sequence[Tool] = (),
    ) -> Generator[str | ToolCall, None, GenerationStats]:
        if tools and "text my sister" in conversation[-1].content.lower():
            yield MESSAGE
            yield "Sending it now."
        else:
            yield "Okay."
        return GenerationStats(3, 3, "end")


async def test_a_question_asked_on_one_node_is_answered_on_the_other(
    redis_server: RedisServer,
) -> None:
    """The question stands across the move: it is in Redis with the conversation,
    and the yes said to the other node sends the message (docs/actions.md)."""
    config = ServerConfig(store=redis_server.url)
    replies = AsksToText()
    async with (
        serving(replies=replies, config=config) as (a, _),
        serving(replies=replies, config=config) as (b, _),
    ):
        ws, ready = await started(a)
        done = await turn(ws, "Text my sister that I'm running late.")
        assert done["text"] == "Send 'I'm running late' to your sister?"
        stored = parked(redis_server, ready["resume_token"]) or {}
        assert stored["pending"] == {"name": MESSAGE.name, "arguments": dict(MESSAGE.arguments)}
        async with within(30, "the first node's close"):
            await ws.close()
            await ws.wait_closed()
        moved, resumed = await started(b, resume_token=ready["resume_token"])
        assert resumed["resumed"]
        await moved.send(json.dumps({"type": "text", "text": "Yes, please."}))
        action = await asyncio.wait_for(until(moved, "action"), 30)
        assert (action["name"], action["arguments"]) == (MESSAGE.name, dict(MESSAGE.arguments))
        async with within(30, "the second node's close"):
            await moved.close()


async def test_reply_done_waits_for_a_slow_write(redis_server: RedisServer) -> None:
    """Redis holds writes back for a moment (CLIENT PAUSE ... WRITE, well under the
    store's timeout): the client hears ``reply_done`` only once the turn is stored.
    Unpaced audio: the reply ends well inside the pause."""
    config = ServerConfig(store=redis_server.url, pacing=Pacing(lead_ms=60_000))
    async with serving(config=config) as (url, _):
        ws, ready = await started(url)
        await ws.send(json.dumps({"type": "text", "text": "Where is Paris?"}))
        redis.Redis.from_url(redis_server.url).execute_command("CLIENT", "PAUSE", 300, "WRITE")
        done = await asyncio.wait_for(until(ws, "reply_done"), 30)
        stored = parked(redis_server, ready["resume_token"])  # reads are not held back
        assert stored is not None and stored["conversation"][1] == ["assistant", done["text"]]
        await ws.close()


async def test_one_late_answer_is_not_redis_down_two_in_a_row_are(
    redis_server: RedisServer,
) -> None:
    """A Redis that answers late once (a busy host) keeps resume on; one that keeps
    answering late is down. SIGSTOP holds the real server past the call timeout."""
    store = RedisStore(redis_server.url, "n1", ttl_s=60)
    await store.beat({})
    assert store.ok
    assert redis_server.proc is not None
    pid = redis_server.proc.pid

    async def beat_while_redis_is_stopped() -> None:
        os.kill(pid, signal.SIGSTOP)
        try:
            await store.beat({})
        finally:
            os.kill(pid, signal.SIGCONT)

    await beat_while_redis_is_stopped()
    assert store.ok and store.slow == 1
    await store.beat({})  # answered in time: the count starts again
    assert store.ok and store.slow == 0
    await beat_while_redis_is_stopped()
    await beat_while_redis_is_stopped()
    assert not store.ok
    await store.beat({})
    assert store.ok  # back
    await store.leave()


async def test_another_owners_try_does_not_use_the_token_up(redis_server: RedisServer) -> None:
    store = RedisStore(redis_server.url, "n1", ttl_s=60)
    await store.beat({})
    assert store.ok
    said = [ChatMessage("user", "My PIN is 4321."), ChatMessage("assistant", "Noted.")]
    assert await store.put("tok", "owner-a", said) == "written"
    with pytest.raises(ProtocolError) as err:
        await store.take("tok", "owner-b")
    assert err.value.code == "bad_resume_token"
    assert await store.take("tok", "owner-a") == Parked(said)
    with pytest.raises(ProtocolError):
        await store.take("tok", "owner-a")
    assert await store.put("tok", "owner-a", said) == "taken"  # never parked again
    await store.leave()


async def test_a_question_the_user_had_not_answered_is_parked_with_it(
    redis_server: RedisServer,
) -> None:
    """The call the last reply asked about goes with the conversation (a yes after
    the resume makes it, on any node: docs/actions.md, "Asking first")."""
    store = RedisStore(redis_server.url, "n1", ttl_s=60)
    await store.beat({})
    message = ToolCall("message.send", {"to": "my sister", "text": "I'm running late"})
    said = [ChatMessage("user", "Text my sister."), ChatMessage("assistant", "Send it?")]
    assert await store.put("tok", "owner-a", said, message) == "written"
    assert await store.take("tok", "owner-a") == Parked(said, message)
    await store.leave()


async def test_the_registry_lists_live_nodes_and_counts_addresses_across_them(
    redis_server: RedisServer,
) -> None:
    limits = replace(Limits(), max_sessions_per_address=2)
    config = ServerConfig(store=redis_server.url, limits=limits)
    one = replace(config, node_id="node-one")
    async with serving(config=one) as (a, app_a), serving(config=config) as (b, app_b):
        assert app_b.shared is not None and app_a.shared is not None
        x, _ = await started(a)
        y, _ = await started(a)
        # node b hears of node a's two sessions from 127.0.0.1 within a beat
        await eventually(lambda: app_b.shared.fleet.addresses["127.0.0.1"] == 2)  # type: ignore[union-attr]
        assert app_b.shared.fleet.nodes["node-one"]["sessions"] == 2
        stats = json.loads((await get(b, "/stats"))[1])["store"]
        assert stats["ok"] and stats["others"] == ["node-one"]
        refused = await connect(b)
        await refused.wait_closed()
        assert refused.close_code == p.CloseCode.POLICY_VIOLATION
        await x.close()
        await y.close()
    await asyncio.sleep(0)
    assert redis.Redis.from_url(redis_server.url).get("quicksilver:node:node-one") is None


async def test_readyz_says_when_a_node_takes_no_new_sessions(redis_server: RedisServer) -> None:
    config = ServerConfig(store=redis_server.url, limits=replace(Limits(), max_sessions=1))
    async with serving(config=config) as (url, app):
        assert await get(url, "/readyz") == (200, b"ready\n")
        ws, _ = await started(url)
        status, body = await get(url, "/readyz")
        assert (status, json.loads(body)) == (503, {"ready": False, "reason": "full"})
        await ws.close()
        await eventually(lambda: not app.sessions)
        app.closing = True  # what drain() does first on SIGTERM
        status, body = await get(url, "/readyz")
        assert (status, json.loads(body)) == (503, {"ready": False, "reason": "draining"})


async def test_a_drained_node_parks_every_conversation_in_redis(
    redis_server: RedisServer,
) -> None:
    config = ServerConfig(store=redis_server.url)
    async with serving(config=config) as (a, app_a), serving(config=config) as (b, _):
        ws, ready = await started(a)
        await turn(ws)
        await app_a.drain(grace_s=5)
        await ws.wait_closed()
        assert ws.close_code == p.CloseCode.GOING_AWAY
        again, resumed = await started(b, resume_token=ready["resume_token"])
        assert resumed["resumed"] and resumed["history"] == 2
        await again.close()


async def test_a_node_serves_without_redis_and_recovers_when_it_returns(
    redis_server: RedisServer,
) -> None:
    config = ServerConfig(store=redis_server.url)
    async with serving(config=config) as (a, app_a), serving(config=config) as (b, app_b):
        assert app_a.shared is not None and app_b.shared is not None
        ws, ready = await started(a)
        await turn(ws)
        kept = ready["resume_token"]
        await eventually(lambda: parked(redis_server, kept) is not None)
        redis_server.kill()
        await eventually(lambda: not app_a.shared.ok and not app_b.shared.ok)  # type: ignore[union-attr]
        status, body = await get(a, "/healthz")
        assert (status, json.loads(body)) == (
            200,
            {"status": "ok", "store": "redis", "store_ok": False},
        )
        assert b"quicksilver_store_up 0.0" in (await get(a, "/metrics"))[1]
        assert (await get(a, "/readyz"))[0] == 200  # still takes new sessions
        # a turn goes on while Redis is down; a new session has no resume
        await turn(ws, "And Rome?")
        fresh, fresh_ready = await started(b)
        assert fresh_ready["resume_token"] == ""
        await turn(fresh)
        await fresh.close()
        other, error = await first(b, resume_token=kept)
        assert (error["type"], error["code"]) == ("error", "resume_unavailable")
        await other.close()
        redis_server.start()
        await eventually(lambda: app_a.shared.ok and app_b.shared.ok)  # type: ignore[union-attr]
        assert json.loads((await get(a, "/healthz"))[1])["store_ok"] is True
        # the next turn writes the whole conversation, the one made while Redis was down too
        await turn(ws, "And Madrid?")
        await eventually(
            lambda: len((parked(redis_server, kept) or {}).get("conversation", [])) == 6
        )
        await ws.close()
        await ws.wait_closed()
        again, resumed = await started(b, resume_token=kept)
        assert resumed["resumed"] and resumed["history"] == 6
        await again.close()


def test_the_store_option_takes_memory_or_a_redis_url() -> None:
    assert check_url("memory") == "memory"
    assert check_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    for bad in ("redis", "http://127.0.0.1:6379/0", "redis://", "/tmp/x"):
        with pytest.raises(ValueError):
            check_url(bad)


async def test_one_keys_sessions_count_across_the_fleet(redis_server: RedisServer) -> None:
    key, other = "test-key-0123456789abcdef", "other-key-0123456789abcdef"
    config = ServerConfig(
        store=redis_server.url,
        limits=replace(Limits(), max_sessions_per_key=1),
        auth=AuthConfig(api_keys=frozenset({key, other})),
    )
    async with serving(config=config) as (a, _), serving(config=config) as (b, app_b):
        assert app_b.shared is not None
        held = await connect(a, additional_headers={"Authorization": f"Bearer {key}"})
        await eventually(lambda: sum(app_b.shared.fleet.owners.values()) == 1)  # type: ignore[union-attr]
        second = await connect(b, additional_headers={"Authorization": f"Bearer {key}"})
        await second.wait_closed()
        assert second.close_code == p.CloseCode.POLICY_VIOLATION
        assert "API key" in (second.close_reason or "")
        ws = await connect(b, additional_headers={"Authorization": f"Bearer {other}"})
        await ws.send(json.dumps({"type": "start", "sample_rate": 16_000}))
        assert json.loads(await ws.recv())["type"] == "ready"
        await ws.close()
        await held.close()


async def test_a_turn_in_flight_is_not_written_until_it_completes(
    redis_server: RedisServer,
) -> None:
    """A node lost mid-reply: the client resumes with every completed turn, and the
    question in flight is not left in the history without its answer."""
    replies = ScriptedReplies()
    async with serving(replies=replies, config=ServerConfig(store=redis_server.url)) as (a, _):
        ws, ready = await started(a)
        token = ready["resume_token"]
        await turn(ws)
        await eventually(lambda: len((parked(redis_server, token) or {})["conversation"]) == 2)
        replies.hold, replies.started = True, threading.Event()
        await ws.send(json.dumps({"type": "text", "text": "And Rome?"}))
        await asyncio.to_thread(replies.started.wait, 30)  # the question is in the session
        await asyncio.sleep(0.2)  # time for a write, were one made
        assert len((parked(redis_server, token) or {})["conversation"]) == 2
        replies.go.set()
        await asyncio.wait_for(until(ws, "reply_done"), 30)
        await eventually(lambda: len((parked(redis_server, token) or {})["conversation"]) == 4)
        await ws.close()


async def test_one_keys_text_messages_count_across_the_fleet(redis_server: RedisServer) -> None:
    key = "test-key-0123456789abcdef"
    config = ServerConfig(
        store=redis_server.url,
        limits=replace(Limits(), text_per_minute_per_key=2),
        auth=AuthConfig(api_keys=frozenset({key})),
    )
    bearer = {"Authorization": f"Bearer {key}"}
    async with serving(config=config) as (a, app_a), serving(config=config) as (b, app_b):
        assert app_a.texts is not None and app_b.texts is not None and app_b.shared is not None
        app_a.texts.clock = app_b.texts.clock = lambda: 600.0  # one minute throughout
        x = await connect(a, additional_headers=bearer)
        await x.send(json.dumps({"type": "start", "sample_rate": 16_000}))
        await until(x, "ready")
        await turn(x)
        await turn(x, "And Rome?")
        await eventually(lambda: app_b.shared.fleet.texts[owner_of(key)] == 2)  # type: ignore[union-attr]
        y = await connect(b, additional_headers=bearer)
        await y.send(json.dumps({"type": "start", "sample_rate": 16_000}))
        await until(y, "ready")
        await y.send(json.dumps({"type": "text", "text": "And Madrid?"}))
        error = await asyncio.wait_for(until(y, "error"), 10)
        assert error["code"] == "rate_limited" and "API key" in error["message"]
        await x.close()
        await y.close()


def test_a_keys_text_budget_is_per_minute_and_counts_the_other_nodes() -> None:
    wall = [120.0]
    budget = TextBudget(3, clock=lambda: wall[0])
    others = Fleet(minute=2, texts=Counter({"k": 2}))
    assert budget.allow("k", others)
    assert not budget.allow("k", others)  # 1 here + 2 elsewhere
    assert budget.allow("other", others)
    stale = Fleet(minute=1, texts=Counter({"k": 5}))  # a minute that is over
    assert budget.allow("k", stale)
    wall[0] = 180.0  # the next minute starts over
    assert budget.report() == {"minute": 3, "owners": {}}
    assert budget.allow("k", others) and budget.allow("k", others)


async def test_a_redis_that_lost_its_data_gets_every_live_conversation_again(
    redis_server: RedisServer,
) -> None:
    async with serving(config=ServerConfig(store=redis_server.url)) as (a, app):
        assert app.shared is not None
        ws, ready = await started(a)
        token = ready["resume_token"]
        await turn(ws)
        await eventually(lambda: parked(redis_server, token) is not None)
        redis_server.kill()
        shutil.rmtree(redis_server.directory / "appendonlydir")  # a Redis without persistence
        await eventually(lambda: not app.shared.ok)  # type: ignore[union-attr]
        redis_server.start()
        await eventually(lambda: app.shared.ok)  # type: ignore[union-attr]
        assert parked(redis_server, token) is None
        await ws.send(bytes(640))  # any frame from the client: 20 ms of silence
        await eventually(lambda: parked(redis_server, token) is not None)
        assert len(parked(redis_server, token)["conversation"]) == 2  # type: ignore[index]
        await ws.close()


async def test_the_car_starts_a_new_conversation_while_resume_is_unavailable(
    redis_server: RedisServer,
) -> None:
    async with serving(config=ServerConfig(store=redis_server.url)) as (url, app):
        assert app.shared is not None
        redis_server.kill()
        await eventually(lambda: not app.shared.ok)  # type: ignore[union-attr]
        options = CarOptions(url, rate=16_000)
        async with Car(options, on_frame=lambda *_: None, resume_token="a-parked-token") as car:
            assert car.log.refused == ["resume_unavailable"]
            [ready] = car.log.readies
            assert not ready.resumed and ready.resume_token == ""
            assert car.resume_token is None  # nothing to resume with until Redis is back
