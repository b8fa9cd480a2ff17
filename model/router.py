"""Which call a command asks for: a linear probe on the reply model's own state.

The tools adapter decides *whether* to act well (its first reply token is a call's for
230 of 240 held-out commands and for none of 86 chat questions), but it picks the tool
by decoding the tool's name one masked position at a time, and on phrasings unlike its
training it picks wrong for a third of the commands ("let's go to the stadium" ->
``media.next``), and the same for a call's fixed parts ("make it quieter" ->
``volume.set {level: 10}``). The prefill's last row, which the decision already reads,
holds what the model understood of the request: a multinomial logistic regression on it
(fitted by ``quicksilver router``, ``training/router.py``) decides whether to act
where it is sure, a second one on the same features names the tool, and a third that
tool's call *shape* (``model.tools.shape_name``: the parameters present, each boolean
or enum value, e.g. ``volume.set(change=down)``); the model then writes the free values.

The probe is fitted on the model's final hidden state, recovered from the logits by
least squares (the head is the tied embedding, so the logits are a fixed linear map of
it); the map and the standardisation are folded into one matrix over the logits, so
routing is one product of the ``(V,)`` row with a ``(V, K)`` matrix (~0.3 ms) and no
extra pass. The file belongs to one adapter: it records the adapter's weights digest,
and a model directory built from another adapter gets no router (:func:`find_router`).

Beside the probe, a *word expert* (:class:`WordExpert`) reads the user's words
themselves: bag-of-words logistic regressions for act or speak, the tool and the
shape, their scores added to the probe's (a product of the two experts). The two fail on different
requests: the state of a 135M model blurs phrasings unlike its training ("bring the
cabin to 23 degrees" -> ``navigation.start``) where one word says the tool, and the
words miss what only the sentence says ("go to the next one" is not a destination). It
reads only the request, so it is the same after earlier turns, where the state drifts.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
from numpy.typing import NDArray

from model.modeldir import CHAT_ADAPTER, SHIPPED_ADAPTER, read_manifest

log = logging.getLogger("quicksilver")

ROUTER_FILE = "router.npz"
# the act-or-speak classifier's columns (the first two, when the router has them)
SPEAK, ACT = "(speak)", "(act)"
SURE = 3.0  # log-odds: the act classifier decides above probability 0.95 either way
# where a model directory's router is looked for: beside the shipped adapters
ADAPTER_DIRS = (SHIPPED_ADAPTER, CHAT_ADAPTER)
# the files fitted on the rows graphs' states (export/rows_graph.py), in each place
ROWS_DIR = "rows"


def fitted_places(places: Sequence[Path], rows: bool) -> list[Path]:
    """Where fitted files are looked for: ``places``, or their :data:`ROWS_DIR` for a
    model served on the rows graphs (their prompt states differ a little from the
    blockwise files', enough to move a few near-tie calls: a probe is fitted on the
    states it reads)."""
    return [p / ROWS_DIR for p in places] if rows else list(places)


_WORD = re.compile(r"[a-z']+")


def word_set(text: str) -> set[str]:
    """The words of a request as the word expert reads them: lower case, letters and
    apostrophes (numbers are read by ``model/spoken.py``, not here), each once."""
    return set(_WORD.findall(text.lower()))


@dataclass(frozen=True)
class WordExpert:
    """Scores over the router's columns from which words a request has: linear models
    on their presence (act or speak; the tool; the shape), each scaled by the weight it
    was chosen to have beside the state probe (act or speak zero where the state
    decides alone)."""

    words: tuple[str, ...]
    weights: NDArray[np.float32]  # (W, K): one row per word, the router's columns
    bias: NDArray[np.float32]  # (K,)

    @cached_property
    def _index(self) -> dict[str, int]:
        return {w: i for i, w in enumerate(self.words)}

    def scores(self, text: str) -> NDArray[np.float32]:
        rows = [self._index[w] for w in word_set(text) if w in self._index]
        out: NDArray[np.float32] = self.bias + self.weights[rows].sum(0)
        return out


@dataclass(frozen=True)
class ToolRouter:
    # one per column: act or speak (``(speak)``, ``(act)``), each tool it tells apart
    # (``timer.set``), then each call shape (``timer.set(seconds)``): three classifiers
    # over the same features
    names: tuple[str, ...]
    weights: NDArray[np.float32]  # (V, K): over the prefill's last-row logits
    bias: NDArray[np.float32]  # (K,)
    adapter_sha256: str  # the adapter whose model it reads
    info: dict[str, Any]  # how it was fitted and how well it did (held-out accuracy)
    words: WordExpert | None = field(default=None, compare=False)  # reads the request

    def scores(self, logits: NDArray[np.float32], text: str | None = None) -> NDArray[np.float32]:
        """One score per column for a prefill's last-row logits ``(V,)``; with the
        request's ``text``, the word expert's scores added, where the router has one."""
        out: NDArray[np.float32] = logits.astype(np.float32) @ self.weights + self.bias
        if text is not None and self.words is not None:
            out = out + self.words.scores(text)
        return out

    @property
    def tools(self) -> list[str]:
        """The tools it tells apart (its tool classifier's columns)."""
        return [n for n in self.names if "(" not in n]

    @property
    def shapes(self) -> list[str]:
        """The call shapes it tells apart (its shape classifier's columns)."""
        return [n for n in self.names if "(" in n and n not in (SPEAK, ACT)]

    def knows(self, shapes: Sequence[str]) -> bool:
        """The session's tools are among the ones it was fitted on, each with every
        shape it knows for it (a tool of the same name with another schema is another
        tool). A session with a part of them lists fewer in its system prompt, and the
        state moves with the prompt, but the probe still reads it: with each command's
        own tool alone it chose right where the model's first token spoke
        (docs/actions.md, "Sessions with some of the tools")."""
        session = {tool_of(s) for s in shapes}
        if not session or not session <= set(self.tools):
            return False
        return {s for s in self.shapes if tool_of(s) in session} <= set(shapes)

    def absent(
        self, logits: NDArray[np.float32], shapes: Sequence[str], text: str | None = None
    ) -> str | None:
        """The tool a request asks for, when it is one the router knows and the session
        lacks (``shapes``: the session's): the nearest of the session's tools is no
        answer to it ("I need a timer" in a session without ``timer.set`` was
        ``timer.cancel``). None when the best tool is the session's."""
        scores = dict(zip(self.names, self.scores(logits, text).tolist(), strict=True))
        tool = max(self.tools, key=scores.__getitem__)
        return None if tool in {tool_of(s) for s in shapes} else tool

    def acts(self, logits: NDArray[np.float32], text: str | None = None) -> bool | None:
        """Whether the request asks for an action, when the router is sure either way
        (probability above 0.95); None when it is not, or has no act classifier: the
        model's first token then decides. Fitted on turns alone and after earlier turns,
        it holds inside a session better than the model's first token, which acts on
        chat there (docs/training.md, "Conversations"). With the request's ``text``, the
        word expert's act-or-speak scores join the state's: the words of "Set a timer
        for ten minutes." or "Good night." are the same after any earlier turn, where
        the state drifts (docs/actions.md)."""
        margin = self.margin(logits, text)
        return None if margin is None or abs(margin) < SURE else margin > 0

    def margin(self, logits: NDArray[np.float32], text: str | None = None) -> float | None:
        """The log-odds of acting (the act classifier's, with the words' where given);
        None when the router has no act classifier."""
        if self.names[:2] != (SPEAK, ACT):
            return None
        speak, act = self.scores(logits, text)[:2]
        return float(act - speak)

    def choose(
        self,
        logits: NDArray[np.float32],
        shapes: Sequence[str],
        fits: Collection[str] | None = None,
        text: str | None = None,
    ) -> str | None:
        """The shape, among the session's (``model.actions.shape_names``), the request
        asks for: the best tool first, then that tool's best shape (the tool classifier
        generalises better than picking among every shape at once: 0.91 against 0.87 of
        held-out tools). None when a session tool is not one the router knows, or has no
        shape it knows (it cannot weigh that tool, so the model decides). ``fits``: the
        shapes that fit what the user said (``model.actions.said_shapes``): the tool's
        best shape among them, when it has any there. ``text``: the request, which the
        word expert reads with the state."""
        if not self.knows(shapes):
            return None
        tools, session = {tool_of(s) for s in shapes}, set(shapes)
        scores = self.scores(logits, text)

        def best(columns: list[int]) -> str:
            return self.names[max(columns, key=lambda i: float(scores[i]))]

        tool = best([i for i, n in enumerate(self.names) if n in tools])
        own = [i for i, n in enumerate(self.names) if n in session and tool_of(n) == tool]
        fitting = [i for i in own if fits is None or self.names[i] in fits]
        return best(fitting or own)

    def save(self, path: Path) -> None:
        arrays: dict[str, Any] = {
            "names": np.array(self.names),
            "weights": self.weights.astype(np.float16),  # 2.7 MB; scores move by < 1e-3
            "bias": self.bias.astype(np.float32),
            "adapter_sha256": np.array(self.adapter_sha256),
            "info": np.array(json.dumps(self.info)),
        }
        if self.words is not None:
            arrays["words"] = np.array(self.words.words)
            arrays["word_weights"] = self.words.weights.astype(np.float32)
            arrays["word_bias"] = self.words.bias.astype(np.float32)
        np.savez_compressed(path, **arrays)

    @classmethod
    def load(cls, path: Path) -> ToolRouter:
        with np.load(path, allow_pickle=False) as z:
            words = None
            if "words" in z.files:
                words = WordExpert(
                    tuple(str(w) for w in z["words"]),
                    z["word_weights"].astype(np.float32),
                    z["word_bias"].astype(np.float32),
                )
            return cls(
                names=tuple(str(n) for n in z["names"]),
                weights=z["weights"].astype(np.float32),
                bias=z["bias"].astype(np.float32),
                adapter_sha256=str(z["adapter_sha256"]),
                info=json.loads(str(z["info"])),
                words=words,
            )


def tool_of(shape: str) -> str:
    """``volume.set(change=down)`` -> ``volume.set``."""
    return shape.split("(", 1)[0]


def model_adapter_sha256(model_dir: Path) -> str | None:
    """The weights digest of the adapter merged into ``model_dir`` (None: the base)."""
    adapter = (read_manifest(model_dir).get("source") or {}).get("adapter") or {}
    sha = (adapter.get("weights") or {}).get("sha256")
    return str(sha) if sha else None


class _Fitted(Protocol):
    """What is fitted for one adapter and read over its logits (a router, pointers)."""

    @property
    def adapter_sha256(self) -> str: ...

    @property
    def weights(self) -> NDArray[np.float32]: ...


Fitted = TypeVar("Fitted", bound=_Fitted)


def find_fitted(
    model_dir: Path,
    file: str,
    load: Callable[[Path], Fitted],
    places: Sequence[Path] = ADAPTER_DIRS,
    vocab: int | None = None,
) -> Fitted | None:
    """The first ``file`` in ``places`` fitted for the adapter merged into
    ``model_dir`` (it names that adapter's weights digest); None when there is none.
    ``vocab``: the logits' width, checked."""
    sha = model_adapter_sha256(model_dir)
    if sha is None:
        return None
    for place in places:
        path = place / file
        if not path.is_file():
            continue
        found = load(path)
        if found.adapter_sha256 != sha:
            log.info("%s is for another adapter (%s); not used", path, sha[:12])
            continue
        if vocab is not None and found.weights.shape[0] != vocab:
            width = found.weights.shape[0]
            raise ValueError(f"{path} reads {width} logits; the model writes {vocab}")
        return found
    return None


def find_router(
    model_dir: Path,
    places: Sequence[Path] = ADAPTER_DIRS,
    vocab: int | None = None,
    rows: bool = False,
) -> ToolRouter | None:
    """The router fitted for the adapter merged into ``model_dir``: the first
    ``router.npz`` in ``places`` that names that adapter's weights; None when there is
    none (the model then names the tool itself). ``vocab``: the logits' width, checked;
    ``rows``: the one fitted on the rows graphs (:func:`fitted_places`)."""
    places = fitted_places(places, rows)
    return find_fitted(model_dir, ROUTER_FILE, ToolRouter.load, places, vocab)
