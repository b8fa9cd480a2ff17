"""Tool calls written by the diffusion model into a fixed layout: valid by construction.

A call's text (``model/tools.py``) is mostly fixed: the tags, the JSON punctuation,
the keys. Only three kinds of thing are the model's to choose:

* **whether to call at all**: the reply's first token, read from the prefill's last
  row (no extra pass): a call starts with ``<`` of ``<tool_call>``, which no spoken
  reply does, so the decision is the model's own greedy first token;
* **which tool, which optional parameters, which enum value**: every way the call can
  be written (a *shape*: a tool, its optional parameters present or not, each enum or
  boolean value) is a token program; where the programs still alive part ways, one
  position is decoded with the vocabulary masked to their next tokens, and runs of
  tokens they agree on are laid down without a pass;
* **free values** (integers, numbers, strings): a number the user said once is laid
  down as said (``model/spoken.py``: "twenty five point five" is 25.5, "half an hour"
  of a ``seconds`` parameter 1800); otherwise a slot of masked positions denoised in
  parallel, each position's vocabulary masked to what the value may hold (digits; for a
  string, the tokens of the user's own words, a run of whole words, which is where a
  destination, a contact or a message text comes from) plus the token that closes the
  value, which also picks among programs that differ right after it. A pass commits
  the longest run of slot positions, from the left, whose chosen token the model itself
  gives more than the threshold (at least one), so a value is never written around an
  undecided hole, and a position predicted while its left neighbour was still masked
  commits only when the model needed no neighbour to know it. Where the span
  pointers chose a string (``model/spans.py``: they do better than this walk, which
  copies carrier words along or drops one), it is laid down as said instead.

Positions are laid out in the reply's blocks exactly as the sampler lays them
(``model/sampler.py``): a pass runs the current block with its decided tokens and masks
everywhere else (the training distribution), and a block whose tokens are all decided
is committed to the KV cache with one more pass. The caller then lets the ordinary
sampler write the spoken confirmation after the call (``sample(..., forced=...)``),
which the engine speaks only as checked against the call (``model/confirm.py``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from model.backend import StepBackend, last_row
from model.sampler import DiffusionConfig
from model.spoken import slot_value
from model.tokenizer import Tokenizer
from model.tools import (
    CALL_OPEN,
    Param,
    Tool,
    ToolCall,
    layout,
    said_value,
    shape_name,
    validate,
    value_text,
)

Program = tuple[int | Param, ...]  # token ids, and the free-value slots between them

MAX_DIGITS = 7  # an integer slot's positions (a week in seconds is 604800)
MAX_STRING_TOKENS = 24


@dataclass(frozen=True)
class ActionSettings:
    threshold: float = 0.9  # a slot position commits above it (the model's probability)
    max_passes: int = 48  # a call that takes more is given up
    calibrate: bool = False  # branches divided by their content-free odds (ContentFree)


# The model's probabilities of a branch's options after the call's ``ids`` so far when
# the user said nothing in particular (:class:`ContentFree`).
Prior = Callable[[Sequence[int], Sequence[int]], NDArray[np.float64]]


@dataclass(frozen=True)
class DecodedCall:
    """A call the model wrote: the call (with the passes it took, block commits
    included), its token ids, and where it leaves the cache."""

    call: ToolCall
    ids: list[int]
    committed: int  # leading ids already committed to the cache (whole blocks)
    last: NDArray[np.float32]  # logits of the last committed row


@dataclass
class _Shape:
    tool: Tool
    program: Program
    values: dict[str, Any]  # enum and boolean values fixed by the program

    @property
    def name(self) -> str:
        """``model.tools.shape_name`` of the calls this program writes."""
        present = {i.name: None for i in self.program if isinstance(i, Param)}
        return shape_name(self.tool, present | self.values)


def _presences(tool: Tool) -> list[list[Param]]:
    """The parameters a call of ``tool`` can carry: the required ones with each subset
    of the optional ones."""
    optional = [p for p in tool.params if not p.required]
    return [
        [p for p in tool.params if p.required or (mask >> optional.index(p)) & 1]
        for mask in range(1 << len(optional))
    ]


def _fixed_values(p: Param) -> list[Any] | None:
    """The values a boolean or enum parameter is written with, one program each; None
    for a free value (a slot)."""
    if p.type == "boolean":
        return [True, False]
    return list(p.enum) if p.enum else None


def shape_names(tools: Sequence[Tool]) -> list[str]:
    """The names of every way a call of ``tools`` can be laid out (no tokenizer needed:
    what the router chooses among), in the order of :func:`shapes`."""
    return [name for tool in tools for name in _names(tool, _presences(tool))]


def _names(
    tool: Tool, presences: list[list[Param]], said: Mapping[str, Any] | None = None
) -> list[str]:
    """The shape names of ``tool``'s calls with these parameters present, a parameter
    in ``said`` (its name -> a value) with that value only."""
    said = said or {}
    out: list[str] = []
    for present in presences:
        choices: list[dict[str, Any]] = [{}]
        for p in present:
            values = [said[p.name]] if p.name in said else _fixed_values(p) or [None]
            choices = [c | {p.name: v} for c in choices for v in values]
        out += [shape_name(tool, c) for c in choices]
    return out


def said_shapes(tools: Sequence[Tool], user_text: str) -> list[str]:
    """The names of the call shapes that fit the numbers the user said: an optional
    integer or number parameter is present exactly when its value was said
    (``model.spoken.slot_value``). "Put the volume at 8" is ``volume.set(level)``, not
    a ``change`` that drops the 8; "a little louder" is no shape with a ``level`` the
    call would have to make up. An enum the words name one value of
    (``model.tools.said_value``: "make it quieter") is that value. A tool with no shape
    that fits keeps all of its own."""
    out: list[str] = []
    for tool in tools:
        said = {p.name: v for p in tool.params if (v := said_value(tool, p, user_text)) is not None}
        numbers = [
            p
            for p in tool.params
            if not p.required and p.type in ("integer", "number") and _fixed_values(p) is None
        ]
        fitting = [
            present
            for present in _presences(tool)
            if all((p in present) == (slot_value(p, user_text) is not None) for p in numbers)
        ]
        out += _names(tool, fitting or _presences(tool), said)
    return out


def shapes(tok: Tokenizer, tools: Sequence[Tool]) -> list[_Shape]:
    """Every way a call of ``tools`` can be written, as token programs."""
    return [
        shape
        for tool in tools
        for present in _presences(tool)
        for shape in _expand(tok, tool, layout(tool, present))
    ]


def _expand(tok: Tokenizer, tool: Tool, items: list[str | Param]) -> list[_Shape]:
    """One program per choice of each enum / boolean value; free values stay slots."""
    done = [_Shape(tool, (), {})]
    for item in items:
        if isinstance(item, str):
            add: list[list[int | Param]] = [[*tok.encode_plain(item)]]
            fixed: list[dict[str, Any]] = [{}]
        elif (options := _fixed_values(item)) is not None:
            add = [[*tok.encode_plain(value_text(item, v))] for v in options]
            fixed = [{item.name: v} for v in options]
        else:
            add, fixed = [[item]], [{}]
        done = [
            _Shape(tool, s.program + tuple(a), s.values | f)
            for s in done
            for a, f in zip(add, fixed, strict=True)
        ]
    return done


# ---------------------------------------------------------------------------- vocabularies


def value_vocab(tok: Tokenizer, p: Param, user_text: str) -> NDArray[np.int64]:
    """Token ids a free value of ``p`` may hold."""
    if p.type in ("integer", "number"):
        chars = "0123456789" + ("." if p.type == "number" else "")
        if p.minimum is None or p.minimum < 0:
            chars += "-"
        return np.array(sorted({tok.encode_plain(c)[0] for c in chars}), np.int64)
    words = user_text.split()
    texts = [user_text, user_text.lower(), *words, *(w.lower() for w in words)]
    texts += [w.strip(".,!?;:") for w in words]
    ids = {i for t in texts for i in tok.encode_plain(t)}
    ids |= {i for t in texts for i in tok.encode_plain(" " + t)}
    ids -= set(tok.encode_plain('"'))  # a quote would end the JSON string
    return np.array(sorted(ids - set(tok.special_ids)), np.int64)


# ---------------------------------------------------------------------------- the decoder


def call_starts(
    tok: Tokenizer, logits: NDArray[np.float32], echoes: Collection[int] = frozenset()
) -> bool:
    """The model's greedy first reply token (``logits (V,)``, the prefill's last row) is
    a call's: the decision costs no pass. ``echoes``: first tokens of the openings the
    reply may not repeat (the user's own words, earlier replies: ``model/openings.py``)
    do not compete: "Set a timer for five minutes" is otherwise half the time answered
    by starting to say it back. The call's own first token is never one of them."""
    call = tok.encode_plain(CALL_OPEN)[0]
    ranked = logits.copy()
    ranked[[e for e in echoes if e != call]] = -np.inf
    return int(np.argmax(ranked)) == call


@dataclass
class _Call:
    """One call being written: its decided tokens, the programs still alive and where
    each one is, and the backend state around it."""

    backend: StepBackend
    tok: Tokenizer
    cache: Any
    block: int
    mask_id: int
    last: NDArray[np.float32]  # logits that predict the current block's first position
    user: str  # the user's words: what string values are copied from
    ids: list[int]
    alive: list[tuple[_Shape, int]]  # (shape, index of its next program item)
    values: dict[str, list[int]] = field(default_factory=dict)  # free values' tokens
    committed: int = 0
    passes: int = 0
    failed: bool = False  # a value nothing can be written into
    prior: Prior | None = None  # branches calibrated against it


@dataclass(frozen=True)
class CallOptions:
    """How :func:`decode_call` writes one call, beyond the model and the prompt."""

    block: int  # the sampler's block size: the call's tokens are committed in blocks of it
    settings: ActionSettings = field(default_factory=ActionSettings)
    # each branch picks the option whose probability most exceeds its content-free one
    # (:class:`ContentFree`)
    prior: Prior | None = None
    # the call is laid out so (``model.tools.shape_name``: the router's choice,
    # ``model/router.py``), so its tool, parameters and fixed values cost no pass and
    # the model writes the free values
    shape: str | None = None
    # string values by parameter name, spans of the user's words the span pointers chose
    # (``model/spans.py``), laid down as said instead of written
    pointed: Mapping[str, str] | None = None


def decode_call(
    backend: StepBackend,
    tok: Tokenizer,
    cache: Any,
    last: NDArray[np.float32],
    tools: Sequence[Tool],
    user_text: str,
    model: DiffusionConfig,
    options: CallOptions,
    should_stop: Callable[[], bool] = lambda: False,
) -> DecodedCall | None:
    """Write a call after the prompt held by ``cache`` (``last``: its last row's logits).

    Returns None when cancelled or when the call cannot be finished within the pass
    budget; the cache then holds the prompt and possibly some committed call blocks:
    the caller truncates it.
    """
    shape, settings = options.shape, options.settings
    programs = [(s, 0) for s in shapes(tok, tools) if shape is None or s.name == shape]
    if not programs:
        raise ValueError(f"no call of {[t.name for t in tools]} is laid out as {shape!r}")
    c = _Call(backend, tok, cache, options.block, model.mask_id, last, user_text, [], programs)
    c.prior = options.prior
    vocab = {p.name: value_vocab(tok, p, user_text) for t in tools for p in t.params}
    while c.passes <= settings.max_passes and not c.failed:
        if should_stop():
            return None
        _lay_agreed(c)
        nexts = {s.program[i] for s, i in c.alive if i < len(s.program)}
        if not nexts:
            return _finish(c)
        if all(isinstance(n, int) for n in nexts):
            _branch(c, sorted(n for n in nexts if isinstance(n, int)))
        else:
            (p,) = {n.name: n for n in nexts if isinstance(n, Param)}.values()
            said = slot_value(p, user_text)
            if said is None and p.type == "string":
                said = (options.pointed or {}).get(p.name)
            if said:
                _lay_value(c, p, said)
            else:
                _slot(c, p, vocab[p.name], settings.threshold)
        _commit_full_blocks(c)
    return None


def _lay_agreed(c: _Call) -> None:
    """Lay down the tokens every live program agrees on next (no pass)."""
    while True:
        nexts = {s.program[i] if i < len(s.program) else None for s, i in c.alive}
        if len(nexts) != 1 or not isinstance(n := next(iter(nexts)), int):
            return
        c.ids.append(n)
        c.alive = [(s, i + 1) for s, i in c.alive]
        _commit_full_blocks(c)


def _rows(c: _Call, want: int) -> NDArray[np.float32]:
    """Logits for the ``want`` positions from the next undecided one (one pass over the
    current block: its decided tokens, masks elsewhere)."""
    lo = (len(c.ids) // c.block) * c.block
    k = len(c.ids) - lo  # decided positions in the block
    want = max(1, min(want, c.block - k))
    chunk = np.full(c.block, c.mask_id, np.int64)
    chunk[:k] = c.ids[lo:]
    rows = np.arange(k - 1, k - 1 + want)  # Dream's shift: row j predicts j + 1
    logits = c.backend.step(c.cache, chunk, "block", commit=False, rows=rows[rows >= 0])
    c.passes += 1
    if rows[0] < 0:  # the block's first position: the pass before
        logits = np.concatenate([c.last[None], logits])
    return logits  # (want, V)


def _softmax(logits: NDArray[np.float32]) -> NDArray[np.float64]:
    """The model's probabilities over the whole vocabulary."""
    z = logits.astype(np.float64)
    p = np.exp(z - z.max())
    out: NDArray[np.float64] = p / p.sum()
    return out


def _masked_choice(logits: NDArray[np.float32], allowed: NDArray[np.int64]) -> tuple[int, float]:
    """The best allowed token and the model's own probability of it (over the whole
    vocabulary: renormalized over the allowed tokens alone, a token the model barely
    believes would look certain once its rivals are masked out)."""
    token = int(allowed[int(np.argmax(logits[allowed]))])
    return token, float(_softmax(logits)[token])


def _branch(c: _Call, options: list[int]) -> None:
    """The live programs part ways here: one position decides which go on."""
    row, allowed = _rows(c, 1)[0], np.array(options, np.int64)
    if c.prior is None:
        token, _ = _masked_choice(row, allowed)
    else:
        odds = _softmax(row)[allowed] / np.maximum(c.prior(c.ids, options), 1e-9)
        token = int(allowed[int(np.argmax(odds))])
    _take(c, token)


class ContentFree:
    """The model's leanings at a call's branches, read with no request in the prompt.

    Trained on equal numbers of calls per tool, the model still favours, at the first
    token of a tool's name, a prefix that many tools share ("media" opens three): "let's
    go to the stadium" became ``media.next``. Contextual calibration (Zhao et al., 2021,
    "Calibrate Before Use") divides each option's probability by the one the model
    gives it after content-free requests (``prompts``: the same system prompt and tools,
    a user turn such as "N/A"), averaged; computed once per branch and kept. Costs, at
    a branch first met, one prefill per prompt (kept) and one pass per prompt.
    """

    def __init__(
        self,
        backend: StepBackend,
        tok: Tokenizer,
        prompts: Sequence[list[int]],
        model: DiffusionConfig,
        block: int,
    ) -> None:
        self.backend, self.tok, self.model, self.block = backend, tok, model, block
        self._prompts = [list(p) for p in prompts]
        self._prefilled: list[tuple[Any, NDArray[np.float32]]] = []
        self._known: dict[tuple[tuple[int, ...], tuple[int, ...]], NDArray[np.float64]] = {}

    def __call__(self, ids: Sequence[int], options: Sequence[int]) -> NDArray[np.float64]:
        key = (tuple(ids), tuple(options))
        if key not in self._known:
            self._known[key] = np.mean(
                [self._probs(i, ids, options) for i in range(len(self._prompts))], axis=0
            )
        return self._known[key]

    def _probs(self, i: int, ids: Sequence[int], options: Sequence[int]) -> NDArray[np.float64]:
        be, prompt = self.backend, self._prompts[i]
        if i == len(self._prefilled):
            cache = be.new_cache()
            chunk = np.asarray(prompt, np.int64)
            last = be.step(cache, chunk, "causal", commit=True, rows=last_row(chunk))[-1]
            self._prefilled.append((cache, last))
        cache, last = self._prefilled[i]
        be.truncate(cache, len(prompt))
        c = _Call(be, self.tok, cache, self.block, self.model.mask_id, last, "", [], [])
        for token in ids:
            c.ids.append(token)
            _commit_full_blocks(c)
        return _softmax(_rows(c, 1)[0])[list(options)]


def _take(c: _Call, token: int) -> None:
    """Append ``token``: the programs whose next item it is go on, past it."""
    c.ids.append(token)
    c.alive = [(s, i + 1) for s, i in c.alive if i < len(s.program) and s.program[i] == token]


def _lay_value(c: _Call, p: Param, text: str) -> None:
    """Lay down the number the user said (``model.spoken.slot_value``) or the span of
    their words pointed at as ``p``'s value, tokenized apart as training writes values
    (``model.tools.call_ids``): no pass."""
    value = c.values.setdefault(p.name, [])
    for token in c.tok.encode_plain(text):
        c.ids.append(token)
        value.append(token)
        _commit_full_blocks(c)
    c.alive = [(s, i + 1) for s, i in c.alive]  # past the slot: its closer comes next


def _slot(c: _Call, p: Param, vocab: NDArray[np.int64], threshold: float) -> None:
    """Denoise some of the free value of ``p`` (every live program is at this slot):
    positions left to right, each masked to the tokens that keep the value well formed
    (:func:`_fits`) and to the value's closers once it is not empty."""
    closers = sorted({n for s, i in c.alive if isinstance(n := s.program[i + 1], int)})
    value = c.values.setdefault(p.name, [])
    cap = MAX_STRING_TOKENS if p.type == "string" else MAX_DIGITS
    for j, row in enumerate(_rows(c, cap - len(value) + 1)):
        text = c.tok.decode(value)
        fits = [
            t
            for t in vocab.tolist()
            if len(value) < cap and _fits(p, text + c.tok.decode([t]), c.user)
        ]
        ends = bool(value) and (p.type != "string" or _ends_word(text, c.user))
        allowed = np.array(fits + (closers if ends else []), np.int64)
        if allowed.size == 0:  # an empty value nothing can start (no words to copy)
            c.failed = True
            return
        token, conf = _masked_choice(row, allowed)
        if j > 0 and conf <= threshold:
            return
        if token in closers:  # the value ends: the closer is the next program's token
            c.alive = [(s, i + 1) for s, i in c.alive]
            _take(c, token)
            return
        c.ids.append(token)
        value.append(token)
        _commit_full_blocks(c)
        if len(c.ids) % c.block == 0:
            return  # the rest of the slot is in the next block


_NUMBER = re.compile(r"^-?[0-9]*\.?[0-9]*$")


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def _fits(p: Param, text: str, user: str) -> bool:
    """``text`` can start a value of ``p``: a number's digits, or for a string a run
    of the user's own words from a word's start (case and spacing aside; so a
    destination, a contact or a message is copied from what was said, never made up).
    A string value may also end only where a word does (:func:`_slot`)."""
    if p.type != "string":
        return (bool(_NUMBER.match(text)) and not text.startswith("0")) or text == "0"
    if text != text.lstrip() or "  " in text:  # as training writes values: no space first
        return False
    t = _norm(text) + (" " if text[-1:].isspace() else "")  # "m " is no start of "minutes"
    return bool(t.strip()) and _at_words(t, _norm(user), False)


def _ends_word(text: str, user: str) -> bool:
    """A string value may close here: it is a run of whole words of ``user``."""
    return text == text.rstrip() and _at_words(_norm(text), _norm(user), True)


def _at_words(text: str, user: str, whole: bool) -> bool:
    """``text`` occurs in ``user`` starting at a word's start (and, when ``whole``,
    ending at a word's end): "ok" of "okay" is no value, nor "ay"."""
    i = user.find(text)
    while i >= 0:
        j = i + len(text)
        if (i == 0 or not user[i - 1].isalnum()) and (
            not whole or j == len(user) or not user[j].isalnum()
        ):
            return True
        i = user.find(text, i + 1)
    return False


def _commit_full_blocks(c: _Call) -> None:
    while len(c.ids) - c.committed >= c.block:
        chunk = np.array(c.ids[c.committed : c.committed + c.block], np.int64)
        c.last = c.backend.step(c.cache, chunk, "block", commit=True, rows=last_row(chunk))[-1]
        c.passes += 1
        c.committed += c.block


def _finish(c: _Call) -> DecodedCall | None:
    """The call as JSON values, checked against its tool's schema."""
    shape, _ = c.alive[0]
    args = dict(shape.values)
    for item in shape.program:
        if isinstance(item, Param):
            args[item.name] = _value(item, c.tok.decode(c.values[item.name]))
    try:
        validate(shape.tool, args)
    except ValueError:
        return None
    return DecodedCall(ToolCall(shape.tool.name, args, c.passes), c.ids, c.committed, c.last)


def _value(p: Param, text: str) -> Any:
    """A slot's text as its JSON value; a number outside the schema's range is clamped
    to it (a "timer for zero seconds" becomes the shortest one allowed)."""
    if p.type == "string":
        return text
    try:
        x = float(text)
    except ValueError:
        return text  # not a number ("-", "1.2.3"): validate() refuses the call
    if not math.isfinite(x):
        return text
    if p.minimum is not None:
        x = max(x, float(p.minimum))  # float: a bound may be an int, which has no is_integer
    if p.maximum is not None:
        x = min(x, float(p.maximum))
    return int(x) if p.type == "integer" or x.is_integer() else x
