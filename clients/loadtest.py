"""Concurrency check: many connected sessions, a few talking at once.

    python -m clients.loadtest --url ws://127.0.0.1:8765/v1/voice --wav q1.wav [q2.wav ...] \\
        --sessions 50 --talkers 4 --turns 2 [--json out.json]

Every session starts and streams silence at real time (a worn device that is on but
quiet); ``--talkers`` of them speak the WAVs in turn, all at the same moment, and wait
for each reply. Prints, per turn, the server's latency breakdown and, at the end,
whether every turn completed and the server's event-loop lag (from ``GET /stats``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from websockets.asyncio.client import ClientConnection, connect

from server import protocol as p

from .common import Pacer, Pcm, frames, read_wav, silence
from .glasses import start_session


@dataclass
class TurnRecord:
    session: int
    turn: int
    transcript: str = ""
    reply: str = ""
    metrics: dict[str, object] | None = None
    error: str | None = None


class Talker:
    """One session: streams silence, speaks on cue, collects replies."""

    def __init__(self, index: int, ws: ClientConnection, rate: int) -> None:
        self.index = index
        self.ws = ws
        self.rate = rate
        self.queue: asyncio.Queue[Pcm] = asyncio.Queue()
        self.events: asyncio.Queue[p.ServerMessage] = asyncio.Queue()

    async def stream(self) -> None:
        """Real-time audio forever: queued utterances, silence in between."""
        pacer = Pacer()
        quiet = frames(silence(self.rate, 0.02))[0]
        while True:
            chunks = frames(self.queue.get_nowait()) if not self.queue.empty() else [quiet]
            for chunk in chunks:
                await pacer.wait(len(chunk) / 2 / self.rate)
                await self.ws.send(chunk)

    async def read(self) -> None:
        async for frame in self.ws:
            if isinstance(frame, str):
                self.events.put_nowait(p.decode_server(frame))

    async def turn(self, number: int, pcm: Pcm, timeout_s: float) -> TurnRecord:
        record = TurnRecord(self.index, number)
        self.queue.put_nowait(pcm)
        try:
            async with asyncio.timeout(timeout_s):
                while record.metrics is None:
                    match await self.events.get():
                        case p.TranscriptFinal(text=text):
                            record.transcript = text
                        case p.ReplyDone(text=text):
                            record.reply = text
                        case p.ReplyCancelled(reason=reason):
                            record.error = f"cancelled: {reason}"
                        case p.Metrics() as m:
                            record.metrics = asdict(m)
                        case p.Error(code=code, message=message):
                            record.error = f"{code}: {message}"
        except TimeoutError:
            record.error = f"no reply within {timeout_s:.0f} s"
        return record


def fetch_stats(url: str) -> dict[str, object]:
    http = url.replace("ws://", "http://").split("/v1/", 1)[0]
    with urllib.request.urlopen(f"{http}/stats", timeout=10) as response:
        stats: dict[str, object] = json.loads(response.read())
    return stats


async def run(
    url: str, wavs: list[Path], sessions: int, talkers: int, turns: int, timeout_s: float
) -> dict[str, object]:
    utterances = [read_wav(w) for w in wavs]
    rate = utterances[0].rate
    if any(u.rate != rate for u in utterances):
        raise ValueError("all WAVs must have the same sample rate")
    connections = [await connect(url, max_size=None) for _ in range(sessions)]
    clients = [Talker(i, ws, rate) for i, ws in enumerate(connections)]
    background: list[asyncio.Task[None]] = []
    records: list[TurnRecord] = []
    try:
        for c in clients:
            await start_session(c.ws, rate, "loadtest")
            background += [asyncio.create_task(c.stream()), asyncio.create_task(c.read())]
        print(f"{sessions} sessions connected; {talkers} talking", file=sys.stderr)
        for k in range(turns):
            pcm = utterances[k % len(utterances)]
            batch = [c.turn(k + 1, pcm, timeout_s) for c in clients[:talkers]]
            done = await asyncio.gather(*batch)
            records += done
            firsts = [r.metrics["first_audio_ms"] for r in done if r.metrics]
            print(f"round {k + 1}/{turns}: first audio ms {firsts}", file=sys.stderr)
        stats = fetch_stats(url)
    finally:
        for task in background:
            task.cancel()
        for ws in connections:
            await ws.close()
    return summarize(records, stats, sessions, talkers)


def summarize(
    records: list[TurnRecord], stats: dict[str, object], sessions: int, talkers: int
) -> dict[str, object]:
    ok = [r for r in records if r.error is None and r.metrics]
    summary: dict[str, object] = {
        "sessions": sessions,
        "talkers": talkers,
        "turns": len(records),
        "completed": len(ok),
        "loop_lag": stats.get("loop_lag"),
    }
    for key in ("first_audio_ms", "endpointing_ms", "asr_ms", "reply_ms", "tts_first_chunk_ms"):
        values = [float(v) for r in ok if r.metrics and isinstance(v := r.metrics[key], float)]
        if values:
            summary[f"{key}_median"] = round(statistics.median(values), 1)
    return {"summary": summary, "turns": [asdict(r) for r in records]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m clients.loadtest", description=__doc__)
    parser.add_argument("--url", default=f"ws://127.0.0.1:8765{p.PATH}")
    parser.add_argument("--wav", type=Path, nargs="+", required=True)
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--talkers", type=int, default=4)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per turn")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if not 0 < args.talkers <= args.sessions:
        parser.error("need 0 < --talkers <= --sessions")
    report = asyncio.run(
        run(args.url, args.wav, args.sessions, args.talkers, args.turns, args.timeout)
    )
    print(json.dumps(report["summary"], indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    summary = report["summary"]
    assert isinstance(summary, dict)
    return 0 if summary["completed"] == summary["turns"] else 1


if __name__ == "__main__":
    sys.exit(main())
