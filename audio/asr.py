"""Speech to text with faster-whisper (CTranslate2 Whisper), on already-segmented audio.

The endpointer decides where a turn starts and ends, so Whisper's own VAD filter is
off, and so are the features that cost latency without helping one short turn:
beam search (``beam_size=1``), conditioning on previous text, timestamps, and the
temperature fallback (a re-decode at higher temperature doubles the time of the turns
it triggers on; a short command rarely needs it).

``transcribe`` blocks for hundreds of milliseconds: the server runs it in a worker
thread. One :class:`Transcriber` is shared by all sessions; CTranslate2 models accept
concurrent calls (they are queued on ``num_workers`` model replicas, 1 by default).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from faster_whisper import WhisperModel
from numpy.typing import NDArray

from audio.assets import whisper_model

SAMPLE_RATE = 16_000


@dataclass(frozen=True)
class Transcript:
    text: str  # stripped; "" when nothing was recognised
    language: str
    audio_s: float  # duration of the audio transcribed
    no_speech_prob: float  # Whisper's "this was not speech" (highest over segments)
    avg_logprob: float  # mean token log-probability (lowest over segments)


@dataclass(frozen=True)
class AsrOptions:
    device: str = "cpu"
    compute_type: str = "int8"
    cpu_threads: int = 2
    language: str | None = "en"  # None: detect (multilingual models only; costs a pass)


class Transcriber:
    def __init__(self, model_dir: str, options: AsrOptions | None = None):
        self.options = options if options is not None else AsrOptions()
        o = self.options
        self.model_dir = model_dir
        self.model = WhisperModel(
            model_dir, device=o.device, compute_type=o.compute_type, cpu_threads=o.cpu_threads
        )
        self.multilingual = bool(self.model.model.is_multilingual)
        self.language = o.language if (o.language or not self.multilingual) else None
        if not self.multilingual:
            self.language = "en"

    def transcribe(self, audio: NDArray[np.floating]) -> Transcript:
        """Transcribe 16 kHz mono float32 audio (one turn). Blocking."""
        x = np.ascontiguousarray(audio, dtype=np.float32)
        audio_s = len(x) / SAMPLE_RATE
        if len(x) == 0:
            return Transcript("", self.language or "en", 0.0, 1.0, 0.0)
        segments, info = self.model.transcribe(
            x,
            language=self.language,
            beam_size=1,
            temperature=0.0,
            condition_on_previous_text=False,
            without_timestamps=True,
            vad_filter=False,
        )
        segs = list(segments)  # the generator does the decoding
        return Transcript(
            text=" ".join(s.text.strip() for s in segs).strip(),
            language=info.language,
            audio_s=audio_s,
            no_speech_prob=max((s.no_speech_prob for s in segs), default=1.0),
            avg_logprob=min((s.avg_logprob for s in segs), default=0.0),
        )


def load_transcriber(
    name: str = "base", cache_dir: Path | None = None, options: AsrOptions | None = None
) -> Transcriber:
    """Load "tiny.en", "base" (offline packages), a model directory, or a hub name."""
    return Transcriber(whisper_model(name, cache_dir), options)


def recommended_model(device: str) -> str:
    """The default Whisper model for a device (measurements in docs/audio.md).

    On a GPU, "base": fewer word errors, and its extra cost is a few tens of ms. On CPU,
    "tiny.en": "base" takes ~2x as long (about 1 s for a 3 s question on 2 cores),
    which alone exceeds the whole turn budget Quicksilver aims at there.
    """
    return "tiny.en" if device == "cpu" else "base"
