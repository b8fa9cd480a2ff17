"""A conversation's first turn starts from another's system prompt (model/prefix.py with
an ONNX Runtime backend's ``copy_prefix``): copied, not prefilled, and the other
conversation keeps its cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from model.batch import BatchedBackend, CachePool, StepLoop
from model.prefix import MIN_COPIED, PrefixCache

from .conftest import TINY, ort_backend
from .test_batch import runner_of

SYSTEM = [int(i) for i in np.random.default_rng(3).integers(3, TINY.vocab_size, MIN_COPIED + 8)]


def test_a_new_conversation_copies_the_shared_system_prompt(tiny_dir: Path) -> None:
    backend = ort_backend(tiny_dir)
    kept = PrefixCache(backend, capacity=4)
    first = [*SYSTEM, 5, 6, 7]
    cache = backend.new_cache()
    backend.step(cache, np.array(first), "causal", commit=True)
    kept.put(first, cache)

    second = [*SYSTEM, 9, 10]
    warm = kept.take(second)
    assert warm.length == len(SYSTEM) and warm.cache is not cache
    assert len(kept) == 1  # the first conversation keeps its cache
    rest = np.array(second[len(SYSTEM) :])
    got = backend.step(warm.cache, rest, "causal", commit=True, rows=[len(rest) - 1])
    cold = backend.new_cache()
    want = backend.step(cold, np.array(second), "causal", commit=True, rows=[len(second) - 1])
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert got.argmax() == want.argmax()
    # the first conversation's next turn still takes its own cache, whole
    own = kept.take([*first, 11, 12])
    assert own.cache is cache and own.length == len(first) and len(kept) == 0


def test_a_short_shared_prefix_is_prefilled_not_copied(tiny_dir: Path) -> None:
    backend = ort_backend(tiny_dir)
    kept = PrefixCache(backend, capacity=4)
    short = SYSTEM[: MIN_COPIED - 1]
    cache = backend.new_cache()
    backend.step(cache, np.array([*short, 5]), "causal", commit=True)
    kept.put([*short, 5], cache)
    assert kept.take([*short, 6]).length < MIN_COPIED


def test_a_copy_counts_against_the_cache_pool(tiny_dir: Path) -> None:
    loop = StepLoop(runner_of(tiny_dir))
    try:
        pool = CachePool(budget=4 * 128)
        shared = BatchedBackend(loop, pool)
        kept = PrefixCache(shared, capacity=4)
        cache = shared.new_cache()
        shared.step(cache, np.array([*SYSTEM, 5]), "causal", True)
        kept.put([*SYSTEM, 5], cache)
        held = pool.held
        warm = kept.take([*SYSTEM, 6])
        assert warm.length == len(SYSTEM) and pool.held > held
    finally:
        loop.close()
