"""Spoken numbers and durations (model/spoken.py), and the decoder laying them down."""

from __future__ import annotations

import pytest

from model.actions import CallOptions, decode_call
from model.diffusion_engine import smollm2_diffusion_config
from model.spoken import slot_value, spoken_duration, spoken_numbers
from model.tools import DEFAULT_TOOLS, Param

from .test_actions import TOOLS, prefilled

PARAMS = {p.name: p for t in DEFAULT_TOOLS for p in t.params}


@pytest.mark.parametrize(
    ("text", "numbers"),
    [
        ("set it to twenty five point five", [25.5]),
        ("seventeen and a half degrees", [17.5]),
        ("I'd like it at 24.5 degrees.", [24.5]),
        ("one hundred and five, then two thousand three hundred", [105, 2300]),
        ("forty-five seconds", [45]),
        ("put the volume at zero", [0]),
        ("call mom", []),
        ("the point is", []),
    ],
)
def test_spoken_numbers(text: str, numbers: list[float]) -> None:
    assert spoken_numbers(text) == numbers


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("Set a timer for five minutes.", 300),
        ("start counting down from 35 minutes", 2100),
        ("i need a timer for 1 hour and five minutes", 3900),
        ("I need a timer for half an hour.", 1800),
        ("start counting down from a minute and a half", 90),
        ("put a timer on for an hour and a half", 5400),
        ("a timer for ten and a half minutes", 630),
        ("2 hours and ten minutes", 7800),
        ("Uh, 15 seconds timer please.", 15),
        ("set a timer", None),
        ("five", None),
    ],
)
def test_spoken_durations(text: str, seconds: float | None) -> None:
    assert spoken_duration(text) == seconds


def test_a_number_slot_takes_the_one_number_said_if_it_fits() -> None:
    assert slot_value(PARAMS["seconds"], "Set a timer for five minutes.") == "300"
    assert slot_value(PARAMS["temperature_c"], "twenty five point five degrees") == "25.5"
    assert slot_value(PARAMS["temperature_c"], "make it 21") == "21"
    assert slot_value(PARAMS["level"], "put the volume at nine") == "9"
    assert slot_value(PARAMS["level"], "put the volume at 11") is None  # outside 0-10
    assert slot_value(PARAMS["level"], "volume 4.5") is None  # not an integer
    assert slot_value(PARAMS["level"], "from 3 to 4") is None  # two numbers: the model's
    assert slot_value(PARAMS["temperature_c"], "warmer please") is None  # none said
    assert slot_value(PARAMS["contact"], "call five") is None  # strings are copied
    minutes = Param("minutes", "integer")
    assert slot_value(minutes, "in two hours") == "120"  # a unit-named parameter converts


def test_the_decoder_lays_the_number_said_whatever_the_model_would_write() -> None:
    text = "set a timer for two and a half minutes"
    backend, cache, last, tok = prefilled(0, text)
    config = smollm2_diffusion_config(tok)
    timer = [t for t in TOOLS if t.name == "timer.set"]
    before = backend.steps
    done = decode_call(backend, tok, cache, last, timer, text, config, CallOptions(8))
    assert done is not None and done.call.arguments == {"seconds": 150}
    assert done.call.passes == backend.steps - before
