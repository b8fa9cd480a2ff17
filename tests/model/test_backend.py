"""TorchBackend: the numpy step interface over the Llama module."""

from __future__ import annotations

import numpy as np
import torch

from model.backend import TorchBackend
from model.llama import Llama, LlamaConfig

TINY = LlamaConfig(
    vocab_size=64, n_layer=2, n_embd=32, n_head=4, n_kv_head=2, ffn_hidden=48, max_seq_len=64
)


def backend() -> TorchBackend:
    torch.manual_seed(0)
    return TorchBackend(Llama(TINY).eval(), max_len=32)


def test_step_matches_a_full_forward_and_commit_grows_the_cache() -> None:
    b = backend()
    ids = np.array([3, 9, 4, 7, 1], np.int64)
    with torch.inference_mode():
        full = b.model(torch.from_numpy(ids)[None])[0].numpy()
    cache = b.new_cache()
    first = b.step(cache, ids[:3], "causal", commit=True)
    assert b.cache_length(cache) == 3
    rest = b.step(cache, ids[3:], "causal", commit=True)
    np.testing.assert_allclose(np.concatenate([first, rest]), full, atol=1e-5)


def test_uncommitted_block_steps_leave_the_cache_alone_and_truncate_rolls_back() -> None:
    b = backend()
    cache = b.new_cache()
    b.step(cache, np.array([1, 2, 3], np.int64), "causal", commit=True)
    block = np.array([5, 6], np.int64)
    a = b.step(cache, block, "block", commit=False)
    again = b.step(cache, block, "block", commit=False)
    assert b.cache_length(cache) == 3
    np.testing.assert_array_equal(a, again)
    last = b.step(cache, block, "block", commit=True, last_only=True)
    np.testing.assert_allclose(last, a[-1:], atol=1e-5)
    assert b.cache_length(cache) == 5
    b.truncate(cache, 3)
    np.testing.assert_allclose(b.step(cache, block, "block", commit=False), a, atol=1e-5)


def test_block_attention_differs_from_causal_inside_the_chunk() -> None:
    b = backend()
    cache = b.new_cache()
    b.step(cache, np.array([1, 2], np.int64), "causal", commit=True)
    ids = np.array([7, 8, 9], np.int64)
    causal = b.step(cache, ids, "causal", commit=False)
    block = b.step(cache, ids, "block", commit=False)
    assert not np.allclose(causal[0], block[0])  # the first token now sees the later ones
    one = b.step(cache, ids[:1], "block", commit=False)
    np.testing.assert_allclose(one, causal[:1], atol=1e-5)  # alone, the modes agree
