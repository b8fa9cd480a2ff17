"""Smart-glasses client: microphone up, speech down, reconnecting when the network drops.

    python -m clients.glasses --url ws://127.0.0.1:8765/v1/voice --wav question.wav \\
        [--out reply.wav]
    python -m clients.glasses --url ws://HOST:8765/v1/voice          # live mic + speaker

With ``--wav`` the WAV is the microphone (real-time pace, then a second of silence) and
the client exits 0 after the first completed turn, writing its reply audio to ``--out``.
Without ``--wav`` it captures the default microphone at 16 kHz in 20 ms frames and
plays replies on the default speaker (needs the ``audio`` extra) until Ctrl-C or
``--turns`` completed turns. Every server event is printed as one JSON line on stdout
(audio frames as ``{"type": "audio", ...}``). Playback of a cancelled reply stops at
once. After a dropped connection the client reconnects with backoff and resumes the
conversation with its resume token; an unreachable server is reported on stderr with a
non-zero exit. The assistant's actions are carried out (``clients/actions.py``: a real
countdown timer, the rest logged) and answered with ``action_result``; ``--tools``
says which tools the session declares.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidURI

from server import protocol as p

from .actions import Actions, add_action_options, finish_actions, tools_option
from .common import (
    NETWORK_ERRORS,
    ClientError,
    Pacer,
    Pcm,
    ResumeRefused,
    TurnAudio,
    auth_headers,
    backoff,
    frames,
    read_wav,
    silence,
    start_session,
    unreachable,
)
from .devices import DeviceMicrophone, DeviceSpeaker, Microphone, Speaker, WavMicrophone, WavSpeaker

__all__ = [
    "ClientError",
    "Glasses",
    "GlassesOptions",
    "TurnResult",
    "first_turn",
    "start_session",
    "stream_audio",
]

FATAL_CLOSE_CODES = {1008, 1009, int(p.CloseCode.TOO_MANY_ERRORS)}  # reconnecting won't help


@dataclass
class TurnResult:
    turn_id: int
    transcript: str
    reply: str
    audio: bytes
    output_rate: int
    events: list[p.ServerMessage] = field(default_factory=list)


async def stream_audio(ws: ClientConnection, pcm: Pcm, trailing_s: float = 1.0) -> None:
    pacer = Pacer()
    for chunk in frames(pcm) + frames(silence(pcm.rate, trailing_s)):
        await pacer.wait(len(chunk) / 2 / pcm.rate)
        await ws.send(chunk)


async def first_turn(ws: ClientConnection, ready: p.Ready, printer: bool = True) -> TurnResult:
    """Read events until a turn's reply is done and measured; its audio is what was kept."""
    audio = TurnAudio()
    events: list[p.ServerMessage] = [ready]
    transcripts: dict[int, str] = {}
    done: p.ReplyDone | None = None
    async for frame in ws:
        if isinstance(frame, bytes):
            turn_id = audio.add(frame)
            if printer:
                print(json.dumps({"type": "audio", "turn_id": turn_id, "bytes": len(frame)}))
            continue
        message = p.decode_server(frame)
        events.append(message)
        if printer:
            print(frame, flush=True)
        match message:
            case p.TranscriptFinal(turn_id=t, text=text):
                transcripts[t] = text
            case p.ReplyCancelled(turn_id=t):
                audio.cancel(t)
            case p.ReplyDone(text=text) if text:
                done = message
            case p.Metrics(turn_id=t) if done is not None and done.turn_id == t:
                rate = ready.output_sample_rate
                return TurnResult(t, transcripts.get(t, ""), done.text, audio.pcm(t), rate, events)
    raise ClientError("the server closed the connection before a reply was complete")


@dataclass
class GlassesOptions:
    url: str
    turns: int | None = 1  # stop after this many completed turns; None: run until stopped
    timeout_s: float | None = 120.0  # for the whole run, reconnections included
    retries: int = 8  # reconnection attempts after a drop before giving up
    output_rate: int = 16000
    tools: list[Any] | None = None  # sent in start: None, the server's default device tools


def print_event(message: p.ServerMessage | None, frame: str | bytes) -> None:
    """The CLI's event printer: one JSON line per server message or audio frame."""
    if isinstance(frame, bytes):
        turn_id, seq, _ = p.unpack_audio(frame)
        print(json.dumps({"type": "audio", "turn_id": turn_id, "seq": seq, "bytes": len(frame)}))
    else:
        print(frame, flush=True)


def log(text: str) -> None:
    print(f"glasses: {text}", file=sys.stderr, flush=True)


class Glasses:
    """One conversation over as many connections as the network needs."""

    def __init__(
        self,
        options: GlassesOptions,
        mic: Microphone,
        speaker: Speaker,
        on_frame: Callable[[p.ServerMessage | None, str | bytes], None] = print_event,
        actions: Actions | None = None,
    ) -> None:
        self.options = options
        self.mic = mic
        self.speaker = speaker
        self.on_frame = on_frame
        self.actions = actions or Actions(options.tools, speaker)
        self.results: list[TurnResult] = []
        self.resume_token: str | None = None
        self.connections = 0

    async def run(self) -> list[TurnResult]:
        try:
            async with asyncio.timeout(self.options.timeout_s):
                await self._reconnecting()
        except TimeoutError:
            raise ClientError(f"no complete reply within {self.options.timeout_s} s") from None
        return self.results

    async def _reconnecting(self) -> None:
        delays, failures = backoff(), 0
        while True:
            try:
                if await self._connection():
                    return
                reason = "the server closed the connection"
            except InvalidURI as exc:
                raise unreachable(self.options.url, exc) from None
            except NETWORK_ERRORS as exc:
                if self.connections == 0:
                    raise unreachable(self.options.url, exc) from None
                reason = f"connection lost ({exc or type(exc).__name__})"
            failures += 1
            if failures > self.options.retries:
                raise ClientError(f"{reason}; gave up after {self.options.retries} reconnections")
            delay = next(delays)
            log(f"{reason}; reconnecting in {delay:.1f} s")
            await asyncio.sleep(delay)

    async def _connection(self) -> bool:
        """One connection; True when enough turns completed."""
        async with connect(
            self.options.url, open_timeout=10, max_size=None, additional_headers=auth_headers()
        ) as ws:
            ready = await self._start(ws)
            self.connections += 1
            self.on_frame(ready, p.encode(ready))
            sender = asyncio.create_task(self._send_mic(ws))
            try:
                return await self._converse(ws, ready)
            except ConnectionClosed as exc:
                if exc.rcvd is not None and exc.rcvd.code in FATAL_CLOSE_CODES:
                    raise ClientError(f"the server closed the session: {exc}") from None
                raise
            finally:
                sender.cancel()
                with contextlib.suppress(asyncio.CancelledError, *NETWORK_ERRORS):
                    await sender

    async def _start(self, ws: ClientConnection) -> p.Ready:
        rate, out_rate, tools = self.mic.rate, self.options.output_rate, self.options.tools
        try:
            ready = await start_session(ws, rate, "glasses", self.resume_token, out_rate, tools)
        except ResumeRefused as exc:
            log(f"could not resume the conversation ({exc.code}); starting a new one")
            ready = await start_session(ws, rate, "glasses", None, out_rate, tools)
        self.resume_token = ready.resume_token or None
        return ready

    async def _send_mic(self, ws: ClientConnection) -> None:
        async for chunk in self.mic.stream():
            await ws.send(chunk)

    async def _converse(self, ws: ClientConnection, ready: p.Ready) -> bool:
        audio = TurnAudio()
        transcripts: dict[int, str] = {}
        done: dict[int, p.ReplyDone] = {}
        async for frame in ws:
            if isinstance(frame, bytes):
                turn_id = audio.add(frame)
                if turn_id not in audio.cancelled:
                    self.speaker.play(turn_id, p.unpack_audio(frame)[2])
                self.on_frame(None, frame)
                continue
            message = p.decode_server(frame)
            self.on_frame(message, frame)
            match message:
                case p.TranscriptFinal(turn_id=t, text=text):
                    transcripts[t] = text
                case p.Action():
                    await ws.send(p.encode(await self.actions.carry_out(message)))
                case p.Error(code="tools_unsupported", message=text):
                    log(text)  # the session goes on; its replies only speak
                case p.ReplyCancelled(turn_id=t):
                    audio.cancel(t)
                    self.speaker.flush(t)
                case p.ReplyDone(turn_id=t, text=text) if text:
                    done[t] = message
                case p.Metrics(turn_id=t) if t in done:
                    self._complete(t, transcripts.get(t, ""), done.pop(t).text, audio, ready)
                    if self.options.turns is not None and len(self.results) >= self.options.turns:
                        return True
        return False

    def _complete(
        self, turn_id: int, transcript: str, reply: str, audio: TurnAudio, ready: p.Ready
    ) -> None:
        rate = ready.output_sample_rate
        self.results.append(TurnResult(turn_id, transcript, reply, audio.pcm(turn_id), rate))
        if isinstance(self.speaker, WavSpeaker):
            self.speaker.keep(turn_id)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m clients.glasses",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--url", default=f"ws://127.0.0.1:8765{p.PATH}")
    parser.add_argument("--wav", type=Path, help="16-bit WAV as the microphone (default: live)")
    parser.add_argument("--out", type=Path, help="write the reply audio here (WAV)")
    parser.add_argument("--play", action="store_true", help="play replies on the speaker")
    parser.add_argument("--turns", type=int, help="stop after N turns (default 1 with --wav)")
    parser.add_argument("--timeout", type=float, help="seconds for the whole run")
    parser.add_argument("--retries", type=int, default=8, help="reconnections after a drop")
    add_action_options(parser)
    return parser


def _devices(args: argparse.Namespace) -> tuple[Microphone, Speaker]:
    mic: Microphone = WavMicrophone(read_wav(args.wav)) if args.wav else DeviceMicrophone()
    live_out = args.play or (args.wav is None and args.out is None)
    speaker: Speaker = DeviceSpeaker(16000) if live_out else WavSpeaker(16000, args.out)
    return mic, speaker


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.wav is not None and not args.wav.is_file():
        log(f"no such WAV file: {args.wav}")
        return 2
    live = args.wav is None
    turns = args.turns if args.turns is not None else (None if live else 1)
    timeout = args.timeout or (None if live and turns is None else 120.0)
    try:
        tools = tools_option(args.tools)
        mic, speaker = _devices(args)
    except (RuntimeError, ValueError) as exc:
        log(str(exc))
        return 2
    options = GlassesOptions(args.url, turns, timeout, args.retries, tools=tools)
    try:
        asyncio.run(_run(Glasses(options, mic, speaker), args.wait_timers))
    except (ClientError, ValueError) as exc:
        log(str(exc))
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        speaker.close()
    return 0


async def _run(glasses: Glasses, wait_timers: bool) -> None:
    try:
        await glasses.run()
        if wait_timers:
            await finish_actions(glasses.actions, True, log)
    finally:
        await finish_actions(glasses.actions, False, log)


if __name__ == "__main__":
    sys.exit(main())
