"""TensorRT engine build for the exported fp16 step graph, where TensorRT exists.

The route is ONNX Runtime's TensorRT execution provider (``onnxruntime-gpu`` built with
it): a session with the engine cache on builds the engine once and stores it in the
model directory; :class:`model.runtime.OrtBackend` with ``device="tensorrt"`` reuses
it. The engine is built from the fp16 file, whose attention is standard operators
(``export/graph.py``, the "plain" form): the fused ``GroupQueryAttention`` of the CPU
files has no TensorRT form, and its CUDA kernel refuses the block pattern. Serving
goes through ONNX Runtime, whose IO binding keeps each reply's cache buffers in place;
a plan file built by the TensorRT API alone (format v3's second route) would need a
runtime of its own, so it is not offered.

Where the provider is missing (every CPU-only host, including the development
machines) :func:`build_engine` raises :class:`TensorRTUnavailableError` with a message
that says so plainly and what to install; the int8 CPU and fp16 models are built
without TensorRT.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import onnxruntime as ort

TRT_PROVIDER = "TensorrtExecutionProvider"
ENGINE_DIR = "tensorrt"


class TensorRTUnavailableError(RuntimeError):
    """Neither TensorRT route is installed on this host."""


def unavailable_reason() -> str | None:
    """None where a TensorRT engine can be built here; otherwise why not, in words."""
    providers = ort.get_available_providers()
    if TRT_PROVIDER in providers:
        return None
    offered = ", ".join(providers)
    if importlib.util.find_spec("tensorrt") is not None:
        head = (
            f"onnxruntime here has no TensorRT execution provider (it offers only {offered}); "
            "the `tensorrt` Python package is installed, but the engine is built and served "
            "through that provider (ONNX Runtime binds each reply's cache buffers in "
            "place), not as a plan file of its own. "
        )
    else:
        head = (
            f"TensorRT is not installed on this host: onnxruntime offers only {offered} "
            "and the `tensorrt` Python package is missing. "
        )
    return (
        head + "On an NVIDIA GPU host swap onnxruntime for onnxruntime-gpu, built with "
        "TensorRT (docs/export.md, On a GPU host), and install TensorRT "
        "(pip install tensorrt), then rerun `quicksilver export --tensorrt`. The int8 CPU "
        "and fp16 models do not need it."
    )


def profile_shapes(
    n_layer: int, n_kv: int, head_dim: int, max_len: int, max_chunk: int = 512
) -> dict[str, dict[str, list[int]]]:
    """min / opt / max shapes of the dynamic inputs (one optimisation profile): chunks
    of 1 to ``max_chunk`` tokens, cache buffers of 1 to ``max_len`` positions."""
    chunk = {"min": [1], "opt": [32], "max": [max_chunk]}
    shapes = {name: dict(chunk) for name in ("input_ids", "positions", "logit_rows")}
    buffer = {"min": [1, n_kv, 1, head_dim], "opt": [1, n_kv, 256, head_dim]}
    buffer["max"] = [1, n_kv, max_len, head_dim]
    for layer in range(n_layer):
        for kv in ("key", "value"):
            shapes[f"past_{kv}_{layer}"] = buffer
    return shapes


def trt_provider_options(
    cache_dir: Path, shapes: dict[str, dict[str, list[int]]]
) -> dict[str, Any]:
    """ONNX Runtime TensorRT EP options: fp16, engine cache in the model directory."""

    def fmt(which: str) -> str:
        return ",".join(f"{n}:{'x'.join(map(str, s[which]))}" for n, s in shapes.items())

    return {
        "trt_fp16_enable": True,
        "trt_engine_cache_enable": True,
        "trt_engine_cache_path": str(cache_dir),
        "trt_profile_min_shapes": fmt("min"),
        "trt_profile_opt_shapes": fmt("opt"),
        "trt_profile_max_shapes": fmt("max"),
    }


def build_engine(
    onnx_path: Path, out_dir: Path, dims: tuple[int, int, int], max_len: int = 2048
) -> Path:
    """Build the TensorRT engine for ``onnx_path`` into ``out_dir / "tensorrt"``.

    ``dims``: (n_layer, n_kv_head, head_dim) of the step graph's cache inputs.
    """
    if (reason := unavailable_reason()) is not None:
        raise TensorRTUnavailableError(reason)
    engine_dir = out_dir / ENGINE_DIR
    engine_dir.mkdir(parents=True, exist_ok=True)
    shapes = profile_shapes(*dims, max_len=max_len)
    # Creating the session builds the engine and writes it to the cache directory.
    options = trt_provider_options(engine_dir, shapes)
    ort.InferenceSession(str(onnx_path), providers=[(TRT_PROVIDER, options)])
    return engine_dir
