"""Samplers for the diffusion reply model, written against StepBackend (numpy logits).

A reply is produced in blocks of ``B`` positions, left to right. A block starts as ``B``
mask tokens; each denoising step runs the model over the block, proposes a token for
every masked position and commits some of them; the rest stay masked for the next step.
Which ones commit is the *commit rule*, a pure function (:func:`decide`):

* ``"lowconf"``, low-confidence remasking (LLaDA, Nie et al. 2025, Alg. 5): a fixed
  number of commits per step, ``ceil(masked / steps_left)``, most confident first, so
  a block takes exactly ``steps_per_block`` steps.
* ``"threshold"``, confidence-aware parallel decoding (Fast-dLLM, Wu et al. 2025): every
  masked position whose confidence exceeds ``threshold``; when none does, one position
  still commits, so a step always makes progress: the leftmost masked one
  (``fallback="leftmost"``, the default: with the logit shift it is the one predicted
  from committed tokens only, so an unsure block is written left to right, like the
  model it was adapted from) or the most confident one (``"confident"``, as published).

With ``attention="block"`` (BD3-LM, Arriola et al. 2025; Fast-dLLM v2) the prompt is
prefilled causally into the KV cache once, each noisy block attends to the cache and
to itself, and a finished block is committed to the cache with one more pass, so the
cache of finished blocks is exact. With ``attention="full"`` (LLaDA, Dream as
published) every step runs the whole sequence, prompt included, without a cache.

With the Dream logit shift (Ye et al. 2025), logits at position ``i`` predict the token
at ``i + 1``: the first position of a block is predicted by the last row of the pass
before it (the prefill or the previous block's commit), the others by the block's own
rows ``0..B-2``.

End of reply: once an end token is committed at position ``j``, every position after
``j`` becomes that end token (never generated) and no further block starts. Tokens are
released as soon as they are final, that is once no mask precedes them, so speech can
start before the last block is denoised.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from model.backend import Prefix, StepBackend, last_row
from model.engine import GenerationStats
from model.openings import Opening, completed_opening
from model.tokenizer import Tokenizer

Rule = Literal["threshold", "lowconf"]
Fallback = Literal["confident", "leftmost"]
Attention = Literal["block", "full"]
Ids = NDArray[np.int64]


@dataclass(frozen=True)
class DiffusionConfig:
    """What a sampler needs to know about the model; ids come from its config/tokenizer."""

    mask_id: int
    end_ids: frozenset[int]  # tokens that end a reply (ChatML <|im_end|>, eos)
    attention: Attention = "block"  # "block": block-causal with a KV cache; "full": LLaDA
    shift: bool = True  # Dream: logits at i predict the token at i + 1
    # tokens that end a sentence (".", "?", "!" last): what ``ends_after_sentence`` lets
    # a reply end after (empty: the rule has nothing to read and is off)
    sentence_ends: frozenset[int] = frozenset()
    # per token id, the id of the same word in lower case without its leading space
    # ("You", " you" -> one key): what ``stop_repeats`` compares sentences by (empty: off)
    word_keys: tuple[int, ...] = ()
    # tokens whose text starts with white space: a sentence held whole (``stop_repeats``)
    # that starts with one may be announced by ``SENTENCE_BREAK`` before it is released
    spaced: frozenset[int] = frozenset()


# What ``sample(..., breaks=True)`` yields where a released sentence is over and the next
# one, held whole until it is (``stop_repeats``), starts with white space: the voice loop
# can speak the sentence now rather than when the next one's first word comes out.
SENTENCE_BREAK = -1


@dataclass(frozen=True)
class SamplerSettings:
    # Blocks of 16 with the adapter trained on blocks of 8 end more held-out replies
    # inside the budget than blocks of 8 at the same likelihood
    # (docs/results/2026-11-decoding-settings.md)
    block_size: int = 16
    # "threshold" is served; "lowconf" is LLaDA's published rule, what published LLaDA
    # and Dream checkpoints answer with (model.nn.hf_formats)
    rule: Rule = "threshold"
    threshold: float = 0.9  # "threshold": commit every masked position above it
    # "threshold": the position committed when none is above it (at least one per step);
    # "leftmost" scores best on quality with the shipped adapter (docs/training.md)
    fallback: Fallback = "leftmost"
    # "lowconf": steps per block, commits spread evenly. "threshold": the most steps a
    # block may take; its last step commits whatever is still masked. None: the block
    # size, so a threshold block never has to commit below the threshold more than one
    # position per step (what docs/training.md validates; fewer steps force commits and
    # the replies repeat themselves: docs/results/2026-11-decoding-settings.md)
    steps_per_block: int | None = None
    temperature: float = 0.0  # 0: greedy; > 0: Gumbel-max sampling
    # step budget: denoising passes per reply, all blocks together. None: what the
    # reply's blocks may take (blocks x steps per block), so only max_tokens binds
    max_steps: int | None = None
    # An end token commits only with at most this many masked positions before it (0:
    # once the reply before it is written; None: anywhere, as published). A confident
    # end far out in the block fixes the reply's length before its words ("A mile is
    # approximately 1."); 8 keeps the clean ends a look ahead gives (docs/diffusion.md)
    end_lookahead: int | None = 8
    # An end token commits only right after a committed token that ends a sentence
    # (``DiffusionConfig.sentence_ends``). The tools adapter, trained on short call
    # confirmations, ends factual answers before their last words ("The capital of
    # Italy"); held to a sentence's end it writes them ("... is Rome.")
    ends_after_sentence: bool = False
    # A sentence after the reply's first is released only once it is whole, and when
    # most of its word pairs (``REPEAT_SHARE``) are already in the reply's earlier
    # sentences the reply ends before it: "You can avoid them by avoiding them." said
    # once, not to the budget. Needs ``DiffusionConfig.word_keys`` and ``sentence_ends``.
    # The first sentence streams as before (a listener waits for it)
    stop_repeats: bool = False
    # An end token is proposed wherever the end's probability (all end ids together)
    # reaches this, not only where it is the likeliest token (None: off). Where ends are
    # allowed only after a sentence's end, it asks how sure the model is that the reply
    # could stop there
    end_bar: float | None = None
    # A reply this many tokens long ends at its next sentence's end (None: off): a spoken
    # reply that has said this much wraps up instead of running into its budget
    wrap_after: int | None = None

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.block_steps < 1 or (self.max_steps or 1) < 1:
            raise ValueError(f"block_size, steps_per_block, max_steps must be >= 1: {self}")
        if self.rule not in ("threshold", "lowconf"):
            raise ValueError(f"unknown commit rule {self.rule!r}")
        if self.fallback not in ("confident", "leftmost"):
            raise ValueError(f"unknown fallback {self.fallback!r}")
        if (self.wrap_after or 0) < 0:
            raise ValueError(f"wrap_after must be >= 0 or None: {self}")
        if (self.end_lookahead or 0) < 0:
            raise ValueError(f"end_lookahead must be >= 0 or None: {self}")

    @property
    def block_steps(self) -> int:
        """The most denoising steps a block may take."""
        return self.block_size if self.steps_per_block is None else self.steps_per_block

    def blocks(self, max_tokens: int) -> list[tuple[int, int]]:
        """The reply's blocks ``[lo, hi)`` that cover ``max_tokens`` positions (the last
        one whole, so it may reach past them)."""
        B = self.block_size
        return [(lo, lo + B) for lo in range(0, max(max_tokens, 0), B)]

    def step_budget(self, max_tokens: int) -> int:
        """Denoising steps a reply of at most ``max_tokens`` may take in all."""
        if self.max_steps is not None:
            return self.max_steps
        return self.block_steps * len(self.blocks(max_tokens))


# ---------------------------------------------------------------------------- decisions


@functools.lru_cache(maxsize=32)
def _table(ids: frozenset[int]) -> NDArray[np.bool_]:
    """``ids`` as a lookup table: the sets the sampler asks about (end tokens, sentence
    ends) are fixed per model, and a lookup costs a fraction of ``np.isin``, which the
    sampler called five times a token (a quarter of its time a token in blocks of one)."""
    table = np.zeros(max(ids, default=-1) + 1, bool)
    table[list(ids)] = True
    return table


def is_in(x: Ids, ids: frozenset[int]) -> NDArray[np.bool_]:
    """``np.isin(x, list(ids))`` for token ids ``x`` (a mask id, past every id, is in no
    set)."""
    table = _table(ids)
    inside = (x >= 0) & (x < table.size)
    return inside & table[np.where(inside, x, 0)] if table.size else inside


def propose(
    logits: NDArray[np.float32], temperature: float, rng: np.random.Generator
) -> tuple[Ids, NDArray[np.float32]]:
    """A token and its confidence for every row of ``logits (N, V)``.

    Greedy at temperature 0, else Gumbel-max sampling from softmax(logits / T). The
    confidence is the model's probability of the chosen token, softmax(logits)[token].
    """
    tokens, conf, _ = _propose(logits, temperature, rng)
    return tokens, conf


def _propose(
    logits: NDArray[np.float32], temperature: float, rng: np.random.Generator
) -> tuple[Ids, NDArray[np.float32], tuple[NDArray[np.float32], NDArray[np.float32]]]:
    """:func:`propose`, and the softmax's parts (exp(z) (N, V) and its row sums (N,)),
    for the end bar to read rather than compute again."""
    if temperature > 0:
        noisy = logits / temperature + rng.gumbel(size=logits.shape)
        tokens = noisy.argmax(-1)
    else:
        tokens = logits.argmax(-1)
    z = logits - logits.max(-1, keepdims=True)  # (N, V), stable softmax
    chosen = np.take_along_axis(z, tokens[:, None], -1)[:, 0]  # (N,)
    e = np.exp(z)
    total = e.sum(-1)
    conf = np.exp(chosen) / total
    return tokens.astype(np.int64), conf.astype(np.float32), (e, total)


def choose(
    confidence: NDArray[np.float32],
    masked: NDArray[np.bool_],
    n: int | None = None,
    threshold: float | None = None,
    fallback: Fallback = "confident",
) -> Ids:
    """Positions to commit, ascending: the ``n`` most confident masked ones, or every
    masked one with confidence > ``threshold``; when none is above it, the most confident
    (``fallback="confident"``) or the leftmost (``"leftmost"``). Ties go to the leftmost."""
    cand = np.flatnonzero(masked)
    order = cand[np.argsort(-confidence[cand], kind="stable")]
    if threshold is not None:
        above = cand[confidence[cand] > threshold]
        if above.size == 0 and fallback == "leftmost":
            return cand[:1]
        n = max(1, above.size)
    assert n is not None, "choose needs n or threshold"
    return np.sort(order[: min(n, cand.size)])


def decide(
    logits: NDArray[np.float32],
    masked: NDArray[np.bool_],
    settings: SamplerSettings,
    steps_left: int,
    rng: np.random.Generator,
    end_ids: frozenset[int] = frozenset(),
    end_waits: NDArray[np.bool_] | None = None,
) -> tuple[Ids, Ids]:
    """The commit rule: which masked positions of a block commit, and to which tokens.

    ``logits (N, V)`` predict the block's ``N`` positions (only the masked ones' rows
    are read); ``masked (N,)`` marks those still undecided; ``steps_left`` counts this
    step. The last step commits them all.
    An end token (``end_ids``) proposed behind more than ``settings.end_lookahead``
    masked positions counts as confidence 0 (the block's earlier blocks are final, so
    the masked positions before it are the words the reply still lacks); so does one at a
    position ``end_waits (N,)`` marks (the sentence-end rule: the word before it unwritten).
    """
    where = np.flatnonzero(masked)
    if where.size == 1 and settings.temperature == 0:
        # one position commits whatever its confidence (blocks of one: every step), so
        # only the end bar reads the softmax, and mostly it need not be computed
        return where, _greedy_one(logits[where], settings.end_bar, end_ids, rng)
    tokens, conf, softmax = _propose(logits[where], settings.temperature, rng)  # (M,), (M,)
    if settings.end_bar is not None and end_ids:
        tokens, conf = _end_at_bar(softmax, tokens, conf, settings.end_bar, end_ids)
    if settings.end_lookahead is not None and end_ids:
        behind = np.arange(where.size) > settings.end_lookahead  # masked ones before it
        conf = np.where(behind & is_in(tokens, end_ids), np.float32(0), conf)
    if end_waits is not None and end_ids:
        conf = np.where(end_waits[where] & is_in(tokens, end_ids), np.float32(0), conf)
    every = np.ones(where.size, dtype=bool)
    if steps_left <= 1:
        pick = np.arange(where.size)
    elif settings.rule == "lowconf":
        pick = choose(conf, every, n=math.ceil(where.size / steps_left))
    else:
        pick = choose(conf, every, threshold=settings.threshold, fallback=settings.fallback)
    return where[pick], tokens[pick]


@functools.lru_cache(maxsize=32)
def _sorted(ids: frozenset[int]) -> Ids:
    """``ids`` ascending, as an index array (the end tokens: fixed per model)."""
    return np.array(sorted(ids), np.int64)


def _greedy_one(
    row: NDArray[np.float32],
    bar: float | None,
    end_ids: frozenset[int],
    rng: np.random.Generator,
) -> Ids:
    """:func:`decide`'s token for one position at temperature 0: the likeliest, or the
    likeliest end where the ends together reach ``bar``. The softmax's sum (``exp``
    over the whole vocabulary, most of a step's sampling time) is computed only where
    the ends' own terms come near the bar: the sum holds the top token's term, 1, so
    the ends' probability is at most their terms' sum."""
    top: Ids = row.argmax(-1).astype(np.int64)
    if bar is None or not end_ids:
        return top
    near = np.exp(row[:, _sorted(end_ids)] - row[0, top[0]]).sum()
    if near < bar * (1 - 1e-4):  # the margin covers the sums' rounding
        return top
    tokens, conf, softmax = _propose(row, 0.0, rng)  # temperature 0: no draw
    return _end_at_bar(softmax, tokens, conf, bar, end_ids)[0]


def _end_at_bar(
    softmax: tuple[NDArray[np.float32], NDArray[np.float32]],
    tokens: Ids,
    conf: NDArray[np.float32],
    bar: float,
    end_ids: frozenset[int],
) -> tuple[Ids, NDArray[np.float32]]:
    """``tokens`` with the likeliest end token wherever the end's probability reaches
    ``bar``; its confidence is that probability. ``softmax``: exp(z) and its row sums
    (:func:`_propose`)."""
    ends = _sorted(end_ids)
    p, total = softmax
    p_end = p[:, ends].sum(-1) / total
    at = p_end >= bar
    best = ends[p[:, ends].argmax(-1)]
    return np.where(at, best, tokens), np.where(at, p_end.astype(np.float32), conf)


def cut_at_end(x: Ids, lo: int, hi: int, end_ids: frozenset[int]) -> int | None:
    """Index of the first end token in ``x[lo:hi]``; everything after it becomes that
    token, so it is never generated. None when there is none."""
    ends = np.flatnonzero(is_in(x[lo:hi], end_ids))
    if ends.size == 0:
        return None
    j = lo + int(ends[0])
    x[j + 1 :] = x[j]
    return j


# ---------------------------------------------------------------------------- the loop


@dataclass
class _Reply:
    """The state of one reply: its positions and what it has cost so far."""

    model: DiffusionConfig
    settings: SamplerSettings
    rng: np.random.Generator
    should_stop: Callable[[], bool]
    x: Ids  # reply tokens up to the last block's end, mask where undecided
    limit: int  # positions that may be generated (max_tokens)
    blocks: list[tuple[int, int]]  # [lo, hi) of each block (SamplerSettings.blocks)
    budget: int  # denoising steps the reply may take (SamplerSettings.step_budget)
    passes: int = 0  # model passes: prefill, denoising steps, block commits
    steps: int = 0  # denoising steps (what the step budget counts)
    done: int = 0  # reply tokens released (forced ones included)
    ended: bool = False  # an end token was committed
    skipped: int = 0  # forced tokens: placed, never released
    avoid: Sequence[Opening] = ()  # openings the reply may not start with (model/openings.py)
    never: Ids = field(default_factory=lambda: np.zeros(0, np.int64))  # tokens it never writes
    # stop_repeats: the word pairs of the sentences released so far, where the next one
    # starts, whether the reply was ended before a repeated sentence
    pairs: set[tuple[int, int]] = field(default_factory=set)
    sentence: int = 0
    repeat_cut: bool = False
    breaks: bool = False  # announce held sentences (SENTENCE_BREAK)
    broke: int = 0  # the position of the last one announced

    def stats(self, stopped_by: Literal["end", "budget", "cancel"]) -> GenerationStats:
        tokens = self.done - self.skipped
        return GenerationStats(tokens, self.passes, stopped_by, self.repeat_cut)


def _never() -> bool:
    return False


def sample(
    backend: StepBackend,
    prompt: Sequence[int],
    model: DiffusionConfig,
    settings: SamplerSettings,
    rng: np.random.Generator,
    max_tokens: int,
    should_stop: Callable[[], bool] = _never,
    prefix: Prefix | None = None,
    forced: Sequence[int] = (),
    avoid: Sequence[Opening] = (),
    never: Sequence[int] = (),
    breaks: bool = False,
) -> Generator[int, None, GenerationStats]:
    """Yield reply token ids (end token excluded) as soon as they are final.

    ``prefix``: a cache already holding the start of ``prompt`` (block attention only);
    the rest of the prompt is prefilled, and the cache ends up holding the prompt and
    the committed blocks. ``forced``: the reply's first tokens, already decided (a tool
    call, ``model/actions.py``): laid into the first block as committed, never yielded,
    and counted in ``max_tokens``. ``avoid``: token sequences the reply's words (after
    ``forced``) may not start with (:mod:`model.openings`); ``never``: token ids it may
    not write anywhere. ``breaks``: also yield :data:`SENTENCE_BREAK` where a sentence
    is over and the next, held, has begun (``stop_repeats``). Returns the reply's
    :class:`GenerationStats` (tokens: the yielded ones); ``stopped_by`` is "end" (an
    end token), "budget" (``max_tokens`` or the step budget), "cancel".
    """
    if not prompt:
        raise ValueError("the prompt is empty")
    blocks = settings.blocks(max_tokens)
    x = np.full(blocks[-1][1] if blocks else 0, model.mask_id, dtype=np.int64)
    limit = max(max_tokens, 0)
    if len(forced) > limit:
        raise ValueError(f"{len(forced)} forced tokens do not fit in {limit}")
    x[: len(forced)] = forced
    r = _Reply(model, settings, rng, should_stop, x, limit, blocks, settings.step_budget(limit))
    r.done = r.skipped = r.sentence = len(forced)
    r.avoid = avoid
    r.never = np.asarray(never, np.int64)
    r.breaks = breaks
    if r.limit == 0:
        return r.stats("budget")
    if model.attention == "full":
        stats = yield from _sample_full(backend, np.asarray(prompt, np.int64), r)
    else:
        stats = yield from _sample_blocks(backend, np.asarray(prompt, np.int64), r, prefix)
    if stats.stopped_by == "budget":  # the step budget: a sentence may still be held
        yield from _release(r, final=True)
        stats = r.stats("end" if r.repeat_cut else "budget")
    return stats


def _sample_blocks(
    backend: StepBackend, prompt: Ids, r: _Reply, prefix: Prefix | None
) -> Generator[int, None, GenerationStats]:
    """Block-causal decoding: causal prefill, then blocks committed to the KV cache."""
    cache = prefix.cache if prefix is not None else backend.new_cache()
    # the whole prompt cached with its last row known: nothing to prefill; else >= 1 token
    known = prefix is not None and prefix.last is not None and prefix.length == prompt.size
    start = 0 if prefix is None else min(prefix.length, prompt.size - (0 if known else 1))
    backend.truncate(cache, start)
    if r.should_stop():
        return r.stats("cancel")
    if known:
        assert prefix is not None
        last = prefix.last
    else:
        chunk = prompt[start:]
        last = backend.step(cache, chunk, "causal", commit=True, rows=last_row(chunk))[-1]
        r.passes += 1
    blocks = r.blocks
    if r.settings.block_size == 1 and 0 < r.skipped < r.limit:
        # forced tokens in blocks of one: committed in one causal pass, which computes
        # what one commit each would (a block of one attends as causal attention does)
        chunk = r.x[: r.skipped]
        last = backend.step(cache, chunk, "causal", commit=True, rows=last_row(chunk))[-1]
        r.passes += 1
        blocks = blocks[r.skipped :]
    for lo, hi in blocks:
        block = r.x[lo:hi]  # a view: commits write into r.x

        def predict(
            want: Ids, block: Ids = block, last: NDArray[np.float32] = last
        ) -> NDArray[np.float32]:
            rows = want - 1 if r.model.shift else want  # block row i predicts i + shift
            if (rows >= 0).any():
                logits = backend.step(cache, block, "block", commit=False, rows=rows[rows >= 0])
                r.passes += 1
            else:  # only the first position, from the pass before: no pass to run (a
                # denoising step changes no cache), so a block of 1 costs one pass, as AR
                logits = np.empty((0, last.size), last.dtype)
            if rows.size and rows[0] < 0:  # the block's first position: the pass before
                logits = np.concatenate([last[None], logits])
            return logits

        if not (yield from _denoise(r, lo, hi, predict)):
            return r.stats("cancel")
        if (stop := _finished(r, hi)) is not None:
            return r.stats(stop)
        if r.should_stop():
            return r.stats("cancel")
        last = backend.step(cache, block, "block", commit=True, rows=last_row(block))[-1]
        r.passes += 1
    return r.stats("budget")  # not reached: _finished stops at the last block


def _sample_full(
    backend: StepBackend, prompt: Ids, r: _Reply
) -> Generator[int, None, GenerationStats]:
    """LLaDA-style decoding: every step runs prompt + whole reply, bidirectionally."""
    P, s = prompt.size, int(r.model.shift)
    cache = backend.new_cache()  # stays empty: nothing is committed
    for lo, hi in r.blocks:

        def predict(want: Ids, lo: int = lo) -> NDArray[np.float32]:
            seq = np.concatenate([prompt, r.x])  # (P + N,)
            r.passes += 1
            return backend.step(cache, seq, "block", commit=False, rows=P + lo - s + want)

        if not (yield from _denoise(r, lo, hi, predict)):
            return r.stats("cancel")
        if (stop := _finished(r, hi)) is not None:
            return r.stats(stop)
    return r.stats("budget")


def _finished(r: _Reply, hi: int) -> Literal["end", "budget"] | None:
    """Why the reply stops after the block ending at ``hi``, or None to go on."""
    if r.ended:
        return "end"
    if hi >= r.limit or r.steps >= r.budget:
        return "budget"
    return None


def _denoise(
    r: _Reply, lo: int, end: int, predict: Callable[[Ids], NDArray[np.float32]]
) -> Generator[int, None, bool]:
    """Denoise the block ``[lo, end)`` until none of its live positions is masked,
    yielding tokens as they become final. ``predict(want)`` gives logits for the block
    positions ``want`` only (the masked ones: the only rows read, so the only ones the
    model computes) and counts the model passes it runs. Returns False if cancelled."""
    hi = min(end, r.limit)  # live positions: [lo, hi)
    steps = r.settings.block_steps
    taken = 0  # steps spent on this block
    while (masked := r.x[lo:hi] == r.model.mask_id).any():
        if r.should_stop():
            return False
        left = min(steps - taken, r.budget - r.steps)
        want = np.flatnonzero(masked)
        rows = predict(want)  # (M, V)
        logits = np.empty((masked.size, rows.shape[-1]), rows.dtype)  # (live, V)
        logits[want] = _no_mask(rows, r.model.mask_id)  # the other rows are never read
        if r.never.size:
            logits[:, r.never] = -np.inf
        waits = None
        if r.settings.ends_after_sentence and r.model.sentence_ends:
            waits = _end_after_sentences(logits, r.x, lo, want, r.model)
        if r.settings.wrap_after is not None and r.model.sentence_ends:
            _wrap_up(logits, r.x, lo, want, r.settings.wrap_after, r.model)
        r.steps, taken = r.steps + 1, taken + 1  # predict counts the passes it runs
        pos, tok = decide(logits, masked, r.settings, left, r.rng, r.model.end_ids, waits)
        while r.avoid and (ban := completed_opening(r.x, lo + pos, tok, r.avoid, r.skipped)):
            logits[ban[0] - lo, ban[1]] = -np.inf  # decide again without it
            pos, tok = decide(logits, masked, r.settings, left, r.rng, r.model.end_ids, waits)
        r.x[lo + pos] = tok
        if cut_at_end(r.x, lo, hi, r.model.end_ids) is not None:
            r.ended = True
        yield from _release(r)
    return True


def _end_after_sentences(
    logits: NDArray[np.float32], x: Ids, lo: int, want: Ids, model: DiffusionConfig
) -> NDArray[np.bool_]:
    """The sentence-end rule at the masked block positions ``want``: an end token is
    barred (in place) after a committed token that does not end a sentence, and at the
    reply's first position (an empty reply is no answer); after a masked one it waits
    (returned: the live block positions where an end may not commit yet), so the word
    before it is written first, not replaced by the model's second choice."""
    before = lo + want - 1
    prev = x[np.maximum(before, 0)]
    ends_sentence = is_in(prev, model.sentence_ends) & (before >= 0)
    written = (prev != model.mask_id) | (before < 0)  # the reply's start: nothing to wait for
    barred = want[~ends_sentence & written]
    logits[np.ix_(barred, _sorted(model.end_ids))] = -np.inf
    waits = np.zeros(logits.shape[0], bool)
    waits[want[~written]] = True
    return waits


def _wrap_up(
    logits: NDArray[np.float32], x: Ids, lo: int, want: Ids, after: int, model: DiffusionConfig
) -> None:
    """``wrap_after``: at the masked block positions ``want`` that follow a committed
    sentence's end at or past reply position ``after``, the end token is certain (in
    place)."""
    at = lo + want
    ends = is_in(x[np.maximum(at - 1, 0)], model.sentence_ends) & (at >= max(after, 1))
    logits[want[ends]] = -np.inf
    logits[want[ends], min(model.end_ids)] = 0.0


def sentence_end_ids(tokenizer: Tokenizer) -> frozenset[int]:
    """The ids whose text ends a sentence: ``.``, ``?`` or ``!`` last (closing quotes
    and brackets aside), an ellipsis not."""
    out = set()
    for i in range(tokenizer.vocab_size):
        text = tokenizer.token_bytes(i).decode("utf-8", "replace").rstrip().rstrip("\"')]")
        if text.endswith((".", "?", "!")) and not text.endswith(".."):
            out.add(i)
    return frozenset(out)


def spaced_ids(tokenizer: Tokenizer) -> frozenset[int]:
    """The ids whose text starts with white space (" It", "\\n")."""
    return frozenset(
        i for i in range(tokenizer.vocab_size) if tokenizer.token_bytes(i)[:1].isspace()
    )


def word_keys(tokenizer: Tokenizer) -> tuple[int, ...]:
    """Per token id, the first id whose text is the same word: lower case, without the
    leading space a word has inside a sentence; every number one word, so that "3.
    Identify the tire." repeats "2. Identify the tire." (``DiffusionConfig.word_keys``)."""
    first: dict[str, int] = {}
    out = []
    for i in range(tokenizer.vocab_size):
        text = tokenizer.token_bytes(i).decode("utf-8", "replace").strip().lower()
        out.append(first.setdefault("0" if text.isdigit() else text, i))
    return tuple(out)


def _no_mask(logits: NDArray[np.float32], mask_id: int) -> NDArray[np.float32]:
    """Never propose the mask token (LLaDA and Dream have it inside their vocabulary)."""
    if mask_id >= logits.shape[-1]:
        return logits  # SmolLM2: the head has no mask logit
    logits = logits.copy()
    logits[:, mask_id] = -np.inf
    return logits


def _release(r: _Reply, final: bool = False) -> list[int]:
    """Tokens that just became final: the run of committed tokens after the released
    ones, up to the first mask or end token (with ``stop_repeats``, past the first
    sentence: up to the last whole sentence, unless the reply is over or ``final``)."""
    k = r.done
    while k < r.limit and r.x[k] != r.model.mask_id and int(r.x[k]) not in r.model.end_ids:
        k += 1
    if r.settings.stop_repeats and r.model.word_keys and r.model.sentence_ends:
        over = final or k >= r.limit or int(r.x[k]) in r.model.end_ids
        k = _whole_sentences(r, k, over)
    out: list[int]
    out, r.done = r.x[r.done : k].tolist(), k
    held = k < r.limit and int(r.x[k]) in r.model.spaced
    if r.breaks and r.sentence == k > max(r.broke, r.skipped) and held:
        r.broke = k  # released to a sentence's end, and the held one has begun
        out.append(SENTENCE_BREAK)
    return out


REPEAT_SHARE = 0.8  # of a sentence's word pairs already said: it repeats the reply
REPEAT_MIN_PAIRS = 3  # shorter "sentences" ("Yes.", a list's "2.") go on with the next


def _whole_sentences(r: _Reply, k: int, over: bool) -> int:
    """How far the committed run ``[r.done, k)`` may be released under ``stop_repeats``:
    each sentence that ends in it is checked against the earlier ones and released, or
    the reply ends before it (``r.x`` cut there, ``r.ended``); the sentence not yet
    ended is held, except the reply's first and a tail when the reply is ``over``."""
    keys, x = r.model.word_keys, r.x
    ends = [j + 1 for j in range(r.done, k) if int(x[j]) in r.model.sentence_ends]
    if over and k > r.sentence and (not ends or ends[-1] != k):
        ends.append(k)
    released = r.done
    for end in ends:
        words = [keys[int(t)] for t in x[r.sentence : end]]
        pairs = list(itertools.pairwise(words))
        short = len(pairs) < REPEAT_MIN_PAIRS
        if short and not (over and end == k):  # "2." of a list, "Yes.": goes on with
            continue  # the next sentence
        said = sum(p in r.pairs for p in pairs)
        if r.pairs and not short and said >= REPEAT_SHARE * len(pairs):
            x[r.sentence :] = min(r.model.end_ids)
            r.ended = r.repeat_cut = True
            return r.sentence  # >= r.done: past the first sentence, release stops at ends
        r.pairs.update(pairs)
        released = r.sentence = end
    return k if not r.pairs else released
