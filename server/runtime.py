"""The models of one server process and the worker threads that run them.

Everything here is loaded once in ``main()`` and shared by all sessions. Each kind of
blocking inference has its own single worker thread, so a burst of one kind (say, ten
sessions' VAD) never queues behind another (one long reply), and the event loop only
awaits futures.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, ParamSpec, TypeVar

import onnxruntime as ort
from threadpoolctl import threadpool_limits

from audio.asr import (
    BEAM_SIZE,
    AsrOptions,
    Transcriber,
    Transcript,
    Window,
    load_transcriber,
    recommended_model,
)
from audio.tts import Synthesizer
from audio.vad import SileroVad
from model.ar import ARGenerator
from model.assemble import DEFAULT_ENGINE, Batching, EngineName, load_generator, reply_on_cpu
from model.backend import in_background
from model.batch import BatchedBackend
from model.diffusion_engine import DiffusionGenerator
from model.engine import ChatMessage, ReplyEngine, TextGenerator, ThreadedReplyEngine
from model.openai_chat import ChatServerOptions
from model.runtime import Device
from model.tools import DEFAULT_TOOLS, Tool

from .speech import SpeechFirst
from .turn_end import EndOfTurnModel

log = logging.getLogger("quicksilver")

# model.diffusion_engine.DiffusionGenerator.warm: (history, tools, should_stop) -> tokens
Warm = Callable[[Sequence[ChatMessage], Sequence[Tool], Callable[[], bool]], int]

P = ParamSpec("P")
T = TypeVar("T")

# "auto": tiny.en on the CPU, base on a GPU (audio.asr.recommended_model, docs/audio.md)
DEFAULT_ASR = "auto"
# "auto": the other offline Whisper model hears a turn again before a call is made on
# its words (check_model; docs/actions.md, "Heard twice")
DEFAULT_ASR_CHECK = "auto"
# Turns one Whisper call may hear together (--asr-batch): finals that wait while the
# ASR worker is busy, and second hearings (Hearings), each as it is heard alone. 1 (each
# alone): at eight sessions the turns rarely waited together, and first audio came no
# sooner with 8 (docs/latency.md, "Turns heard together")
ASR_BATCH = 1


class WorkerKind(StrEnum):
    """The kinds of blocking inference, one worker thread each."""

    VAD = "vad"
    ASR = "asr"
    TTS = "tts"  # replies' first sentences
    # later sentences: in a thread of their own, so a first sentence never waits for one
    # (a later sentence takes 100-600 ms of Piper under load; docs/latency.md), the one
    # whose reply runs out of audio soonest first
    TTS_LATER = "tts_later"
    REPLY = "reply"
    TURN_END = "turn_end"
    WARM = "warm"


# Replies from a chat server (engine "openai-chat") spend their time waiting on its
# socket, and the server batches them: each reply in flight gets a thread, up to this
# many, instead of waiting for the reply before it as local models' replies do.
CHAT_REPLY_THREADS = 32


def reply_threads(engine: EngineName, shared: BatchedBackend | None = None) -> int:
    """Threads of the reply worker: a reply each, as many as share one pass of the
    batched model in this process (``shared``, ``model/batch.py``), one when its replies
    run one at a time (the model uses the CPU or the GPU alone),
    :data:`CHAT_REPLY_THREADS` for a chat server's replies."""
    if engine == "openai-chat":
        return CHAT_REPLY_THREADS
    return shared.loop.runner.rows if shared is not None else 1


def shared_passes(generator: TextGenerator) -> BatchedBackend | None:
    """The step loop ``generator``'s replies share, if it runs on one."""
    backend = getattr(generator, "backend", None)
    return backend if isinstance(backend, BatchedBackend) else None


class Worker:
    """Threads (one unless said) for one kind of blocking job, with its queue depth
    visible. Jobs wait in rank order, lower first, then in the order asked (``rank``:
    the ASR worker hears final transcripts before partial transcripts and second
    hearings, ``Hearings``; the later-sentence worker's rank is when each sentence's
    audio is due, ``server.turn``)."""

    def __init__(self, name: str, threads: int = 1) -> None:
        self.executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name)
        self.pending = 0
        self._jobs: list[tuple[float, int, Callable[[], Any], Future[Any]]] = []
        self._asked = itertools.count()
        self._lock = threading.Lock()

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        return await self.ranked(1, functools.partial(fn, *args, **kwargs))

    async def ranked(self, rank: float, call: Callable[[], T]) -> T:
        """``call()`` in a worker thread, after every waiting job of a lower rank."""
        done: Future[T] = Future()
        with self._lock:
            heapq.heappush(self._jobs, (rank, next(self._asked), call, done))
        self.pending += 1
        try:
            self.executor.submit(self._next)
            return await asyncio.wrap_future(done)
        finally:
            self.pending -= 1

    def _next(self) -> None:
        """One worker thread's turn: the best job waiting now, not necessarily the one
        whose submission started it (each submission starts one turn)."""
        with self._lock:
            _, _, call, done = heapq.heappop(self._jobs)
        if not done.set_running_or_notify_cancel():  # its asker stopped waiting
            return
        try:
            done.set_result(call())
        except BaseException as exc:  # the asker gets it, whatever it is
            done.set_exception(exc)

    def shutdown(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            for *_, done in self._jobs:
                done.cancel()
            self._jobs.clear()


class Hearings:
    """Transcripts asked for while the ASR worker is busy wait together and are heard
    in one Whisper call when it is free (``Transcriber.transcribe_batch``), at most
    ``most`` a call (``--asr-batch``; 1, the default: each alone): where many
    sessions' turns end together, one batched decode costs less than the same decodes
    one after another (eight 2.5 s commands: tiny.en 0.60 against 1.05 s, base 1.00
    against 1.74 s on the 2-core CPU). Each turn gets the words it gets alone: only
    turns whose windows have one length share a decode (audio.asr, ``grid_frames``).
    The first one runs at once, alone: batching never makes a turn wait for another.
    ``rank`` orders them among the worker's other jobs: final transcripts (0) before
    partial transcripts and second hearings (1)."""

    def __init__(self, worker: Worker, asr: Any, most: int, rank: int = 0) -> None:
        self.worker, self.asr, self.most, self.rank = worker, asr, max(1, most), rank
        self.sizes: list[int] = []  # how many turns each call heard (tests, stats)
        self._waiting: list[tuple[Any, asyncio.Future[Any]]] = []
        self._task: asyncio.Task[None] | None = None

    async def hear(self, audio: Any) -> Any:
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting.append((audio, done))
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._drain())
        return await done

    async def _drain(self) -> None:
        while self._waiting:
            waiting = [(a, d) for a, d in self._waiting if not d.done()]  # not cancelled
            taken, self._waiting = waiting[: self.most], waiting[self.most :]
            if not taken:
                continue
            audios = [a for a, _ in taken]
            self.sizes.append(len(audios))
            if len(audios) > 1:
                log.debug("hearing %d turns in one Whisper call", len(audios))
            try:
                heard = await self.worker.ranked(self.rank, functools.partial(self._call, audios))
            except Exception as exc:
                for _, d in taken:
                    if not d.done():
                        d.set_exception(exc)
                continue
            for (_, d), transcript in zip(taken, heard, strict=True):
                if not d.done():
                    d.set_result(transcript)

    def _call(self, audios: list[Any]) -> list[Any]:
        batch = getattr(self.asr, "transcribe_batch", None)
        if len(audios) == 1 or batch is None:
            return [self.asr.transcribe(a) for a in audios]
        return list(batch(audios))


@dataclass
class Runtime:
    vad: SileroVad
    asr: Transcriber
    tts: Synthesizer
    reply: ReplyEngine
    asr_name: str
    max_reply_tokens: int = 64  # the reply budget (--max-reply-tokens; a turn may ask less)
    workers: dict[WorkerKind, Worker] = field(default_factory=dict)
    # the reply model's pauses for a reply's first phrase (server/turn.py)
    speech_first: SpeechFirst = field(default_factory=lambda: SpeechFirst(enabled=False))
    # scores paused turns' transcripts (server/turn_end.py); None: silence and words only
    turn_end: EndOfTurnModel | None = None
    # the step loop every reply's passes go through (model/batch.py); None: one at a time
    shared: BatchedBackend | None = None
    # hears a turn again before a call on its words is made without asking (--asr-check,
    # server/turn.py); None: calls are made on the first hearing alone
    asr_check: Transcriber | None = None
    # turns heard in one Whisper call at most, finals and second hearings each
    # (--asr-batch; 1: one a call)
    asr_batch: int = ASR_BATCH
    # prefills a conversation's next prompt between turns (WarmNext, warm_next); None
    # where nothing would run it behind the replies (no step loop) or nothing keeps it
    warm: Warm | None = None
    # Whisper, Piper and (unless it is a GPU's or a chat server's) the reply model share
    # the CPU's cores: a partial transcript then takes them from the turns being produced
    cpu: bool = False
    _finals: Hearings | None = field(default=None, init=False, repr=False)
    _checks: Hearings | None = field(default=None, init=False, repr=False)
    _producing: int = field(default=0, init=False, repr=False)  # turns (producing())
    # partial transcripts run and passed over since start, for /stats
    partials: dict[str, int] = field(
        default_factory=lambda: {"run": 0, "skipped": 0}, init=False, repr=False
    )

    async def hear(self, audio: Any) -> Transcript:
        """A turn's final transcript, heard with the other turns' that wait (Hearings)."""
        if self._finals is None:
            self._finals = Hearings(self.worker(WorkerKind.ASR), self.asr, self.asr_batch)
        transcript: Transcript = await self._finals.hear(audio)
        return transcript

    async def hear_again(self, audio: Any) -> Transcript:
        """A turn heard by the second model (``asr_check``), with the other turns' second
        hearings that wait; after the waiting finals."""
        if self.asr_check is None:
            raise RuntimeError("no second model to hear a turn again (--asr-check none)")
        if self._checks is None:
            worker = self.worker(WorkerKind.ASR)
            self._checks = Hearings(worker, self.asr_check, self.asr_batch, rank=1)
        transcript: Transcript = await self._checks.hear(audio)
        return transcript

    @contextlib.contextmanager
    def producing(self) -> Iterator[None]:
        """Held (on the event loop) while a turn's words are heard, its reply written or
        its sentences synthesized; not while its audio is paced out."""
        self._producing += 1
        try:
            yield
        finally:
            self._producing -= 1

    def partial_now(self) -> bool:
        """Whether a partial transcript may be heard now, and counts the answer. A
        partial is shown, never acted on ("best effort, may be skipped under load",
        docs/protocol.md), so it yields: to any job waiting for the ASR worker, and on a
        CPU host to every turn being produced. On the 2-core CPUs partials were a sixth
        of a turn's CPU time (~0.7 of 4.1 CPU seconds: three to four decodes of the
        growing utterance), and one in the ASR thread made a final that came meanwhile
        wait for it (docs/latency.md, "Partial transcripts under load")."""
        busy = self.worker(WorkerKind.ASR).pending > 0 or (self.cpu and self._producing > 0)
        self.partials["skipped" if busy else "run"] += 1
        return not busy

    def lean_speech(self, first: bool) -> bool:
        """Whether a sentence asks for Piper's one-thread session (``Synthesizer``
        runs it where it has one: a CPU): every sentence except a reply's first one
        while no other turn is being produced (a turn counts itself: more than one
        means others). A later sentence is
        written while the earlier ones play and the reply model decodes; beside other
        turns' work the cores are taken, and Piper on two threads cost 60% more CPU
        there and came no sooner (docs/latency.md, "Piper on one thread under load").
        A lone turn's first sentence has both cores: the reply model pauses for it
        (speech first)."""
        return not first or self._producing > 1

    def finals(self, again: bool = False) -> dict[str, int]:
        """The Whisper calls that heard final transcripts (or, ``again``, second
        hearings) so far, for /stats."""
        hearings = self._checks if again else self._finals
        sizes = hearings.sizes if hearings is not None else []
        return {
            "calls": len(sizes),
            "turns": sum(sizes),
            "batched_calls": sum(n > 1 for n in sizes),
            "largest": max(sizes, default=0),
        }

    def passes(self) -> dict[str, object] | None:
        """The reply model's shared passes so far, for /stats."""
        if self.shared is None:
            return None
        loop, pool = self.shared.loop, self.shared.pool
        return {
            "rows": loop.runner.rows,
            "passes": loop.passes,
            "rows_per_pass": round(loop.rows_run / max(loop.passes, 1), 2),
            **({"kv_positions": pool.held, "kv_budget": pool.budget} if pool else {}),
        }

    def worker(self, kind: WorkerKind) -> Worker:
        return self.workers[kind]

    async def warm_next(
        self, history: Sequence[ChatMessage], tools: Sequence[Tool], stop: threading.Event
    ) -> int:
        """Prefill the prompt a conversation's next turn starts with, in the warm worker's
        thread, its passes behind every reply's (model.backend.in_background); stops
        between passes once ``stop`` is set. The tokens prefilled (0 without a warm)."""
        if self.warm is None:
            return 0
        warm = self.warm

        def run() -> int:
            in_background()
            return warm(history, tools, stop.is_set)

        return await self.worker(WorkerKind.WARM).run(run)

    def close(self) -> None:
        for w in self.workers.values():
            w.shutdown()


@dataclass(frozen=True)
class RuntimeOptions:
    asr: str = DEFAULT_ASR
    asr_window: Window = "auto"  # audio.asr.AsrOptions.window
    asr_beam: int = BEAM_SIZE  # audio.asr.AsrOptions.beam_size
    asr_check: str = DEFAULT_ASR_CHECK  # check_model: the second hearing before acting
    asr_batch: int = ASR_BATCH  # Runtime.asr_batch
    engine: EngineName = DEFAULT_ENGINE
    cache_dir: Path | None = None
    max_reply_tokens: int = 64  # the reply budget, in tokens
    speech_first: bool | None = None  # None: when the reply model is on the CPU
    device: Device = "auto"  # auto: the GPU when ONNX Runtime and CTranslate2 see one
    turn_model: bool = True  # score paused turns with the reply model (docs/turn_end.md)
    chat: ChatServerOptions | None = None  # the server the "openai-chat" engine asks
    adapter: Path | None = None  # the diffusion engines' adapter; None: the shipped one
    batching: Batching = field(default_factory=Batching)  # replies sharing passes


def resolve_device(device: Device) -> Literal["cpu", "cuda"]:
    """ "auto" -> "cuda" when both ONNX Runtime (onnxruntime-gpu) and CTranslate2 can use
    a GPU here, else "cpu"; "tensorrt" serves the reply model through TensorRT and the
    rest on CUDA."""
    if device == "cpu":
        return "cpu"
    if device in ("cuda", "tensorrt"):
        return "cuda"
    import ctranslate2

    gpu = "CUDAExecutionProvider" in ort.get_available_providers()
    return "cuda" if gpu and ctranslate2.get_cuda_device_count() > 0 else "cpu"


def _timed(what: str, fn: Callable[[], T]) -> T:
    log.info("loading %s ...", what)
    t0 = time.perf_counter()
    value = fn()
    log.info("loaded %s in %.1f s", what, time.perf_counter() - t0)
    return value


def one_blas_thread() -> None:
    """numpy's BLAS on one thread for the rest of the process. Its products here are
    small (the router's and the span pointers' read of a prefill: 0.4 and 1.8 ms), and
    OpenBLAS's second thread spun after each for ~50 ms of a core (the time to its
    next call, up to its timeout) that the reply model and Piper were waiting for:
    3 ms of CPU a call on one thread against 52 (docs/latency.md, "One BLAS thread")."""
    threadpool_limits(1, user_api="blas")


def load_runtime(options: RuntimeOptions) -> Runtime:
    """Load every model once; say what is happening, since first start takes a while."""
    one_blas_thread()
    workers = {kind: Worker(kind.value) for kind in WorkerKind}
    vad = _timed("Silero VAD", SileroVad)
    device = resolve_device(options.device)
    asr_name = recommended_model(device) if options.asr == "auto" else options.asr
    compute = "int8" if device == "cpu" else "float16"
    asr_options = AsrOptions(
        device=device, compute_type=compute, window=options.asr_window, beam_size=options.asr_beam
    )
    asr = _timed(
        f"Whisper {asr_name} on {device}",
        lambda: load_transcriber(asr_name, options.cache_dir, asr_options),
    )
    log.info(
        "Whisper's window: %s (--asr-window %s), beam of %d",
        asr.window,
        options.asr_window,
        options.asr_beam,
    )
    check_name = check_model(options.asr_check, asr_name)
    if check_name == asr_name:
        log.warning(
            "--asr-check %s is the model that hears every turn: it hears what the first "
            "hearing did, so it doubts nothing (use the other model, or none)",
            check_name,
        )
    asr_check = None
    if check_name is not None:
        # sized on the CPU: base in the 30 s window costs ~1.2 s a turn there, sized ~50 ms
        # more than tiny.en (docs/audio.md); greedy, as the first hearing's default
        window: Window = "sized" if device == "cpu" else "auto"
        check_options = replace(asr_options, window=window, beam_size=BEAM_SIZE)
        asr_check = _timed(
            f"Whisper {check_name} on {device}, to hear a turn again before acting on it",
            lambda: load_transcriber(check_name, options.cache_dir, check_options),
        )
    # and, where it runs on the CPU, its one-thread twin for sentences no lone
    # listener waits on
    tts = _timed("Piper voice en_US-joe-medium", lambda: Synthesizer(device=device, lean=True))
    speech_first = options.speech_first
    if speech_first is None:
        speech_first = reply_on_cpu(options.engine, options.device)
    speech = SpeechFirst(enabled=speech_first)
    log.info(
        "speech first (the reply model pauses for a reply's first sentence): %s",
        "on" if speech_first else "off",
    )
    what = f"reply engine {options.engine}"
    if options.chat is not None and options.engine == "openai-chat":
        what += f" ({options.chat.model} at {options.chat.url})"
    generator = _timed(
        what,
        lambda: load_generator(
            options.engine,
            options.cache_dir,
            options.device,
            options.chat,
            options.adapter,
            options.batching,
        ),
    )
    prime = getattr(generator, "prime_heads", None)
    if prime is not None:  # a session's first turn then prefills only its own words
        _timed(
            "the system prompt's cache, with and without the default tools",
            lambda: prime([DEFAULT_TOOLS, ()]),
        )
    shared = shared_passes(generator)
    threads = reply_threads(options.engine, shared)
    workers[WorkerKind.REPLY] = Worker(WorkerKind.REPLY.value, threads)
    if threads > 1 and options.engine != "openai-chat":
        log.info("replies share the reply model's passes: up to %d a pass", threads)
    reply = ThreadedReplyEngine(generator, workers[WorkerKind.REPLY].executor)
    # between turns, a conversation's next prompt is prefilled behind the replies (the
    # step loop runs such passes alone, when no reply's step waits): not without one
    warm = getattr(generator, "warm", None) if shared is not None else None
    if warm is not None:
        workers[WorkerKind.WARM] = Worker(WorkerKind.WARM.value)
    turn_end = turn_end_model(generator) if options.turn_model else None
    log.info(
        "end of turn: %s", "scored by the reply model" if turn_end else "silence and words only"
    )
    return Runtime(
        vad,
        asr,
        tts,
        reply,
        asr_name,
        options.max_reply_tokens,
        workers,
        speech,
        turn_end,
        shared,
        asr_check,
        options.asr_batch,
        warm,
        cpu=device == "cpu",
    )


def check_model(check: str, asr: str) -> str | None:
    """The Whisper model that hears a turn again before a call on its words is made
    (``--asr-check``): "none" for no second hearing; "auto" for the other offline model
    of the one serving (tiny.en and base: different models mishear differently, so a
    word they both hear was likely said), none beside a model directory of the user's."""
    if check == "none":
        return None
    if check == "auto":
        return {"tiny.en": "base", "base": "tiny.en"}.get(asr)
    return check


def turn_end_model(generator: TextGenerator) -> EndOfTurnModel | None:
    """The end-of-turn scorer on the reply model's own backend (one more pass per paused
    turn, no second copy of the weights); None for a generator without one."""
    if isinstance(generator, ARGenerator | DiffusionGenerator):
        return EndOfTurnModel(generator.backend, generator.tokenizer)
    return None
