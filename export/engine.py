"""Reply engines on exported models: the serving path, with no torch.

"smollm2-ar-onnx" is :class:`model.ar.ARGenerator` (greedy decoding from
:mod:`model.generate`, the tokenizer and the ChatML prompt) on an
:class:`export.runtime.OrtBackend`: the same decoding code as the PyTorch "smollm2-ar"
engine, on the int8 ONNX model by default. "diffusion-onnx" is DIFFUSION's
:class:`model.diffusion_engine.DiffusionGenerator` on the same file (the mask row is
in it), so the two engines differ only in their decoder.
"""

from __future__ import annotations

from pathlib import Path

from export.modeldir import FILES, Variant, load_tokenizer, read_manifest
from export.runtime import OrtBackend, RuntimeConfig
from model.ar import ARGenerator, AROptions
from model.engine import TextGenerator

AR_ONNX = "smollm2-ar-onnx"
DIFFUSION_ONNX = "diffusion-onnx"


def load_onnx_backend(
    model_dir: Path, variant: Variant = "int8", config: RuntimeConfig | None = None
) -> OrtBackend:
    manifest = read_manifest(model_dir)
    name = FILES[variant]
    if name not in manifest["files"]:
        built = ", ".join(manifest["files"])
        raise FileNotFoundError(f"{model_dir} has no {variant} model ({name}); it has {built}")
    return OrtBackend(model_dir / name, config, name=f"onnx-{variant}")


def load_onnx_ar_generator(
    model_dir: Path,
    variant: Variant = "int8",
    config: RuntimeConfig | None = None,
    options: AROptions | None = None,
) -> ARGenerator:
    backend = load_onnx_backend(model_dir, variant, config)
    return ARGenerator(backend, load_tokenizer(model_dir), options or AROptions(), AR_ONNX)


def load_onnx_diffusion_generator(
    model_dir: Path, variant: Variant = "int8", config: RuntimeConfig | None = None
) -> TextGenerator:
    """DIFFUSION's generator (model/diffusion_engine.py) on the exported model."""
    from model.diffusion_engine import (
        DiffusionGenerator,
        DiffusionOptions,
        smollm2_diffusion_config,
    )

    options = DiffusionOptions()
    config = config or RuntimeConfig(max_len=options.cache_len)
    backend = load_onnx_backend(model_dir, variant, config)
    tok = load_tokenizer(model_dir)
    model = smollm2_diffusion_config(tok)
    return DiffusionGenerator(backend, tok, model, options, name=DIFFUSION_ONNX)
