"""One engine loop that owns the model and runs every reply's steps in shared passes.

A reply engine decodes in its own thread against a :class:`model.backend.StepBackend`.
With :class:`BatchedBackend` a ``step`` is a request to the :class:`StepLoop`: the loop
thread takes every request waiting when the model is free, up to the batched graph's
rows, and runs them in one pass of ``export.graph.BatchGraph`` (one request alone runs
in the one-reply graph, as before). The projections and MLP read their weights once per
pass instead of once per reply, which is where several replies at once gain: one AR
step is memory-bound, so eight of them cost little more than one.

A row's logits are the ones it would get alone (each row attends over its own cache
buffers; the int8 kernel scales activations per token), so which replies share a pass
never changes a reply (``tests/export/test_batch.py``). Requests are taken in priority
order, lower first (:attr:`Request.priority`: a reply whose first sentence is not out
yet goes first, then the oldest). A cancelled reply makes no more requests: its rows
leave at the next pass.

Caches stay the one-reply :class:`model.runtime.OrtCache`; :class:`CachePool` counts
the positions every live cache has reserved against one budget and refuses a cache that
would pass it (:class:`PoolFullError`), so many replies at once cannot take the host's
memory.
"""

from __future__ import annotations

import gc
import itertools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from numpy.typing import NDArray

from model.backend import Attend, Logits, Rows, is_urgent
from model.runtime import GROW, OrtBackend, OrtCache, RuntimeConfig

_order = itertools.count()
# Prompt tokens per prefill request: a block's width, so a chunk costs about what a
# diffusion block does and shares a pass with other replies' steps at that price.
PREFILL_CHUNK = 32


class PoolFullError(RuntimeError):
    """Every position of the KV cache budget is held by live replies."""


class CachePool:
    """The positions every live reply cache has reserved, against ``budget``. When a
    cache would pass it, ``evict`` (the engine's kept conversations, oldest first,
    ``model/prefix.py``) frees what it can; only what live replies hold is refused."""

    def __init__(self, budget: int, evict: Callable[[], bool] | None = None) -> None:
        self.budget = budget
        self.held = 0
        self.evict = evict  # frees one kept cache; False when none is left
        self._lock = threading.Lock()

    def grow(self, by: int) -> None:
        while True:
            with self._lock:
                if self.held + by <= self.budget:
                    self.held += by
                    return
            if self.evict is None or not self.evict():
                raise PoolFullError(
                    f"the KV cache pool is full ({self.held} of {self.budget} positions "
                    f"held by live replies; {by} more asked)"
                )
            gc.collect()  # an evicted cache returns its positions when collected

    def release(self, n: int) -> None:
        with self._lock:
            self.held -= n


@dataclass(order=True)
class Request:
    """One reply's step, waiting for a pass: urgent ones first (a reply whose first
    sentence is not out, :func:`model.backend.set_urgent`), then in the order asked."""

    later: bool  # not urgent
    order: int
    cache: OrtCache = field(compare=False)
    ids: NDArray[np.int64] = field(compare=False)
    attend: Attend = field(compare=False)
    commit: bool = field(compare=False)
    rows: NDArray[np.int64] = field(compare=False)
    done: Future[Logits] = field(compare=False, default_factory=Future)


class BatchRunner:
    """The batched graph of a model directory beside its one-reply graph: runs a list
    of requests (1 to ``rows``) in one pass and hands each its logits."""

    def __init__(self, single: OrtBackend, path: Path, config: RuntimeConfig) -> None:
        self.single = single
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if config.threads:
            options.intra_op_num_threads = config.threads
        options.add_session_config_entry("session.force_spinning_stop", "1")
        self.session = ort.InferenceSession(str(path), options, providers=single.providers)
        names = [i.name for i in self.session.get_inputs()]
        n_layer = single.dims[0]
        self.rows = sum(n.startswith("past_key_0_") for n in names)
        if self.rows < 2 or f"past_key_{n_layer - 1}_0" not in names:
            raise ValueError(f"{path} is not a batched step graph of this model")
        self._idle = OrtCache(single)  # a row with no request writes here
        self._idle.reserve(1)

    def run(self, requests: Sequence[Request]) -> list[Logits]:
        if len(requests) == 1:
            r = requests[0]
            return [self.single.step(r.cache, r.ids, r.attend, r.commit, r.rows)]
        if len(requests) > self.rows:
            raise ValueError(f"{len(requests)} requests for a graph of {self.rows} rows")
        io = self.session.io_binding()
        io.bind_output("logits")
        ids, positions, lengths, pasts, blocks, rows = [], [], [], [], [], []
        offset = 0
        for b in range(self.rows):
            if b < len(requests):
                r = requests[b]
                P, T = r.cache.length, len(r.ids)
                if self.single.max_len < P + T:
                    raise ValueError(f"KV cache full: {P} + {T} > {self.single.max_len}")
                r.cache.reserve(P + T)
                cache, chunk, block = r.cache, r.ids, r.attend == "block"
                rows.append(r.rows + offset)
            else:  # an idle row: one token on the idle buffer, no logits
                cache, P, T = self._idle, 0, 1
                chunk, block = np.zeros(1, np.int64), False
            self._bind(io, b, cache)
            ids.append(chunk)
            positions.append(np.arange(P, P + T, dtype=np.int64))
            lengths.append(T)
            pasts.append(P)
            blocks.append(block)
            offset += T
        io.bind_cpu_input("input_ids", np.ascontiguousarray(np.concatenate(ids), np.int64))
        io.bind_cpu_input("positions", np.concatenate(positions))
        io.bind_cpu_input("lengths", np.array(lengths, np.int64))
        io.bind_cpu_input("past_lengths", np.array(pasts, np.int64))
        io.bind_cpu_input("blocks", np.array(blocks))
        io.bind_cpu_input("logit_rows", np.concatenate(rows).astype(np.int64))
        self.session.run_with_iobinding(io)
        logits: Logits = io.get_outputs()[0].numpy()
        out, at = [], 0
        for r in requests:
            out.append(logits[at : at + len(r.rows)])
            at += len(r.rows)
            if r.commit:
                r.cache.length += len(r.ids)
        return out

    def _bind(self, io: Any, row: int, cache: OrtCache) -> None:
        be = self.single
        L, n_kv, hd = be.dims
        shape = [1, n_kv, cache.capacity, hd]
        layer_bytes = int(np.prod(shape)) * be.dtype.itemsize
        base = cache.buffers.data_ptr()
        for layer in range(L):
            for j, kv in enumerate(("key", "value")):
                args = (be.device, 0, be.dtype.type, shape, base + (2 * layer + j) * layer_bytes)
                io.bind_input(f"past_{kv}_{layer}_{row}", *args)
                io.bind_output(f"present_{kv}_{layer}_{row}", *args)


class StepLoop:
    """The thread that owns the model: it waits for requests, takes as many as one
    pass holds (lowest priority first) and runs them together."""

    def __init__(
        self, runner: BatchRunner, on_pass: Callable[[Sequence[Request]], None] | None = None
    ) -> None:
        self.runner = runner
        self.on_pass = on_pass  # sees every pass's requests (metrics, tests)
        self._waiting: list[Request] = []
        self._cond = threading.Condition()
        self._closed = False
        self.passes = 0
        self.rows_run = 0
        self._thread = threading.Thread(target=self._run, name="step-loop", daemon=True)
        self._thread.start()

    def submit(self, request: Request) -> Future[Logits]:
        with self._cond:
            if self._closed:
                raise RuntimeError("the step loop is closed")
            self._waiting.append(request)
            self._cond.notify()
        return request.done

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()

    def _take(self) -> list[Request] | None:
        with self._cond:
            while not self._waiting and not self._closed:
                self._cond.wait()
            if not self._waiting:
                return None
            self._waiting.sort()
            taken = self._waiting[: self.runner.rows]
            del self._waiting[: self.runner.rows]
            return taken

    def _run(self) -> None:
        while (taken := self._take()) is not None:
            try:
                results = self.runner.run(taken)
            except Exception as exc:  # each reply in the pass gets it; the loop goes on
                for r in taken:
                    r.done.set_exception(exc)
                continue
            self.passes += 1
            self.rows_run += len(taken)
            if self.on_pass is not None:
                self.on_pass(taken)
            for r, logits in zip(taken, results, strict=True):
                r.done.set_result(logits)


class BatchedBackend:
    """A :class:`model.backend.StepBackend` whose steps run in a :class:`StepLoop`
    (shared passes); the calling thread waits for its own logits. Its caches count
    against a :class:`CachePool`."""

    def __init__(self, loop: StepLoop, pool: CachePool | None = None) -> None:
        self.loop = loop
        single = loop.runner.single
        self.name = single.name
        self.vocab_size = single.vocab_size
        self.max_len = single.max_len
        self.pool = pool

    def new_cache(self) -> OrtCache:
        return PooledCache(self.loop.runner.single, self.pool)

    def cache_length(self, cache: OrtCache) -> int:
        return cache.length

    def truncate(self, cache: OrtCache, length: int) -> None:
        self.loop.runner.single.truncate(cache, length)

    def step(
        self,
        cache: OrtCache,
        ids: NDArray[np.int64],
        attend: Attend,
        commit: bool,
        rows: Rows = None,
    ) -> Logits:
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        picked = np.arange(len(ids)) if rows is None else np.asarray(rows, np.int64)
        if attend == "causal" and commit and len(ids) > PREFILL_CHUNK:
            return self._prefill(cache, ids, picked)
        return self._run(cache, ids, attend, commit, picked)

    def _run(
        self, cache: OrtCache, ids: NDArray[np.int64], attend: Attend, commit: bool, rows: Any
    ) -> Logits:
        # room first, in the reply's own thread: a refusal is this reply's alone
        if self.max_len < cache.length + len(ids):
            raise ValueError(f"KV cache full: {cache.length} + {len(ids)} > {self.max_len}")
        cache.reserve(cache.length + len(ids))
        request = Request(not is_urgent(), next(_order), cache, ids, attend, commit, rows)
        return self.loop.submit(request).result()

    def _prefill(self, cache: OrtCache, ids: NDArray[np.int64], rows: NDArray[np.int64]) -> Logits:
        """A long causal prompt in chunks of :data:`PREFILL_CHUNK`, each its own request,
        so other replies' steps run between them: a long prompt never holds back
        another reply's first sentence for its whole prefill. Causal attention makes the
        chunks compute what one step would."""
        parts = []
        for lo in range(0, len(ids), PREFILL_CHUNK):
            hi = min(lo + PREFILL_CHUNK, len(ids))
            want = rows[(rows >= lo) & (rows < hi)] - lo
            parts.append(self._run(cache, ids[lo:hi], "causal", True, want))
        return np.concatenate(parts)


class PooledCache(OrtCache):
    """An :class:`OrtCache` whose growth is counted in a :class:`CachePool` (returned
    when the cache is collected: a reply's cache lives as long as its conversation is
    kept, ``model/prefix.py``)."""

    def __init__(self, backend: OrtBackend, pool: CachePool | None) -> None:
        self._pool = pool
        self._counted = 0
        super().__init__(backend)

    def reserve(self, n: int) -> None:
        if n <= self.capacity:
            return
        grown = min(self._backend.max_len, -(-n // GROW) * GROW)
        if self._pool is not None:
            self._pool.grow(grown - self._counted)
            self._counted = grown
        super().reserve(n)

    def __del__(self) -> None:
        if self._pool is not None and self._counted:
            self._pool.release(self._counted)
