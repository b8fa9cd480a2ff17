"""Conversations of dropped connections, kept for a while against a resume token.

A car drives into a tunnel: the connection drops, the client reconnects and sends its
resume token in ``start``, and the conversation goes on where it was. Pure logic with
the time passed in, like the session; tokens are single use (a resumed session gets a
new one), so a leaked token cannot be replayed, and a conversation resumes only for
its owner (the API key it was held under, docs/security.md), so a token that leaked
to another key's holder opens nothing. A question the last reply asked and the user
had not answered yet ("Send 'I'm running late' to your sister?") is parked with the
conversation: a yes after the resume makes the call (docs/actions.md, "Asking first").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, get_args

from model.engine import ChatMessage, Role
from model.tools import ToolCall

from .protocol import ProtocolError

FILE_VERSION = 2  # 2: each conversation names its owner


@dataclass(frozen=True)
class Parked:
    """What a resume takes back: the conversation, and the call its last reply asked
    about that the user's next words answer (None: no question stands)."""

    conversation: list[ChatMessage]
    pending: ToolCall | None = None


@dataclass(frozen=True)
class _Parked:
    conversation: tuple[ChatMessage, ...]
    expires_at: float
    owner: str
    pending: ToolCall | None = None


@dataclass
class _Shelf:
    """The parked conversations, shared by a store and its owners' views of it."""

    parked: dict[str, _Parked] = field(default_factory=dict)
    expired: dict[str, str] = field(default_factory=dict)  # recently expired: owner


class ResumeStore:
    """Every owner's parked conversations; :meth:`for_owner` is what one connection
    sees: it parks under that owner and takes only that owner's."""

    def __init__(
        self,
        ttl_s: float = 120.0,
        max_entries: int = 10_000,
        owner: str = "",
        shelf: _Shelf | None = None,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.owner = owner
        self._shelf = shelf if shelf is not None else _Shelf()

    def for_owner(self, owner: str) -> ResumeStore:
        """This store as one owner's connection uses it."""
        return ResumeStore(self.ttl_s, self.max_entries, owner, self._shelf)

    def park(
        self,
        token: str,
        conversation: list[ChatMessage],
        now: float,
        pending: ToolCall | None = None,
    ) -> None:
        self._purge(now)
        if self.ttl_s <= 0:
            return
        parked = self._shelf.parked
        if len(parked) >= self.max_entries:  # drop the oldest first
            del parked[next(iter(parked))]
        parked[token] = _Parked(tuple(conversation), now + self.ttl_s, self.owner, pending)

    def take(self, token: str, now: float) -> Parked:
        """The parked conversation for ``token``; it can be taken once, by its owner.
        Another owner is told the token is unknown, and the token stays good."""
        self._purge(now)
        parked = self._shelf.parked.get(token)
        if parked is not None and parked.owner == self.owner:
            del self._shelf.parked[token]
            return Parked(list(parked.conversation), parked.pending)
        if parked is None and self._shelf.expired.get(token) == self.owner:
            raise ProtocolError("resume_expired", "that session has expired; start a new one")
        raise ProtocolError("bad_resume_token", "unknown resume token; start a new session")

    def _purge(self, now: float) -> None:
        parked, expired = self._shelf.parked, self._shelf.expired
        for token in [t for t, p in parked.items() if p.expires_at <= now]:
            expired[token] = parked.pop(token).owner
        while len(expired) > self.max_entries:
            del expired[next(iter(expired))]

    def dump(self, now: float, wall: float) -> dict[str, object]:
        """The parked conversations as JSON, expiry in wall-clock seconds (``now`` is
        this store's clock, ``wall`` time.time() at the same instant): another process
        restores them with :meth:`load`."""
        self._purge(now)
        entries = {
            token: {
                "expires_at": wall + (parked.expires_at - now),
                "owner": parked.owner,
                "conversation": [[m.role, m.content] for m in parked.conversation],
                "pending": call_json(parked.pending),
            }
            for token, parked in self._shelf.parked.items()
        }
        return {"version": FILE_VERSION, "parked": entries}

    def load(self, data: dict[str, Any], now: float, wall: float) -> int:
        """Restore what :meth:`dump` wrote; entries past their expiry are dropped.
        Returns how many were restored."""
        if data.get("version") != FILE_VERSION:
            raise ValueError(f"unknown version {data.get('version')!r}")
        restored = 0
        for token, entry in data["parked"].items():
            expires_at = now + (float(entry["expires_at"]) - wall)
            if expires_at <= now or len(self._shelf.parked) >= self.max_entries:
                continue
            messages = tuple(ChatMessage(_role(r), str(c)) for r, c in entry["conversation"])
            owner = entry["owner"]
            if not isinstance(owner, str):
                raise ValueError(f"not an owner: {owner!r}")
            pending = call_from(entry.get("pending"))
            self._shelf.parked[str(token)] = _Parked(messages, expires_at, owner, pending)
            restored += 1
        return restored

    def __len__(self) -> int:
        return len(self._shelf.parked)


def call_json(call: ToolCall | None) -> dict[str, Any] | None:
    """A pending call as the saved file and the fleet's store keep it."""
    return None if call is None else {"name": call.name, "arguments": dict(call.arguments)}


def call_from(data: object) -> ToolCall | None:
    """What :func:`call_json` wrote (absent: no question stood)."""
    if data is None:
        return None
    if not isinstance(data, Mapping) or not isinstance(data.get("name"), str):
        raise ValueError(f"not a pending call: {data!r}")
    arguments = data.get("arguments")
    if not isinstance(arguments, Mapping):
        raise ValueError(f"not a pending call's arguments: {arguments!r}")
    return ToolCall(data["name"], dict(arguments))


def _role(value: object) -> Role:
    # every role a conversation holds: "tool" is what came of an action (action_result)
    if value not in get_args(Role):
        raise ValueError(f"not a chat role: {value!r}")
    return value  # type: ignore[return-value]
