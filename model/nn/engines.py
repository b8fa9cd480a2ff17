"""The reply engines on the PyTorch model ("smollm2-ar", "diffusion"): development and
reference engines, the same decoders as the served ONNX ones (:mod:`model.assemble`) on
a :class:`model.nn.backend.TorchBackend`."""

from __future__ import annotations

from pathlib import Path

import torch

from model.ar import ARGenerator, AROptions
from model.diffusion_engine import (
    DiffusionGenerator,
    DiffusionOptions,
    served_options,
    smollm2_diffusion_config,
)
from model.nn.adapter import Adapter, load_adapter
from model.nn.backend import TorchBackend
from model.nn.diffusion import load_smollm2_diffusion
from model.nn.gguf import GGUFFile, open_gguf
from model.nn.llama import Llama
from model.tokenizer import Tokenizer

# positions of an AR reply's cache beyond the prompt budget: the reply itself
AR_REPLY_ROOM = 512


def load_ar_generator(
    source: GGUFFile | str | Path | None = None, options: AROptions | None = None
) -> ARGenerator:
    """Read the GGUF (default: the offline SmolLM2) once; build model + tokenizer."""
    options = options or AROptions()
    f = open_gguf(source)
    config = f.llama_config()
    model = Llama.from_state_dict(config, f.state_dict(config), getattr(torch, options.dtype))
    backend = TorchBackend(model, max_len=options.prompt_budget + AR_REPLY_ROOM)
    return ARGenerator(backend, Tokenizer(f.tokenizer_data()), options)


def load_diffusion_generator(
    adapter: Adapter | str | Path | None = None,
    settings: DiffusionOptions | None = None,
    source: GGUFFile | str | Path | None = None,
) -> DiffusionGenerator:
    """The "diffusion" generator: SmolLM2 from the GGUF with the mask row and ``adapter``
    merged in (:func:`model.nn.diffusion.load_smollm2_diffusion`)."""
    f = open_gguf(source)
    tokenizer = Tokenizer(f.tokenizer_data())
    if isinstance(adapter, str | Path):
        adapter = load_adapter(adapter)
    settings = settings or served_options(adapter.manifest if adapter else None)
    model = load_smollm2_diffusion(f, adapter, getattr(torch, settings.dtype))
    backend = TorchBackend(model, max_len=settings.cache_len)
    return DiffusionGenerator(backend, tokenizer, smollm2_diffusion_config(tokenizer), settings)
