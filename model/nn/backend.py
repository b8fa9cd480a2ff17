"""The PyTorch Llama behind the :class:`model.backend.StepBackend` protocol.

Training, tests and the parity checks run decoders on it; serving runs the same decoders
on ONNX Runtime (:mod:`model.runtime`) and never imports this module.
"""

from __future__ import annotations

import numpy as np
import torch
from numpy.typing import NDArray

from model.backend import Attend, Logits, Rows
from model.nn.llama import KVCache, Llama


class TorchBackend:
    """The PyTorch Llama behind the :class:`StepBackend` protocol (batch 1), on whatever
    device its weights are (a CUDA host runs LLaDA / Dream checkpoints through it)."""

    def __init__(self, model: Llama, max_len: int = 2048, name: str = "torch") -> None:
        self.model = model
        self.name = name
        self.vocab_size = int(model.config.vocab_size)
        self.max_len = max_len

    def new_cache(self) -> KVCache:
        with torch.inference_mode():
            return self.model.new_cache(1, self.max_len)

    def cache_length(self, cache: KVCache) -> int:
        return int(cache.length)

    def truncate(self, cache: KVCache, length: int) -> None:
        if not 0 <= length <= cache.length:
            raise ValueError(f"cannot truncate a cache of {cache.length} to {length}")
        cache.length = length

    def step(
        self,
        cache: KVCache,
        ids: NDArray[np.int64],
        attend: Attend,
        commit: bool,
        rows: Rows = None,
    ) -> Logits:
        mask = "causal" if attend == "causal" else "full"
        device = self.model.tok_emb.weight.device
        with torch.inference_mode():
            x = torch.as_tensor(np.asarray(ids, dtype=np.int64), device=device)[None]  # (1, T)
            logits = self.model(x, cache=cache, mask=mask, commit=commit, rows=rows)
        out: Logits = logits[0].float().cpu().numpy()  # (K, V)
        return out
