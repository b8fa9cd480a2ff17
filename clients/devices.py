"""Microphones and speakers: live through ``sounddevice`` (extra ``audio``), or WAV files.

A microphone is an async iterator of small PCM16 frames at its rate; a speaker takes
reply audio per turn and drops a cancelled turn's audio at once (:meth:`Speaker.flush`),
including what is already queued for the sound card, so a barge-in silences the
assistant within one audio block. A speaker also plays the device's own sounds (a
timer's chime, :meth:`Speaker.sound`), which belong to no turn and are never flushed.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from .common import FRAME_MS, Pacer, Pcm, TurnAudio, frames, silence, write_wav


def sounddevice_module() -> ModuleType | None:
    """``sounddevice`` if it is installed and finds PortAudio, else None."""
    try:
        import sounddevice
    except (ImportError, OSError):  # OSError: the module is there, PortAudio is not
        return None
    module: ModuleType = sounddevice
    return module


def need_sounddevice() -> ModuleType:
    sd = sounddevice_module()
    if sd is None:
        raise RuntimeError(
            "live audio needs sounddevice and PortAudio: pip install 'quicksilver[audio]' "
            "and apt-get install libportaudio2 (or use --wav / --out)"
        )
    return sd


class Microphone(Protocol):
    rate: int

    def stream(self) -> AsyncIterator[bytes]:
        """Frames from now on; a new call after a reconnect starts a new stream."""
        ...


class WavMicrophone:
    """A WAV file as the microphone, at real-time pace, then ``trailing_s`` of silence.

    Each :meth:`stream` plays the file from the start: after a dropped connection
    the user's question is asked again, as a person would repeat it.
    """

    def __init__(self, pcm: Pcm, trailing_s: float = 1.0) -> None:
        self.pcm = pcm
        self.rate = pcm.rate
        self.trailing_s = trailing_s

    async def stream(self) -> AsyncIterator[bytes]:
        pacer = Pacer()
        for chunk in frames(self.pcm) + frames(silence(self.rate, self.trailing_s)):
            await pacer.wait(len(chunk) / 2 / self.rate)
            yield chunk


class DeviceMicrophone:
    """The default input device: 16 kHz mono PCM16 in ``FRAME_MS`` blocks."""

    def __init__(self, rate: int = 16000, frame_ms: int = FRAME_MS) -> None:
        self.rate = rate
        self.frame_ms = frame_ms

    async def stream(self) -> AsyncIterator[bytes]:
        sd = need_sounddevice()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=100)  # 2 s; older audio is stale

        def put(data: bytes) -> None:
            if queue.full():
                queue.get_nowait()
            queue.put_nowait(data)

        def callback(indata: Any, _frames: int, _time: Any, _status: Any) -> None:
            loop.call_soon_threadsafe(put, bytes(indata))

        block = self.rate * self.frame_ms // 1000
        with sd.RawInputStream(
            samplerate=self.rate, blocksize=block, channels=1, dtype="int16", callback=callback
        ):
            while True:
                yield await queue.get()


SOUND_TURN = -1  # the device's own sounds in a speaker's queue: no turn has this id


class Speaker(Protocol):
    rate: int

    def play(self, turn_id: int, pcm: bytes) -> None: ...

    def sound(self, pcm: bytes) -> None:
        """A sound of the device's own (a timer's chime), after what is queued."""
        ...

    def flush(self, turn_id: int) -> None:
        """The turn was cancelled: drop all of its audio now, queued or not."""
        ...

    def close(self) -> None: ...


class WavSpeaker:
    """Keeps the audio of every turn that was not cancelled, and the device's sounds,
    in the order they came; writes it on close."""

    def __init__(self, rate: int, path: Path | None = None) -> None:
        self.rate = rate
        self.path = path
        self.audio = TurnAudio()
        self.kept: list[int | bytes] = []  # turns to write and sounds, in order

    def play(self, turn_id: int, pcm: bytes) -> None:
        if turn_id not in self.audio.cancelled:
            self.audio.chunks.setdefault(turn_id, []).append(pcm)

    def flush(self, turn_id: int) -> None:
        self.audio.cancel(turn_id)

    def keep(self, turn_id: int) -> None:
        self.kept.append(turn_id)

    def sound(self, pcm: bytes) -> None:
        self.kept.append(pcm)

    def close(self) -> None:
        if self.path is not None and self.kept:
            out = (x if isinstance(x, bytes) else self.audio.pcm(x) for x in self.kept)
            write_wav(self.path, b"".join(out), self.rate)


class DeviceSpeaker:
    """The default output device, fed from a queue that :meth:`flush` empties at once."""

    def __init__(self, rate: int, block_ms: int = FRAME_MS) -> None:
        sd = need_sounddevice()
        self.rate = rate
        self._lock = threading.Lock()
        self._queue: collections.deque[tuple[int, bytes]] = collections.deque()
        self._cancelled: set[int] = set()
        self._stream = sd.RawOutputStream(
            samplerate=rate,
            blocksize=rate * block_ms // 1000,
            channels=1,
            dtype="int16",
            callback=self._fill,
        )
        self._stream.start()

    def play(self, turn_id: int, pcm: bytes) -> None:
        with self._lock:
            if turn_id not in self._cancelled:
                self._queue.append((turn_id, pcm))

    def sound(self, pcm: bytes) -> None:
        self.play(SOUND_TURN, pcm)

    def flush(self, turn_id: int) -> None:
        with self._lock:
            self._cancelled.add(turn_id)
            self._queue = collections.deque(x for x in self._queue if x[0] != turn_id)

    def _fill(self, outdata: Any, _frames: int, _time: Any, _status: Any) -> None:
        """Sound-card thread: copy queued audio out, silence when there is none."""
        need, out = len(outdata), bytearray()
        with self._lock:
            while len(out) < need and self._queue:
                turn_id, pcm = self._queue.popleft()
                take = need - len(out)
                out += pcm[:take]
                if len(pcm) > take:
                    self._queue.appendleft((turn_id, pcm[take:]))
        outdata[:] = bytes(out) + bytes(need - len(out))

    def close(self) -> None:
        self._stream.stop()
        self._stream.close()
