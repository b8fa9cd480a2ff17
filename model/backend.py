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
"""

from __future__ import annotations

import itertools
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
from numpy.typing import NDArray

Attend = Literal["causal", "block"]
Logits = NDArray[np.float32]
Rows = Sequence[int] | NDArray[np.int64] | None


_reply = threading.local()
_replies = itertools.count()


def begin_reply() -> None:
    """Say, from a reply's thread, that a new reply starts there: its listener waits for
    its first sentence (:func:`spoke` ends that). A backend that shares passes between
    replies (``model/batch.py``) runs the steps of replies still silent first, oldest
    reply first; a backend that runs one reply at a time ignores both."""
    _reply.urgent = True
    _reply.order = next(_replies)


def ends_a_turn() -> None:
    """Say, from a thread, that its next steps decide whether a user's turn is over
    (the end-of-turn score, ``server/turn_end.py``): they go before every reply's in a
    shared pass. The listener waits on the turn's end before any reply of it can start,
    and while the score is out the endpointer waits its longest (900 ms); behind eight
    replies' prompt chunks it came too late for 18 of 24 turns (docs/latency.md)."""
    _reply.urgent = True
    _reply.order = -1


# The rank of steps nobody waits on (:func:`in_background`): after every reply's steps
BACKGROUND = (True, sys.maxsize)


def in_background() -> None:
    """Say, from a thread, that nobody waits on its next steps (the next turn's prompt
    prefilled between turns, ``model.prefix.warm``): a backend that shares passes runs
    each of them alone, when no reply's step is waiting (``model/batch.py``)."""
    _reply.urgent = False
    _reply.order = BACKGROUND[1]


def spoke() -> None:
    """The reply of this thread has said its first sentence."""
    _reply.urgent = False


def reply_rank() -> tuple[bool, int]:
    """This thread's reply: (said its first sentence, when it began), lower first."""
    return not getattr(_reply, "urgent", False), int(getattr(_reply, "order", 0))


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
    ) -> Logits:
        """Logits ``(K, V)``, float32, for the ``rows`` of ``ids (T,)`` (ascending chunk
        indices; None: all T). The vocabulary head is a fifth of a 16-token pass, so a
        step asks only for the rows it reads (:func:`last_row`, a block's masked rows)."""
        ...


@dataclass(frozen=True)
class Prefix:
    """A backend cache whose first ``length`` positions hold the prompt's first tokens.
    ``last``: the logits of its last position's row, when the caller already ran it (a
    decoder then goes on from them instead of running that position again)."""

    cache: Any
    length: int
    last: Any = None  # NDArray[np.float32] (V,) or None
