"""``quicksilver eval actions --spoken``: the actions eval as a user says it.

    quicksilver eval actions --spoken --json F [--url ws://127.0.0.1:PORT/v1/voice | --asr NAME]
                             [--voices piper espeak-us espeak-gb] [--noise clean babble:10]
                             [--per-tool 2] [--chat-limit 10] [--limit N] [--sessions 2]
    python -m bench.asr --spoken   # the Whisper models' WER on the same utterances

The held-out lines of ``quicksilver data --actions`` (commands and chat questions, never
trained on) and lines that sound like commands but ask for nothing the default tools do
(:data:`NOT_COMMANDS`), each spoken by every voice in every noise condition, through a
real server's audio path: a ``quicksilver serve`` started on loopback for the run (or
the one at ``--url``), real VAD, faster-whisper, reply engine and Piper. One fresh
session per utterance, ``--sessions`` of them at a time. The audio is sent as a
push-to-talk client does (the car's button): frames as fast as the socket takes them,
then ``end_of_input`` and the silence of a released button, so the turn ends where the
speech does and the run takes minutes, not the sum of the utterances' audio.

What each turn made is read from its events. A confirmation question ("Send 'I'm
running late' to your sister?", docs/actions.md "Asking first") is answered with a typed
"Yes." in the same session, and the call that yes makes is the turn's call, marked
``asked``. A turn whose first sentence comes with no call did not act (the served
engines write a call before any words). Scores, per voice and noise and overall:

* **exact**: a command line's call has the expected tool and arguments (compared as
  ``eval actions`` compares them, ``training.eval_actions.same_call``, strings as words
  said: "10" is "ten");
* **false actions**: a line that is not a command (chat, or :data:`NOT_COMMANDS`) made a
  call without asking (**false asks**: it asked about one);
* **wrong calls**: a command line's call, made without asking, has a wrong tool or value
  (the costly kind; **wrong asks**: a wrong call asked about, which a user would refuse);
* **contradictions**: the spoken confirmation of a call fails ``model.confirm.problems``;
* **WER**: the server's final transcript against the line (the ASR's time per turn is
  ``python -m bench.asr --spoken``'s: a turn that did not act is left before its
  ``metrics``, so ``asr_ms_p50`` here is of the turns that acted).

Generated speech and noise stay in memory or in a temporary directory, never the repo.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from audio.resample import SAMPLE_RATE, float32_to_int16
from audio.speech import SpeechFactory, edit_distance, normalize_words, pad
from clients.common import ClientError, Inbox, Pacer, Pcm, frames, open_session, silence
from model.confirm import is_question, problems, tool_named
from model.cpu import read_cpu
from model.tools import DEFAULT_TOOLS, ToolCall
from server import protocol as p
from training.eval_actions import read_cases, same_call

Float32Array = NDArray[np.float32]
Kind = Literal["command", "chat", "other"]

# Lines that sound like commands (a tool's words: "read", "message", "call", "lights",
# "that's all", "yes") but ask for nothing the default tools do: acting on any of them
# is a false action. The first eight are the (issue 39); the rest are ours.
NOT_COMMANDS = (
    "Read me my last message.",
    "Translate thank you very much into Spanish.",
    "Add milk to my shopping list.",
    "I called my mom yesterday.",
    "Yes, please.",
    "Thanks, goodbye.",
    "The lights in this city are beautiful.",
    "Okay, that's all for now.",
    "My sister sent me a funny message this morning.",
    "That timer went off too early.",
    "The music at the party was too loud.",
    "Can you tell me a joke about the weather?",
)

# name -> (synthesizer, espeak-ng voice, words per minute): Piper's joe (the voice the
# project ships) and espeak-ng's formant voices, each unlike the other
VOICES: dict[str, tuple[str, str, int]] = {
    "piper": ("piper", "", 0),
    "espeak-us": ("espeak", "en-us", 165),
    "espeak-gb": ("espeak", "en-gb+m3", 150),
    "espeak-f": ("espeak", "en-us+f3", 180),
}
DEFAULT_VOICES = ("piper", "espeak-us", "espeak-gb")
DEFAULT_NOISE = ("clean", "babble:10")
LEAD_S = 0.3  # about the endpointer's pre-roll
TRAIL_S = 0.3  # silence (or noise) after the speech, before end_of_input
BABBLE_TALKERS = 4  # other lines summed into babble
_SAID = re.compile(r"[.!?]$")  # a sentence's end: ReplyText may carry a part of one


@dataclass(frozen=True)
class Line:
    text: str
    kind: Kind
    expected: ToolCall | None = None  # a command's call


@dataclass(frozen=True)
class Noise:
    """``clean``, or ``white`` / ``babble`` (other lines, other voices, summed) at
    ``snr_db`` below the speech's mean power."""

    kind: Literal["clean", "white", "babble"]
    snr_db: float = 0.0

    @property
    def label(self) -> str:
        return "clean" if self.kind == "clean" else f"{self.kind} {self.snr_db:g} dB"


def parse_noise(spec: str) -> Noise:
    """``clean``, ``white:10``, ``babble:5``."""
    kind, _, snr = spec.partition(":")
    if kind == "clean" and not snr:
        return Noise("clean")
    if kind in ("white", "babble") and snr:
        return Noise(kind, float(snr))  # type: ignore[arg-type]
    raise ValueError(f"noise {spec!r}: clean, white:SNR_DB or babble:SNR_DB")


def eval_lines(
    data: Path,
    per_tool: int | None,
    chat_limit: int | None,
    others: Sequence[str] = NOT_COMMANDS,
) -> list[Line]:
    """The held-out commands (the first ``per_tool`` of each tool) and chat questions,
    then ``others``, interleaved so that a ``--limit`` keeps some of each kind."""
    commands = [
        Line(c.text, "command", c.expected)
        for c in read_cases(data / "heldout_commands.jsonl", per_tool)
    ]
    chat = [Line(c.text, "chat") for c in read_cases(data / "heldout_chat.jsonl")][:chat_limit]
    rest = [Line(t, "other") for t in others]
    out: list[Line] = []
    for i in range(max(len(commands), len(chat), len(rest))):
        out += [group[i] for group in (commands, chat, rest) if i < len(group)]
    return out


# --- speech ---------------------------------------------------------------------------


def say(factory: SpeechFactory, voice: str, text: str) -> Float32Array:
    synth, name, wpm = VOICES[voice]
    if synth == "piper":
        return factory.piper(text)
    return factory.espeak(text, voice=name, words_per_minute=wpm)


def white(n: int, seed: int) -> Float32Array:
    out: Float32Array = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    return out


def babble(talkers: Sequence[Float32Array], n: int, seed: int) -> Float32Array:
    """Several other speakers at once, each from a seeded offset, repeated to ``n``
    samples and scaled to unit power: speech-shaped noise with words in it."""
    rng = np.random.default_rng(seed)
    out = np.zeros(n, np.float64)
    for t in talkers:
        t = t / max(1e-9, float(np.sqrt(np.mean(t.astype(np.float64) ** 2))))
        start = int(rng.integers(len(t)))
        out += np.resize(np.roll(t, -start), n)
    unit: Float32Array = (out / np.sqrt(np.mean(out**2))).astype(np.float32)
    return unit


def utterance(speech: Float32Array, noise: Noise, noise_source: Float32Array) -> Float32Array:
    """``speech`` with silence around it and, when noisy, ``noise_source`` (unit power,
    as long as the result) ``noise.snr_db`` below the speech's power, running through
    the silence too."""
    padded = pad(speech, LEAD_S, TRAIL_S)
    if noise.kind == "clean":
        return padded
    power = float(np.mean(speech.astype(np.float64) ** 2))
    gain = np.sqrt(power / 10 ** (noise.snr_db / 10))
    out: Float32Array = np.clip(padded + gain * noise_source[: len(padded)], -1, 1)
    return out.astype(np.float32)


def noise_for(
    noise: Noise, n: int, seed: int, others: Callable[[], Sequence[Float32Array]]
) -> Float32Array:
    if noise.kind == "white":
        return white(n, seed)
    if noise.kind == "babble":
        return babble(others(), n, seed)
    return np.zeros(n, np.float32)


# --- one utterance through the server -------------------------------------------------


@dataclass
class Heard:
    """What one session made of one utterance."""

    transcript: str = ""
    call: dict[str, Any] | None = None  # the first action's {name, arguments}
    calls: int = 0  # actions in all
    reply: str = ""  # the words that went with the call (or the first sentence)
    question: str = ""  # the confirmation question asked, if any
    asked: bool = False  # the call was made after a question and a yes
    asr_ms: float | None = None
    error: str | None = None
    served: tuple[str, str] = ("", "")  # the server's ASR model and reply engine (ready)


@dataclass
class _Turn:
    actions: list[dict[str, Any]] = field(default_factory=list)
    sentences: list[str] = field(default_factory=list)
    transcript: str = ""
    asr_ms: float | None = None
    done: bool = False


async def _follow(inbox: Inbox, timeout_s: float) -> _Turn:
    """Read one turn's events: to its end when it acts or asks, else to the end of its
    first sentence (or to its metrics, when it says nothing)."""
    turn = _Turn()
    started = False
    async with asyncio.timeout(timeout_s):
        while True:
            a = await inbox.get()
            match a.message:
                case p.SpeechStarted():
                    started = True
                case p.TranscriptFinal(text=text):
                    turn.transcript = " ".join(filter(None, (turn.transcript, text)))
                case p.Action(name=name, arguments=arguments):
                    turn.actions.append({"name": name, "arguments": arguments})
                case p.ReplyText(text=text):
                    turn.sentences.append(text)
                    said = " ".join(turn.sentences).strip()
                    if not turn.actions and _SAID.search(said) and not is_question(said):
                        return turn
                case p.Metrics(asr_ms=ms):
                    turn.asr_ms = ms if ms is not None else turn.asr_ms
                    if turn.done:
                        return turn
                case p.ReplyDone() | p.ReplyCancelled():
                    turn.done = True
                case p.Error(code="no_speech", message=message) if not started:
                    raise ClientError(f"no_speech: {message}")


async def hear(url: str, audio: Float32Array, timeout_s: float = 60.0) -> Heard:
    """One fresh session: ``audio`` (16 kHz) as push-to-talk, then ``end_of_input``;
    a confirmation question is answered with a typed "Yes."."""
    ws, ready = await open_session(url, SAMPLE_RATE, "eval-spoken")
    inbox = Inbox(ws)
    heard = Heard(served=(ready.asr, ready.reply_engine))
    quiet: asyncio.Task[None] | None = None
    try:
        for chunk in frames(Pcm(float32_to_int16(audio), SAMPLE_RATE)):
            await ws.send(chunk)
        await ws.send(p.encode(p.EndOfInput()))
        # A turn the endpointer already held open at a pause is not ended by
        # end_of_input (it answers no_speech): the silence of a released button, sent
        # at real time, lets the turn end as an open microphone's would.
        quiet = asyncio.create_task(_quiet(ws))
        turn = await _follow(inbox, timeout_s)
        heard.transcript, heard.asr_ms = turn.transcript, turn.asr_ms
        said = " ".join(turn.sentences).strip()
        if not turn.actions and is_question(said):
            heard.question = said
            await ws.send(p.encode(p.Text("Yes.")))
            turn = await _follow(inbox, timeout_s)
            heard.asked = bool(turn.actions)
            said = " ".join(turn.sentences).strip()
        if turn.actions:
            heard.call, heard.calls = turn.actions[0], len(turn.actions)
        heard.reply = said
    except (ClientError, TimeoutError) as exc:
        heard.error = str(exc) or type(exc).__name__
    finally:
        if quiet is not None:
            quiet.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
                await quiet
        await inbox.close()
        await ws.close()
    return heard


async def _quiet(ws: ClientConnection) -> None:
    pacer, frame = Pacer(), silence(SAMPLE_RATE, 0.02).samples.tobytes()
    while True:
        await pacer.wait(0.02)
        await ws.send(frame)


# --- scoring --------------------------------------------------------------------------


def score(line: Line, heard: Heard) -> dict[str, Any]:
    """One utterance's row: what was said and heard, the call and what it counts as."""
    call = _call(heard.call)
    exact = line.kind == "command" and call is not None and same_spoken_call(call, line.expected)
    wrong = line.kind == "command" and call is not None and not exact
    tool = tool_named(DEFAULT_TOOLS, call.name) if call is not None else None
    contradiction = problems(call, heard.reply, tool) if call is not None else []
    ref = normalize_words(line.text)
    return {
        "text": line.text,
        "kind": line.kind,
        "expected": _call_json(line.expected),
        "transcript": heard.transcript,
        "word_errors": edit_distance(ref, normalize_words(heard.transcript)),
        "words": len(ref),
        "call": heard.call,
        "asked": heard.asked,
        "question": heard.question,
        "reply": heard.reply,
        "exact": exact,
        "false_action": line.kind != "command" and call is not None and not heard.asked,
        "false_ask": line.kind != "command" and bool(heard.question),
        "wrong_call": wrong and not heard.asked,
        "wrong_ask": wrong and heard.asked,
        "contradiction": contradiction,
        "asr_ms": heard.asr_ms,
        "error": heard.error,
    }


def same_spoken_call(a: ToolCall, b: ToolCall | None) -> bool:
    """``eval actions``' comparison, with string values compared as words said
    (``audio.speech.normalize_words``): Whisper writes "in 10 minutes" for "in ten
    minutes", and a message saying either says the same."""
    if b is None or a.name != b.name or set(a.arguments) != set(b.arguments):
        return False
    return all(
        normalize_words(v) == normalize_words(b.arguments[k])
        if isinstance(v, str) and isinstance(b.arguments[k], str)
        else same_call(ToolCall(a.name, {k: v}), ToolCall(b.name, {k: b.arguments[k]}))
        for k, v in a.arguments.items()
    )


def _call(c: Mapping[str, Any] | None) -> ToolCall | None:
    return None if c is None else ToolCall(c["name"], dict(c["arguments"]))


def _call_json(call: ToolCall | None) -> dict[str, Any] | None:
    return None if call is None else {"name": call.name, "arguments": dict(call.arguments)}


def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The four scores, WER and ASR time over ``rows``."""
    commands = [r for r in rows if r["kind"] == "command"]
    others = [r for r in rows if r["kind"] != "command"]
    acted = [r for r in rows if r["call"] is not None]
    ms = [r["asr_ms"] for r in rows if r["asr_ms"] is not None]
    words = sum(r["words"] for r in rows)

    def rate(n: int, of: int) -> float | None:
        return round(n / of, 4) if of else None

    exact = sum(r["exact"] for r in commands)
    false = sum(r["false_action"] for r in others)
    wrong = sum(r["wrong_call"] for r in commands)
    contra = sum(bool(r["contradiction"]) for r in acted)
    misheard = [r for r in rows if r["word_errors"]]
    return {
        "utterances": len(rows),
        "commands": len(commands),
        "not_commands": len(others),
        "exact": exact,
        "exact_rate": rate(exact, len(commands)),
        "false_actions": false,
        "false_action_rate": rate(false, len(others)),
        "false_asks": sum(r["false_ask"] for r in others),
        "wrong_calls": wrong,
        "wrong_call_rate": rate(wrong, len(commands)),
        "wrong_asks": sum(r["wrong_ask"] for r in commands),
        # commands made right after a question and a yes: what asking costs a user
        "right_asks": sum(r["exact"] and r["asked"] for r in commands),
        "contradictions": contra,
        # of the contradictions, those of a template spoken after a question and a yes
        "contradictions_after_yes": sum(bool(r["contradiction"]) for r in acted if r["asked"]),
        # of the false actions and wrong calls, those on lines the ASR got a word wrong
        "false_actions_misheard": sum(r["false_action"] for r in misheard),
        "wrong_calls_misheard": sum(r["wrong_call"] for r in misheard),
        "wer": rate(sum(r["word_errors"] for r in rows), words),
        "asr_ms_p50": statistics.median(ms) if ms else None,
        "errors": sum(r["error"] is not None for r in rows),
    }


GOALS = {
    "exact_rate": ">= 0.85",
    "false_action_rate": "<= 0.02",
    "wrong_call_rate": "<= 0.01",
    "contradictions": "0",
}


def by_condition(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """:func:`summarize` per voice and noise (``"piper, clean"``), then ``"all"``."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault(f"{r['voice']}, {r['noise']}", []).append(r)
    out = {k: summarize(v) for k, v in groups.items()}
    out["all"] = summarize(rows)
    return out


def table(conditions: Mapping[str, Mapping[str, Any]]) -> str:
    """Markdown: a row per voice and noise (docs/actions.md)."""
    lines = [
        "| voice, noise | commands right | false actions (misheard) | wrong calls (misheard) "
        "| contradictions (after a yes) | asked: right / wrong calls / not commands | WER |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, s in conditions.items():
        cells = [
            f"{s['exact']}/{s['commands']}",
            f"{s['false_actions']}/{s['not_commands']} ({s['false_actions_misheard']})",
            f"{s['wrong_calls']}/{s['commands']} ({s['wrong_calls_misheard']})",
            f"{s['contradictions']} ({s['contradictions_after_yes']})",
            f"{s['right_asks']} / {s['wrong_asks']} / {s['false_asks']}",
            "-" if s["wer"] is None else f"{s['wer']:.1%}",
        ]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --- the run --------------------------------------------------------------------------


@dataclass(frozen=True)
class SpokenOptions:
    data: Path = Path("data/actions")
    voices: tuple[str, ...] = DEFAULT_VOICES
    noise: tuple[Noise, ...] = tuple(parse_noise(n) for n in DEFAULT_NOISE)
    per_tool: int | None = 2
    chat_limit: int | None = 10
    limit: int | None = None  # the first N lines (each in every voice and noise)
    seed: int = 0
    timeout_s: float = 60.0
    sessions: int = 2  # at a time: one's reply audio plays out while the next is heard


def plan(opts: SpokenOptions, lines: Sequence[Line]) -> Iterable[tuple[int, Line, str, Noise]]:
    """(seed, line, voice, noise) for every utterance, in a fixed order."""
    seed = opts.seed
    for voice in opts.voices:
        for noise in opts.noise:
            for line in lines:
                yield seed, line, voice, noise
                seed += 1


async def run_spoken(
    url: str, opts: SpokenOptions, cache: Path, log: Callable[[str], None] = print
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Every line in every voice and noise, one session each, ``opts.sessions`` of
    them at a time: a row per utterance (in the plan's order), and the server's ASR
    model and reply engine."""
    served: dict[str, str] = {}
    lines = eval_lines(opts.data, opts.per_tool, opts.chat_limit)[: opts.limit]
    factory = SpeechFactory(cache)
    todo = list(plan(opts, lines))
    rows: list[dict[str, Any] | None] = [None] * len(todo)
    synth, slots, t0 = asyncio.Lock(), asyncio.Semaphore(opts.sessions), time.monotonic()

    async def one(i: int, seed: int, line: Line, voice: str, noise: Noise) -> None:
        nonlocal served
        async with slots:
            async with synth:  # one synthesizer, one sentence at a time
                audio = await asyncio.to_thread(
                    _audio, factory, opts, lines, line, voice, noise, seed
                )
            heard = await hear(url, audio, opts.timeout_s)
        served = {"asr": heard.served[0], "engine": heard.served[1]}
        row = {"voice": voice, "noise": noise.label, "seed": seed, **score(line, heard)}
        rows[i] = row
        done = sum(r is not None for r in rows)
        log(_progress(done, len(todo), time.monotonic() - t0, row))

    await asyncio.gather(*(one(i, *item) for i, item in enumerate(todo)))
    return [r for r in rows if r is not None], served


def _audio(
    factory: SpeechFactory,
    opts: SpokenOptions,
    lines: Sequence[Line],
    line: Line,
    voice: str,
    noise: Noise,
    seed: int,
) -> Float32Array:
    """One utterance: ``line`` in ``voice``, with silence (or ``noise``) around it."""
    speech = say(factory, voice, line.text)
    n = len(speech) + round((LEAD_S + TRAIL_S) * SAMPLE_RATE)
    talkers = partial(_talkers, factory, opts, lines, line, voice, seed)
    return utterance(speech, noise, noise_for(noise, n, seed, talkers))


def _talkers(
    factory: SpeechFactory,
    opts: SpokenOptions,
    lines: Sequence[Line],
    line: Line,
    voice: str,
    seed: int,
) -> list[Float32Array]:
    """Babble's talkers: other lines (chosen by the seed) in the run's other voices."""
    pool = [v for v in opts.voices if v != voice] or [voice]
    rng = np.random.default_rng(seed)
    others = sorted(({t.text for t in lines} | set(NOT_COMMANDS)) - {line.text})
    texts = rng.choice(others, BABBLE_TALKERS, replace=False)
    return [say(factory, pool[i % len(pool)], str(t)) for i, t in enumerate(texts)]


def _progress(i: int, total: int, elapsed: float, r: Mapping[str, Any]) -> str:
    mark = (
        "ok" if r["exact"] else
        "WRONG" if r["wrong_call"] else
        "FALSE" if r["false_action"] else
        "asked" if r["question"] else
        "miss" if r["kind"] == "command" else "ok"
    )  # fmt: skip
    call = "" if r["call"] is None else f" -> {r['call']['name']} {r['call']['arguments']}"
    eta = elapsed / i * (total - i)
    return (
        f"spoken {i}/{total} (~{eta:.0f} s left) {r['voice']}, {r['noise']}: {mark} "
        f"{r['text']!r} heard {r['transcript']!r}{call}"
        + (f" [{r['error']}]" if r["error"] else "")
    )


def report(
    rows: list[dict[str, Any]], opts: SpokenOptions, server: Mapping[str, Any]
) -> dict[str, Any]:
    conditions = by_condition(rows)
    return {
        "server": dict(server),
        "options": {**asdict(opts), "data": str(opts.data), "noise": [n.label for n in opts.noise]},
        "machine": {"cpu": read_cpu().name, "cores": os.cpu_count()},
        "goals": GOALS,
        "summary": conditions["all"],
        "conditions": conditions,
        "rows": rows,
    }


# --- command line ---------------------------------------------------------------------


def _beam(text: str) -> int:
    """A beam width as ``serve --asr-beam`` takes it: a whole number of at least 1."""
    value = int(text) if text.strip().lstrip("+").isdigit() else 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options ``eval actions`` takes with ``--spoken`` (cli/main.py adds them)."""
    parser.add_argument(
        "--spoken",
        action="store_true",
        help="speak the held-out lines (and lines that only sound like commands) through "
        "a real server's audio path instead: per voice and noise, exact calls, false "
        "actions, wrong calls, contradicting confirmations and WER (docs/actions.md)",
    )
    parser.add_argument(
        "--url", default=None, help="--spoken: a running server on loopback (default: start one)"
    )
    parser.add_argument(
        "--asr", default="auto", help="--spoken: the started server's --asr (tiny.en, base, auto)"
    )
    parser.add_argument(
        "--asr-beam", type=_beam, default=None, metavar="N",
        help="--spoken: the started server's --asr-beam (default: its own)",
    )  # fmt: skip
    parser.add_argument(
        "--asr-check", default=None, metavar="MODEL",
        help="--spoken: the started server's --asr-check (auto, none, a model; default: its own)",
    )  # fmt: skip
    parser.add_argument(
        "--engine", default=None, help="--spoken: the started server's --engine (default: its own)"
    )
    parser.add_argument("--cache-dir", type=Path, default=None, help="--spoken: the server's")
    parser.add_argument(
        "--voices", nargs="+", default=list(DEFAULT_VOICES), choices=tuple(VOICES),
        help="--spoken: Piper's joe and espeak-ng voices",
    )  # fmt: skip
    parser.add_argument(
        "--noise", nargs="+", default=list(DEFAULT_NOISE), metavar="clean|white:DB|babble:DB",
        help="--spoken: noise conditions (SNR in dB; babble: four other lines at once)",
    )  # fmt: skip
    parser.add_argument(
        "--limit", type=int, default=None, help="--spoken: the first N lines (of every kind)"
    )
    parser.add_argument("--seed", type=int, default=0, help="--spoken: noise and babble")
    parser.add_argument(
        "--sessions", type=int, default=2, help="--spoken: utterances spoken at a time"
    )


def run_command(args: argparse.Namespace) -> int:
    """``quicksilver eval actions --spoken``."""
    try:
        opts = SpokenOptions(
            data=args.data,
            voices=tuple(args.voices),
            noise=tuple(parse_noise(n) for n in args.noise),
            per_tool=2 if args.per_tool is None else args.per_tool,
            chat_limit=10 if args.chat_limit is None else args.chat_limit,
            limit=args.limit,
            seed=args.seed,
            sessions=args.sessions,
        )
        result = _run(args, opts)
    except (ClientError, ValueError, OSError) as exc:
        print(f"quicksilver eval actions --spoken: {exc}", file=sys.stderr)
        return 1
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"], indent=2))
    print(table(result["conditions"]))
    print(f"wrote {args.json_out}")
    return 0 if result["summary"]["errors"] == 0 else 1


def _run(args: argparse.Namespace, opts: SpokenOptions) -> dict[str, Any]:
    from bench.loop import OwnServer, check_loopback

    with tempfile.TemporaryDirectory(prefix="quicksilver-spoken-") as tmp:
        server = None
        if args.url is None:
            extra = ["--asr", args.asr] + (["--engine", args.engine] if args.engine else [])
            extra += ["--asr-beam", str(args.asr_beam)] if args.asr_beam else []
            extra += ["--asr-check", args.asr_check] if args.asr_check else []
            extra += ["--cache-dir", str(args.cache_dir)] if args.cache_dir else []
            log = Path(tmp) / "serve.log"
            _log(f"spoken: starting quicksilver serve {' '.join(extra)}")
            server = OwnServer(extra, log)
        url = server.url if server is not None else args.url
        try:
            check_loopback(url)
            rows, served = asyncio.run(run_spoken(url, opts, Path(tmp), _log))
        finally:
            if server is not None:
                server.stop()
    about = {"url": url, "started": server is not None, **served}
    if server is not None:
        about["asr_option"] = args.asr
        about["asr_beam_option"] = args.asr_beam
        about["asr_check_option"] = args.asr_check
    return report(rows, opts, about)


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# --- the ASR models on the same lines (python -m bench.asr --spoken) -------------------


# What ``MODEL:WINDOW:prompt`` gives Whisper as its previous text: the default tools'
# own descriptions, the vocabulary a session's commands are in (never the eval's lines)
COMMAND_PROMPT = " ".join(tool.description for tool in DEFAULT_TOOLS)


def asr_compare(
    models: Sequence[str],
    opts: SpokenOptions,
    cache_dir: Path | None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Word errors per voice and noise of each ``MODEL:WINDOW[:prompt][:beamN][:gridN]``
    (``tiny.en:sized``, ``base:full``, ``tiny.en:sized:prompt``: with
    :data:`COMMAND_PROMPT`, ``tiny.en:sized:beam1``: greedy, ``tiny.en:sized:grid1``:
    sized windows not rounded up; the served beam and grid without one)
    on the utterances the spoken eval makes (same lines, voices, noise, seeds), and each
    one's transcription time per turn: the models take the turns in turn, the order
    rotated turn by turn so that the machine's load falls on all alike.
    The audio is what the server would transcribe: the utterance, cut 0.05 s after
    the speech as the server cuts a turn."""
    from audio.asr import AsrOptions, load_transcriber

    asrs = {}
    for spec in models:
        name, _, rest = spec.partition(":")
        window, *flags = rest.split(":")
        beams = [int(f[4:]) for f in flags if f.startswith("beam")]
        grids = [int(f[4:]) for f in flags if f.startswith("grid")]
        options = AsrOptions(
            window=window or "auto",  # type: ignore[arg-type]
            prompt=COMMAND_PROMPT if "prompt" in flags else None,
            beam_size=beams[0] if beams else AsrOptions.beam_size,
            grid_frames=grids[0] if grids else AsrOptions.grid_frames,
        )
        asrs[spec] = load_transcriber(name, cache_dir, options)
    errors = {spec: {} for spec in models}  # type: dict[str, dict[str, list[int]]]
    ms: dict[str, list[float]] = {spec: [] for spec in models}
    with tempfile.TemporaryDirectory(prefix="quicksilver-spoken-") as tmp:
        turns = list(_utterances(opts, Path(tmp)))
        for spec in models:
            asrs[spec].transcribe(turns[0][2])  # warm-up
        for i, (label, text, audio) in enumerate(turns):
            k = i % len(models)
            order = [*models[k:], *models[:k]]
            for spec in order:
                t = time.perf_counter()
                heard = asrs[spec].transcribe(audio).text
                ms[spec].append((time.perf_counter() - t) * 1000)
                ref = normalize_words(text)
                cell = errors[spec].setdefault(label, [0, 0])
                cell[0] += edit_distance(ref, normalize_words(heard))
                cell[1] += len(ref)
            if (i + 1) % 20 == 0:
                log(f"asr: {i + 1}/{len(turns)} turns")
    seconds = [len(a) / SAMPLE_RATE for _, _, a in turns]
    return {
        "machine": {"cpu": read_cpu().name, "cores": os.cpu_count()},
        "turns": len(turns),
        "audio_s_p50": statistics.median(seconds),
        "wer": {s: {k: round(e / w, 4) for k, (e, w) in errors[s].items()} for s in models},
        "errors": errors,
        "ms_p50": {s: round(statistics.median(v), 1) for s, v in ms.items()},
        "ms_p90": {s: round(float(np.percentile(v, 90)), 1) for s, v in ms.items()},
    }


def _utterances(opts: SpokenOptions, cache: Path) -> Iterable[tuple[str, str, Float32Array]]:
    """(voice and noise, text, audio) of every utterance of the spoken eval, cut as the
    server cuts a turn: 0.05 s after the speech."""
    lines = eval_lines(opts.data, opts.per_tool, opts.chat_limit)[: opts.limit]
    factory = SpeechFactory(cache)
    for seed, line, voice, noise in plan(opts, lines):
        audio = _audio(factory, opts, lines, line, voice, noise, seed)
        yield f"{voice}, {noise.label}", line.text, audio[: -round((TRAIL_S - 0.05) * SAMPLE_RATE)]


def asr_table(result: Mapping[str, Any]) -> str:
    """Markdown: WER per voice and noise, a column per model; then time per turn."""
    specs = list(result["wer"])
    labels = list(result["wer"][specs[0]])
    lines = ["| voice, noise | " + " | ".join(specs) + " |", "|---|" + "---|" * len(specs)]
    for label in labels:
        cells = [f"{result['wer'][s][label]:.1%}" for s in specs]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    totals = []
    for s in specs:
        e = sum(v[0] for v in result["errors"][s].values())
        w = sum(v[1] for v in result["errors"][s].values())
        totals.append(f"**{e / w:.1%}** ({e}/{w})")
    lines.append("| all | " + " | ".join(totals) + " |")
    lines.append(
        "| ms per turn, p50 | " + " | ".join(f"{result['ms_p50'][s]:.0f}" for s in specs) + " |"
    )
    lines.append(
        "| ms per turn, p90 | " + " | ".join(f"{result['ms_p90'][s]:.0f}" for s in specs) + " |"
    )
    return "\n".join(lines)
