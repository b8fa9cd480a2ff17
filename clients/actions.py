"""What a device does with the server's actions (docs/protocol.md, "Actions (tools)").

The reference clients have one device function of their own, a countdown timer:
``timer.set`` starts it (a new one replaces the one running), ``timer.cancel`` stops
it, and when it ends the client prints a ``timer_done`` line and plays a chime where
it plays the replies. Every other tool the session declared is logged and answered
``"done"``, as a device integration answers once it has done the thing. Every action
gets an ``action_result``; a tool the session did not declare, or arguments that do
not fit its schema, get an error string (``"error: ..."``), which the next reply can
tell the user about.

Each action is printed as the ``action_result`` line the client sends (with the
tool's ``name`` added), one JSON object per line, like the server's events.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from model.tools import DEFAULT_TOOLS, Tool, ToolError, parse_tools, validate
from server import protocol as p

Emit = Callable[[dict[str, Any]], None]
Sleep = Callable[[float], Awaitable[None]]
Clock = Callable[[], float]

TOOLS_CHOICES = "none|default|FILE.json"
CHIME_TONES_HZ = (1318.5, 1046.5, 1318.5, 1046.5)  # E6 C6, twice: a kitchen-timer ding


class Sounds(Protocol):
    """Where a device sound goes: the speaker the client plays replies on."""

    rate: int

    def sound(self, pcm: bytes) -> None: ...


def print_line(event: dict[str, Any]) -> None:
    print(json.dumps(event), flush=True)


def tools_option(spec: str) -> list[Any] | None:
    """``--tools``: ``none`` -> ``[]`` (no tools), ``default`` -> None (the server's
    default device tools), else a JSON file holding a list of ``{name, description,
    parameters}``, checked here so that a mistake is reported before connecting."""
    if spec == "none":
        return []
    if spec == "default":
        return None
    try:
        raw = json.loads(Path(spec).read_text("utf-8"))
    except OSError as exc:
        raise ValueError(f"--tools: cannot read {spec}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ValueError(f"--tools: {spec} is not JSON: {exc}") from None
    try:
        parse_tools(raw)
    except ToolError as exc:
        raise ValueError(f"--tools: {spec}: {exc}") from None
    tools: list[Any] = raw
    return tools


def declared(tools: list[Any] | None) -> tuple[Tool, ...]:
    """The tools a ``start`` with ``tools`` declares (None: the default device set)."""
    return DEFAULT_TOOLS if tools is None else parse_tools(tools)


def spoken_duration(seconds: float) -> str:
    """``300`` -> ``"5 minutes"``, ``90`` -> ``"1 minute 30 seconds"``: the words a
    reply can repeat."""
    s = max(0, round(seconds))
    parts = [(s // 3600, "hour"), (s % 3600 // 60, "minute"), (s % 60, "second")]
    words = [f"{n} {unit}{'' if n == 1 else 's'}" for n, unit in parts if n]
    return " ".join(words) or "0 seconds"


def chime(rate: int, volume: float = 0.3) -> bytes:
    """A timer's chime: four 120 ms tones with 10 ms raised-cosine edges (no clicks)."""
    n, ramp = int(0.12 * rate), int(0.01 * rate)
    t = np.arange(n) / rate
    edge = 0.5 - 0.5 * np.cos(np.pi * np.arange(ramp) / ramp)
    envelope = np.ones(n)
    envelope[:ramp], envelope[n - ramp :] = edge, edge[::-1]
    gap = np.zeros(int(0.04 * rate))
    tones = [np.sin(2 * np.pi * hz * t) * envelope for hz in CHIME_TONES_HZ]
    wave = np.concatenate([x for tone in tones for x in (tone, gap)]) * volume
    return (wave * 32767).astype("<i2").tobytes()


@dataclass
class Timer:
    call_id: str
    seconds: int
    ends_at: float  # on the handler's clock
    task: asyncio.Task[None]


class Actions:
    """Carries out a session's actions; one per client, across reconnections."""

    def __init__(
        self,
        tools: list[Any] | None = None,
        sounds: Sounds | None = None,
        emit: Emit = print_line,
        sleep: Sleep = asyncio.sleep,
        clock: Clock = time.monotonic,
    ) -> None:
        self.tools = {t.name: t for t in declared(tools)}
        self.sounds = sounds
        self.emit = emit
        self.sleep = sleep
        self.clock = clock
        self.timer: Timer | None = None

    async def carry_out(self, action: p.Action) -> p.ActionResult:
        """Do ``action`` now; the result to send back."""
        output = await self._output(action)
        line = {"type": "action_result", "call_id": action.call_id, "name": action.name}
        self.emit({**line, "output": output})
        return p.ActionResult(action.call_id, output)

    async def _output(self, action: p.Action) -> str:
        tool = self.tools.get(action.name)
        if tool is None:
            return f"error: unknown tool {action.name!r}"
        if not isinstance(action.arguments, Mapping):
            return f"error: {action.name}: arguments must be an object"
        try:
            validate(tool, action.arguments)
        except ToolError as exc:
            return f"error: {exc}"
        match action.name:
            case "timer.set":
                return await self._set_timer(action.call_id, action.arguments)
            case "timer.cancel":
                return await self._cancel_timer()
        return "done"

    def left_s(self) -> float | None:
        """Seconds left on the running timer (None: none runs)."""
        return None if self.timer is None else max(0.0, self.timer.ends_at - self.clock())

    async def _set_timer(self, call_id: str, arguments: Mapping[str, Any]) -> str:
        seconds = arguments.get("seconds")
        if isinstance(seconds, bool) or not isinstance(seconds, int) or seconds < 1:
            return "error: timer.set needs seconds, a whole number of at least 1"
        left = self.left_s()
        await self._stop_timer()
        ends_at = self.clock() + seconds
        task = asyncio.create_task(self._count_down(call_id, seconds, ends_at))
        self.timer = Timer(call_id, seconds, ends_at, task)
        said = f"Timer set for {spoken_duration(seconds)}"
        if left is None:
            return f"{said}."
        return f"{said}, replacing one with {spoken_duration(left)} left."

    async def _cancel_timer(self) -> str:
        left = self.left_s()
        if left is None:
            return "No timer was running."
        await self._stop_timer()
        return f"Timer cancelled with {spoken_duration(left)} left."

    async def _stop_timer(self) -> None:
        timer, self.timer = self.timer, None
        if timer is not None:
            timer.task.cancel()
            await asyncio.wait({timer.task})  # raises nothing; our own cancellation still does

    async def _count_down(self, call_id: str, seconds: int, ends_at: float) -> None:
        await self.sleep(max(0.0, ends_at - self.clock()))
        self.timer = None
        self.emit({"type": "timer_done", "call_id": call_id, "seconds": seconds})
        if self.sounds is not None:
            self.sounds.sound(chime(self.sounds.rate))

    async def wait(self) -> None:
        """Until no timer runs (it rang or was cancelled)."""
        while (timer := self.timer) is not None:
            await asyncio.wait({timer.task})

    async def close(self) -> float | None:
        """Stop the running timer, as the device shuts down; the seconds it had left."""
        left = self.left_s()
        await self._stop_timer()
        return left


# --- the command lines of the glasses and the car ----------------------------------


def add_action_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tools",
        default="default",
        metavar=TOOLS_CHOICES,
        help="tools the assistant may call: none, the server's default device tools, "
        "or a JSON file with a list of {name, description, parameters} (default: default)",
    )
    parser.add_argument(
        "--wait-timers",
        action="store_true",
        help="after the last turn, keep running until a running timer has rung",
    )


async def finish_actions(actions: Actions, wait_timers: bool, log: Callable[[str], None]) -> None:
    """The client is done talking: wait for a running timer, or say it is dropped."""
    if wait_timers and (left := actions.left_s()) is not None:
        log(f"waiting for the timer to ring ({spoken_duration(left)} left)")
        await actions.wait()
    if (left := await actions.close()) is not None:
        log(f"exiting with {spoken_duration(left)} left on the timer (--wait-timers waits)")
