"""A real server in the test's own event loop, with scriptable ASR and reply model.

The WebSocket server, session, turn pipeline, VAD and Piper are the real ones; the
ASR and the reply model's generator are scripted so that a test can fix what they say
and when (an empty transcript, a reply that blocks). Their real twins run in the
end-to-end tests (tests/e2e, tests/clients), which start the server as a user does.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import threading
from collections.abc import AsyncIterator, Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from websockets.asyncio.client import ClientConnection, connect

from audio.asr import Transcript
from audio.tts import Synthesizer
from audio.vad import SileroVad
from model.engine import ChatMessage, GenerationStats, TextGenerator, ThreadedReplyEngine
from server import protocol as p
from server.app import App, ServerConfig, start_server
from server.runtime import Runtime, Worker, WorkerKind
from server.speech import SpeechFirst


@dataclass
class ScriptedAsr:
    """Answers every transcription with ``text``."""

    text: str = "What is the capital of France?"
    calls: int = 0

    def transcribe(self, audio: np.ndarray) -> Transcript:
        self.calls += 1
        return Transcript(self.text, "en", len(audio) / 16_000, 0.0, 0.0)


@dataclass
class ScriptedReplies:
    """A TextGenerator that says ``reply`` word by word; ``hold`` (when set) blocks
    each reply after its first word until the test sets ``go``."""

    reply: str = "Paris is the capital of France."
    name: str = "scripted"
    supports_tools: bool = False
    hold: bool = False
    go: threading.Event = field(default_factory=threading.Event)
    started: threading.Event = field(default_factory=threading.Event)
    seen: list[tuple[ChatMessage, ...]] = field(default_factory=list)

    def generate(
        self,
        conversation: Sequence[ChatMessage],
        max_tokens: int,
        should_stop: Callable[[], bool],
        tools: Sequence[Any] = (),
    ) -> Generator[str, None, GenerationStats]:
        self.seen.append(tuple(conversation))
        self.started.set()
        words = self.reply.split(" ")
        for i, word in enumerate(words):
            if should_stop():
                return GenerationStats(i, i, "cancel")
            yield word if i == 0 else " " + word
            if i == 0 and self.hold:
                while not self.go.wait(0.01):
                    if should_stop():
                        return GenerationStats(1, 1, "cancel")
        return GenerationStats(len(words), len(words), "end")


_SHARED: dict[str, Any] = {}


def shared_models() -> tuple[SileroVad, Synthesizer]:
    """The real VAD and Piper voice, loaded once per test process."""
    if not _SHARED:
        _SHARED["vad"], _SHARED["tts"] = SileroVad(), Synthesizer(lean=True)  # as serve on a CPU
    return _SHARED["vad"], _SHARED["tts"]


def runtime(asr: ScriptedAsr, replies: TextGenerator, reply_threads: int = 1) -> Runtime:
    vad, tts = shared_models()
    workers = {kind: Worker(kind.value) for kind in WorkerKind}
    workers[WorkerKind.REPLY] = Worker(WorkerKind.REPLY.value, reply_threads)
    reply = ThreadedReplyEngine(replies, workers[WorkerKind.REPLY].executor)
    speech = SpeechFirst(enabled=False)
    return Runtime(vad, asr, tts, reply, "scripted-asr", 64, workers, speech)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def serving(
    asr: ScriptedAsr | None = None,
    replies: TextGenerator | None = None,
    config: ServerConfig | None = None,
    reply_threads: int = 1,
) -> AsyncIterator[tuple[str, App]]:
    """``(url, app)`` of a server on a free loopback port, closed on exit; ``replies``
    is any generator (the openai-chat engine's tests give theirs, and the reply worker's
    threads of that engine, ``server.runtime.reply_threads``)."""
    rt = runtime(asr or ScriptedAsr(), replies or ScriptedReplies(), reply_threads)
    server, app = await start_server(rt, "127.0.0.1", 0, config)
    host, port = server.sockets[0].getsockname()[:2]
    try:
        yield f"ws://{host}:{port}{p.PATH}", app
    finally:
        server.close()
        async with within(60, "the server's close (its sessions' handlers ending)"):
            await server.wait_closed()
            await app.stop_store()
        rt.close()


@contextlib.asynccontextmanager
async def within(seconds: float, what: str) -> AsyncIterator[None]:
    """A wait that should end well inside ``seconds``: past it, the test fails naming
    ``what`` with every task's stack (where it is stuck), not at pytest's whole-test
    timeout with only the threads' stacks."""
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError:
        stacks = io.StringIO()
        for task in asyncio.all_tasks():
            task.print_stack(file=stacks)
        raise AssertionError(f"{what}: not over in {seconds:g} s\n{stacks.getvalue()}") from None


async def started(url: str, **start: Any) -> tuple[ClientConnection, dict[str, Any]]:
    """A connected client past ``start``: the connection and the ready message."""
    ws = await connect(url)
    await ws.send(json.dumps({"type": "start", "sample_rate": 16_000, **start}))
    async with within(30, "the answer to start"):
        ready = json.loads(await ws.recv())
    assert ready["type"] == "ready", ready
    return ws, ready


async def until(
    ws: ClientConnection, kind: str, audio: list[bytes] | None = None
) -> dict[str, Any]:
    """Read up to the next message of ``kind``; binary frames go to ``audio``."""
    while True:
        frame = await ws.recv()
        if isinstance(frame, bytes):
            if audio is not None:
                audio.append(frame)
            continue
        message: dict[str, Any] = json.loads(frame)
        if message["type"] == kind:
            return message


def pcm16(audio: np.ndarray) -> bytes:
    return (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()


MIC_FRAME = 512  # samples, 32 ms at 16 kHz


async def stream(ws: ClientConnection, audio: np.ndarray) -> None:
    """Like a microphone: one 32 ms frame every 32 ms."""
    for i in range(0, len(audio), MIC_FRAME):
        await ws.send(pcm16(audio[i : i + MIC_FRAME]))
        await asyncio.sleep(MIC_FRAME / 16_000)
