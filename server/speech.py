"""The speech side of a turn: cutting the reply into sentences for Piper, and sharing
the CPU between Piper and the reply model.

The reply engine streams text pieces (:mod:`model.engine`); :func:`sentences` releases
each sentence as soon as its end mark and the space after it have arrived, so the
first one is synthesized while the model writes the rest.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import AsyncIterator, Generator
from dataclasses import dataclass

from model.engine import ReplyChunk, ReplyEnd
from model.tools import ToolCall


@dataclass(frozen=True)
class Sentence:
    """One sentence of the reply."""

    text: str
    index: int  # sentence number within the reply, from 0


# A sentence ends at . ! ? (optionally followed by closing quotes/brackets) and then
# whitespace. Abbreviations such as "Dr. Smith" split early; that only costs a slightly
# shorter first TTS chunk, never lost text.
_SENTENCE_END = re.compile(r"[.!?…]+[\"')\]]*\s+")
# Markup a reply model may write into its words ("<name>My sister ...</name>"): never
# spoken (Piper would read the brackets). A "<" with a space after it is not a tag.
_TAG = re.compile(r"</?[A-Za-z_][\w.:-]*>")


# Where the first sentence is cut for a quick first audio chunk. Piper's time grows with
# the audio it writes (~40 ms per second of speech on 2 cores, docs/latency.md), so the
# first chunk is a phrase of 3-5 words: cut at a clause mark, or before a word that opens
# a phrase (a conjunction, a preposition, an auxiliary: "The nearest gas station | is
# about a mile away."). "of" is not one: "the capital | of France" splits a noun phrase.
_CLAUSE_MARK = re.compile(r"[,;:—]\s+")
_PHRASE_WORDS = frozenset(
    [
        *("and", "but", "so", "because", "which", "that", "when", "while", "if", "or"),
        *("where", "although", "than", "then"),
        *("with", "in", "on", "at", "for", "to", "from", "by", "about", "into", "near"),
        *("after", "before", "until", "around", "over", "under", "during", "through"),
        *("is", "are", "was", "were", "will", "would", "can", "could", "should", "has"),
        *("have", "had", "does", "do", "did", "may", "might", "must"),
    ]
)
FIRST_CLAUSE_WORDS = 2  # at a clause mark ("Of course, ...")
FIRST_PHRASE_WORDS = 3  # before a phrase word, with no mark yet
# The rest of the first sentence goes in phrases too, a little longer: it must be
# synthesized while the first phrase (about a second) plays, and a long remainder
# written to its end first would leave a silence after it.
NEXT_CLAUSE_WORDS = 3
NEXT_PHRASE_WORDS = 5


class SentenceSplitter:
    """Accumulates streamed text and releases complete sentences.

    With ``first_clause``, the reply's first sentence is released in phrases, at its
    natural breaks (docs/latency.md, "First audio from the first phrase"): Piper's time
    to a first chunk grows with the chunk, and the listener is waiting for it.
    """

    def __init__(self, first_clause: bool = False) -> None:
        self._buffer = ""
        self._first_clause = first_clause
        self._released = 0  # phrases of the first sentence released
        self._sentences = 0  # whole sentences ended so far

    def feed(self, piece: str) -> list[str]:
        self._buffer += piece
        out: list[str] = []
        while (m := _SENTENCE_END.search(self._buffer)) is not None:
            sentence = self._buffer[: m.end()].strip()
            self._buffer = self._buffer[m.end() :]
            self._sentences += 1
            if sentence:
                out.append(sentence)
        while self._first_clause and not self._sentences and (phrase := self._clause()):
            out.append(phrase)
        return out

    def _clause(self) -> str | None:
        """The first sentence's next phrase, if its break has come."""
        words = self._buffer.split()
        marks, phrase = (
            (FIRST_CLAUSE_WORDS, FIRST_PHRASE_WORDS)
            if not self._released
            else (NEXT_CLAUSE_WORDS, NEXT_PHRASE_WORDS)
        )
        cut = None
        for m in _CLAUSE_MARK.finditer(self._buffer):
            if len(self._buffer[: m.start()].split()) >= marks:
                cut = m.end()
                break
        if cut is None and len(words) > phrase:
            # before the first phrase word after enough words; its word must be whole
            for i in range(phrase, len(words) - 1):
                if words[i].lower() in _PHRASE_WORDS and not _dangles(words[i - 1]):
                    cut = _word_offset(self._buffer, i)
                    break
        if cut is None:
            return None
        clause, self._buffer = self._buffer[:cut].strip(), self._buffer[cut:]
        self._released += 1
        return clause or None

    def flush(self) -> list[str]:
        rest, self._buffer = self._buffer.strip(), ""
        return [rest] if rest else []


class SpeechFirst:
    """Speech first: the reply model pauses between forward passes while a reply's first
    phrase goes to speech.

    On a CPU host the reply model and Piper each spread over every core; run at the
    same time, each goes at less than half its speed (docs/latency.md, "Speech first"),
    so the first phrase's audio would wait on the model writing the later sentences.
    Each reply gets a :class:`ReplyPasses` (:meth:`reply`): until its first phrase is
    synthesized, its model starts no pass before the turn has taken every piece the
    model wrote (the phrase may be in the last one), and while any reply's first phrase
    is being synthesized (:meth:`synthesizing`) no reply model starts a pass. A model
    thread waits on one condition variable, which the turn's side notifies; nothing
    polls. Disabled (a GPU host: the model does not need the cores), nothing waits.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._changed = threading.Condition()
        self._synthesizing = 0  # first phrases being synthesized now

    @property
    def holding(self) -> bool:
        """A first phrase is being synthesized: no reply model starts a pass."""
        return self._synthesizing > 0

    def reply(self, speaks: bool) -> ReplyPasses:
        """The pauses of one reply's model; ``speaks``: its text goes to Piper (a
        text-only reply never waits for its own speech, only for others')."""
        return ReplyPasses(self, lockstep=self.enabled and speaks)

    @contextlib.contextmanager
    def synthesizing(self) -> Generator[None, None, None]:
        """Held while a reply's first phrase is synthesized."""
        if not self.enabled:
            yield
            return
        with self._changed:
            self._synthesizing += 1
        try:
            yield
        finally:
            with self._changed:
                self._synthesizing -= 1
                self._changed.notify_all()


class ReplyPasses:
    """When one reply's model may start its next forward pass (a
    :class:`model.engine.PassPauses`): the engine reports each piece written and taken,
    the turn :meth:`release` s it once the first phrase is synthesized."""

    def __init__(self, speech_first: SpeechFirst, lockstep: bool) -> None:
        self._owner = speech_first
        self._changed = speech_first._changed
        self._lockstep = lockstep  # until the first phrase is synthesized
        self._written = self._taken = 0
        self._closed = False

    def wrote(self) -> None:
        with self._changed:
            self._written += 1

    def took(self) -> None:
        with self._changed:
            self._taken += 1
            self._changed.notify_all()

    def release(self) -> None:
        """The first phrase is synthesized: the model may run ahead of its speech."""
        with self._changed:
            self._lockstep = False
            self._changed.notify_all()

    def close(self) -> None:
        """The reply is over or cancelled: a waiting model returns at once (a cancelled
        reply must not wait for someone else's speech)."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def wait(self) -> None:
        """Return when the model may start its next pass, or once closed."""
        if not self._owner.enabled:
            return
        with self._changed:
            self._changed.wait_for(self._may_pass)

    def ready(self) -> bool:
        """The model may start a pass now: :meth:`wait` would return at once."""
        with self._changed:
            return not self._owner.enabled or self._may_pass()

    def _may_pass(self) -> bool:
        caught_up = not self._lockstep or self._taken >= self._written
        return self._closed or (caught_up and not self._owner._synthesizing)


_DETERMINERS = frozenset(["a", "an", "the", "my", "your", "our", "their", "its", "his", "her"])


def _dangles(word: str) -> bool:
    """A phrase cannot end on this word ("The weather in | in Paris", "Set a | for")."""
    return word.lower() in _PHRASE_WORDS or word.lower() in _DETERMINERS


def _word_offset(text: str, i: int) -> int:
    """Where the i-th whitespace-separated word of ``text`` starts."""
    return [m.start() for m in re.finditer(r"\S+", text)][i]


def _untagged(text: str) -> tuple[str, str]:
    """``text`` with its tags as spaces, and the tail that may open one still to come
    ("<na" of "<name>"), held back."""
    cut = text.rfind("<")
    tail = ""
    if cut >= 0 and ">" not in text[cut:] and re.fullmatch(r"</?[\w.:-]*", text[cut:]):
        text, tail = text[:cut], text[cut:]
    return _TAG.sub(" ", text), tail


async def sentences(
    stream: AsyncIterator[ReplyChunk],
) -> AsyncIterator[Sentence | ToolCall | ReplyEnd]:
    """The reply's tool call if it acts, its sentences (a long first one cut at its
    first clause; markup tags left out), numbered from 0, then its :class:`ReplyEnd`; a
    cancelled reply (no ReplyEnd) keeps its unfinished last sentence to itself."""
    splitter, index = SentenceSplitter(first_clause=True), 0
    held = ""  # the start of a tag not closed yet
    async for chunk in stream:
        if isinstance(chunk, ToolCall):  # before any text: the reply acts
            yield chunk
            continue
        if isinstance(chunk, ReplyEnd):
            texts = splitter.feed(_TAG.sub(" ", held)) + splitter.flush()
        else:
            text, held = _untagged(held + chunk)
            texts = splitter.feed(text)
        for text in texts:
            if not (text := " ".join(text.split())):
                continue  # markup alone: nothing to say
            yield Sentence(text, index)
            index += 1
        if isinstance(chunk, ReplyEnd):
            yield chunk
