"""Smart-glasses client (minimal): stream a WAV as the microphone, print every event.

    python -m clients.glasses --url ws://127.0.0.1:8765/v1/voice --wav question.wav \\
        [--out reply.wav]

Streams the WAV at real-time pace followed by a second of silence, prints every server
event as one JSON line on stdout (audio frames as ``{"type": "audio", ...}`` lines),
writes the reply audio of the first completed turn to ``--out``, and exits 0 after
that turn; non-zero with a message on stderr otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, InvalidURI

from server import protocol as p

from .common import Pacer, Pcm, TurnAudio, frames, read_wav, silence, write_wav


class ClientError(Exception):
    """The session ended without a completed turn; the message says why."""


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


async def start_session(ws: ClientConnection, rate: int, client: str) -> p.Ready:
    await ws.send(p.encode(p.Start(sample_rate=rate, client=client, output_sample_rate=16000)))
    message = p.decode_server(await ws.recv())
    if isinstance(message, p.Error):
        raise ClientError(f"server refused the session: {message.code}: {message.message}")
    if not isinstance(message, p.Ready):
        raise ClientError(f"expected ready, got {message.type}")
    return message


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


async def run(url: str, wav: Path, out: Path | None, timeout_s: float) -> TurnResult:
    pcm = read_wav(wav)
    try:
        async with connect(url, open_timeout=10) as ws:
            ready = await start_session(ws, pcm.rate, "glasses")
            print(p.encode(ready), flush=True)
            sender = asyncio.create_task(stream_audio(ws, pcm))
            try:
                async with asyncio.timeout(timeout_s):
                    result = await first_turn(ws, ready)
            finally:
                sender.cancel()
    except TimeoutError:
        raise ClientError(f"no complete reply within {timeout_s:.0f} s") from None
    except (OSError, InvalidURI, InvalidStatus) as exc:
        raise ClientError(f"cannot reach the server at {url}: {exc}") from None
    except ConnectionClosed as exc:
        raise ClientError(f"connection closed: {exc}") from None
    if out is not None:
        write_wav(out, result.audio, result.output_rate)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m clients.glasses", description=__doc__)
    parser.add_argument("--url", default=f"ws://127.0.0.1:8765{p.PATH}")
    parser.add_argument("--wav", type=Path, required=True, help="16-bit mono/stereo WAV")
    parser.add_argument("--out", type=Path, help="write the reply audio here (WAV)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait")
    args = parser.parse_args(argv)
    if not args.wav.is_file():
        print(f"glasses: no such WAV file: {args.wav}", file=sys.stderr)
        return 2
    try:
        asyncio.run(run(args.url, args.wav, args.out, args.timeout))
    except (ClientError, ValueError) as exc:
        print(f"glasses: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
