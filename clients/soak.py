"""Bounded soak: many open sessions, a few talking at a time, the server's resources sampled.

    python -m clients.soak --url ws://127.0.0.1:8765/v1/voice --sessions 50 --talking 4 \\
        --minutes 30 --pid PID [--json soak.json] [--sample-every 10] [--wav q1.wav ...]

Every session starts and stays connected; ``--talking`` of them at a time speak a
question (Piper speech synthesized once at start, or ``--wav`` files), streamed as
PCM16 at real time like a microphone and followed by real-time silence until the
reply is done; then the next session in rotation takes that turn. The others are open
microphones that send a little silence now and then. Every ``--sample-every`` seconds
the server's RSS, open fds and threads (from /proc/PID) and ``GET /stats`` are
recorded. At the end: growth after warm-up, ``(end - value at 20%) / value at 20%``
(the first fifth of the run is excluded), for RSS, fds and threads (and asyncio tasks
where /stats reports them).

Exits non-zero if a turn did not complete (no ``reply_done`` with text), a session
was closed by the server, or any growth reaches ``--max-growth`` (default 5%).
Sessions come from several loopback source addresses (``--per-address`` each), as
devices would, so that the server's per-address connection limit does not refuse them.
Only loopback URLs are accepted; no new turn starts after ``--minutes``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

from server import protocol as p

from .common import (
    FRAME_MS,
    Microphone,
    Pacer,
    auth_headers,
    frames,
    silence,
    start_session,
)
from .fuzz import http_base, http_get, read_proc, require_loopback
from .harness import Talker, TurnRecord, Utterance, run_turn

QUESTIONS = (
    "What is the capital of Australia?",
    "Who wrote the novel Pride and Prejudice?",
    "How many kilometers are in a mile?",
    "Set a timer for twenty minutes.",
)
GROWTH_KEYS = ("rss_kb", "fds", "threads", "tasks")


class SoakMicrophone(Microphone):
    """A worn device's microphone: mostly quiet (a burst of silence every ``idle_gap_s``),
    and while its session talks, the question then real-time silence until the scheduler
    says the turn is over (the server needs the silence to hear the end of the turn)."""

    def __init__(
        self,
        ws: ClientConnection,
        rate: int,
        idle_gap_s: float,
        burst_ms: int,
        seed: int,
        talking: Callable[[], bool],
    ) -> None:
        self.idle_gap_s = idle_gap_s
        self.burst_frames = max(1, burst_ms // FRAME_MS)
        self.rng = random.Random(seed)
        self.talking = talking
        super().__init__(ws, rate)

    async def _stream(self) -> None:
        quiet = frames(silence(self.rate, FRAME_MS / 1000))[0]
        seconds = FRAME_MS / 1000
        while True:
            gap = self.idle_gap_s * self.rng.uniform(0.5, 1.5)
            try:
                playback = await asyncio.wait_for(self.queue.get(), gap)
            except TimeoutError:
                pacer = Pacer()
                for _ in range(self.burst_frames):
                    await pacer.wait(seconds)
                    await self.ws.send(quiet)
                continue
            pacer = Pacer()  # a fresh clock: the idle time was not streamed
            for i, chunk in enumerate(frames(playback.pcm)):
                await pacer.wait(len(chunk) / 2 / self.rate)
                await self.ws.send(chunk)
                if i in playback.sent:
                    playback.sent[i].set_result(time.monotonic())
            while self.talking() and self.queue.empty():
                await pacer.wait(seconds)
                await self.ws.send(quiet)


class SoakTalker(Talker):
    """A session of the soak, on a :class:`SoakMicrophone`."""

    def __init__(
        self, index: int, ws: ClientConnection, rate: int, idle_gap_s: float, burst_ms: int
    ) -> None:
        self.talking = False
        self.closing = False
        mic = SoakMicrophone(ws, rate, idle_gap_s, burst_ms, index, lambda: self.talking)
        super().__init__(index, ws, rate, mic)

    @property
    def dropped(self) -> bool:
        """The server ended the connection while the soak still held it."""
        return self.inbox.task.done() and not self.closing

    async def close(self) -> None:
        self.closing = True
        await super().close()


@dataclass
class Options:
    url: str
    sessions: int = 50
    talking: int = 4
    minutes: float = 30.0
    pid: int | None = None
    sample_every_s: float = 10.0
    warmup: float = 0.2  # fraction of the run left out of the growth figures
    max_growth: float | None = 0.05  # None: report growth, do not judge it
    idle_gap_s: float = 2.0  # an idle session sends a burst of silence this often
    burst_ms: int = 200
    per_address: int = 10  # sessions per loopback source address
    timeout_s: float = 180.0  # per turn
    gap_s: float = 1.0  # between one session's reply and the next turn in its slot


@dataclass
class Sample:
    t: float
    turns_started: int
    turns_completed: int
    rss_kb: int | None = None
    fds: int | None = None
    threads: int | None = None
    tasks: int | None = None  # asyncio tasks, where /stats reports them
    sessions: int | None = None  # /stats
    loop_lag_p99_ms: float | None = None


@dataclass
class Soak:
    opts: Options
    utterances: list[Utterance]
    talkers: list[SoakTalker] = field(default_factory=list)
    records: list[TurnRecord] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    started: int = 0
    t0: float = field(default_factory=time.monotonic)
    busy: set[int] = field(default_factory=set)
    closed_early: dict[int, str] = field(default_factory=dict)

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    async def run(self) -> dict[str, object]:
        before = self._sample()
        await self._connect()
        self.t0 = time.monotonic()
        sampler = asyncio.create_task(self._sampling())
        try:
            rotation = itertools.cycle(range(len(self.talkers)))
            await asyncio.gather(*(self._slot(k, rotation) for k in range(self.opts.talking)))
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            self.samples.append(self._sample())  # the end: still under load
            self._check_drops()
            await asyncio.gather(*(t.close() for t in self.talkers))
        await asyncio.sleep(2.0)  # the server notices the closes a moment later
        after = self._sample()
        return self.report(before, after)

    async def _connect(self) -> None:
        rate = self.utterances[0].pcm.rate
        for i in range(self.opts.sessions):
            host = f"127.0.0.{2 + i // self.opts.per_address}" if self.opts.per_address else None
            extra: dict[str, Any] = {"local_addr": (host, 0)} if host else {}
            ws = await connect(
                self.opts.url,
                proxy=None,
                max_size=None,
                open_timeout=30,
                additional_headers=auth_headers(),
                **extra,
            )
            await start_session(ws, rate, "soak")
            self.talkers.append(SoakTalker(i, ws, rate, self.opts.idle_gap_s, self.opts.burst_ms))
        print(f"soak: {len(self.talkers)} sessions connected", file=sys.stderr, flush=True)

    async def _slot(self, k: int, rotation: itertools.cycle[int]) -> None:
        """One talking place: its turns go round the sessions, one after another."""
        await asyncio.sleep(k * 2.0)  # the slots' turns are spread out, not in step
        deadline = self.opts.minutes * 60
        while self.elapsed() < deadline:
            talker = self.talkers[next(i for i in rotation if i not in self.busy)]
            if talker.dropped:
                await asyncio.sleep(self.opts.gap_s)
                continue
            self.busy.add(talker.index)
            u = self.utterances[self.started % len(self.utterances)]
            self.started += 1
            record = TurnRecord(talker.index, self.started, u.name)
            talker.talking = True
            try:
                self.records += await run_turn(talker, record, u, self.opts.timeout_s)
            finally:
                talker.talking = False
                self.busy.discard(talker.index)
            await asyncio.sleep(self.opts.gap_s)

    def _check_drops(self) -> None:
        for t in self.talkers:
            if t.dropped and t.index not in self.closed_early:
                rcvd = t.ws.protocol.close_rcvd
                self.closed_early[t.index] = f"{rcvd.code} {rcvd.reason}" if rcvd else "1006"

    def _sample(self) -> Sample:
        done = sum(r.error is None for r in self.records)
        sample = Sample(round(self.elapsed(), 1), self.started, done)
        if self.opts.pid is not None and (proc := read_proc(self.opts.pid, 0.0)) is not None:
            sample.rss_kb, sample.fds, sample.threads = proc.rss_kb, proc.fds, proc.threads
        body = http_get(f"{http_base(self.opts.url)}/stats")
        stats = json.loads(body) if body else {}
        if isinstance(stats, dict):
            sample.sessions = stats.get("sessions")
            tasks = stats.get("tasks", stats.get("asyncio_tasks"))
            sample.tasks = tasks if isinstance(tasks, int) else None
            lag = stats.get("loop_lag")
            sample.loop_lag_p99_ms = lag.get("p99_ms") if isinstance(lag, dict) else None
        return sample

    async def _sampling(self) -> None:
        while True:
            await asyncio.sleep(self.opts.sample_every_s)
            sample = await asyncio.to_thread(self._sample)
            self.samples.append(sample)
            self._check_drops()
            print(self.progress_line(sample), file=sys.stderr, flush=True)

    def progress_line(self, s: Sample) -> str:
        failed = sum(r.error is not None for r in self.records)
        rss = f"{s.rss_kb / 1024:.0f} MiB" if s.rss_kb else "-"
        return (
            f"soak {s.t:5.0f}/{self.opts.minutes * 60:.0f} s: turns {s.turns_started} started, "
            f"{s.turns_completed} completed, {failed} failed; server rss {rss}, fds {s.fds}, "
            f"threads {s.threads}, tasks {s.tasks}, sessions {s.sessions}, "
            f"dropped {len(self.closed_early)}"
        )

    def report(self, before: Sample, after: Sample) -> dict[str, object]:
        growth = growth_after_warmup(self.samples, self.opts.warmup)
        ok = [r for r in self.records if r.error is None]
        failures = []
        if not self.records or len(ok) != len(self.records):
            failures.append(f"{len(ok)}/{len(self.records)} turns completed")
        if self.closed_early:
            failures.append(f"{len(self.closed_early)} session(s) closed by the server")
        limit = self.opts.max_growth
        for key, g in growth.items():
            if limit is not None and g["growth"] >= limit:
                failures.append(f"{key} grew {g['growth']:.1%} after warm-up")
        firsts = sorted(r.first_audio_ms for r in ok if r.first_audio_ms is not None)
        summary: dict[str, object] = {
            "url": self.opts.url,
            "sessions": self.opts.sessions,
            "talking": self.opts.talking,
            "minutes": self.opts.minutes,
            "seconds": self.samples[-1].t if self.samples else 0.0,
            "turns_started": len(self.records),
            "turns_completed": len(ok),
            "turn_errors": [r.error for r in self.records if r.error is not None][:20],
            "first_audio_ms_median": firsts[len(firsts) // 2] if firsts else None,
            "closed_by_server": {str(k): v for k, v in self.closed_early.items()},
            "growth_after_warmup": growth,
            "server": figures(self.samples),
            "before_connect": asdict(before),
            "after_close": asdict(after),
            "failures": failures,
            "ok": not failures,
        }
        return {
            "summary": summary,
            "samples": [asdict(s) for s in self.samples],
            "turns": [asdict(r) for r in self.records],
        }


def figures(samples: list[Sample]) -> dict[str, dict[str, float]]:
    """Start, end and maximum of each resource figure over the samples."""
    out: dict[str, dict[str, float]] = {}
    for key in GROWTH_KEYS:
        values = [v for s in samples if isinstance(v := getattr(s, key), int | float)]
        if values:
            out[key] = {"start": values[0], "end": values[-1], "max": max(values)}
    return out


def growth_after_warmup(samples: list[Sample], warmup: float) -> dict[str, dict[str, float]]:
    """``(end - w) / w`` per figure, w its first sample at or after ``warmup`` of the run."""
    if not samples:
        return {}
    cut = warmup * samples[-1].t
    start = next(s for s in samples if s.t >= cut)
    out: dict[str, dict[str, float]] = {}
    for key in GROWTH_KEYS:
        w, end = getattr(start, key), getattr(samples[-1], key)
        if isinstance(w, int | float) and isinstance(end, int | float) and w > 0:
            out[key] = {"at_warmup": w, "end": end, "growth": round((end - w) / w, 4)}
    return out


def synthesize(questions: tuple[str, ...] | list[str], folder: Path) -> list[Path]:
    """The questions as WAVs, spoken by Piper (audio.speech, made on this machine)."""
    from audio.speech import SpeechFactory, write_wav

    speech = SpeechFactory(folder)
    return [
        write_wav(folder / f"q{i}.wav", speech.piper(q, lead_s=0.3))
        for i, q in enumerate(questions)
    ]


async def run(opts: Options, wavs: list[Path]) -> dict[str, object]:
    require_loopback(opts.url)
    utterances = [Utterance.load(w) for w in wavs]
    if len({u.pcm.rate for u in utterances}) != 1:
        raise ValueError("all WAVs must have the same sample rate")
    return await Soak(opts, utterances).run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m clients.soak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--url", default=f"ws://127.0.0.1:8765{p.PATH}")
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--talking", type=int, default=4, help="sessions talking at a time")
    parser.add_argument("--minutes", type=float, default=30.0, help="no new turn after this")
    parser.add_argument("--pid", type=int, help="the server's pid: sample RSS, fds, threads")
    parser.add_argument("--sample-every", type=float, default=10.0, help="seconds")
    parser.add_argument("--max-growth", type=float, default=0.05, help="fail at this growth")
    parser.add_argument(
        "--warmup", type=float, default=0.2, help="fraction of the run left out of the growth"
    )
    parser.add_argument("--per-address", type=int, default=10, help="sessions per 127.0.0.x")
    parser.add_argument("--wav", type=Path, nargs="*", help="questions (default: Piper speech)")
    parser.add_argument("--json", type=Path, help="write the full report here")
    args = parser.parse_args(argv)
    if not 0 < args.talking <= args.sessions:
        parser.error("need 0 < --talking <= --sessions")
    opts = Options(
        args.url, args.sessions, args.talking, args.minutes, args.pid, args.sample_every,
        warmup=args.warmup, max_growth=args.max_growth, per_address=args.per_address,
    )  # fmt: skip
    try:
        require_loopback(opts.url)  # before any speech is synthesized
        with tempfile.TemporaryDirectory() as tmp:
            wavs = args.wav or synthesize(QUESTIONS, Path(tmp))
            report = asyncio.run(run(opts, wavs))
    except (ValueError, OSError) as exc:
        print(f"soak: {exc}", file=sys.stderr)
        return 2
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    summary = report["summary"]
    assert isinstance(summary, dict)
    print(json.dumps(summary, indent=2))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
