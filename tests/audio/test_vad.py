from __future__ import annotations

import time

import numpy as np
import pytest

from audio.speech import SpeechFactory
from audio.vad import FRAME_SAMPLES, SileroVad
from tests.speech import needs_espeak

pytestmark = pytest.mark.models


@pytest.fixture(scope="module")
def sentence(speech: SpeechFactory) -> np.ndarray:
    return speech.piper("Can you turn off the lights in the kitchen, please?", 0.5, 1.0)


def test_streaming_in_odd_pieces_equals_whole_frames(vad: SileroVad, sentence: np.ndarray) -> None:
    whole = vad.process(vad.new_state(), sentence)
    assert len(whole) == len(sentence) // FRAME_SAMPLES

    state, rng, pieces, pos = vad.new_state(), np.random.default_rng(0), [], 0
    while pos < len(sentence):
        n = int(rng.integers(1, 1500))  # 0, 1 or several frames per call
        pieces.append(vad.process(state, sentence[pos : pos + n]))
        pos += n
    streamed = np.concatenate(pieces)
    np.testing.assert_allclose(streamed, whole, atol=1e-5)
    assert state.frames == len(whole)
    assert len(state.pending) == len(sentence) % FRAME_SAMPLES

    one_by_one = vad.new_state()
    frames = sentence[: len(whole) * FRAME_SAMPLES].reshape(-1, FRAME_SAMPLES)
    singles = np.concatenate([vad.process(one_by_one, f) for f in frames])
    np.testing.assert_allclose(singles, whole, atol=1e-5)


def test_states_are_independent(vad: SileroVad, sentence: np.ndarray) -> None:
    a, b = vad.new_state(), vad.new_state()
    ref = vad.process(vad.new_state(), sentence)
    half = len(sentence) // 2
    out_a = [vad.process(a, sentence[:half])]
    vad.process(b, np.random.default_rng(1).standard_normal(30_000).astype(np.float32))
    out_a.append(vad.process(a, sentence[half:]))
    np.testing.assert_allclose(np.concatenate(out_a), ref, atol=1e-5)


def test_speech_is_high_and_silence_low(vad: SileroVad, sentence: np.ndarray) -> None:
    probs = vad.process(vad.new_state(), sentence)
    lead = probs[: int(0.45 * 16_000) // FRAME_SAMPLES]
    trail = probs[-int(0.8 * 16_000) // FRAME_SAMPLES :]
    speech = probs[len(lead) + 3 : -len(trail) - 3]
    assert lead.max() < 0.2 and trail.max() < 0.2
    assert np.median(speech) > 0.9
    noise = np.random.default_rng(2).standard_normal(16_000).astype(np.float32) * 0.01
    assert vad.process(vad.new_state(), noise).max() < 0.35


@needs_espeak
def test_espeak_voice_is_speech_too(vad: SileroVad, speech: SpeechFactory) -> None:
    probs = vad.process(vad.new_state(), speech.espeak("What time is it in Tokyo?"))
    assert np.mean(probs > 0.5) > 0.6


def test_frame_cost(vad: SileroVad, sentence: np.ndarray) -> None:
    """Prints ms per 32 ms frame, streamed one frame per call (figure, not assertion)."""
    frames = sentence[: (len(sentence) // FRAME_SAMPLES) * FRAME_SAMPLES]
    frames = frames.reshape(-1, FRAME_SAMPLES)
    runs = []
    for _ in range(5):
        state = vad.new_state()
        t = time.perf_counter()
        for f in frames:
            vad.process(state, f)
        runs.append((time.perf_counter() - t) / len(frames) * 1000)
    print(f"VAD: {np.median(runs):.3f} ms per 32 ms frame (median of 5)")
