from __future__ import annotations

import numpy as np
import pytest

from audio.asr import Transcriber, load_transcriber
from audio.resample import int16_to_float32, resample
from audio.speech import word_error_rate
from audio.tts import Synthesizer

pytestmark = pytest.mark.models


@pytest.fixture(scope="module")
def tts() -> Synthesizer:
    return Synthesizer(lean=True)  # as the server loads it on a CPU


def test_one_int16_chunk_per_sentence(tts: Synthesizer) -> None:
    assert tts.sample_rate == 22_050
    chunks = list(tts.synthesize("Sure. The timer is set for ten minutes. Anything else?"))
    assert len(chunks) == 3
    for c in chunks:
        assert c.dtype == np.int16 and c.ndim == 1
        assert 0.2 * tts.sample_rate < len(c) < 3 * tts.sample_rate
        assert np.abs(c).max() > 16_000  # peak-normalised like Piper
    assert list(tts.synthesize("")) == []


@pytest.mark.parametrize("lean", [False, True])
def test_speech_is_intelligible(tts: Synthesizer, lean: bool) -> None:
    """On the all-cores session and on its one-thread twin alike (``lean``: sentences
    written while other work takes the cores)."""
    asr: Transcriber = load_transcriber("tiny.en")
    text = "Your package will arrive on Friday afternoon."
    audio = np.concatenate(list(tts.synthesize(text, lean=lean)))
    heard = asr.transcribe(resample(int16_to_float32(audio), tts.sample_rate, 16_000)).text
    assert word_error_rate(text, heard) <= 0.25, heard


def test_the_first_chunk_is_the_first_sentence_alone(tts: Synthesizer) -> None:
    """The reply's first audio is its first sentence and nothing more: what the voice
    loop can play while the rest is made."""
    asr: Transcriber = load_transcriber("tiny.en")
    first, second = "It will be sunny tomorrow.", "Expect a high of twenty two degrees."
    chunks = tts.synthesize(f"{first} {second}")
    audio = next(iter(chunks))
    heard = asr.transcribe(resample(int16_to_float32(audio), tts.sample_rate, 16_000)).text
    # Piper's takes vary (its noise is not seeded): tiny.en may mishear a word, but what
    # it hears is the first sentence, not the reply
    alone = word_error_rate(first, heard)
    assert alone <= 0.4 and alone < word_error_rate(f"{first} {second}", heard), heard
    rest = list(chunks)
    assert len(rest) == 1 and len(rest[0]) > 0.2 * tts.sample_rate


def test_voice_threads_stop_spinning_when_a_sentence_is_written(tts: Synthesizer) -> None:
    options = tts.voice.session.get_session_options()
    assert options.get_session_config_entry("session.force_spinning_stop") == "1"


def test_the_lean_twin_runs_on_one_thread_and_stops_spinning(tts: Synthesizer) -> None:
    assert tts.has_lean and tts._lean is not None
    options = tts._lean.session.get_session_options()
    assert options.intra_op_num_threads == 1
    assert options.get_session_config_entry("session.force_spinning_stop") == "1"


def test_a_voice_on_one_thread_or_not_asked_has_no_lean_twin() -> None:
    """Without ``lean``, or with one thread already, ``lean=True`` runs the voice's
    own session."""
    for voice in (Synthesizer(), Synthesizer(threads=1, lean=True)):
        assert not voice.has_lean
        assert len(np.concatenate(list(voice.synthesize("Hello there.", lean=True)))) > 0
