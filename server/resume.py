"""Conversations of dropped connections, kept for a while against a resume token.

A car drives into a tunnel: the connection drops, the client reconnects and sends its
resume token in ``start``, and the conversation goes on where it was. Pure logic with
the time passed in, like the session; tokens are single use (a resumed session gets a
new one), so a leaked token cannot be replayed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from model.engine import ChatMessage, Role

from .protocol import ProtocolError


@dataclass(frozen=True)
class _Parked:
    conversation: tuple[ChatMessage, ...]
    expires_at: float


class ResumeStore:
    def __init__(self, ttl_s: float = 120.0, max_entries: int = 10_000) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._parked: dict[str, _Parked] = {}
        self._expired: dict[str, None] = {}  # recently expired tokens, for a precise error

    def park(self, token: str, conversation: list[ChatMessage], now: float) -> None:
        self._purge(now)
        if self.ttl_s <= 0:
            return
        if len(self._parked) >= self.max_entries:  # drop the oldest first
            del self._parked[next(iter(self._parked))]
        self._parked[token] = _Parked(tuple(conversation), now + self.ttl_s)

    def take(self, token: str, now: float) -> list[ChatMessage]:
        """The parked conversation for ``token``; it can be taken once."""
        self._purge(now)
        parked = self._parked.pop(token, None)
        if parked is not None:
            return list(parked.conversation)
        if token in self._expired:
            raise ProtocolError("resume_expired", "that session has expired; start a new one")
        raise ProtocolError("bad_resume_token", "unknown resume token; start a new session")

    def _purge(self, now: float) -> None:
        for token in [t for t, p in self._parked.items() if p.expires_at <= now]:
            del self._parked[token]
            self._expired[token] = None
        while len(self._expired) > self.max_entries:
            del self._expired[next(iter(self._expired))]

    def dump(self, now: float, wall: float) -> dict[str, object]:
        """The parked conversations as JSON, expiry in wall-clock seconds (``now`` is
        this store's clock, ``wall`` time.time() at the same instant): another process
        restores them with :meth:`load`."""
        self._purge(now)
        entries = {
            token: {
                "expires_at": wall + (parked.expires_at - now),
                "conversation": [[m.role, m.content] for m in parked.conversation],
            }
            for token, parked in self._parked.items()
        }
        return {"version": 1, "parked": entries}

    def load(self, data: dict[str, Any], now: float, wall: float) -> int:
        """Restore what :meth:`dump` wrote; entries past their expiry are dropped.
        Returns how many were restored."""
        if data.get("version") != 1:
            raise ValueError(f"unknown version {data.get('version')!r}")
        restored = 0
        for token, entry in data["parked"].items():
            expires_at = now + (float(entry["expires_at"]) - wall)
            if expires_at <= now or len(self._parked) >= self.max_entries:
                continue
            messages = tuple(ChatMessage(_role(r), str(c)) for r, c in entry["conversation"])
            self._parked[str(token)] = _Parked(messages, expires_at)
            restored += 1
        return restored

    def __len__(self) -> int:
        return len(self._parked)


def _role(value: object) -> Role:
    if value not in ("system", "user", "assistant"):
        raise ValueError(f"not a chat role: {value!r}")
    return value
