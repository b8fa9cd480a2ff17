"""One forward pass over a chunk of tokens against a KV cache: what every decoder uses.

Greedy autoregressive decoding and the diffusion samplers are written against the
small :class:`StepBackend` protocol, with numpy in and out, so the same decoding code
runs on the PyTorch model (:class:`TorchBackend`: training, tests, the reference) and
on exported models in ONNX Runtime (``model/runtime.py``: serving, no torch).

Positions are implicit: a step's tokens sit right after the cache's committed prefix.
``attend="causal"`` is ordinary left-to-right attention (prompt prefill, one AR
token); ``attend="block"`` lets every token of the chunk see the whole chunk and the
whole prefix (denoising one block of a block-diffusion model, BD3-LM / Fast-dLLM v2).
A step with ``commit=False`` leaves the cache as it was, so a block can be denoised
repeatedly and committed once, when its tokens are final.

The draft (Fast-dLLM's approximate cache, Wu et al. 2025, inside one block): an
uncommitted block step may feed only some of the block, its tokens placed by ``at``
(offsets after the committed prefix), and ``keep`` the keys and values of some of them
in the cache's *draft*. Later block steps attend to the committed prefix, to the draft
entries at offsets they do not feed, and to their own chunk; so a token committed inside
a block is computed once more and then read from the draft. A commit or a truncate
forgets the draft, and the block's commit pass recomputes it exactly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
from numpy.typing import NDArray

Attend = Literal["causal", "block"]
Logits = NDArray[np.float32]
Rows = Sequence[int] | NDArray[np.int64] | None
Offsets = Sequence[int] | NDArray[np.int64] | None


def check_draft_step(
    attend: Attend, commit: bool, n: int, at: Offsets, keep: Rows, drafted: bool
) -> NDArray[np.int64]:
    """The chunk's offsets (``at``, default 0..n-1), after checking that a draft step is
    an uncommitted block step and that a causal step has no draft to ignore."""
    if at is None and keep is None:
        if drafted and attend == "causal":
            raise ValueError("a causal step with a draft pending: commit or truncate first")
        return np.arange(n, dtype=np.int64)
    if commit or attend != "block":
        raise ValueError("at / keep are for uncommitted block steps only")
    offsets = np.arange(n, dtype=np.int64) if at is None else np.asarray(at, np.int64)
    bad = offsets.size and (offsets.min() < 0 or (np.diff(offsets) <= 0).any())
    if offsets.shape != (n,) or bad:
        raise ValueError(f"at must be {n} ascending offsets >= 0, got {offsets.tolist()}")
    return offsets


def unfed_draft(draft: Mapping[int, Any], offsets: NDArray[np.int64]) -> list[int]:
    """The draft entries a step reads: those at offsets it does not feed, in offset
    order (both backends place them right after the committed prefix)."""
    if not draft:
        return []
    fed = set(offsets.tolist())
    return [o for o in sorted(draft) if o not in fed]


def last_row(ids: Sequence[int] | NDArray[np.int64]) -> list[int]:
    """``rows`` for a step that needs only its last token's logits (prefill, AR)."""
    return [len(ids) - 1]


class StepBackend(Protocol):
    name: str
    vocab_size: int  # width of the logits
    max_len: int  # positions a cache can hold

    def new_cache(self) -> Any: ...

    def cache_length(self, cache: Any) -> int: ...

    def truncate(self, cache: Any, length: int) -> None:
        """Forget every committed position from ``length`` on (a rolled-back reply)."""
        ...

    def step(
        self,
        cache: Any,
        ids: NDArray[np.int64],
        attend: Attend,
        commit: bool,
        rows: Rows = None,
        at: Offsets = None,
        keep: Rows = None,
    ) -> Logits:
        """Logits ``(K, V)``, float32, for the ``rows`` of ``ids (T,)`` (ascending chunk
        indices; None: all T). The vocabulary head is a fifth of a 16-token pass, so a
        step asks only for the rows it reads (:func:`last_row`, a block's masked rows).
        ``at``: the tokens' offsets after the committed prefix (None: 0..T-1); ``keep``:
        chunk indices whose keys and values go to the draft (see the module docstring)."""
        ...


@dataclass(frozen=True)
class Prefix:
    """A backend cache whose first ``length`` positions hold the prompt's first tokens.
    ``last``: the logits of its last position's row, when the caller already ran it (a
    decoder then goes on from them instead of running that position again)."""

    cache: Any
    length: int
    last: Any = None  # NDArray[np.float32] (V,) or None
