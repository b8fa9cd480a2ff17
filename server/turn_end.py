"""The end-of-turn decision's text side: does what the user said so far read as finished?

The endpointer (:mod:`audio.endpoint`) finds pauses from voice activity alone; the
session makes a pause the end of the turn once its transcript is known. What the words
say decides how much silence that takes (docs/turn_end.md):

- :class:`EndOfTurnModel` scores a transcript: the probability that the turn is
  complete, read off SmolLM2's next-token distribution after the user's words (the
  idea behind LiveKit's turn detector, which fine-tunes this same 135M model; here the
  served model is used as it is, so the score costs one short causal prefill on the
  backend the server already has loaded);
- :func:`looks_incomplete` is the word heuristic: a trailing comma, article,
  conjunction or filler;
- :class:`TurnEndPolicy` turns (transcript, probability, silence so far) into "final
  now" or "wait", with an ``eagerness`` of low / medium / high (as OpenAI's
  semantic_vad) choosing its thresholds and how long an unfinished turn is held.

Pure logic apart from the scorer's one forward pass; no clock, no I/O.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from model.backend import ends_a_turn

if TYPE_CHECKING:
    from model.backend import StepBackend
    from model.runtime import Device
    from model.tokenizer import Tokenizer

# Words after which an English sentence (almost) never ends: articles, possessives,
# conjunctions, a few prepositions that are never particles ("turn it on" ends in one),
# fillers. Deliberately short: a false "unfinished" costs the hold
# (TurnEndPolicy.hold_ms) of waiting, a false "finished" answers half a question.
_DANGLING = frozenset(
    [
        *("a", "an", "the", "my", "your", "our", "their", "its"),
        *("and", "or", "but", "because", "if", "while", "than", "whether"),
        *("of", "to", "at", "into"),
        *("um", "uh", "er", "erm"),
    ]
)


def trails_off(text: str) -> bool:
    """The transcript ends with a comma, dash, ellipsis, semicolon or colon: Whisper
    heard the voice go on or trail away ("How far is it from here...")."""
    return text.strip().endswith((",", "-", "\u2014", "...", "\u2026", ";", ":"))


def looks_incomplete(text: str) -> bool:
    """Heuristic on a (speculative) transcript: does it stop mid-sentence?

    True when it is empty of words, :func:`trails_off`, or ends with a word no English
    sentence ends with. :class:`TurnEndPolicy` (``use_words``) never answers such a
    transcript early, and holds it when it trails off or the model is unsure too.
    """
    if trails_off(text):
        return True
    words = re.findall(r"[a-z']+", text.lower())
    return not words or words[-1] in _DANGLING


# -- the model's score ----------------------------------------------------------------

# What may follow the last word: final punctuation, closing quotes, an ellipsis, a
# dangling comma. Whisper writes a final "." or "?" on many cut-off utterances too
# ("What's the weather like in?"; 31-71% of those measured, docs/turn_end.md), so the
# score reads the words without it.
_TAIL = re.compile(r"[\s.?!,;:\"\u2026\u2014-]*$")
# A token that ends a sentence: ".", "?", "!", " ?", "?!", ... but not an ellipsis.
_STOP = re.compile(r" ?[.?!]+")


def normalize_transcript(text: str) -> str:
    """The transcript as the scorer reads it: NFKC, one space between words, stripped."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


def split_tail(text: str) -> tuple[str, str]:
    """``(words, tail)``: the transcript without its final punctuation, and that."""
    m = _TAIL.search(text)
    assert m is not None  # the pattern matches the empty string at the end
    return text[: m.start()], text[m.start() :]


@dataclass(frozen=True)
class TurnEndScores:
    """The two readings of one transcript, from one prefill."""

    complete: float  # P(the sentence ends here | the words, final punctuation removed)
    end_token: float  # P(<|im_end|> next | the transcript as the ASR wrote it)


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max(axis=-1, keepdims=True))
    out: np.ndarray = z / z.sum(axis=-1, keepdims=True)
    return out


class EndOfTurnModel:
    """P(the user's turn is complete | transcript) under SmolLM2, one causal prefill.

    The prompt is the ChatML opening of a user message, ``<|im_start|>user\\n`` and the
    transcript's words. The instruct model ends a finished message with a full stop
    (or "?", "!") and then ``<|im_end|>``; after an unfinished one ("Set a timer for")
    it puts almost all its mass on more words. Whisper, though, writes final
    punctuation on cut-off speech as well, so :meth:`probability` strips the tail and
    sums the probability of every sentence-ending token and ``<|im_end|>`` after the
    bare words. :meth:`scores` also gives P(``<|im_end|>``) after the transcript as
    written, the plain LiveKit-style reading, read off the same pass (measured in
    docs/results/2026-12-end-of-turn.md: the stripped reading is the one that works
    on Whisper's output).

    ``backend`` is any :class:`model.backend.StepBackend` of SmolLM2 (the server's
    reply backend can be shared: ONNX Runtime's ``run`` is thread-safe and each call
    uses its own cache); blocking, call it from a worker thread.
    """

    def __init__(self, backend: StepBackend, tokenizer: Tokenizer, max_tokens: int = 96) -> None:
        self.backend = backend
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens  # the last words decide: a long turn is cut on the left
        self._head = [tokenizer.im_start_id, *tokenizer.encode_plain("user\n")]
        self.stop_ids = np.asarray(sorted(_stop_tokens(tokenizer)), np.int64)

    @classmethod
    def from_model_dir(
        cls,
        model_dir: Path,
        variant: Literal["int8", "fp16", "fp32"] = "int8",
        threads: int = 1,
        device: Device = "cpu",
    ) -> EndOfTurnModel:
        """A scorer with its own ONNX Runtime session on ``model_dir`` (an exported
        model directory, :mod:`model.modeldir`), ``threads`` intra-op threads."""
        from model.assemble import load_onnx_backend
        from model.modeldir import load_tokenizer
        from model.runtime import RuntimeConfig

        config = RuntimeConfig(device=device, threads=threads, max_len=256)
        return cls(load_onnx_backend(model_dir, variant, config), load_tokenizer(model_dir))

    def probability(self, transcript: str) -> float:
        """P(complete) in [0, 1]; 0 for a transcript with no words. Blocking."""
        return self.scores(transcript).complete

    def scores(self, transcript: str) -> TurnEndScores:
        words, tail = split_tail(normalize_transcript(transcript))
        if not words:
            return TurnEndScores(0.0, 0.0)
        tok = self.tokenizer
        # The pre-tokenizer splits letters from punctuation, so the words' tokens are a
        # prefix of the whole transcript's: one pass reads both positions.
        body = tok.encode_plain(words)[-(self.max_tokens - len(self._head)) :]
        ids = [*self._head, *body, *tok.encode_plain(tail.strip())]
        rows = sorted({len(self._head) + len(body) - 1, len(ids) - 1})
        ends_a_turn()  # a listener waits on it: first in a shared pass
        cache = self.backend.new_cache()
        logits = self.backend.step(cache, np.asarray(ids, np.int64), "causal", True, rows=rows)
        p = _softmax(logits.astype(np.float64))  # (1 or 2, V): after the words, after all
        return TurnEndScores(float(p[0, self.stop_ids].sum()), float(p[-1, tok.im_end_id]))


def _stop_tokens(tok: Tokenizer) -> set[int]:
    """``<|im_end|>``, end of text, and every token that ends a sentence."""
    out = {tok.im_end_id, tok.eos_id}
    for i in range(tok.vocab_size):
        if i in tok.special_ids:
            continue
        text = tok.token_bytes(i).decode("utf-8", errors="replace")
        if _STOP.fullmatch(text) and not text.lstrip().startswith(".."):
            out.add(i)
    return out


# -- the policy -----------------------------------------------------------------------

Eagerness = Literal["low", "medium", "high"]
Tier = Literal["complete", "unsure", "incomplete", "empty"]


@dataclass(frozen=True)
class TurnEndPolicy:
    """How much silence a paused turn needs before it is final, from what was said.

    Three tiers by P(complete) (:class:`EndOfTurnModel`):

    - ``p >= complete_at``: final after ``complete_ms`` of silence (200 ms: "What is
      the capital of Australia?" is answered ~200 ms sooner than by silence alone),
      unless the ASR doubted the words (mean token log-probability under
      ``doubt_below``): a reading of misheard words is no evidence that the user is
      done ("What's a new recipe for dinner?", -0.93, was half a request);
    - ``p < hold_below``: held up to ``hold_ms`` ("What's the weather like in"); speech
      within that time continues the same turn;
    - in between (the model unsure): ``unsure_ms`` (900 ms at medium eagerness). A
      request the model cannot call finished may be half of one said with a pause
      ("Can you turn off the lights" 0.7 s "in the kitchen": P 0.08): the answer waits
      until a user who paused mid-request (0.3-0.8 s) has been heard going on;
    - a transcript with no words: ``default_ms``, the silence the endpointer waits
      anyway (``EndpointConfig.end_of_turn_ms``);
    - no probability: the hold if :func:`looks_incomplete`; else, with a score on its
      way (``pending``), ``unsure_ms`` unless the score comes first (a scorer slowed
      by the reply model's speculative passes let "Can you turn off the lights",
      0.7 s before "in the kitchen", through at the endpointer's silence), and with
      none coming (no scorer) ``default_ms``, today's rule.

    With ``use_words``, a transcript :func:`looks_incomplete` calls unfinished never
    takes the 200 ms path; one that :func:`trails_off` is held whatever the score (the
    model reads the words, not how the voice stopped: "How far is it from here..."
    scores complete), one with a dangling last word unless the model calls it
    complete ("What are you looking at?"). The
    defaults (:meth:`from_eagerness`) were chosen on the tuning half of
    ``bench.turn_end``'s labelled set and checked on its held-out half
    (docs/turn_end.md).
    """

    complete_at: float = 0.5
    hold_below: float = 0.01
    hold_ms: float = 1200.0
    complete_ms: float = 200.0
    default_ms: float = 416.0
    unsure_ms: float = 900.0
    doubt_below: float = -0.6  # ASR mean token log-probability; -inf: never doubted
    use_words: bool = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.hold_below <= self.complete_at <= 1.0:
            raise ValueError("need 0 <= hold_below <= complete_at <= 1")
        if not 0 <= self.complete_ms <= self.default_ms <= self.hold_ms:
            raise ValueError("need 0 <= complete_ms <= default_ms <= hold_ms")
        # the unsure wait lies between the endpointer's silence and the hold
        unsure = min(max(self.unsure_ms, self.default_ms), self.hold_ms)
        object.__setattr__(self, "unsure_ms", unsure)

    @classmethod
    def from_eagerness(
        cls, eagerness: Eagerness = "medium", default_ms: float = 416.0
    ) -> TurnEndPolicy:
        """The documented setting for ``eagerness`` (:data:`EAGERNESS`) around an
        endpointer that ends turns after ``default_ms`` (the 200 ms path, the unsure
        wait and the hold are clamped to it when it is shorter or longer)."""
        if eagerness not in EAGERNESS:
            raise ValueError(f"eagerness must be one of {', '.join(EAGERNESS)}, got {eagerness!r}")
        base = EAGERNESS[eagerness]
        return replace(
            base,
            default_ms=default_ms,
            complete_ms=min(base.complete_ms, default_ms),
            hold_ms=max(base.hold_ms, default_ms),
        )

    def tier(
        self, transcript: str, probability: float | None, asr_logprob: float | None = None
    ) -> Tier:
        """Which path the turn takes; ``probability`` None (no scorer, or its score is
        not in yet) is today's rule: held if the words look unfinished, else default;
        ``asr_logprob``: the ASR's mean token log-probability (None: not known)."""
        if not split_tail(normalize_transcript(transcript))[0]:
            return "empty"
        words_say_unfinished = self.use_words and looks_incomplete(transcript)
        if probability is None:
            return "incomplete" if looks_incomplete(transcript) else "unsure"
        if self.use_words and trails_off(transcript):
            return "incomplete"
        if probability >= self.complete_at:
            doubted = asr_logprob is not None and asr_logprob < self.doubt_below
            return "unsure" if words_say_unfinished or doubted else "complete"
        if probability < self.hold_below or words_say_unfinished:
            return "incomplete"
        return "unsure"

    def silence_needed_ms(
        self,
        transcript: str,
        probability: float | None,
        pending: bool = False,
        asr_logprob: float | None = None,
    ) -> float:
        """Silence after the end of speech at which the turn is final; ``pending``:
        the turn's score is on its way (``probability`` is None until it comes)."""
        match self.tier(transcript, probability, asr_logprob):
            case "complete":
                return self.complete_ms
            case "incomplete":
                return self.hold_ms
            case "unsure" if probability is not None or pending:
                return self.unsure_ms
            case _:  # no words, or no scorer: the endpointer's silence, as before
                return self.default_ms

    def decide(
        self,
        transcript: str,
        probability: float | None,
        silence_ms: float,
        pending: bool = False,
        asr_logprob: float | None = None,
    ) -> TurnEndDecision:
        """Final now, or wait ``wait_ms`` more of silence (speech in that time goes on
        with the same turn)."""
        tier = self.tier(transcript, probability, asr_logprob)
        needed = self.silence_needed_ms(transcript, probability, pending, asr_logprob)
        wait = needed - silence_ms
        return TurnEndDecision(wait <= 0, max(0.0, wait), tier, needed > self.default_ms)


@dataclass(frozen=True)
class TurnEndDecision:
    final: bool
    wait_ms: float  # more silence needed before the turn is final (0 when final)
    tier: Tier  # why: which of the policy's tiers the transcript fell in
    holds: bool = False  # the turn waits past the endpointer's end of turn


# The documented defaults (docs/turn_end.md has the figures behind them). Higher
# eagerness answers sooner: a lower bar for the 200 ms path, fewer turns held, a
# shorter hold. "medium" holds an unfinished turn 1.2 s, and one the model is unsure of
# 0.9 s, past the longest mid-request pause of the loop benchmark's speech (0.8 s); its
# 200 ms path starts at P 0.5 under the served (tools) adapter, whose scores sit lower
# than the chat adapter's: there it answers 4 of 86 pauses before the rest of a request
# ("Remind me to call my mother" | "at seven thirty") and 45% of complete requests,
# what the chat adapter did at 0.6 (3 of 86, 42%; at 0.2: 29 of 86, 77%). "low" starts
# it where neither answers any of those pauses (0.8); "high" answers most requests at
# 200 ms and accepts the cut-ins.
EAGERNESS: dict[Eagerness, TurnEndPolicy] = {
    "low": TurnEndPolicy(complete_at=0.8, hold_below=0.02, unsure_ms=1000.0, hold_ms=2000.0),
    "medium": TurnEndPolicy(complete_at=0.5, hold_below=0.01, unsure_ms=900.0, hold_ms=1200.0),
    "high": TurnEndPolicy(
        complete_at=0.05, hold_below=0.002, unsure_ms=416.0, doubt_below=-1.0, hold_ms=800.0
    ),
}
