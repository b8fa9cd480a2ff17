"""Speech for tests, made on the machine (never downloaded), and a word error rate.

    speech = SpeechFactory(tmp_path_factory.mktemp("speech"))
    audio = speech.piper("Set a timer for ten minutes.", lead_s=0.5, trail_s=1.0)
    audio = speech.espeak("What time is it?")  # needs espeak-ng (Debian package)
    assert word_error_rate("set a timer for 10 minutes", text) < 0.2

All audio is float32 mono at 16 kHz. Piper runs deterministically here (no generator
noise) so that the same text always gives the same samples; espeak-ng is a second,
very different (formant) voice. Generated speech is cached in memory and, when a
directory is given, as .npy files, so a test session synthesizes each sentence once.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import tempfile
import wave
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from audio.resample import SAMPLE_RATE, float32_to_int16, int16_to_float32, resample

if TYPE_CHECKING:
    from audio.tts import Synthesizer

Float32Array = NDArray[np.float32]

# Voice-assistant questions used by the ASR benchmark and tests: commas give the
# endpointer mid-sentence pauses to survive.
QUESTIONS = (
    "What's the weather like in Paris tomorrow?",
    "Set a timer for twenty minutes.",
    "How many kilometers are in a mile?",
    "Remind me to call my mother at seven thirty tonight.",
    "Can you turn off the lights in the kitchen, please?",
    "What time does the pharmacy on Main Street close today?",
    "Play some relaxing music, but not too loud.",
    "Who wrote the novel Pride and Prejudice?",
    "If I leave now, how long will it take to drive to the airport?",
    "Add milk, eggs, and bread to my shopping list.",
    "What is the capital of Australia?",
    "Translate good morning into Spanish.",
)


def have_espeak() -> bool:
    return shutil.which("espeak-ng") is not None


class SpeechFactory:
    """Synthesizes test sentences with Piper (joe voice) and espeak-ng, with caching."""

    def __init__(self, cache_dir: Path | None = None):
        self.cache_dir = cache_dir
        self._memory: dict[str, Float32Array] = {}
        self._piper: Synthesizer | None = None  # loaded on first use

    def piper(self, text: str, lead_s: float = 0.0, trail_s: float = 0.0) -> Float32Array:
        speech = self._cached(f"piper|{text}", lambda: self._synth_piper(text))
        return pad(speech, lead_s, trail_s)

    def espeak(
        self,
        text: str,
        lead_s: float = 0.0,
        trail_s: float = 0.0,
        voice: str = "en-us",
        words_per_minute: int = 165,
    ) -> Float32Array:
        if not have_espeak():
            raise RuntimeError("espeak-ng is not installed (apt-get install espeak-ng)")
        key = f"espeak|{voice}|{words_per_minute}|{text}"
        speech = self._cached(key, lambda: _synth_espeak(text, voice, words_per_minute))
        return pad(speech, lead_s, trail_s)

    def _synth_piper(self, text: str) -> Float32Array:
        from piper import SynthesisConfig

        from audio.tts import Synthesizer

        if self._piper is None:
            self._piper = Synthesizer()
        quiet = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)  # deterministic
        chunks = list(self._piper.synthesize(text, quiet))
        audio = np.concatenate(chunks) if chunks else np.zeros(0, np.int16)
        return resample(int16_to_float32(audio), self._piper.sample_rate, SAMPLE_RATE)

    def _cached(self, key: str, make: Callable[[], Float32Array]) -> Float32Array:
        if key in self._memory:
            return self._memory[key]
        digest = hashlib.sha1(key.encode()).hexdigest()[:16]
        path = self.cache_dir / f"{digest}.npy" if self.cache_dir else None
        if path is not None and path.exists():
            audio: Float32Array = np.load(path)
        else:
            audio = make()
            if path is not None:
                np.save(path, audio)
        self._memory[key] = audio
        return audio


def _synth_espeak(text: str, voice: str, words_per_minute: int) -> Float32Array:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "speech.wav"
        cmd = ["espeak-ng", "-v", voice, "-s", str(words_per_minute), "-w", str(out), text]
        subprocess.run(cmd, check=True, capture_output=True, timeout=30)
        audio, rate = read_wav(out)
    return resample(audio, rate, SAMPLE_RATE)


def pad(audio: Float32Array, lead_s: float = 0.0, trail_s: float = 0.0) -> Float32Array:
    """Digital silence before and after (16 kHz)."""
    lead = np.zeros(round(lead_s * SAMPLE_RATE), np.float32)
    trail = np.zeros(round(trail_s * SAMPLE_RATE), np.float32)
    return np.concatenate([lead, audio.astype(np.float32), trail])


def write_wav(path: Path, audio: Float32Array, rate: int = SAMPLE_RATE) -> Path:
    """16-bit mono WAV."""
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(float32_to_int16(audio).astype("<i2").tobytes())
    return path


def read_wav(path: Path) -> tuple[Float32Array, int]:
    """16-bit PCM WAV -> (float32 mono, rate); stereo is averaged."""
    with wave.open(str(path), "rb") as w:
        if w.getsampwidth() != 2:
            raise ValueError(f"{path}: only 16-bit PCM is supported")
        channels, rate = w.getnchannels(), w.getframerate()
        data = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    audio = int16_to_float32(data)
    if channels > 1:
        audio = audio.reshape(-1, channels).mean(axis=1).astype(np.float32)
    return audio, rate


# -- word error rate -----------------------------------------------------------------

_ONES = [
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
    "eighteen", "nineteen",
]  # fmt: skip
_TENS = ["_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_SCALES = ((10**9, "billion"), (10**6, "million"), (1000, "thousand"), (100, "hundred"))
_ORDINALS = {"one": "first", "two": "second", "three": "third", "five": "fifth",
             "eight": "eighth", "nine": "ninth", "twelve": "twelfth"}  # fmt: skip
_CONTRACTIONS = {
    "what's": "what is", "it's": "it is", "that's": "that is", "where's": "where is",
    "who's": "who is", "how's": "how is", "there's": "there is", "let's": "let us",
    "i'm": "i am", "you're": "you are", "we're": "we are", "they're": "they are",
    "i've": "i have", "i'll": "i will", "you'll": "you will", "i'd": "i would",
    "don't": "do not", "doesn't": "does not", "didn't": "did not", "can't": "can not",
    "cannot": "can not", "won't": "will not", "isn't": "is not", "aren't": "are not",
    "okay": "ok", "o'clock": "oclock",
}  # fmt: skip


def number_to_words(n: int) -> str:
    """Cardinal number in words: 1234 -> "one thousand two hundred thirty four"."""
    if n < 0:
        return "minus " + number_to_words(-n)
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else " " + _ONES[n % 10])
    for value, name in _SCALES:
        if n >= value:
            head, rest = divmod(n, value)
            tail = "" if rest == 0 else " " + number_to_words(rest)
            return f"{number_to_words(head)} {name}{tail}"
    raise AssertionError("unreachable")


def _ordinal(words: str) -> str:
    *head, last = words.split()
    if last in _ORDINALS:
        last = _ORDINALS[last]
    elif last.endswith("y"):
        last = last[:-1] + "ieth"
    else:
        last += "th"
    return " ".join([*head, last])


def _spell_number(m: re.Match[str]) -> str:
    token = m.group(0).replace(",", "")
    if ":" in token:  # time of day: 7:30 -> seven thirty, 7:05 -> seven oh five
        h, mm = token.split(":")
        minutes = int(mm)
        tail = "" if minutes == 0 else ("oh " if minutes < 10 else "") + number_to_words(minutes)
        return f" {number_to_words(int(h))} {tail} "
    ordinal = token[-2:].lower() in ("st", "nd", "rd", "th")
    if ordinal:
        return f" {_ordinal(number_to_words(int(token[:-2])))} "
    whole, _, frac = token.partition(".")
    words = number_to_words(int(whole))
    if frac:
        words += " point " + " ".join(_ONES[int(d)] for d in frac)
    return f" {words} "


def normalize_words(text: str) -> list[str]:
    """Lowercase words without punctuation, numbers spelt out as spoken."""
    t = text.lower().replace("%", " percent ").replace("&", " and ")
    t = re.sub(r"\$(\d[\d,]*(?:\.\d+)?)", r"\1 dollars", t)
    # Whisper writes "at seven thirty" as "at 7:30", "at 7.30" or "at 730": a time of day
    t = re.sub(r"\bat (\d{1,2})[.:]?(\d\d)\b", r"at \1:\2", t)
    t = re.sub(r"\d+:\d\d|\d[\d,]*(?:\.\d+)?(?:st|nd|rd|th)?", _spell_number, t)
    t = t.replace("\u2019", "'")  # typographic apostrophe
    words = []
    for w in re.sub(r"[^a-z0-9' ]+", " ", t).split():
        w = w.strip("'")
        words.extend(_CONTRACTIONS.get(w, w).split())
    return [w for w in words if w]


def edit_distance(ref: list[str], hyp: list[str]) -> int:
    """Levenshtein distance over words (substitutions, insertions, deletions)."""
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1]


def word_error_rate(reference: str, hypothesis: str) -> float:
    """(S + D + I) / N over normalised words; 0 for two empty strings."""
    ref, hyp = normalize_words(reference), normalize_words(hypothesis)
    if not ref:
        return 0.0 if not hyp else 1.0
    return edit_distance(ref, hyp) / len(ref)
