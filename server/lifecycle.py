"""What happens to a turn, as the session tells both wires: typed lifecycle events.

The session (server/session.py) is the one owner of a turn's state. Beside the
protocol v1 messages it sends, it emits these events, each carrying what a wire needs
to name and describe what happened (the ids of the conversation's messages, whether a
reply speaks, what of its audio was sent), so a wire translates them without keeping
any turn or response state of its own. Protocol v1 (``VoiceWire`` in server/app.py)
has a message for everything and translates none of them; the OpenAI Realtime codec
(server/realtime.py) translates these instead of the v1 messages they stand beside.

Messages of the conversation have ids the session owns: a wire may name a message it
adds (``UserText``, ``Respond.user_item``); the session names the rest with the
functions below, from the turn they belong to.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from . import protocol as p


def user_item(turn_id: int) -> str:
    """The id of the user's words of a spoken (or v1 text) turn."""
    return f"item_u{turn_id}"


def reply_item(turn_id: int) -> str:
    """The id of the assistant message a turn's reply becomes."""
    return f"item_r{turn_id}"


def call_item(turn_id: int) -> str:
    """The id of the tool call a turn's reply made."""
    return f"item_c{turn_id}"


def truncate_to_sent(sentences: list[str], sent: dict[int, int], total: dict[int, int]) -> str:
    """The reply text a listener has been sent: whole sentences, then a word prefix."""
    kept: list[str] = []
    for i, sentence in enumerate(sentences):
        n, size = sent.get(i, 0), total.get(i, 0)
        if size and n >= size:
            kept.append(sentence)
            continue
        if n and size:
            words = sentence.split()
            kept.append(" ".join(words[: round(len(words) * n / size)]))
        break
    return " ".join(k for k in kept if k)


@dataclass
class AudioLedger:
    """A turn's reply audio, kept in one place: per sentence its whole length and what
    of it the client took, and what was handed to the connection. The session owns
    it (one per turn); the connection reports frames written (``AudioWritten``)."""

    rate: int
    total: dict[int, int] = field(default_factory=dict)  # sentence -> its whole length
    written: dict[int, int] = field(default_factory=dict)  # sentence -> samples written
    queued: int = 0  # samples handed to the connection, written or not
    frames: int = 0  # frames handed over (their sequence numbers)

    def queue(self, sentence: int, samples: int, sentence_samples: int) -> int:
        """A frame goes to the connection: its sequence number."""
        self.total[sentence] = sentence_samples
        self.queued += samples
        self.frames += 1
        return self.frames - 1

    def write(self, sentence: int, samples: int) -> None:
        self.written[sentence] = self.written.get(sentence, 0) + samples

    @property
    def written_samples(self) -> int:
        return sum(self.written.values())

    @property
    def unwritten(self) -> int:
        """Samples queued and not written yet."""
        return self.queued - self.written_samples

    def spoken(self, sentences: list[str]) -> str:
        """The words of ``sentences`` the client was sent as audio."""
        return truncate_to_sent(sentences, self.written, self.total)

    def heard(self, sentences: list[str]) -> HeardAudio:
        return HeardAudio(self.rate, tuple(sentences), dict(self.total), dict(self.written))


@dataclass(frozen=True)
class HeardAudio:
    """What of a reply's audio was sent, as the reply ended: what truncating it cuts."""

    rate: int
    sentences: tuple[str, ...]
    total: dict[int, int]
    written: dict[int, int]

    @property
    def ms(self) -> int:
        return sum(self.written.values()) * 1000 // self.rate

    def cut(self, audio_end_ms: int) -> tuple[str, HeardAudio]:
        """The words heard in the first ``audio_end_ms``, and the audio left."""
        left = audio_end_ms * self.rate // 1000
        heard: dict[int, int] = {}
        for i in range(len(self.sentences)):
            heard[i] = min(self.written.get(i, 0), left)
            left -= heard[i]
        text = truncate_to_sent(list(self.sentences), heard, self.total)
        return text, replace(self, written=heard)


@dataclass(frozen=True)
class Lifecycle:
    """Base of the events; every one is about a turn."""

    turn_id: int


@dataclass(frozen=True)
class TranscriptGrew(Lifecycle):
    """The partial transcript of the speech being heard grew by ``delta`` (a partial
    that changed earlier words adds nothing)."""

    item_id: str
    delta: str


@dataclass(frozen=True)
class UserHeard(Lifecycle):
    """The user's words of a turn are known (its transcript, or a text message)."""

    item_id: str
    text: str
    speech_ms: int  # how long the speech was (0: text)
    announced: bool  # the wire added the item before (committed audio, Respond.user_item)


@dataclass(frozen=True)
class ReplyStarted(Lifecycle):
    """The turn is answered: its reply is under way and will end with ReplyEnded."""

    item_id: str  # the assistant message it becomes
    speak: bool
    keep: bool  # False: out of band, the conversation keeps nothing of it
    output_format: str | None  # Configure's label of the reply audio's format
    max_tokens: int | None  # the reply's token budget as asked (None: the server's)
    metadata: dict[str, str] | None
    requests: tuple[int, int, float]  # the request bucket: size, left, seconds to full


@dataclass(frozen=True)
class SentenceAdded(Lifecycle):
    """A sentence of the reply is shown (with its first audio, when it speaks)."""

    item_id: str
    index: int
    text: str
    speak: bool


@dataclass(frozen=True)
class CallAdded(Lifecycle):
    """The reply calls a tool, and the client is told (with the reply's first audio)."""

    item_id: str  # the call's own item
    call_id: str
    name: str
    arguments: dict[str, object]
    keep: bool


@dataclass(frozen=True)
class ReplyEnded(Lifecycle):
    """The reply is done, cut off, or failed."""

    item_id: str
    status: Literal["completed", "cancelled", "failed"]
    reason: p.CancelReason | None  # why it was cut off
    text: str  # completed: all of it; else what was sent
    speak: bool
    keep: bool
    output_format: str | None
    max_tokens: int | None
    metadata: dict[str, str] | None
    call: CallAdded | None  # the tool call the client was told of
    audio: HeardAudio | None  # what of its audio was written (None: it spoke none)


@dataclass(frozen=True)
class TurnWithdrawn(Lifecycle):
    """The user went on speaking: the answered turn's items leave the conversation
    (its words come back in the next turn's transcript)."""

    items: tuple[str, ...]


@dataclass(frozen=True)
class TurnClosed(Lifecycle):
    """The turn is over; its metrics are the last word of it."""

    user_item: str | None  # its user words' item (spoken or committed), if any
    replied: bool  # a reply started (ReplyStarted)
    metrics: p.Metrics


@dataclass(frozen=True)
class TurnOpened(Lifecycle):
    """A user turn began: speech was heard, a text came, or a reply was asked for."""

    origin: Literal["speech", "text", "request"]
    user_item: str | None  # the id its user words will have (None: a request without)
