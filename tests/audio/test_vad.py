from __future__ import annotations

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


def test_chunks_that_complete_no_frame_are_held_without_the_model(
    vad: SileroVad, sentence: np.ndarray
) -> None:
    """The server keeps such chunks on its event loop (server/app.py): the stream must
    score exactly as when every chunk goes through the model."""
    plain, held = vad.new_state(), vad.new_state()
    expected, got, skipped = [], [], 0
    for pos in range(0, len(sentence), 320):  # 20 ms chunks, as clients send them
        chunk = sentence[pos : pos + 320]
        expected.append(vad.process(plain, chunk))
        probs = vad.held(held, chunk)
        if probs is None:
            probs = vad.process(held, chunk)
        else:
            skipped += 1
            assert len(probs) == 0
        got.append(probs)
    np.testing.assert_array_equal(np.concatenate(got), np.concatenate(expected))
    assert held.frames == plain.frames and np.array_equal(held.pending, plain.pending)
    chunks = -(-len(sentence) // 320)
    assert abs(skipped - chunks * 3 / 8) <= 2  # 3 in 8 chunks of 320 complete no 512-frame
    state = vad.new_state()
    assert vad.held(state, sentence[:511]) is not None and len(state.pending) == 511
    assert vad.held(state, sentence[511:512]) is None and len(state.pending) == 511  # unchanged


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


def test_a_frame_is_scored_the_moment_its_last_sample_arrives(
    vad: SileroVad, sentence: np.ndarray
) -> None:
    """What the endpointer relies on: nothing for part of a frame, its probability in
    the call that completes it, and the same probability as the whole sentence's."""
    whole = vad.process(vad.new_state(), sentence)
    state, half = vad.new_state(), FRAME_SAMPLES // 2
    for k in range(3):
        start = k * FRAME_SAMPLES
        assert len(vad.process(state, sentence[start : start + half])) == 0
        assert state.frames == k and len(state.pending) == half
        got = vad.process(state, sentence[start + half : start + FRAME_SAMPLES])
        np.testing.assert_allclose(got, whole[k : k + 1], atol=1e-5)
        assert state.frames == k + 1 and len(state.pending) == 0
