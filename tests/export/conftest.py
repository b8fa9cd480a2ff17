"""A tiny random Llama exported once per test session, and its PyTorch twin."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from export.build import BuildOptions, Source, build_atomic, with_mask_row
from model.nn.backend import TorchBackend
from model.nn.llama import Llama
from model.runtime import OrtBackend
from model.tokenizer import TokenizerData, _unicode_to_byte
from tests.model.conftest import TINY, smollm2_gguf, tiny_model


def tiny_tokenizer_data() -> TokenizerData:
    """The byte-level tokenizer of tests.model.conftest, as the data a build stores."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = specials + sorted(_unicode_to_byte(), key=_unicode_to_byte().get)
    return TokenizerData(tokens, [], [3] * 3 + [1] * 256, 1, 2, "gpt2", "smollm")


def tiny_source() -> Source:
    return Source(tiny_model(), tiny_tokenizer_data(), {"gguf": "tiny random Llama"})


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """fp32, int8 and fp16 exports of the tiny model, with parity figures."""
    out = tmp_path_factory.mktemp("tiny-export") / "model"
    return build_atomic(out, BuildOptions(fp16=True), tiny_source())


@pytest.fixture(scope="session")
def tiny_plain(tmp_path_factory: pytest.TempPathFactory, tiny_ref: Llama) -> Path:
    """The tiny model's fp32 step graph with plain attention (the GPU form), beside
    ``tiny_dir``'s fused one; ``ort_backend(tiny_plain.parent, tiny_plain.name)``."""
    from export.build import export_onnx

    return export_onnx(tiny_ref, tmp_path_factory.mktemp("tiny-plain") / "plain.onnx", "plain")


@pytest.fixture(scope="session")
def tiny_ref() -> Llama:
    """The exported model in PyTorch: the tiny Llama with the mask row added."""
    return with_mask_row(tiny_model())


def torch_backend(model: Llama, max_len: int = 128) -> TorchBackend:
    return TorchBackend(model, max_len=max_len)


def ort_backend(tiny_dir: Path, variant: str = "model.onnx", max_len: int = 128) -> OrtBackend:
    from model.runtime import RuntimeConfig

    return OrtBackend(tiny_dir / variant, RuntimeConfig(device="cpu", max_len=max_len))


__all__ = ["TINY", "ort_backend", "smollm2_gguf", "tiny_source", "torch", "torch_backend"]
