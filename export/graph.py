"""One step of the Llama as a pure function of tensors: the graph that goes to ONNX.

:class:`model.nn.llama.Llama` keeps its KV cache in a Python object and picks the attention
mask with Python ``if``s; an exported graph needs both as tensors. :class:`StepGraph`
reuses the Llama's own modules (so its weights, biases and norms are the model's) and
computes one :class:`model.backend.StepBackend` step:

inputs
    ``input_ids`` (T,) int64: the chunk's tokens.
    ``positions`` (T,) int64: their positions (RoPE), right after the cache's entries
    (S..S+T-1). An input rather than computed in the graph since format 3
    (``model/modeldir.py``), for an in-block cache the sampler no longer has.
    ``past_length`` () int64: S, the cache entries the chunk attends to.
    ``block`` () bool: False = causal ("causal" attend), True = every chunk token sees
    the whole chunk (a block-diffusion block, BD3-LM / Fast-dLLM v2). One graph serves
    the autoregressive baseline and the diffusion sampler, so their comparison is fair.
    ``logit_rows`` (K,) int64: which chunk rows get logits (``[T-1]``: the last only,
    so a prefill does not pay the 49152-wide head for every prompt token).
    ``past_key_<l>``, ``past_value_<l>`` (1, n_kv, C, hd) per layer: the runtime's cache
    buffers, head-major, C >= S + T their capacity; only the first S entries are read.
outputs
    ``logits`` (K, V) float32.
    ``present_key_<l>``, ``present_value_<l>``: the same buffers with the chunk's keys and
    values written at S..S+T-1. The runtime binds each to its input's memory, so ONNX
    Runtime writes the chunk in place: nothing is copied, split or concatenated per step.

Attention comes in two forms with the same inputs and outputs (``StepGraph(attention=)``):

- ``"fused"`` (the CPU files, fp32 and int8): ONNX Runtime's ``GroupQueryAttention``
  (com.microsoft), which reads the buffers in place and, since format v6, takes q, k and
  v packed from one weight product and applies RoPE itself (:meth:`StepGraph.packed_layer`);
  before it (format v3) the graph
  took the cache as one tensor and split and concatenated it every step, a quarter of a
  block pass and 43% of an AR step at 1900 cached positions (docs/export.md). Its CUDA
  kernel, though, is causal only and refuses an ``attention_bias``, so a block pass
  cannot run there.
- ``"plain"`` (the GPU file, fp16): standard ONNX operators that CUDA and TensorRT run.
  ``ScatterElements`` writes the chunk into the buffer (in place when the runtime binds
  the present to the past, as ONNX Runtime's kernels skip the copy when input and
  output are one), and the chunk attends over the buffer's whole capacity, the unused
  positions masked.

The attention pattern follows chunk order, not ``positions``: causal is chunk token i
seeing every past entry and chunk tokens up to i. The mask-token embedding row
(id = vocab size) is part of the table: ids up to V (inclusive) embed; logits keep
width V.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from model.modeldir import Attention
from model.nn.diffusion import embedding_with_mask_row
from model.nn.llama import Llama, LlamaConfig, apply_rope, rope_cos_sin

FIXED_INPUTS = ["input_ids", "positions", "past_length", "block", "logit_rows"]


def cache_names(n_layer: int, prefix: str) -> list[str]:
    """``<prefix>_key_0, <prefix>_value_0, <prefix>_key_1, ...``: the per-layer buffers."""
    return [f"{prefix}_{kv}_{layer}" for layer in range(n_layer) for kv in ("key", "value")]


def input_names(n_layer: int) -> list[str]:
    return [*FIXED_INPUTS, *cache_names(n_layer, "past")]


def output_names(n_layer: int) -> list[str]:
    return ["logits", *cache_names(n_layer, "present")]


def dynamic_axes(n_layer: int) -> dict[str, dict[int, str]]:
    axes = {
        "input_ids": {0: "T"},
        "positions": {0: "T"},
        "logit_rows": {0: "K"},
        "logits": {0: "K"},
    }
    for name in cache_names(n_layer, "past") + cache_names(n_layer, "present"):
        axes[name] = {2: "C"}
    return axes


class StepGraph(nn.Module):
    rope_cos: torch.Tensor  # the fused graphs' RoPE tables (buffers)
    rope_sin: torch.Tensor

    def __init__(self, model: Llama, attention: Attention = "fused") -> None:
        super().__init__()
        cfg = model.config
        self.cfg = cfg
        self.attention = attention
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
        if attention == "fused":
            # One weight product for q, k and v and one for the gate and up projections:
            # a one-token pass is 211 small products and ~1,100 other nodes, so what it
            # costs on a CPU is mostly per node, not the weights it reads
            # (docs/results/2026-12-packed-graph.md)
            layers: list[Any] = list(model.blocks)
            self.qkv = nn.ModuleList(
                _packed_linear(b.attn.q_proj, b.attn.k_proj, b.attn.v_proj) for b in layers
            )
            self.gate_up = nn.ModuleList(
                _packed_linear(b.mlp.gate_proj, b.mlp.up_proj) for b in layers
            )
            cos, sin = rope_tables(cfg)
            self.register_buffer("rope_cos", cos.to(model.dtype), persistent=False)
            self.register_buffer("rope_sin", sin.to(model.dtype), persistent=False)

    def packed_layer(
        self,
        layer: int,
        x: torch.Tensor,  # (1, N, C)
        rows: list[tuple[Any, torch.Tensor, tuple[torch.Tensor, torch.Tensor], torch.Tensor]],
        past: tuple[torch.Tensor, ...],
        keep: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """One layer of the fused graphs: q, k and v in one product, RoPE inside the
        attention node, the gate and up projections in one product. ``rows``: per
        reply, its token indices (None: all of them), positions, the node's lengths and
        its bias; ``past``: each row's key and value buffers of this layer, in order;
        ``keep``: which of the rows' attention outputs, end to end, go on (not an idle
        row's stand-in)."""
        blk: Any = self.blocks[layer]
        a = blk.attn
        qkv = self.qkv[layer](blk.attn_norm(x))  # (1, N, (nh + 2 nkv) hd)
        ys, present = [], []
        for r, (at, pos, lens, bias) in enumerate(rows):
            part = qkv if at is None else qkv.index_select(1, at)
            pk, pv = past[2 * r], past[2 * r + 1]
            if a.hd % 16 == 0:  # the node rotates head sizes that are multiples of 16
                y, pk, pv = PackedAttention.apply(  # type: ignore[no-untyped-call]
                    part,
                    pk,
                    pv,
                    *lens,
                    self.rope_cos,
                    self.rope_sin,
                    pos[None],
                    bias[None, None],
                    a.nh,
                    a.nkv,
                )
            else:  # tiny test models: RoPE before the node, as format v5
                rope = rope_cos_sin(pos[None], a.hd, self.cfg.rope_theta, x.dtype)
                y, pk, pv = _rotated_attention(part, pk, pv, lens, rope, bias, a.nh, a.nkv)
            ys.append(y)
            present += [pk, pv]
        y = ys[0] if len(ys) == 1 else torch.cat(ys, 1)
        x = x + a.o_proj(y if keep is None else y.index_select(1, keep))
        ffn = self.cfg.ffn_hidden  # split at a constant: chunk() costs 6 shape nodes a layer
        gate, up = self.gate_up[layer](blk.mlp_norm(x)).split([ffn, ffn], dim=-1)
        x = x + blk.mlp.down_proj(F.silu(gate) * up)
        return x, present

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        past_length: torch.Tensor,
        block: torch.Tensor,
        logit_rows: torch.Tensor,
        *past: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        cfg = self.cfg
        T = input_ids.shape[0]
        x = self.embed_t.index_select(1, input_ids).t()[None]  # (1, T, C)
        total = past_length + T
        # fused: the first S+T entries; plain: the whole capacity C, past S+T masked
        span = total if self.attention == "fused" else past[0].shape[2]
        i = torch.arange(T, device=x.device)[:, None]
        j = torch.arange(span, device=x.device)[None, :]  # type: ignore[arg-type]
        allowed = (j <= i + past_length) | block  # (T, span): causal with an offset, or all
        if self.attention == "plain":
            allowed = allowed & (j < total)  # never the unused capacity
        bias = torch.zeros(allowed.shape, dtype=x.dtype).masked_fill(~allowed, float("-inf"))
        lengths = (total.to(torch.int32) - 1).reshape(1), total.to(torch.int32)
        present: list[torch.Tensor] = []
        if self.attention == "fused":
            only = [(None, positions, lengths, bias)]
            for layer in range(cfg.n_layer):
                x, kv = self.packed_layer(layer, x, only, past[2 * layer : 2 * layer + 2])
                present += kv
        else:
            rope = rope_cos_sin(positions[None], cfg.head_dim, cfg.rope_theta, x.dtype)
            blocks: list[Any] = list(self.blocks)
            for layer, blk in enumerate(blocks):
                a = blk.attn
                h = blk.attn_norm(x)
                q = apply_rope(a.q_proj(h).view(1, T, a.nh, a.hd).transpose(1, 2), *rope)
                k = apply_rope(a.k_proj(h).view(1, T, a.nkv, a.hd).transpose(1, 2), *rope)
                q = q.transpose(1, 2).reshape(1, T, a.nh * a.hd)
                k = k.transpose(1, 2).reshape(1, T, a.nkv * a.hd)
                pk, pv = past[2 * layer], past[2 * layer + 1]
                y, pk, pv = plain_attention(
                    q, k, a.v_proj(h), pk, pv, past_length, bias, a.nh, a.nkv
                )
                present += [pk, pv]
                x = x + a.o_proj(y)
                x = x + blk.mlp(blk.mlp_norm(x))
        y = self.norm(x[0].index_select(0, logit_rows))  # (K, C)
        logits = (y @ self.embed_t)[:, : cfg.vocab_size] if self.head is None else self.head(y)
        return (logits.float(), *present)


def plain_attention(
    q: torch.Tensor,  # (1, T, nh*hd), after RoPE
    k: torch.Tensor,  # (1, T, n_kv*hd), after RoPE
    v: torch.Tensor,  # (1, T, n_kv*hd)
    past_k: torch.Tensor,  # (1, n_kv, C, hd)
    past_v: torch.Tensor,
    past_length: torch.Tensor,  # () int64: S
    bias: torch.Tensor,  # (T, C): 0 where attended, -inf elsewhere (past S+T included)
    n_head: int,
    n_kv: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The chunk's keys and values scattered into ``S..S+T-1`` of the buffers, and
    attention over all ``C`` positions with ``bias`` masking what it must not see, in
    operators every execution provider has (traced, no Python ints of tensors)."""
    T, hd = q.shape[1], past_k.shape[-1]
    at = (past_length + torch.arange(T, device=q.device)).view(1, 1, T, 1).expand(1, n_kv, T, hd)

    def heads(x: torch.Tensor) -> torch.Tensor:  # (1, T, n_kv*hd) -> (1, n_kv, T, hd)
        return x.view(1, T, n_kv, hd).transpose(1, 2)

    present_k = past_k.scatter(2, at, heads(k))
    present_v = past_v.scatter(2, at, heads(v))
    y = grouped_attention(q, present_k[0], present_v[0], bias, n_head, n_kv)
    return y, present_k, present_v


def grouped_attention(
    q: torch.Tensor,  # (1, T, nh*hd), after RoPE
    keys: torch.Tensor,  # (n_kv, S, hd)
    values: torch.Tensor,  # (n_kv, S, hd)
    bias: torch.Tensor,  # broadcasts to (T, S): 0 where attended, -inf elsewhere
    n_head: int,
    n_kv: int,
) -> torch.Tensor:
    """Attention of the chunk's queries over ``S`` entries -> ``(1, T, nh*hd)``. Queries
    are grouped, not keys repeated (HF repeat_kv order: query head h reads kv head
    h // g), and the softmax runs in fp32 even in an fp16 graph."""
    T, hd = q.shape[1], keys.shape[-1]
    g = n_head // n_kv
    qg = q[0].view(T, n_head, hd).transpose(0, 1).reshape(n_kv, g * T, hd)
    att = (qg @ keys.transpose(1, 2)).float() * hd**-0.5  # (n_kv, g*T, S)
    att = att.view(n_kv, g, T, -1) + bias.float()
    p = att.softmax(-1).to(values.dtype).view(n_kv, g * T, -1)
    y: torch.Tensor = (p @ values).view(n_head, T, hd).transpose(0, 1).reshape(1, T, n_head * hd)
    return y


class GroupQueryAttention(torch.autograd.Function):
    """ONNX Runtime's ``com.microsoft::GroupQueryAttention`` in a shared buffer: the
    chunk's keys and values go to ``S..S+T-1`` of the past buffers (S = ``total - T``),
    and the chunk attends to the first ``total`` entries, masked by ``bias``.

    ``forward`` is the same computation in PyTorch (for tracing and for a reader); the
    exporter emits ``symbolic``.
    """

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,  # (1, T, nh*hd), after RoPE
        k: torch.Tensor,  # (1, T, n_kv*hd), after RoPE
        v: torch.Tensor,  # (1, T, n_kv*hd)
        past_k: torch.Tensor,  # (1, n_kv, C, hd)
        past_v: torch.Tensor,
        seqlens_k: torch.Tensor,  # (1,) int32: total - 1
        total: torch.Tensor,  # () int32
        bias: torch.Tensor,  # (1, 1, T, total)
        n_head: int,
        n_kv: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        T, nkv, hd = q.shape[1], n_kv, past_k.shape[-1]
        S = int(total) - T
        present_k, present_v = past_k.clone(), past_v.clone()
        present_k[0, :, S : S + T] = k[0].view(T, nkv, hd).transpose(0, 1)
        present_v[0, :, S : S + T] = v[0].view(T, nkv, hd).transpose(0, 1)
        keys, values = present_k[0, :, : S + T], present_v[0, :, : S + T]
        y = grouped_attention(q, keys, values, bias[0, 0], n_head, nkv)
        return y, present_k, present_v

    @staticmethod
    def symbolic(
        g: Any,
        q: Any,
        k: Any,
        v: Any,
        past_k: Any,
        past_v: Any,
        seqlens_k: Any,
        total: Any,
        bias: Any,
        n_head: int,
        n_kv: int,
    ) -> Any:
        none = g.op("prim::Constant")  # an absent optional input ("" in the ONNX node)
        none.setType(torch._C.OptionalType.ofTensor())
        y, present_k, present_v = g.op(
            "com.microsoft::GroupQueryAttention",
            *(q, k, v, past_k, past_v, seqlens_k, total),
            *(none, none, none),  # cos_cache, sin_cache, position_ids: RoPE is applied above
            bias,
            num_heads_i=n_head,
            kv_num_heads_i=n_kv,
            causal_i=0,  # the pattern is all in `bias`
            outputs=3,
        )
        y.setType(q.type())
        present_k.setType(past_k.type())
        present_v.setType(past_v.type())
        return y, present_k, present_v


def _split_rotated(
    qkv: torch.Tensor,  # (1, T, (nh + 2 nkv) hd), before RoPE
    rope: tuple[torch.Tensor, torch.Tensor],  # cos, sin (1, 1, T, hd) at the chunk's positions
    nh: int,
    nkv: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v of a packed product, q and k rotated (each (1, T, heads hd)): what the
    fused node does with ``do_rotary``. The head size comes from ``rope``, never from a
    cache buffer (the buffers go only to the node)."""
    T, hd = qkv.shape[1], rope[0].shape[-1]
    q, k, v = torch.split(qkv, [nh * hd, nkv * hd, nkv * hd], dim=-1)
    q = apply_rope(q.view(1, T, nh, hd).transpose(1, 2), *rope).transpose(1, 2)
    k = apply_rope(k.view(1, T, nkv, hd).transpose(1, 2), *rope).transpose(1, 2)
    return q.reshape(1, T, nh * hd), k.reshape(1, T, nkv * hd), v


def _rotated_attention(
    qkv: torch.Tensor,
    pk: torch.Tensor,
    pv: torch.Tensor,
    lens: tuple[torch.Tensor, torch.Tensor],
    rope: tuple[torch.Tensor, torch.Tensor],
    bias: torch.Tensor,  # (T, total)
    nh: int,
    nkv: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fused node on packed q, k and v with RoPE applied before it (head sizes the
    node cannot rotate)."""
    q, k, v = _split_rotated(qkv, rope, nh, nkv)
    return GroupQueryAttention.apply(  # type: ignore[no-untyped-call,no-any-return]
        q, k, v, pk, pv, *lens, bias[None, None], nh, nkv
    )


def rope_tables(cfg: LlamaConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused node's cos / sin tables ``(max_seq_len, hd / 2)``, fp32, computed in
    float64 and rounded once. In fp32 an angle at position 8191 carries ~5e-4 rad of
    rounding, and which vector path PyTorch took decided it: two exports of the same
    code differed by 1.5e-4 in one table, enough to move int8 prefills' top tokens."""
    pos = torch.arange(cfg.max_seq_len, dtype=torch.float64)
    inv_freq = cfg.rope_theta ** -(
        torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim
    )
    angle = pos[:, None] * inv_freq  # (positions, hd / 2)
    return angle.cos().float(), angle.sin().float()


def _packed_linear(*parts: nn.Linear) -> nn.Linear:
    """One linear layer whose outputs are ``parts``' outputs end to end."""
    w = torch.cat([p.weight.detach() for p in parts])
    biased = any(p.bias is not None for p in parts)  # Qwen2's q, k, v
    out = nn.Linear(w.shape[1], w.shape[0], bias=biased, device=w.device, dtype=w.dtype)
    out.weight = nn.Parameter(w.clone(), requires_grad=False)
    if biased:
        b = [p.bias.detach() if p.bias is not None else w.new_zeros(p.out_features) for p in parts]
        out.bias = nn.Parameter(torch.cat(b).clone(), requires_grad=False)
    return out


class PackedAttention(torch.autograd.Function):
    """:class:`GroupQueryAttention` on q, k and v packed in one tensor, rotated inside
    the node (``do_rotary`` with the graph's cos / sin tables at ``position_ids``)."""

    @staticmethod
    def forward(
        ctx: Any,
        qkv: torch.Tensor,  # (1, T, (nh + 2 n_kv) hd), before RoPE
        past_k: torch.Tensor,  # (1, n_kv, C, hd)
        past_v: torch.Tensor,
        seqlens_k: torch.Tensor,  # (1,) int32: total - 1
        total: torch.Tensor,  # () int32
        cos: torch.Tensor,  # (positions, hd / 2)
        sin: torch.Tensor,
        position_ids: torch.Tensor,  # (1, T) int64
        bias: torch.Tensor,  # (1, 1, T, total)
        n_head: int,
        n_kv: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        at = position_ids[0]
        rope = torch.cat([cos, cos], -1)[at][None, None], torch.cat([sin, sin], -1)[at][None, None]
        q, k, v = _split_rotated(qkv, rope, n_head, n_kv)
        return GroupQueryAttention.forward(
            ctx, q, k, v, past_k, past_v, seqlens_k, total, bias, n_head, n_kv
        )

    @staticmethod
    def symbolic(
        g: Any,
        qkv: Any,
        past_k: Any,
        past_v: Any,
        seqlens_k: Any,
        total: Any,
        cos: Any,
        sin: Any,
        position_ids: Any,
        bias: Any,
        n_head: int,
        n_kv: int,
    ) -> Any:
        none = g.op("prim::Constant")  # key and value: packed into the query
        none.setType(torch._C.OptionalType.ofTensor())
        y, present_k, present_v = g.op(
            "com.microsoft::GroupQueryAttention",
            *(qkv, none, none, past_k, past_v, seqlens_k, total),
            *(cos, sin, position_ids, bias),
            num_heads_i=n_head,
            kv_num_heads_i=n_kv,
            causal_i=0,  # the pattern is all in `bias`
            do_rotary_i=1,
            rotary_interleaved_i=0,  # rotate_half, as the Llama
            outputs=3,
        )
        hd = past_k.type().varyingSizes()[-1]
        y.setType(qkv.type().with_sizes([1, None, None if hd is None else n_head * hd]))
        present_k.setType(past_k.type())
        present_v.setType(past_v.type())
        return y, present_k, present_v


def cache_buffer_shape(cfg: LlamaConfig, capacity: int) -> tuple[int, int, int, int]:
    return (1, cfg.n_kv_head, capacity, cfg.head_dim)


def example_inputs(model: Llama, T: int = 3, P: int = 2, C: int = 8) -> tuple[torch.Tensor, ...]:
    cfg = model.config
    buffers = [
        torch.zeros(cache_buffer_shape(cfg, C), dtype=model.dtype) for _ in range(2 * cfg.n_layer)
    ]
    return (
        torch.zeros(T, dtype=torch.long),
        torch.arange(P, P + T),
        torch.tensor(P),
        torch.tensor(False),
        torch.arange(T),
        *buffers,
    )


# -- several replies in one pass -------------------------------------------------------

BATCH_INPUTS = ["input_ids", "positions", "lengths", "past_lengths", "blocks", "logit_rows"]


def row_cache_names(n_layer: int, rows: int, prefix: str) -> list[str]:
    """``<prefix>_key_<layer>_<row>``, ...: each row's own per-layer buffers."""
    return [f"{name}_{row}" for row in range(rows) for name in cache_names(n_layer, prefix)]


def batch_input_names(n_layer: int, rows: int) -> list[str]:
    return [*BATCH_INPUTS, *row_cache_names(n_layer, rows, "past")]


def batch_output_names(n_layer: int, rows: int) -> list[str]:
    return ["logits", *row_cache_names(n_layer, rows, "present")]


def batch_dynamic_axes(n_layer: int, rows: int) -> dict[str, dict[int, str]]:
    axes = {
        "input_ids": {0: "N"},
        "positions": {0: "N"},
        "logit_rows": {0: "K"},
        "logits": {0: "K"},
    }
    for row in range(rows):  # each row's cache has its own capacity
        for prefix in ("past", "present"):
            for name in cache_names(n_layer, prefix):
                axes[f"{name}_{row}"] = {2: f"C_{row}"}
    return axes


class BatchGraph(StepGraph):
    """``rows`` replies' steps in one pass, packed: no padding.

    The chunks of every row lie end to end in ``input_ids`` and ``positions`` (N,);
    ``lengths`` (B,) says how many tokens each row has (>= 1), ``past_lengths`` (B,)
    each row's S, ``blocks`` (B,) bool each row's attention (as ``block``). Every row
    has its own cache buffers (``past_key_<l>_<b>``), bound to its reply's cache, so a
    reply's cache never moves. The projections and the MLP run once over all N tokens
    (where batching pays: their weights are read once per pass, not once per reply);
    attention runs per row, the same fused node :class:`StepGraph` runs, on the row's
    own buffers (the fused node on the CPU files, :func:`plain_attention` on the GPU's).
    ``logit_rows`` index the packed tokens. A row's logits are what
    :class:`StepGraph` gives for its chunk alone: the projections are per token, and
    the int8 kernel scales activations per token (docs/export.md).
    """

    def __init__(self, model: Llama, rows: int, attention: Attention = "fused") -> None:
        super().__init__(model, attention)
        self.rows = rows

    def forward(  # type: ignore[override]
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        lengths: torch.Tensor,
        past_lengths: torch.Tensor,
        blocks: torch.Tensor,
        logit_rows: torch.Tensor,
        *past: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        cfg, B, L = self.cfg, self.rows, self.cfg.n_layer
        N = input_ids.shape[0]
        x = self.embed_t.index_select(1, input_ids).t()[None]  # (1, N, C)
        ends = torch.cumsum(lengths, 0)
        spans = []  # per row: its token indices, and the fused node's lengths and mask
        for b in range(B):
            T, S = lengths[b], past_lengths[b]
            # A row with no step (T = 0) attends one stand-in token, another row's, whose
            # key and value land past its cache's end and whose output is dropped: it
            # costs one token's attention and nothing of the products
            Tq = torch.clamp(T, min=1)
            start = ends[b] - T
            at = torch.arange(start, start + Tq, device=x.device)  # type: ignore[call-overload]
            at = torch.clamp(at, max=N - 1)
            total = S + Tq
            # fused: the row's first S+T entries; plain: its buffer's whole capacity
            span = total if self.attention == "fused" else past[2 * b * L].shape[2]
            i = torch.arange(Tq, device=x.device)[:, None]  # type: ignore[call-overload]
            j = torch.arange(span, device=x.device)[None, :]  # type: ignore[arg-type]
            allowed = ((j <= i + S) | blocks[b]) & (j < total)
            bias = torch.zeros(allowed.shape, dtype=x.dtype).masked_fill(~allowed, float("-inf"))
            lens = (total.to(torch.int32) - 1).reshape(1), total.to(torch.int32)
            spans.append((at, S, lens, bias))
        present: list[list[torch.Tensor]] = [[] for _ in range(B)]
        # the rows' attention outputs end to end, less the idle rows' stand-ins: one
        # gather a layer (a slice a row cost 240 nodes a pass)
        real = [
            torch.arange(s[0].shape[0], device=x.device) < lengths[b] for b, s in enumerate(spans)
        ]
        keep = torch.cat(real).nonzero()[:, 0]
        if self.attention == "fused":
            rows = [(at, positions.index_select(0, at), lens, bias) for at, _, lens, bias in spans]
            for layer in range(L):
                bufs = tuple(
                    t for b in range(B) for t in past[2 * (b * L + layer) : 2 * (b * L + layer) + 2]
                )
                x, kv = self.packed_layer(layer, x, rows, bufs, keep)
                for b in range(B):
                    present[b] += kv[2 * b : 2 * b + 2]
        else:
            rope = rope_cos_sin(positions[None], cfg.head_dim, cfg.rope_theta, x.dtype)
            for layer, blk in enumerate(self.blocks):
                a: Any = blk.attn
                h = blk.attn_norm(x)  # type: ignore[operator]
                q = apply_rope(a.q_proj(h).view(1, N, a.nh, a.hd).transpose(1, 2), *rope)
                k = apply_rope(a.k_proj(h).view(1, N, a.nkv, a.hd).transpose(1, 2), *rope)
                q = q.transpose(1, 2).reshape(1, N, a.nh * a.hd)
                k = k.transpose(1, 2).reshape(1, N, a.nkv * a.hd)
                v = a.v_proj(h)
                ys = []
                for b, (at, S, _, bias) in enumerate(spans):
                    pk, pv = past[2 * (b * L + layer)], past[2 * (b * L + layer) + 1]
                    qkv = q.index_select(1, at), k.index_select(1, at), v.index_select(1, at)
                    y, pk, pv = plain_attention(*qkv, pk, pv, S, bias, a.nh, a.nkv)
                    ys.append(y)
                    present[b] += [pk, pv]
                x = x + a.o_proj(torch.cat(ys, 1).index_select(1, keep))
                x = x + blk.mlp(blk.mlp_norm(x))  # type: ignore[operator]
        y = self.norm(x[0].index_select(0, logit_rows))
        logits = (y @ self.embed_t)[:, : cfg.vocab_size] if self.head is None else self.head(y)
        return (logits.float(), *(t for row in present for t in row))


def batch_example_inputs(model: Llama, rows: int, C: int = 8) -> tuple[torch.Tensor, ...]:
    """Rows of different lengths and pasts, so nothing traces as a constant."""
    cfg = model.config
    lengths = torch.tensor([1 + b % 3 if b < rows - 1 else 0 for b in range(rows)])  # one idle
    past = torch.tensor([b % 4 for b in range(rows)])
    spans = zip(past.tolist(), lengths.tolist(), strict=True)
    positions = torch.cat([torch.arange(p, p + t) for p, t in spans])
    buffers = [
        torch.zeros(cache_buffer_shape(cfg, C), dtype=model.dtype)
        for _ in range(2 * cfg.n_layer * rows)
    ]
    return (
        torch.zeros(int(lengths.sum()), dtype=torch.long),
        positions,
        lengths,
        past,
        torch.tensor([b % 2 == 1 for b in range(rows)]),
        torch.arange(int(lengths.sum())),
        *buffers,
    )
