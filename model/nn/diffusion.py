"""The diffusion LM: the Llama module (model/nn/llama.py) plus a mask token, an attention
pattern, and optionally Dream's one-position logit shift.

* Mask token: masked diffusion (MDLM, Sahoo et al. 2024; LLaDA) replaces undecided
  tokens with a special token. SmolLM2 has none, so it gets one extra, trainable
  embedding row with id = vocab size, initialised to the mean token
  embedding until a trained adapter replaces it. The head keeps ``vocab_size`` outputs:
  the model never predicts the mask. LLaDA and Dream have their mask id in the vocabulary.
* Attention: ``"full"`` is LLaDA / MDLM (every position sees every other);
  ``"block"`` is block-causal (BD3-LM, Arriola et al. 2025; Fast-dLLM v2): causal
  across blocks, bidirectional inside one, so the KV cache of finished blocks is exact.
  The prompt is processed causally, as the autoregressive base model was trained.
  :func:`block_causal_mask` writes the pattern out as one bool matrix, for training and
  for checking the cached sampler against a cache-free recomputation.
* Shift (Dream, Ye et al. 2025): logits at position i predict the token at i + 1, so an
  adapted autoregressive checkpoint keeps using its next-token head. LLaDA: no shift.

What the sampler needs (mask id, end ids, attention, shift) is a
:class:`model.sampler.DiffusionConfig`, which imports no torch; SmolLM2's is
:func:`model.diffusion_engine.smollm2_diffusion_config`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from model.nn.adapter import Adapter, apply_adapter, load_adapter
from model.nn.gguf import GGUFFile, open_gguf
from model.nn.llama import Llama, LlamaConfig
from model.sampler import DiffusionConfig

__all__ = [
    "DiffusionConfig",
    "add_mask_row",
    "block_causal_mask",
    "embedding_with_mask_row",
    "load_smollm2_diffusion",
    "with_mask_row",
]


def block_causal_mask(n_prompt: int, n: int, block_size: int) -> torch.Tensor:
    """Bool attention mask ``(1, 1, n, n)``, True = may attend.

    Positions ``[0, n_prompt)`` are causal; after them, blocks of ``block_size``
    see the prompt, every earlier block and all of their own block. Query i may see
    key j iff j <= last(i), where last(i) = i in the prompt and the last position of
    i's block after it. ``n_prompt=0, block_size >= n`` is fully bidirectional.
    """
    i = torch.arange(n)
    b = (i - n_prompt) // block_size  # block index of each reply position
    last = torch.where(i < n_prompt, i, n_prompt + (b + 1) * block_size - 1)  # (n,)
    return (i[None, :] <= last[:, None])[None, None]  # (1, 1, n, n)


def mean_mask_row(emb: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The untrained mask embedding ``(1, C)``: the mean of the vocabulary's rows, a
    neutral input the adapter's training then moves."""
    return emb[:vocab_size].detach().float().mean(0, keepdim=True).to(emb.dtype)


def add_mask_row(
    config: LlamaConfig, state: dict[str, torch.Tensor]
) -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
    """One more embedding row, the mask token (id = vocab_size), set to
    :func:`mean_mask_row`. The head keeps ``vocab_size`` outputs."""
    emb = state["tok_emb.weight"]  # (V, C)
    if emb.shape[0] != config.vocab_size:
        raise ValueError(f"embedding has {emb.shape[0]} rows, expected {config.vocab_size}")
    state = dict(state)
    if config.tie_embeddings:  # the head is the embedding, without the new row
        state.pop("lm_head.weight", None)
    state["tok_emb.weight"] = torch.cat([emb, mean_mask_row(emb, config.vocab_size)])
    return replace(config, embedding_size=config.vocab_size + 1), state


def has_mask_row(model: Llama) -> bool:
    return bool(model.tok_emb.weight.shape[0] > model.config.vocab_size)


def with_mask_row(model: Llama) -> Llama:
    """``model`` itself when it has a mask row; else a copy with the mean row added."""
    if has_mask_row(model):
        return model
    config, state = add_mask_row(model.config, model.state_dict())
    return Llama.from_state_dict(config, state, model.dtype)


def embedding_with_mask_row(model: Llama) -> torch.Tensor:
    """The model's token table ``(V + 1, C)``, with the mean mask row if it has none."""
    w = model.tok_emb.weight.detach()
    if has_mask_row(model):
        return w
    return torch.cat((w, mean_mask_row(w, model.config.vocab_size)), dim=0)


def load_smollm2_diffusion(
    source: GGUFFile | str | Path | None = None,
    adapter: Adapter | str | Path | None = None,
    dtype: torch.dtype = torch.float32,
) -> Llama:
    """SmolLM2-135M-Instruct with the mask row, plus the trained adapter if given.

    ``adapter``: a path or an object from ``model.nn.adapter.load_adapter``,
    merged with ``model.nn.adapter.apply_adapter``. Without one the mask row is the mean
    embedding and the model is the untrained base.
    """
    f = open_gguf(source)
    config = f.llama_config()
    config, state = add_mask_row(config, f.state_dict(config))
    model = Llama.from_state_dict(config, state, torch.float32)
    if adapter is not None:
        if isinstance(adapter, str | Path):
            adapter = load_adapter(adapter)
        with torch.no_grad():
            apply_adapter(model, adapter)
    return model.to(dtype).eval()
