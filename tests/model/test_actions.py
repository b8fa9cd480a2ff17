"""Tool calls written into the reply's blocks (model/actions.py) and the engine that
acts (model/diffusion_engine.py), on the tiny random diffusion model: whatever the
weights, a call fits its schema, its strings come from the user's words, and the
passes it reports are the passes it ran."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from model.actions import (
    ActionSettings,
    CallOptions,
    ContentFree,
    _value,
    call_starts,
    decode_call,
    shapes,
)
from model.backend import last_row
from model.chat import SPOKEN_SYSTEM_PROMPT, build_prompt
from model.diffusion_engine import smollm2_diffusion_config
from model.engine import ChatMessage, drain
from model.nn.backend import TorchBackend
from model.nn.gguf import GGUFFile
from model.sampler import SamplerSettings, sample
from model.tools import (
    CALL_OPEN,
    DEFAULT_TOOLS,
    Param,
    Tool,
    ToolCall,
    call_ids,
)
from tests.schema import assert_fits_schema

from .conftest import tiny_tokenizer
from .test_diffusion import tiny_diffusion, tiny_generator

USER = "please navigate to the old harbour and tell Anna I am 5 minutes late"
# the default set without climate.set: a random model may write "-" or "." as a number
# (the one way a call can still fail validation: it is then not made)
TOOLS = tuple(t for t in DEFAULT_TOOLS if t.name != "climate.set")


class Counting:
    """A StepBackend that counts the passes run through it."""

    def __init__(self, inner: TorchBackend) -> None:
        self.inner, self.steps = inner, 0
        self.name, self.vocab_size, self.max_len = inner.name, inner.vocab_size, inner.max_len

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def step(self, *args: Any, **kwargs: Any) -> Any:
        self.steps += 1
        return self.inner.step(*args, **kwargs)


def prefilled(seed: int, text: str = USER) -> tuple[Counting, Any, np.ndarray, Any]:
    tok = tiny_tokenizer()
    backend = Counting(TorchBackend(tiny_diffusion(seed), max_len=512))
    prompt = build_prompt(tok, [ChatMessage("user", text)], 400, SPOKEN_SYSTEM_PROMPT)
    cache = backend.new_cache()
    ids = np.asarray(prompt, np.int64)
    last = backend.step(cache, ids, "causal", commit=True, rows=last_row(ids))[-1]
    return backend, cache, last, tok


@pytest.mark.parametrize("seed", range(4))
def test_whatever_the_weights_a_call_fits_its_schema_and_its_ids(seed: int) -> None:
    backend, cache, last, tok = prefilled(seed)
    config = smollm2_diffusion_config(tok)
    before = backend.steps
    done = decode_call(backend, tok, cache, last, TOOLS, USER, config, CallOptions(8))
    assert done is not None
    tool = next(t for t in TOOLS if t.name == done.call.name)
    assert_fits_schema(tool, done.call.arguments)
    # the ids are exactly the call's piecewise encoding: what training writes
    assert done.ids == call_ids(tok, tool, done.call.arguments)
    assert done.call.passes == backend.steps - before  # every pass is counted
    assert done.committed == len(done.ids) // 8 * 8  # whole blocks went to the cache
    assert backend.cache_length(cache) == _prompt_len(tok) + done.committed
    free = [p.name for p in tool.params if p.type == "string" and not p.enum]
    strings = [v for name in free if (v := done.call.arguments.get(name)) is not None]
    # a tool with free text has some in its call (seeds 0, 1 and 3 draw such tools)
    assert bool(strings) == bool(free), done.call
    for value in strings:
        assert value.lower() in USER.lower()  # copied from what was said
        words = re.search(rf"(?<!\w){re.escape(value.lower())}(?!\w)", USER.lower())
        assert words, value  # whole words: "ok" of "okay" is no value


def _prompt_len(tok: Any) -> int:
    return len(build_prompt(tok, [ChatMessage("user", USER)], 400, SPOKEN_SYSTEM_PROMPT))


def test_every_way_to_write_a_call_is_a_program() -> None:
    """Optional parameters present or not, each enum and boolean value spelled out."""
    tok = tiny_tokenizer()
    by_tool: dict[str, int] = {}
    for s in shapes(tok, DEFAULT_TOOLS):
        by_tool[s.tool.name] = by_tool.get(s.tool.name, 0) + 1
    assert by_tool["lights.set"] == 2  # true, false
    assert by_tool["reminder.create"] == 2  # with and without "when"
    assert by_tool["volume.set"] == 6  # {}, level, up, down, level + up, level + down
    assert sum(by_tool.values()) == len(DEFAULT_TOOLS) - 3 + 2 + 2 + 6


def test_a_string_value_is_refused_when_no_word_of_the_user_fits() -> None:
    """Nothing said to copy: the call cannot be written, and no call is made."""
    say = (Tool("say", "", (Param("text", "string"),)),)
    backend, cache, last, tok = prefilled(0, "")
    done = decode_call(
        backend, tok, cache, last, say, "", smollm2_diffusion_config(tok), CallOptions(8)
    )
    assert done is None


def test_a_cancelled_call_stops_before_its_next_pass() -> None:
    backend, cache, last, tok = prefilled(1)
    before = backend.steps
    config = smollm2_diffusion_config(tok)
    stop = decode_call(
        backend, tok, cache, last, TOOLS, USER, config, CallOptions(8), should_stop=lambda: True
    )
    assert stop is None and backend.steps == before


def test_the_first_token_decides() -> None:
    tok = tiny_tokenizer()
    logits = np.zeros(300, np.float32)
    assert not call_starts(tok, logits)
    logits[tok.encode_plain(CALL_OPEN)[0]] = 5.0
    assert call_starts(tok, logits)
    echo = tok.encode_plain("Set")[0]  # "Set a timer ..." said back
    logits[echo] = 6.0
    assert not call_starts(tok, logits)
    assert call_starts(tok, logits, {echo})  # an echo's start does not compete
    # the call's own token is never an echo: an earlier reply that acted is no reason
    assert call_starts(tok, logits, {echo, tok.encode_plain(CALL_OPEN)[0]})


def test_a_spoken_reply_never_opens_with_the_call_s_first_token() -> None:
    """The decision was speak: the sampler may not write a call as words."""
    tok = tiny_tokenizer()
    open_id = tok.encode_plain(CALL_OPEN)[0]
    backend = CallsFirst(tiny_diffusion(3), max_len=256)
    backend.open_id = open_id  # type: ignore[attr-defined]
    prompt = build_prompt(tok, [ChatMessage("user", "hi")], 200, SPOKEN_SYSTEM_PROMPT)
    settings = SamplerSettings(block_size=8, steps_per_block=4)
    config = smollm2_diffusion_config(tok)
    rng = np.random.default_rng(0)
    free, _ = drain(sample(backend, prompt, config, settings, rng, 8))
    assert free[0] == open_id  # what this backend writes unhindered
    banned, _ = drain(sample(backend, prompt, config, settings, rng, 8, avoid=((open_id,),)))
    assert banned[0] != open_id


@pytest.mark.models
def test_a_spoken_reply_writes_no_token_a_call_s_tags_start_with(smollm2_gguf: GGUFFile) -> None:
    """SmolLM2's tokenizer starts the two tags differently ("<tool" and "</tool"): a
    reply that was to speak, tools offered or not, writes none of those tokens
    anywhere, so it never speaks a call or its tail (after "Cancel the timer." the
    model answered "goodbye" with "</tool_call>Cancelling...", and with "</" barred at
    the start, "Itool_call>...")."""
    from model.tokenizer import Tokenizer

    gen, _ = tiny_generator()
    gen.tokenizer = tok = Tokenizer(smollm2_gguf.tokenizer_data())
    never = gen._no_call
    assert [tok.decode([i]) for i in never] == sorted(
        ["<", "</", "tool"], key=lambda t: tok.encode_plain(t)[0]
    )
    assert tok.encode_plain(" tool")[0] not in never  # the word itself stays sayable


def test_a_token_the_reply_may_never_write_is_not_written() -> None:
    tok = tiny_tokenizer()
    backend = TorchBackend(tiny_diffusion(3), max_len=256)
    prompt = build_prompt(tok, [ChatMessage("user", "hi")], 200, SPOKEN_SYSTEM_PROMPT)
    settings = SamplerSettings(block_size=8, steps_per_block=4)
    config = smollm2_diffusion_config(tok)
    free, _ = drain(sample(backend, prompt, config, settings, np.random.default_rng(0), 16))
    common = max(set(free), key=free.count)  # what the tiny model writes most
    got, _ = drain(
        sample(backend, prompt, config, settings, np.random.default_rng(0), 16, never=[common])
    )
    assert common not in got and len(got) == len(free)


@pytest.mark.parametrize(
    ("rule", "tools", "ends"),
    [
        ("tools", False, False),
        ("tools", True, True),
        ("always", False, True),
        ("never", True, False),
    ],
)
def test_where_a_reply_ends_only_after_a_sentence(
    rule: str, tools: bool, ends: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``end_after_sentence``: in sessions with tools (the default), in every session
    (what the loaders set for an adapter trained on calls), or never."""
    import model.diffusion_engine as engine

    seen: list[SamplerSettings] = []
    real = engine.sample

    def spy(backend, prompt, model, settings, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(settings)
        return real(backend, prompt, model, settings, *args, **kwargs)

    monkeypatch.setattr(engine, "sample", spy)
    gen, _ = tiny_generator(end_after_sentence=rule)
    drain(gen.generate([ChatMessage("user", "hi")], 8, lambda: False, TOOLS[:2] if tools else ()))
    assert [s.ends_after_sentence for s in seen] == [ends]


def test_forced_tokens_are_laid_down_not_yielded() -> None:
    tok = tiny_tokenizer()
    backend = TorchBackend(tiny_diffusion(2), max_len=256)
    config = smollm2_diffusion_config(tok)
    prompt = build_prompt(tok, [ChatMessage("user", "hi")], 200, SPOKEN_SYSTEM_PROMPT)
    settings = SamplerSettings(block_size=8, steps_per_block=4)
    rng = np.random.default_rng(0)
    forced = tok.encode_plain("<call>")  # 6 of the first block's 8
    tokens, stats = drain(sample(backend, prompt, config, settings, rng, 16, forced=forced))
    assert len(tokens) == stats.tokens == 16 - len(forced)  # the tiny model never ends
    with pytest.raises(ValueError, match="do not fit"):
        drain(sample(backend, prompt, config, settings, rng, 4, forced=forced))


class CallsFirst(TorchBackend):
    """The tiny model with the call's first token always most likely: so the engine
    takes the call path (the decision itself is test_the_first_token_decides)."""

    def step(self, *args: Any, **kwargs: Any) -> Any:
        logits = super().step(*args, **kwargs)
        logits[:, self.open_id] += 100.0
        return logits


@pytest.mark.parametrize("calibrate", [False, True])
def test_the_engine_yields_the_call_then_speaks_and_keeps_only_the_prompt(
    calibrate: bool,
) -> None:
    gen, _ = tiny_generator(actions=ActionSettings(calibrate=calibrate))
    tok = gen.tokenizer
    backend = CallsFirst(tiny_diffusion(4), max_len=1024)
    backend.open_id = tok.encode_plain(CALL_OPEN)[0]  # type: ignore[attr-defined]
    gen.backend = gen.prefixes.backend = backend
    convo = [ChatMessage("user", "set a timer for 5 minutes")]
    items, stats = drain(gen.generate(convo, 48, lambda: False, TOOLS[:2]))  # timer.*
    call, *speech = items
    assert isinstance(call, ToolCall) and call.passes > 0
    assert all(isinstance(s, str) for s in speech)  # the confirmation, never the call
    assert stats.forward_passes > call.passes and stats.tokens <= 48
    assert len(gen.prefixes) == 1  # the next turn reuses the prompt's cache
    no_tools, _ = drain(tiny_generator()[0].generate(convo, 16, lambda: False))
    assert not any(isinstance(i, ToolCall) for i in no_tools)
    assert len(gen._calibrations) == calibrate  # the tool set's content-free odds, kept


def test_a_reply_with_tools_prefills_its_prompt_once() -> None:
    """The decision reads the prefill's last row; the sampler goes on from it rather
    than running the prompt's last position again."""
    gen, prefills = tiny_generator()
    convo = [ChatMessage("user", "hi")]
    items, _ = drain(gen.generate(convo, 8, lambda: False, TOOLS[:2]))
    assert not any(isinstance(i, ToolCall) for i in items)  # the tiny model speaks
    assert len(prefills) == 1  # one causal pass: the whole prompt


def test_a_calibrated_branch_takes_the_option_its_prior_undervalues() -> None:
    """Each branch divides the model's odds by the content-free ones: an option the
    prior all but rules out wins every branch it is at (here lights.set, on: off)."""
    backend, cache, last, tok = prefilled(0)
    config = smollm2_diffusion_config(tok)
    (lights,) = [
        s for s in shapes(tok, TOOLS) if s.tool.name == "lights.set" and not s.values["on"]
    ]
    program = lights.program

    def prior(ids: Any, options: Any) -> np.ndarray:
        at = program[len(ids)] if len(ids) < len(program) else None
        return np.array([1e-12 if o == at else 1.0 for o in options])

    done = decode_call(backend, tok, cache, last, TOOLS, USER, config, CallOptions(8, prior=prior))
    assert done is not None
    assert (done.call.name, done.call.arguments) == ("lights.set", {"on": False})


def test_content_free_odds_are_read_once_per_branch() -> None:
    tok = tiny_tokenizer()
    backend = Counting(TorchBackend(tiny_diffusion(1), max_len=512))
    config = smollm2_diffusion_config(tok)
    prompts = [
        build_prompt(tok, [ChatMessage("user", t)], 400, SPOKEN_SYSTEM_PROMPT) for t in ("N/A", "")
    ]
    free = ContentFree(backend, tok, prompts, config, block=8)
    ids = call_ids(tok, TOOLS[0], {"seconds": 5})[:3]
    options = [5, 7, 11]
    first = free(ids, options)
    assert first.shape == (3,) and np.all(first > 0) and first.sum() <= 1.0
    assert backend.steps == 2 + 2  # a prefill and a pass per prompt
    assert np.array_equal(free(ids, options), first) and backend.steps == 4  # kept
    free(ids[:2], options)
    assert backend.steps == 6  # another branch: a pass per prompt, the prefills kept


@pytest.mark.parametrize(
    ("text", "value"),
    [("60", 32), ("12", 16), ("21.5", 21.5), ("20", 20), ("-", "-")],
)
def test_a_number_past_the_schema_s_whole_bounds_is_clamped_to_them(
    text: str, value: float | str
) -> None:
    """The cabin's 16-32 degrees are whole numbers: "bring the cabin to sixteen" heard
    "60" is clamped to 32 (then asked about, model.ask.unsaid), not a failed turn (an
    int has no is_integer before Python 3.12)."""
    cabin = Param("temperature_c", "number", minimum=16, maximum=32)
    assert _value(cabin, text) == value
    assert type(_value(cabin, text)) is type(value)
