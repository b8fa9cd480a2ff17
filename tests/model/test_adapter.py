"""Adapter save / load / apply round trip on a tiny model with the mask row."""

from __future__ import annotations

import json

import pytest
import torch

from model.nn.adapter import (
    TARGETS,
    apply_adapter,
    attach_lora,
    extract_adapter,
    load_adapter,
    save_adapter,
)
from tests.model.conftest import tiny_model
from tests.model.test_train import CFG, MASK, tiny_diffusion


def trained_adapter(dtype=torch.float32):
    """A LoRA-wrapped tiny model with random (non-zero) factors, and its adapter."""
    model = tiny_diffusion()
    attach_lora(model, rank=4, alpha=8)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    mask_emb = torch.randn(CFG.n_embd, generator=gen)
    return model, extract_adapter(model, mask_emb, 4, 8)


def test_round_trip_merges_base_plus_scaled_BA(tmp_path):
    _, adapter = trained_adapter()
    adapter.manifest = {"block_size": 4, "steps": 3}
    save_adapter(tmp_path, adapter, dtype=torch.float32)
    loaded = load_adapter(tmp_path)
    assert (loaded.rank, loaded.alpha, loaded.manifest["steps"]) == (4, 8.0, 3)
    assert len(loaded.lora) == CFG.n_layer * len(TARGETS)
    base, merged = tiny_diffusion(), apply_adapter(tiny_diffusion(), loaded)
    for name, (A, B) in adapter.lora.items():
        w0 = base.get_submodule(name).weight
        torch.testing.assert_close(merged.get_submodule(name).weight, w0 + 2.0 * B @ A)
    assert torch.equal(merged.tok_emb.weight[MASK], adapter.mask_embedding)
    assert torch.equal(merged.tok_emb.weight[:MASK], base.tok_emb.weight[:MASK])


def test_merged_model_computes_what_the_lora_model_did(tmp_path):
    lora_model, adapter = trained_adapter()
    save_adapter(tmp_path, adapter)  # fp16 on disk, as shipped
    merged = apply_adapter(tiny_diffusion(), load_adapter(tmp_path))
    x = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        torch.testing.assert_close(merged(x), lora_model(x), rtol=2e-3, atol=2e-3)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["weights"]["dtype"] == "float16" and len(manifest["weights"]["sha256"]) == 64


def test_apply_needs_the_mask_row():
    _, adapter = trained_adapter()
    with pytest.raises(ValueError, match="mask row"):
        apply_adapter(tiny_model(), adapter)
