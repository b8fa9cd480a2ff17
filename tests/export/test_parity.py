"""The exported graph computes what the PyTorch model computes (tiny random Llama)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from export.parity import greedy_agreement, logit_diffs
from tests.export.conftest import ort_backend, torch_backend

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


def test_int8_greedy_agreement_is_reported(tiny_dir: Path, tiny_ref) -> None:
    ref = torch_backend(tiny_ref)
    prompts = [PROMPT, PROMPT[::-1], [1, 2, 3, 4]]
    same, rate = greedy_agreement(ref, ort_backend(tiny_dir, "model.int8.onnx"), prompts, 16, {2})
    print(f"int8 vs fp32 greedy: {same}/3 replies identical, token agreement {rate:.2%}")
    assert 0.0 <= rate <= 1.0
    # the build wrote the same figures into the manifest, for every format
    parity = json.loads((tiny_dir / "manifest.json").read_text())["parity"]
    assert set(parity) == {"fp32", "int8", "fp16"}
    assert parity["fp32"]["token_agreement"] == 1.0
    assert parity["fp32"]["prefill_max_abs"] < 1e-5


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
