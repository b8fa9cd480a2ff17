"""The PyTorch Llama behind the :class:`model.backend.StepBackend` protocol.

Training, tests and the parity checks run decoders on it; serving runs the same decoders
on ONNX Runtime (:mod:`model.runtime`) and never imports this module.
"""

from __future__ import annotations

import numpy as np
import torch
from numpy.typing import NDArray

from model.backend import Attend, Logits, Offsets, Rows, check_draft_step, unfed_draft
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
        cache.draft.clear()

    def step(
        self,
        cache: KVCache,
        ids: NDArray[np.int64],
        attend: Attend,
        commit: bool,
        rows: Rows = None,
        at: Offsets = None,
        keep: Rows = None,
    ) -> Logits:
        mask = "causal" if attend == "causal" else "full"
        offsets = check_draft_step(attend, commit, len(ids), at, keep, bool(cache.draft))
        if commit:
            cache.draft.clear()  # the commit pass recomputes the block exactly
        device = self.model.tok_emb.weight.device
        with torch.inference_mode():
            x = torch.as_tensor(np.asarray(ids, dtype=np.int64), device=device)[None]  # (1, T)
            if not cache.draft and at is None and keep is None:
                logits = self.model(x, cache=cache, mask=mask, commit=commit, rows=rows)
                out: Logits = logits[0].float().cpu().numpy()  # (K, V)
                return out
            # The draft entries this chunk does not feed go right after the prefix, the
            # chunk after them (its positions from `at`); the cache's length is put back.
            P = cache.length
            old = unfed_draft(cache.draft, offsets)
            for n, o in enumerate(old):
                cache.k[:, :, :, P + n], cache.v[:, :, :, P + n] = cache.draft[o]
            cache.length = P + len(old)
            pos = torch.as_tensor(P + offsets, device=device)[None]  # (1, T)
            try:
                logits = self.model(x, pos=pos, cache=cache, mask="full", commit=True, rows=rows)
            finally:
                cache.length = P
            start = P + len(old)
            for c in np.asarray([] if keep is None else keep, np.int64).tolist():
                cache.draft[int(offsets[c])] = (
                    cache.k[:, :, :, start + c].clone(),
                    cache.v[:, :, :, start + c].clone(),
                )
            res: Logits = logits[0].float().cpu().numpy()
            return res
