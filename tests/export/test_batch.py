"""Several replies' steps in one pass (export.graph.BatchGraph, model/batch.py): each
row gets what it gets alone, on the tiny model's fp32 and int8 files."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import model.batch
from model.backend import (
    BACKGROUND,
    StepBackend,
    begin_reply,
    ends_a_turn,
    in_background,
    reply_rank,
    spoke,
)
from model.batch import (
    NARROW,
    PREFILL_CHUNK,
    SHAPES,
    BatchedBackend,
    BatchRunner,
    CachePool,
    PassShape,
    PoolFullError,
    Request,
    StepLoop,
    host_key,
    host_shape,
)
from model.generate import greedy
from model.modeldir import BATCH_ROWS, batch_file, read_manifest
from model.runtime import OrtBackend, OrtCache, RuntimeConfig
from model.sampler import DiffusionConfig, SamplerSettings, sample
from tests.export.conftest import TINY

VOCAB = TINY.vocab_size
DIFFUSION = DiffusionConfig(mask_id=VOCAB, end_ids=frozenset({2}), attention="block", shift=True)
SETTINGS = SamplerSettings(block_size=8, steps_per_block=4)
PROMPTS = [[5, 17, 42, 7, 99, 3], [9, 8, 7], [1, *range(40, 80)], [200, 201]]


def runner_of(tiny_dir: Path, variant: str = "fp32") -> BatchRunner:
    config = RuntimeConfig(device="cpu", max_len=128)
    name = "model.onnx" if variant == "fp32" else "model.int8.onnx"
    found = batch_file(tiny_dir, "fp32" if variant == "fp32" else "int8")
    assert found is not None
    return BatchRunner(OrtBackend(tiny_dir / name, config), found[0])


def filled(backend: OrtBackend, ids: Sequence[int]) -> OrtCache:
    cache = backend.new_cache()
    if ids:
        backend.step(cache, np.asarray(ids, np.int64), "causal", commit=True)
    return cache


def test_the_build_writes_a_batched_graph_of_the_default_rows(tiny_dir: Path) -> None:
    manifest = read_manifest(tiny_dir)
    for variant in ("fp32", "int8", "fp16"):
        found = batch_file(tiny_dir, variant)  # type: ignore[arg-type]
        assert found is not None and found[1] == BATCH_ROWS
        assert manifest["files"][found[0].name]["variant"] == variant


def test_a_row_idle_for_a_while_lets_go_of_its_cache_and_it_answers_as_alone(
    tiny_dir: Path,
) -> None:
    """A row with no request has no tokens: its stand-in writes past its cache's end and
    is dropped. After IDLE_PASSES passes without a request the row holds the empty idle
    cache instead (its stand-in then reads nothing); the reply that comes back is given
    a row again, with its cache as it left it and the logits it gets alone."""
    runner = runner_of(tiny_dir)
    single, rng = runner.single, np.random.default_rng(1)
    pasts = [rng.integers(0, VOCAB, 9).tolist(), rng.integers(0, VOCAB, 5).tolist()]
    kept, busy = (filled(single, p) for p in pasts)
    twin = filled(single, pasts[0])

    def step(cache: OrtCache) -> Request:
        return Request((False, 0), 0, cache, np.array([7]), "causal", True, np.arange(1))

    runner.run([step(kept), step(busy)])
    single.step(twin, np.array([7]), "causal", commit=True)
    before = kept.buffers.numpy()[..., : kept.length, :].copy()
    for _ in range(model.batch.IDLE_PASSES - 1):
        runner.run([step(busy), step(filled(single, [3]))])
    assert runner._row_of(kept) is not None  # still holds its row
    runner.run([step(busy), step(filled(single, [3]))])
    assert runner._row_of(kept) is None  # let go
    np.testing.assert_array_equal(kept.buffers.numpy()[..., : kept.length, :], before)
    back = runner.run([step(kept), step(busy)])[0]
    np.testing.assert_array_equal(back, single.step(twin, np.array([7]), "causal", commit=True))


@pytest.mark.parametrize("variant", ["fp32", "int8"])
def test_each_row_of_a_batched_pass_gets_what_it_gets_alone(tiny_dir: Path, variant: str) -> None:
    """Exact logits and cache entries, rows of every kind in one pass (an AR step, a
    committed prefill chunk, an uncommitted block, a block on an empty cache) and the
    graph's other rows idle."""
    runner = runner_of(tiny_dir, variant)
    single, rng = runner.single, np.random.default_rng(0)
    kinds = [(5, 1, "causal", True), (0, 7, "causal", True), (9, 4, "block", False)]
    kinds.append((0, 3, "block", False))
    pasts = [rng.integers(0, VOCAB, p).tolist() for p, *_ in kinds]
    chunks = [rng.integers(0, VOCAB, t) for _, t, *_ in kinds]
    alone_caches = [filled(single, p) for p in pasts]
    alone = [
        single.step(c, x, attend, commit)
        for c, x, (_, _, attend, commit) in zip(alone_caches, chunks, kinds, strict=True)
    ]
    caches = [filled(single, p) for p in pasts]
    requests = [
        Request(False, i, c, x, attend, commit, np.arange(len(x)))
        for i, (c, x, (_, _, attend, commit)) in enumerate(zip(caches, chunks, kinds, strict=True))
    ]
    together = runner.run(requests)
    assert runner.rows == BATCH_ROWS > len(requests)  # idle rows in the pass
    for a, b in zip(alone, together, strict=True):
        np.testing.assert_array_equal(a, b)
    for a_cache, b_cache in zip(alone_caches, caches, strict=True):
        assert a_cache.length == b_cache.length
        n = a_cache.length
        np.testing.assert_array_equal(
            a_cache.buffers.numpy()[..., :n, :], b_cache.buffers.numpy()[..., :n, :]
        )


def test_the_plain_attention_form_batches_as_exactly(
    tiny_plain: Path, tiny_ref: Any, tmp_path: Path
) -> None:
    """The GPU file's form (standard operators, the row's whole buffer masked), in fp32
    on the CPU: each row exactly what the plain one-reply graph gives it."""
    from export.build import export_batch_onnx

    config = RuntimeConfig(device="cpu", max_len=128)
    single = OrtBackend(tiny_plain, config)
    runner = BatchRunner(single, export_batch_onnx(tiny_ref, tmp_path / "b.onnx", 3, "plain"))
    rng = np.random.default_rng(2)
    pasts = [rng.integers(0, VOCAB, n).tolist() for n in (4, 0)]
    chunks = [rng.integers(0, VOCAB, t) for t in (1, 5)]
    attends = ["causal", "block"]
    alone = [
        single.step(filled(single, p), x, a, False)  # type: ignore[arg-type]
        for p, x, a in zip(pasts, chunks, attends, strict=True)
    ]
    requests = [
        Request(False, i, filled(single, p), x, a, False, np.arange(len(x)))  # type: ignore[arg-type]
        for i, (p, x, a) in enumerate(zip(pasts, chunks, attends, strict=True))
    ]
    for a, b in zip(alone, runner.run(requests), strict=True):
        np.testing.assert_array_equal(a, b)


def in_threads(jobs: Sequence[Callable[[], Any]]) -> list[Any]:
    """Run every job in its own thread at once; their results in order."""
    out: list[Any] = [None] * len(jobs)
    start = threading.Barrier(len(jobs))

    def run(i: int) -> None:
        start.wait()
        out[i] = jobs[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def diffusion(backend: StepBackend, prompt: list[int], stop: Callable[[], bool] = bool) -> list:
    rng = np.random.default_rng(0)
    return list(sample(backend, prompt, DIFFUSION, SETTINGS, rng, 24, lambda: stop()))


def ar(backend: StepBackend, prompt: list[int], n: int = 20) -> list[int]:
    return list(greedy(backend, prompt, n, ()))


@pytest.mark.parametrize("decode", [diffusion, ar], ids=["diffusion", "ar"])
def test_replies_sharing_passes_give_the_tokens_they_give_alone(
    tiny_dir: Path, decode: Callable[[StepBackend, list[int]], list[int]]
) -> None:
    runner = runner_of(tiny_dir)
    alone = [decode(runner.single, p) for p in PROMPTS]
    rows: list[int] = []
    loop = StepLoop(runner, on_pass=lambda taken: rows.append(len(taken)))
    try:
        shared = BatchedBackend(loop)
        together = in_threads([lambda p=p: decode(shared, p) for p in PROMPTS])
    finally:
        loop.close()
    assert together == alone and all(len(t) > 0 for t in alone)
    assert max(rows) > 1  # replies did share passes


@dataclass
class Slow:
    """A reply's backend whose decoder takes ``after_s`` to ask again after each step
    (its sampling between passes, stretched so the test sees the order)."""

    inner: BatchedBackend
    after_s: float

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def step(self, *args: Any, **kwargs: Any) -> Any:
        logits = self.inner.step(*args, **kwargs)
        time.sleep(self.after_s)
        return logits


def test_replies_that_ask_one_after_another_still_share_a_pass(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decoders sample one after another between passes (the GIL): the loop waits
    SETTLE_S past each request that comes in, so four replies asking 15 ms apart share
    one pass, where a fixed 30 ms wait would split them."""
    monkeypatch.setattr(model.batch, "SETTLE_S", 0.03)
    monkeypatch.setattr(model.batch, "SETTLE_MAX_S", 1.0)
    runner = runner_of(tiny_dir)
    alone = [ar(runner.single, p) for p in PROMPTS]
    rows: list[int] = []
    loop = StepLoop(runner, on_pass=lambda taken: rows.append(len(taken)))
    try:
        shared = BatchedBackend(loop)
        jobs = [lambda p=p, i=i: ar(Slow(shared, 0.015 * i), p) for i, p in enumerate(PROMPTS)]
        together = in_threads(jobs)
    finally:
        loop.close()
    assert together == alone
    assert rows.count(len(PROMPTS)) >= len(rows) // 2, rows


def test_the_end_of_turn_score_goes_before_every_reply_in_the_queue() -> None:
    """Requests wait in rank order: an old reply still silent, a new one, and one that
    has spoken; the end-of-turn score, asked for last, is taken first."""
    ranks: dict[str, tuple[bool, int]] = {}

    def rank_of(name: str, *calls: Callable[[], None]) -> None:
        for call in calls:
            call()
        ranks[name] = reply_rank()

    for name, calls in [
        ("old reply", (begin_reply,)),
        ("new reply", (begin_reply,)),
        ("spoken", (begin_reply, spoke)),
        ("score", (ends_a_turn,)),
    ]:
        t = threading.Thread(target=rank_of, args=(name, *calls))
        t.start()
        t.join()
    cache = OrtCache.__new__(OrtCache)  # never read: only the queue's order is
    waiting = [
        Request(ranks[name], i, cache, np.zeros(1, np.int64), "causal", True, np.zeros(1))
        for i, name in enumerate(ranks)
    ]
    names = list(ranks)
    assert [names[r.order] for r in sorted(waiting)] == [
        "score",
        "old reply",
        "new reply",
        "spoken",
    ]


def test_a_cancelled_reply_leaves_the_others_unchanged(tiny_dir: Path) -> None:
    runner = runner_of(tiny_dir)
    alone = [diffusion(runner.single, p) for p in PROMPTS[1:]]
    loop = StepLoop(runner)
    try:
        shared = BatchedBackend(loop)
        steps = iter(range(1000))
        cancelled = [lambda: next(steps) >= 3]  # stops before its fourth pass
        jobs = [lambda: diffusion(shared, PROMPTS[0], cancelled[0])]
        jobs += [lambda p=p: diffusion(shared, p) for p in PROMPTS[1:]]
        cut, *others = in_threads(jobs)
    finally:
        loop.close()
    assert others == alone
    assert len(cut) < len(diffusion(runner.single, PROMPTS[0]))


def test_a_long_prefill_runs_in_chunks_between_other_replies_steps(tiny_dir: Path) -> None:
    runner = runner_of(tiny_dir)
    chunk = 32  # PREFILL_CHUNK is longer than the tiny model's cache
    assert chunk <= PREFILL_CHUNK
    long_prompt = [int(i) for i in np.random.default_rng(1).integers(3, VOCAB, 3 * chunk)]
    alone = ar(runner.single, long_prompt)
    passes: list[list[int]] = []  # each pass: its rows' widths
    loop = StepLoop(runner, on_pass=lambda taken: passes.append([len(r.ids) for r in taken]))
    try:
        shared = BatchedBackend(loop, prefill_chunk=chunk)
        # the short reply's 120 steps span the long prompt's prefill, whichever starts first
        short, long = in_threads(
            [lambda: ar(shared, PROMPTS[1], 120), lambda: ar(shared, long_prompt)]
        )
    finally:
        loop.close()
    assert long == alone and short == ar(runner.single, PROMPTS[1], 120)
    chunks = [w for p in passes for w in p if w > len(PROMPTS[1])]
    assert chunks == [chunk] * 3  # never one pass of the whole prompt
    # the short reply's one-token steps ran in passes beside the chunks
    assert any(chunk in p and 1 in p for p in passes)


def test_a_background_prefill_runs_alone_and_only_when_no_reply_waits(tiny_dir: Path) -> None:
    """The next turn's prompt prefilled between turns (``model.prefix.warm``) runs in
    passes of its own, never beside a reply's step, and writes what it writes alone."""
    runner = runner_of(tiny_dir)
    chunk = 32
    long_prompt = [int(i) for i in np.random.default_rng(1).integers(3, VOCAB, 3 * chunk)]
    cold = OrtCache(runner.single)
    expected = runner.single.step(cold, np.asarray(long_prompt, np.int64), "causal", True)
    passes: list[list[tuple[bool, int]]] = []  # each pass: (background, width) per row
    loop = StepLoop(
        runner,
        on_pass=lambda taken: passes.append([(r.rank == BACKGROUND, len(r.ids)) for r in taken]),
    )
    warmed: list[np.ndarray] = []

    def warm() -> None:
        in_background()
        shared = BatchedBackend(loop)
        cache = shared.new_cache()
        for lo in range(0, len(long_prompt), chunk):
            ids = np.asarray(long_prompt[lo : lo + chunk], np.int64)
            warmed.append(shared.step(cache, ids, "causal", True))

    try:
        shared = BatchedBackend(loop)
        short, _ = in_threads([lambda: ar(shared, PROMPTS[1], 120), warm])
    finally:
        loop.close()
    assert short == ar(runner.single, PROMPTS[1], 120)
    np.testing.assert_allclose(np.concatenate(warmed), expected, rtol=1e-5, atol=1e-5)
    background = [p for p in passes if any(bg for bg, _ in p)]
    assert [len(p) for p in background] == [1, 1, 1]  # each chunk alone
    assert all(not bg for p in passes if len(p) > 1 for bg, _ in p)


def test_a_pass_holds_no_more_wide_rows_than_its_shape_lets(tiny_dir: Path) -> None:
    runner = runner_of(tiny_dir)
    alone = [diffusion(runner.single, p) for p in PROMPTS]
    widths: list[list[int]] = []
    shape = PassShape(wide=1, narrow=BATCH_ROWS)
    loop = StepLoop(runner, on_pass=lambda t: widths.append([len(r.ids) for r in t]), shape=shape)
    try:
        shared = BatchedBackend(loop)
        together = in_threads([lambda p=p: diffusion(shared, p) for p in PROMPTS])
    finally:
        loop.close()
    assert together == alone
    assert all(sum(w > NARROW for w in pass_) <= 1 for pass_ in widths)


def test_narrow_rows_share_a_pass_only_where_it_costs_less_than_taking_turns() -> None:
    """The AMD EPYC's measured costs: the batched graph runs all 8 rows whatever how
    many ask, so 2 cost 13.6 ms against 2 x 5.0 one after another; 3 and more share."""
    costs = {"1x1": 4.99, "1x2": 13.61, "1x4": 13.69, "1x8": 14.05, "16x1": 15.15}
    shape = PassShape(wide=1, narrow=8, costs_ms=costs)
    assert [shape.batched_pays(k) for k in range(1, 9)] == [True, False] + [True] * 6
    assert PassShape(8, 8).batched_pays(2)  # not measured: batched
    gpu = {"1x1": 2.0, "1x2": 2.1, "1x8": 2.3}
    assert all(PassShape(8, 8, costs_ms=gpu).batched_pays(k) for k in range(2, 9))


def test_replies_take_turns_where_a_shared_pass_costs_more(tiny_dir: Path) -> None:
    """Where two rows cost more together than one after another, two replies' one-token
    steps run one a pass in the one-reply graph, and say what they say alone."""
    runner = runner_of(tiny_dir)
    alone = [ar(runner.single, p) for p in PROMPTS[:2]]
    never = {"1x1": 1.0, **{f"1x{k}": 10.0 * k for k in (2, 4, BATCH_ROWS)}}
    widths: list[list[int]] = []  # each pass: its rows' widths
    shape = PassShape(1, 8, never)
    loop = StepLoop(runner, on_pass=lambda t: widths.append([len(r.ids) for r in t]), shape=shape)
    try:
        shared = BatchedBackend(loop)
        together = in_threads([lambda p=p: ar(shared, p) for p in PROMPTS[:2]])
    finally:
        loop.close()
    assert together == alone
    narrow = [w for w in widths if max(w) <= NARROW]
    assert len(narrow) > 10 and all(len(w) == 1 for w in narrow)
    # only a prompt's prefill shares its pass, as the shape lets wide rows
    assert all(max(w) > NARROW for w in widths if len(w) > 1)


def test_the_host_shape_is_measured_once_and_kept_in_the_model_dir(
    tiny_dir: Path, tmp_path: Path
) -> None:
    runner = runner_of(tiny_dir)
    shape, measured = host_shape(runner, tmp_path)
    assert measured and 1 <= shape.wide <= runner.rows and 1 <= shape.narrow <= runner.rows
    assert host_shape(runner, tmp_path) == (shape, False)
    kept = json.loads((tmp_path / SHAPES).read_text())
    assert list(kept) == [host_key(runner.session.get_providers())]


def test_the_cache_pool_refuses_a_reply_when_live_ones_hold_it_all(tiny_dir: Path) -> None:
    runner = runner_of(tiny_dir)
    loop = StepLoop(runner)
    kept: list[Any] = []

    def evict() -> bool:
        return bool(kept) and kept.pop(0) is not None

    try:
        shared = BatchedBackend(loop, CachePool(budget=2 * 128, evict=evict))
        live = [shared.new_cache() for _ in range(3)]
        for cache in live[:2]:  # each reserves its whole 128 positions (GROW > max_len)
            shared.step(cache, np.arange(3, dtype=np.int64), "causal", True)
        with pytest.raises(PoolFullError, match="KV cache pool is full"):
            shared.step(live[2], np.arange(3, dtype=np.int64), "causal", True)
        kept.append(live.pop(0))  # a finished conversation, kept for its next turn ...
        shared.step(live[1], np.arange(3, dtype=np.int64), "causal", True)  # ... gives way
        assert live[1].length == 3
    finally:
        loop.close()


@pytest.mark.parametrize("engine", ["diffusion", "ar"])
def test_the_served_engines_share_passes_and_answer_as_they_do_alone(
    tiny_dir: Path, engine: str
) -> None:
    """The loaders serve builds engines with (model/assemble.py): with the directory's
    batched graph, replies in threads at once say what each says alone."""
    from model.assemble import Batching, load_onnx_ar_generator, load_onnx_diffusion_generator
    from model.engine import ChatMessage, drain

    load = load_onnx_diffusion_generator if engine == "diffusion" else load_onnx_ar_generator
    config = RuntimeConfig(device="cpu", max_len=512)
    alone = load(tiny_dir, "fp32", config, batching=Batching(rows=1))
    shared = load(tiny_dir, "fp32", config, batching=Batching(rows=BATCH_ROWS))
    assert isinstance(shared.backend, BatchedBackend)
    assert not isinstance(alone.backend, BatchedBackend)
    asks = ["hi", "what is it", "tell me more", "ok"]

    def answer(gen: Any, text: str) -> list[str]:
        return drain(gen.generate([ChatMessage("user", text)], 12, lambda: False))[0]

    try:
        expected = [answer(alone, t) for t in asks]
        assert in_threads([lambda t=t: answer(shared, t) for t in asks]) == expected
        assert shared.backend.loop.passes > 0
    finally:
        shared.backend.loop.close()
