"""A reply may not open as an earlier reply of the conversation did.

A 135M model shown its own earlier replies copies them: in a 20-turn session the
diffusion engine began reply after reply with the same apology, and the AR engine
answered "I'm running great." to every later turn (docs/training.md, "Conversations").
The engines pass the first ``n`` tokens of each earlier assistant reply (and of the
user's latest words, so the reply does not open by echoing them) to the decoders as
*openings*; a decoder about to commit tokens that would make its reply start with one
of them bans, instead, the token that would complete it (a no-repeat n-gram ban, as in
Paulus et al. 2017, limited to the reply's start and to the conversation's replies).

With parallel commits (the diffusion sampler commits several positions per pass, in
any order) the completing token is the leftmost one of this step's commits inside the
opening: every position before it is already committed. Banning it (its logit to -inf)
and deciding again leaves the step's other commits as they were, so it costs no pass.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from model.engine import ChatMessage
from model.tokenizer import Tokenizer
from model.tools import split_call

Opening = tuple[int, ...]
# A sentence's last mark: . ! ? or an ellipsis, before a space or the end of the text
SENTENCE_END = re.compile(r"[.!?\u2026]+(?=\s|$)")


def reply_openings(
    tok: Tokenizer, conversation: Sequence[ChatMessage], n: int
) -> tuple[Opening, ...]:
    """The first ``n`` tokens of every assistant message in ``conversation`` and of its
    latest user message, cut at the end of its first sentence ("1." of "1. Stay
    focused. 2. ..."; an earlier reply shorter than that: all of it). Empty when ``n``
    is 0. A reply that acted is kept with its call first (``server/session.py``): its
    opening is that of its words, as a call's ``<`` as an opening would keep every later
    reply of the window from acting. The replies to an earlier message with the latest
    one's words are left out: asked "What is the capital of Japan?" again, the right
    answer opens as before (banned, the model wrote "The capital of China is Beijing.")."""
    if n <= 0:
        return ()
    users = [m.content for m in conversation if m.role == "user"]
    asked = " ".join(words(users[-1])) if users else ""
    texts, question = [], None
    for m in conversation:
        if m.role == "user":
            question = " ".join(words(m.content))
        elif m.role == "assistant" and not (asked and question == asked):
            texts.append(split_call(m.content)[1])
    found = {tuple(tok.encode_plain(first_sentence(t))[:n]) for t in texts + users[-1:]}
    return tuple(sorted(o for o in found if o))


def words(text: str) -> list[str]:
    """Lower-case words, punctuation and apostrophes dropped ("I'm" -> "im"): the same
    question asked again matches, and the session eval compares replies by them."""
    return re.findall(r"[a-z0-9]+", re.sub(r"['\u2019]", "", text.lower()))


def first_sentence(text: str) -> str:
    """The text up to its first sentence's last mark, stripped."""
    text = text.strip()
    m = SENTENCE_END.search(text)
    return text[: m.end()] if m else text


def completed_opening(
    x: NDArray[np.int64],
    pos: NDArray[np.int64],
    tokens: NDArray[np.int64],
    openings: Sequence[Opening],
    start: int = 0,
) -> tuple[int, int] | None:
    """Would writing ``tokens`` at reply positions ``pos`` of ``x`` (the reply so far,
    undecided positions holding anything not in an opening) make the reply's words,
    which begin at ``start`` (after a tool call's tokens), start with one of
    ``openings``? Then (position, token) to ban: the leftmost of ``pos`` inside that
    opening, and its token there. None when the commits are fine."""
    y = x.copy()
    y[pos] = tokens
    for o in openings:
        n = len(o)
        if y.size < start + n or not np.array_equal(y[start : start + n], o):
            continue
        inside = pos[(pos >= start) & (pos < start + n)]
        if inside.size:  # this step completes it (an opening already there is not ours)
            p = int(inside.min())
            return p, o[p - start]
    return None
