"""The exported graph computes what the PyTorch model computes (tiny random Llama)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import model.diffusion_engine as diffusion_engine
from export.build import BuildOptions, Source, build_atomic
from export.graph import rope_tables
from export.parity import greedy_agreement, logit_diffs
from model.assemble import Batching, load_onnx_diffusion_generator, with_block_size
from model.diffusion_engine import DiffusionGenerator, DiffusionOptions, smollm2_diffusion_config
from model.engine import ChatMessage, GenerationStats, drain
from model.modeldir import load_tokenizer
from model.nn.diffusion import with_mask_row
from model.nn.llama import Llama, LlamaConfig
from tests.export.conftest import ort_backend, tiny_tokenizer_data, torch_backend
from tests.model.conftest import TINY, tiny_model

PROMPT = [5, 17, 42, 7, 99, 3, 250, 11]


@pytest.mark.parametrize(("variant", "tol"), [("model.onnx", 1e-5), ("model.fp16.onnx", 2e-3)])
def test_causal_prefill_ar_step_and_block_step_match_pytorch(
    tiny_dir: Path, tiny_ref, variant: str, tol: float
) -> None:
    ref = torch_backend(tiny_ref)
    mask_id = tiny_ref.config.vocab_size
    prefill, step, block, top1 = logit_diffs(ref, ort_backend(tiny_dir, variant), PROMPT, mask_id)
    print(f"{variant}: max |logit diff| prefill {prefill:.2e} step {step:.2e} block {block:.2e}")
    assert max(prefill, step, block) < tol and top1 == 1.0


def test_block_step_uses_the_mask_row(tiny_dir: Path, tiny_ref) -> None:
    """The mask id embeds (row V of the table) but is never a logit."""
    b = ort_backend(tiny_dir)
    mask_id = tiny_ref.config.vocab_size
    cache = b.new_cache()
    b.step(cache, np.array(PROMPT, np.int64), "causal", True)
    logits = b.step(cache, np.array([mask_id] * 4, np.int64), "block", False)
    assert logits.shape == (4, mask_id)
    ref = torch_backend(tiny_ref)
    rc = ref.new_cache()
    ref.step(rc, np.array(PROMPT, np.int64), "causal", True)
    want = ref.step(rc, np.array([mask_id] * 4, np.int64), "block", False)
    np.testing.assert_allclose(logits, want, atol=1e-5)


def test_fp32_greedy_replies_equal_pytorchs(tiny_dir: Path, tiny_ref) -> None:
    ref = torch_backend(tiny_ref)
    prompts = [PROMPT, PROMPT[::-1], [1, 2, 3, 4]]
    assert greedy_agreement(ref, ort_backend(tiny_dir), prompts, 16, {2}) == (3, 1.0)


def test_int8_is_quantized_and_keeps_pytorchs_greedy_replies(tiny_dir: Path, tiny_ref) -> None:
    """int8 moves the logits by more than float rounding (it is quantized) and by far
    less than the tiny model's top-1 margins along these replies (0.07 at the least),
    so every greedy token stays."""
    ref = torch_backend(tiny_ref)
    int8 = ort_backend(tiny_dir, "model.int8.onnx")
    *diffs, top1 = logit_diffs(ref, int8, PROMPT, tiny_ref.config.vocab_size)
    print(f"int8: max |logit diff| prefill/step/block {diffs}")
    assert all(1e-4 < d < 0.03 for d in diffs) and top1 == 1.0
    prompts = [PROMPT, PROMPT[::-1], [1, 2, 3, 4]]
    assert greedy_agreement(ref, int8, prompts, 16, {2}) == (3, 1.0)


def test_the_manifest_reports_the_parity_of_every_format(tiny_dir: Path) -> None:
    """The build measured the same (on the chat prompts, 32 tokens) and wrote it down."""
    parity = json.loads((tiny_dir / "manifest.json").read_text())["parity"]
    assert set(parity) == {"fp32", "int8", "fp16"}
    for fmt in ("fp32", "int8"):
        assert parity[fmt]["replies_identical"] == parity[fmt]["replies"] == 3, fmt
        assert parity[fmt]["token_agreement"] == 1.0, fmt
        assert parity[fmt]["prefill_top1"] == 1.0, fmt
    assert parity["fp32"]["prefill_max_abs"] < 1e-5
    assert 1e-4 < parity["int8"]["prefill_max_abs"] < 0.03
    assert parity["fp16"]["prefill_max_abs"] < 2e-3  # logits only: no replies on a CPU
    assert parity["fp16"]["token_agreement"] is None


def test_the_fused_rope_tables_are_the_angles_rounded_once() -> None:
    """Every entry of SmolLM2's tables, to its last position, is the float64 cos / sin
    rounded to fp32 (within half an ulp): no path-dependent fp32 rounding, so two
    exports of the same weights write the same file. The fp32 recipe was 4.6e-4 off."""
    cfg = LlamaConfig()
    cos, sin = rope_tables(cfg)
    angle = np.arange(cfg.max_seq_len, dtype=np.float64)[:, None] * cfg.rope_theta ** -(
        np.arange(0, cfg.head_dim, 2, dtype=np.float64) / cfg.head_dim
    )
    for got, want in ((cos, np.cos(angle)), (sin, np.sin(angle))):
        assert got.dtype == torch.float32 and got.shape == (cfg.max_seq_len, cfg.head_dim // 2)
        ulp = np.spacing(np.abs(want).astype(np.float32))
        assert np.all(np.abs(got.numpy().astype(np.float64) - want) <= ulp / 2 + 1e-12)


def test_a_head_size_the_fused_node_rotates_matches_pytorch(tmp_path: Path) -> None:
    """Format v6 with RoPE inside the fused node (head sizes that are multiples of 16,
    as SmolLM2's 64): q, k and v packed into one product, no explicit rotation, and the
    one-reply and batched graphs compute what PyTorch does."""
    import onnx

    from export.build import export_batch_onnx, export_onnx
    from model.batch import BatchedBackend, BatchRunner, StepLoop
    from model.nn.llama import LlamaConfig
    from model.runtime import OrtBackend, RuntimeConfig

    config = LlamaConfig(
        vocab_size=300, n_layer=2, n_embd=64, n_head=4, n_kv_head=2, ffn_hidden=96, max_seq_len=128
    )
    model = with_mask_row(tiny_model(seed=3, config=config))
    path = export_onnx(model, tmp_path / "m.onnx")
    graph = onnx.load(str(path)).graph
    fused = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    rotary = [a.i for n in fused for a in n.attribute if a.name == "do_rotary"]
    assert len(fused) == config.n_layer and rotary == [1] * config.n_layer
    assert not [n for n in graph.node if n.op_type in ("Neg", "Sin", "Cos")]  # no RoPE outside
    assert all(n.input[1] == "" and n.input[2] == "" for n in fused)  # q, k, v packed
    products = [n for n in graph.node if n.op_type == "MatMul"]
    assert len(products) == 4 * config.n_layer + 1  # qkv, o, gate+up, down a layer; the head
    ref = torch_backend(model)
    one = OrtBackend(path, RuntimeConfig(device="cpu", max_len=128))
    prefill, step, block, top1 = logit_diffs(ref, one, PROMPT, 300)
    assert max(prefill, step, block) < 1e-5 and top1 == 1.0
    # positions far from zero: the node's tables are read at `positions`, not at 0
    ids = np.array([*PROMPT] * 8, np.int64)
    a = ref.step(ref.new_cache(), ids, "causal", True)
    b = one.step(one.new_cache(), ids, "causal", True)
    np.testing.assert_allclose(b, a, atol=1e-5)
    runner = BatchRunner(one, export_batch_onnx(model, tmp_path / "b.onnx", 2))
    loop = StepLoop(runner)
    try:
        prefill, step, block, top1 = logit_diffs(ref, BatchedBackend(loop), PROMPT, 300)
    finally:
        loop.close()
    assert max(prefill, step, block) < 1e-5 and top1 == 1.0


@pytest.mark.parametrize("fmt", ["llada", "dream"])
def test_llada_and_dream_checkpoints_export_to_the_same_step_graph(
    tmp_path: Path, fmt: str
) -> None:
    """Their layouts (LLaDA's names, Dream's q/k/v biases) go through the fused attention."""
    import torch

    from export.build import export_onnx
    from model.nn.backend import TorchBackend
    from model.nn.hf_formats import load_hf_diffusion
    from model.runtime import OrtBackend, RuntimeConfig
    from tests.model import test_hf_formats as hf

    config, tensors = (
        (hf.LLADA_CONFIG, hf.llada_tensors)
        if fmt == "llada"
        else (hf.DREAM_CONFIG, hf.dream_tensors)
    )
    torch.manual_seed(0)
    hf.write_checkpoint(tmp_path, config, tensors())
    model, _ = load_hf_diffusion(tmp_path, dtype=torch.float32)
    t = TorchBackend(model, 64)
    o = OrtBackend(export_onnx(model, tmp_path / "m.onnx"), RuntimeConfig(device="cpu", max_len=64))
    ids = np.array([3, 17, hf.MASK_ID, hf.MASK_ID, 42, 5, hf.MASK_ID])
    full = [b.step(b.new_cache(), ids, "block", commit=False) for b in (t, o)]
    np.testing.assert_allclose(full[1], full[0], atol=1e-4)
    caches = [t.new_cache(), o.new_cache()]
    for b, c in zip((t, o), caches, strict=True):
        b.step(c, ids[:4], "causal", commit=True)
    after = [b.step(c, ids[4:], "block", commit=False) for b, c in zip((t, o), caches, strict=True)]
    np.testing.assert_allclose(after[1], after[0], atol=1e-4)


# ------------------------------------------------------------ the diffusion engine


def peaked_model() -> Llama:
    """A tiny Llama whose replies exercise the served sampler: the byte tokenizer's
    vocabulary (so the mask is the extra row, as in SmolLM2), its own output head scaled
    up so that some positions pass the 0.9 threshold (the plain tiny model is never that
    sure: one leftmost token per pass) and <|im_end|> tilted so that some replies end.
    The plain tiny model's reply is one token repeated, which a broken engine could
    match."""
    model = tiny_model(0, replace(TINY, vocab_size=259, tie_embeddings=False))
    with torch.no_grad():
        model.lm_head.weight *= 100
        model.lm_head.weight[2] *= 1.4  # <|im_end|>
    return model


@pytest.fixture(scope="module")
def peaked_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = Source(peaked_model(), tiny_tokenizer_data(), {"gguf": "tiny peaked Llama"})
    out = tmp_path_factory.mktemp("peaked") / "model"
    return build_atomic(out, BuildOptions(int8=False, check=False), source)


Reply = tuple[list[int], list[str], GenerationStats]


def replies(
    gen: DiffusionGenerator, conversations: list[list[ChatMessage]], monkeypatch
) -> list[Reply]:
    """Each conversation's reply through ``gen.generate``: the sampler's tokens, the
    text pieces and the stats; one generator, so later turns reuse its prefix cache."""
    tokens: list[int] = []
    real = diffusion_engine.sample

    def recording(*args: Any, **kwargs: Any):  # type: ignore[no-untyped-def]
        it = real(*args, **kwargs)
        while True:
            try:
                tokens.append(next(it))
            except StopIteration as done:
                return done.value
            yield tokens[-1]

    monkeypatch.setattr(diffusion_engine, "sample", recording)
    out: list[Reply] = []
    for conversation in conversations:
        tokens.clear()
        pieces, stats = drain(gen.generate(conversation, 48, lambda: False))
        out.append((list(tokens), pieces, stats))
    return out


QUESTIONS = ["hi", "What is the capital of Italy?", "Tell me a story.", "Name three colors."]


@pytest.mark.parametrize("block_size", [16, 1], ids=["wide", "narrow"])
def test_the_onnx_diffusion_engine_writes_the_pytorch_engines_replies(
    peaked_dir: Path, monkeypatch, block_size: int
) -> None:
    """The served engine (load_onnx_diffusion_generator, fp32 graph, default sampler
    settings in either schedule a host may get) and the same DiffusionGenerator on the
    PyTorch model: token for token."""
    asked = Batching(rows=1, block_size=block_size)
    onnx = load_onnx_diffusion_generator(peaked_dir, "fp32", batching=asked)
    tok = load_tokenizer(peaked_dir)
    options = with_block_size(DiffusionOptions(), block_size)
    assert onnx.options == options
    backend = torch_backend(with_mask_row(peaked_model()), options.cache_len)
    ref = DiffusionGenerator(backend, tok, smollm2_diffusion_config(tok), options)

    first = [[ChatMessage("user", q)] for q in QUESTIONS]
    want = replies(ref, first, monkeypatch)
    # the second turn of the first conversation: its prompt starts with the first turn,
    # which each engine's prefix cache already holds
    second: Callable[[list[Reply]], list[ChatMessage]] = lambda r: [  # noqa: E731
        *first[0],
        ChatMessage("assistant", "".join(r[0][1])),
        ChatMessage("user", "And then?"),
    ]
    want += replies(ref, [second(want)], monkeypatch)
    got = replies(onnx, first, monkeypatch)
    got += replies(onnx, [second(got)], monkeypatch)
    assert got == want
    # what the replies exercised: an end, the budget, several tokens in one pass (the
    # narrow schedule writes one a pass, and wraps the long reply up at a sentence's end)
    stats = [s for _, _, s in want]
    wide = block_size > 1
    assert {s.stopped_by for s in stats} == ({"end", "budget"} if wide else {"end"})
    assert any(s.forward_passes < s.tokens for s in stats) == wide
    assert all(len(t) == s.tokens > 0 for t, _, s in want)
