"""quicksilver eval sessions: the repeat and echo detectors on hand-made replies, and a
whole evaluation on the tiny model."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Callable, Generator, Sequence
from typing import Any

import numpy as np
import pytest

from model.ar import ARGenerator, AROptions
from model.engine import ChatMessage, GenerationStats
from model.nn.backend import TorchBackend
from model.tools import CALL_OPEN, Tool, ToolCall, render_call
from tests.model.conftest import TINY, tiny_model, tiny_tokenizer
from tests.model.test_actions import TOOLS, CallsFirst
from tests.model.test_diffusion import tiny_diffusion, tiny_generator
from training.sessions import (
    CALLS_FILE,
    SCRIPTS_FILE,
    Scorer,
    SessionOptions,
    Turn,
    configure,
    echoes,
    evaluate,
    first_sentence,
    read_calls,
    read_scripts,
    repeats,
    score_session,
    table,
    words,
)


def test_words_and_first_sentence_are_normalised() -> None:
    assert words("I'm running  GREAT, thanks!") == ["im", "running", "great", "thanks"]
    assert first_sentence("I'm sorry. As a voice assistant...") == "im sorry"
    assert first_sentence("It is 3.5 km away! Drive safely.") == "it is 3 5 km away"
    assert first_sentence("No mark at all") == "no mark at all"
    assert first_sentence("") == ""


def test_a_repeat_is_an_earlier_first_sentence_up_to_case_and_punctuation() -> None:
    earlier = ["I'm running great.", "Sorry, I can't do that. But I can help."]
    assert repeats("i'm running great!", earlier)
    assert repeats("Im running GREAT", earlier)  # one sentence, no mark
    assert repeats("Sorry I can't do that! Try asking me something else.", earlier)
    assert not repeats("I'm running great today.", earlier)
    assert not repeats("But I can help.", earlier)  # a later sentence is not an opening
    assert not repeats("", [""])  # an empty reply is counted as empty, not as a repeat
    assert not repeats("I'm running great.", [])


def test_an_echo_only_says_the_users_words_back() -> None:
    user = "Set a timer for five minutes."
    assert echoes("Set a timer for five minutes.", user)
    assert echoes("set a TIMER for five minutes", user)
    assert echoes("Five minutes.", user)  # only part of the words, still nothing new
    assert not echoes("Setting a timer for five minutes.", user)  # one new word in six
    assert not echoes("I can't set timers, but five minutes is 300 seconds.", user)
    assert not echoes("", user)
    # one new word in ten is still an echo, two are not
    long_user = "please remind me to call my mother at six in the evening"
    assert echoes("okay remind me to call my mother at six in the evening", long_user)
    assert not echoes("okay remind me to call my mother at seven in the evening", long_user)


def test_the_shipped_scripts_are_20_turn_sessions() -> None:
    scripts = read_scripts(SCRIPTS_FILE)
    assert len(scripts) >= 3 and all(len(t) == 20 for t in scripts.values())
    commands = ("Set a timer for five minutes.", "Turn on the lights.", "Play some jazz.")
    every = [t for turns in scripts.values() for t in turns]
    assert all(c in every for c in commands)


def test_every_command_of_the_shipped_scripts_has_a_valid_expected_call() -> None:
    from model.tools import DEFAULT_TOOLS
    from tests.schema import assert_fits_schema

    calls = read_calls(CALLS_FILE)
    every = {t for turns in read_scripts(SCRIPTS_FILE).values() for t in turns}
    assert set(calls) <= every and len(calls) >= 20  # no stale entry; most tools covered
    tools = {t.name: t for t in DEFAULT_TOOLS}
    for call in calls.values():
        assert_fits_schema(tools[call.name], call.arguments)
    assert {c.name for c in calls.values()} == set(tools)  # each default tool at least once
    assert "What is the capital of Australia?" not in calls  # a question is chat


def _turn(user: str, reply: str, call: ToolCall | None, sim: float) -> Turn:
    t = Turn(user, reply, GenerationStats(3, 3, "end"), [1, 2], 1.0, None, call=call)
    t.nll, t.similarity = (1.0, 3), sim
    return t


def test_commands_are_scored_as_actions_and_chat_similarity_leaves_them_out() -> None:
    timer = ToolCall("timer.set", {"seconds": 300})
    calls = {
        "Set a timer for five minutes.": timer,
        "Call Bob.": ToolCall("call.start", {"contact": "Bob"}),
    }
    turns = [
        _turn(
            "Set a timer for five minutes.",
            "Timer set.",
            ToolCall("timer.set", {"seconds": 300.0}),
            0.1,
        ),
        _turn(
            "Call Bob.", "Calling bob.", ToolCall("call.start", {"contact": "bob."}), 0.2
        ),  # same, normalised
        _turn("Call Bob.", "Okay.", None, 0.3),  # not acted on
        _turn("Hi there.", "Hello!", None, 0.9),
        _turn("Why is the sky blue?", "Light scatters.", timer, 0.7),  # a false trigger
    ]
    row = score_session(turns, tiny_tokenizer(), calls)
    assert (row["commands"], row["exact_calls"], row["commands_not_acted"]) == (3, 2, 1)
    assert row["false_triggers"] == 1 and row["actions"] == 3
    assert row["similarity_median"] == 0.3  # every turn
    assert row["chat_similarity_median"] == pytest.approx(0.8)  # the two that are not commands
    wrong = [_turn("Call Bob.", "Calling Rob.", ToolCall("call.start", {"contact": "Rob"}), 0.2)]
    assert score_session(wrong, tiny_tokenizer(), calls)["exact_calls"] == 0
    plain = score_session(turns, tiny_tokenizer())  # no calls given: no action figures
    assert "exact_calls" not in plain and "chat_similarity_median" not in plain


class BagOfLetters:
    """A stand-in sentence embedder: normalised letter counts."""

    def encode(self, texts: list[str], **_: Any) -> np.ndarray:
        out = np.ones((len(texts), 26))
        for i, t in enumerate(texts):
            for c in t.lower():
                if "a" <= c <= "z":
                    out[i, ord(c) - 97] += 1
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def test_evaluate_runs_sessions_on_their_own_replies_and_counts(tmp_path) -> None:
    tok = tiny_tokenizer()
    opts = AROptions(prompt_budget=200, system_prompt="Be brief.", history_window=None)
    model = tiny_model(config=dataclasses.replace(TINY, vocab_size=tok.vocab_size))
    ar = ARGenerator(TorchBackend(model, max_len=256), tok, opts, name="tiny-ar")
    diffusion, _ = tiny_generator(prompt_budget=200, system_prompt="Be brief.", history_window=None)
    scripts = {"a": ["hi", "hi", "go"], "b": ["yes?", "no"]}
    refs = {q: q for turns in scripts.values() for q in turns}
    scorer = Scorer(tiny_model(1), tok, BagOfLetters(), refs, batch=2)
    report = evaluate(
        [ar, diffusion], scripts, SessionOptions(max_tokens=6), scorer, lambda _: None
    )
    rows = report["rows"]
    assert [(r["engine"], r["session"]) for r in rows] == [
        (e, s) for e in ("tiny-ar", "diffusion") for s in ("a", "b", "total")
    ]
    for engine, sessions in report["replies"].items():
        mine = {r["session"]: r for r in rows if r["engine"] == engine}
        for name, turns in sessions.items():
            assert [t["user"] for t in turns] == scripts[name]
            # the counts are the detectors' over the replies, each against its earlier ones
            said = [t["reply"] for t in turns]
            want = sum(repeats(r, said[:i]) for i, r in enumerate(said))
            assert mine[name]["repeats"] == want == sum(t["repeat"] for t in turns)
            assert mine[name]["echoes"] == sum(echoes(t["reply"], t["user"]) for t in turns)
            # the engine saw its own earlier replies: the prompt grows turn by turn
            sizes = [t["prompt_tokens"] for t in turns]
            assert sizes == sorted(sizes) and sizes[-1] > sizes[0]
            # no window: each prompt starts with the previous one, only the rest is new
            prefills = [t["prefill_tokens"] for t in turns]
            assert prefills[0] == sizes[0] and all(
                0 < p < s for p, s in zip(prefills[1:], sizes[1:], strict=True)
            )
        total = mine["total"]
        assert total["turns"] == 5
        assert total["repeats"] == mine["a"]["repeats"] + mine["b"]["repeats"]
        every = [t for turns in sessions.values() for t in turns]
        ended = [t["stopped_by"] == "end" for t in every]
        assert total["clean_end_rate"] == sum(ended) / 5
        # each reply against its reference (here the user's words), in the stand-in
        # embedder computed here: the median of those
        bag = BagOfLetters()
        sims = [float(bag.encode([t["reply"]])[0] @ bag.encode([t["user"]])[0]) for t in every]
        assert [t["similarity"] for t in every] == pytest.approx(sims)
        assert total["similarity_median"] == pytest.approx(statistics.median(sims))
        # per token over all replies: between the figures of the replies that have a
        # token to score (a word, or the end token)
        scored = [t for t in every if t["reply"] or t["stopped_by"] == "end"]
        nlls = [t["nll_per_token"] for t in scored]
        if nlls:
            assert min(nlls) - 1e-9 <= total["nll_per_token"] <= max(nlls) + 1e-9
        else:  # every reply empty, and none ended: no token to score
            assert math.isnan(total["nll_per_token"])
    assert report["engine_options"]["tiny-ar"] == {"history_window": None, "opening_ban": 4}
    assert "| tiny-ar | total | 5 |" in table(report)
    json.dumps(report)  # what --json writes


class Parrot(ARGenerator):
    """Says the user's words back on every other turn, else "I'm running great.": the
    AR engine's collapse, for exact counts."""

    def generate(
        self,
        conversation: Sequence[ChatMessage],
        max_tokens: int,
        should_stop: Callable[[], bool],
        tools: Sequence[Tool] = (),
    ) -> Generator[str | ToolCall, None, GenerationStats]:
        users = [m for m in conversation if m.role == "user"]
        text = users[-1].content if len(users) % 2 else "I'm running GREAT!"
        yield text
        return GenerationStats(len(text), len(text), "end")


def test_evaluate_counts_a_collapsed_session_exactly() -> None:
    tok = tiny_tokenizer()
    parrot = Parrot(TorchBackend(tiny_model(), max_len=64), tok, AROptions(), name="parrot")
    scripts = {"s": ["Set a timer.", "How are you?", "Play jazz.", "Why?", "Call Bob.", "Hi"]}
    report = evaluate([parrot], scripts, SessionOptions(), None, lambda _: None)
    row = report["rows"][0]
    # turns 1, 3, 5 echo; turns 2, 4, 6 say the same sentence: the last two repeat it
    assert (row["echoes"], row["repeats"], row["empty"]) == (3, 2, 0)
    assert row["clean_end_rate"] == 1.0 and "nll_per_token" not in row
    replies = [t["reply"] for t in report["replies"]["parrot"]["s"]]
    assert replies[1] == replies[3] == "I'm running GREAT!"


def test_configure_sets_the_window_and_ban_the_options_ask_for() -> None:
    tok = tiny_tokenizer()
    gen = ARGenerator(TorchBackend(tiny_model(), max_len=64), tok, AROptions())
    default = (gen.options.history_window, gen.options.opening_ban)
    configure(gen, SessionOptions())  # nothing asked: the engine's defaults
    assert (gen.options.history_window, gen.options.opening_ban) == default
    configure(gen, SessionOptions(history_window=2, opening_ban=0))
    assert (gen.options.history_window, gen.options.opening_ban) == (2, 0)
    configure(gen, SessionOptions(full_history=True))
    assert (gen.options.history_window, gen.options.opening_ban) == (None, 0)
    before = gen.options
    configure(gen, SessionOptions(stop_repeats=False))  # the AR engine has no such rule
    assert gen.options == before
    diffusion, _ = tiny_generator()
    for stop in (True, False):
        configure(diffusion, SessionOptions(stop_repeats=stop))
        assert diffusion.options.sampler.stop_repeats is stop


@pytest.mark.models
@pytest.mark.slow
def test_the_command_runs_a_session_on_the_served_ar_engine(
    tmp_path, capsys, monkeypatch, model_cache
) -> None:
    """`quicksilver eval sessions` end to end: two turns on the int8 AR engine, no
    scoring model; the table and the JSON agree. The engine is built as `serve` builds
    it, into the test session's cache, which the command finds as ~/.cache/quicksilver of
    a home of the test's own (never the user's)."""
    from cli.main import main, prepare_model

    prepare_model("smollm2-ar-onnx", model_cache)
    home = tmp_path / "home"
    (home / ".cache").mkdir(parents=True)
    (home / ".cache" / "quicksilver").symlink_to(model_cache)
    monkeypatch.setenv("HOME", str(home))
    scripts = tmp_path / "s.json"
    scripts.write_text(json.dumps({"one": ["Set a timer for five minutes.", "Play some jazz."]}))
    out = tmp_path / "r.json"
    argv = ["eval", "sessions", "--engine", "smollm2-ar-onnx", "--scripts", str(scripts)]
    assert main([*argv, "--no-quality", "--history-window", "all", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["engine_options"]["smollm2-ar-onnx"]["history_window"] is None
    turns = report["replies"]["smollm2-ar-onnx"]["one"]
    assert [t["user"] for t in turns] == ["Set a timer for five minutes.", "Play some jazz."]
    assert not any(t["echo"] for t in turns)  # the engine's default ban: no echo
    total = report["rows"][-1]
    assert total["session"] == "total" and total["turns"] == 2
    assert "| smollm2-ar-onnx | total | 2 |" in capsys.readouterr().out


def test_a_session_with_tools_keeps_each_call_before_the_words_heard() -> None:
    """With the default device tools the diffusion engine acts; the conversation keeps
    the call's text and then the reply's words, as server/session.py keeps them, and the
    detectors read the words alone."""
    gen, _ = tiny_generator(prompt_budget=400, history_window=None)
    tok = gen.tokenizer
    backend = CallsFirst(tiny_diffusion(4), max_len=1024)
    backend.open_id = tok.encode_plain(CALL_OPEN)[0]  # type: ignore[attr-defined]
    gen.backend = gen.prefixes.backend = backend
    seen: list[list[ChatMessage]] = []
    generate = gen.generate

    def spy(conversation, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(list(conversation))
        return generate(conversation, *args, **kwargs)

    gen.generate = spy  # type: ignore[method-assign]
    scripts = {"s": ["set a timer for 5 minutes", "turn the lights off"]}
    opts = SessionOptions(max_tokens=24, tools=True)
    report = evaluate([gen], scripts, opts, None, lambda _: None)
    turns = report["replies"]["diffusion"]["s"]
    assert [t["action"] is not None for t in turns] == [True, True]
    assert report["rows"][0]["actions"] == 2
    first = turns[0]["action"]
    tool = next(t for t in TOOLS if t.name == first["name"])
    kept = seen[1][1]  # the second turn's history: the first reply as the session keeps it
    call = render_call(tool, {k: v for k, v in first.items() if k != "name"})
    assert kept.role == "assistant" and kept.content.startswith(call)
    assert "tool_call" not in turns[0]["reply"]  # the words measured are the words heard
    # without tools nothing acts
    plain = evaluate([tiny_generator()[0]], scripts, SessionOptions(max_tokens=8), None, print)
    assert plain["rows"][0]["actions"] == 0
