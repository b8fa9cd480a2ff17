from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from audio.asr import Transcriber, load_transcriber
from audio.speech import SpeechFactory, have_espeak, word_error_rate

pytestmark = pytest.mark.models

CASES = [
    ("piper", "Set a timer for twenty minutes."),
    ("piper", "Who wrote the novel Pride and Prejudice?"),
    ("espeak", "What is the capital of Australia?"),
]


@pytest.fixture(scope="module", params=["tiny.en", "base"])
def transcriber(request: pytest.FixtureRequest, model_cache: Path) -> Transcriber:
    return load_transcriber(request.param, model_cache)


@pytest.mark.parametrize(("voice", "text"), CASES)
def test_transcribes_test_speech(
    transcriber: Transcriber, speech: SpeechFactory, voice: str, text: str
) -> None:
    if voice == "espeak" and not have_espeak():
        pytest.skip("espeak-ng is not installed")
    audio = getattr(speech, voice)(text, 0.3, 0.3)
    result = transcriber.transcribe(audio)
    assert result.language == "en"
    assert result.audio_s == pytest.approx(len(audio) / 16_000)
    assert word_error_rate(text, result.text) <= 0.2, result.text


def test_silence_and_empty_give_no_words(transcriber: Transcriber) -> None:
    assert transcriber.transcribe(np.zeros(0, np.float32)).text == ""
    quiet = transcriber.transcribe(np.zeros(16_000, np.float32))
    assert word_error_rate("", quiet.text) == 0.0 or quiet.no_speech_prob > 0.5


def test_english_default_even_for_the_multilingual_model(transcriber: Transcriber) -> None:
    assert transcriber.language == "en"
    assert transcriber.multilingual is (transcriber.model_dir.endswith("whisper-base-ct2"))
