"""The span pointers (model/spans.py), their fit (training/spans.py) and the
engine that lays down what they point at."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from model.actions import shape_names
from model.chat import build_prompt
from model.engine import ChatMessage, drain
from model.modeldir import SHIPPED_ADAPTER
from model.nn.backend import TorchBackend
from model.router import ACT, SPEAK
from model.spans import (
    MAX_WORDS,
    SPANS_FILE,
    SpanPointer,
    boundary_rows,
    find_span,
    find_spans,
    span_text,
    user_tokens,
    without_courtesy,
    words,
)
from model.tools import ToolCall
from training.spans import (
    Example,
    SpanOptions,
    accuracy,
    fit_pointer,
    fit_spans,
    fold,
    pointer_inputs,
    read_examples,
    string_params,
)

from .conftest import tiny_tokenizer
from .test_actions import TOOLS, USER
from .test_diffusion import tiny_diffusion, tiny_generator
from .test_router import _model_dir, a_router

PARAMS = ("navigation.start.destination", "message.send.to")


def test_a_value_is_a_run_of_the_user_s_words_without_the_punctuation_around_it() -> None:
    text = 'Okay, shoot Emily a message saying "love you", please. Remind me at 8 a.m.'
    spans = words(text)
    assert span_text(text, spans, 0, 1) == "Okay"
    assert span_text(text, spans, 6, 8) == "love you"
    assert span_text(text, spans, 11, 14) == "at 8 a.m."  # an abbreviation keeps its dot
    assert find_span(text, "love you") == (6, 8)
    assert find_span(text, "emily") == (2, 3)  # case aside, when no run is exact
    assert find_span(text, "Emily saying") is None  # not a run of the words


def test_a_value_loses_the_courtesy_said_to_the_assistant_after_it() -> None:
    """ "Remind me to call the dentist, please." is a reminder to call the dentist."""
    assert without_courtesy("call the dentist, please") == "call the dentist"
    assert without_courtesy("call mom thank you.") == "call mom"
    assert without_courtesy("Peter please") == "Peter"
    assert without_courtesy("please") == "please"  # nothing left: the words as they are
    assert without_courtesy("please pick up milk") == "please pick up milk"
    assert without_courtesy("pleased to meet you") == "pleased to meet you"


def test_each_boundary_reads_the_token_before_it_and_the_first_token_after_it() -> None:
    # "set the?" as a BPE with merges writes it: "set", " the", "?"
    offsets = [(0, 3), (3, 7), (7, 8)]
    pairs = boundary_rows(offsets, words("set the?"))
    # before "set": the token before the text; before "the": " the" holds its "t";
    # after the last word: the token after the text
    assert pairs.tolist() == [[-1, 0], [0, 1], [2, 3]]
    # a tokenizer with no merges: " " is a token of its own before "the"
    tok = tiny_tokenizer()
    ids, offsets = tok.encode_plain_offsets("set the")
    assert len(ids) == 7
    assert boundary_rows(offsets, words("set the")).tolist() == [[-1, 0], [3, 4], [6, 7]]


def test_the_user_s_tokens_are_found_at_the_end_of_the_prompt() -> None:
    tok = tiny_tokenizer()
    convo = [
        ChatMessage("user", "hi"),
        ChatMessage("assistant", "Hello."),
        ChatMessage("user", USER),
    ]
    prompt = build_prompt(tok, convo, 1000, "sys")
    where = user_tokens(tok, prompt, USER)
    assert where is not None
    n = len(where.offsets)
    assert tok.decode(prompt[where.first : where.first + n]) == USER
    assert where.rows.tolist() == list(range(where.first - 1, where.first + n + 1))
    assert prompt[where.first + n] == tok.im_end_id
    assert user_tokens(tok, prompt, "something else") is None
    cut = build_prompt(tok, [ChatMessage("user", USER)], 40, "sys")  # the message is cut
    assert user_tokens(tok, cut, USER) is None


def pointer(weights: np.ndarray, params: tuple[str, ...] = PARAMS, sha: str = "s") -> SpanPointer:
    return SpanPointer(params, weights.astype(np.float32), sha, {"n": 1})


def test_the_best_span_has_the_highest_start_and_end_scores_and_at_least_one_word() -> None:
    # one logit per row says how much a boundary's "after" row wants to start the
    # destination, another how much its "before" row wants to end it
    weights = np.zeros((2, 4 * len(PARAMS)))
    weights[0, 1] = 1.0  # destination: start, after the boundary
    weights[1, 2] = 1.0  # destination: end, before the boundary
    pairs = np.array([[-1, 0], [0, 1], [1, 2], [2, 3], [3, 4]])  # 4 words, 1 token each
    rows = np.zeros((6, 2), np.float32)  # the token before, 4 words, the token after
    rows[1 + 2, 0] = 3.0  # word 2 starts it
    rows[1 + 2, 1] = 2.0  # and ends it (the boundary after word 2 reads it "before")
    rows[1 + 0, 0] = -20.0  # word 0 is no start...
    rows[1 + 0, 1] = 9.0  # ...so a high end after it pairs with nothing good
    p = pointer(weights)
    scores = p.scores(rows, pairs)
    assert scores.shape == (2, 2, 5)
    assert p.best(scores, "navigation.start", "destination") == (2, 3)
    assert p.points("message.send", "to") and not p.points("message.send", "text")
    long = np.zeros((2, 2, MAX_WORDS + 5), np.float32)
    long[0, 0, 0], long[0, 1, -1] = 5.0, 5.0  # a span too long to be one
    i, j = p.best(long, "navigation.start", "destination")
    assert 0 < j - i <= MAX_WORDS


def test_a_saved_pointer_loads_the_same_and_belongs_to_its_adapter(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    p = pointer(rng.normal(size=(8, 4 * len(PARAMS))), sha="mine")
    place = tmp_path / "adapter"
    place.mkdir()
    p.save(place / SPANS_FILE)
    back = SpanPointer.load(place / SPANS_FILE)
    assert (back.params, back.adapter_sha256, back.info) == (PARAMS, "mine", {"n": 1})
    assert np.allclose(back.weights, p.weights, atol=1e-2)  # fp16
    mine = _model_dir(tmp_path / "mine", "mine")
    found = find_spans(mine, [tmp_path / "elsewhere", place], vocab=8)
    assert found is not None and found.adapter_sha256 == "mine"
    assert find_spans(_model_dir(tmp_path / "other", "other"), [place]) is None
    assert find_spans(_model_dir(tmp_path / "base", None), [place]) is None
    with pytest.raises(ValueError, match="reads 8 logits"):
        find_spans(mine, [place], vocab=9)


def test_the_shipped_pointers_belong_to_the_shipped_tools_adapter() -> None:
    """A retrained tools adapter needs its pointers refitted (`quicksilver spans`)."""
    tools = SHIPPED_ADAPTER
    p = SpanPointer.load(tools / SPANS_FILE)
    weights = hashlib.sha256((tools / "adapter.safetensors").read_bytes()).hexdigest()
    assert p.adapter_sha256 == weights
    assert set(p.params) == set(string_params()) and p.weights.shape == (49152, 4 * len(p.params))
    assert p.info["heldout_with_history"]["exact"] >= 0.9  # as fitted (docs/actions.md)


def test_the_pointer_fit_finds_the_boundary_its_features_mark() -> None:
    rng = np.random.default_rng(1)
    xs, gold = [], []
    for _ in range(60):
        x = rng.normal(size=(int(rng.integers(3, 9)), 5))
        k = int(rng.integers(len(x)))
        x[k, 2] += 4.0  # the gold boundary stands out along one direction
        xs.append(x)
        gold.append(k)
    w = fit_pointer(xs, gold, l2=1e-3, steps=300, lr=0.05)
    assert all(int(np.argmax(x @ w)) == k for x, k in zip(xs, gold, strict=True))
    assert not fit_pointer(xs, gold, l2=1e-3, steps=0, lr=0.05).any()  # the fit does it


def test_the_folded_pointers_score_the_logits_as_the_fit_scored_the_states() -> None:
    """Projection and standardisation fold into one (V, 4P) matrix: the scores differ
    from the unfolded ones by a constant per example, so the same span wins."""
    rng = np.random.default_rng(2)
    table = rng.normal(size=(40, 6)).astype(np.float32)  # (V, C): a tied head
    to_hidden = np.linalg.pinv(table).astype(np.float32)
    text = "please drive to the old harbour now"
    spans = words(text)
    pairs = boundary_rows([(a, b) for a, b in spans], spans)  # one token per word
    feats, examples = [], []
    for k in range(30):
        states = rng.normal(size=(len(spans) + 2, 6)).astype(np.float32)
        i = int(rng.integers(len(spans) - 1))
        states[i + 1, 0] += 5.0  # the start word's row
        states[i + 2, 1] += 5.0  # the row after the last word (a two-word value)
        feats.append((states @ table.T, pairs))
        examples.append(Example(f"{text} {k}", {PARAMS[0]: (i, i + 2)}))
    hidden = np.concatenate([r for r, _ in feats]) @ to_hidden.T
    mu, sd = hidden.mean(0), hidden.std(0) + 1e-6
    xs = pointer_inputs(feats, to_hidden, mu, sd)
    options = SpanOptions(Path("."), steps=300)
    w = fit_spans(xs, examples, PARAMS, 1e-3, options)
    assert not w[1].any()  # no example has a contact: nothing fitted
    p = pointer(fold(w, to_hidden, sd))
    assert accuracy(p, feats, examples)["exact"] == 1.0
    scores = p.scores(*feats[0])[0, 0]  # destination start, folded
    direct = xs[0] @ w[0, 0]
    assert np.allclose(scores - scores[0], direct - direct[0], atol=1e-3)


def test_commands_become_spans_of_their_words_and_the_rest_is_counted(tmp_path: Path) -> None:
    lines = [
        {"question": "Take me to Pier 39, please.", "source": "command:navigation.start",
         "reply": '<tool_call>{"name": "navigation.start", "arguments": {"destination": '
                  '"Pier 39"}}</tool_call>On our way.'},
        {"question": "Text mom I'm late", "source": "command:message.send",
         "reply": '<tool_call>{"name": "message.send", "arguments": {"to": "Mom", '
                  '"text": "I am late"}}</tool_call>Sent.'},
        {"question": "timer off", "source": "command:timer.cancel",
         "reply": '<tool_call>{"name": "timer.cancel", "arguments": {}}</tool_call>Done.'},
        {"question": "hi", "source": "template", "reply": "Hello."},
    ]  # fmt: skip
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines))
    examples, missed = read_examples(path)
    assert examples == [
        Example("Take me to Pier 39, please.", {"navigation.start.destination": (3, 5)}),
        Example("Text mom I'm late", {"message.send.to": (1, 2)}),
    ]
    assert missed == 1  # "I am late" is not what was said


def test_the_engine_lays_down_the_span_its_pointer_chooses() -> None:
    """Whatever the tiny model would write, the destination is the pointer's span: with
    all-zero weights every span scores alike, and the first one-word span wins. The
    same when the prompt is already in the prefix cache (a speculative turn's prompt):
    the user's rows are prefilled again for the pointer."""
    gen, _ = tiny_generator()
    gen.backend = gen.prefixes.backend = TorchBackend(tiny_diffusion(4), max_len=1024)
    columns = (SPEAK, ACT, *(t.name for t in TOOLS), *shape_names(TOOLS))
    gen.router = a_router("navigation.start(destination)", gen.backend.vocab_size, names=columns)
    params = tuple(string_params())
    gen.spans = pointer(np.zeros((gen.backend.vocab_size, 4 * len(params))), params)
    convo = [ChatMessage("user", USER)]
    for _ in range(2):
        items, _ = drain(gen.generate(convo, 32, lambda: False, TOOLS))
        calls = [i for i in items if isinstance(i, ToolCall)]
        assert calls == [ToolCall("navigation.start", {"destination": "please"}, calls[0].passes)]
