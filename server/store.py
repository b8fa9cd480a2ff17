"""What must outlive one node, in Redis: parked conversations, the node registry,
session counts per address and per API key (docs/security.md, "Several nodes").

``quicksilver serve --store redis://HOST:PORT/DB`` gives every node of a fleet one
:class:`RedisStore`; the default (``memory``) keeps today's in-process
:class:`server.resume.ResumeStore` and none of this runs. The session stays sans-I/O:
the connection takes a resumed conversation from Redis before the session sees
``start`` and writes the conversation after it changes (:class:`Parking`).

Redis is never on the path of a turn: every call has a short timeout, one background
task (:meth:`RedisStore.run`) pings it and flips :attr:`RedisStore.ok`, and while it is
down a node serves new sessions without resume and counts its limits by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeout

from model.engine import ChatMessage
from model.tools import ToolCall

from .protocol import ProtocolError
from .resume import Parked, _role, call_from, call_json

log = logging.getLogger("quicksilver.store")

# What Redis being unreachable, slow or restarting looks like to redis-py.
_DOWN = (RedisError, OSError, TimeoutError)

PREFIX = "quicksilver:"
TIMEOUT_S = 0.5  # connect and read: Redis on the same network answers in a millisecond
BEAT_S = 1.0  # ping, heartbeat and the fleet's counts, this often
NODE_TTL_S = 3 * BEAT_S  # a node that stops beating leaves the registry after this
# A refused connection means Redis is down; a call that only timed out may be a busy
# host (a model build, a loaded CI machine): down after this many in a row, so one
# slow answer does not leave the sessions starting in that second without resume.
SLOW_CALLS_DOWN = 2

# Taken at most once, by its owner only: another owner's try leaves the token good.
# The taken mark stops a live session on the node the client left from parking the
# conversation again under the spent token (a replay).
_TAKE = """
local value = redis.call('GET', KEYS[1])
if not value then return {0, false} end
if cjson.decode(value)['owner'] ~= ARGV[1] then return {1, false} end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
return {2, value}
"""
_PUT = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""


Put = Literal["written", "taken", "down"]


def check_url(url: str) -> str:
    """``memory``, or a ``redis://`` URL (ValueError otherwise)."""
    if url == "memory":
        return url
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        raise ValueError(f"--store: 'memory' or redis://HOST:PORT/DB, not {url!r}")
    return url


@dataclass
class Fleet:
    """What the other live nodes reported in their last heartbeats."""

    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    addresses: Counter[str] = field(default_factory=Counter)  # sessions per address
    owners: Counter[str] = field(default_factory=Counter)  # per API key fingerprint
    minute: int = 0  # the wall-clock minute of ``texts``
    texts: Counter[str] = field(default_factory=Counter)  # text messages per key


class RedisStore:
    """One node's view of the fleet's Redis."""

    def __init__(self, url: str, node_id: str, ttl_s: float) -> None:
        self.url = url
        self.node_id = node_id
        self.ttl_s = ttl_s
        self.ok = False  # the last ping answered
        self.slow = 0  # calls in a row that timed out while Redis was up
        self.epoch = 0  # times Redis came (back) up
        self.fleet = Fleet()
        self.live: set[str] = set()  # tokens of this node's sessions, refreshed by beats
        self.redis = Redis.from_url(
            url,
            socket_timeout=TIMEOUT_S,
            socket_connect_timeout=TIMEOUT_S,
            retry=Retry(NoBackoff(), 0),  # a failure is reported, never waited out
        )
        self._take = self.redis.register_script(_TAKE)
        self._put = self.redis.register_script(_PUT)

    def stats(self) -> dict[str, object]:
        """For /stats: whether Redis answers, and the other live nodes."""
        return {
            "kind": "redis",
            "ok": self.ok,
            "node": self.node_id,
            "others": sorted(self.fleet.nodes),
        }

    # -- conversations --

    async def take(self, token: str, owner: str) -> Parked:
        """The conversation parked under ``token`` (and the question its last reply
        asked, if it stood: ``server.resume.Parked``), removed: once, by its owner.
        ProtocolError says why not (``resume_unavailable`` while Redis is down)."""
        if not self.ok:
            raise _unavailable()
        try:
            found, value = await self._take(
                keys=[_parked(token), _taken(token)], args=[owner, _ms(self.ttl_s)]
            )
        except _DOWN as exc:
            self._failed("take", exc)
            raise _unavailable() from exc
        if found != 2:
            raise ProtocolError("bad_resume_token", "unknown resume token; start a new session")
        data = json.loads(value)
        conversation = [ChatMessage(_role(r), str(c)) for r, c in data["conversation"]]
        return Parked(conversation, call_from(data.get("pending")))

    async def put(
        self,
        token: str,
        owner: str,
        conversation: Sequence[ChatMessage],
        pending: ToolCall | None = None,
    ) -> Put:
        """Park ``conversation`` (and ``pending``, the call its last reply asked about)
        under ``token`` for the resume TTL, unless the token was taken already (the
        client resumed elsewhere)."""
        if not self.ok or self.ttl_s <= 0:
            return "down"
        value = json.dumps(
            {
                "owner": owner,
                "node": self.node_id,
                "conversation": [[m.role, m.content] for m in conversation],
                "pending": call_json(pending),
            }
        )
        try:
            written = await self._put(
                keys=[_parked(token), _taken(token)], args=[value, _ms(self.ttl_s)]
            )
        except _DOWN as exc:
            self._failed("put", exc)
            return "down"
        return "written" if written else "taken"

    # -- the node's life --

    async def run(self, report: Callable[[], Mapping[str, Any]]) -> None:
        """Ping, beat and read the fleet every BEAT_S until cancelled; ``report`` is
        this node's entry in the registry (sessions, draining, per-address counts)."""
        while True:
            try:
                await self.beat(report())
            except Exception as exc:  # a bug: logged, and the beat goes on
                log.exception("store: heartbeat failed")
                self._failed("heartbeat", exc)
            await asyncio.sleep(BEAT_S)

    async def beat(self, entry: Mapping[str, Any]) -> None:
        try:
            await self.redis.ping()
            was, self.ok, self.slow = self.ok, True, 0
            if not was:
                self.epoch += 1  # what Redis held may be gone: every session writes again
                log.info("store: Redis at %s is up", _safe(self.url))
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.set(_node(self.node_id), json.dumps(dict(entry)), px=_ms(NODE_TTL_S))
                for token in self.live:
                    pipe.pexpire(_parked(token), _ms(self.ttl_s))
                await pipe.execute()
            self.fleet = await self._read_fleet()
        except _DOWN as exc:
            self._failed("heartbeat", exc)

    async def _read_fleet(self) -> Fleet:
        keys = [k async for k in self.redis.scan_iter(match=_node("*"), count=100)]
        fleet = Fleet()
        for key, value in zip(keys, await self.redis.mget(keys) if keys else [], strict=True):
            node = key.decode()[len(_node("")) :]
            if value is None or node == self.node_id:
                continue
            try:
                _count_in(fleet, node, json.loads(value))
            except (ValueError, TypeError, AttributeError) as exc:  # not a node's entry
                log.debug("store: ignoring the registry entry of %r: %r", node, exc)
        return fleet

    async def leave(self) -> None:
        """Out of the registry (a clean shutdown), then the connections closed."""
        if self.ok:
            with contextlib.suppress(Exception):
                await self.redis.delete(_node(self.node_id))
        with contextlib.suppress(Exception):
            await self.redis.aclose()

    def _failed(self, what: str, exc: BaseException) -> None:
        if self.ok and isinstance(exc, RedisTimeout | TimeoutError):
            self.slow += 1
            if self.slow < SLOW_CALLS_DOWN:
                log.info("store: Redis at %s answered late (%s)", _safe(self.url), what)
                return
        if self.ok:
            log.warning(
                "store: Redis at %s is down (%s: %r); resume is off", _safe(self.url), what, exc
            )
        self.ok = False
        self.fleet = Fleet()  # nobody else's counts while we cannot see them


class TextBudget:
    """``text`` messages of one API key per wall-clock minute, on every node together:
    this node's count of the minute plus what the others reported in their beats (a
    beat late at most). Sessions of other keys, and the sessions' own rate, are apart."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.time) -> None:
        self.per_minute = per_minute
        self.clock = clock  # wall-clock seconds: every node's minutes are the same
        self.minute = 0
        self.here: Counter[str] = Counter()  # this minute, on this node

    def allow(self, owner: str, elsewhere: Fleet | None) -> bool:
        """Count one message of ``owner`` in, unless its minute's budget is spent."""
        self._roll()
        others = elsewhere.texts[owner] if elsewhere and elsewhere.minute == self.minute else 0
        if self.here[owner] + others >= self.per_minute:
            return False
        self.here[owner] += 1
        return True

    def report(self) -> dict[str, object]:
        """This node's counts, for its registry entry."""
        self._roll()
        return {"minute": self.minute, "owners": dict(self.here)}

    def _roll(self) -> None:
        if (minute := int(self.clock() // 60)) != self.minute:
            self.minute, self.here = minute, Counter()


class Parking:
    """One connection's conversation in a :class:`RedisStore`: taken before the
    session sees a resuming ``start``, written whenever it changes (each turn), and
    once more when the connection closes."""

    def __init__(self, store: RedisStore, owner: str, token: str) -> None:
        self.store = store
        self.owner = owner
        self._offered = token  # the session's token, if Redis is up when it starts
        self.token = ""  # the token written under: "" until it starts with Redis up
        # the conversation (and pending call) last handed to a write
        self._mark: tuple[int, int, int, int] | None = None
        self._queued: tuple[list[ChatMessage], ToolCall | None] | None = None
        self._writer: asyncio.Task[None] | None = None

    def begin(self) -> str:
        """The session is starting: its resume token, or "" (no resume) while Redis
        is down, in which case nothing of it is ever written."""
        self.store.live.discard(self.token)
        self.token = self._offered if self.store.ok else ""
        if self.token:
            self.store.live.add(self.token)
        return self.token

    def changed(
        self, conversation: list[ChatMessage], pending: ToolCall | None = None, final: bool = False
    ) -> None:
        """Called after every batch of effects: writes the conversation, and the call
        its last reply asked about (``pending``), in the background when they are not
        the ones written last (cheap when they are). A turn's question is written with
        its reply, when the turn completes; a node lost in between loses the turn in
        flight, as a client that resumes expects."""
        if not self.token or not self.store.ok:
            return  # Redis back: the next batch of effects writes the whole conversation
        if not final and conversation and conversation[-1].role == "user":
            return
        last = id(conversation[-1]) if conversation else 0
        mark = (self.store.epoch, len(conversation), last, id(pending))
        if mark == self._mark:
            return
        self._mark = mark
        self._queued = (list(conversation), pending)
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write())

    async def _write(self) -> None:
        while (queued := self._queued) is not None:
            self._queued = None
            match await self.store.put(self.token, self.owner, *queued):
                case "down":
                    self._mark = None  # not written: the next change writes it again
                    return
                case "taken":  # resumed elsewhere: this session's token is spent
                    self.store.live.discard(self.token)
                    self.token = ""
                    return

    async def written(
        self, conversation: list[ChatMessage], pending: ToolCall | None = None
    ) -> None:
        """A completed turn, durable before the client is told it is done: a node
        lost after a ``reply.done`` must not lose that turn. Waits at most as long as
        a write may take; Redis down, it does not wait at all."""
        self.changed(conversation, pending)
        await self._settled()

    async def _settled(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._writer), 2 * TIMEOUT_S)

    async def close(
        self, conversation: list[ChatMessage] | None, pending: ToolCall | None = None
    ) -> None:
        """The connection ended: its conversation (None: it never started), as the
        session parked it, is written one last time before the connection counts as
        closed."""
        if conversation is not None:
            self._mark = None
            self.changed(conversation, pending, final=True)
        await self._settled()
        self.store.live.discard(self.token)


def _count_in(fleet: Fleet, node: str, entry: dict[str, Any]) -> None:
    """Add one node's registry entry (App.registry_entry) to ``fleet``."""
    fleet.nodes[node] = entry
    fleet.addresses.update(entry.get("addresses", {}))
    fleet.owners.update(entry.get("owners", {}))
    texts = entry.get("texts") or {}
    minute = int(texts.get("minute", 0))
    if minute > fleet.minute:  # counts of an older minute no longer count
        fleet.minute, fleet.texts = minute, Counter()
    if minute == fleet.minute:
        fleet.texts.update(texts.get("owners", {}))


def _unavailable() -> ProtocolError:
    return ProtocolError(
        "resume_unavailable", "resume is unavailable right now; start a new session"
    )


def _parked(token: str) -> str:
    return f"{PREFIX}parked:{token}"


def _taken(token: str) -> str:
    return f"{PREFIX}taken:{token}"


def _node(node_id: str) -> str:
    return f"{PREFIX}node:{node_id}"


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def _safe(url: str) -> str:
    """The URL without a password, for logs."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    return f"{parts.scheme}://{host}:{parts.port or 6379}{parts.path}"
