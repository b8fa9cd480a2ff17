"""A call's string arguments pointed at in the user's words: a span probe on the prefill.

A string argument (a destination, a contact, a message text, a reminder's ``when``) is
always a run of the user's own words. The decoder used to write it token by token
(``model/actions._slot``): the first word by one masked position, then go on or close
at each next one. That greedy walk was the largest source of wrong calls: carrier words
copied along ("throw on the news", "I remember to feed the cat"), a word dropped ("the
oven" for "check the oven"), "please" or "now" kept at the end, ``when`` without its
"at" (docs/results/2026-12-router-refit.md).

Span extraction is the classic answer (a start and an end pointer over the words, as in
extractive question answering, Devlin et al. 2019, section 4.2): a linear start score
and a linear end score at each boundary between words, the best span the one whose
start + end score is highest. The features are the reply model's own states at the
user's tokens in the prefill the turn runs anyway (their logits rows, recovered to the
hidden state by least squares as the router does, ``model/router.py``): at a boundary,
the state at the last token before it and at the first token after it (the causal
model has then seen the next word: "the news | now" reads as the end of a query only
once "now" is in). Each string parameter of the default tools has its own pair of
pointers; the projection and the standardisation fold into one ``(V, 4P)`` matrix, so
scoring is one product of the user's rows with it.

Fitted by ``quicksilver spans`` (``training/spans.py``); the file belongs to one
adapter, as the router's does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from model.router import ADAPTER_DIRS, find_fitted, fitted_places
from model.tokenizer import Tokenizer

SPANS_FILE = "spans.npz"
MAX_WORDS = 12  # the longest span pointed at (the longest value in the data: 9 words)
_WORD = re.compile(r"\S+")
_EDGE = ".,!?;:\"'()"  # punctuation a value does not start or end with


def words(text: str) -> list[tuple[int, int]]:
    """Character spans of the whitespace-separated words of ``text``."""
    return [(m.start(), m.end()) for m in _WORD.finditer(text)]


def span_text(text: str, spans: Sequence[tuple[int, int]], i: int, j: int) -> str:
    """Words ``i`` to ``j - 1`` of ``text`` as a value: the user's own characters, with
    the punctuation around them left out ("you," -> "you"), but an abbreviation's last
    dot kept ("at 8 a.m.")."""
    raw = text[spans[i][0] : spans[j - 1][1]]
    value = raw.strip(_EDGE)
    last = raw.rsplit(None, 1)[-1]
    if last.endswith(".") and "." in last.rstrip(".").strip(_EDGE) and value:
        value += "."
    return value


# Courtesy said to the assistant at the end of a span ("remind me to call the dentist,
# please"): never part of a value in data/actions (0 of its 1,723 string arguments end
# so, while 961 of its commands say "please")
_COURTESY = re.compile(r"[\s,]+(?:please|thanks|thank you)[\s.!?]*$", re.I)


def without_courtesy(value: str) -> str:
    """``value`` without a trailing "please", "thanks" or "thank you" (the whole value
    when that is all it is)."""
    return _COURTESY.sub("", value) or value


def find_span(text: str, value: str) -> tuple[int, int] | None:
    """The run of ``text``'s words that is ``value`` (exactly, or else case aside)."""
    spans = words(text)
    runs = [(i, j) for i in range(len(spans)) for j in range(i + 1, len(spans) + 1)]
    for exact in (True, False):
        for i, j in runs:
            got = span_text(text, spans, i, j)
            if got == value if exact else got.lower() == value.lower():
                return i, j
    return None


def boundary_rows(
    offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]
) -> NDArray[np.int64]:
    """For each boundary between words (before the first, ..., after the last: ``len
    (spans) + 1``), the two token rows the pointers read, as indices into the text's
    tokens (``offsets``: each token's character span): the last token before the
    boundary (-1: the token before the text) and the first one after it (``len
    (offsets)``: the token after the text). ``(B, 2)``."""
    starts = np.array([s for s, _ in offsets])
    out = []
    for k in range(len(spans) + 1):
        # the first token that holds a character of word k (a token may open with the space)
        after = (
            len(offsets)
            if k == len(spans)
            else int(np.searchsorted(starts, spans[k][0], "right")) - 1
        )
        if k < len(spans) and offsets[after][1] <= spans[k][0]:
            after += 1  # that token ends before the word: the word starts the next one
        out.append((after - 1, after))
    return np.array(out, np.int64)


@dataclass(frozen=True)
class UserTokens:
    """Where the latest user message's text lies in a prompt."""

    first: int  # the prompt position of the text's first token
    offsets: list[tuple[int, int]]  # each text token's character span in the text

    @property
    def rows(self) -> NDArray[np.int64]:
        """The prompt rows the pointers read: the token before the text, the text's,
        and the one after it (``<|im_end|>``)."""
        return np.arange(self.first - 1, self.first + len(self.offsets) + 1)


def user_tokens(tok: Tokenizer, prompt: Sequence[int], text: str) -> UserTokens | None:
    """The tokens of ``text`` as the last user message of ``prompt`` (ChatML,
    ``model.chat.encode_message``, then the assistant's header); None when the prompt
    does not end so (a message cut to the prompt budget) or the text has no words."""
    head = "user\n"
    body, offsets = tok.encode_plain_offsets(head + text)
    tail = [tok.im_start_id, *body, tok.im_end_id, *tok.encode_plain("\n")]
    tail += [tok.im_start_id, *tok.encode_plain("assistant\n")]
    if len(tail) > len(prompt) or list(prompt[-len(tail) :]) != tail or not words(text):
        return None
    inside = [k for k, (_, end) in enumerate(offsets) if end > len(head)]
    if not inside or inside[0] == 0:
        return None  # "user\n" merged into the text's first token: no row before it
    shift = len(head)
    spans = [(max(a - shift, 0), b - shift) for a, b in (offsets[k] for k in inside)]
    return UserTokens(len(prompt) - len(tail) + 1 + inside[0], spans)


@dataclass(frozen=True)
class SpanPointer:
    # the string parameters it points for, as ``tool.param``
    params: tuple[str, ...]
    # (V, 4P) over logits rows: per parameter, start score from the row before a
    # boundary and from the row after it, then the same two for the end score
    weights: NDArray[np.float32]
    adapter_sha256: str  # the adapter whose model it reads
    info: dict[str, Any]  # how it was fitted and how well it did

    def points(self, tool: str, param: str) -> bool:
        return f"{tool}.{param}" in self.params

    def scores(self, rows: NDArray[np.float32], pairs: NDArray[np.int64]) -> NDArray[np.float32]:
        """Start and end scores ``(P, 2, B)`` at each boundary, from the logits ``rows``
        ``(R, V)`` of the text's tokens with one row before and one after (row 0 is the
        token before the text) and the boundaries' ``pairs`` (:func:`boundary_rows`)."""
        per_row = rows.astype(np.float32) @ self.weights  # (R, 4P)
        # (R, P, start|end, before|after)
        per_row = per_row.reshape(len(rows), len(self.params), 2, 2)
        before, after = per_row[pairs[:, 0] + 1, :, :, 0], per_row[pairs[:, 1] + 1, :, :, 1]
        out: NDArray[np.float32] = np.moveaxis(before + after, 0, -1)  # (P, 2, B)
        return out

    def best(self, scores: NDArray[np.float32], tool: str, param: str) -> tuple[int, int]:
        """The span ``(i, j)`` of words ``i .. j - 1`` whose start + end score is highest
        (at least one word, at most :data:`MAX_WORDS`)."""
        start, end = scores[self.params.index(f"{tool}.{param}")]
        if len(start) < 2:
            raise ValueError("no words to point at")
        total = start[:, None] + end[None, :]  # (B, B): start at i, end at j
        i, j = np.indices(total.shape)
        total = np.where((j > i) & (j - i <= MAX_WORDS), total, -np.inf)
        i_best, j_best = np.unravel_index(int(np.argmax(total)), total.shape)
        return int(i_best), int(j_best)

    def save(self, path: Path) -> None:
        np.savez_compressed(
            path,
            params=np.array(self.params),
            weights=self.weights.astype(np.float16),  # scores move by < 1e-3
            adapter_sha256=np.array(self.adapter_sha256),
            info=np.array(json.dumps(self.info)),
        )

    @classmethod
    def load(cls, path: Path) -> SpanPointer:
        with np.load(path, allow_pickle=False) as z:
            return cls(
                params=tuple(str(n) for n in z["params"]),
                weights=z["weights"].astype(np.float32),
                adapter_sha256=str(z["adapter_sha256"]),
                info=json.loads(str(z["info"])),
            )


def find_spans(
    model_dir: Path,
    places: Sequence[Path] = ADAPTER_DIRS,
    vocab: int | None = None,
    rows: bool = False,
) -> SpanPointer | None:
    """The span pointer fitted for the adapter merged into ``model_dir`` (the first
    ``spans.npz`` in ``places`` that names its weights); None when there is none (the
    model then writes string values itself). ``rows``: the one fitted on the rows
    graphs (``model.router.fitted_places``)."""
    places = fitted_places(places, rows)
    return find_fitted(model_dir, SPANS_FILE, SpanPointer.load, places, vocab)
