"""Measure the audio stack on the project's own test speech: ``python -m export.bench.asr``.

Prints the figures quoted in docs/audio.md: ASR word error rate and latency for each
Whisper model, VAD cost per frame, Piper time to first chunk, resampler delays, and
what the endpointer sees (longest pause inside a question, VAD end lag). Timings are
medians of repeats; on a shared 2-core machine compare them only within one run.

Uses :mod:`audio.speech` for the speech.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from audio.asr import load_transcriber
from audio.endpoint import EndOfTurn, Endpointer, SpeechStarted
from audio.resample import CLIENT_RATES, StreamResampler
from audio.tts import Synthesizer
from audio.vad import FRAME_SAMPLES, SileroVad

Float32Array = NDArray[np.float32]
Utterance = tuple[str, str, Float32Array]  # voice, text, 16 kHz audio


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def make_speech(cache: Path | None) -> list[Utterance]:
    from audio.speech import QUESTIONS, SpeechFactory, have_espeak

    factory = SpeechFactory(cache)
    voices = ["piper", "espeak"] if have_espeak() else ["piper"]
    return [(v, q, getattr(factory, v)(q, 0.3, 0.3)) for v in voices for q in QUESTIONS]


def bench_asr(names: list[str], speech: list[Utterance], repeats: int, cache: Path | None) -> None:
    from audio.speech import edit_distance, normalize_words

    print("\n## ASR (int8, beam 1, cpu_threads=2)")
    print("| model | voice | WER | median latency | median latency / audio s |")
    print("|---|---|---|---|---|")
    for name in names:
        asr = load_transcriber(name, cache)
        asr.transcribe(speech[0][2])  # warm-up
        for voice in sorted({v for v, _, _ in speech}):
            errors = words = 0
            lat, per_s = [], []
            for _, text, audio in (u for u in speech if u[0] == voice):
                hyp = asr.transcribe(audio).text
                ref = normalize_words(text)
                errors += edit_distance(ref, normalize_words(hyp))
                words += len(ref)
                ms = median_ms(partial(asr.transcribe, audio), repeats)
                lat.append(ms)
                per_s.append(ms / (len(audio) / 16_000))
            print(
                f"| {name} | {voice} | {errors / words:.1%} ({errors}/{words}) "
                f"| {statistics.median(lat):.0f} ms | {statistics.median(per_s):.0f} ms |"
            )


def bench_vad_and_endpoint(speech: list[Utterance], repeats: int) -> None:
    vad = SileroVad()
    audio = np.concatenate([a for _, _, a in speech[:4]])
    frames = audio[: len(audio) // FRAME_SAMPLES * FRAME_SAMPLES].reshape(-1, FRAME_SAMPLES)

    def stream() -> None:
        state = vad.new_state()
        for f in frames:
            vad.process(state, f)

    ms = median_ms(stream, repeats) / len(frames)
    print(f"\n## VAD: {ms:.3f} ms per 32 ms frame, streamed one frame per call")

    print("\n## Endpointing (default EndpointConfig), Silero probabilities per frame")
    print("| voice | longest gap inside a question | VAD end lag | turns found |")
    print("|---|---|---|---|")
    for voice in sorted({v for v, _, _ in speech}):
        gaps, lags, turns = [], [], []
        for _, _, a in (u for u in speech if u[0] == voice):
            padded = np.concatenate([a, np.zeros(16_000, np.float32)])
            probs = vad.process(vad.new_state(), padded)
            gaps.append(_longest_gap(probs))
            events = Endpointer().feed(probs)
            turns.append(sum(isinstance(e, SpeechStarted) for e in events))
            ends = [e.end_sample for e in events if isinstance(e, EndOfTurn)]
            loud = np.flatnonzero(np.abs(a) > 0.01)
            if ends:
                lags.append((ends[-1] - (loud[-1] + 1)) / 16)
        print(
            f"| {voice} | {max(gaps)} ms (median {statistics.median(gaps):.0f}) "
            f"| median {statistics.median(lags):.0f} ms, max {max(lags):.0f} ms "
            f"| {turns.count(1)}/{len(turns)} questions as one turn |"
        )


def _longest_gap(probs: Float32Array, neg: float = 0.35, thr: float = 0.5) -> int:
    """Longest run of frames below neg_threshold between speech frames, in ms."""
    speech = np.flatnonzero(probs >= thr)
    if len(speech) == 0:
        return 0
    inside = probs[speech[0] : speech[-1] + 1] < neg
    longest = run = 0
    for quiet in inside:
        run = run + 1 if quiet else 0
        longest = max(longest, run)
    return longest * FRAME_SAMPLES * 1000 // 16_000


def bench_tts(repeats: int) -> None:
    tts = Synthesizer()
    reply = "It is sunny in Paris tomorrow. Expect a high of twenty two degrees."
    next(iter(tts.synthesize(reply)))  # warm-up
    first = median_ms(lambda: next(iter(tts.synthesize(reply))), repeats)
    total = median_ms(lambda: list(tts.synthesize(reply)), repeats)
    seconds = sum(len(c) for c in tts.synthesize(reply)) / tts.sample_rate
    print(f"\n## Piper (joe medium): first sentence {first:.0f} ms, whole reply {total:.0f} ms")
    print(f"real-time factor {total / 1000 / seconds:.3f} ({seconds:.1f} s of audio)")


def bench_resampler() -> None:
    print("\n## Resampler hold-back (soxr LQ), ms of output held by the filter")
    pairs = [(r, 16_000) for r in CLIENT_RATES if r != 16_000]
    pairs += [(22_050, r) for r in CLIENT_RATES if r != 22_050]
    for src, dst in pairs:
        rs = StreamResampler(src, dst)
        for _ in range(20):
            rs.process(np.ones(src // 50, np.float32))  # 20 ms chunks
        print(f"{src} -> {dst}: {rs.delay_samples() * 1000 / dst:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="*", default=["tiny.en", "base"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache-dir", type=Path, default=None, help="joined Whisper base")
    parser.add_argument("--speech-cache", type=Path, default=None)
    args = parser.parse_args()
    logging.basicConfig(format="%(message)s")
    logging.getLogger("audio").setLevel(logging.INFO)  # shows the first-run base join
    speech = make_speech(args.speech_cache)
    bench_vad_and_endpoint(speech, args.repeats)
    bench_tts(args.repeats)
    bench_resampler()
    bench_asr(args.models, speech, args.repeats, args.cache_dir)


if __name__ == "__main__":
    main()
