"""4-bit weights chosen with GPTQ (Frantar et al. 2022, arXiv:2210.17323).

Rounding each weight to the nearest of its block's 16 levels (RTN) moves the served
model's logits far from fp32's (prefill top-1 0.77, greedy token agreement 0.22:
docs/results/2026-12-four-bit.md). GPTQ rounds one input column of a layer at a time
and spreads each column's rounding error over the columns not yet rounded, weighted by
the inverse Hessian ``H = 2 X X^T`` of the layer's inputs ``X`` on calibration text, so
the layer's *outputs* stay close on the inputs it meets rather than each weight on its
own. Blocks are quantised in order through the model, each block's inputs computed by
the blocks before it as already quantised.

The result is a table of codes, scales and zero points per weight in MatMulNBits'
layout (asymmetric, blocks of 32 along K, a 4-bit zero point a block), keyed by the
fp32 weight's bytes as the ONNX file holds them (``K x N``), so the same table fills
the one-reply and the batched graph (:func:`apply_table`); ORT's quantiser writes the
graph and this module only replaces its initializers.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import random
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import onnx
import torch
from numpy.typing import NDArray
from onnx import helper, numpy_helper
from torch import nn

from model.chat import SPOKEN_SYSTEM_PROMPT, build_prompt
from model.engine import ChatMessage
from model.modeldir import PRODUCT_KINDS
from model.nn.diffusion import embedding_with_mask_row
from model.nn.llama import Block, Llama, rope_cos_sin
from model.tokenizer import Tokenizer

log = logging.getLogger(__name__)

# The training sets of the adapters (never their held-out lines): chat turns under the
# spoken prompt, commands and chat under the tools prompt, as the server builds them.
DATA_DIR = Path(__file__).resolve().parents[1] / "data"
CALIBRATION_FILES = (DATA_DIR / "distill" / "train.jsonl", DATA_DIR / "actions" / "train.jsonl")
MAX_TOKENS = 512  # a calibration sequence's length at most
LEVELS = 15  # 4 bits: codes 0..15
DAMP = 0.01  # of the mean diagonal, added to H (GPTQ's default)
LAZY = 128  # columns updated together (GPTQ's lazy batch)
SHRINK = tuple(1 - 0.02 * i for i in range(13))  # a block's range, shrunk by up to 24%


@dataclass(frozen=True)
class Quantised:
    """One weight ``(N, K)`` at 4 bits: ``codes`` (N, K) in 0..15, ``scales`` and
    ``zeros`` (N, K / block); the weight is ``scales * (codes - zeros)`` blockwise."""

    codes: NDArray[np.uint8]
    scales: NDArray[np.float32]
    zeros: NDArray[np.uint8]

    def dequantised(self, block: int) -> NDArray[np.float32]:
        s = np.repeat(self.scales, block, axis=1)
        z = np.repeat(self.zeros, block, axis=1).astype(np.float32)
        return (s * (self.codes.astype(np.float32) - z)).astype(np.float32)


Table = dict[str, Quantised]  # weight_key(K x N fp32 array) -> its 4-bit form


def weight_key(kn: NDArray[np.float32]) -> str:
    """The key of an ONNX weight initializer (``K x N``, fp32) in a :data:`Table`."""
    a = np.ascontiguousarray(kn, dtype=np.float32)
    return hashlib.sha256(a.tobytes() + repr(a.shape).encode()).hexdigest()


# ---------------------------------------------------------------- calibration text


def calibration_ids(tok: Tokenizer, n: int, seed: int = 0) -> list[list[int]]:
    """``n`` prompts with their trained replies from the adapters' training sets, drawn
    evenly from both files (seeded); only the drawn lines are tokenized."""
    rng = random.Random(seed)
    per_file = [_lines(path) for path in CALIBRATION_FILES]
    for lines in per_file:
        rng.shuffle(lines)
    out: list[list[int]] = []
    while len(out) < n and any(per_file):
        for lines in per_file:
            if lines and len(out) < n:
                out.append(_sequence(tok, lines.pop()))
    if not out:
        raise FileNotFoundError(f"no calibration text in {[str(p) for p in CALIBRATION_FILES]}")
    return out


def _lines(path: Path) -> list[str]:
    if not path.is_file():
        raise FileNotFoundError(f"GPTQ's calibration text {path} is missing (the repo has it)")
    return path.read_text().splitlines()


def _sequence(tok: Tokenizer, line: str) -> list[int]:
    """One training example's prompt, as the server builds it, and its reply."""
    e = json.loads(line)
    system = e.get("system") or SPOKEN_SYSTEM_PROMPT
    prompt = build_prompt(tok, [ChatMessage("user", e["question"])], 1024, system)
    # the reply's text, not its stored ids: any tokenizer (the tests' byte-level one)
    reply = tok.encode(e["reply"]) + ([tok.im_end_id] if e.get("ended") else [])
    return (prompt + reply)[:MAX_TOKENS]


# ---------------------------------------------------------------- GPTQ


def _grid(w: torch.Tensor, search: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero point of each row of a block ``(N, block)``: its range with 0 in
    it (the zero point is a code), as MatMulNBits' own quantiser takes it; with
    ``search``, the range shrunk by whichever of :data:`SHRINK` rounds the row with the
    least squared error (an outlier's level given back to the other 31 weights)."""
    lo = w.min(dim=1).values.clamp(max=0)
    hi = w.max(dim=1).values.clamp(min=0)
    best: tuple[torch.Tensor, torch.Tensor] | None = None
    least = torch.full_like(lo, float("inf"))
    for f in SHRINK if search else (1.0,):
        scale, zero = _levels(lo * f, hi * f)
        q = torch.round(w / scale[:, None] + zero[:, None]).clamp(0, LEVELS)
        err = (scale[:, None] * (q - zero[:, None]) - w).square().sum(dim=1)
        if best is None:
            best, least = (scale, zero), err
            continue
        better = err < least
        best = (torch.where(better, scale, best[0]), torch.where(better, zero, best[1]))
        least = torch.where(better, err, least)
    assert best is not None
    return best


def _levels(lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = (hi - lo) / LEVELS
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return scale, torch.round(-lo / scale).clamp(0, LEVELS)


def gptq(
    weight: torch.Tensor, hessian: torch.Tensor, block: int, order: bool = True, search: bool = True
) -> Quantised:
    """GPTQ of ``weight (N, K)`` given its inputs' ``hessian (K, K)``. Each block of
    ``block`` columns has its grid from the weights as they were (:func:`_grid`); the
    columns are rounded in order of their inputs' energy (``order``, GPTQ's "act
    order": the error of the columns that matter most goes to those that matter
    less), each one's error spread over the columns not yet rounded."""
    W = weight.detach().to(torch.float64).clone()
    N, K = W.shape
    if K % block:
        raise ValueError(f"K={K} is not a multiple of the block {block}")
    H = hessian.to(torch.float64).clone()
    dead = torch.diag(H) == 0  # inputs never seen: any weight does
    H[dead, dead] = 1
    W[:, dead] = 0
    grids = [_grid(W[:, g : g + block], search) for g in range(0, K, block)]
    scales = torch.stack([s for s, _ in grids], dim=1)  # (N, K / block)
    zeros = torch.stack([z for _, z in grids], dim=1)
    perm = torch.argsort(torch.diag(H), descending=True) if order else torch.arange(K)
    W, H = W[:, perm], H[perm][:, perm]
    group = perm // block  # each (permuted) column's grid
    H += DAMP * torch.mean(torch.diag(H)) * torch.eye(K, dtype=H.dtype)
    Hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    codes = torch.zeros(N, K, dtype=torch.uint8)
    for i1 in range(0, K, LAZY):
        i2 = min(i1 + LAZY, K)
        W1, Hinv1 = W[:, i1:i2].clone(), Hinv[i1:i2, i1:i2]
        errors = torch.zeros_like(W1)
        for i in range(i2 - i1):
            scale, zero = scales[:, group[i1 + i]], zeros[:, group[i1 + i]]
            q = torch.round(W1[:, i] / scale + zero).clamp(0, LEVELS)
            codes[:, perm[i1 + i]] = q.to(torch.uint8)
            err = (W1[:, i] - scale * (q - zero)) / Hinv1[i, i]
            W1[:, i:] -= err[:, None] * Hinv1[i, i:][None, :]
            errors[:, i] = err
        W[:, i2:] -= errors @ Hinv[i1:i2, i2:]
    return Quantised(codes.numpy(), scales.to(torch.float32).numpy(), zeros.to(torch.uint8).numpy())


class _Inputs:
    """``H = 2/n sum x x^T`` of one product's inputs, accumulated by a forward hook."""

    def __init__(self, k: int) -> None:
        self.h = torch.zeros(k, k, dtype=torch.float64)
        self.n = 0

    def add(self, x: torch.Tensor) -> None:
        x = x.reshape(-1, x.shape[-1]).to(torch.float64)
        self.h *= self.n / (self.n + len(x))
        self.n += len(x)
        x = x * (2 / self.n) ** 0.5
        self.h += x.T @ x


def _hessians(mods: dict[str, nn.Linear], run: Callable[[], object]) -> dict[str, torch.Tensor]:
    """Each module's input Hessian over the forward passes ``run()`` makes."""
    seen = {name: _Inputs(m.in_features) for name, m in mods.items()}
    hooks = [
        m.register_forward_pre_hook(lambda _m, args, s=seen[name]: s.add(args[0]))
        for name, m in mods.items()
    ]
    try:
        run()
    finally:
        for h in hooks:
            h.remove()
    return {name: s.h for name, s in seen.items()}


# A layer's products as the export packs them (export/graph.py), by their kinds
# (model.modeldir.PRODUCT_KINDS; a 4-bit file keeps WIDE_PRODUCTS at 8 bits): q, k and v
# one product, o, gate and up one, down
PRODUCTS: dict[str, tuple[str, ...]] = dict(
    zip(
        PRODUCT_KINDS,
        (
            ("attn.q_proj", "attn.k_proj", "attn.v_proj"),
            ("attn.o_proj",),
            ("mlp.gate_proj", "mlp.up_proj"),
            ("mlp.down_proj",),
        ),
        strict=True,
    )
)


def product_weight(blk: nn.Module, kind: str) -> torch.Tensor:
    """The (N, K) weight of one of a layer's :data:`PRODUCTS`, its parts stacked."""
    return torch.cat(
        [cast(nn.Linear, blk.get_submodule(n)).weight.detach() for n in PRODUCTS[kind]]
    )


def product_keys(model: Llama, kinds: Collection[str]) -> set[str]:
    """The :func:`weight_key` of every layer's products of ``kinds``, as the fp32 graph's
    MatMuls read them (transposed): how the export finds them among its initializers."""
    return {
        weight_key(product_weight(blk, kind).t().contiguous().float().numpy())
        for blk in model.blocks
        for kind in kinds
    }


def quantise_model(
    model: Llama, seqs: list[list[int]], block: int, head: bool = True, skip: Collection[str] = ()
) -> Table:
    """The :data:`Table` of every product the export quantises: per layer q, k and v
    (one product), o, gate and up (one product) and down, but the :data:`PRODUCTS` in
    ``skip`` (kept at 8 bits: the layers after them see their exact weights), and
    (``head``) the tied head. Each layer's inputs come from the layers before it as
    quantised; ``model`` is left as it was (a copy is quantised)."""
    unknown = set(skip) - PRODUCTS.keys()
    if unknown:
        raise ValueError(f"no such products {sorted(unknown)}: choose from {sorted(PRODUCTS)}")
    model = copy.deepcopy(model).float().eval()
    cfg = model.config
    table: Table = {}
    t0 = time.perf_counter()
    with torch.no_grad():
        xs = [model.tok_emb(torch.tensor([ids])) for ids in seqs]  # each (1, T, C)
        ropes = [
            rope_cos_sin(torch.arange(x.shape[1])[None], cfg.head_dim, cfg.rope_theta, x.dtype)
            for x in xs
        ]
        for i, blk in enumerate(model.blocks):

            def run(
                b: nn.Module = blk, i: int = i, xs: list[torch.Tensor] = xs
            ) -> list[torch.Tensor]:
                return [b(x, r, "causal", None, i, True) for x, r in zip(xs, ropes, strict=True)]

            _quantise_block(table, cast(Block, blk), run, block, skip)
            xs = run()  # through the quantised layer
            log.info("GPTQ: layer %d of %d (%.0f s)", i + 1, cfg.n_layer, time.perf_counter() - t0)
        if not head:
            return table
        inputs = _Inputs(cfg.n_embd)
        for x in xs:
            inputs.add(model.norm(x))
        table_t = embedding_with_mask_row(model).t().contiguous()  # export/graph.py's head
        table[weight_key(table_t.numpy())] = gptq(table_t.t(), inputs.h, block)
    return table


def _quantise_block(
    table: Table, blk: Block, run: Callable[[], object], block: int, skip: Collection[str]
) -> None:
    """A layer's products (those not in ``skip``), each on its inputs' Hessian through
    the layer as it was; the layer then holds the quantised weights."""
    kinds = [k for k in PRODUCTS if k not in skip]
    mods = {k: cast(nn.Linear, blk.get_submodule(PRODUCTS[k][0])) for k in kinds}
    hs = _hessians(mods, run)
    for k in kinds:
        _add(table, [cast(nn.Linear, blk.get_submodule(n)) for n in PRODUCTS[k]], hs[k], block)


def _add(table: Table, parts: list[nn.Linear], hessian: torch.Tensor, block: int) -> None:
    """One product of ``parts`` end to end (as export/graph.py packs them); each part
    then holds its quantised weights, for the layers after it."""
    w = torch.cat([p.weight.detach() for p in parts])  # (N, K)
    q = gptq(w, hessian, block)
    table[weight_key(w.t().contiguous().numpy())] = q
    dq = torch.from_numpy(q.dequantised(block))
    at = 0
    for p in parts:
        p.weight.data = dq[at : at + p.out_features].to(p.weight.dtype).clone()
        at += p.out_features


# ---------------------------------------------------------------- the ONNX file


Packed = tuple[NDArray[np.uint8], NDArray[np.float32], NDArray[np.uint8]]


def pack(q: Quantised, block: int) -> Packed:
    """MatMulNBits' B ``(N, K/block, block/2)``, scales ``(N, K/block)`` and zero points
    ``(N, ceil(K/block / 2))``: two codes a byte, the even one in the low nibble."""
    n, k = q.codes.shape
    c = q.codes.reshape(n, k // block, block // 2, 2)
    b = (c[..., 0] | (c[..., 1] << 4)).astype(np.uint8)
    z = q.zeros
    if z.shape[1] % 2:
        z = np.pad(z, ((0, 0), (0, 1)))
    zp = (z[:, 0::2] | (z[:, 1::2] << 4)).astype(np.uint8)
    return b, q.scales.astype(np.float32), zp


def weight_keys(model: onnx.ModelProto) -> dict[str, str]:
    """The :func:`weight_key` of every MatMul weight of ``model`` (an fp32 graph), by
    initializer name: read before ORT's quantiser replaces those weights."""
    inits = {i.name: i for i in model.graph.initializer}
    names = {n.input[1] for n in model.graph.node if n.op_type == "MatMul"} & inits.keys()
    return {k: weight_key(numpy_helper.to_array(inits[k]).astype(np.float32)) for k in names}


def apply_table(quantised: onnx.ModelProto, keys: dict[str, str], table: Table, block: int) -> None:
    """Replace the 4-bit weights of ``quantised`` (ORT's quantiser's output for the
    fp32 graph whose :func:`weight_keys` are ``keys``) with the table's. Every 4-bit
    product must be in the table: a graph whose weights are not the model's is an
    error."""
    inits = {i.name: i for i in quantised.graph.initializer}
    for node in quantised.graph.node:
        if node.op_type != "MatMulNBits" or helper.get_node_attr_value(node, "bits") != 4:
            continue  # an 8-bit product (the head of a 4-bit file) keeps the quantiser's
        name = node.input[1].removesuffix("_Q4")
        if keys.get(name) not in table:
            raise ValueError(f"GPTQ has no weights for {name} ({node.name})")
        arrays: list[NDArray[Any]] = list(pack(table[keys[name]], block))
        for init, array in zip(node.input[1:4], arrays, strict=True):
            old = inits[init]
            new = numpy_helper.from_array(array.reshape(tuple(old.dims)), init)
            if tuple(new.dims) != tuple(old.dims) or new.data_type != old.data_type:
                raise ValueError(f"{init}: GPTQ's {new.dims} is not the quantiser's {old.dims}")
            old.CopyFrom(new)


def describe(table: Table, seqs: list[list[int]], seconds: float) -> dict[str, Any]:
    """What the manifest says of the GPTQ run."""
    return {
        "method": "gptq",
        "calibration_sequences": len(seqs),
        "calibration_tokens": sum(map(len, seqs)),
        "products": len(table),
        "damp": DAMP,
        "seconds": round(seconds, 1),
    }
