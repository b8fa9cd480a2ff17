from __future__ import annotations

import torch

from model.nn.gguf import permute_rope_rows, unpermute_rope_rows
from model.nn.llama import Llama, apply_rope, rope_cos_sin
from tests.model.conftest import TINY, tiny_model

ATOL = 1e-5


def tokens(T: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, TINY.vocab_size, (2, T), generator=g)  # (B, T)


@torch.inference_mode()
def test_kv_cache_step_by_step_matches_full_forward() -> None:
    model, idx = tiny_model(), tokens(12)
    full = model(idx)  # (B, T, V)
    cache = model.new_cache(batch=2, max_len=12)
    first = model(idx[:, :5], cache=cache)
    steps = [model(idx[:, t : t + 1], cache=cache) for t in range(5, 12)]
    assert cache.length == 12
    torch.testing.assert_close(torch.cat([first, *steps], dim=1), full, atol=ATOL, rtol=0)


@torch.inference_mode()
def test_kv_cache_chunked_prefill_matches_full_forward() -> None:
    # Several new tokens on top of a cache need the offset causal mask.
    model, idx = tiny_model(), tokens(12)
    cache = model.new_cache(batch=2, max_len=12)
    parts = [model(idx[:, a:b], cache=cache) for a, b in [(0, 4), (4, 9), (9, 12)]]
    torch.testing.assert_close(torch.cat(parts, dim=1), model(idx), atol=ATOL, rtol=0)


@torch.inference_mode()
def test_uncommitted_pass_leaves_the_cache_unchanged() -> None:
    model, idx = tiny_model(), tokens(10)
    cache = model.new_cache(batch=2, max_len=10)
    model(idx[:, :6], cache=cache)
    trial = model(idx[:, 6:], cache=cache, commit=False)
    assert cache.length == 6
    torch.testing.assert_close(trial, model(idx)[:, 6:], atol=ATOL, rtol=0)
    torch.testing.assert_close(model(idx[:, 6:], cache=cache), trial, atol=ATOL, rtol=0)
    assert cache.length == 10


@torch.inference_mode()
def test_attention_modes() -> None:
    model, idx = tiny_model(), tokens(8)
    T = idx.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool).tril()[None, None]  # (1, 1, T, T)
    torch.testing.assert_close(model(idx, mask=causal), model(idx), atol=ATOL, rtol=0)
    everything = torch.ones(1, 1, T, T, dtype=torch.bool)
    full = model(idx, mask="full")
    torch.testing.assert_close(model(idx, mask=everything), full, atol=ATOL, rtol=0)
    # bidirectional: the first position now sees the future
    assert not torch.allclose(full[:, 0], model(idx)[:, 0], atol=1e-3)


@torch.inference_mode()
def test_explicit_positions_and_logit_rows() -> None:
    model, idx = tiny_model(), tokens(6)
    pos = torch.arange(6).expand(2, 6)
    torch.testing.assert_close(model(idx, pos=pos), model(idx), atol=ATOL, rtol=0)
    torch.testing.assert_close(model(idx, rows=[5]), model(idx)[:, -1:])
    torch.testing.assert_close(model(idx, rows=[0, 3]), model(idx)[:, [0, 3]])
    # RoPE makes attention depend on relative position only: shifting all positions
    # leaves the logits unchanged.
    torch.testing.assert_close(model(idx, pos=100), model(idx), atol=1e-4, rtol=0)


def test_from_state_dict_ties_the_head_and_casts() -> None:
    src = tiny_model()
    state = {k: v for k, v in src.state_dict().items() if k != "lm_head.weight"}
    model = Llama.from_state_dict(TINY, state, torch.bfloat16)
    assert model.lm_head.weight is model.tok_emb.weight
    assert model.dtype == torch.bfloat16
    torch.testing.assert_close(
        model.tok_emb.weight.float(), src.tok_emb.weight, atol=1e-2, rtol=1e-2
    )


def _rope_interleaved(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """llama.cpp's RoPE: rotates adjacent pairs (x0, x1), (x2, x3)... (reference)."""
    hd = x.shape[-1]
    inv = theta ** -(torch.arange(0, hd, 2).float() / hd)
    ang = pos[:, None, :, None].float() * inv  # (B, 1, T, hd/2)
    a, b = x[..., 0::2], x[..., 1::2]
    out = torch.stack((a * ang.cos() - b * ang.sin(), a * ang.sin() + b * ang.cos()), -1)
    return out.flatten(-2)


def test_unpermute_turns_gguf_rows_into_rotate_half_layout() -> None:
    torch.manual_seed(0)
    n_head, hd, C, T = 3, 8, 16, 5
    wq_hf, wk_hf = torch.randn(n_head * hd, C), torch.randn(n_head * hd, C)
    wq_gguf, wk_gguf = permute_rope_rows(wq_hf, n_head), permute_rope_rows(wk_hf, n_head)
    assert torch.equal(unpermute_rope_rows(wq_gguf, n_head), wq_hf)
    x, pos = torch.randn(1, T, C), torch.arange(T)[None]

    def heads(w: torch.Tensor) -> torch.Tensor:
        return (x @ w.T).view(1, T, n_head, hd).transpose(1, 2)  # (1, nh, T, hd)

    rope = rope_cos_sin(pos, hd, 10000.0, torch.float32)
    q, k = (apply_rope(heads(unpermute_rope_rows(w, n_head)), *rope) for w in (wq_gguf, wk_gguf))
    q_ref, k_ref = (_rope_interleaved(heads(w), pos, 10000.0) for w in (wq_gguf, wk_gguf))
    # llama.cpp's interleaved RoPE on its own layout == rotate_half on the unpermuted one
    torch.testing.assert_close(q @ k.transpose(-1, -2), q_ref @ k_ref.transpose(-1, -2))
    # and skipping the unpermute would not be
    q_bad, k_bad = (apply_rope(heads(w), *rope) for w in (wq_gguf, wk_gguf))
    assert not torch.allclose(q_bad @ k_bad.transpose(-1, -2), q_ref @ k_ref.transpose(-1, -2))
