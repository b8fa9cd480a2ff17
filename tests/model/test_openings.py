"""A reply may not open as an earlier one did (model/openings.py), in both decoders."""

from __future__ import annotations

import numpy as np

from model.engine import ChatMessage, drain
from model.generate import greedy
from model.nn.backend import TorchBackend
from model.openings import completed_opening, reply_openings
from model.sampler import SamplerSettings, sample
from tests.model.conftest import tiny_model, tiny_tokenizer
from tests.model.test_sampler import MASK, MODEL, PROMPT, RNG, ScriptBackend

M = MASK


def test_reply_openings_are_the_first_tokens_of_replies_and_the_latest_user_words() -> None:
    tok = tiny_tokenizer()
    conversation = [
        ChatMessage("user", "old question"),
        ChatMessage("assistant", " Sorry, I can't."),
        ChatMessage("user", "Set a timer"),
        ChatMessage("assistant", "OK"),
        ChatMessage("user", "Play jazz"),
    ]
    got = reply_openings(tok, conversation, 4)
    want = {tuple(tok.encode_plain(t)[:4]) for t in ("Sorry, I can't.", "OK", "Play jazz")}
    assert set(got) == want  # stripped; an earlier user turn is not an opening
    assert reply_openings(tok, conversation, 0) == ()


def test_the_same_question_asked_again_may_get_the_same_answer() -> None:
    tok = tiny_tokenizer()
    conversation = [
        ChatMessage("user", "What is the capital of Japan?"),
        ChatMessage("assistant", "The capital of Japan is Tokyo."),
        ChatMessage("user", "Say hello."),
        ChatMessage("assistant", "Hello."),
        ChatMessage("user", "what is the capital of japan"),  # as Whisper may write it
    ]
    got = set(reply_openings(tok, conversation, 4))
    tokyo = tuple(tok.encode_plain("The capital of Japan is Tokyo.")[:4])
    assert tokyo not in got and tuple(tok.encode_plain("Hello.")[:4]) in got
    # another question: that answer is banned again
    other = [*conversation[:-1], ChatMessage("user", "And of France?")]
    assert tokyo in reply_openings(tok, other, 4)


def test_a_reply_that_acted_opens_with_its_words_not_its_call() -> None:
    tok = tiny_tokenizer()
    acted = '<tool_call>{"name": "timer.set", "arguments": {"seconds": 300}}</tool_call> Timer set.'
    convo = [ChatMessage("user", "a"), ChatMessage("assistant", acted), ChatMessage("user", "b")]
    openings = reply_openings(tok, convo, 3)
    assert tuple(tok.encode_plain("Timer set.")[:3]) in openings
    assert all(o[0] != tok.encode_plain("<")[0] for o in openings)


def test_completed_opening_bans_the_token_that_would_complete_it() -> None:
    o = [(10, 11, 12)]
    x = np.array([10, 11, M, M])
    assert completed_opening(x, np.array([2]), np.array([12]), o) == (2, 12)
    assert completed_opening(x, np.array([2]), np.array([13]), o) is None
    assert completed_opening(x, np.array([3]), np.array([12]), o) is None  # past it
    # parallel commits: the leftmost of them inside the opening
    x = np.array([M, M, 12, M])
    assert completed_opening(x, np.array([0, 1, 3]), np.array([10, 11, 5]), o) == (0, 10)
    assert completed_opening(x, np.array([1]), np.array([11]), o) is None  # 0 still masked
    # a reply that cannot hold the whole opening never completes it
    assert completed_opening(np.array([M, M]), np.array([0, 1]), np.array([10, 11]), o) is None
    # after a call's forced tokens (here 2) the words start later: the opening is theirs
    x = np.array([7, 8, 10, 11, M, M])
    assert completed_opening(x, np.array([4]), np.array([12]), o, start=2) == (4, 12)
    assert completed_opening(x, np.array([4]), np.array([12]), o) is None  # 7, 8 open it
    called = np.array([10, 11, M, M])  # the call's own tokens never count as words
    assert completed_opening(called, np.array([2]), np.array([12]), o, start=2) is None


def test_sampler_parallel_commits_never_complete_a_banned_opening() -> None:
    """Four confident positions commit in one step; with the opening (10, 11, 12)
    banned, position 0 (the leftmost of the commits inside it) loses its token."""
    s = SamplerSettings(block_size=4, threshold=0.9)
    free, _ = drain(
        sample(ScriptBackend([10, 11, 12, 13], [0.95] * 4, 3), PROMPT, MODEL, s, RNG(0), 4)
    )
    assert free == [10, 11, 12, 13]
    b = ScriptBackend([10, 11, 12, 13], [0.95] * 4, 3)
    got, _ = drain(sample(b, PROMPT, MODEL, s, RNG(0), 4, avoid=[(10, 11, 12)]))
    assert got[1:] == [11, 12, 13] and got[0] != 10
    assert b.denoise_inputs() == [[M, M, M, M], [M, 11, 12, 13]]  # the others committed


def test_after_forced_call_tokens_the_words_may_not_open_as_banned() -> None:
    """A call's confirmation: the call's last tokens are forced into the block, and the
    words after them may not start with the user's words (an echo)."""
    s = SamplerSettings(block_size=6, threshold=0.9)
    script = [7, 8, 10, 11, 12, 13]
    free, _ = drain(
        sample(ScriptBackend(script, [0.95] * 6, 3), PROMPT, MODEL, s, RNG(0), 6, forced=[7, 8])
    )
    assert free == [10, 11, 12, 13]  # the forced tokens are never yielded
    b = ScriptBackend(script, [0.95] * 6, 3)
    got, _ = drain(sample(b, PROMPT, MODEL, s, RNG(0), 6, forced=[7, 8], avoid=[(10, 11, 12)]))
    assert got[0] != 10 and got[1:] == [11, 12, 13]


def test_sampler_bans_the_last_token_of_an_opening_written_out_of_order() -> None:
    """Position 2 commits first (confident), then 0 and 1 left to right: the ban falls
    on 1, the position that would complete the opening; 0 keeps its token."""
    b = ScriptBackend([10, 11, 12, 13], [0.2, 0.2, 0.97, 0.2], 3)
    s = SamplerSettings(block_size=4, threshold=0.9)
    got, _ = drain(sample(b, PROMPT, MODEL, s, RNG(0), 4, avoid=[(10, 11, 12), (99, 98)]))
    assert got[0] == 10 and got[1] != 11 and got[2:] == [12, 13]


def test_greedy_changes_only_the_token_that_completes_an_opening() -> None:
    model, prompt = tiny_model(), [5, 6, 7, 8]
    free, _ = drain(greedy(TorchBackend(model, 64), prompt, 6, stop_ids=()))
    avoid = [tuple(free[:3])]
    got, _ = drain(greedy(TorchBackend(model, 64), prompt, 6, stop_ids=(), avoid=avoid))
    assert got[:2] == free[:2] and got[2] != free[2]
    other, _ = drain(greedy(TorchBackend(model, 64), prompt, 6, (), avoid=[(free[0], -1)]))
    assert other == free  # an opening the reply does not take changes nothing
