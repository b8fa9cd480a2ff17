"""The loop benchmark's speech: spoken-assistant requests as WAV files and a manifest.

    python -m bench.speechset --out DIR [--set complete|paused|all] [--n 8] [--seed 0]

Two sets, each voice rendered by Piper (joe) or espeak-ng (en-us, en-gb, en-us+f3 at
different speeds), 16 kHz mono PCM16:

* ``complete``: a whole request said in one go (:data:`audio.speech.QUESTIONS` and more);
* ``paused``: a request said in two halves with a silence of 0.3-0.8 s between them
  ("Add milk, eggs," 0.6 s "and bread to my shopping list."), each half synthesized on
  its own and the two joined, as a user pauses mid-sentence. It is one turn.

Every file has lead silence and ~2.5 s of trailing silence, room for the reply while the
microphone stays open. ``manifest.json`` lists ``{"file", "speech_end_s", "text",
"pause_s", ...}`` in the form the Pipecat peer's client reads (``MANIFEST``): the end
of speech is where the synthesized speech ends, known from the synthesis (each
synthesizer's own output trimmed where its 10 ms RMS stays under -50 dBFS, before the
pieces are joined and padded), not found in the mixed file.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from audio.resample import SAMPLE_RATE
from audio.speech import QUESTIONS, SpeechFactory, write_wav

Float32Array = NDArray[np.float32]

LEAD_S = 0.5
TRAIL_S = 2.5
PAUSES_S = (0.3, 0.8)  # range of the mid-sentence pause
# A 10 ms window under -50 dBFS (RMS) is the synthesizer's own silence or its residual
# hiss; real word endings (a final fricative's decay) stay above it.
TRIM_DBFS = -50.0
TRIM_WINDOW = SAMPLE_RATE // 100

MORE_QUESTIONS = (
    "How tall is the Eiffel Tower?",
    "Turn the thermostat up to twenty one degrees.",
    "What's the best way to cook rice?",
    "Call my sister on speaker.",
    "How do I say thank you in French?",
    "What's on my calendar for tomorrow morning?",
)
COMPLETE = (*QUESTIONS, *MORE_QUESTIONS)

# Requests with a natural place to stop and think; the first half alone sometimes reads
# as finished ("Remind me to call my mother"), sometimes not ("Add milk, eggs,").
PAUSED = (
    ("Add milk, eggs,", "and bread to my shopping list."),
    ("Remind me to call my mother", "at seven thirty tonight."),
    ("Can you turn off the lights", "in the kitchen, please?"),
    ("If I leave now,", "how long will it take to drive to the airport?"),
    ("What time does the pharmacy", "on Main Street close today?"),
    ("Set an alarm for six,", "tomorrow morning."),
    ("Send a message to Anna", "saying I will be late."),
    ("How far is it from here", "to the nearest gas station?"),
    ("What's a good recipe for dinner", "with chicken and rice?"),
    ("Play some music by", "the Beatles, please."),
)


@dataclass(frozen=True)
class Voice:
    """Piper's joe voice, or an espeak-ng voice at a speed in words per minute."""

    engine: str  # "piper" or "espeak"
    name: str = "joe"
    words_per_minute: int = 165

    @property
    def label(self) -> str:
        if self.engine == "piper":
            return "piper-joe"
        return f"espeak-{self.name.replace('+', '-')}-{self.words_per_minute}"


VOICES = (
    Voice("piper"),
    Voice("espeak", "en-us", 165),
    Voice("espeak", "en-gb", 150),
    Voice("espeak", "en-us+f3", 180),
    Voice("espeak", "en-us", 135),
    Voice("espeak", "en-gb", 190),
)


@dataclass(frozen=True)
class Entry:
    """One line of the manifest (the Pipecat client reads ``file`` and ``speech_end_s``)."""

    file: str
    speech_end_s: float  # the true end of speech, from the start of the file
    text: str
    pause_s: float  # the mid-sentence silence (0 for a complete utterance)
    speech_start_s: float
    duration_s: float
    voice: str
    set: str
    longest_gap_s: float  # longest stretch under -40 dBFS inside the speech (commas too)


def trim(audio: Float32Array, dbfs: float = TRIM_DBFS) -> Float32Array:
    """The synthesized speech without the synthesizer's leading and trailing silence,
    to the 10 ms window."""
    n = len(audio) // TRIM_WINDOW
    windows = audio[: n * TRIM_WINDOW].reshape(n, TRIM_WINDOW).astype(np.float64)
    rms = np.sqrt((windows**2).mean(axis=1))
    loud = np.flatnonzero(rms > 10 ** (dbfs / 20))
    if loud.size == 0:
        raise ValueError("the synthesizer returned silence")
    return audio[loud[0] * TRIM_WINDOW : (loud[-1] + 1) * TRIM_WINDOW]


def longest_gap(speech: Float32Array, dbfs: float = -40.0) -> float:
    """The longest run of 10 ms windows quieter than ``dbfs``, in seconds: the pauses
    a synthesizer makes at commas, and the one a paused utterance has on purpose."""
    n = len(speech) // TRIM_WINDOW
    windows = speech[: n * TRIM_WINDOW].reshape(n, TRIM_WINDOW).astype(np.float64)
    quiet = np.sqrt((windows**2).mean(axis=1)) < 10 ** (dbfs / 20)
    best = run = 0
    for q in quiet:
        run = run + 1 if q else 0
        best = max(best, run)
    return best * TRIM_WINDOW / SAMPLE_RATE


def synthesize(speech: SpeechFactory, text: str, voice: Voice) -> Float32Array:
    if voice.engine == "piper":
        return trim(speech.piper(text))
    return trim(speech.espeak(text, voice=voice.name, words_per_minute=voice.words_per_minute))


def silence(seconds: float) -> Float32Array:
    return np.zeros(round(seconds * SAMPLE_RATE), np.float32)


def render(
    speech: SpeechFactory, parts: Sequence[str], voice: Voice, pause_s: float
) -> tuple[Float32Array, float, float]:
    """(audio, true end of speech, the pause as rendered): the parts joined by pauses."""
    pieces = [silence(LEAD_S)]
    for i, part in enumerate(parts):
        if i:
            pieces.append(silence(pause_s))
        pieces.append(synthesize(speech, part, voice))
    end_s = sum(len(x) for x in pieces) / SAMPLE_RATE
    pieces.append(silence(TRAIL_S))
    rendered_pause = len(silence(pause_s)) / SAMPLE_RATE if len(parts) > 1 else 0.0
    return np.concatenate(pieces), end_s, rendered_pause


Spec = tuple[str, tuple[str, ...], Voice, float]  # set, parts, voice, pause


def plan(kind: str, n: int, seed: int) -> list[Spec]:
    """``n`` utterances of a set; voices rotate so every voice is heard, texts and
    pauses are drawn with ``seed``."""
    rng = random.Random(f"{kind}-{seed}")
    texts: list[tuple[str, ...]]
    texts = [(t,) for t in COMPLETE] if kind == "complete" else list(PAUSED)
    rng.shuffle(texts)
    voices = list(VOICES)
    rng.shuffle(voices)
    out = []
    for i in range(n):
        pause = 0.0 if kind == "complete" else round(rng.uniform(*PAUSES_S), 2)
        out.append((kind, texts[i % len(texts)], voices[i % len(voices)], pause))
    return out


def write_set(out: Path, specs: Sequence[Spec], speech: SpeechFactory | None = None) -> list[Entry]:
    """Render ``specs`` into ``out`` as WAVs and ``manifest.json``; returns the manifest."""
    out.mkdir(parents=True, exist_ok=True)
    speech = speech or SpeechFactory()
    entries, numbers = [], dict.fromkeys((kind for kind, *_ in specs), 0)
    for kind, parts, voice, pause in specs:
        numbers[kind] += 1
        audio, end_s, pause_s = render(speech, parts, voice, pause)
        name = f"{kind[0]}{numbers[kind]:02d}-{voice.label}.wav"
        write_wav(out / name, audio)
        entries.append(
            Entry(
                file=name,
                speech_end_s=round(end_s, 4),
                text=" ".join(parts),
                pause_s=round(pause_s, 4),
                speech_start_s=LEAD_S,
                duration_s=round(len(audio) / SAMPLE_RATE, 4),
                voice=voice.label,
                set=kind,
                longest_gap_s=longest_gap(
                    audio[round(LEAD_S * SAMPLE_RATE) : round(end_s * SAMPLE_RATE)]
                ),
            )
        )
    manifest = [asdict(e) for e in entries]
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return entries


def make_set(out: Path, sets: Sequence[str], n: int, seed: int) -> list[Entry]:
    """``n`` utterances of each set, drawn with ``seed``, written into ``out``."""
    return write_set(out, [spec for kind in sets for spec in plan(kind, n, seed)])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--out", type=Path, required=True, help="directory for WAVs + manifest")
    parser.add_argument("--set", choices=("complete", "paused", "all"), default="all")
    parser.add_argument("--n", type=int, default=8, help="utterances per set")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error("--n needs 1 or more")
    sets = ("complete", "paused") if args.set == "all" else (args.set,)
    entries = make_set(args.out, sets, args.n, args.seed)
    for e in entries:
        pause = f" [pause {e.pause_s:.2f} s]" if e.pause_s else ""
        print(f"{e.file:28s} end {e.speech_end_s:6.3f} s  {e.text}{pause}")
    print(f"wrote {len(entries)} WAVs and {args.out / 'manifest.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
