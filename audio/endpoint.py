"""Endpointing: when did the user start, pause, resume, and finish a turn.

Pure logic, no I/O and no clock. The :class:`Endpointer` is fed the per-frame speech
probabilities from :mod:`audio.vad` (frame i covers samples [512 i, 512 (i + 1)) of the
session's 16 kHz stream), so every event carries an absolute sample index: the server
slices the turn's audio out of its :class:`audio.ring.AudioRing` with it.

The decision rules follow Silero's ``get_speech_timestamps`` (hysteresis between
``threshold`` and ``neg_threshold``, a minimum speech duration) with two silence
timers on top, one for speculation and one for the final decision::

    SILENCE --speech >= min_speech--> SPEECH --silence >= pause--> PAUSED
       ^                                 ^                          |  |
       |                                 +--speech >= min_speech----+  |  (SpeechResumed)
       +------------------- silence >= end_of_turn --------------------+  (EndOfTurn)

Invariants the server can rely on:

- every turn is ``SpeechStarted``, then one or more ``SpeechPaused``
  [``SpeechResumed``, ``SpeechPaused``]..., then ``EndOfTurn``;
- an ``EndOfTurn`` always comes right after a ``SpeechPaused`` with the same
  ``end_sample`` (possibly in the same call): the audio of the final transcript is
  exactly the audio the last speculative transcript was started on;
- events are emitted late (a decision needs the frames that confirm it) but their
  sample indices point back to where the speech really started or stopped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Literal

FRAME_SAMPLES = 512
SAMPLE_RATE = 16_000
FRAME_MS = 1000 * FRAME_SAMPLES / SAMPLE_RATE  # 32.0


@dataclass(frozen=True)
class EndpointConfig:
    """Defaults are justified in docs/audio.md (measured on synthesized questions)."""

    threshold: float = 0.5  # a frame with p >= threshold is speech
    neg_threshold: float = 0.35  # once speaking, only p < neg_threshold is silence
    min_speech_ms: float = 96.0  # shorter bursts (clicks, taps) never start a turn
    pause_ms: float = 192.0  # silence before SpeechPaused: speculative ASR + reply start
    end_of_turn_ms: float = 416.0  # silence before EndOfTurn (the server may hold longer)
    pre_roll_ms: float = 320.0  # audio before the detected start handed to ASR
    max_turn_s: float = 28.0  # forced end (Whisper sees 30 s, minus the pre-roll)

    def __post_init__(self) -> None:
        if not 0.0 < self.neg_threshold <= self.threshold < 1.0:
            raise ValueError("need 0 < neg_threshold <= threshold < 1")
        if not 0 < self.pause_ms <= self.end_of_turn_ms:
            raise ValueError("need 0 < pause_ms <= end_of_turn_ms")
        if self.min_speech_ms < 0 or self.pre_roll_ms < 0:
            raise ValueError("durations must be >= 0")
        if self.max_turn_s * 1000 <= self.min_speech_ms:
            raise ValueError("max_turn_s must exceed min_speech_ms")

    @property
    def pre_roll_samples(self) -> int:
        return round(self.pre_roll_ms * SAMPLE_RATE / 1000)

    def asr_start(self, start_sample: int) -> int:
        """First sample to hand to ASR for a turn that started at ``start_sample``."""
        return max(0, start_sample - self.pre_roll_samples)


def ms_to_frames(ms: float) -> int:
    """Whole frames needed to cover ``ms`` (at least one)."""
    return max(1, math.ceil(ms / FRAME_MS - 1e-9))


@dataclass(frozen=True)
class SpeechStarted:
    start_sample: int  # first sample of the first speech frame (before pre-roll)


@dataclass(frozen=True)
class SpeechPaused:
    end_sample: int  # first sample after the last speech frame


@dataclass(frozen=True)
class SpeechResumed:
    sample: int  # first sample of the speech that cancelled the pause


EndReason = Literal["silence", "max_turn", "end_input"]


@dataclass(frozen=True)
class EndOfTurn:
    end_sample: int  # same as the SpeechPaused just before it
    reason: EndReason = "silence"


EndpointEvent = SpeechStarted | SpeechPaused | SpeechResumed | EndOfTurn


class Phase(Enum):
    SILENCE = "silence"  # between turns
    SPEECH = "speech"  # in a turn, no pause announced
    PAUSED = "paused"  # in a turn, SpeechPaused announced, waiting for end or resume


class Endpointer:
    """Turns per-frame speech probabilities into :data:`EndpointEvent` s."""

    def __init__(self, config: EndpointConfig | None = None):
        self.reconfigure(config if config is not None else EndpointConfig())
        self.frames = 0  # frames seen since the session started
        self.reset()

    def reconfigure(self, config: EndpointConfig) -> None:
        """Use ``config`` from the next frame on; a turn in progress goes on under it."""
        self.config = c = config
        self._min_speech = ms_to_frames(c.min_speech_ms) if c.min_speech_ms > 0 else 1
        self._pause = ms_to_frames(c.pause_ms)
        self._end = ms_to_frames(c.end_of_turn_ms)
        self._max_turn = ms_to_frames(c.max_turn_s * 1000)

    def reset(self) -> None:
        """Forget the speech being heard: the next speech starts a new turn."""
        self.phase = Phase.SILENCE
        self.turn_start: int | None = None  # frame where the current turn's speech began
        self._silence_start: int | None = None  # first frame of the current gap in a turn
        self._cand_start: int | None = None  # first frame of unconfirmed speech
        self._cand_len = 0

    def feed(self, probs: Iterable[float]) -> list[EndpointEvent]:
        events: list[EndpointEvent] = []
        for p in probs:
            self._step(float(p), events)
        return events

    @property
    def hearing_speech(self) -> bool:
        """Speech is being heard now, confirmed or not yet (shorter than min_speech)."""
        in_speech = self.phase is not Phase.SILENCE and self._silence_start is None
        return in_speech or self._cand_start is not None

    def end_input(self, end_sample: int | None = None) -> list[EndpointEvent]:
        """Push-to-talk release (or the caller knows the turn is over): end it now.

        Returns ``[SpeechPaused, EndOfTurn]`` (or just ``EndOfTurn`` if already paused)
        if the turn has confirmed speech, else ``[]``. If the user is still speaking the
        turn ends at ``end_sample`` (default: the end of the frames seen so far; pass the
        total samples received so that the unframed tail is included).
        """
        if self.phase is Phase.SILENCE:
            self._clear_candidate()
            return []
        if self._silence_start is not None:
            end = self._silence_start * FRAME_SAMPLES
        else:
            end = max(self.frames * FRAME_SAMPLES, end_sample or 0)
        return self._finish(end, "end_input")

    # -- per-frame state machine -------------------------------------------------------

    def _step(self, p: float, events: list[EndpointEvent]) -> None:
        i = self.frames
        self.frames += 1
        if self.phase is Phase.SILENCE:
            if self._candidate(i, p):
                self._start_turn(events)
            return
        if self._silence_start is None:  # speaking
            if p < self.config.neg_threshold:
                self._silence_start = i
        elif self.phase is Phase.SPEECH and p >= self.config.threshold:
            self._silence_start = None  # short dip inside speech: nothing was announced
        elif self._candidate(i, p):
            events.append(SpeechResumed(self._take_candidate() * FRAME_SAMPLES))
            self.phase, self._silence_start = Phase.SPEECH, None
        elif self._cand_start is None:  # silence timers wait while a candidate is open
            self._check_silence(events)
            return
        self._check_max_turn(events)

    def _candidate(self, i: int, p: float) -> bool:
        """Track unconfirmed speech; True once it has lasted ``min_speech`` frames."""
        if self._cand_start is None:
            if p >= self.config.threshold:
                self._cand_start, self._cand_len = i, 1
        elif p >= self.config.neg_threshold:
            self._cand_len += 1
        else:
            self._clear_candidate()
        return self._cand_start is not None and self._cand_len >= self._min_speech

    def _take_candidate(self) -> int:
        assert self._cand_start is not None
        start = self._cand_start
        self._clear_candidate()
        return start

    def _clear_candidate(self) -> None:
        self._cand_start, self._cand_len = None, 0

    def _start_turn(self, events: list[EndpointEvent]) -> None:
        self.turn_start = self._take_candidate()
        self.phase, self._silence_start = Phase.SPEECH, None
        events.append(SpeechStarted(self.turn_start * FRAME_SAMPLES))

    def _check_silence(self, events: list[EndpointEvent]) -> None:
        assert self._silence_start is not None
        gap = self.frames - self._silence_start
        end = self._silence_start * FRAME_SAMPLES
        if gap >= self._end:
            events.extend(self._finish(end, "silence"))
        elif gap >= self._pause and self.phase is Phase.SPEECH:
            self.phase = Phase.PAUSED
            events.append(SpeechPaused(end))

    def _check_max_turn(self, events: list[EndpointEvent]) -> None:
        assert self.turn_start is not None
        if self.frames - self.turn_start >= self._max_turn:
            gap_start = self._silence_start
            end = (gap_start if gap_start is not None else self.frames) * FRAME_SAMPLES
            events.extend(self._finish(end, "max_turn"))

    def _finish(self, end: int, reason: EndReason) -> list[EndpointEvent]:
        events: list[EndpointEvent] = []
        if self.phase is Phase.SPEECH:
            events.append(SpeechPaused(end))
        events.append(EndOfTurn(end, reason))
        self.phase, self.turn_start, self._silence_start = Phase.SILENCE, None, None
        self._clear_candidate()
        return events
