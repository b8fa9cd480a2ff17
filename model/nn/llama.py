"""A Llama decoder in one file (nanoGPT style): RMSNorm, RoPE, GQA attention, SwiGLU.

Weights use the Hugging Face Llama layout (rotate_half RoPE, ``(out, in)`` linears), so
SmolLM2 (from its GGUF, see :mod:`model.nn.gguf`) and, later, LLaDA / Dream checkpoints load
into the same module.

Attention modes, chosen per call with ``mask``:

* ``"causal"``: token i sees the cache and new tokens up to i (autoregressive decoding).
* ``"full"``: every new token sees the whole cache and every new token. With a cache of
  finished blocks this is block diffusion's "current block" pass (BD3-LM, Fast-dLLM v2);
  without a cache it is LLaDA's fully bidirectional attention.
* a bool tensor ``(B or 1, 1, T, S)``, True = may attend, S = cached + new length: any
  other pattern (e.g. a block-causal training mask).

The cache only grows when ``commit=True``: a diffusion sampler denoises a block with
``commit=False`` as often as it likes, then commits the finished block once, so the
cache stays exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

Mask = Literal["causal", "full"] | torch.Tensor


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int = 49152
    n_layer: int = 30
    n_embd: int = 576
    n_head: int = 9
    n_kv_head: int = 3
    ffn_hidden: int = 1536
    rope_theta: float = 100000.0
    norm_eps: float = 1e-5
    max_seq_len: int = 8192
    tie_embeddings: bool = True
    attn_bias: bool = False  # biases on q, k, v (Qwen2, hence Dream)
    # Rows of the token embedding when it holds more than the vocabulary: SmolLM2 adapted
    # to diffusion has one extra row, the mask token, which is an input but never a
    # logit (the head keeps vocab_size outputs). None: vocab_size.
    embedding_size: int | None = None

    @property
    def n_emb(self) -> int:
        return self.embedding_size or self.vocab_size

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


class KVCache:
    """Keys and values of the committed prefix, preallocated for ``max_len`` positions."""

    def __init__(
        self,
        config: LlamaConfig,
        batch: int,
        max_len: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        shape = (config.n_layer, batch, config.n_kv_head, max_len, config.head_dim)
        # empty, not zeros: only the first `length` positions are ever read
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.length = 0  # committed positions

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Keep only these batch rows (a bool mask or indices): finished rows stop costing."""
        self.k = self.k[:, rows]
        self.v = self.v[:, rows]

    def extend(
        self, layer: int, k: torch.Tensor, v: torch.Tensor, commit: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Cached + new keys/values ``(B, n_kv, P+T, hd)``; stores the new ones if commit."""
        P, T = self.length, k.shape[2]
        if not commit:
            return (
                torch.cat((self.k[layer, :, :, :P], k), dim=2),
                torch.cat((self.v[layer, :, :, :P], v), dim=2),
            )
        end = P + T
        if end > self.max_len:
            raise ValueError(f"KV cache full: {P} + {T} > {self.max_len}")
        self.k[layer, :, :, P:end] = k
        self.v[layer, :, :, P:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()  # normalise in fp32 even when the model runs in bf16
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rope_cos_sin(
    pos: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin ``(B, 1, T, hd)`` for positions ``(B, T)`` (RoFormer, Su et al. 2021)."""
    # Computed in fp32 on the fly: a bf16 buffer would lose the low frequencies.
    inv_freq = theta ** -(torch.arange(0, head_dim, 2, device=pos.device).float() / head_dim)
    f = pos[..., None].float() * inv_freq  # (B, T, hd/2)
    emb = torch.cat((f, f), dim=-1)[:, None]  # (B, 1, T, hd)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin  # rotate_half layout


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.nh, self.nkv, self.hd = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        self.q_proj = nn.Linear(cfg.n_embd, self.nh * self.hd, bias=cfg.attn_bias)
        self.k_proj = nn.Linear(cfg.n_embd, self.nkv * self.hd, bias=cfg.attn_bias)
        self.v_proj = nn.Linear(cfg.n_embd, self.nkv * self.hd, bias=cfg.attn_bias)
        self.o_proj = nn.Linear(self.nh * self.hd, cfg.n_embd, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        mask: Mask,
        cache: KVCache | None,
        layer: int,
        commit: bool,
    ) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)  # (B, nh, T, hd)
        k = self.k_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)  # (B, nkv, T, hd)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if cache is not None:
            k, v = cache.extend(layer, k, v, commit)  # (B, nkv, S, hd)
        # mask is "causal" (no past), "full", or a bool tensor: see _resolve_mask
        opts: dict[str, Any]  # attn_mask or is_causal, for SDPA
        if isinstance(mask, torch.Tensor):
            opts = {"attn_mask": mask}
        else:
            opts = {"is_causal": mask == "causal"}
        y = F.scaled_dot_product_attention(q, k, v, enable_gqa=self.nkv != self.nh, **opts)
        # y: (B, nh, T, hd)
        out: torch.Tensor = self.o_proj(y.transpose(1, 2).reshape(B, T, self.nh * self.hd))
        return out


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.n_embd, cfg.ffn_hidden, bias=False)
        self.up_proj = nn.Linear(cfg.n_embd, cfg.ffn_hidden, bias=False)
        self.down_proj = nn.Linear(cfg.ffn_hidden, cfg.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))  # SwiGLU
        return out


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        mask: Mask,
        cache: KVCache | None,
        layer: int,
        commit: bool,
    ) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), rope, mask, cache, layer, commit)
        x = x + self.mlp(self.mlp_norm(x))
        return x


class Llama(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        # _weight: skip nn.Embedding's own normal_ init, which on the meta device
        # (from_state_dict) costs over a second of one-time setup; _init_weights below.
        emb = torch.empty(config.n_emb, config.n_embd)
        self.tok_emb = nn.Embedding(config.n_emb, config.n_embd, _weight=emb)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.norm = RMSNorm(config.n_embd, config.norm_eps)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        if not emb.is_meta:
            self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        # N(0, 0.02) as nanoGPT and HF Llama (initializer_range) do
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    @classmethod
    def from_state_dict(
        cls,
        config: LlamaConfig,
        state: dict[str, torch.Tensor],
        dtype: torch.dtype = torch.float32,
    ) -> Llama:
        """Build without random init (meta device), then adopt ``state``'s tensors."""
        with torch.device("meta"):
            model = cls(config)
        state = dict(state)
        if config.tie_embeddings:
            state.setdefault("lm_head.weight", state["tok_emb.weight"])
        model.load_state_dict(state, strict=True, assign=True)
        if config.tie_embeddings:  # assign=True replaced the shared Parameter
            model.lm_head.weight = model.tok_emb.weight
        return model.to(dtype).eval()

    @property
    def dtype(self) -> torch.dtype:
        return self.tok_emb.weight.dtype

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        w = self.tok_emb.weight
        return KVCache(self.config, batch, max_len, w.dtype, w.device)

    def forward(
        self,
        idx: torch.Tensor,
        pos: torch.Tensor | int | None = None,
        cache: KVCache | None = None,
        mask: Mask = "causal",
        commit: bool = True,
        rows: Sequence[int] | torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits ``(B, K, V)`` for tokens ``idx (B, T)``: the ``rows`` of the chunk
        (indices into T; None: all, K = T). Only those rows go through the head.

        ``pos``: positions ``(B, T)``, or the first position (default: the cache length).
        """
        B, T = idx.shape
        P = cache.length if cache is not None else 0
        if not isinstance(pos, torch.Tensor):
            start = P if pos is None else pos
            pos = torch.arange(start, start + T, device=idx.device).expand(B, T)
        x = self.tok_emb(idx)  # (B, T, C)
        rope = rope_cos_sin(pos, self.config.head_dim, self.config.rope_theta, x.dtype)
        mask = _resolve_mask(mask, P, T, idx.device)
        for i, block in enumerate(self.blocks):
            x = block(x, rope, mask, cache, i, commit)
        if cache is not None and commit:
            cache.length += T
        if rows is not None:
            x = x[:, torch.as_tensor(rows, dtype=torch.long, device=x.device)]
        return self.head(self.norm(x))  # (B, K, V)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Logits over the vocabulary: a tied head skips the extra (mask) embedding rows."""
        V = self.config.vocab_size
        if self.lm_head.weight.shape[0] == V:
            logits: torch.Tensor = self.lm_head(x)
            return logits
        return F.linear(x, self.lm_head.weight[:V])


def _resolve_mask(mask: Mask, past: int, T: int, device: torch.device) -> Mask:
    """SDPA's ``is_causal`` assumes no past; with a cache, causal needs an offset mask."""
    if isinstance(mask, torch.Tensor) or mask == "full":
        return mask
    if mask != "causal":
        raise ValueError(f"unknown attention mask {mask!r}")
    if past == 0:
        return "causal"
    if T == 1:
        return "full"  # one new token may see every cached one
    i = torch.arange(T, device=device)[:, None]
    j = torch.arange(past + T, device=device)[None, :]
    return (j <= past + i)[None, None]  # (1, 1, T, S)


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
