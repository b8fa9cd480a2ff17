"""Measure the audio stack on the project's own test speech: ``python -m bench.asr``.

Prints the figures quoted in docs/audio.md: ASR word error rate and latency for each
Whisper model, VAD cost per frame, Piper time to first chunk, resampler delays, and
what the endpointer sees (longest pause inside a question, VAD end lag). Timings are
medians of repeats; on a shared 2-core machine compare them only within one run.

``--window-compare`` prints instead the encoder window study (docs/results/
2026-12-asr-window.md): Whisper's 30 s window against the window sized to the turn,
word error rate on clean and noisy speech from Piper and five espeak-ng voices and
speeds, and latency with the windows interleaved turn by turn.

Uses :mod:`audio.speech` for the speech.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from audio.asr import AsrOptions, Transcriber, cut_repetition, load_transcriber
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


# -- the encoder window: 30 s against sized to the turn --------------------------------

# Turns beyond audio.speech.QUESTIONS: 1-6 s of audio, the shortest and longest
MORE_UTTERANCES = (
    "Stop.",
    "What time is it?",
    "Turn the volume up.",
    "Yes, please.",
    "Tell me a joke about penguins.",
    "How far is the nearest gas station, and is it open right now?",
    "Remind me on Friday morning to pay the electricity bill before noon.",
    "Send a message to Sarah saying I will be twenty minutes late for dinner.",
)
# (synthesizer, espeak-ng voice, words per minute)
WINDOW_VOICES = (
    ("piper", "", 0),
    ("espeak", "en-us", 165),
    ("espeak", "en-gb", 165),
    ("espeak", "en-us+f3", 165),
    ("espeak", "en-us", 210),
    ("espeak", "en-gb+m3", 135),
)
LEAD_S = 0.3  # about the endpointer's pre-roll (320 ms)
SERVED_TRAIL_S = 0.05  # a turn's audio ends ~40 ms after its last audible sample
Condition = Literal["clean", "noisy"]


@dataclass(frozen=True)
class Case:
    voice: str
    text: str
    clean: Float32Array
    noisy: Float32Array  # white or pink noise at 10 or 15 dB SNR


def noise(n: int, colour: str, rng: np.random.Generator) -> Float32Array:
    """Unit-power white or pink (1/f power) noise."""
    w = rng.standard_normal(n)
    if colour == "pink":
        spectrum = np.fft.rfft(w)
        spectrum[1:] /= np.sqrt(np.arange(1, len(spectrum)))
        w = np.fft.irfft(spectrum, n)
    out: Float32Array = (w / np.sqrt(np.mean(w**2))).astype(np.float32)
    return out


def noisy_copy(
    speech: Float32Array, padded: Float32Array, snr_db: float, colour: str, seed: int
) -> Float32Array:
    """``padded`` (``speech`` with silence around it) plus noise ``snr_db`` below
    the mean power of ``speech``: the noise runs through the silence too."""
    power = float(np.mean(speech.astype(np.float64) ** 2))
    n = noise(len(padded), colour, np.random.default_rng(seed))
    out: Float32Array = (padded + n * np.sqrt(power / 10 ** (snr_db / 10))).astype(np.float32)
    return out


def window_speech(cache: Path | None, trail_s: float = SERVED_TRAIL_S) -> list[Case]:
    """Every voice saying every test turn, clean and with seeded noise: white or pink
    at 10 or 15 dB SNR, the four combinations in turn."""
    from audio.speech import QUESTIONS, SpeechFactory, have_espeak, pad

    factory = SpeechFactory(cache)
    voices = [v for v in WINDOW_VOICES if v[0] == "piper" or have_espeak()]
    cases: list[Case] = []
    for synth, voice, wpm in voices:
        for text in QUESTIONS + MORE_UTTERANCES:
            if synth == "piper":
                speech = factory.piper(text)
            else:
                speech = factory.espeak(text, voice=voice, words_per_minute=wpm)
            padded = pad(speech, LEAD_S, trail_s)
            i = len(cases)
            colour, snr = ("white", "pink")[i % 2], (10, 15)[i // 2 % 2]
            noisy = noisy_copy(speech, padded, snr, colour, seed=i)
            label = synth if synth == "piper" else f"espeak {voice} {wpm} wpm"
            cases.append(Case(label, text, padded, noisy))
    return cases


def _audio(case: Case, condition: Condition) -> Float32Array:
    return case.clean if condition == "clean" else case.noisy


def bench_window(
    names: Sequence[str],
    cases: Sequence[Case],
    repeats: int,
    cache: Path | None,
    pads: Sequence[int],
    trail_s: float,
) -> None:
    """WER and latency of the 30 s window against sized windows (+ each pad)."""
    print(f"\n## ASR window: 30 s against sized (int8, beam 1, cpu_threads=2): {len(cases)} turns")
    print(f"clean and noisy (white / pink, 10 / 15 dB SNR), {LEAD_S} s of silence before,")
    print(f"{trail_s} s after;")
    print(f"latency: median of {repeats} repeats per turn, the windows interleaved")
    for name in names:
        windows: dict[str, Transcriber] = {
            "full": load_transcriber(name, cache, AsrOptions(window="full"))
        }
        for p in pads:
            options = AsrOptions(window="sized", pad_frames=p)
            windows[f"sized +{p}"] = load_transcriber(name, cache, options)
        for asr in windows.values():
            asr.transcribe(cases[0].clean)  # warm-up
        _window_wer(name, windows, cases)
        _window_latency(name, windows, cases, repeats)


def _window_wer(name: str, windows: dict[str, Transcriber], cases: Sequence[Case]) -> None:
    from audio.speech import edit_distance, normalize_words

    print(
        "\n| model | window | clean WER | noisy WER | same words as full, clean / noisy "
        "| loops cut | to the full path |"
    )
    print("|---|---|---|---|---|---|---|")
    full: dict[tuple[int, str], list[str]] = {}
    for label, asr in windows.items():
        errors = {"clean": 0, "noisy": 0}
        same = {"clean": 0, "noisy": 0}
        words = loops = fallbacks = 0
        for i, case in enumerate(cases):
            ref = normalize_words(case.text)
            words += len(ref)
            for cond in ("clean", "noisy"):
                x = _audio(case, cond)
                hyp = normalize_words(asr.transcribe(x).text)
                errors[cond] += edit_distance(ref, hyp)
                if label == "full":
                    full[i, cond] = hyp
                same[cond] += hyp == full[i, cond]
                d = asr.decode_sized(x) if asr.window == "sized" else None
                if d is not None:
                    looped = cut_repetition(d.text) != d.text
                    loops += looped
                    fallbacks += d.capped and not looped
        turns = 2 * len(cases)
        print(
            f"| {name} | {label} | {errors['clean'] / words:.1%} ({errors['clean']}/{words}) "
            f"| {errors['noisy'] / words:.1%} ({errors['noisy']}/{words}) "
            f"| {same['clean']}/{len(cases)} / {same['noisy']}/{len(cases)} "
            f"| {loops}/{turns} | {fallbacks}/{turns} |"
        )


def _window_latency(
    name: str, windows: dict[str, Transcriber], cases: Sequence[Case], repeats: int
) -> None:
    """Each turn through every window, the order rotated turn by turn and repeat by
    repeat, so that the machine's load falls on all windows alike."""
    labels = list(windows)
    ms: dict[str, list[float]] = {label: [] for label in labels}
    seconds = []
    turn = 0
    for case in cases:
        for cond in ("clean", "noisy"):
            x = _audio(case, cond)
            runs: dict[str, list[float]] = {label: [] for label in labels}
            for r in range(repeats):
                k = (turn + r) % len(labels)
                for label in labels[k:] + labels[:k]:
                    t = time.perf_counter()
                    windows[label].transcribe(x)
                    runs[label].append((time.perf_counter() - t) * 1000)
            for label in labels:
                ms[label].append(statistics.median(runs[label]))
            seconds.append(len(x) / 16_000)
            turn += 1
    print(
        "\n| model | window | p50 | p95 | p50, turns of 4 s and more "
        "| full / this, median over turns |"
    )
    print("|---|---|---|---|---|---|")
    long_turns = [i for i, s in enumerate(seconds) if s >= 4.0]
    for label in labels:
        per_turn = np.array(ms[label])
        ratio = float(np.median(np.array(ms["full"]) / per_turn))
        long_p50 = float(np.median(per_turn[long_turns])) if long_turns else float("nan")
        p50, p95 = np.percentile(per_turn, [50, 95])
        print(
            f"| {name} | {label} | {p50:.0f} ms | {p95:.0f} ms "
            f"| {long_p50:.0f} ms ({len(long_turns)} turns) | {ratio:.2f} |"
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


def bench_spoken(args: argparse.Namespace) -> None:
    """The ASR models on the spoken eval's utterances (docs/audio.md, "Which model")."""
    import json

    from bench.spoken import SpokenOptions, asr_compare, asr_table, parse_noise

    opts = SpokenOptions(noise=tuple(parse_noise(n) for n in args.noise), limit=args.limit)
    models = args.models or ["tiny.en:sized", "base:sized", "base:full"]
    result = asr_compare(models, opts, args.cache_dir)
    print(f"\n## ASR on the spoken eval's lines: {result['turns']} turns, {result['machine']}")
    print(asr_table(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="*", default=None, help="tiny.en base; window: tiny.en")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache-dir", type=Path, default=None, help="joined Whisper base")
    parser.add_argument("--speech-cache", type=Path, default=None)
    parser.add_argument(
        "--window-compare", action="store_true", help="only the 30 s against sized window study"
    )
    parser.add_argument(
        "--pad-frames", type=int, nargs="+", default=[AsrOptions().pad_frames],
        help="sized windows to compare: frames of silence after the turn",
    )  # fmt: skip
    parser.add_argument(
        "--trail-s", type=float, default=SERVED_TRAIL_S,
        help="silence after each turn (the server's turns end ~40 ms after the speech)",
    )  # fmt: skip
    parser.add_argument(
        "--spoken", action="store_true",
        help="only WER per voice and noise on the lines of `eval actions --spoken`, and time "
        "per turn, of each --models MODEL:WINDOW (default: tiny.en:sized base:sized base:full)",
    )  # fmt: skip
    parser.add_argument(
        "--noise", nargs="+", default=["clean", "white:10", "babble:10"], help="--spoken"
    )
    parser.add_argument("--limit", type=int, default=None, help="--spoken: the first N lines")
    parser.add_argument("--json", type=Path, default=None, help="--spoken: write the figures")
    args = parser.parse_args()
    if args.spoken:
        bench_spoken(args)
        return
    logging.basicConfig(format="%(message)s")
    logging.getLogger("audio").setLevel(logging.INFO)  # shows the first-run base join
    if args.window_compare:
        cases = window_speech(args.speech_cache, args.trail_s)
        names = args.models or ["tiny.en"]
        bench_window(names, cases, args.repeats, args.cache_dir, args.pad_frames, args.trail_s)
        return
    speech = make_speech(args.speech_cache)
    bench_vad_and_endpoint(speech, args.repeats)
    bench_tts(args.repeats)
    bench_resampler()
    bench_asr(args.models or ["tiny.en", "base"], speech, args.repeats, args.cache_dir)


if __name__ == "__main__":
    main()
