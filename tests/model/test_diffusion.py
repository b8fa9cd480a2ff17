"""The diffusion model and engine on real (tiny random, and SmolLM2) weights.

The central check: block-causal sampling with the KV cache produces exactly the tokens
of a cache-free sampler that reruns the whole sequence under
:func:`model.nn.diffusion.block_causal_mask` at every step.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch

from model.chat import build_prompt, encode_chat, encode_message
from model.diffusion_engine import (
    DiffusionGenerator,
    DiffusionOptions,
    smollm2_diffusion_config,
)
from model.engine import ChatMessage, GenerationStats, ReplyEnd, ThreadedReplyEngine, drain
from model.nn.backend import TorchBackend
from model.nn.diffusion import add_mask_row, block_causal_mask, load_smollm2_diffusion
from model.nn.gguf import gguf_tokenizer
from model.nn.llama import Llama, LlamaConfig
from model.prefix import WARM_CHUNK, PrefixCache
from model.sampler import DiffusionConfig, SamplerSettings, sample
from tests.model.conftest import tiny_tokenizer

BASE = LlamaConfig(
    vocab_size=259, n_layer=2, n_embd=32, n_head=4, n_kv_head=2, ffn_hidden=64, max_seq_len=256
)
MASK = BASE.vocab_size  # the extra row


def tiny_diffusion(seed: int = 0) -> Llama:
    torch.manual_seed(seed)
    base = Llama(BASE).eval()
    config, state = add_mask_row(BASE, base.state_dict())
    return Llama.from_state_dict(config, state)


class RecomputeBackend:
    """StepBackend without a KV cache: every step reruns the committed ids plus the new
    ones through the model with one bool block-causal mask (causal prompt, blocks)."""

    name = "recompute"

    def __init__(self, model: Llama, block_size: int, max_len: int = 256) -> None:
        self.model, self.block_size, self.max_len = model, block_size, max_len
        self.vocab_size = model.config.vocab_size

    def new_cache(self) -> dict[str, Any]:
        return {"ids": [], "prompt": 0}

    def cache_length(self, cache: dict[str, Any]) -> int:
        return len(cache["ids"])

    def truncate(self, cache: dict[str, Any], length: int) -> None:
        cache["ids"] = cache["ids"][:length]
        cache["prompt"] = min(cache["prompt"], length)

    def step(self, cache, ids, attend, commit, rows=None):  # type: ignore[no-untyped-def]
        seq = cache["ids"] + ids.tolist()
        n_prompt = len(seq) if attend == "causal" else cache["prompt"]
        mask = block_causal_mask(n_prompt, len(seq), self.block_size)
        with torch.inference_mode():
            logits = self.model(torch.tensor([seq]), mask=mask)[0, len(cache["ids"]) :]
        if commit:
            cache["ids"], cache["prompt"] = seq, n_prompt
        return (logits if rows is None else logits[list(rows)]).numpy()


# ------------------------------------------------------------------ the model


def test_block_causal_mask_pattern() -> None:
    m = block_causal_mask(n_prompt=2, n=7, block_size=2)[0, 0].int().tolist()
    assert m == [
        [1, 0, 0, 0, 0, 0, 0],  # prompt: causal
        [1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0],  # block 0: prompt + itself
        [1, 1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 1, 1, 0],  # block 1: + block 0
        [1, 1, 1, 1, 1, 1, 0],
        [1, 1, 1, 1, 1, 1, 1],  # block 2 (partial)
    ]
    assert block_causal_mask(0, 5, 8).all()  # one block over everything: LLaDA


def test_mask_row_is_the_mean_embedding_and_the_head_keeps_the_vocabulary() -> None:
    torch.manual_seed(0)
    base = Llama(BASE).eval()
    model = tiny_diffusion(0)
    emb = model.tok_emb.weight
    assert emb.shape == (BASE.vocab_size + 1, BASE.n_embd)
    torch.testing.assert_close(emb[MASK], base.tok_emb.weight.mean(0))
    ids = torch.tensor([[1, 5, 9, MASK]])
    with torch.inference_mode():
        logits = model(ids)
        assert logits.shape == (1, 4, BASE.vocab_size)
        torch.testing.assert_close(logits[:, :3], base(ids[:, :3]))  # causal: same prefix


def test_attention_biases_are_used() -> None:
    config = replace(BASE, attn_bias=True)
    torch.manual_seed(0)
    model = Llama(config).eval()
    ids = torch.tensor([[3, 4, 5]])
    with torch.inference_mode():
        before = model(ids)
        model.blocks[0].attn.v_proj.bias.add_(1.0)
        assert not torch.allclose(before, model(ids))


@pytest.mark.parametrize("shift", [True, False])
@pytest.mark.parametrize(
    "settings",
    [
        SamplerSettings(block_size=4, rule="lowconf", steps_per_block=2),
        SamplerSettings(block_size=4, rule="threshold", threshold=0.02, steps_per_block=4),
        SamplerSettings(block_size=3, rule="lowconf", steps_per_block=3, temperature=1.0),
    ],
)
def test_kv_cached_blocks_give_the_tokens_of_a_cache_free_recomputation(
    settings: SamplerSettings, shift: bool
) -> None:
    model = tiny_diffusion(1)
    cfg = DiffusionConfig(mask_id=MASK, end_ids=frozenset({2}), attention="block", shift=shift)
    prompt = [1, 40, 41, 42, 43, 44, 2, 1, 50]
    runs = []
    recompute = RecomputeBackend(model, settings.block_size)
    for backend in (TorchBackend(model, max_len=64), recompute):
        gen = sample(backend, prompt, cfg, settings, np.random.default_rng(3), max_tokens=11)
        runs.append(drain(gen))
    assert runs[0] == runs[1]
    assert runs[0][1].tokens > 4  # several blocks were decoded (a random model rarely ends)


def test_prefix_reuse_gives_the_tokens_of_a_cold_start() -> None:
    model = tiny_diffusion(2)
    backend = TorchBackend(model, max_len=64)
    cfg = DiffusionConfig(mask_id=MASK, end_ids=frozenset({2}))
    s = SamplerSettings(block_size=4, rule="lowconf", steps_per_block=2)
    first, second = [1, 30, 31, 32, 33, 2], [1, 30, 31, 32, 33, 2, 1, 60, 61, 62]

    def reply(prompt: list[int], prefix: Any = None) -> list[int]:
        gen = sample(backend, prompt, cfg, s, np.random.default_rng(0), 8, prefix=prefix)
        return drain(gen)[0]

    cache = PrefixCache(backend, capacity=4)
    p = cache.take(first)
    assert p.length == 0
    drain(sample(backend, first, cfg, s, np.random.default_rng(0), 8, prefix=p))
    cache.put(first, p.cache)
    warm = cache.take(second)
    assert warm.length == len(first)
    assert reply(second, warm) == reply(second)
    cache.put(second, warm.cache)
    rolled_back = [1, 30, 31, 32, 33, 2, 1, 70]  # the last turn replaced
    warm = cache.take(rolled_back)
    assert warm.length == len(first) + 1
    assert reply(rolled_back, warm) == reply(rolled_back)


def test_prefix_cache_keeps_sessions_apart_and_evicts_the_oldest() -> None:
    backend = TorchBackend(tiny_diffusion(0), max_len=32)
    cache = PrefixCache(backend, capacity=2)
    system = [1, 9, 9, 9]
    for turn in ([5, 6], [7, 8]):  # two sessions, same system prompt
        c = backend.new_cache()
        backend.step(c, np.array(system + turn), "causal", commit=True)
        cache.put(system + turn, c)
    # a third session shares only the system prompt: it must not take a session's cache
    assert cache.take([*system, 3]).length == 0 and len(cache) == 2
    # a session's next turn takes its own cache
    assert cache.take([*system, 5, 6, 2, 4]).length == 6 and len(cache) == 1
    for turn in ([1], [2], [3]):
        c = backend.new_cache()
        backend.step(c, np.array(system + turn), "causal", commit=True)
        cache.put(system + turn, c)
    assert len(cache) == 2  # capacity: the oldest went first
    assert cache.take([*system, 7, 8]).length < 6


# ------------------------------------------------------------------ the engine


def tiny_generator(**options: Any) -> tuple[DiffusionGenerator, list[int]]:
    """The engine on the tiny model; also returns the sizes of its causal prefills."""
    tok = tiny_tokenizer()
    backend = TorchBackend(tiny_diffusion(4), max_len=512)
    prefills: list[int] = []
    step = backend.step

    def counting_step(cache, ids, attend, commit, rows=None):  # type: ignore[no-untyped-def]
        if attend == "causal":
            prefills.append(len(ids))
        return step(cache, ids, attend, commit, rows)

    backend.step = counting_step  # type: ignore[method-assign]
    opts = DiffusionOptions(sampler=SamplerSettings(block_size=8, steps_per_block=4), **options)
    return DiffusionGenerator(backend, tok, smollm2_diffusion_config(tok), opts), prefills


def reply_text(gen: DiffusionGenerator, conversation: list[ChatMessage]) -> tuple[str, Any]:
    pieces, stats = drain(gen.generate(conversation, 16, lambda: False))
    return "".join(pieces), stats


def test_engine_turns_reuse_the_conversation_cache() -> None:
    warm, prefills = tiny_generator()
    turn1 = [ChatMessage("user", "hi there")]
    text1, stats = reply_text(warm, turn1)
    assert stats.forward_passes >= 2 and len(warm.prefixes) == 1
    turn2 = [*turn1, ChatMessage("assistant", text1 or "ok"), ChatMessage("user", "and then?")]
    text2, _ = reply_text(warm, turn2)
    cold, cold_prefills = tiny_generator()
    assert reply_text(cold, turn2)[0] == text2
    assert prefills[1] < cold_prefills[0]  # only the new part was prefilled


@pytest.mark.parametrize("window", [None, 2, 3])
def test_a_warmed_next_turn_prefills_only_its_new_words_and_replies_as_a_cold_one(
    window: int | None,
) -> None:
    """Between turns the engine prefills what the next prompt starts with (the last
    reply; with a history window, the history from its new start): the next turn then
    prefills only the user's new message and the assistant's header, and writes the
    tokens a cold engine writes."""
    gen, prefills = tiny_generator(history_window=window)
    conversation: list[ChatMessage] = []
    for i, question in enumerate(["hi there", "and then?", "why so?", "tell me more"]):
        conversation.append(ChatMessage("user", question))
        prefills.clear()
        text, _ = reply_text(gen, conversation)
        cold, _ = tiny_generator(history_window=window)
        assert reply_text(cold, conversation)[0] == text
        if i:  # after a warm: the new message and the header, at most
            tok = gen.tokenizer
            new = len(encode_message(tok, conversation[-1])) + len(encode_chat(tok, []))
            assert prefills[0] <= new, (i, prefills)
        conversation.append(ChatMessage("assistant", text or "ok"))
        prefills.clear()
        # the last reply, or the kept history after its start moved (nothing where the
        # window dropped it all: the system prompt is held)
        assert gen.warm(conversation) == sum(prefills) and (i or prefills)
        assert all(n <= WARM_CHUNK for n in prefills)
        assert gen.warm(conversation) == 0  # held already


def test_engine_counts_passes_and_respects_max_tokens() -> None:
    """The tiny model never writes an end token, so its reply runs to the budget: two
    blocks of 8 at their 4 steps each, one commit between them, one prefill of the
    whole prompt; a budget of 12 stops inside the second block."""
    steps = 4
    conversation = [ChatMessage("user", "count")]
    for max_tokens in (16, 12):
        gen, prefills = tiny_generator()
        pieces, stats = drain(gen.generate(conversation, max_tokens, lambda: False))
        assert stats == GenerationStats(max_tokens, 1 + 2 * steps + 1, "budget")
        opts = gen.options
        prompt = build_prompt(gen.tokenizer, conversation, opts.prompt_budget, opts.system_prompt)
        assert prefills == [len(prompt)]
        assert 0 < len("".join(pieces)) <= max_tokens  # a byte token is at most a character


@pytest.mark.models
def test_smollm2_diffusion_engine_runs_and_stops(smollm2_gguf) -> None:  # type: ignore[no-untyped-def]
    """The served adapter on SmolLM2 in PyTorch (the ONNX graphs' source) answers."""
    from model.diffusion_engine import served_options
    from model.modeldir import SHIPPED_ADAPTER
    from model.nn.adapter import load_adapter

    adapter = load_adapter(SHIPPED_ADAPTER)
    served = served_options(adapter.manifest)  # its sampler, at most 4 steps a block
    settings = replace(served, sampler=replace(served.sampler, block_size=16, steps_per_block=4))
    model = load_smollm2_diffusion(smollm2_gguf, adapter)
    assert model.tok_emb.weight.shape[0] == model.config.vocab_size + 1

    async def ask() -> list[Any]:
        with ThreadPoolExecutor(1) as pool:
            backend = TorchBackend(model, max_len=settings.cache_len)
            tok = gguf_tokenizer(smollm2_gguf)
            model_cfg = smollm2_diffusion_config(tok)
            engine = ThreadedReplyEngine(
                DiffusionGenerator(backend, tok, model_cfg, settings), pool
            )
            question = [ChatMessage("user", "What is the capital of France?")]
            return [c async for c in engine.stream(question, 32)]

    chunks = asyncio.run(ask())
    assert isinstance(chunks[-1], ReplyEnd)
    stats = chunks[-1].stats
    assert all(isinstance(c, str) for c in chunks[:-1])
    # fp32 names Paris (int8 flips a near-tie to a made-up name: tests/speech.py)
    assert "Paris" in "".join(chunks[:-1]), chunks
    assert 0 < stats.tokens <= 32 and stats.stopped_by == "end"
    # prefill + at most 4 steps per block + one commit between the two blocks
    assert 2 <= stats.forward_passes <= 1 + 2 * 4 + 1


def test_the_blocks_size_the_cache_and_the_room_for_a_reply() -> None:
    blocks = SamplerSettings(block_size=4)
    opts = DiffusionOptions(sampler=blocks, prompt_budget=10, reply_cache_tokens=20)
    assert opts.cache_len == 10 + 20  # five blocks of 4
    assert replace(opts, reply_cache_tokens=21).cache_len == 10 + 24  # the last one whole
    assert replace(opts, reply_cache_tokens=0).cache_len == 10
    gen, _ = tiny_generator()
    gen.options = replace(gen.options, sampler=blocks)
    room = gen.backend.max_len
    assert gen._room(room - 20, 64) == 20 and gen._room(room - 19, 64) == 16
    assert gen._room(room - 30, 3) == 3
    with pytest.raises(ValueError, match="no room for a 4-token block"):
        gen._room(room - 3, 64)
