"""Text to speech with Piper (joe, en_US, medium quality, 22050 Hz).

``synthesize`` yields one int16 chunk per sentence, so the server can send the first
sentence while the next ones are synthesized. It blocks: run it in a worker thread.

Piper's own ``PiperVoice.synthesize`` is reproduced in :meth:`Synthesizer.synthesize`
in a few lines so that phonemization, which goes through espeak-ng's global state and
is not thread-safe, can run under a lock, while the ONNX part (the real cost, and
thread-safe) runs concurrently for different sessions.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
from numpy.typing import NDArray
from piper import PiperVoice, SynthesisConfig
from piper.config import PiperConfig

from audio.assets import PiperVoicePaths, piper_voice_paths

Int16Array = NDArray[np.int16]


class Synthesizer:
    def __init__(
        self,
        voice: PiperVoicePaths | None = None,
        threads: int = 0,
        device: str = "cpu",
        lean: bool = False,
    ):
        """``threads``: ONNX Runtime intra-op threads (0: its default, all cores);
        ``device`` "cuda": the CUDA provider first (onnxruntime-gpu), else the CPU.
        ``lean``: on the CPU, a second session of the voice on one thread, for
        sentences written while other work wants the cores (:meth:`synthesize`)."""
        paths = voice if voice is not None else piper_voice_paths()
        config = PiperConfig.from_dict(json.loads(Path(paths.config).read_text("utf-8")))
        providers = _providers(device)
        self.voice = PiperVoice(session=_session(paths, threads, providers), config=config)
        self._lean: PiperVoice | None = None
        if lean and threads != 1 and providers[0] == "CPUExecutionProvider":
            self._lean = PiperVoice(session=_session(paths, 1, providers), config=config)
        self._phonemize_lock = threading.Lock()

    @property
    def sample_rate(self) -> int:
        return int(self.voice.config.sample_rate)

    def sentences(self, text: str) -> list[list[str]]:
        """Phonemes per sentence, as Piper splits them."""
        with self._phonemize_lock:
            return [p for p in self.voice.phonemize(text) if p]

    @property
    def has_lean(self) -> bool:
        """Whether it has the one-thread session (``lean`` on a CPU)."""
        return self._lean is not None

    def synthesize(
        self, text: str, config: SynthesisConfig | None = None, lean: bool = False
    ) -> Iterator[Int16Array]:
        """One int16 chunk per sentence at :attr:`sample_rate`, first sentence first.
        ``lean``: on the one-thread session, where there is one. With the reply model
        taking both cores, a sentence on two threads cost 60% more CPU than on one and
        came no sooner (970 against 605 ms of CPU, 976 against 756 ms; quiet, two
        threads are 1.6x as fast for 26% more CPU: docs/latency.md, "Piper on one
        thread under load")."""
        voice = self._lean if lean and self._lean is not None else self.voice
        for phonemes in self.sentences(text):
            ids = voice.phonemes_to_ids(phonemes)
            audio = np.asarray(voice.phoneme_ids_to_audio(ids, config), np.float32)
            peak = float(np.max(np.abs(audio))) if len(audio) else 0.0
            if config is None or config.normalize_audio:  # as Piper: peak-normalise
                audio = audio / peak if peak > 1e-8 else np.zeros_like(audio)
            if config is not None and config.volume != 1.0:
                audio = audio * config.volume
            yield np.round(np.clip(audio, -1.0, 1.0) * 32767.0).astype(np.int16)


def _session(paths: PiperVoicePaths, threads: int, providers: list[str]) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.log_severity_level = 3
    # no spinning once a sentence is written: the reply model needs the cores
    opts.add_session_config_entry("session.force_spinning_stop", "1")
    return ort.InferenceSession(str(paths.model), sess_options=opts, providers=providers)


def _providers(device: str) -> list[str]:
    cpu = ["CPUExecutionProvider"]
    if device == "cuda" and "CUDAExecutionProvider" in ort.get_available_providers():
        return ["CUDAExecutionProvider", *cpu]
    return cpu
