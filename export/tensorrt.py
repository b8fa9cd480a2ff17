"""TensorRT engine build for the exported fp16 step graph, where TensorRT exists.

Two routes, best first:

1. ONNX Runtime's TensorRT execution provider (``onnxruntime-gpu`` built with it): a
   session with the engine cache on builds the engine once and stores it in the model
   directory; :class:`export.runtime.OrtBackend` with ``device="tensorrt"`` reuses it.
2. The ``tensorrt`` Python package: parse the ONNX file and serialise a plan file.

Neither needs a rebuild of the ONNX file. Where neither exists (every CPU-only host,
including the development machines) :func:`build_engine` raises
:class:`TensorRTUnavailableError` with a message that says so plainly and what to
install; the int8 CPU and fp16 models are built without TensorRT.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import onnxruntime as ort

TRT_PROVIDER = "TensorrtExecutionProvider"
ENGINE_DIR = "tensorrt"
PLAN_FILE = "model.fp16.plan"


class TensorRTUnavailableError(RuntimeError):
    """Neither TensorRT route is installed on this host."""


def unavailable_reason() -> str | None:
    """None where a TensorRT engine can be built here; otherwise why not, in words."""
    providers = ort.get_available_providers()
    if TRT_PROVIDER in providers or importlib.util.find_spec("tensorrt") is not None:
        return None
    return (
        "TensorRT is not installed on this host: onnxruntime offers only "
        f"{', '.join(providers)} and the `tensorrt` Python package is missing. "
        "On an NVIDIA GPU host install the gpu extra (pip install 'quicksilver[gpu]', "
        "onnxruntime-gpu instead of onnxruntime) and TensorRT (pip install tensorrt), "
        "then rerun `quicksilver export --tensorrt`. The int8 CPU and fp16 models do "
        "not need it."
    )


def profile_shapes(
    n_layer: int, n_kv: int, head_dim: int, max_len: int, max_chunk: int = 512
) -> dict[str, dict[str, list[int]]]:
    """min / opt / max shapes of the dynamic inputs (one optimisation profile)."""
    kv = [n_layer, n_kv, head_dim]
    return {
        "input_ids": {"min": [1], "opt": [32], "max": [max_chunk]},
        "positions": {"min": [1], "opt": [32], "max": [max_chunk]},
        "past_keys": {"min": [0, *kv], "opt": [256, *kv], "max": [max_len, *kv]},
        "past_values": {"min": [0, *kv], "opt": [256, *kv], "max": [max_len, *kv]},
        "logit_rows": {"min": [1], "opt": [32], "max": [max_chunk]},
    }


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
    if TRT_PROVIDER in ort.get_available_providers():
        # Creating the session builds the engine and writes it to the cache directory.
        options = trt_provider_options(engine_dir, shapes)
        ort.InferenceSession(str(onnx_path), providers=[(TRT_PROVIDER, options)])
        return engine_dir
    return _build_plan(onnx_path, engine_dir / PLAN_FILE, shapes)


def _build_plan(onnx_path: Path, plan: Path, shapes: dict[str, dict[str, list[int]]]) -> Path:
    import tensorrt as trt  # only on GPU hosts

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"TensorRT could not parse {onnx_path}: {errors}")
    config = builder.create_builder_config()
    config.set_flag(trt.BuilderFlag.FP16)
    profile = builder.create_optimization_profile()
    for name, s in shapes.items():
        profile.set_shape(name, s["min"], s["opt"], s["max"])
    config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise RuntimeError(f"TensorRT failed to build an engine for {onnx_path}")
    plan.write_bytes(bytes(serialized))
    return plan
