"""llama.cpp on the same GGUF as an engine of ``quicksilver bench llm``.

llama.cpp is what a user would reach for to run SmolLM2 on a CPU, so the bench times it
beside the project's engines, on the same prompt token ids, interleaved with them. It
runs greedy in a child process (``llamacpp_worker.py``) under a Python that has
llama-cpp-python, which is built apart from the project (it compiles llama.cpp, ~9
minutes on 2 cores; docs/export.md): ``$QUICKSILVER_LLAMA_CPP_PYTHON``, or this Python
when ``llama_cpp`` imports here. The child streams each token as llama.cpp makes it, so
the bench's clock sees the same first-sentence and reply times as for its own engines;
a JSON line through a pipe costs tens of microseconds against ~11 ms per token.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Collection, Generator
from pathlib import Path
from typing import IO, Any

from model.backend import StepBackend
from model.engine import GenerationStats

LLAMA_PYTHON_ENV = "QUICKSILVER_LLAMA_CPP_PYTHON"
WORKER = Path(__file__).with_name("llamacpp_worker.py")


def llama_cpp_python() -> str | None:
    """A Python with llama-cpp-python: ``$QUICKSILVER_LLAMA_CPP_PYTHON``, or this one
    when ``llama_cpp`` is importable here; None where neither is."""
    if override := os.environ.get(LLAMA_PYTHON_ENV):
        return override
    return sys.executable if importlib.util.find_spec("llama_cpp") else None


class LlamaCppError(RuntimeError):
    """The llama.cpp worker did not start or stopped answering."""


class LlamaCppWorker:
    """One llama.cpp model (``gguf``, ``threads`` threads) in a child process."""

    def __init__(self, python: str, gguf: Path, threads: int = 2) -> None:
        self.gguf = gguf
        # the worker's errors, read back if it dies; closed in close()
        self._stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(
                [python, str(WORKER), str(gguf), str(threads)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                text=True,
                bufsize=1,
            )
        except OSError as exc:
            self._stderr.close()
            raise LlamaCppError(f"cannot run {python} for llama.cpp: {exc}") from exc
        try:
            hello = self._read()
            if "error" in hello or not hello.get("ready"):
                raise LlamaCppError(f"llama.cpp worker under {python}: {hello.get('error', hello)}")
        except BaseException:
            self.close()
            raise
        self.version = str(hello.get("version", "?"))

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            self._stderr.seek(0)
            tail = self._stderr.read().decode(errors="replace").strip()[-2000:]
            raise LlamaCppError(
                f"llama.cpp worker exited (status {self.proc.returncode}): {tail or 'no output'}"
            )
        reply: dict[str, Any] = json.loads(line)
        return reply

    def generate(
        self, prompt: list[int], n: int, stop_ids: Collection[int], keep: int = 0
    ) -> Generator[int, None, GenerationStats]:
        """Greedy reply tokens (stop tokens excluded), as the project's ``greedy`` yields
        them; returns what the reply cost (the prefill counted as one pass). ``keep``:
        at most this many of the cache's first tokens are reused where the prompt starts
        with them (the system prompt, as llama.cpp's server keeps its prompt cache);
        0: the whole prompt is prefilled."""
        assert self.proc.stdin is not None
        request = {
            "ids": list(map(int, prompt)),
            "n": n,
            "stop": sorted(map(int, stop_ids)),
            "keep": keep,
        }
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        tokens = 0
        while "done" not in (msg := self._read()):
            tokens += 1
            yield int(msg["t"])
        return GenerationStats(tokens, int(msg["passes"]), msg["stopped_by"])

    def decoder(self, stop_ids: Collection[int], keep: int = 0) -> Any:
        """A bench decoder (``bench.llm.Decoder``): it ignores the backend it is
        given, as llama.cpp runs its own copy of the weights. ``keep``: as
        :meth:`generate`'s."""

        def run(b: StepBackend, prompt: list[int], n: int) -> Generator[int, None, GenerationStats]:
            return self.generate(prompt, n, stop_ids, keep)

        return run

    def close(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()  # the worker's loop ends at end of input
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stderr.close()

    def __enter__(self) -> LlamaCppWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
