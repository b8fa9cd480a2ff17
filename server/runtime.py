"""The models of one server process and the worker threads that run them.

Everything here is loaded once in ``main()`` and shared by all sessions. Each kind of
blocking inference has its own single worker thread, so a burst of one kind (say, ten
sessions' VAD) never queues behind another (one long reply), and the event loop only
awaits futures.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, ParamSpec, TypeVar

from audio.asr import Transcriber, load_transcriber
from audio.tts import Synthesizer
from audio.vad import SileroVad
from model.engine import PassGate, ReplyEngine, TextGenerator, ThreadedReplyEngine

log = logging.getLogger("quicksilver")

P = ParamSpec("P")
T = TypeVar("T")

# "-onnx" engines run exported models in ONNX Runtime without torch (export/); the
# others run the PyTorch model. The default is the diffusion engine on the int8 graph
# of base + shipped adapter, built into the cache on first start (docs/export.md): its
# held-out replies meet the quality bar as served (docs/training.md, "Quality").
ENGINES = ("diffusion-onnx", "diffusion", "smollm2-ar-onnx", "smollm2-ar")
ONNX_ENGINES = ("smollm2-ar-onnx", "diffusion-onnx")
DEFAULT_ENGINE = "diffusion-onnx"
DEFAULT_ASR = "tiny.en"  # chosen by measured accuracy and latency: docs/audio.md


class Worker:
    """One thread for one kind of blocking job, with its queue depth visible."""

    def __init__(self, name: str) -> None:
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self.pending = 0

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        self.pending += 1
        try:
            return await loop.run_in_executor(self.executor, lambda: fn(*args, **kwargs))
        finally:
            self.pending -= 1

    def shutdown(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)


@dataclass
class Runtime:
    vad: SileroVad
    asr: Transcriber
    tts: Synthesizer
    reply: ReplyEngine
    asr_name: str
    max_reply_tokens: int = 64
    workers: dict[str, Worker] = field(default_factory=dict)
    # held while the first sentence of a reply is synthesized (server/turn.py)
    gate: PassGate = field(default_factory=lambda: PassGate(enabled=False))

    def worker(self, name: str) -> Worker:
        return self.workers[name]

    def close(self) -> None:
        for w in self.workers.values():
            w.shutdown()


@dataclass(frozen=True)
class RuntimeOptions:
    asr: str = DEFAULT_ASR
    engine: str = DEFAULT_ENGINE
    cache_dir: Path | None = None
    max_reply_tokens: int = 64
    speech_first: bool | None = None  # None: when the reply model is on the CPU


def _timed(what: str, fn: Callable[[], T]) -> T:
    log.info("loading %s ...", what)
    t0 = time.perf_counter()
    value = fn()
    log.info("loaded %s in %.1f s", what, time.perf_counter() - t0)
    return value


def load_runtime(options: RuntimeOptions) -> Runtime:
    """Load every model once; say what is happening, since first start takes a while."""
    workers = {name: Worker(name) for name in ("vad", "asr", "tts", "reply")}
    vad = _timed("Silero VAD", SileroVad)
    asr = _timed(f"Whisper {options.asr}", lambda: load_transcriber(options.asr, options.cache_dir))
    tts = _timed("Piper voice en_US-joe-medium", Synthesizer)
    speech_first = options.speech_first
    if speech_first is None:
        speech_first = reply_on_cpu(options.engine)
    gate = PassGate(enabled=speech_first)
    log.info(
        "speech first (the reply model pauses for a reply's first sentence): %s",
        "on" if speech_first else "off",
    )
    reply = _timed(
        f"reply engine {options.engine}",
        lambda: load_engine(options.engine, workers["reply"], options.cache_dir, gate),
    )
    return Runtime(vad, asr, tts, reply, options.asr, options.max_reply_tokens, workers, gate)


def reply_on_cpu(engine: str) -> bool:
    """Whether the reply model ``engine`` shares the CPU with Piper: the PyTorch engines
    run on it here, the ONNX ones unless ONNX Runtime offers a GPU provider."""
    if engine not in ONNX_ENGINES:
        return True
    from export.runtime import choose_providers

    return bool(choose_providers("auto")[0] == "CPUExecutionProvider")


def serving_variant(engine: str) -> Literal["int8", "fp16"]:
    """The graph an ONNX engine serves: int8 on the CPU (its quality is validated as
    served, docs/training.md), fp16 on a GPU (the file whose attention the CUDA and
    TensorRT providers can run, docs/export.md)."""
    return "int8" if reply_on_cpu(engine) else "fp16"


def load_engine(
    name: str, worker: Worker, cache_dir: Path | None = None, gate: PassGate | None = None
) -> ReplyEngine:
    """The reply engine ``name`` on ``worker``'s thread, waiting at ``gate`` between
    forward passes."""
    return ThreadedReplyEngine(load_generator(name, cache_dir), worker.executor, gate)


def load_generator(name: str, cache_dir: Path | None = None) -> TextGenerator:
    """The blocking generator of engine ``name``; only the PyTorch engines import torch."""
    if name == "smollm2-ar":
        from model.ar import load_ar_generator

        return load_ar_generator()
    if name == "diffusion":
        from model.diffusion_engine import load_diffusion_generator, shipped_adapter

        return load_diffusion_generator(adapter=shipped_adapter())
    if name in ONNX_ENGINES:
        from export.engine import load_onnx_ar_generator, load_onnx_diffusion_generator
        from export.modeldir import ensure_model_dir
        from model.diffusion_engine import shipped_adapter

        variant = serving_variant(name)
        # the diffusion engine serves base + shipped adapter, built into its own directory
        adapter = shipped_adapter() if name == "diffusion-onnx" else None
        model_dir = ensure_model_dir(cache_dir, variant, adapter)
        log.info("reply model: the %s graph in %s", variant, model_dir)
        if name == "smollm2-ar-onnx":
            return load_onnx_ar_generator(model_dir, variant)
        return load_onnx_diffusion_generator(model_dir, variant)
    raise ValueError(f"unknown reply engine {name!r}; choose one of {', '.join(ENGINES)}")
