"""Streaming Silero VAD (v6 ONNX model shipped with faster-whisper).

faster-whisper's own ``SileroVADModel`` resets the LSTM state on every call, so it can
only label a whole recording. Here the state lives in a small per-session
:class:`VadState` and the model in one shared :class:`SileroVad` per process:
ONNX Runtime's ``InferenceSession.run`` is thread-safe, so sessions may call it from
any worker thread as long as each state is used by one caller at a time.

The v6 graph takes ``input`` (N, 576): for each 512-sample frame at 16 kHz, the last 64
samples of the previous frame followed by the frame itself (zeros before the first
frame), and runs its LSTM over the N rows in order, carrying ``h``/``c`` (1, 1, 128)
between rows. So N frames in one call give exactly the same probabilities as N calls
of one frame with the state carried, which is what the streaming tests check.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort
from numpy.typing import NDArray

from audio.assets import silero_vad_path

SAMPLE_RATE = 16_000
FRAME_SAMPLES = 512  # 32 ms
CONTEXT_SAMPLES = 64
STATE_SHAPE = (1, 1, 128)

Float32Array = NDArray[np.float32]


def _zeros(*shape: int) -> Float32Array:
    return np.zeros(shape, dtype=np.float32)


@dataclass
class VadState:
    """One stream's VAD state: LSTM memory, frame context, and samples not yet framed."""

    h: Float32Array = field(default_factory=lambda: _zeros(*STATE_SHAPE))
    c: Float32Array = field(default_factory=lambda: _zeros(*STATE_SHAPE))
    context: Float32Array = field(default_factory=lambda: _zeros(CONTEXT_SAMPLES))
    pending: Float32Array = field(default_factory=lambda: _zeros(0))  # < FRAME_SAMPLES
    frames: int = 0  # frames processed so far; frame i covers samples [512 i, 512 (i+1))

    @property
    def samples_in(self) -> int:
        """Samples received so far (framed or pending)."""
        return self.frames * FRAME_SAMPLES + len(self.pending)


class SileroVad:
    """The shared model. ``process(state, audio)`` -> one probability per full frame."""

    def __init__(self, model_path: Path | None = None):
        opts = ort.SessionOptions()
        # One thread: a frame is tiny (docs/audio.md), and the cores belong to Whisper and
        # the reply model.
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        path = model_path if model_path is not None else silero_vad_path()
        self.session = ort.InferenceSession(
            str(path), sess_options=opts, providers=["CPUExecutionProvider"]
        )

    def new_state(self) -> VadState:
        return VadState()

    def held(self, state: VadState, audio: NDArray[np.floating]) -> Float32Array | None:
        """What :meth:`process` returns for ``audio`` that completes no frame (no
        probabilities; the samples wait in ``state``), done without the model, so a
        caller may skip handing it to a worker thread (a 20 ms chunk completes none 3
        times in 8). None, and ``state`` unchanged, when the model has frames to run."""
        if len(state.pending) + len(audio) >= FRAME_SAMPLES:
            return None
        return self.process(state, audio)  # completes no frame: never reaches the model

    def process(self, state: VadState, audio: NDArray[np.floating]) -> Float32Array:
        """Feed 16 kHz mono samples of any length; returns probabilities of the frames
        completed by them (possibly none). The remainder waits in ``state.pending``."""
        x = np.asarray(audio, dtype=np.float32)
        if x.ndim != 1:
            raise ValueError(f"expected mono 1-D samples, got shape {x.shape}")
        if len(state.pending):
            x = np.concatenate([state.pending, x])
        n = len(x) // FRAME_SAMPLES
        state.pending = x[n * FRAME_SAMPLES :].copy()
        if n == 0:
            return _zeros(0)
        frames = x[: n * FRAME_SAMPLES].reshape(n, FRAME_SAMPLES)  # (N, 512)
        # Row i's context is the tail of frame i-1; row 0's is the carried context.
        ctx = np.concatenate([state.context[None, :], frames[:-1, -CONTEXT_SAMPLES:]])
        batch = np.concatenate([ctx, frames], axis=1)  # (N, 576)
        probs, state.h, state.c = self.session.run(
            None, {"input": batch, "h": state.h, "c": state.c}
        )
        state.context = frames[-1, -CONTEXT_SAMPLES:].copy()
        state.frames += n
        out: Float32Array = np.asarray(probs, dtype=np.float32).reshape(n)
        return out
