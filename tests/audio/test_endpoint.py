"""Endpointer transitions on synthetic probability sequences (no models)."""

from __future__ import annotations

import pytest

from audio.endpoint import (
    FRAME_SAMPLES,
    EndOfTurn,
    EndpointConfig,
    Endpointer,
    Phase,
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
)

F = FRAME_SAMPLES
# 32 ms frames: min speech 3 frames, pause 6, end of turn 13, max 40.
CFG = EndpointConfig(
    min_speech_ms=96,
    pause_ms=192,
    end_of_turn_ms=416,
    pre_roll_ms=64,
    max_turn_s=1.28,
)
S, Q = 0.9, 0.05  # speech and silence probabilities


def run(probs: list[float], cfg: EndpointConfig = CFG) -> list[tuple[int, object]]:
    """Feed frame by frame; return (frame index at which it was emitted, event)."""
    ep = Endpointer(cfg)
    out: list[tuple[int, object]] = []
    for i, p in enumerate(probs):
        out.extend((i, e) for e in ep.feed([p]))
    return out


def test_silence_gives_nothing() -> None:
    assert run([Q] * 100) == []


def test_speech_start_needs_min_speech_and_points_back_to_onset() -> None:
    events = run([Q] * 5 + [S] * 3)
    assert events == [(7, SpeechStarted(5 * F))]  # emitted on the 3rd speech frame


def test_short_burst_is_rejected() -> None:
    assert run([Q] * 5 + [S] * 2 + [Q] * 30) == []


def test_hysteresis_keeps_a_candidate_between_thresholds() -> None:
    # 0.4 is below threshold (cannot start) but above neg_threshold (does not stop)
    assert run([0.4] * 10) == []
    assert run([S, 0.4, 0.4]) == [(2, SpeechStarted(0))]
    assert run([S, 0.3, S, S, S]) == [(4, SpeechStarted(2 * F))]  # 0.3 broke the first


def test_pause_then_end_of_turn() -> None:
    events = run([Q] * 2 + [S] * 10 + [Q] * 20)
    assert events == [
        (4, SpeechStarted(2 * F)),
        (17, SpeechPaused(12 * F)),  # 6th silent frame
        (24, EndOfTurn(12 * F)),  # 13th silent frame
    ]


def test_short_dip_before_pause_is_ignored() -> None:
    events = run([S] * 5 + [Q] * 5 + [S] * 5 + [Q] * 13)
    assert [e for _, e in events] == [SpeechStarted(0), SpeechPaused(15 * F), EndOfTurn(15 * F)]


def test_probabilities_between_thresholds_neither_start_nor_stop_silence() -> None:
    # inside speech 0.4 is still speech; inside a gap it is still silence
    assert run([S] * 5 + [0.4] * 30) == [(2, SpeechStarted(0))]
    events = run([S] * 5 + [Q] + [0.4] * 12)
    assert [e for _, e in events] == [SpeechStarted(0), SpeechPaused(5 * F), EndOfTurn(5 * F)]


def test_resume_after_pause() -> None:
    events = run([S] * 5 + [Q] * 8 + [S] * 5 + [Q] * 13)
    assert [e for _, e in events] == [
        SpeechStarted(0),
        SpeechPaused(5 * F),
        SpeechResumed(13 * F),
        SpeechPaused(18 * F),
        EndOfTurn(18 * F),
    ]


def test_click_during_pause_neither_resumes_nor_delays_end() -> None:
    events = run([S] * 5 + [Q] * 8 + [S] * 2 + [Q] * 10)
    assert events == [(2, SpeechStarted(0)), (10, SpeechPaused(5 * F)), (17, EndOfTurn(5 * F))]


def test_candidate_in_pause_holds_end_until_decided() -> None:
    # the gap reaches end_of_turn while a 2-frame burst is undecided: decided when it ends
    events = run([S] * 5 + [Q] * 11 + [S] * 2 + [Q] * 5)
    assert events[-1] == (18, EndOfTurn(5 * F))


def test_max_turn_forces_end_and_continues_with_a_new_turn() -> None:
    events = run([S] * 50)
    assert events == [
        (2, SpeechStarted(0)),
        (39, SpeechPaused(40 * F)),
        (39, EndOfTurn(40 * F, "max_turn")),
        (42, SpeechStarted(40 * F)),  # the rest of the speech is the next turn
    ]


def test_end_input_while_speaking() -> None:
    ep = Endpointer(CFG)
    ep.feed([Q] * 2 + [S] * 5)
    assert ep.end_input() == [SpeechPaused(7 * F), EndOfTurn(7 * F, "end_input")]
    assert ep.phase is Phase.SILENCE
    assert ep.end_input() == []


def test_end_input_includes_unframed_tail_when_given() -> None:
    ep = Endpointer(CFG)
    ep.feed([S] * 5)
    assert ep.end_input(5 * F + 100)[-1] == EndOfTurn(5 * F + 100, "end_input")


def test_end_input_in_gap_ends_at_the_gap() -> None:
    ep = Endpointer(CFG)
    ep.feed([S] * 5 + [Q] * 2)
    assert ep.end_input() == [SpeechPaused(5 * F), EndOfTurn(5 * F, "end_input")]
    ep.feed([S] * 5 + [Q] * 6)
    assert ep.end_input() == [EndOfTurn(12 * F, "end_input")]  # already paused


def test_end_input_without_confirmed_speech() -> None:
    ep = Endpointer(CFG)
    ep.feed([Q, S, S])  # a 2-frame candidate only
    assert ep.end_input() == []
    assert ep.feed([S]) == []  # the candidate was dropped, not continued


def test_pause_equal_to_end_of_turn_emits_both_at_once() -> None:
    cfg = EndpointConfig(min_speech_ms=32, pause_ms=96, end_of_turn_ms=96)
    assert run([S] * 2 + [Q] * 3, cfg) == [
        (0, SpeechStarted(0)),
        (4, SpeechPaused(2 * F)),
        (4, EndOfTurn(2 * F)),
    ]


def test_feed_accepts_batches_same_as_frames() -> None:
    probs = [Q] * 3 + [S] * 7 + [Q] * 8 + [S] * 4 + [Q] * 20 + [S] * 50
    ep = Endpointer(CFG)
    batched = ep.feed(probs[:13]) + ep.feed(probs[13:])
    assert batched == [e for _, e in run(probs)]


def test_config_validation_and_pre_roll() -> None:
    with pytest.raises(ValueError):
        EndpointConfig(threshold=0.3, neg_threshold=0.5)
    with pytest.raises(ValueError):
        EndpointConfig(pause_ms=500, end_of_turn_ms=400)
    assert CFG.asr_start(10 * F) == 10 * F - 1024
    assert CFG.asr_start(100) == 0


def test_hearing_speech_includes_unconfirmed_speech() -> None:
    ep = Endpointer(CFG)
    assert not ep.hearing_speech
    ep.feed([S])  # one frame: a candidate, not yet a turn
    assert ep.hearing_speech and ep.phase is Phase.SILENCE
    ep.feed([S] * 4 + [Q])
    assert not ep.hearing_speech  # in a turn, but silent now
    ep.feed([S])
    assert ep.hearing_speech


def test_reconfigure_moves_the_end_of_turn_of_the_turn_in_progress() -> None:
    ep = Endpointer(CFG)
    ep.feed([S] * 5 + [Q] * 8)  # speech, then past the pause
    ep.reconfigure(EndpointConfig(min_speech_ms=96, pause_ms=192, end_of_turn_ms=800))
    assert ep.feed([Q] * 10) == []  # 18 silent frames: over 416 ms, under 800
    (end,) = ep.feed([Q] * 7)
    assert end == EndOfTurn(5 * F)


def test_reset_forgets_the_turn_and_hears_the_next_speech_as_new() -> None:
    ep = Endpointer(CFG)
    ep.feed([S] * 5)
    ep.reset()
    assert ep.phase is Phase.SILENCE and not ep.hearing_speech
    assert ep.feed([Q] * 20) == []  # no pause or end of the forgotten turn
    assert ep.feed([S] * 3) == [SpeechStarted(25 * F)]
