"""Car client: push-to-talk, 8 or 16 kHz audio, and a conversation that survives tunnels.

    python -m clients.car --url ws://127.0.0.1:8765/v1/voice --wav q1.wav [q2.wav ...] \\
        [--rate 8000] [--out-dir replies/]
    python -m clients.car --url ws://HOST:8765/v1/voice --live      # Enter to talk

Each WAV is one press of the talk button: its audio is sent while the button is held
and ``end_of_input`` when it is released, so the server answers at once instead of
waiting for trailing silence. Pressing the button while a reply plays cancels it. When
the connection drops the client reconnects with backoff and sends its resume token, so
the conversation goes on where it was; a question cut off by the drop is asked again.
Every server event is printed as one JSON line on stdout. The assistant's actions are
carried out (``clients/actions.py``: a real countdown timer, the rest logged) and
answered with ``action_result``; ``--tools`` says which tools the session declares.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidURI

from server import protocol as p

from .actions import Actions, add_action_options, finish_actions, tools_option
from .common import (
    NETWORK_ERRORS,
    Arrival,
    ClientError,
    Inbox,
    Pacer,
    Pcm,
    ResumeRefused,
    TurnAudio,
    auth_headers,
    backoff,
    frames,
    read_wav,
    start_session,
    unreachable,
    write_wav,
)
from .devices import DeviceMicrophone, DeviceSpeaker, Speaker, WavSpeaker
from .glasses import TurnResult, print_event

RATES = (8000, 16000)


@dataclass
class CarOptions:
    url: str
    rate: int = 16000  # what the head unit's microphone delivers
    output_rate: int = 16000
    turn_timeout_s: float = 120.0
    retries: int = 8
    tools: list[Any] | None = None  # sent in start: None, the server's default device tools


@dataclass
class CarLog:
    """What happened to the connection, for the driver's display and for tests."""

    readies: list[p.Ready] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # resume error codes
    drops: int = 0


def log(text: str) -> None:
    print(f"car: {text}", file=sys.stderr, flush=True)


class Car:
    """A head unit's session: ask questions by push-to-talk, across reconnections."""

    def __init__(
        self,
        options: CarOptions,
        speaker: Speaker | None = None,
        on_frame: Callable[[p.ServerMessage | None, str | bytes], None] = print_event,
        resume_token: str | None = None,
        actions: Actions | None = None,
    ) -> None:
        if options.rate not in RATES:
            raise ValueError(f"the car client sends 8000 or 16000 Hz, not {options.rate}")
        self.options = options
        self.speaker = speaker
        self.on_frame = on_frame
        self.resume_token = resume_token
        self.actions = actions or Actions(options.tools, speaker)
        self.log = CarLog()
        self.ws: ClientConnection | None = None
        self.inbox: Inbox | None = None
        self.playing: int | None = None  # turn whose reply audio is arriving

    async def __aenter__(self) -> Car:
        try:
            await self.connect()
        except (InvalidURI, *NETWORK_ERRORS) as exc:
            raise unreachable(self.options.url, exc) from None
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self) -> p.Ready:
        ws = await connect(
            self.options.url, open_timeout=10, max_size=None, additional_headers=auth_headers()
        )
        try:
            ready = await self._start(ws)
        except BaseException:
            await ws.close()
            raise
        self.ws, self.inbox = ws, Inbox(ws)
        self.on_frame(ready, p.encode(ready))
        return ready

    async def _start(self, ws: ClientConnection) -> p.Ready:
        rate, out_rate, tools = self.options.rate, self.options.output_rate, self.options.tools
        try:
            ready = await start_session(ws, rate, "car", self.resume_token, out_rate, tools)
        except ResumeRefused as exc:
            self.log.refused.append(exc.code)
            log(f"could not resume the conversation ({exc.code}); starting a new one")
            ready = await start_session(ws, rate, "car", None, out_rate, tools)
        self.resume_token = ready.resume_token or None
        self.log.readies.append(ready)
        return ready

    async def close(self) -> None:
        if self.inbox is not None:
            await self.inbox.close()
        if self.ws is not None:
            await self.ws.close()
        self.ws = self.inbox = None

    async def reconnect(self) -> p.Ready:
        """After a drop: new connections with backoff until one is ready (resumed)."""
        await self.close()
        self.log.drops += 1
        delays = backoff()
        for attempt in range(1, self.options.retries + 1):
            delay = next(delays)
            log(f"connection lost; reconnecting in {delay:.1f} s (attempt {attempt})")
            await asyncio.sleep(delay)
            with contextlib.suppress(*NETWORK_ERRORS):
                return await self.connect()
        raise ClientError(f"could not reconnect after {self.options.retries} attempts")

    async def ask(self, pcm: Pcm) -> TurnResult:
        """Push, speak ``pcm``, release; the answer, asked again after a drop."""
        pcm = pcm.at_rate(self.options.rate)
        for _ in range(self.options.retries + 1):
            try:
                if self.ws is None:
                    await self.reconnect()
                async with asyncio.timeout(self.options.turn_timeout_s):
                    return await self._ask_once(pcm)
            except TimeoutError:
                raise ClientError(f"no reply within {self.options.turn_timeout_s:.0f} s") from None
            except NETWORK_ERRORS:
                await self.reconnect()
        raise ClientError("the connection kept dropping")

    async def _ask_once(self, pcm: Pcm) -> TurnResult:
        assert self.ws is not None and self.inbox is not None
        await self._drain()
        if self.playing is not None:  # talking over the reply: the driver wants to speak
            await self.ws.send(p.encode(p.Cancel()))
        pacer = Pacer()
        for chunk in frames(pcm):  # the button is held
            await pacer.wait(len(chunk) / 2 / pcm.rate)
            await self.ws.send(chunk)
        await self.ws.send(p.encode(p.EndOfInput()))  # released
        return await self._answer()

    async def _drain(self) -> None:
        """Handle what arrived while nobody was asking (late audio, a closed socket)."""
        assert self.inbox is not None
        while not self.inbox.queue.empty():
            await self._handle(await self.inbox.get())

    async def _handle(self, arrival: Arrival) -> None:
        self.on_frame(arrival.message, arrival.raw)
        if arrival.audio is not None:
            turn_id, _seq, data = arrival.audio
            self.playing = turn_id
            if self.speaker is not None:
                self.speaker.play(turn_id, data)
        match arrival.message:
            case p.Action() as action:
                result = await self.actions.carry_out(action)
                assert self.ws is not None
                await self.ws.send(p.encode(result))
            case p.Error(code="tools_unsupported", message=text):
                log(text)  # the session goes on; its replies only speak
            case p.ReplyCancelled(turn_id=t):
                if self.speaker is not None:
                    self.speaker.flush(t)
                self.playing = None
            case p.ReplyDone():
                self.playing = None

    async def _answer(self) -> TurnResult:
        assert self.inbox is not None
        transcript, done, audio = "", None, TurnAudio()
        while True:
            arrival = await self.inbox.get()
            await self._handle(arrival)
            match arrival.message:
                case p.Error(code="no_speech"):
                    raise ClientError("the server heard no speech in that press")
                case p.TranscriptFinal(text=text):
                    transcript = text
                case p.ReplyDone(text=text) if text:
                    done = arrival.message
                case p.Metrics(turn_id=t) if done is not None and t == done.turn_id:
                    rate = self.options.output_rate
                    return TurnResult(t, transcript, done.text, audio.pcm(t), rate)
            if arrival.audio is not None:
                audio.add(arrival.raw if isinstance(arrival.raw, bytes) else b"")


async def run_wavs(
    options: CarOptions, wavs: list[Path], out_dir: Path | None, wait_timers: bool = False
) -> int:
    speaker = WavSpeaker(options.output_rate, out_dir / "sounds.wav" if out_dir else None)
    async with Car(options, speaker) as car:
        try:
            for i, wav in enumerate(wavs, 1):
                result = await car.ask(read_wav(wav))
                log(f"turn {i}: {result.transcript!r} -> {result.reply!r}")
                if out_dir is not None:
                    write_wav(out_dir / f"reply{i}.wav", result.audio, result.output_rate)
            await finish_actions(car.actions, wait_timers, log)
        finally:
            await finish_actions(car.actions, False, log)
            speaker.close()
    return 0


async def run_live(options: CarOptions) -> int:
    """Enter starts talking, Enter again releases; Ctrl-D quits."""
    loop = asyncio.get_running_loop()
    mic = DeviceMicrophone(options.rate)
    speaker = DeviceSpeaker(options.output_rate)
    try:
        async with Car(options, speaker) as car:
            try:
                while await loop.run_in_executor(None, sys.stdin.readline):
                    log("talking... (Enter to release)")
                    captured = await _capture_until_enter(mic, loop)
                    await car.ask(captured)
            finally:
                await finish_actions(car.actions, False, log)
    finally:
        speaker.close()
    return 0


async def _capture_until_enter(mic: DeviceMicrophone, loop: asyncio.AbstractEventLoop) -> Pcm:
    import numpy as np

    chunks: list[bytes] = []
    release = loop.run_in_executor(None, sys.stdin.readline)
    async for chunk in mic.stream():
        chunks.append(chunk)
        if release.done():
            break
    return Pcm(np.frombuffer(b"".join(chunks), "<i2").astype(np.int16), mic.rate)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m clients.car",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--url", default=f"ws://127.0.0.1:8765{p.PATH}")
    parser.add_argument("--wav", type=Path, nargs="+", help="one WAV per press of the button")
    parser.add_argument("--live", action="store_true", help="microphone and speaker")
    parser.add_argument("--rate", type=int, default=16000, choices=RATES)
    parser.add_argument("--out-dir", type=Path, help="write reply N to DIR/replyN.wav")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per turn")
    parser.add_argument("--retries", type=int, default=8, help="reconnection attempts")
    add_action_options(parser)
    args = parser.parse_args(argv)
    if not args.wav and not args.live:
        parser.error("give --wav FILE... or --live")
    try:
        tools = tools_option(args.tools)
    except ValueError as exc:
        log(str(exc))
        return 2
    options = CarOptions(
        args.url, args.rate, turn_timeout_s=args.timeout, retries=args.retries, tools=tools
    )
    try:
        if args.live:
            return asyncio.run(run_live(options))
        if args.out_dir is not None:
            args.out_dir.mkdir(parents=True, exist_ok=True)
        return asyncio.run(run_wavs(options, args.wav, args.out_dir, args.wait_timers))
    except (ClientError, ValueError, RuntimeError, FileNotFoundError) as exc:
        log(str(exc))
        return 1
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
