"""One engine loop that owns the model and runs every reply's steps in shared passes.

A reply engine decodes in its own thread against a :class:`model.backend.StepBackend`.
With :class:`BatchedBackend` a ``step`` is a request to the :class:`StepLoop`: the loop
thread takes the requests waiting when the model is free, as many as the host's pass
shape lets share (:class:`PassShape`, measured once per host), and runs them in one pass
of ``export.graph.BatchGraph`` (one request alone runs in the one-reply graph, as
before). The projections and MLP read their weights once per pass instead of once per
reply, which is where several replies at once gain: one AR step is memory-bound, so
eight of them cost little more than one; a 16-token block on a CPU is not.

A row's logits are the ones it would get alone (each row attends over its own cache
buffers; the int8 kernel scales activations per token), so which replies share a pass
never changes a reply (``tests/export/test_batch.py``). Requests are taken in rank
order (:attr:`Request.rank`: the steps of replies whose first sentence is not out yet
first, the oldest reply first). A cancelled reply makes no more requests: its rows
leave at the next pass.

Caches stay the one-reply :class:`model.runtime.OrtCache`; :class:`CachePool` counts
the positions every live cache has reserved against one budget and refuses a cache that
would pass it (:class:`PoolFullError`), so many replies at once cannot take the host's
memory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import itertools
import json
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from numpy.typing import NDArray

from model.backend import BACKGROUND, Attend, Logits, Rows, reply_rank
from model.cpu import read_cpu
from model.runtime import OrtBackend, OrtCache, session_options

_order = itertools.count()
# Prompt tokens per prefill request, so a long prompt is several passes that other
# replies' steps go between (or share, where the shape lets them). Each pass reads every
# weight again: on the 2-core CPU a 400-token prompt took 763 ms in chunks of 128, 739
# in one pass, 967 in chunks of 32 (docs/results/2026-12-narrow-schedule.md)
PREFILL_CHUNK = 128


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
    """One reply's step, waiting for a pass: the steps of replies that have not said
    their first sentence first, the oldest reply first (:func:`model.backend.reply_rank`),
    then in the order asked."""

    rank: tuple[bool, int]
    order: int
    cache: OrtCache = field(compare=False)
    ids: NDArray[np.int64] = field(compare=False)
    attend: Attend = field(compare=False)
    commit: bool = field(compare=False)
    rows: NDArray[np.int64] = field(compare=False)
    done: Future[Logits] = field(compare=False, default_factory=Future)
    thread: int = field(compare=False, default_factory=threading.get_ident)


class BatchRunner:
    """The batched graph of a model directory beside its one-reply graph: runs a list
    of requests (1 to ``rows``) in one pass and hands each its logits."""

    def __init__(self, single: OrtBackend, path: Path, threads: int = 0) -> None:
        self.single = single
        options = session_options(threads)  # as the one-reply graph's (OrtBackend)
        self.session = ort.InferenceSession(str(path), options, providers=single.providers)
        names = [i.name for i in self.session.get_inputs()]
        n_layer = single.dims[0]
        self.rows = sum(n.startswith("past_key_0_") for n in names)
        if self.rows < 2 or f"past_key_{n_layer - 1}_0" not in names:
            raise ValueError(f"{path} is not a batched step graph of this model")
        self._idle = OrtCache(single)  # a row with no request writes here
        self._idle.reserve(1)
        self._io = self.session.io_binding()
        self._io.bind_output("logits")  # first: its index in get_outputs() stays 0
        # per row: the cache bound (weakly: a kept cache may be dropped any time), and
        # the buffer and capacity it was bound at
        self._bound: list[tuple[weakref.ref[OrtCache], int, int]] = []
        for b in range(self.rows):
            self._bound.append((lambda: None, 0, 0))  # type: ignore[arg-type]
            self._bind_row(b, self._idle)
        self._used = [0] * self.rows
        self._tick = 0

    def run(self, requests: Sequence[Request]) -> list[Logits]:
        if len(requests) == 1:
            return [self._one(requests[0])]
        if len(requests) > self.rows:
            raise ValueError(f"{len(requests)} requests for a graph of {self.rows} rows")
        at_row = self._place(requests)
        ids, positions, lengths, pasts, blocks, rows = [], [], [], [], [], []
        held = []  # every bound buffer stays alive until the pass is over
        offset = 0
        for b in range(self.rows):
            if (req := at_row.get(b)) is not None:
                P, T = req.cache.length, len(req.ids)
                req.cache.room_for(T)
                self._bind_row(b, req.cache)
                chunk, block = req.ids, req.attend == "block"
                rows.append(req.rows + offset)
                held.append(req.cache.buffers)
            else:  # no request: no tokens; the graph writes a stand-in's key and value
                # past what the row's cache holds, and drops its output
                cache = self._idle_cache(b)
                P, T, chunk, block = cache.length, 0, np.zeros(0, np.int64), False
                held.append(cache.buffers)
            ids.append(chunk)
            positions.append(np.arange(P, P + T, dtype=np.int64))
            lengths.append(T)
            pasts.append(P)
            blocks.append(block)
            offset += T
        io = self._io
        io.bind_cpu_input("input_ids", np.ascontiguousarray(np.concatenate(ids), np.int64))
        io.bind_cpu_input("positions", np.concatenate(positions))
        io.bind_cpu_input("lengths", np.array(lengths, np.int64))
        io.bind_cpu_input("past_lengths", np.array(pasts, np.int64))
        io.bind_cpu_input("blocks", np.array(blocks))
        picked = np.concatenate(rows).astype(np.int64)
        io.bind_cpu_input("logit_rows", picked)
        logits = self.single.run_bound(self.session, io, len(picked))
        del held
        out, at = {}, 0
        for b in sorted(at_row):  # logits come in row order
            done = at_row[b]
            out[id(done)] = logits[at : at + len(done.rows)]
            at += len(done.rows)
            if done.commit:
                done.cache.length += len(done.ids)
        return [out[id(q)] for q in requests]

    def _one(self, r: Request) -> Logits:
        return self.single.step(r.cache, r.ids, r.attend, r.commit, r.rows)

    # Each row's 2 x layers buffers stay bound from pass to pass (binding them all costs
    # ~1 ms a row): a reply keeps its row while its cache lives. A row with no request
    # has its stand-in token attend over the cache it holds, past that cache's end: over
    # a kept conversation's hundreds of positions, every pass. So a row that has had no
    # request for IDLE_PASSES passes is bound to the empty idle cache instead.

    def _place(self, requests: Sequence[Request]) -> dict[int, Request]:
        """Each request's row: the one its cache is bound to, else a free one (a row
        whose cache is gone first, then the longest unused)."""
        at_row: dict[int, Request] = {}
        homeless = []
        for r in requests:
            b = self._row_of(r.cache)
            if b is None or b in at_row:
                homeless.append(r)
            else:
                at_row[b] = r
        self._tick += 1
        for r in homeless:
            free = [b for b in range(self.rows) if b not in at_row]
            b = min(
                free, key=lambda b: (self._bound[b][0]() not in (None, self._idle), self._used[b])
            )
            at_row[b] = r
        for b in at_row:
            self._used[b] = self._tick
        return at_row

    def _row_of(self, cache: OrtCache) -> int | None:
        for b, (ref, _, _) in enumerate(self._bound):
            if ref() is cache:
                return b
        return None

    def _idle_cache(self, row: int) -> OrtCache:
        """The cache a row with no request runs its stand-in token on: the one bound,
        when it is alive, bound where it still is, has room past its end and asked
        within :data:`IDLE_PASSES` passes; else the idle one."""
        ref, ptr, capacity = self._bound[row]
        cache = ref()
        if (
            cache is None
            or cache.buffers.data_ptr() != ptr
            or cache.capacity != capacity
            or cache.length >= capacity
            or (cache is not self._idle and self._tick - self._used[row] >= IDLE_PASSES)
        ):
            cache = self._idle
            self._idle.length = 0
            self._bind_row(row, cache)
        return cache

    def _bind_row(self, row: int, cache: OrtCache) -> None:
        ptr, capacity = cache.buffers.data_ptr(), cache.capacity
        ref, bound_ptr, bound_capacity = self._bound[row]
        if ref() is cache and bound_ptr == ptr and bound_capacity == capacity:
            return
        be = self.single
        L, n_kv, hd = be.dims
        shape = [1, n_kv, capacity, hd]
        layer_bytes = int(np.prod(shape)) * be.dtype.itemsize
        for layer in range(L):
            for j, kv in enumerate(("key", "value")):
                args = (be.device, 0, be.dtype.type, shape, ptr + (2 * layer + j) * layer_bytes)
                self._io.bind_input(f"past_{kv}_{layer}_{row}", *args)
                self._io.bind_output(f"present_{kv}_{layer}_{row}", *args)
        self._bound[row] = (weakref.ref(cache), ptr, capacity)


# Passes a batched row may go without a request before its stand-in token stops reading
# the cache it holds (BatchRunner._idle_cache): a reply in flight asks every pass or two
IDLE_PASSES = 8

# How long the loop waits for the next of the last pass's replies to ask for their next
# step before it runs what is waiting. Their decoders sample between passes one after
# another (the GIL), about 2 ms each on the 2-core CPU: each request that comes in gives
# the rest this long again, up to SETTLE_MAX_S in all, so eight replies share one pass
# rather than splitting into passes of two or three that cost nearly what eight do
# (a batched pass of 8 one-token rows 36 ms, of 2: 34 ms; docs/results/2026-12-settle.md).
# A reply that ended never asks, and costs the others one SETTLE_S.
SETTLE_S = 0.003
SETTLE_MAX_S = 0.030
# A step of at most this many tokens is narrow (an AR token, the end-of-turn score's
# one position): its pass reads the weights once for little arithmetic, so narrow rows
# share a pass almost for free. Wider ones (a diffusion block, a prefill chunk) are
# arithmetic-bound on a CPU, where sharing a pass gains less and delays every row in it.
NARROW = 4


@dataclass(frozen=True)
class PassShape:
    """How many wide and narrow rows one pass may hold (``measure_shape``)."""

    wide: int
    narrow: int
    # Two rows share a pass even where the batched graph's own cost (a fused node per
    # row, idle rows) makes it 16% dearer than two alone (the 2-core CPU): asking for
    # more (4 there, where it pays back) kept replies still in their prefill from ever
    # joining the decoding ones (docs/results/2026-12-step-loop.md)
    # what it was chosen from: "<width>x<rows>" -> ms a pass (empty when not measured)
    costs_ms: dict[str, float] = dataclasses.field(default_factory=dict, compare=False)

    def batched_pays(self, rows: int) -> bool:
        """Whether ``rows`` one-token rows cost less in one batched pass than one after
        another in the one-reply graph. The batched graph runs every one of its rows,
        whether it has a request or not: with format v6 an idle row's token went through
        the whole model, and on the AMD EPYC without AMX a pass of 2 cost 13.6 ms, of 8
        14.1, one row alone 5.0, so two replies went faster taking turns. Since v7 an
        idle row costs its stand-in's attention only (2 rows 8.6 ms there), and sharing
        pays from 2 rows. Unmeasured (a shape given, not timed): always batched."""
        one = self.costs_ms.get("1x1")
        measured = sorted(
            (int(k[2:]), v) for k, v in self.costs_ms.items() if k.startswith("1x") and k != "1x1"
        )
        if rows < 2 or one is None or not measured:
            return True
        ks, ms = [k for k, _ in measured], [m for _, m in measured]
        return float(np.interp(rows, ks, ms)) < rows * one


def measure_shape(runner: BatchRunner, repeats: int = 5, cached: int = 64) -> PassShape:
    """The pass shape that is fastest for listeners on this host, from the cost of a
    pass of k rows (2, 4, all) against one row, wide (a 16-token block) and narrow (one
    token). k rows share a pass when that gets k silent replies' first sentences out no
    later at the median than running them one after another: k passes of cost c(k)
    against (k + 1) / 2 of cost c(1), so c(k) <= c(1) (k + 1) / 2. On a GPU, or a CPU
    with cheap wide passes, every row shares; on a CPU without, wide rows run alone
    (narrow ones, bound by reading the weights, share there too)."""
    single = runner.single
    rng = np.random.default_rng(0)
    caches = []
    for _ in range(runner.rows):
        cache = OrtCache(single)
        single.step(cache, rng.integers(0, single.vocab_size, cached), "causal", commit=True)
        caches.append(cache)

    def cost(k: int, width: int) -> float:
        times = []
        # not timed: the first warms the graph's kernels up, and the rest take the rows
        # of the last measurement's replies to the idle cache, as a loop's would
        warm = IDLE_PASSES
        for _ in range(warm + repeats):
            ids, rows = rng.integers(0, 100, width), np.arange(width)
            requests = [
                Request((False, 0), i, caches[i], ids, "block", False, rows) for i in range(k)
            ]
            t0 = time.perf_counter()
            runner.run(requests)
            times.append(time.perf_counter() - t0)
        return float(np.median(times[warm:]))

    fits, costs = {}, {}
    ks = sorted({1, 2, 4, runner.rows})
    for width in (16, 1):
        costs[width] = {k: cost(k, width) for k in ks}
        one = costs[width][1]
        fits[width] = max(k for k in ks if costs[width][k] <= one * (k + 1) / 2)
    shape = PassShape(wide=fits[16], narrow=fits[1])
    shape.costs_ms.update(
        {f"{w}x{k}": round(c * 1000, 2) for w, by_k in costs.items() for k, c in by_k.items()}
    )
    return shape


SHAPES = "passes.json"  # in the model directory: the shape measured on each host


def host_shape(runner: BatchRunner, model_dir: Path) -> tuple[PassShape, bool]:
    """This host's pass shape: measured once (:func:`measure_shape`, a few seconds on a
    CPU) and kept in the model directory under the host's processor and providers.
    Returns it and whether it was measured now."""
    key = host_key(runner.session.get_providers())
    path = model_dir / SHAPES
    if isinstance(found := host_records(path).get(key), dict):
        return PassShape(int(found["wide"]), int(found["narrow"]), found.get("costs_ms", {})), False
    shape = measure_shape(runner)
    keep_host_record(path, key, dataclasses.asdict(shape) | {"rows": runner.rows})
    return shape, True


def host_records(path: Path) -> dict[str, Any]:
    """What ``path`` keeps per host (:func:`host_key`); empty when it is missing or
    unreadable."""
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return known if isinstance(known, dict) else {}


def keep_host_record(path: Path, key: str, record: dict[str, Any]) -> None:
    """Keep this host's ``record`` in ``path`` beside the other hosts'; a read-only
    directory measures at every start."""
    known = host_records(path) | {key: record}
    with contextlib.suppress(OSError):
        path.write_text(json.dumps(known, indent=2))


def host_key(providers: Sequence[str]) -> str:
    """The processor (its name, cores and the flags that decide int8 kernels) and the
    execution providers: what a pass's cost depends on besides the model."""
    cpu = read_cpu()
    kernels = {"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8"}
    isa = sorted((cpu.flags or frozenset()) & kernels)
    return f"{cpu.name} x{os.cpu_count()} {'+'.join(isa)} {','.join(providers)}"


class StepLoop:
    """The thread that owns the model: it waits for requests, takes as many as one
    pass holds (lowest priority first) and runs them together."""

    def __init__(
        self,
        runner: BatchRunner,
        on_pass: Callable[[Sequence[Request]], None] | None = None,
        shape: PassShape | None = None,
    ) -> None:
        self.runner = runner
        self.shape = shape or PassShape(runner.rows, runner.rows)
        # how many one-token rows run in turn rather than in one pass (PassShape.batched_pays)
        self._in_turn = frozenset(
            k for k in range(2, runner.rows + 1) if not self.shape.batched_pays(k)
        )
        self.on_pass = on_pass  # sees every pass's requests (metrics, tests)
        self._waiting: list[Request] = []
        self._expected: set[int] = set()  # the threads of the last pass, until they ask
        self._asked = 0.0  # when the last request came in (time.monotonic)
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
            self._asked = time.monotonic()
            self._cond.notify()
        return request.done

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()

    def _take(self) -> list[Request] | None:
        """The next pass: waiting requests in rank order, as many as :attr:`shape`
        lets share it (the first always goes); a background request
        (:func:`model.backend.in_background`) only alone, when no other waits."""
        with self._cond:
            while not self._waiting and not self._closed:
                self._cond.wait()
            if not self._waiting:
                return None
            self._settle()
            self._waiting.sort()
            taken: list[Request] = []
            left: list[Request] = []
            wide = narrow = 0
            for r in self._waiting:
                if taken and (r.rank == BACKGROUND or taken[0].rank == BACKGROUND):
                    left.append(r)  # nobody waits on it: alone, when nothing else waits
                    continue
                is_wide = len(r.ids) > NARROW
                fits = len(taken) < self.runner.rows and (
                    wide < self.shape.wide if is_wide else narrow < self.shape.narrow
                )
                if fits or not taken:
                    taken.append(r)
                    wide += is_wide
                    narrow += not is_wide
                else:
                    left.append(r)
            self._waiting = left
            return taken

    def _settle(self) -> None:
        """Give the replies of the last pass a moment to ask again (their decoders
        sample between passes): without it replies fall into taking turns, each asking
        while another's pass runs, and share few passes. Waits only while one of them
        has not asked yet, :data:`SETTLE_S` past the last request to come in, at most
        :data:`SETTLE_MAX_S`."""
        start = time.monotonic()
        while self._expected - {r.thread for r in self._waiting} and not self._closed:
            last = max(self._asked, start)
            left = min(last + SETTLE_S, start + SETTLE_MAX_S) - time.monotonic()
            if left <= 0:
                break
            self._cond.wait(left)
        self._expected = set()

    def _run(self) -> None:
        while (taken := self._take()) is not None:
            self._pass(taken)
            # nothing of the pass held while the loop waits for the next: a reply's
            # cache is freed (its positions back in the pool) as soon as it is let go
            del taken

    def _pass(self, taken: list[Request]) -> None:
        if len(taken) in self._in_turn and all(len(r.ids) <= NARROW for r in taken):
            # one after another: each reply samples its token while the next one's runs
            self._expect(taken)
            for r in taken:
                self._one_pass([r], expect=False)
        else:
            self._one_pass(taken)

    def _expect(self, taken: list[Request]) -> None:
        with self._cond:
            self._expected = {r.thread for r in taken}

    def _one_pass(self, taken: list[Request], expect: bool = True) -> None:
        try:
            results = self.runner.run(taken)
        except Exception as exc:  # each reply in the pass gets it; the loop goes on
            for r in taken:
                r.done.set_exception(exc)
            return
        self.passes += 1
        self.rows_run += len(taken)
        if expect:
            self._expect(taken)
        if self.on_pass is not None:
            self.on_pass(taken)
        for r, logits in zip(taken, results, strict=True):
            r.done.set_result(logits)


class BatchedBackend:
    """A :class:`model.backend.StepBackend` whose steps run in a :class:`StepLoop`
    (shared passes); the calling thread waits for its own logits. Its caches count
    against a :class:`CachePool`."""

    def __init__(
        self, loop: StepLoop, pool: CachePool | None = None, prefill_chunk: int = PREFILL_CHUNK
    ) -> None:
        self.loop = loop
        self.prefill_chunk = prefill_chunk
        single = loop.runner.single
        self.name = single.name
        self.vocab_size = single.vocab_size
        self.max_len = single.max_len
        self.pool = pool

    def new_cache(self) -> OrtCache:
        return PooledCache(self.loop.runner.single, self.pool)

    def copy_prefix(self, cache: OrtCache, n: int) -> OrtCache:
        """A new cache (counted in the pool) holding ``cache``'s first ``n`` positions."""
        copy = self.new_cache()
        copy.load_prefix(cache, n)
        return copy

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
        if attend == "causal" and commit and len(ids) > self.prefill_chunk:
            return self._prefill(cache, ids, picked)
        return self._run(cache, ids, attend, commit, picked)

    def _run(
        self, cache: OrtCache, ids: NDArray[np.int64], attend: Attend, commit: bool, rows: Any
    ) -> Logits:
        cache.room_for(len(ids))  # in the reply's own thread: a refusal is this reply's alone
        request = Request(reply_rank(), next(_order), cache, ids, attend, commit, rows)
        return self.loop.submit(request).result()

    def _prefill(self, cache: OrtCache, ids: NDArray[np.int64], rows: NDArray[np.int64]) -> Logits:
        """A long causal prompt in chunks (:data:`PREFILL_CHUNK`), each its own request,
        so other replies' steps run between them: a long prompt never holds back
        another reply's first sentence for its whole prefill. Causal attention makes the
        chunks compute what one step would."""
        parts = []
        for lo in range(0, len(ids), self.prefill_chunk):
            hi = min(lo + self.prefill_chunk, len(ids))
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

    def _fill(self, capacity: int, source: OrtCache, n: int) -> None:
        if self._pool is not None and capacity > self._counted:
            self._pool.grow(capacity - self._counted)
            self._counted = capacity
        super()._fill(capacity, source, n)

    def __del__(self) -> None:
        if self._pool is not None and self._counted:
            self._pool.release(self._counted)
