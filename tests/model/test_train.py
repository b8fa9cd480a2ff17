"""The block-diffusion training objective on tiny random models."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from model.adapter import attach_lora
from model.backend import TorchBackend
from model.llama import Llama
from model.train import (
    TrainConfig,
    build,
    diffusion_loss,
    forward_rows,
    make_batch,
    noise_block,
    pad_reply,
    parse_overrides,
    train_step,
)
from tests.model.conftest import TINY

V = TINY.vocab_size
MASK = V  # the extra embedding row
CFG = replace(TINY, embedding_size=V + 1)


def tiny_diffusion(seed: int = 0) -> Llama:
    torch.manual_seed(seed)
    return Llama(CFG).eval()


def test_pad_reply_fills_the_last_block_with_end():
    assert pad_reply([5, 6, 7, 9], 3, 9) == [5, 6, 7, 9, 9, 9]
    assert pad_reply([5, 9], 2, 9) == [5, 9]


def test_noise_block_masks_only_inside_the_block():
    x0 = torch.arange(10, 20)
    gen = torch.Generator().manual_seed(0)
    x, masked = noise_block(x0, 4, 8, 1.0, MASK, gen)  # t = 1: everything in the block
    assert masked.tolist() == [False] * 4 + [True] * 4 + [False] * 2
    assert x.tolist() == [10, 11, 12, 13, MASK, MASK, MASK, MASK, 18, 19]
    rates = [noise_block(x0, 0, 10, 0.3, MASK, gen)[1].float().mean() for _ in range(400)]
    assert abs(float(torch.stack(rates).mean()) - 0.3) < 0.03


def test_loss_weights_masked_positions_by_one_over_t():
    # Two examples, block size 2 -> 4 block positions. Example 1 (t = 0.5) has masked
    # positions with CE a and b; example 2 (t = 0.25) one position with CE c.
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 3.0]])
    targets = torch.tensor([0, 2, 1])
    weights = torch.tensor([2.0, 2.0, 4.0])
    ce = [
        -math.log(math.e**2 / (math.e**2 + 2)),
        -math.log(1 / (2 + math.e)),
        -math.log(1 / (2 + math.e**3)),
    ]
    expected = (ce[0] / 0.5 + ce[1] / 0.5 + ce[2] / 0.25) / 4
    assert float(diffusion_loss(logits, targets, weights, 4)) == pytest.approx(expected)


def test_make_batch_rows_targets_and_weights():
    # prompt of 3, reply of 2 blocks of 2; t = 1 masks the whole chosen block
    cfg = TrainConfig(block_size=2)
    prompt, reply = [1, 2, 3], [10, 11, 12, 13]
    gen = torch.Generator().manual_seed(0)
    batch = make_batch([(prompt, reply)], cfg, MASK, gen, t=torch.tensor([1.0]))
    T = batch.idx.shape[1]
    b = (T - 3) // 2 - 1  # the block that was drawn
    lo = 3 + 2 * b
    assert batch.idx[0].tolist() == prompt + reply[: 2 * b] + [MASK, MASK]
    assert batch.rows.tolist() == [lo - 1, lo]  # Dream shift: row q-1 predicts q
    assert batch.targets.tolist() == reply[2 * b : 2 * b + 2]
    assert batch.weights.tolist() == [1.0, 1.0]
    assert batch.n_positions == 2


def contract_mask(n_prompt: int, T: int, B: int) -> torch.Tensor:
    """CONTRACT.md 3 written out by hand: prompt causal; reply block k sees the prompt,
    blocks < k, and all of block k."""
    m = torch.zeros(T, T, dtype=torch.bool)
    for i in range(T):
        for j in range(T):
            if i < n_prompt:
                m[i, j] = j <= i
            else:
                k = (i - n_prompt) // B
                m[i, j] = j < n_prompt + (k + 1) * B
    return m


def test_attention_mask_is_the_contracts():
    cfg = TrainConfig(block_size=4)
    items = [([1, 2, 3], list(range(20, 32))), ([1, 2, 3, 4, 5], list(range(40, 48)))]
    gen = torch.Generator().manual_seed(3)
    batch = make_batch(items, cfg, MASK, gen)
    T = batch.idx.shape[1]
    for n, (prompt, _) in enumerate(items):
        assert torch.equal(batch.attn[n, 0], contract_mask(len(prompt), T, 4))


def test_training_logits_equal_the_samplers_cached_block_steps():
    """Input [prompt | clean blocks | noised block] under the training mask gives the
    logits the sampler computes: causal prefill, committed blocks, one block step."""
    model = tiny_diffusion()
    B, prompt = 4, [5, 6, 7, 8, 9]
    clean = [20, 21, 22, 23, 30, 31, 32, 33]
    noised = [MASK, 41, MASK, MASK]
    idx = torch.tensor([prompt + clean + noised])
    T = idx.shape[1]
    attn = contract_mask(len(prompt), T, B)[None, None]
    lo = len(prompt) + len(clean)
    rows = torch.arange(lo - 1, lo + B - 1)  # predictions for the noised block
    mask_emb = model.tok_emb.weight[MASK]
    with torch.no_grad():
        got = forward_rows(model, mask_emb, idx, attn, rows)
    be = TorchBackend(model, max_len=64)
    cache = be.new_cache()
    ids = lambda xs: np.array(xs, dtype=np.int64)  # noqa: E731
    be.step(cache, ids(prompt), "causal", commit=True)
    be.step(cache, ids(clean[:4]), "block", commit=True)
    last = be.step(cache, ids(clean[4:]), "block", commit=True)[-1]
    block = be.step(cache, ids(noised), "block", commit=False)
    want = np.concatenate([last[None], block[:-1]])
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-5)


def test_loss_decreases_on_a_tiny_batch():
    model = tiny_diffusion()
    with torch.no_grad():  # N(0, 0.02) tied embeddings cap a tiny model's logits near 0
        model.tok_emb.weight.mul_(10)
    cfg = TrainConfig(block_size=4, rank=8, alpha=16, lr=1e-2, mask_lr=1e-2, warmup=1)
    cfg = replace(cfg, max_steps=1000, bf16=False)
    params, mask_emb, opt = build(cfg, model)
    items = [([1, 2, 3], [10, 11, 12, 13, 14, 15, 16, 2]), ([4, 5], [20, 21, 22, 2])]
    gen = torch.Generator().manual_seed(0)
    batch = make_batch(items, cfg, MASK, gen, t=torch.tensor([0.7, 0.9]))
    losses = [train_step(model, mask_emb, opt, params, batch, cfg, s) for s in range(30)]
    assert max(losses[-5:]) < 0.5 * losses[0], losses
    # only the adapter and the mask row moved
    assert all(not p.requires_grad for n, p in model.named_parameters() if "lora" not in n)


def test_attach_lora_starts_as_the_base_model():
    model = tiny_diffusion()
    x = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        before = model(x)
        attach_lora(model, 4, 8)
        after = model(x)
    torch.testing.assert_close(before, after)


def test_parse_overrides_types_values():
    cfg = parse_overrides(TrainConfig(), ["block_size=16", "lr=3e-4", "bf16=false", "schedule=low"])
    assert (cfg.block_size, cfg.lr, cfg.bf16, cfg.schedule) == (16, 3e-4, False, "low")
