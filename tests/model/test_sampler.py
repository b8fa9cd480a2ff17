"""The diffusion samplers: the pure commit rule, then the loop on a scripted backend.

ScriptBackend implements StepBackend with logits fixed in advance per reply position,
so each test states exactly which token each position wants and how confident the
model is. The real backends run the same loop in tests/model/test_diffusion.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from model.engine import GenerationStats, drain
from model.sampler import (
    SENTENCE_BREAK,
    DiffusionConfig,
    SamplerSettings,
    _propose,
    choose,
    cut_at_end,
    decide,
    is_in,
    propose,
    sample,
    sentence_end_ids,
    spaced_ids,
    word_keys,
)

from .conftest import tiny_tokenizer

V, MASK, END = 32, 31, 2
MODEL = DiffusionConfig(mask_id=MASK, end_ids=frozenset({END, 3}), attention="block", shift=False)


def confident_logits(token: int, p: float) -> np.ndarray:
    """Logits (V,) whose softmax gives ``token`` probability ``p``, the rest uniform."""
    rest = (1 - p) / (V - 1)
    probs = np.full(V, rest)
    probs[token] = p
    return np.log(probs).astype(np.float32)


class ScriptBackend:
    """Position i of the reply always predicts ``targets[i]`` with ``confs[i]``."""

    name = "script"
    vocab_size = V
    max_len = 512

    def __init__(self, targets: Sequence[int], confs: Sequence[float], prompt_len: int) -> None:
        self.rows = np.stack([confident_logits(t, c) for t, c in zip(targets, confs, strict=True)])
        self.prompt_len = prompt_len
        self.calls: list[tuple[str, bool, list[int]]] = []  # (attend, commit, ids)

    def new_cache(self) -> dict[str, int]:
        return {"length": 0}

    def cache_length(self, cache: dict[str, int]) -> int:
        return cache["length"]

    def truncate(self, cache: dict[str, int], length: int) -> None:
        cache["length"] = length

    def step(self, cache: Any, ids: np.ndarray, attend: str, commit: bool, rows=None):
        self.calls.append((attend, commit, ids.tolist()))
        start = cache["length"] - self.prompt_len  # reply position of ids[0]
        out = np.zeros((len(ids), V), np.float32)
        for i in range(len(ids)):
            if 0 <= start + i < len(self.rows):
                out[i] = self.rows[start + i]
        if commit:
            cache["length"] += len(ids)
        return out if rows is None else out[list(rows)]

    def denoise_inputs(self) -> list[list[int]]:
        return [ids for attend, commit, ids in self.calls if attend == "block" and not commit]


PROMPT = [7, 8, 9]
RNG = np.random.default_rng


def sampled_with_events(  # type: ignore[no-untyped-def]
    b: ScriptBackend, model: DiffusionConfig, settings: SamplerSettings, max_tokens: int
):
    """The reply, its stats, and the events in order: "pass" per model pass, then each
    token as it is released."""
    events: list[str] = []
    b_step = b.step

    def step(*args, **kwargs):  # type: ignore[no-untyped-def]
        events.append("pass")
        return b_step(*args, **kwargs)

    b.step = step  # type: ignore[method-assign]
    gen = sample(b, PROMPT, model, settings, RNG(0), max_tokens)
    tokens: list[int] = []
    try:
        while True:
            tokens.append(next(gen))
            events.append(str(tokens[-1]))
    except StopIteration as stop:
        return tokens, stop.value, events


# ------------------------------------------------------------------ pure decisions


def test_choose_takes_the_n_most_confident_masked_positions_ties_leftmost() -> None:
    conf = np.array([0.1, 0.9, 0.5, 0.9, 0.99], np.float32)
    masked = np.array([True, True, True, True, False])
    assert choose(conf, masked, n=1).tolist() == [1]  # 0.9 tie: the leftmost
    assert choose(conf, masked, n=3).tolist() == [1, 2, 3]
    assert choose(conf, masked, n=10).tolist() == [0, 1, 2, 3]  # never an unmasked one


def test_choose_threshold_commits_all_above_and_at_least_one() -> None:
    conf = np.array([0.95, 0.2, 0.97, 0.3], np.float32)
    masked = np.ones(4, bool)
    assert choose(conf, masked, threshold=0.9).tolist() == [0, 2]
    assert choose(conf, masked, threshold=0.99).tolist() == [2]  # none above: the best
    assert choose(conf, np.array([False, True, False, True]), threshold=0.9).tolist() == [3]


def test_choose_threshold_leftmost_fallback() -> None:
    conf = np.array([0.3, 0.2, 0.97, 0.95], np.float32)
    masked = np.ones(4, bool)
    left = dict(fallback="leftmost")
    assert choose(conf, masked, threshold=0.9, **left).tolist() == [2, 3]  # above: as before
    assert choose(conf, masked, threshold=0.99, **left).tolist() == [0]  # none: the leftmost
    assert choose(conf, np.array([False, True, True, False]), threshold=0.99, **left).tolist() == [
        1
    ]


def test_propose_is_greedy_at_zero_temperature_with_softmax_confidence() -> None:
    logits = np.stack([confident_logits(5, 0.7), confident_logits(9, 0.2)])
    tokens, conf = propose(logits, 0.0, RNG(0))
    assert tokens.tolist() == [5, 9]
    np.testing.assert_allclose(conf, [0.7, 0.2], rtol=1e-5)


def test_decide_lowconf_spreads_commits_over_the_steps_left() -> None:
    logits = np.stack([confident_logits(t, c) for t, c in [(4, 0.3), (5, 0.8), (6, 0.6)]])
    masked = np.ones(3, bool)
    s = SamplerSettings(rule="lowconf")
    pos, tok = decide(logits, masked, s, steps_left=2, rng=RNG(0))  # ceil(3 / 2) = 2
    assert pos.tolist() == [1, 2] and tok.tolist() == [5, 6]
    pos, _ = decide(logits, masked, s, steps_left=3, rng=RNG(0))
    assert pos.tolist() == [1]


def test_decide_last_step_commits_everything_masked() -> None:
    logits = np.stack([confident_logits(4, 0.1)] * 4)
    masked = np.array([True, False, True, True])
    pos, tok = decide(logits, masked, SamplerSettings(threshold=0.9), 1, RNG(0))
    assert pos.tolist() == [0, 2, 3] and tok.tolist() == [4, 4, 4]


def test_decide_commits_an_end_token_only_within_the_lookahead() -> None:
    logits = np.stack([confident_logits(t, 0.99) for t in (END, 5, END)])
    masked = np.array([False, True, True])  # position 0 is committed already
    ends, in_order = MODEL.end_ids, SamplerSettings(end_lookahead=0)
    pos, tok = decide(logits, masked, in_order, 4, RNG(0), ends)
    assert pos.tolist() == [1] and tok.tolist() == [5]  # the end at 2 waits behind 1
    masked = np.array([False, False, True])
    pos, tok = decide(logits, masked, in_order, 4, RNG(0), ends)
    assert pos.tolist() == [2] and tok.tolist() == [END]  # now it is next
    for anywhere in (SamplerSettings(end_lookahead=None), SamplerSettings(end_lookahead=1)):
        pos, _ = decide(logits, np.array([False, True, True]), anywhere, 4, RNG(0), ends)
        assert pos.tolist() == [1, 2]


def test_cut_at_end_fills_everything_after_the_first_end() -> None:
    x = np.array([5, MASK, END, 6, MASK, 7, MASK], np.int64)
    assert cut_at_end(x, 0, 4, frozenset({END})) == 2
    assert x.tolist() == [5, MASK, END, END, END, END, END]
    assert cut_at_end(np.array([5, 6]), 0, 2, frozenset({END})) is None


# ------------------------------------------------------------------ the loop


def test_lowconf_commits_one_position_per_step_most_confident_first() -> None:
    b = ScriptBackend([10, 11, 12, 13], [0.1, 0.9, 0.5, 0.7], len(PROMPT))
    s = SamplerSettings(block_size=4, rule="lowconf", steps_per_block=4)
    tokens, stats = drain(sample(b, PROMPT, MODEL, s, RNG(0), max_tokens=4))
    M = MASK
    assert b.denoise_inputs() == [
        [M, M, M, M],
        [M, 11, M, M],
        [M, 11, M, 13],
        [M, 11, 12, 13],
    ]
    assert tokens == [10, 11, 12, 13]
    assert stats == GenerationStats(4, 1 + 4, "budget")  # prefill + 4 steps, no commit


def test_threshold_commits_in_parallel_and_always_makes_progress() -> None:
    b = ScriptBackend([10, 11, 12, 13], [0.95, 0.2, 0.97, 0.3], len(PROMPT))
    s = SamplerSettings(block_size=4, threshold=0.9, steps_per_block=8, fallback="confident")
    tokens, stats = drain(sample(b, PROMPT, MODEL, s, RNG(0), max_tokens=4))
    M = MASK
    assert b.denoise_inputs() == [[M, M, M, M], [10, M, 12, M], [10, M, 12, 13]]
    assert tokens == [10, 11, 12, 13] and stats.forward_passes == 1 + 3


def test_threshold_with_leftmost_fallback_writes_an_unsure_block_left_to_right() -> None:
    b = ScriptBackend([10, 11, 12, 13], [0.2, 0.3, 0.97, 0.5], len(PROMPT))
    s = SamplerSettings(block_size=4, threshold=0.9, steps_per_block=8, fallback="leftmost")
    tokens, _ = drain(sample(b, PROMPT, MODEL, s, RNG(0), max_tokens=4))
    M = MASK
    assert b.denoise_inputs() == [[M, M, M, M], [M, M, 12, M], [10, M, 12, M], [10, 11, 12, M]]
    assert tokens == [10, 11, 12, 13]


def test_blocks_left_to_right_with_one_commit_pass_between() -> None:
    b = ScriptBackend(list(range(10, 18)), [0.99] * 8, len(PROMPT))
    s = SamplerSettings(block_size=4)
    tokens, stats = drain(sample(b, PROMPT, MODEL, s, RNG(0), max_tokens=8))
    assert [(a, c) for a, c, _ in b.calls] == [
        ("causal", True),  # prompt prefill
        ("block", False),  # block 0, all above threshold at once
        ("block", True),  # block 0 committed to the cache
        ("block", False),  # block 1: the last, never committed
    ]
    assert b.calls[0][2] == PROMPT and b.calls[2][2] == [10, 11, 12, 13]
    assert tokens == list(range(10, 18)) and stats == GenerationStats(8, 4, "budget")


def test_blocks_cover_the_budget_the_last_one_whole() -> None:
    s = SamplerSettings(block_size=4)
    assert s.blocks(8) == [(0, 4), (4, 8)] and s.blocks(9)[-1] == (8, 12) and s.blocks(0) == []
    assert s.step_budget(9) == 3 * 4
    assert SamplerSettings(block_size=4, steps_per_block=2).step_budget(9) == 3 * 2


def test_end_token_stops_the_reply_and_nothing_after_it_is_generated() -> None:
    # The end token at 2 is the most confident: it commits first, 3 is never generated,
    # and no second block starts although max_tokens allows three.
    b = ScriptBackend([10, 11, END, 13] + [14] * 8, [0.5, 0.6, 0.9, 0.8] + [0.9] * 8, 3)
    s = SamplerSettings(block_size=4, rule="lowconf", steps_per_block=4, end_lookahead=None)
    tokens, stats = drain(sample(b, PROMPT, MODEL, s, RNG(0), max_tokens=12))
    M = MASK
    assert b.denoise_inputs() == [[M, M, M, M], [M, M, END, END], [M, 11, END, END]]
    assert tokens == [10, 11]
    assert stats == GenerationStats(2, 1 + 3, "end")
    assert not any(commit for _, commit, _ in b.calls[1:])


def test_a_confident_end_waits_until_the_words_before_it_are_written() -> None:
    # Published threshold decoding commits the confident ends first and so fixes the
    # reply's length before its words; in order, the words come first.
    targets, confs = [10, 11, END, END], [0.5, 0.5, 0.99, 0.99]
    M = MASK
    b = ScriptBackend(targets, confs, len(PROMPT))
    s = SamplerSettings(block_size=4, end_lookahead=0)
    tokens, stats = drain(sample(b, PROMPT, MODEL, s, RNG(0), 4))
    assert b.denoise_inputs() == [[M, M, M, M], [10, M, M, M], [10, 11, M, M]]
    assert tokens == [10, 11] and stats.stopped_by == "end"
    for ahead in (None, 2):  # anywhere, or within two masked positions of the words
        b = ScriptBackend(targets, confs, len(PROMPT))
        s = SamplerSettings(block_size=4, end_lookahead=ahead)
        drain(sample(b, PROMPT, MODEL, s, RNG(0), 4))
        assert b.denoise_inputs() == [[M, M, M, M], [M, M, END, END], [10, M, END, END]]
    b = ScriptBackend(targets, confs, len(PROMPT))
    drain(sample(b, PROMPT, MODEL, SamplerSettings(block_size=4, end_lookahead=1), RNG(0), 4))
    # the end at 2 waits for 10, then commits one position ahead of the words
    assert b.denoise_inputs() == [[M, M, M, M], [10, M, M, M], [10, M, END, END]]


def test_with_ends_after_sentence_a_reply_ends_only_after_a_sentence_s_end() -> None:
    """The model would end after "10" (not a sentence's end) and, barred, writes its
    second choice 12 (one) first; an empty reply is never the answer either."""

    class EndsEarly(ScriptBackend):
        def __init__(self, first: int) -> None:
            super().__init__([first, END, END, END], [0.99] * 4, len(PROMPT))
            second = np.full(V, np.log(0.01 / (V - 2)), np.float32)
            second[END], second[12] = np.log(0.6), np.log(0.39)
            self.rows[1] = second  # the end first, then 12

    ends_at_12 = DiffusionConfig(MASK, MODEL.end_ids, "block", False, frozenset({12}))
    for rule, want in ((False, [10]), (True, [10, 12])):
        s = SamplerSettings(block_size=4, ends_after_sentence=rule)
        tokens, stats = drain(sample(EndsEarly(10), PROMPT, ends_at_12, s, RNG(0), 4))
        assert tokens == want and stats.stopped_by == "end"
    # after a sentence's end the end token commits as before
    on = SamplerSettings(block_size=4, ends_after_sentence=True)
    assert drain(sample(EndsEarly(12), PROMPT, ends_at_12, on, RNG(0), 4))[0] == [12]
    # an end at the reply's first position never commits
    b = ScriptBackend([END, 12, END, END], [0.6, 0.99, 0.99, 0.99], len(PROMPT))
    tokens, _ = drain(sample(b, PROMPT, ends_at_12, on, RNG(0), 4))
    assert tokens[0] != END and tokens != []
    # without sentence-end ids (another model's config) the rule has nothing to read
    assert drain(sample(EndsEarly(10), PROMPT, MODEL, on, RNG(0), 4))[0] == [10]


def test_sentence_ends_are_tokens_whose_text_ends_with_a_full_stop_or_mark() -> None:
    tok = tiny_tokenizer()
    ends = {tok.token_bytes(i) for i in sentence_end_ids(tok)}
    assert ends == {b".", b"?", b"!"}  # one byte per token here: no ellipsis, no quote


# 12 ends a sentence; 20 is 10 in other clothes (" The" and "The": one word key)
KEYS = tuple(10 if i == 20 else i for i in range(V))
SAYS = DiffusionConfig(MASK, MODEL.end_ids, "block", False, frozenset({12}), word_keys=KEYS)
ONE_BY_ONE = dict(block_size=16, threshold=0.9, fallback="leftmost")  # unsure: leftmost first


def _released(targets: list[int], settings: SamplerSettings, max_tokens: int = 16):  # type: ignore[no-untyped-def]
    """:func:`sampled_with_events` on ``targets``, each wanted at 0.5 (one by one)."""
    b = ScriptBackend(targets, [0.5] * len(targets), len(PROMPT))
    return sampled_with_events(b, SAYS, settings, max_tokens)


def test_stop_repeats_ends_the_reply_before_a_sentence_it_already_said() -> None:
    first, second, again = [10, 11, 13, 12], [14, 15, 16, 12], [20, 11, 13, 12]
    targets = first + second + again + [17, 18, 19, 21]
    on = SamplerSettings(**ONE_BY_ONE, stop_repeats=True)  # type: ignore[arg-type]
    tokens, stats, _ = _released(targets, on)
    assert tokens == first + second
    assert stats.stopped_by == "end" and stats.repeat_cut and stats.tokens == 8
    off = SamplerSettings(**ONE_BY_ONE)  # type: ignore[arg-type]
    tokens, stats, _ = _released(targets, off)
    assert tokens == targets[:16] and stats.stopped_by == "budget" and not stats.repeat_cut


def test_stop_repeats_reads_a_list_s_numbers_with_their_items() -> None:
    """ "1. A B C." then "2. A B C.": a number and its mark go on with the item after
    them (too short to be a sentence), and every number is one word, so the second item
    repeats the first and the reply ends before its number."""
    keys = tuple(10 if i == 20 else 21 if i == 22 else i for i in range(V))
    says = dataclasses.replace(SAYS, word_keys=keys)
    one, two = [21, 12, 10, 11, 13, 12], [22, 12, 20, 11, 13, 12]
    b = ScriptBackend(one + two + [16, 17, 18, 19], [0.5] * 16, len(PROMPT))
    on = SamplerSettings(**ONE_BY_ONE, stop_repeats=True)  # type: ignore[arg-type]
    tokens, stats = drain(sample(b, PROMPT, says, on, RNG(0), 16))
    assert tokens == one and stats.repeat_cut


def test_stop_repeats_streams_the_first_sentence_and_holds_later_ones_whole() -> None:
    targets = [10, 11, 13, 12, 14, 15, 16, 12, 17, 18, 19, 12, 21, 22, 23, 24]
    on = SamplerSettings(**ONE_BY_ONE, stop_repeats=True)  # type: ignore[arg-type]
    tokens, stats, events = _released(targets, on)
    assert tokens == targets and stats.stopped_by == "budget" and not stats.repeat_cut
    # the first sentence token by token, a pass between each
    assert events[events.index("10") : events.index("11") + 1] == ["10", "pass", "11"]
    # the second: nothing of it before its end, then all of it at once
    at = events.index("14")
    assert events[at : at + 4] == ["14", "15", "16", "12"]
    # the tail that never ended is released when the budget ends the reply
    assert events[-4:] == ["21", "22", "23", "24"]


def test_stop_repeats_releases_a_held_tail_at_the_step_budget() -> None:
    """Two blocks of four, then the step budget stops the reply before the third: the
    second sentence, never ended, is released then."""
    targets = [10, 11, 13, 12, 14, 15, 16, 17] + [18] * 8
    s = SamplerSettings(block_size=4, fallback="leftmost", stop_repeats=True, max_steps=8)
    tokens, stats, _ = _released(targets, s, max_tokens=16)
    assert tokens == targets[:8] and stats.stopped_by == "budget"


def test_stop_repeats_leaves_short_and_new_sentences_alone() -> None:
    on = SamplerSettings(**ONE_BY_ONE, stop_repeats=True)  # type: ignore[arg-type]
    yes = [10, 12, 10, 12, 10, 12, END]  # "Yes. Yes. Yes.": one pair each, never a repeat
    assert _released(yes + [END] * 9, on)[0] == yes[:-1]
    # four of five word pairs said before (0.8): a repeat; three of four (0.75): not
    base = [10, 11, 13, 14, 15, 12]
    for second, cut in (([16, 11, 13, 14, 15, 12], True), ([16, 13, 14, 15, 12], False)):
        tokens, stats, _ = _released(base + second + [END] * 5, on)
        assert stats.repeat_cut == cut and tokens == (base if cut else base + second)
    # without word keys (another model's config) the rule has nothing to read
    plain = DiffusionConfig(MASK, MODEL.end_ids, "block", False, frozenset({12}))
    again = [10, 11, 13, 12] * 4
    assert (
        drain(sample(ScriptBackend(again, [0.99] * 16, 3), PROMPT, plain, on, RNG(0), 16))[0]
        == again
    )


def test_word_keys_join_a_word_s_cases() -> None:
    tok = tiny_tokenizer()
    keys = word_keys(tok)
    a, big_a = tok.encode_plain("a")[0], tok.encode_plain("A")[0]
    assert keys[big_a] == keys[a] == min(a, big_a) and len(keys) == tok.vocab_size
    one, two = tok.encode_plain("1")[0], tok.encode_plain("2")[0]
    assert keys[one] == keys[two] != keys[a]  # every number one word


def test_any_end_id_ends_the_reply() -> None:
    b = ScriptBackend([10, 3, 12, 13], [0.99] * 4, len(PROMPT))
    tokens, stats = drain(sample(b, PROMPT, MODEL, SamplerSettings(block_size=4), RNG(0), 4))
    assert tokens == [10] and stats.stopped_by == "end"


def test_step_budget_forces_the_block_then_stops() -> None:
    b = ScriptBackend(list(range(10, 26)), [0.1] * 16, len(PROMPT))
    s = SamplerSettings(block_size=8, rule="threshold", steps_per_block=8, max_steps=3)
    tokens, stats = drain(sample(b, PROMPT, MODEL, s, RNG(0), max_tokens=16))
    # one commit per step (nothing above threshold); the third step commits the rest
    assert len(b.denoise_inputs()) == 3
    assert tokens == list(range(10, 18)) and stats == GenerationStats(8, 1 + 3, "budget")


def test_steps_per_block_caps_a_threshold_block() -> None:
    b = ScriptBackend(list(range(10, 18)), [0.1] * 8, len(PROMPT))
    s = SamplerSettings(block_size=8, threshold=0.9, steps_per_block=2)
    tokens, stats = drain(sample(b, PROMPT, MODEL, s, RNG(0), max_tokens=8))
    assert len(tokens) == 8 and stats.forward_passes == 1 + 2


def test_by_default_an_unsure_block_commits_one_position_per_step() -> None:
    """The default never forces several commits below the threshold: a block of
    unsure positions is written one position per step, left to right."""
    b = ScriptBackend(list(range(10, 26)), [0.1] * 16, len(PROMPT))
    s = SamplerSettings()
    assert s.block_steps == s.block_size and s.step_budget(64) == 64
    tokens, stats = drain(sample(b, PROMPT, MODEL, s, RNG(0), max_tokens=s.block_size))
    assert len(b.denoise_inputs()) == s.block_size and tokens == list(range(10, 26))
    assert stats == GenerationStats(16, 1 + 16, "budget")


def test_the_step_budget_defaults_to_what_the_blocks_may_take() -> None:
    assert SamplerSettings(block_size=4, steps_per_block=2).step_budget(10) == 3 * 2
    assert SamplerSettings(block_size=4, max_steps=3).step_budget(10) == 3
    with pytest.raises(ValueError, match="must be >= 1"):
        SamplerSettings(steps_per_block=0)


def test_max_tokens_inside_a_block_leaves_the_tail_masked_and_uncommitted() -> None:
    b = ScriptBackend(list(range(10, 18)), [0.99] * 8, len(PROMPT))
    tokens, stats = drain(sample(b, PROMPT, MODEL, SamplerSettings(block_size=8), RNG(0), 5))
    assert tokens == [10, 11, 12, 13, 14] and stats == GenerationStats(5, 2, "budget")
    assert b.denoise_inputs()[0] == [MASK] * 8  # the block keeps its full size


def test_tokens_are_released_as_soon_as_no_mask_precedes_them() -> None:
    b = ScriptBackend([10, 11, 12, 13, 14, 15, 16, 17], [0.99, 0.5, 0.9, 0.8] + [0.9] * 4, 3)
    s = SamplerSettings(block_size=4, rule="lowconf", steps_per_block=4)
    _, _, events = sampled_with_events(b, MODEL, s, 8)
    # pass 2 commits position 0 (most confident): 10 is released at once; 11 waits for
    # pass 5, which makes 11, 12, 13 final together; block 1 comes after.
    assert events[:3] == ["pass", "pass", "10"]
    assert events.index("11") < events.index("14") and events.count("pass") == 1 + 4 + 1 + 4


class Shifted(ScriptBackend):
    """Row i predicts reply position i + 1, as after Dream's shift; records the logit
    rows each denoising step asks for."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.asked: list[list[int]] = []

    def step(self, cache, ids, attend, commit, rows=None):  # type: ignore[no-untyped-def]
        if attend == "block" and not commit:
            self.asked.append(list(rows))
        cache["length"] += 1  # pretend one position later ...
        out = super().step(cache, ids, attend, commit, rows)
        cache["length"] -= 1  # ... and restore
        return out


def test_shift_predicts_a_block_start_from_the_previous_pass() -> None:
    b = Shifted(list(range(10, 18)), [0.99] * 8, len(PROMPT))
    model = DiffusionConfig(MASK, frozenset({END}), "block", shift=True)
    tokens, _ = drain(sample(b, PROMPT, model, SamplerSettings(block_size=4), RNG(0), 8))
    assert tokens == list(range(10, 18))


def test_a_denoising_step_asks_only_for_the_rows_before_its_masked_positions() -> None:
    b = Shifted([10, 11, 12, 13], [0.1] * 4, len(PROMPT))  # one commit per step, leftmost
    model = DiffusionConfig(MASK, frozenset({END}), "block", shift=True)
    tokens, _ = drain(sample(b, PROMPT, model, SamplerSettings(block_size=4), RNG(0), 4))
    assert tokens == [10, 11, 12, 13]
    # masked 0-3, 1-3, 2-3, 3: position 0 comes from the prefill's last row
    assert b.asked == [[0, 1, 2], [0, 1, 2], [1, 2], [2]]


def test_a_step_that_reads_only_the_pass_before_runs_no_pass() -> None:
    """With the shift a block's first position comes from the pass before: a block of 1
    is one commit pass per token (AR's cost), and a block whose other positions all
    committed first finishes without a pass."""
    model = DiffusionConfig(MASK, frozenset({END}), "block", shift=True)
    b = Shifted(list(range(10, 14)), [0.1] * 4, len(PROMPT))
    tokens, stats = drain(sample(b, PROMPT, model, SamplerSettings(block_size=1), RNG(0), 4))
    assert tokens == list(range(10, 14)) and b.asked == []  # each from the pass before
    assert [len(ids) for a, c, ids in b.calls if c] == [3, 1, 1, 1]  # prefill, 3 commits
    assert stats == GenerationStats(4, 4, "budget")
    # position 0 unsure, 1-3 sure: the second step needs only the pass before's row
    b = Shifted([10, 11, 12, 13], [0.1, 0.99, 0.99, 0.99], len(PROMPT))
    tokens, stats = drain(sample(b, PROMPT, model, SamplerSettings(block_size=4), RNG(0), 4))
    assert tokens == [10, 11, 12, 13] and b.asked == [[0, 1, 2]]
    assert stats == GenerationStats(4, 1 + 1, "budget")


def test_cancel_stops_before_the_next_pass() -> None:
    b = ScriptBackend(list(range(10, 26)), [0.1] * 16, len(PROMPT))
    calls = iter(range(100))
    stop = lambda: next(calls) >= 3  # noqa: E731
    tokens, stats = drain(sample(b, PROMPT, MODEL, SamplerSettings(block_size=8), RNG(0), 16, stop))
    assert stats.tokens == len(tokens) <= 2  # what was released before the stop
    assert stats.stopped_by == "cancel" and stats.forward_passes == 3 == len(b.calls)


def test_sampling_is_deterministic_for_a_seed() -> None:
    b = ScriptBackend(list(range(10, 26)), [0.3] * 16, len(PROMPT))
    s = SamplerSettings(block_size=8, rule="lowconf", steps_per_block=4, temperature=1.0)
    a1, _ = drain(sample(b, PROMPT, MODEL, s, RNG(7), 16))
    a2, _ = drain(sample(b, PROMPT, MODEL, s, RNG(7), 16))
    a3, _ = drain(sample(b, PROMPT, MODEL, s, RNG(8), 16))
    assert a1 == a2 and a1 != a3


def test_the_mask_token_is_never_committed() -> None:
    b = ScriptBackend([MASK, 11, 12, 13], [0.99] * 4, len(PROMPT))
    tokens, _ = drain(sample(b, PROMPT, MODEL, SamplerSettings(block_size=4), RNG(0), 4))
    assert MASK not in tokens and len(tokens) == 4


def test_full_attention_reruns_prompt_and_reply_without_a_cache() -> None:
    class Full(ScriptBackend):
        def step(self, cache, ids, attend, commit, rows=None):  # type: ignore[no-untyped-def]
            assert attend == "block" and not commit and cache["length"] == 0
            return super().step(cache, ids, attend, commit, rows)

    b = Full(list(range(10, 18)), [0.99] * 8, len(PROMPT))
    b.prompt_len = 0  # rows are indexed from the prompt's first token
    b.rows = np.concatenate([np.zeros((len(PROMPT), V), np.float32), b.rows])
    model = DiffusionConfig(MASK, frozenset({END}), "full", shift=False)
    tokens, stats = drain(sample(b, PROMPT, model, SamplerSettings(block_size=4), RNG(0), 8))
    assert tokens == list(range(10, 18)) and stats.forward_passes == 2
    assert all(len(ids) == len(PROMPT) + 8 for _, _, ids in b.calls)


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError):
        SamplerSettings(block_size=0)
    with pytest.raises(ValueError):
        SamplerSettings(rule="topk")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        SamplerSettings(fallback="random")  # type: ignore[arg-type]


def test_the_end_bar_ends_where_the_end_is_likely_enough() -> None:
    probs = np.full(V, 0.2 / (V - 3))
    probs[[5, END, 3]] = 0.5, 0.2, 0.1  # the end ids together: 0.3
    logits = np.log(probs).astype(np.float32)[None]
    masked = np.array([True])

    def decided(bar: float | None) -> int:
        settings = SamplerSettings(block_size=1, end_bar=bar)
        return int(decide(logits, masked, settings, 1, RNG(0), MODEL.end_ids)[1][0])

    assert decided(None) == 5 and decided(0.35) == 5
    assert decided(0.25) == END  # the likelier end id


def test_one_greedy_position_decides_as_the_whole_softmax_would() -> None:
    """Blocks of one skip the vocabulary's softmax unless the ends come near the bar:
    the token must be the one the full rule (propose, then the end bar) gives, on rows
    whose ends sit anywhere around it."""
    rng = RNG(1)
    masked = np.array([True])
    ends = sorted(MODEL.end_ids)
    for bar in (0.05, 0.3):
        settings = SamplerSettings(block_size=1, end_bar=bar)
        for k in range(300):
            logits = rng.normal(0, 3, V).astype(np.float32)
            logits[ends] = logits.max() + np.log(rng.uniform(0.01, 1.2)) - k % 3
            tokens, _, softmax = _propose(logits[None], 0.0, rng)
            p_end = softmax[0][0, ends].sum() / softmax[1][0]
            want = ends[int(softmax[0][0, ends].argmax())] if p_end >= bar else int(tokens[0])
            got = decide(logits[None], masked, settings, 1, RNG(0), MODEL.end_ids)
            assert got[0].tolist() == [0] and int(got[1][0]) == want, (bar, k, p_end)


def test_a_long_reply_wraps_up_at_its_next_sentence_end() -> None:
    model = dataclasses.replace(MODEL, sentence_ends=frozenset({11}))
    targets = [10, 11, 12, 13, 11, 14, 15, 16]  # sentence ends at positions 1 and 4
    settings = SamplerSettings(block_size=1, wrap_after=3)
    tokens, stats = drain(
        sample(ScriptBackend(targets, [0.9] * 8, 3), PROMPT, model, settings, RNG(0), 8)
    )
    assert tokens == [10, 11, 12, 13, 11] and stats.stopped_by == "end"  # not after the first
    off = dataclasses.replace(settings, wrap_after=None)
    tokens, stats = drain(
        sample(ScriptBackend(targets, [0.9] * 8, 3), PROMPT, model, off, RNG(0), 8)
    )
    assert tokens == targets and stats.stopped_by == "budget"
    # in a block too, once the mark is committed (unsure: written left to right)
    wide = dataclasses.replace(settings, block_size=8)
    tokens, _ = drain(sample(ScriptBackend(targets, [0.5] * 8, 3), PROMPT, model, wide, RNG(0), 8))
    assert tokens == [10, 11, 12, 13, 11]


def test_a_sentence_break_announces_each_held_sentence_that_starts_with_a_space() -> None:
    targets = [10, 11, 13, 12, 14, 15, 16, 12, 17, 18, 19, 12, 21, 22, 23, 24]
    on = SamplerSettings(**ONE_BY_ONE, stop_repeats=True)  # type: ignore[arg-type]
    says = dataclasses.replace(SAYS, spaced=frozenset({14, 17}))  # " 14 ...", " 17 ..."
    b = ScriptBackend(targets, [0.5] * len(targets), len(PROMPT))
    out, stats = drain(sample(b, PROMPT, says, on, RNG(0), 16, breaks=True))
    # the first sentence as it comes, then its break (14 is written, held); the second
    # whole, then its break; 21 starts no spaced sentence: no break before it
    B = SENTENCE_BREAK
    assert out == [10, 11, 13, 12, B, 14, 15, 16, 12, B, 17, 18, 19, 12, 21, 22, 23, 24]
    assert stats.tokens == 16
    b = ScriptBackend(targets, [0.5] * len(targets), len(PROMPT))
    _, _, events = sampled_with_events(b, says, on, 16)  # without breaks: none
    assert str(SENTENCE_BREAK) not in events


def test_the_engine_says_a_sentence_break_as_the_next_sentence_s_space() -> None:
    """The engine's text (model/diffusion_engine.py ``_text``): the space comes at the
    break, the next sentence's words after it without a second one; the server's
    splitter ends the first sentence at the break, not when the next one is out."""
    from model.diffusion_engine import _text
    from server.speech import SentenceSplitter

    tok = tiny_tokenizer()
    ids = [*tok.encode("It is Rome."), SENTENCE_BREAK, *tok.encode(" It is old.")]

    def stream():  # type: ignore[no-untyped-def]
        yield from ids
        return GenerationStats(len(ids) - 1, len(ids), "end")

    pieces, stats = drain(_text(stream(), tok.stream_decoder()))
    assert "".join(pieces) == "It is Rome. It is old." and stats.tokens == len(ids) - 1
    said = ["".join(pieces[: i + 1]) for i in range(len(pieces))]
    at = said.index("It is Rome. ")  # the break's space, before any of " It is old."
    splitter = SentenceSplitter()
    assert [s for p in pieces[: at + 1] for s in splitter.feed(p)] == ["It is Rome."]
    assert sentence_end_ids(tok) and spaced_ids(tok) >= set(tok.encode(" It")[:1])


def test_forced_tokens_in_blocks_of_one_commit_in_one_causal_pass() -> None:
    """A call's tail laid into a narrow reply: one pass, not one each; the words after
    it are what one commit each would give (a block of one attends causally)."""
    targets = [20, 21, 22, 10, 11, 12]
    b = Shifted(targets, [0.9] * 6, len(PROMPT))
    model = DiffusionConfig(MASK, frozenset({END}), "block", shift=True)
    narrow = SamplerSettings(block_size=1)
    gen = sample(b, PROMPT, model, narrow, RNG(0), 6, forced=[20, 21, 22])
    tokens, stats = drain(gen)
    assert tokens == [10, 11, 12] and stats.forward_passes == 1 + 1 + 2
    commits = [(attend, ids) for attend, commit, ids in b.calls if commit]
    assert commits == [
        ("causal", PROMPT),
        ("causal", [20, 21, 22]),
        ("block", [10]),
        ("block", [11]),
    ]


def test_is_in_answers_as_np_isin_for_every_set_the_sampler_asks_about() -> None:
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.integers(0, 600, 200), [-1, 599, 600, 10_000]]).astype(np.int64)
    for ids in (frozenset(), frozenset({2}), frozenset(int(i) for i in rng.integers(0, 500, 40))):
        assert (is_in(x, ids) == np.isin(x, list(ids))).all()
