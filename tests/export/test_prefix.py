"""A conversation's first turn starts from another's system prompt (model/prefix.py with
an ONNX Runtime backend's ``copy_prefix``): copied, not prefilled, and the other
conversation keeps its cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from model.batch import BatchedBackend, CachePool, StepLoop
from model.prefix import MIN_COPIED, PrefixCache
from model.runtime import OrtBackend

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


def _conversation(backend: OrtBackend, kept: PrefixCache, prompt: list[int], head: int = 0) -> None:
    cache = backend.new_cache()
    backend.step(cache, np.array(prompt), "causal", commit=True)
    kept.put(prompt, cache, head)


def test_the_system_prompt_outlives_the_conversations_it_came_from(tiny_dir: Path) -> None:
    backend = ort_backend(tiny_dir)
    kept = PrefixCache(backend, capacity=4)
    _conversation(backend, kept, [*SYSTEM, 5, 6, 7], head=len(SYSTEM))
    _conversation(backend, kept, [*SYSTEM, 8], head=len(SYSTEM))  # the same head: one kept
    assert kept.heads == 1 and len(kept) == 2
    while kept.forget_conversation():  # every conversation let go: the head stays
        pass
    third = [*SYSTEM, 11, 12, 13]
    warm = kept.take(third)
    assert warm.length == len(SYSTEM) and kept.heads == 1
    rest = np.array(third[len(SYSTEM) :])
    got = backend.step(warm.cache, rest, "causal", commit=True, rows=[len(rest) - 1])
    cold = backend.new_cache()
    want = backend.step(cold, np.array(third), "causal", commit=True, rows=[len(third) - 1])
    np.testing.assert_allclose(got, want, atol=1e-5)
    # a reply extends its copy, never the head: the next session gets the same prefix
    again = [*SYSTEM, 14]
    got = backend.step(kept.take(again).cache, np.array([14]), "causal", True, rows=[0])
    want = backend.step(backend.new_cache(), np.array(again), "causal", True, rows=[len(again) - 1])
    np.testing.assert_allclose(got, want, atol=1e-5)
    # a conversation's own next turn still takes its own cache, not the head
    _conversation(backend, kept, [*SYSTEM, 15, 16], head=len(SYSTEM))
    assert kept.take([*SYSTEM, 15, 16, 17]).length == len(SYSTEM) + 2 and len(kept) == 0


def test_memory_wanted_lets_conversations_go_before_heads(tiny_dir: Path) -> None:
    backend = ort_backend(tiny_dir)
    kept = PrefixCache(backend, capacity=4, heads=2)
    other = [int(i) for i in np.random.default_rng(4).integers(3, TINY.vocab_size, MIN_COPIED)]
    for head in (SYSTEM, other, [*SYSTEM[:-1], 3]):  # three heads pinned: two kept
        _conversation(backend, kept, [*head, 5], head=len(head))
        _conversation(backend, kept, [*head, 6], head=len(head))
    assert kept.heads == 2 and len(kept) == 4
    order = []
    while kept.evict_oldest():
        order.append((len(kept), kept.heads))
    assert order == [(3, 2), (2, 2), (1, 2), (0, 2), (0, 1), (0, 0)]
    assert kept.take([*SYSTEM, 7]).length == 0  # nothing kept: a full prefill


def test_a_copy_the_pool_has_no_room_for_lets_a_kept_conversation_go(tiny_dir: Path) -> None:
    """The copy asks the pool for room while the cache's lock is held; the pool frees
    it by letting the oldest kept conversation go, in the same thread."""
    loop = StepLoop(runner_of(tiny_dir))
    try:
        shared = BatchedBackend(loop, CachePool(budget=2 * 128))
        kept = PrefixCache(shared, capacity=4)
        assert shared.pool is not None
        shared.pool.evict = kept.evict_oldest
        _conversation(shared, kept, [*SYSTEM, 5])  # type: ignore[arg-type]
        _conversation(shared, kept, [*SYSTEM, 6])  # type: ignore[arg-type]
        assert len(kept) == 2 and shared.pool.held == 2 * 128
        warm = kept.take([*SYSTEM, 7])
        assert warm.length == len(SYSTEM) and len(kept) == 1
    finally:
        loop.close()


def test_a_head_the_pool_has_no_room_for_is_not_kept_and_the_reply_ends_well(
    tiny_dir: Path,
) -> None:
    loop = StepLoop(runner_of(tiny_dir))
    try:
        shared = BatchedBackend(loop, CachePool(budget=2 * 128))  # two conversations' room
        kept = PrefixCache(shared, capacity=4)
        _conversation(shared, kept, [*SYSTEM, 5], head=len(SYSTEM))  # type: ignore[arg-type]
        _conversation(shared, kept, [*SYSTEM, 6], head=len(SYSTEM))  # type: ignore[arg-type]
        assert kept.heads == 0 and len(kept) == 2  # both kept; the head had no room
    finally:
        loop.close()


def test_a_first_message_put_once_is_not_kept_as_a_head(tiny_dir: Path) -> None:
    """A client's own instructions, one session long, never take a head's room."""
    backend = ort_backend(tiny_dir)
    kept = PrefixCache(backend, capacity=4, heads=1)
    _conversation(backend, kept, [*SYSTEM, 5], head=len(SYSTEM))
    _conversation(backend, kept, [*SYSTEM, 6], head=len(SYSTEM))
    assert kept.heads == 1
    one_off = [int(i) for i in np.random.default_rng(5).integers(3, TINY.vocab_size, MIN_COPIED)]
    _conversation(backend, kept, [*one_off, 5], head=len(one_off))
    while kept.forget_conversation():
        pass
    assert kept.heads == 1 and kept.take([*SYSTEM, 7]).length == len(SYSTEM)
    assert kept.take([*one_off, 7]).length == 0


def test_a_primed_head_serves_the_first_conversation_that_starts_with_it(
    tiny_dir: Path,
) -> None:
    """A server keeps its system prompts' heads from the start (PrefixCache.prime): the
    very first session's turn copies it and prefills only its own words, with the
    logits a cold prefill gives."""
    backend = ort_backend(tiny_dir)
    kept = PrefixCache(backend, capacity=4)
    assert not kept.prime(SYSTEM[: MIN_COPIED - 1])  # too short to be worth a copy
    assert kept.prime(SYSTEM) and kept.heads == 1 and len(kept) == 0
    first = [*SYSTEM, 5, 6]
    warm = kept.take(first)
    assert warm.length == len(SYSTEM)
    got = backend.step(warm.cache, np.array([5, 6]), "causal", commit=True, rows=[1])
    want = backend.step(backend.new_cache(), np.array(first), "causal", True, rows=[len(first) - 1])
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert kept.take([*SYSTEM, 7]).length == len(SYSTEM)  # the head stays for the next


def test_the_engines_prime_the_heads_their_prompts_start_with(tiny_dir: Path) -> None:
    """The served engines' heads are the first message of the prompts they build (with
    the default tools and without), so a first turn finds them."""
    from model.assemble import load_onnx_diffusion_generator
    from model.chat import build_prompt, first_message_length
    from model.engine import ChatMessage
    from model.runtime import RuntimeConfig
    from model.tools import DEFAULT_TOOLS, tools_system_prompt

    gen = load_onnx_diffusion_generator(tiny_dir, "fp32", RuntimeConfig(device="cpu", max_len=512))
    assert gen.prime_heads([DEFAULT_TOOLS, ()]) == (2 if gen.supports_tools else 1)
    for tools in (DEFAULT_TOOLS, ()) if gen.supports_tools else ((),):
        system = tools_system_prompt(gen.options.system_prompt, tools)
        prompt = build_prompt(gen.tokenizer, [ChatMessage("user", "hi there")], 512, system)
        assert gen.prefixes.take(prompt).length == first_message_length(gen.tokenizer, prompt)
