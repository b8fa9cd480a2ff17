"""The clients' action handler (clients/actions.py) on a clock the test moves, and the
glasses and car clients carrying out actions from a scripted peer."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from clients.actions import Actions, chime, finish_actions, spoken_duration, tools_option
from clients.car import Car, CarOptions
from clients.common import Pcm, read_wav
from clients.devices import WavMicrophone, WavSpeaker
from clients.glasses import Glasses, GlassesOptions
from model.tools import DEFAULT_TOOLS
from server import protocol as p
from tests.serverproc import ROOT

from .scripted import scripted_server


class FakeClock:
    """``clock()`` and ``sleep()`` for the handler: time moves only in :meth:`advance`,
    which wakes the sleepers whose time has come; ``asleep`` is set once one sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleepers: list[tuple[float, asyncio.Future[None]]] = []
        self.asleep = asyncio.Event()

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            return
        wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.sleepers.append((self.now + seconds, wake))
        self.asleep.set()
        await wake

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for at, wake in self.sleepers:
            if at <= self.now and not wake.done():
                wake.set_result(None)


class Recorder:
    """The handler's JSON lines, and an event per line type to wait on."""

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []
        self.seen: dict[str, asyncio.Event] = {}

    def __call__(self, line: dict[str, Any]) -> None:
        json.dumps(line)  # each line must print as JSON
        self.lines.append(line)
        self.saw(line["type"]).set()

    def saw(self, kind: str) -> asyncio.Event:
        return self.seen.setdefault(kind, asyncio.Event())

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [line for line in self.lines if line["type"] == kind]


def action(name: str, call_id: str = "call_1", turn_id: int = 1, **arguments: Any) -> p.Action:
    return p.Action(turn_id, call_id, name, arguments)


def handler(tools: list[Any] | None = None, sounds: WavSpeaker | None = None) -> Any:
    clock, lines = FakeClock(), Recorder()
    return Actions(tools, sounds, lines, clock.sleep, clock), clock, lines


async def test_a_timer_counts_down_and_rings_with_a_chime(tmp_path: Path) -> None:
    speaker = WavSpeaker(16000, tmp_path / "out.wav")
    actions, clock, lines = handler(sounds=speaker)
    result = await actions.carry_out(action("timer.set", seconds=300))
    assert result == p.ActionResult("call_1", "Timer set for 5 minutes.")
    await clock.asleep.wait()  # the countdown runs
    assert lines.of("action_result") == [
        {"type": "action_result", "call_id": "call_1", "name": "timer.set",
         "output": "Timer set for 5 minutes."}
    ]  # fmt: skip
    clock.advance(299)
    assert actions.left_s() == 1 and not lines.of("timer_done")  # its sleep is not over
    clock.advance(1)
    await actions.wait()
    assert lines.of("timer_done") == [{"type": "timer_done", "call_id": "call_1", "seconds": 300}]
    assert actions.left_s() is None
    speaker.close()
    assert read_wav(tmp_path / "out.wav").samples.tobytes() == chime(16000)


async def test_a_new_timer_replaces_the_running_one_and_cancel_stops_it() -> None:
    actions, clock, lines = handler()
    await actions.carry_out(action("timer.set", "call_1", seconds=300))
    first = actions.timer.task
    clock.advance(100)
    replaced = await actions.carry_out(action("timer.set", "call_2", seconds=60))
    assert (
        replaced.output == "Timer set for 1 minute, replacing one with 3 minutes 20 seconds left."
    )
    assert first.cancelled()
    clock.advance(15)
    cancel = await actions.carry_out(action("timer.cancel", "call_3", turn_id=2))
    assert cancel == p.ActionResult("call_3", "Timer cancelled with 45 seconds left.")
    again = await actions.carry_out(action("timer.cancel", "call_4", turn_id=3))
    assert again.output == "No timer was running."
    clock.advance(1000)
    await actions.wait()
    assert not lines.of("timer_done") and all(wake.cancelled() for _, wake in clock.sleepers)
    assert [line["call_id"] for line in lines.of("action_result")] == [
        f"call_{i}" for i in (1, 2, 3, 4)
    ]


async def test_a_timer_on_the_event_loop_rings() -> None:
    """The real asyncio countdown, a thousand times faster than the wall clock."""
    lines = Recorder()
    actions = Actions(emit=lines, sleep=lambda s: asyncio.sleep(s / 1000))
    await actions.carry_out(action("timer.set", seconds=2))
    await asyncio.wait_for(lines.saw("timer_done").wait(), 30)
    assert lines.of("timer_done")[0]["seconds"] == 2 and actions.timer is None


async def test_other_tools_are_logged_and_done_and_mistakes_are_errors() -> None:
    actions, _, lines = handler()
    done = await actions.carry_out(action("lights.set", on=True))
    assert done.output == "done"
    assert lines.lines == [
        {"type": "action_result", "call_id": "call_1", "name": "lights.set", "output": "done"}
    ]
    cases = [
        (action("door.open"), "error: unknown tool 'door.open'"),
        (action("timer.set", seconds="five"), "error: timer.set: seconds must be integer"),
        (action("timer.set", seconds=0), "error: timer.set: seconds out of range"),
        (action("timer.set"), "error: timer.set: missing seconds"),
        (action("volume.set", change="up!"), "error: volume.set: change must be one of up, down"),
        (action("media.pause", loud=True), "error: media.pause: unknown argument(s) loud"),
        (action("lights.set", on=1), "error: lights.set: on must be boolean"),
    ]
    not_an_object = p.Action(1, "c", "lights.set", [True])  # type: ignore[arg-type]
    cases.append((not_an_object, "error: lights.set: arguments must be an object"))
    for bad, error in cases:
        assert (await actions.carry_out(bad)).output == error
    assert actions.timer is None


async def test_the_declared_tools_decide_what_is_known() -> None:
    door = {"name": "door.open", "description": "Open a door.", "parameters": {}}
    timer = DEFAULT_TOOLS[0].schema()
    actions, _, _ = handler([door, timer])
    assert (await actions.carry_out(action("door.open"))).output == "done"
    assert (await actions.carry_out(action("lights.set", on=True))).output.startswith("error")
    assert (await actions.carry_out(action("timer.set", seconds=5))).output.startswith("Timer set")
    nothing, _, _ = handler([])
    assert (await nothing.carry_out(action("timer.set", seconds=5))).output.startswith("error")
    assert nothing.timer is None


async def test_close_stops_the_timer_and_says_what_was_left() -> None:
    actions, clock, lines = handler()
    await actions.carry_out(action("timer.set", seconds=90))
    clock.advance(30)
    assert await actions.close() == 60
    clock.advance(60)
    await actions.wait()
    assert not lines.of("timer_done") and await actions.close() is None


async def test_a_client_that_is_done_waits_for_its_timer_or_says_it_stops_it() -> None:
    actions, clock, lines = handler()
    said: list[str] = []
    waiting = asyncio.Event()

    def log(line: str) -> None:
        said.append(line)
        waiting.set()

    await actions.carry_out(action("timer.set", seconds=90))
    finishing = asyncio.create_task(finish_actions(actions, True, log))
    await waiting.wait()
    clock.advance(90)
    await finishing
    assert said == ["waiting for the timer to ring (1 minute 30 seconds left)"]
    assert len(lines.of("timer_done")) == 1
    await actions.carry_out(action("timer.set", "call_2", seconds=90))
    clock.advance(60)
    await finish_actions(actions, False, said.append)
    assert said[1:] == ["exiting with 30 seconds left on the timer (--wait-timers waits)"]
    assert actions.timer is None and len(lines.of("timer_done")) == 1


def test_spoken_durations_and_the_chime() -> None:
    said = [spoken_duration(s) for s in (1, 45, 60, 90, 300, 3600, 3725, 0.4)]
    assert said == [
        "1 second", "45 seconds", "1 minute", "1 minute 30 seconds", "5 minutes", "1 hour",
        "1 hour 2 minutes 5 seconds", "0 seconds",
    ]  # fmt: skip
    sound = np.frombuffer(chime(16000), "<i2")
    assert len(sound) == 4 * (1920 + 640)  # four 120 ms tones, 40 ms apart
    assert 9000 < np.abs(sound).max() <= 32767 * 0.3 + 1
    assert abs(int(sound[0])) < 200 and abs(int(sound[1919])) < 200  # no click at the edges


def test_the_tools_option(tmp_path: Path) -> None:
    assert tools_option("none") == [] and tools_option("default") is None
    tools = [{"name": "door.open", "description": "Open a door.", "parameters": {}}]
    good = tmp_path / "tools.json"
    good.write_text(json.dumps(tools))
    assert tools_option(str(good)) == tools
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"name": "door open"}]))
    with pytest.raises(ValueError, match=r"bad.json: tools\[0\].name must match"):
        tools_option(str(bad))
    with pytest.raises(ValueError, match="cannot read"):
        tools_option(str(tmp_path / "missing.json"))
    bad.write_text("[{")
    with pytest.raises(ValueError, match="is not JSON"):
        tools_option(str(bad))


def test_the_clients_refuse_a_bad_tools_file_before_connecting(tmp_path: Path) -> None:
    bad = tmp_path / "tools.json"
    bad.write_text(json.dumps({"name": "timer.set"}))
    wav = tmp_path / "q.wav"
    from audio.speech import write_wav

    write_wav(wav, np.zeros(1600, np.float32))
    for client in ("clients.glasses", "clients.car"):
        run = subprocess.run(
            [sys.executable, "-m", client, "--url", "ws://127.0.0.1:9/v1/voice", "--wav", str(wav),
             "--tools", str(bad)],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert run.returncode == 2, run.stderr
        assert "--tools: " in run.stderr and "tools must be a list" in run.stderr


# --- the clients, with a peer that sends actions ---------------------------------------


def turn(turn_id: int, *messages: p.ServerMessage) -> list[p.ServerMessage]:
    """A turn as the server sends it: transcript, the actions, the reply, metrics."""
    final = p.TranscriptFinal(turn_id, "Please do it.")
    done = p.ReplyDone(turn_id, "Timer set.")
    metrics = p.Metrics(turn_id, None, None, None, None, None, None)
    return [final, *messages, p.ReplyText(turn_id, 0, "Timer set."), done, metrics]


async def test_the_glasses_carry_out_actions_and_answer_each() -> None:
    quiet = Pcm(np.zeros(16000 * 30, np.int16), 16000)
    async with scripted_server() as peer:
        tools = [DEFAULT_TOOLS[0].schema(), DEFAULT_TOOLS[10].schema()]  # timer.set, lights.set
        options = GlassesOptions(peer.url, turns=1, timeout_s=60, tools=tools)
        actions, clock, lines = handler(tools)
        glasses = Glasses(
            options, WavMicrophone(quiet), WavSpeaker(16000), lambda *_: None, actions
        )
        run = asyncio.create_task(glasses.run())
        start = await peer.next(p.Start)
        assert start.client == "glasses" and start.tools == tools
        await peer.send(p.Action(1, "call_a", "timer.set", {"seconds": 2}))
        assert await peer.next(p.ActionResult) == p.ActionResult(
            "call_a", "Timer set for 2 seconds."
        )
        await peer.send(*turn(1, p.Action(1, "call_b", "media.play", {"query": "jazz"})))
        assert await peer.next(p.ActionResult) == p.ActionResult(
            "call_b", "error: unknown tool 'media.play'"
        )
        [result] = await run
    clock.advance(2)
    await actions.wait()
    assert result.reply == "Timer set." and [line["type"] for line in lines.lines] == [
        "action_result", "action_result", "timer_done"
    ]  # fmt: skip


async def test_the_car_answers_actions_while_it_waits_for_the_reply() -> None:
    lines = Recorder()
    async with scripted_server() as peer:
        options = CarOptions(peer.url, rate=8000, tools=[])
        actions = Actions([], emit=lines)
        async with Car(options, on_frame=lambda *_: None, actions=actions) as car:
            start = await peer.next(p.Start)
            assert start.client == "car" and start.tools == []
            ask = asyncio.create_task(car.ask(Pcm(np.zeros(800, np.int16), 8000)))
            await peer.next(p.EndOfInput)
            await peer.send(*turn(1, p.Action(1, "call_1", "lights.set", {"on": True})))
            result = await ask
            answer = await peer.next(p.ActionResult)
    assert answer == p.ActionResult("call_1", "error: unknown tool 'lights.set'")
    assert result.reply == "Timer set." and lines.of("action_result")[0]["name"] == "lights.set"
