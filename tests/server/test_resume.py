"""server/resume.py: parked conversations resume only for their owner, and a saved
file keeps who that is (issue 40). The time is passed in, as in the session."""

from __future__ import annotations

import pytest

from model.engine import ChatMessage
from model.tools import ToolCall
from server.protocol import ProtocolError
from server.resume import ResumeStore

PIN = [ChatMessage("user", "My PIN is 4321."), ChatMessage("assistant", "Noted.")]


def refused(store: ResumeStore, token: str, now: float) -> str:
    with pytest.raises(ProtocolError) as err:
        store.take(token, now)
    return err.value.code


def test_a_conversation_resumes_only_for_its_owner_and_another_does_not_use_it_up() -> None:
    store = ResumeStore(ttl_s=60)
    store.for_owner("key-a").park("tok", PIN, now=0.0)
    assert refused(store.for_owner("key-b"), "tok", 1.0) == "bad_resume_token"
    assert refused(store, "tok", 1.0) == "bad_resume_token"  # nobody's view
    assert len(store) == 1
    assert store.for_owner("key-a").take("tok", 2.0).conversation == PIN
    assert refused(store.for_owner("key-a"), "tok", 3.0) == "bad_resume_token"  # single use


def test_an_expired_conversation_says_so_only_to_its_owner() -> None:
    store = ResumeStore(ttl_s=10)
    store.for_owner("key-a").park("tok", PIN, now=0.0)
    assert refused(store.for_owner("key-b"), "tok", 11.0) == "bad_resume_token"
    assert refused(store.for_owner("key-a"), "tok", 11.0) == "resume_expired"


def test_the_saved_file_keeps_each_conversations_owner() -> None:
    store = ResumeStore(ttl_s=60)
    store.for_owner("key-a").park("a", PIN, now=0.0)
    store.for_owner("key-b").park("b", PIN[:1], now=0.0)
    saved = store.dump(now=10.0, wall=1_000.0)
    restored = ResumeStore(ttl_s=60)
    assert restored.load(saved, now=500.0, wall=1_005.0) == 2
    assert refused(restored.for_owner("key-b"), "a", 501.0) == "bad_resume_token"
    assert restored.for_owner("key-a").take("a", 501.0).conversation == PIN
    assert restored.for_owner("key-b").take("b", 501.0).conversation == PIN[:1]


def test_a_file_without_owners_is_not_restored() -> None:
    old = {"version": 1, "parked": {"t": {"expires_at": 2e9, "conversation": []}}}
    with pytest.raises(ValueError, match="version"):
        ResumeStore().load(old, now=0.0, wall=1e9)


def test_a_saved_conversation_keeps_what_came_of_an_action() -> None:
    """A turn that acted leaves a "tool" message (the action's result); the saved file
    and the fleet's store (server/store.py reads the same rows) restore it."""
    acted = [
        ChatMessage("user", "Set a timer for five minutes."),
        ChatMessage("assistant", "Timer set for five minutes."),
        ChatMessage("tool", '{"ok": true}'),
    ]
    store = ResumeStore(ttl_s=60)
    store.for_owner("key-a").park("a", acted, now=0.0)
    restored = ResumeStore(ttl_s=60)
    assert restored.load(store.dump(now=1.0, wall=100.0), now=2.0, wall=101.0) == 1
    assert restored.for_owner("key-a").take("a", 3.0).conversation == acted


def test_a_question_the_user_had_not_answered_is_parked_with_its_conversation() -> None:
    """The call the last reply asked about goes with the conversation, through the
    saved file too (docs/actions.md, "Asking first"): a yes after the resume makes it."""
    message = ToolCall("message.send", {"to": "my sister", "text": "I'm running late"})
    asked = [
        ChatMessage("user", "Text my sister that I'm running late."),
        ChatMessage("assistant", "Send 'I'm running late' to your sister?"),
    ]
    store = ResumeStore(ttl_s=60)
    store.for_owner("key-a").park("a", asked, now=0.0, pending=message)
    store.for_owner("key-a").park("b", asked, now=0.0)
    restored = ResumeStore(ttl_s=60)
    assert restored.load(store.dump(now=1.0, wall=100.0), now=2.0, wall=101.0) == 2
    parked = restored.for_owner("key-a").take("a", 3.0)
    assert parked.conversation == asked and parked.pending == message
    assert restored.for_owner("key-a").take("b", 3.0).pending is None
