"""Two nodes behind HAProxy with their conversations in Redis (docs/deploy.md): a node
killed mid-reply loses no completed turn, a drained node finishes its turns while new
sessions go to the other, and Redis going away turns resume off, not the service.

Everything is real: ``redis-server``, HAProxy 2.6 and two ``quicksilver serve``
processes with the default models (``quicksilver fleet``'s :class:`Fleet`), and the car
client talking synthesized speech through the balancer. Where this process may make
network namespaces (root; CI), each node runs in its own, reached over a veth link as
over a network; elsewhere the nodes listen on loopback ports.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from websockets.asyncio.client import ClientConnection, connect

from audio.resample import float32_to_int16
from audio.speech import SpeechFactory
from clients.car import Car, CarOptions
from clients.common import Pcm
from server import protocol as p
from server.fleet import Fleet, FleetOptions, http_status, netns_available
from tests.e2e.test_resume import FACT, RECALL  # a fact only the earlier turn gives
from tests.serverproc import next_event
from tests.speech import AUSTRALIA, ITALY, missing

pytestmark = [pytest.mark.e2e, pytest.mark.models, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def needs_fleet_tools() -> None:
    for tool in ("redis-server", "haproxy"):
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            missing(f"{tool} is not installed (apt-get install redis-server haproxy)")


def namespaces() -> bool:
    """Whether the nodes run in network namespaces: where this process may make them,
    and always in CI (root, iproute2 from .ci/run), where not being able to fails."""
    if netns_available():
        return True
    if os.environ.get("CI"):
        missing("network namespaces are not available (root, apt-get install iproute2)")
    return False


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, model_cache: Path) -> Iterator[Fleet]:
    needs_fleet_tools()
    run_dir = tmp_path_factory.mktemp("fleet")
    options = FleetOptions(
        nodes=2,
        port=0,
        run_dir=run_dir,
        serve_args=["--cache-dir", str(model_cache)],
        namespaces=namespaces(),
    )
    fleet = Fleet(options)
    try:
        fleet.up()
        if options.namespaces:  # each node on its own link, not on loopback
            assert {n.host for n in fleet.nodes} == {k.ns_address for k in fleet.links}
        yield fleet
    finally:
        fleet.down()


@pytest.fixture
def whole(fleet: Fleet) -> Iterator[Fleet]:
    """The fleet with both nodes and Redis up (a test before may have stopped one)."""
    if not fleet.redis.running:
        fleet.start_redis()
    for name, child in fleet.node_procs.items():
        if not child.running:
            fleet.start_node(name)
    wait_for(lambda: set(fleet.server_states().values()) == {"UP"}, "both nodes UP")
    yield fleet
    for name, child in fleet.node_procs.items():
        assert child.running or child.proc is None or child.proc.returncode in (0, -9), (
            f"{name} crashed: {child.tail()}"
        )


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    """Poll a condition seen from outside the processes (nothing there to wait on)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not {what} after {timeout_s:.0f} s"
        time.sleep(0.2)


def serving_node(fleet: Fleet) -> str:
    [(name, _)] = [(n, k) for n, k in fleet.serving().items() if k > 0]
    return name


def pcm(audio: np.ndarray) -> Pcm:
    return Pcm(float32_to_int16(audio), 16000)


async def test_a_node_killed_mid_reply_loses_no_completed_turn(
    whole: Fleet, speech: SpeechFactory
) -> None:
    fleet = whole
    victim: list[str] = []  # the node to kill when the reply starts arriving

    def on_frame(message: p.ServerMessage | None, raw: str | bytes) -> None:
        mid_reply = isinstance(message, p.ReplyText) or isinstance(raw, bytes)
        if victim and mid_reply:
            fleet.node_procs[victim.pop()].signal(signal.SIGKILL)  # an OOM kill, a lost VM

    # no tools: these questions get spoken answers only (no action turns in the way)
    options = CarOptions(fleet.url, rate=16000, turn_timeout_s=300, tools=[])
    async with Car(options, on_frame=on_frame) as car:
        await car.ask(pcm(speech.piper(FACT, lead_s=0.2)))
        first = await asyncio.to_thread(serving_node, fleet)
        victim.append(first)
        recall = await car.ask(pcm(speech.piper(RECALL.text, lead_s=0.2)))
        second = await asyncio.to_thread(serving_node, fleet)

    assert not victim, "the reply never started"
    assert fleet.node_procs[first].proc is not None
    assert fleet.node_procs[first].proc.wait(10) == -signal.SIGKILL
    assert second != first  # the balancer sent the reconnection to the other node
    assert car.log.drops == 1
    start, resumed = car.log.readies
    assert not start.resumed and resumed.resumed
    assert resumed.history == 2, resumed  # the completed turn: question and reply
    # asked again after the drop and answered on the other node from the turn before
    RECALL.check(recall.reply)


async def start(ws: ClientConnection, token: str | None = None) -> p.ServerMessage:
    await ws.send(p.encode(p.Start(sample_rate=16000, client="test", resume_token=token)))
    return await next_event(ws, 120)


async def reply_to(ws: ClientConnection, text: str) -> str:
    await ws.send(p.encode(p.Text(text)))
    while not isinstance(event := await next_event(ws, 300), p.ReplyDone):
        assert not isinstance(event, p.ReplyCancelled | p.Error), event
    return event.text


async def test_a_drained_node_finishes_its_turn_while_new_sessions_go_elsewhere(
    whole: Fleet,
) -> None:
    fleet = whole
    async with connect(fleet.url) as old:
        ready = await start(old)
        assert isinstance(ready, p.Ready) and ready.resume_token
        draining = await asyncio.to_thread(serving_node, fleet)
        [other] = [n for n in fleet.node_procs if n != draining]
        await old.send(p.encode(p.Text(ITALY.text)))
        while not isinstance(event := await next_event(old, 300), p.ReplyText):
            assert not isinstance(event, p.ReplyCancelled | p.Error), event
        fleet.node_procs[draining].signal(signal.SIGTERM)  # mid-reply
        await asyncio.to_thread(
            wait_for, lambda: fleet.server_states()[draining].startswith("DOWN"), "marked down", 30
        )
        async with connect(fleet.url) as new:  # while the old session still runs
            fresh = await start(new)
            assert isinstance(fresh, p.Ready) and not fresh.resumed, fresh
            assert (await asyncio.to_thread(fleet.serving)).get(other) == 1
        while not isinstance(event := await next_event(old, 300), p.ReplyDone):
            assert not isinstance(event, p.ReplyCancelled | p.Error), event
        ITALY.check(event.text)  # the turn in flight finished on the draining node
        await old.wait_closed()
    assert old.close_code == 1001  # going away: clients resume
    child = fleet.node_procs[draining]
    assert child.proc is not None and child.proc.wait(60) == 0

    async with connect(fleet.url) as ws:  # the client comes back through the balancer
        resumed = await start(ws, ready.resume_token)
    assert isinstance(resumed, p.Ready) and resumed.resumed, resumed
    assert resumed.history == 2  # the finished turn: question and reply


async def test_redis_down_turns_resume_off_and_back_on(whole: Fleet) -> None:
    fleet = whole
    async with connect(fleet.url) as ws:
        parked = await start(ws)
        assert isinstance(parked, p.Ready) and parked.resume_token
        await reply_to(ws, FACT)
        ws.transport.abort()  # dropped: the conversation waits in Redis

    fleet.stop_redis()
    names = list(fleet.node_procs)
    await asyncio.to_thread(wait_for, lambda: not any(store_ok(fleet, n) for n in names), "down")
    async with connect(fleet.url) as ws:
        ready = await start(ws)
        assert isinstance(ready, p.Ready) and ready.resume_token == "", ready  # resume off
        AUSTRALIA.check(await reply_to(ws, AUSTRALIA.text))  # the node still serves
    # a car coming back now cannot resume: it starts a new conversation, without a token
    options = CarOptions(fleet.url, tools=[])
    async with Car(options, on_frame=lambda *_: None, resume_token=parked.resume_token) as car:
        assert car.log.refused == ["resume_unavailable"]
        [fresh] = car.log.readies
        assert not fresh.resumed and fresh.resume_token == ""

    fleet.start_redis()  # the same append-only file: what was parked is still there
    # (the refused car above did not use the token up)
    await asyncio.to_thread(wait_for, lambda: all(store_ok(fleet, n) for n in names), "back")
    async with connect(fleet.url) as ws:
        resumed = await start(ws, parked.resume_token)
    assert isinstance(resumed, p.Ready) and resumed.resumed and resumed.history == 2, resumed
    assert resumed.resume_token  # resume on again
    assert all(child.running for child in fleet.node_procs.values())  # nothing crashed


def store_ok(fleet: Fleet, name: str) -> bool:
    health = fleet.node_json(name, "/healthz")
    assert health is not None, f"{name} does not answer /healthz"
    return bool(health["store_ok"])


def test_fleet_up_prints_one_url_and_stops_everything_on_sigterm(model_cache: Path) -> None:
    """``quicksilver fleet up`` as a newcomer runs it (one node, to keep it short), with
    ``--netns`` where the machine allows it: the namespace goes with the fleet."""
    needs_fleet_tools()
    isolated = namespaces()
    argv = [sys.executable, "-m", "cli", "fleet", "up", "--nodes", "1", "--port", "0"]
    argv += ["--netns"] if isolated else []
    argv += ["--", "--cache-dir", str(model_cache)]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("  HAProxy config"):
                break
        url = next(m.group(1) for ln in lines if (m := re.search(r"fleet on (ws://\S+)", ln)))
        node = next(m.group(1) for ln in lines if (m := re.search(r"node1 (http://\S+)", ln)))
        balancer = url.replace("ws://", "http://").removesuffix("/v1/voice")
        assert http_status(balancer + "/readyz") == 200  # through HAProxy to the node
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and "fleet stopped." in rest, rest
    assert http_status(node + "/healthz") is None  # the node is gone
    assert http_status(balancer + "/readyz") is None  # and the balancer
    if isolated:
        [netns] = [m.group(1) for ln in lines if (m := re.search(r"namespace (\S+),", ln))]
        assert node.startswith("http://169.254.")
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
        assert netns not in listed.stdout  # and its namespace
