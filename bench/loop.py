"""The voice loop as a user hears it: ``quicksilver bench loop``.

    quicksilver bench loop --url ws://127.0.0.1:PORT/v1/voice --wavs DIR [--runs 2] [--json F]
    quicksilver bench loop --serve [--engine E] [--eagerness low] --manifest DIR/manifest.json

Streams WAVs (``python -m bench.speechset`` makes them) through a real server on
loopback like an open microphone: one session, real-time PCM16 frames, the WAV's
trailing silence and then more silence until the reply is done and for a second after
it, one utterance after another; the first WAV is also spoken once first as an unscored
warm-up. It is the Pipecat peer's client (``../shared/peers/pipecat/client.py``) turned
to Quicksilver's protocol, so that both systems are measured the same way. Per
utterance:

* **latency**: arrival of the first reply audio frame minus the true end of speech
  (the manifest's ``speech_end_s`` from the time the WAV's first frame was due), the
  peer client's definition; negative when a reply started while the user was talking;
* the server's ``metrics`` of the turn that answered (endpointing, ASR, first reply
  sentence, TTS first chunk, first audio);
* **early**: some reply audio or ``reply_text`` arrived before the end of speech;
* **turns**: how many turns the utterance made (one with a mid-sentence pause is one);
  a turn withdrawn because the user went on before its audio (``reply_cancelled``
  ``continued``) is not one: its speech is heard again in the turn that follows;
* the transcript and the reply.

Then p50 / p95 / max over the scored utterances, as JSON and a printed table.
``--peer-result`` reads a ``run.sh`` result of the peer instead (and its event log for
the number of turns) and prints the same table for it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from websockets.exceptions import ConnectionClosed

from clients.common import (
    Arrival,
    ClientError,
    Inbox,
    Microphone,
    Pcm,
    load_average,
    open_session,
    read_wav,
    speech_bounds,
)
from server import protocol as p

LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
STAGES = (
    "endpointing_ms",
    "asr_ms",
    "reply_first_sentence_ms",
    "tts_first_chunk_ms",
    "first_audio_ms",
)


@dataclass(frozen=True)
class Utterance:
    """A WAV to speak and where its speech truly ends (from the start of the file)."""

    file: str
    pcm: Pcm
    speech_end_s: float
    text: str = ""
    pause_s: float = 0.0
    set: str = ""
    voice: str = ""
    longest_gap_s: float | None = None  # the longest silence inside the speech


def load_utterances(wavs: Sequence[Path], manifest: Path | None) -> list[Utterance]:
    """The WAVs of ``wavs`` (files or directories) or, with none, those ``manifest``
    lists; the end of speech from the manifest (a directory's ``manifest.json`` where
    none is given), else from the audio's level."""
    if manifest is None and len(wavs) == 1 and wavs[0].is_dir():
        found = wavs[0] / "manifest.json"
        manifest = found if found.exists() else None
    entries = {e["file"]: e for e in json.loads(manifest.read_text())} if manifest else {}
    paths: list[Path] = []
    for w in wavs:
        paths += _listed(w, entries) if w.is_dir() else [w]
    if not wavs and manifest is not None:
        paths = [manifest.parent / name for name in entries]
    if not paths:
        raise ValueError("no WAVs to speak (give --wavs DIR or --manifest FILE)")
    return [_utterance(path, entries.get(path.name)) for path in paths]


def _listed(folder: Path, entries: dict[str, Any]) -> list[Path]:
    names = [n for n in entries if (folder / n).exists()] or sorted(
        f.name for f in folder.glob("*.wav")
    )
    return [folder / n for n in names]


def _utterance(path: Path, entry: dict[str, Any] | None) -> Utterance:
    pcm = read_wav(path)
    if entry is None:
        return Utterance(path.name, pcm, speech_bounds(pcm)[1])
    return Utterance(
        path.name,
        pcm,
        float(entry["speech_end_s"]),
        str(entry.get("text", "")),
        float(entry.get("pause_s", 0.0)),
        str(entry.get("set", "")),
        str(entry.get("voice", "")),
        entry.get("longest_gap_s"),
    )


# --- one session: an open microphone and what comes back ------------------------------


@dataclass
class Watch:
    """Every turn one utterance made, from the events (times ``time.monotonic()``)."""

    speech_end_at: float
    turn_ids: list[int] = field(default_factory=list)
    transcripts: dict[int, str] = field(default_factory=dict)
    replies: dict[int, str] = field(default_factory=dict)
    first_audio_at: dict[int, float] = field(default_factory=dict)
    first_text_at: dict[int, float] = field(default_factory=dict)
    metrics: dict[int, dict[str, Any]] = field(default_factory=dict)
    cancelled: dict[int, str] = field(default_factory=dict)
    actions: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def see(self, a: Arrival) -> None:
        if a.audio is not None:
            self.first_audio_at.setdefault(a.audio[0], a.at)
            return
        match a.message:
            case p.SpeechStarted(turn_id=t) if t not in self.turn_ids:
                self.turn_ids.append(t)
            case p.TranscriptFinal(turn_id=t, text=text):
                self.transcripts[t] = text
            case p.ReplyText(turn_id=t):
                self.first_text_at.setdefault(t, a.at)
            case p.ReplyDone(turn_id=t, text=text):
                self.replies[t] = text
            case p.ReplyCancelled(turn_id=t, reason=reason):
                self.cancelled[t] = reason
            case p.Metrics(turn_id=t) as m:
                self.metrics[t] = asdict(m)
            case p.Action(turn_id=t, name=name, arguments=arguments):
                self.actions.setdefault(t, []).append({"name": name, "arguments": arguments})
            case p.Error(code=code, message=message):
                self.errors.append(f"{code}: {message}")

    @property
    def settled(self) -> bool:
        """Some turn was heard and every one of them has reported its metrics."""
        return bool(self.turn_ids) and all(t in self.metrics for t in self.turn_ids)

    def answer(self) -> int | None:
        """The turn that answered: the last with a whole, non-empty reply."""
        done = [t for t in self.turn_ids if self.replies.get(t) and t not in self.cancelled]
        return done[-1] if done else (self.turn_ids[-1] if self.turn_ids else None)


@dataclass
class UtteranceReport:
    run: int
    index: int
    file: str
    set: str
    voice: str
    text: str
    pause_s: float
    speech_end_s: float
    warmup: bool
    longest_gap_s: float | None = None
    latency_ms: float | None = None  # first reply audio (any turn) - true end of speech
    answer_latency_ms: float | None = None  # the same for the turn that answered
    early: bool = False  # reply audio or reply_text before the end of speech
    turns: int = 0
    turn_ids: list[int] = field(default_factory=list)
    transcript: str = ""
    reply: str = ""
    actions: list[dict[str, Any]] = field(default_factory=list)  # the answering turn's calls
    stages: dict[str, float | None] = field(default_factory=dict)
    speculative: bool | None = None
    end_of_turn: str | None = None  # the answering turn's end-of-turn tier (metrics)
    cancelled: dict[int, str] = field(default_factory=dict)
    error: str | None = None


def report(run: int, index: int, u: Utterance, warmup: bool, w: Watch) -> UtteranceReport:
    r = UtteranceReport(
        run, index, u.file, u.set, u.voice, u.text, u.pause_s, u.speech_end_s, warmup,
        u.longest_gap_s,
    )  # fmt: skip

    def ms(t: float) -> float:
        return round((t - w.speech_end_at) * 1000, 1)

    mine = [t for t in w.turn_ids if t in w.first_audio_at]
    if mine:
        r.latency_ms = ms(min(w.first_audio_at[t] for t in mine))
    answer = w.answer()
    if answer is not None and answer in w.first_audio_at:
        r.answer_latency_ms = ms(w.first_audio_at[answer])
    sent = [w.first_audio_at.get(t) for t in w.turn_ids] + [
        w.first_text_at.get(t) for t in w.turn_ids
    ]
    r.early = any(t is not None and t < w.speech_end_at for t in sent)
    r.turn_ids = list(w.turn_ids)
    r.turns = sum(w.cancelled.get(t) != "continued" for t in w.turn_ids)
    r.transcript = " | ".join(w.transcripts.get(t, "") for t in w.turn_ids)
    r.reply = w.replies.get(answer, "") if answer is not None else ""
    r.actions = w.actions.get(answer, []) if answer is not None else []
    m = w.metrics.get(answer, {}) if answer is not None else {}
    r.stages = {k: m.get(k) for k in STAGES}
    r.speculative = m.get("speculative")
    r.end_of_turn = m.get("end_of_turn")
    r.cancelled = {t: w.cancelled[t] for t in w.turn_ids if t in w.cancelled}
    if w.errors:
        r.error = "; ".join(w.errors)
    elif not w.turn_ids:
        r.error = "no turn heard"
    elif r.latency_ms is None:
        r.error = "no reply audio"
    return r


async def speak(mic: Microphone, inbox: Inbox, u: Utterance, timeout_s: float) -> Watch:
    """Play one utterance and follow what it makes until every turn has reported (or
    ``timeout_s`` after the end of speech)."""
    playback = mic.play(u.pcm)
    watch = Watch(await playback.started + u.speech_end_s)
    deadline = watch.speech_end_at + timeout_s
    try:
        async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
            while not playback.finished.done():  # settled or not, the WAV plays out
                getter = asyncio.ensure_future(inbox.get())
                either: set[asyncio.Future[Any]] = {getter, playback.finished}
                await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    watch.see(getter.result())
                else:
                    getter.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await getter
            while not watch.settled:
                watch.see(await inbox.get())
    except TimeoutError:
        watch.errors.append(f"no complete reply within {timeout_s:.0f} s of the end of speech")
    return watch


@dataclass
class Options:
    url: str
    utterances: list[Utterance]
    runs: int = 1
    frame_ms: int = 20
    reply_timeout_s: float = 40.0  # after the end of speech, as the peer's client
    gap_s: float = 1.0  # silence after a reply before the next utterance, as the peer's
    warmup: bool = True


async def one_run(opts: Options, run: int) -> tuple[list[UtteranceReport], p.Ready]:
    """One session: the warm-up, then every utterance in order."""
    rate = opts.utterances[0].pcm.rate
    ws, ready = await open_session(opts.url, rate, "bench-loop")
    inbox, mic = Inbox(ws), Microphone(ws, rate, opts.frame_ms)
    plan = [(opts.utterances[0], True)] if opts.warmup else []
    plan += [(u, False) for u in opts.utterances]
    out = []
    try:
        for i, (u, warm) in enumerate(plan):
            watch = await speak(mic, inbox, u, opts.reply_timeout_s)
            out.append(report(run, i, u, warm, watch))
            _progress(out[-1])
            await asyncio.sleep(opts.gap_s)  # the microphone keeps sending silence
    except (OSError, ConnectionClosed, ClientError) as exc:
        raise ClientError(f"connection lost: {exc or type(exc).__name__}") from None
    finally:
        await mic.close()
        await inbox.close()
        await ws.close()
    return out, ready


def _progress(r: UtteranceReport) -> None:
    tag = "warm-up " if r.warmup else ""
    print(
        f"loop: run {r.run} {tag}{r.file}: latency {r.latency_ms} ms, turns {r.turns}, "
        f"early {r.early}{', ' + r.error if r.error else ''}",
        file=sys.stderr,
        flush=True,
    )


# --- figures -------------------------------------------------------------------------


def spread(values: Sequence[float]) -> dict[str, float | int | None]:
    """n, p50, p95 (linear between ranks) and max."""
    if not values:
        return {"n": 0, "p50": None, "p95": None, "max": None}
    v = np.asarray(values, dtype=float)
    return {
        "n": len(values),
        "p50": round(float(np.percentile(v, 50)), 1),
        "p95": round(float(np.percentile(v, 95)), 1),
        "max": round(float(v.max()), 1),
    }


def summarize(reports: Sequence[UtteranceReport]) -> dict[str, Any]:
    scored = [r for r in reports if not r.warmup]
    latencies = [r.latency_ms for r in scored if r.latency_ms is not None]
    paused = [r for r in scored if r.pause_s > 0]
    return {
        "utterances": len(scored),
        "failed": sum(r.error is not None for r in scored),
        "latency_ms": spread(latencies),
        "early_replies": sum(r.early for r in scored),
        "turns_per_utterance": [r.turns for r in scored],
        "paused": {
            "utterances": len(paused),
            "one_turn": sum(r.turns == 1 for r in paused),
            "turns": [r.turns for r in paused],
            "early_replies": sum(r.early for r in paused),
        },
        "end_of_turn": dict(Counter(r.end_of_turn or "none" for r in scored)),
        "stages_ms": {
            k: spread([v for r in scored if isinstance(v := r.stages.get(k), int | float)])
            for k in STAGES
        },
    }


def git_commit() -> str | None:
    """The measured checkout's commit (with ``+dirty`` for uncommitted changes)."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
        )
    except OSError:
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "load_avg_1m": load_average(),
        "time": time.strftime("%Y-%m-%d %H:%M"),
    }


async def run(opts: Options) -> dict[str, Any]:
    """``opts.runs`` sessions in sequence; the report of each and of all together."""
    if len({u.pcm.rate for u in opts.utterances}) != 1:
        raise ValueError("all WAVs must have the same sample rate")
    start = machine()
    runs, every, ready = [], [], None
    for k in range(1, opts.runs + 1):
        reports, ready = await one_run(opts, k)
        runs.append({"summary": summarize(reports), "utterances": [asdict(r) for r in reports]})
        every += reports
    return {
        "system": "quicksilver",
        "url": opts.url,
        "reply_engine": ready.reply_engine if ready else None,
        "asr": ready.asr if ready else None,
        "commit": git_commit(),
        "frame_ms": opts.frame_ms,
        "machine": {"start": start, "end": machine()},
        "runs": runs,
        "summary": summarize(every),
    }


def print_table(result: dict[str, Any], out: Any = None) -> None:
    """Per utterance, then the p50 / p95 / max lines of each run and of all runs."""
    out = out or sys.stdout
    head = f"{'run':>3} {'file':28s} {'pause':>5} {'gap':>4} {'latency':>8} {'early':>5} "
    head += f"{'turns':>5} "
    head += " ".join(f"{k.removesuffix('_ms')[:14]:>14}" for k in STAGES)
    print(head, file=out)
    for r in result["runs"]:
        for u in r["utterances"]:
            if u["warmup"]:
                continue
            stages = " ".join(f"{_num(u['stages'].get(k)):>14}" for k in STAGES)
            print(
                f"{u['run']:>3} {u['file'][:28]:28s} {u['pause_s']:5.2f} "
                f"{_num((u['longest_gap_s'] or 0) * 1000):>4} "
                f"{_num(u['latency_ms']):>8} {'yes' if u['early'] else '-':>5} "
                f"{u['turns']:>5} {stages}",
                file=out,
            )
            print(f"      {u['transcript']!r} -> {u['reply'][:90]!r}", file=out)
            for a in u.get("actions") or []:  # a peer's report has none
                print(f"      action {a['name']} {json.dumps(a['arguments'])}", file=out)
            if u["error"]:
                print(f"      error: {u['error']}", file=out)
    for i, r in enumerate(result["runs"], 1):
        _summary_line(f"run {i}", r["summary"], out)
    if len(result["runs"]) > 1:
        _summary_line("all runs", result["summary"], out)


def _summary_line(label: str, s: dict[str, Any], out: Any) -> None:
    lat, paused = s["latency_ms"], s["paused"]
    print(
        f"{label}: latency p50 {_num(lat['p50'])} p95 {_num(lat['p95'])} max "
        f"{_num(lat['max'])} ms over {lat['n']}; early replies {s['early_replies']}/"
        f"{s['utterances']}; paused utterances with one turn {paused['one_turn']}/"
        f"{paused['utterances']} (turns {paused['turns']}); failed {s['failed']}",
        file=out,
    )
    stages = ", ".join(
        f"{k.removesuffix('_ms')} {_num(v['p50'])}" for k, v in s.get("stages_ms", {}).items()
    )
    if stages:
        print(f"  stage p50 (ms): {stages}", file=out)
    tiers = s.get("end_of_turn", {})
    if set(tiers) - {"none"}:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(tiers.items()))
        print(f"  end of turn: {counts}", file=out)


def _num(value: object) -> str:
    return "-" if not isinstance(value, int | float) else f"{value:.0f}"


# --- the peer's results, in the same form ------------------------------------------------


def peer_result(
    result: Path, events: Path | None, utterances: Sequence[Utterance]
) -> dict[str, Any]:
    """A ``run.sh`` result of the Pipecat peer as this benchmark's report.

    The latency is its client's ``latency_s`` (any reply audio in the WAV's window) and
    early = reply audio before the end of speech in that window: both charge a late
    reply to the utterance playing when it came. The turns do not depend on timing:
    they are the bot's LLM requests per utterance, each request going to the utterance
    its last transcript was said in (:func:`peer_turns`).
    """
    data = json.loads(result.read_text())
    if events is None:  # run.sh: results/LABEL-TS.json beside logs/events-LABEL-TS.jsonl
        events = result.parent.parent / "logs" / f"events-{result.stem}.jsonl"
    log = [json.loads(line) for line in events.read_text().splitlines() if line.strip()]
    known = {u.file: u for u in utterances}
    turns = data["turns"]
    texts = [
        known[t["file"]].text if t["file"] in known else t.get("expected_text") or "" for t in turns
    ]
    requests, heard = peer_turns(log, texts)
    reports = []
    for i, t in enumerate(turns):
        lo, end = t["stream_start"], t["speech_end_abs"]
        hi = turns[i + 1]["stream_start"] if i + 1 < len(turns) else float("inf")
        u = known.get(t["file"])
        r = UtteranceReport(
            1, i, t["file"], u.set if u else "", u.voice if u else "", u.text if u else "",
            u.pause_s if u else 0.0, u.speech_end_s if u else end - lo, bool(t["warmup"]),
            u.longest_gap_s if u else None,
        )  # fmt: skip
        latency = t.get("latency_s")
        r.latency_ms = None if latency is None else round(latency * 1000, 1)
        audio_at = [e["t"] for e in log if e["event"] == "tts_first_audio" and lo <= e["t"] < hi]
        r.early = (latency is not None and latency < 0) or any(a < end for a in audio_at)
        r.turns, r.transcript = requests[i], " | ".join(heard[i])
        r.reply = t.get("reply_text") or ""
        stages = t.get("stages_rel_speech_end_s") or {}
        r.stages = {k: None if v is None else round(v * 1000, 1) for k, v in stages.items()}
        r.error = None if r.latency_ms is not None else "no reply audio"
        reports.append(r)
    summary = summarize(reports)
    summary["stages_ms"] = {}  # the peer's stages are times from the end of speech
    return {
        "system": "pipecat",
        "label": data.get("label"),
        "config": data.get("config"),
        "runs": [{"summary": summary, "utterances": [asdict(r) for r in reports]}],
        "summary": summary,
    }


# words too common to tell two requests apart
_STOP_WORDS = frozenset(
    {
        "a", "an", "the", "to", "is", "it", "my", "me", "i", "in", "on", "of", "for", "at",
        "and", "you", "can", "what", "how", "this", "that", "be", "will", "with", "by", "so",
    }
)  # fmt: skip


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower())) - _STOP_WORDS


def peer_turns(
    log: Sequence[dict[str, Any]], texts: Sequence[str]
) -> tuple[list[int], list[list[str]]]:
    """(LLM requests, transcripts) per utterance of a peer's event log, in order.

    A peer that falls behind transcribes and answers an utterance while the next ones
    play, so the times say little; the words do. Each transcript goes to the current
    utterance or, when it shares more of its words (at least 30 %) with one of the next
    two or repeats what the current one already heard, to that one; each request to the
    utterance of the transcript before it.
    """
    want = [_words(t) for t in texts]
    heard: list[set[str]] = [set() for _ in texts]
    requests = [0] * len(texts)
    said: list[list[str]] = [[] for _ in texts]
    i, last = 0, None
    for e in log:
        if e["event"] == "transcript" and e.get("text", "").strip():
            w = _words(e["text"])

            def share(j: int, w: set[str] = w) -> float:
                return len(w & want[j]) / max(1, len(w))

            ahead = [j for j in range(i + 1, min(i + 3, len(texts))) if share(j) >= 0.3]
            if ahead and w and w <= heard[i]:  # said again: the next utterance says it
                i = ahead[0]
            elif ahead and max(map(share, ahead)) > share(i):
                i = max(ahead, key=lambda j: (share(j), -j))
            heard[i] |= w
            said[i].append(e["text"].strip())
            last = i
        elif e["event"] == "llm_request" and last is not None:
            requests[last] += 1
    return requests, said


# --- a server of our own ----------------------------------------------------------------


class OwnServer:
    """``quicksilver serve --port 0`` on loopback, as a user starts it; stopped by PID."""

    def __init__(self, args: Sequence[str], log: Path, timeout_s: float = 900) -> None:
        cmd = [sys.executable, "-m", "cli", "serve", "--host", "127.0.0.1", "--port", "0"]
        with log.open("w") as err:
            self.proc = subprocess.Popen(
                [*cmd, *args],
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        self.log = log
        found: list[str] = []
        done = threading.Event()

        def read() -> None:
            assert self.proc.stdout is not None
            with self.proc.stdout:
                for line in self.proc.stdout:
                    if "listening on " in line and not found:
                        found.append(line.split("listening on ", 1)[1].split()[0])
                        done.set()
            done.set()

        self.reader = threading.Thread(target=read, daemon=True)
        self.reader.start()
        if not done.wait(timeout_s) or not found:
            self.stop()
            raise ClientError(f"the server did not start; see {log}")
        self.url = found[0]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.reader.join(10)


# --- command line ---------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url", default=None, help=f"a server on loopback, ws://127.0.0.1:PORT{p.PATH}"
    )
    parser.add_argument(
        "--serve",
        action="store_true",
        help="start `quicksilver serve --port 0` for the benchmark and stop it after",
    )
    parser.add_argument("--engine", default=None, help="with --serve: the reply engine")
    parser.add_argument(
        "--eagerness", choices=("low", "medium", "high"), default=None, help="with --serve"
    )
    parser.add_argument("--cache-dir", type=Path, default=None, help="with --serve")
    parser.add_argument(
        "--wavs", type=Path, nargs="*", default=[], help="WAV files or a speechset directory"
    )
    parser.add_argument(
        "--manifest", type=Path, default=None, help="speechset manifest (true end of speech)"
    )
    parser.add_argument("--runs", type=int, default=1, help="sessions, one after another")
    parser.add_argument(
        "--frame-ms",
        type=int,
        default=20,
        choices=range(20, 33),
        metavar="MS",
        help="microphone frame, 20-32 ms",
    )
    parser.add_argument("--reply-timeout", type=float, default=40.0, help="s after speech end")
    parser.add_argument("--no-warmup", action="store_true", help="score the first WAV too")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    parser.add_argument(
        "--peer-result",
        type=Path,
        default=None,
        help="instead: report a Pipecat peer run.sh result (with its event log)",
    )
    parser.add_argument("--peer-events", type=Path, default=None, help="the peer's event log")


def check_loopback(url: str) -> None:
    host = urllib.parse.urlsplit(url).hostname or ""
    if host not in LOOPBACK:
        raise ClientError(f"the loop benchmark talks to loopback only, not {host or url!r}")


def run_command(args: argparse.Namespace) -> int:
    """``quicksilver bench loop``."""
    try:
        if args.peer_result is not None:
            given = args.wavs or args.manifest
            utterances = load_utterances(args.wavs, args.manifest) if given else []
            result = peer_result(args.peer_result, args.peer_events, utterances)
        else:
            result = _measure(args, load_utterances(args.wavs, args.manifest))
    except (ClientError, ValueError, OSError) as exc:
        print(f"quicksilver bench loop: {exc}", file=sys.stderr)
        return 1
    print_table(result)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0 if result["summary"]["failed"] == 0 else 1


def _measure(args: argparse.Namespace, utterances: list[Utterance]) -> dict[str, Any]:
    if args.runs < 1:
        raise ValueError("--runs needs 1 or more")
    if args.serve == (args.url is not None):
        raise ValueError("give either --url or --serve")
    server = None
    if args.serve:
        extra = ["--engine", args.engine] if args.engine else []
        extra += ["--eagerness", args.eagerness] if args.eagerness else []
        extra += ["--cache-dir", str(args.cache_dir)] if args.cache_dir else []
        fd, name = tempfile.mkstemp(prefix="quicksilver-bench-loop-", suffix=".log")
        os.close(fd)
        log = Path(name)
        print(f"loop: starting quicksilver serve {' '.join(extra)} (log {log})", file=sys.stderr)
        server = OwnServer(extra, log)
    url = server.url if server else args.url
    try:
        check_loopback(url)
        opts = Options(
            url,
            utterances,
            runs=args.runs,
            frame_ms=args.frame_ms,
            reply_timeout_s=args.reply_timeout,
            warmup=not args.no_warmup,
        )
        return asyncio.run(run(opts))
    finally:
        if server is not None:
            server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.loop",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return run_command(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
