"""Latency test harness: N simulated clients, K spoken turns each, timed at the client.

    python -m clients.harness --url ws://127.0.0.1:8765/v1/voice --wav q1.wav [q2.wav ...] \\
        --sessions 4 --turns 3 --json report.json [--plot report.png] [--barge-in]

Each session streams audio at real-time pace without pause (silence between questions,
as a worn device that is on), and speaks the WAVs in turn, one per turn, waiting for
the whole reply before the next. Per turn it measures, from the ground-truth end of
speech (the send time of the frame holding the WAV's last sample above the speech
level, see :func:`clients.common.speech_bounds`): the final transcript, the first reply
audio frame, and ``reply_done``; the server's own ``metrics`` go beside them.

With ``--barge-in`` every question is interrupted: the next WAV is spoken as soon as
the first reply audio arrives, and the record says how long after the interruption's
speech onset the last audio frame of the cancelled turn arrived and when
``reply_cancelled`` came. The interruption is a turn of its own.

The JSON report has ``turns`` (one record per turn, ``error`` set when it failed) and
``summary`` (p50/p95/p99 of end of speech to first reply audio, per-stage percentiles,
barge-in stop times, the server's event-loop lag). A progress line goes to stderr.

Each whole reply is also played back on paper (:func:`playback_stall_ms`): from its
first audio frame at real time, how long a speaker would have fallen silent waiting for
audio that had not come yet. A voice that stutters under load shows there, where first
audio alone would not.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from server import protocol as p

from .common import (
    Arrival,
    ClientError,
    Inbox,
    Microphone,
    Pcm,
    auth_headers,
    load_average,
    open_session,
    read_wav,
    speech_bounds,
)

PERCENTILES = (50, 95, 99)
# a playback gap shorter than this (one 20 ms frame and jitter) is not heard; a turn
# with more in all counts as one that stuttered
AUDIBLE_STALL_MS = 50.0
# --plot's matplotlib is an extra of its own (pyproject.toml), not a dependency
PLOT_INSTALL = "pip install -e '.[plot]'"
CLIENT_STAGES = ("final_transcript_ms", "first_audio_ms", "reply_done_ms")
SERVER_STAGES = (
    "endpointing_ms",
    "asr_ms",
    "reply_first_sentence_ms",
    "reply_ms",
    "tts_first_chunk_ms",
    "first_audio_ms",
)


@dataclass(frozen=True)
class Utterance:
    """A WAV to speak, with the frames that hold its first and last loud sample."""

    name: str
    pcm: Pcm
    onset_frame: int
    end_frame: int

    @classmethod
    def load(cls, path: Path) -> Utterance:
        pcm = read_wav(path)
        onset_s, end_s = speech_bounds(pcm)
        step = pcm.rate * 20 // 1000
        onset, end = int(onset_s * pcm.rate) // step, (int(end_s * pcm.rate) - 1) // step
        return cls(path.name, pcm, onset, end)


@dataclass(frozen=True)
class Spoken:
    """When an utterance's speech started and ended, as sent (``time.monotonic()``)."""

    utterance: Utterance
    onset_at: asyncio.Future[float]
    end_at: asyncio.Future[float]


@dataclass
class TurnRecord:
    session: int
    turn: int
    wav: str
    interruption: bool = False  # spoken over the previous turn's reply (--barge-in)
    turn_id: int | None = None
    transcript: str = ""
    reply: str = ""
    final_transcript_ms: float | None = None  # all client times: from the end of speech
    first_audio_ms: float | None = None
    reply_done_ms: float | None = None
    # silence a real-time player would have inserted waiting for this reply's audio
    # (whole replies only: not one cut short)
    playback_stall_ms: float | None = None
    server: dict[str, object] | None = None  # the server's metrics event
    barge_in: dict[str, object] | None = None
    error: str | None = None


class Talker:
    """One simulated client: an open microphone out, stamped events in."""

    def __init__(
        self,
        index: int,
        ws: ClientConnection,
        rate: int,
        mic: Microphone | None = None,
        out_rate: int | None = None,
    ) -> None:
        """``out_rate``: the server's reply audio rate (``ready``), for playback stalls."""
        self.index = index
        self.ws = ws
        self.out_rate = out_rate
        self.inbox = Inbox(ws)
        self.mic = mic or Microphone(ws, rate)

    def say(self, utterance: Utterance) -> Spoken:
        onset, end = utterance.onset_frame, utterance.end_frame
        playback = self.mic.play(utterance.pcm, marks=(onset, end))
        return Spoken(utterance, playback.sent[onset], playback.sent[end])

    async def close(self) -> None:
        await self.mic.close()
        await self.inbox.close()
        await self.ws.close()


@dataclass
class TurnWatch:
    """Follows one turn's events; times are ``time.monotonic()``."""

    record: TurnRecord
    spoken: Spoken
    final_at: float | None = None
    done_at: float | None = None
    cancelled_at: float | None = None
    finished: bool = False
    out_rate: int | None = None
    # (arrival, samples) of each of the reply's audio frames
    frames: list[tuple[float, int]] = field(default_factory=list)

    @property
    def first_audio_at(self) -> float | None:
        return self.frames[0][0] if self.frames else None

    @property
    def last_audio_at(self) -> float | None:
        return self.frames[-1][0] if self.frames else None

    def see(self, a: Arrival) -> None:
        r = self.record
        if a.audio is not None:
            if a.audio[0] == r.turn_id:
                self.frames.append((a.at, len(a.audio[2]) // 2))
            return
        match a.message:
            case p.SpeechStarted(turn_id=t) if r.turn_id is None:
                r.turn_id = t
            case p.TranscriptFinal(turn_id=t, text=text) if t == r.turn_id:
                r.transcript, self.final_at = text, a.at
            case p.ReplyDone(turn_id=t, text=text) if t == r.turn_id:
                r.reply, self.done_at = text, a.at
                if not text:
                    r.error = "empty reply (no speech recognised)"
            case p.ReplyCancelled(turn_id=t, reason=reason) if t == r.turn_id:
                self.cancelled_at = a.at
                if not r.interruption and reason != "barge_in":
                    r.error = f"reply cancelled: {reason}"
            case p.Metrics(turn_id=t) as m if t == r.turn_id:
                r.server, self.finished = asdict(m), True
            case p.Error(code=code, message=message):
                r.error = f"{code}: {message}"

    def settle(self) -> None:
        """Turn the stamps into milliseconds from the end of speech."""
        if not self.spoken.end_at.done():
            return
        end = self.spoken.end_at.result()

        def ms(t: float | None) -> float | None:
            return None if t is None else round((t - end) * 1000, 1)

        r = self.record
        r.final_transcript_ms = ms(self.final_at)
        r.first_audio_ms = ms(self.first_audio_at)
        r.reply_done_ms = ms(self.done_at)
        if self.out_rate and self.frames and self.done_at and self.cancelled_at is None:
            r.playback_stall_ms = round(playback_stall_ms(self.frames, self.out_rate), 1)


def playback_stall_ms(frames: Sequence[tuple[float, int]], rate: int) -> float:
    """Silence (ms) a player inserts into a reply when it starts the first frame on
    arrival and plays at ``rate`` samples/s: each frame starts when the one before it
    has played or when it arrives, whichever is later. ``frames``: (arrival in s,
    samples), in order. No jitter buffer: the strictest reading of "audio came late"."""
    stall = 0.0
    free_at = frames[0][0] if frames else 0.0  # when the player has played all it had
    for at, samples in frames:
        stall += max(0.0, at - free_at)
        free_at = max(free_at, at) + samples / rate
    return stall * 1000


async def run_turn(
    talker: Talker,
    record: TurnRecord,
    utterance: Utterance,
    timeout_s: float,
    interruption: Utterance | None = None,
) -> list[TurnRecord]:
    """Speak, wait for the answer (and with ``interruption``, talk over it)."""
    watch = TurnWatch(record, talker.say(utterance), out_rate=talker.out_rate)
    barge: TurnWatch | None = None
    try:
        async with asyncio.timeout(timeout_s):
            while not (watch.finished and (barge is None or barge.finished)):
                a = await talker.inbox.get()
                watch.see(a)
                if barge is not None:
                    barge.see(a)
                elif interruption is not None and a.audio and a.audio[0] == record.turn_id:
                    barge = _interrupt(talker, record, interruption)
    except TimeoutError:
        record.error = record.error or f"no complete reply within {timeout_s:.0f} s"
    except (OSError, ConnectionClosed, ClientError) as exc:
        record.error = f"connection lost: {exc or type(exc).__name__}"
    watch.settle()
    if barge is None:
        if interruption is not None and record.error is None:
            record.error = "reply had no audio to interrupt"
        return [record]
    barge.settle()
    record.barge_in = _barge_in_figures(watch, barge)
    return [record, barge.record]


def _interrupt(talker: Talker, record: TurnRecord, utterance: Utterance) -> TurnWatch:
    nxt = TurnRecord(record.session, record.turn, utterance.name, interruption=True)
    return TurnWatch(nxt, talker.say(utterance), out_rate=talker.out_rate)


def _barge_in_figures(cut: TurnWatch, barge: TurnWatch) -> dict[str, object]:
    """Interruption onset -> the cancelled turn's last audio frame / reply_cancelled."""
    if not barge.spoken.onset_at.done():
        return {"error": "the interruption was never sent"}
    onset = barge.spoken.onset_at.result()

    def ms(t: float | None) -> float | None:
        return None if t is None else round((t - onset) * 1000, 1)

    out: dict[str, object] = {
        "stop_ms": ms(cut.last_audio_at),
        "cancelled_event_ms": ms(cut.cancelled_at),
        "cancelled": cut.cancelled_at is not None,
    }
    if cut.cancelled_at is None:
        out["error"] = "the reply was not cancelled (it ended first?)"
    return out


@dataclass
class Options:
    url: str
    wavs: list[Path]
    sessions: int = 1
    turns: int = 1
    barge_in: bool = False
    timeout_s: float = 180.0  # per turn
    gap_s: float = 1.0  # silence between a reply and the next question
    stagger_s: float = 0.0  # session i starts i * stagger_s / sessions later


class Progress:
    def __init__(self, total: int) -> None:
        self.total, self.done, self.failed = total, 0, 0
        self.tty = sys.stderr.isatty()

    def add(self, records: list[TurnRecord]) -> None:
        for r in records:
            self.done += 1
            self.failed += r.error is not None
        last = records[0].first_audio_ms
        text = (
            f"harness: {self.done}/{self.total} turns, {self.failed} failed, "
            f"last end of speech -> first audio {last if last is not None else '-'} ms"
        )
        print(("\r" if self.tty else "") + text, end="" if self.tty else "\n", file=sys.stderr)
        sys.stderr.flush()

    def end(self) -> None:
        if self.tty:
            print(file=sys.stderr)


async def connect_talker(url: str, index: int, rate: int, client: str) -> Talker:
    ws, ready = await open_session(url, rate, client)
    return Talker(index, ws, rate, out_rate=ready.output_sample_rate)


async def session(
    opts: Options, index: int, utterances: list[Utterance], progress: Progress
) -> list[TurnRecord]:
    await asyncio.sleep(index * opts.stagger_s / max(1, opts.sessions))
    talker = await connect_talker(opts.url, index, utterances[0].pcm.rate, "harness")
    records: list[TurnRecord] = []
    try:
        for k in range(opts.turns):
            u = utterances[k % len(utterances)]
            cut_in = utterances[(k + 1) % len(utterances)] if opts.barge_in else None
            record = TurnRecord(index, k + 1, u.name)
            done = await run_turn(talker, record, u, opts.timeout_s, cut_in)
            records += done
            progress.add(done)
            await asyncio.sleep(opts.gap_s)
    finally:
        await talker.close()
    return records


async def run(opts: Options) -> dict[str, object]:
    utterances = [Utterance.load(w) for w in opts.wavs]
    if len({u.pcm.rate for u in utterances}) != 1:
        raise ValueError("all WAVs must have the same sample rate")
    per_session = opts.turns * (2 if opts.barge_in else 1)
    progress = Progress(opts.sessions * per_session)
    load_before = load_average()
    jobs = [session(opts, i, utterances, progress) for i in range(opts.sessions)]
    results = await asyncio.gather(*jobs)
    progress.end()
    records = [r for rs in results for r in rs]
    stats = await asyncio.to_thread(fetch_stats, opts.url)
    summary = summarize(records, opts)
    summary["loop_lag"] = stats.get("loop_lag")
    summary["load_avg_1m"] = {"start": load_before, "end": load_average()}
    return {"summary": summary, "turns": [asdict(r) for r in records]}


def fetch_stats(url: str) -> dict[str, object]:
    """``GET /stats`` of the server behind ``url``; {} if it does not answer."""
    http = url.replace("ws://", "http://").replace("wss://", "https://").split("/v1/", 1)[0]
    try:
        request = urllib.request.Request(f"{http}/stats", headers=auth_headers())
        with urllib.request.urlopen(request, timeout=10) as response:
            stats: dict[str, object] = json.loads(response.read())
    except (OSError, ValueError):
        return {}
    return stats


def percentiles(values: Sequence[float], prefix: str) -> dict[str, float | int | None]:
    """``{prefix}_p50`` ... (linear interpolation between ranks), and ``{prefix}_n``."""
    out: dict[str, float | int | None] = {f"{prefix}_n": len(values)}
    for q in PERCENTILES:
        value = float(np.percentile(values, q)) if values else None
        out[f"{prefix}_p{q}"] = None if value is None else round(value, 1)
    return out


def _values(records: list[TurnRecord], key: str, server: bool = False) -> list[float]:
    out = []
    for r in records:
        source: dict[str, object] = (r.server or {}) if server else asdict(r)
        value = source.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            out.append(float(value))
    return out


def summarize(records: list[TurnRecord], opts: Options) -> dict[str, object]:
    ok = [r for r in records if r.error is None]
    summary: dict[str, object] = {
        "sessions": opts.sessions,
        "turns_per_session": opts.turns,
        "barge_in": opts.barge_in,
        "turns": len(records),
        "completed": len(ok),
        "failed": len(records) - len(ok),
    }
    summary.update(percentiles(_values(ok, "first_audio_ms"), "end_of_speech_to_first_audio_ms"))
    stalls = _values(ok, "playback_stall_ms")
    summary.update(percentiles(stalls, "playback_stall_ms"))
    summary["playback_stalled_turns"] = sum(s >= AUDIBLE_STALL_MS for s in stalls)
    stages: dict[str, object] = {}
    for key in CLIENT_STAGES:
        stages[f"client_{key}"] = percentiles(_values(ok, key), "ms")
    for key in SERVER_STAGES:
        stages[f"server_{key}"] = percentiles(_values(ok, key, server=True), "ms")
    summary["stages"] = stages
    if opts.barge_in:
        cuts = [r.barge_in for r in records if r.barge_in]
        stops = [float(v) for c in cuts if isinstance(v := c.get("stop_ms"), float)]
        events = [float(v) for c in cuts if isinstance(v := c.get("cancelled_event_ms"), float)]
        summary.update(percentiles(stops, "barge_in_stop_ms"))
        summary.update(percentiles(events, "barge_in_cancelled_event_ms"))
    return summary


def _have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def plot(report: dict[str, object], out: Path) -> None:
    """Distribution of end of speech -> first audio, and the per-stage breakdown.

    ``reply_done`` is left out of the bars: it is mostly the reply's own duration.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary, turns = report["summary"], report["turns"]
    assert isinstance(summary, dict) and isinstance(turns, list)
    firsts = [t["first_audio_ms"] for t in turns if not t["error"] and t["first_audio_ms"]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    left.hist(firsts, bins=max(5, min(30, len(firsts))), color="#4a7bd0")
    for q, style in zip(PERCENTILES, ("-", "--", ":"), strict=True):
        value = summary.get(f"end_of_speech_to_first_audio_ms_p{q}")
        if isinstance(value, float):
            left.axvline(value, color="k", linestyle=style, label=f"p{q} {value:.0f} ms")
    left.set(xlabel="end of speech -> first reply audio (ms, client)", ylabel="turns")
    left.set_title(f"{summary['sessions']} session(s), {len(firsts)} turns")
    left.legend()
    _stage_bars(right, summary)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def _stage_bars(ax: object, summary: dict[str, object]) -> None:
    stages = summary["stages"]
    assert isinstance(stages, dict)
    names, p50, p95 = [], [], []
    for name, figures in stages.items():
        if name != "client_reply_done_ms" and isinstance(figures.get("ms_p50"), float):
            names.append(name.replace("_ms", "").replace("_", " "))
            p50.append(figures["ms_p50"])
            p95.append(figures["ms_p95"])
    for key, label in (("barge_in_stop_ms", "barge-in stop"),):
        if isinstance(summary.get(f"{key}_p50"), float):
            names.append(label)
            p50.append(summary[f"{key}_p50"])
            p95.append(summary[f"{key}_p95"])
    y = np.arange(len(names))
    err = [np.zeros(len(names)), np.array(p95) - np.array(p50)]
    ax.barh(y, p50, xerr=err, color="#e08a3c", capsize=3)  # type: ignore[attr-defined]
    ax.set_yticks(y, names)  # type: ignore[attr-defined]
    ax.invert_yaxis()  # type: ignore[attr-defined]
    ax.set(xlabel="ms (bar: p50, whisker: p95)", title="per stage")  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m clients.harness",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--url", default=f"ws://127.0.0.1:8765{p.PATH}")
    parser.add_argument("--wav", type=Path, nargs="+", required=True)
    parser.add_argument("--sessions", type=int, default=1)
    parser.add_argument("--turns", type=int, default=3, help="turns per session")
    parser.add_argument("--json", type=Path, required=True, help="write the report here")
    parser.add_argument(
        "--plot", type=Path, help=f"write a PNG figure here (needs matplotlib: {PLOT_INSTALL})"
    )
    parser.add_argument("--barge-in", action="store_true", help="interrupt every reply")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per turn")
    parser.add_argument("--gap", type=float, default=1.0, help="silence between turns (s)")
    parser.add_argument("--stagger", type=float, default=0.0, help="spread session starts (s)")
    args = parser.parse_args(argv)
    if args.sessions < 1 or args.turns < 1:
        parser.error("--sessions and --turns must be at least 1")
    if args.plot and not _have_matplotlib():
        parser.error(f"--plot needs matplotlib: {PLOT_INSTALL}")
    opts = Options(
        args.url, args.wav, args.sessions, args.turns, args.barge_in, args.timeout, args.gap,
        args.stagger,
    )  # fmt: skip
    try:
        report = asyncio.run(run(opts))
    except (ClientError, ValueError, FileNotFoundError) as exc:
        print(f"harness: {exc}", file=sys.stderr)
        return 1
    args.json.write_text(json.dumps(report, indent=2))
    if args.plot:
        plot(report, args.plot)
    summary = report["summary"]
    assert isinstance(summary, dict)
    print(json.dumps({k: v for k, v in summary.items() if k != "stages"}, indent=2))
    return 0 if summary["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
