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
    def __init__(self, voice: PiperVoicePaths | None = None, threads: int = 0, device: str = "cpu"):
        """``threads``: ONNX Runtime intra-op threads (0: its default, all cores);
        ``device`` "cuda": the CUDA provider first (onnxruntime-gpu), else the CPU."""
        paths = voice if voice is not None else piper_voice_paths()
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.log_severity_level = 3
        # no spinning once a sentence is written: the reply model needs the cores
        opts.add_session_config_entry("session.force_spinning_stop", "1")
        session = ort.InferenceSession(
            str(paths.model), sess_options=opts, providers=_providers(device)
        )
        config = PiperConfig.from_dict(json.loads(Path(paths.config).read_text("utf-8")))
        self.voice = PiperVoice(session=session, config=config)
        self._phonemize_lock = threading.Lock()

    @property
    def sample_rate(self) -> int:
        return int(self.voice.config.sample_rate)

    def sentences(self, text: str) -> list[list[str]]:
        """Phonemes per sentence, as Piper splits them."""
        with self._phonemize_lock:
            return [p for p in self.voice.phonemize(text) if p]

    def synthesize(self, text: str, config: SynthesisConfig | None = None) -> Iterator[Int16Array]:
        """One int16 chunk per sentence at :attr:`sample_rate`, first sentence first."""
        for phonemes in self.sentences(text):
            ids = self.voice.phonemes_to_ids(phonemes)
            audio = np.asarray(self.voice.phoneme_ids_to_audio(ids, config), np.float32)
            peak = float(np.max(np.abs(audio))) if len(audio) else 0.0
            if config is None or config.normalize_audio:  # as Piper: peak-normalise
                audio = audio / peak if peak > 1e-8 else np.zeros_like(audio)
            if config is not None and config.volume != 1.0:
                audio = audio * config.volume
            yield np.round(np.clip(audio, -1.0, 1.0) * 32767.0).astype(np.int16)


def _providers(device: str) -> list[str]:
    cpu = ["CPUExecutionProvider"]
    if device == "cuda" and "CUDAExecutionProvider" in ort.get_available_providers():
        return ["CUDAExecutionProvider", *cpu]
    return cpu
