"""The test-speech helpers themselves: normalisation, WER, WAV I/O (no models)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from audio.speech import (
    edit_distance,
    normalize_words,
    number_to_words,
    pad,
    read_wav,
    word_error_rate,
    write_wav,
)


@pytest.mark.parametrize(
    ("n", "words"),
    [
        (0, "zero"),
        (13, "thirteen"),
        (40, "forty"),
        (99, "ninety nine"),
        (105, "one hundred five"),
        (1200, "one thousand two hundred"),
        (2_000_017, "two million seventeen"),
    ],
)
def test_number_to_words(n: int, words: str) -> None:
    assert number_to_words(n) == words


def test_normalize_lowercases_strips_punctuation_and_spells_numbers() -> None:
    assert normalize_words("Set a timer for 20 minutes, OK?") == (
        ["set", "a", "timer", "for", "twenty", "minutes", "ok"]
    )
    assert normalize_words("What\u2019s on the 21st at 7:05?") == (
        ["what", "is", "on", "the", "twenty", "first", "at", "seven", "oh", "five"]
    )
    assert normalize_words("$5 is 3.5% of it") == (
        ["five", "dollars", "is", "three", "point", "five", "percent", "of", "it"]
    )
    assert normalize_words("at 730") == normalize_words("at 7.30") == ["at", "seven", "thirty"]


def test_word_error_rate() -> None:
    assert word_error_rate("Set a timer for twenty minutes.", "set a timer for 20 minutes") == 0
    assert word_error_rate("turn off the lights", "turn of the light") == 0.5
    assert word_error_rate("a b c", "a x b c") == pytest.approx(1 / 3)  # one insertion
    assert word_error_rate("", "") == 0.0
    assert word_error_rate("", "hello") == 1.0
    assert edit_distance(["a", "b"], []) == 2


def test_wav_round_trip_and_padding(tmp_path: Path) -> None:
    x = np.sin(np.linspace(0, 100, 8000)).astype(np.float32) * 0.5
    y = pad(x, lead_s=0.5, trail_s=0.25)
    assert len(y) == 8000 + 8000 + 4000 and not y[:8000].any()
    audio, rate = read_wav(write_wav(tmp_path / "x.wav", y))
    assert rate == 16_000
    assert np.max(np.abs(audio - y)) < 1e-4
