"""One step of the Llama as a pure function of tensors: the graph that goes to ONNX.

:class:`model.llama.Llama` keeps its KV cache in a Python object and picks the attention
mask with Python ``if``s; an exported graph needs both as tensors. :class:`StepGraph`
reuses the Llama's own modules (so its weights, biases and norms are the model's) and
computes one :class:`model.backend.StepBackend` step:

inputs
    ``input_ids`` (T,) int64: the chunk's tokens.
    ``positions`` (T,) int64: their positions (RoPE). Right after the committed prefix
    (P..P+T-1) except in a draft step (``model/backend.py``), which feeds only some of a
    block and reads the rest from keys and values placed after the prefix.
    ``past_keys``, ``past_values`` (P, L, n_kv, hd): the committed prefix's keys and
    values, position-major so that a runtime's preallocated cache passes its first P
    positions as one contiguous slice, without a copy.
    ``block`` () bool: False = causal ("causal" attend), True = every chunk token sees
    the whole chunk (a block-diffusion block, BD3-LM / Fast-dLLM v2). One graph serves
    the autoregressive baseline and the diffusion sampler, so their comparison is fair.
    ``logit_rows`` (K,) int64: which chunk rows get logits (``[T-1]``: the last only,
    so a prefill does not pay the 49152-wide head for every prompt token).
outputs
    ``logits`` (K, V) float32, ``keys``, ``values`` (T, L, n_kv, hd): the chunk's own
    keys and values, which the runtime appends to its cache when it commits.

The attention pattern follows chunk order, not ``positions``: causal is chunk token i
seeing every past entry and chunk tokens up to i. The mask-token embedding row
(CONTRACT.md item 1) is part of the table: ids up to V (inclusive) embed; logits keep
width V.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from model.llama import Llama, apply_rope, rope_cos_sin

INPUT_NAMES = ["input_ids", "positions", "past_keys", "past_values", "block", "logit_rows"]
OUTPUT_NAMES = ["logits", "keys", "values"]
DYNAMIC_AXES = {
    "input_ids": {0: "T"},
    "positions": {0: "T"},
    "past_keys": {0: "P"},
    "past_values": {0: "P"},
    "logit_rows": {0: "K"},
    "logits": {0: "K"},
    "keys": {0: "T"},
    "values": {0: "T"},
}


def mean_mask_row(model: Llama) -> torch.Tensor:
    """The untrained mask embedding: the mean of the vocabulary's rows (CONTRACT item 5)."""
    V = model.config.vocab_size
    return model.tok_emb.weight[:V].detach().float().mean(0).to(model.dtype)


def embedding_with_mask_row(model: Llama) -> torch.Tensor:
    """The model's token table with the mask row, adding the mean row if it has none."""
    w = model.tok_emb.weight.detach()
    if w.shape[0] > model.config.vocab_size:
        return w
    return torch.cat((w, mean_mask_row(model)[None]), dim=0)


class StepGraph(nn.Module):
    def __init__(self, model: Llama) -> None:
        super().__init__()
        cfg = model.config
        self.cfg = cfg
        self.blocks = model.blocks
        self.norm = model.norm
        # The table is stored transposed, (C, V+1): a tied head multiplies by it as is
        # (one mask column more, dropped after) and the lookup gathers its columns, so
        # the file holds the table once (row-major it would also hold a transposed copy
        # for the head, 113 MB for SmolLM2).
        table = embedding_with_mask_row(model).t().contiguous()
        self.embed_t = nn.Parameter(table, requires_grad=False)
        tied = model.lm_head.weight is model.tok_emb.weight
        self.head = None if tied else model.lm_head

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        past_keys: torch.Tensor,
        past_values: torch.Tensor,
        block: torch.Tensor,
        logit_rows: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        T, P = input_ids.shape[0], past_keys.shape[0]
        x = self.embed_t.index_select(1, input_ids).t()[None]  # (1, T, C)
        rope = rope_cos_sin(positions[None], cfg.head_dim, cfg.rope_theta, x.dtype)  # (1,1,T,hd)
        i = torch.arange(T, device=x.device)[:, None]
        j = torch.arange(P + T, device=x.device)[None, :]
        allowed = (j <= i + P) | block  # (T, S): causal with an offset, or all
        bias = torch.zeros(allowed.shape, dtype=torch.float32).masked_fill(~allowed, float("-inf"))
        pk = past_keys.permute(1, 2, 0, 3)  # (L, n_kv, P, hd)
        pv = past_values.permute(1, 2, 0, 3)
        new_k: list[torch.Tensor] = []
        new_v: list[torch.Tensor] = []
        blocks: list[Any] = list(self.blocks)
        for layer, blk in enumerate(blocks):
            h, k, v = _attention(blk.attn, blk.attn_norm(x), rope, pk[layer], pv[layer], bias)
            new_k.append(k)
            new_v.append(v)
            x = x + h
            x = x + blk.mlp(blk.mlp_norm(x))
        y = self.norm(x[0].index_select(0, logit_rows))  # (K, C)
        logits = (y @ self.embed_t)[:, : cfg.vocab_size] if self.head is None else self.head(y)
        keys = torch.stack(new_k).permute(2, 0, 1, 3)  # (T, L, n_kv, hd)
        values = torch.stack(new_v).permute(2, 0, 1, 3)
        return logits.float(), keys, values


def _attention(
    a: Any,
    x: torch.Tensor,
    rope: tuple[torch.Tensor, torch.Tensor],
    past_k: torch.Tensor,
    past_v: torch.Tensor,
    bias: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Grouped-query attention written out (no SDPA), so every exporter and EP takes it.

    Returns the output ``(1, T, C)`` and the chunk's keys and values ``(n_kv, T, hd)``.
    """
    nh, nkv, hd = a.nh, a.nkv, a.hd
    g = nh // nkv
    T = x.shape[1]
    q = a.q_proj(x).view(1, T, nh, hd).transpose(1, 2)  # (1, nh, T, hd)
    k = a.k_proj(x).view(1, T, nkv, hd).transpose(1, 2)  # (1, n_kv, T, hd)
    v = a.v_proj(x).view(1, T, nkv, hd).transpose(1, 2)
    q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    k, v = k[0], v[0]  # (n_kv, T, hd)
    K = torch.cat((past_k, k), dim=1)  # (n_kv, S, hd)
    Vv = torch.cat((past_v, v), dim=1)
    # query head h reads kv head h // g (HF repeat_kv order): group the queries instead
    # of repeating the keys
    qg = q[0].reshape(nkv, g * T, hd)  # (n_kv, g*T, hd)
    att = (qg @ K.transpose(1, 2)).float() * hd**-0.5  # (n_kv, g*T, S)
    att = att.view(nkv, g, T, -1) + bias  # softmax in fp32 even for an fp16 graph
    p = att.softmax(-1).to(Vv.dtype).view(nkv, g * T, -1)
    y = (p @ Vv).view(nh, T, hd).transpose(0, 1).reshape(1, T, nh * hd)
    return a.o_proj(y), k, v


def example_inputs(model: Llama, T: int = 3, P: int = 2) -> tuple[torch.Tensor, ...]:
    cfg = model.config
    shape = (P, cfg.n_layer, cfg.n_kv_head, cfg.head_dim)
    return (
        torch.zeros(T, dtype=torch.long),
        torch.arange(P, P + T),
        torch.zeros(shape, dtype=model.dtype),
        torch.zeros(shape, dtype=model.dtype),
        torch.tensor(False),
        torch.arange(T),
    )
