"""The exported model directory: its file names, its manifest, and where it is cached.

A model directory holds the step graph in each built format, the tokenizer, and
``manifest.json`` (sizes, sha256, parity figures). The manifest is written last, and
directories are built under a temporary name and renamed into place, so a directory
with a manifest is complete. Reading one needs no torch; building one does
(:func:`export.build.ensure_model_dir`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from model.tokenizer import Tokenizer, TokenizerData

Variant = Literal["fp32", "int8", "fp16"]
FILES: dict[Variant, str] = {
    "fp32": "model.onnx",
    "int8": "model.int8.onnx",
    "fp16": "model.fp16.onnx",
}
# The attention form of each file (export/graph.py): the CPU files read the cache with
# ONNX Runtime's fused kernel, the GPU file with standard operators its CUDA and
# TensorRT providers run. A cached fp16 file of the fused form is rebuilt.
Attention = Literal["fused", "plain"]
ATTENTION: dict[Variant, Attention] = {
    "fp32": "fused",
    "int8": "fused",
    "fp16": "plain",
}
# The batched graph of each file (export.graph.BatchGraph): BATCH_ROWS replies' steps in
# one pass, in the attention form of the file it sits beside.
BATCH_FILES: dict[Variant, str] = {
    "fp32": "model.batch.onnx",
    "int8": "model.int8.batch.onnx",
    "fp16": "model.fp16.batch.onnx",
}
BATCH_ROWS = 8
# The rows graphs beside the int8 files, when built (``quicksilver export --rows-graphs``;
# export/rows_graph.py): the one-reply and the batched graph with their layer products
# quantised per row for ONNX Runtime's integer kernel; a host serves them or the
# blockwise files, whichever it runs faster (model/schedule.py, host_kernel)
ROWS_FILES: dict[Variant, str] = {"int8": "model.int8.rows.onnx"}
ROWS_BATCH_FILES: dict[Variant, str] = {"int8": "model.int8.rows.batch.onnx"}
MANIFEST = "manifest.json"
TOKENIZER = "tokenizer.json"
# Bump when the graph's inputs or outputs or a file's format change: cached
# directories are rebuilt. 2: blockwise int8 (export/build.py); 3: a ``positions`` input
# (export/graph.py), for an in-block cache since removed; 4: per-layer cache buffers
# written in place by a fused GroupQueryAttention; 5: a batched graph beside the
# one-reply graph (several replies' steps in one pass, model/batch.py); 6: q, k and v in
# one weight product, RoPE inside the fused attention node, the gate and up projections
# in one product (the CPU graphs: a one-token pass 0.8x v5's); 7: a batched row with no
# step has no tokens (its products cost nothing; it was one token a row); 8: the int8
# files' weights 4-bit by default, the head, q/k/v and down at 8 bits (WEIGHT_BITS).
FORMAT_VERSION = 8
# Bits of a weight in the CPU file's blockwise products (``quicksilver export --bits``).
# 4 (served): asymmetric, a scale and a zero point a block of 32 (the GGUF's Q4_1
# layout), the codes chosen by GPTQ; the tied head and WIDE_PRODUCTS stay 8-bit
# (export.build.HEAD_BITS). A one-token pass is memory-bound and reads ~3/4 of 8 bits'
# bytes: bench llm's served row 1.51x / 1.55x llama.cpp's tokens/s against 1.25x /
# 1.36x, first sentence 0.50x / 0.49x against 0.66x / 0.56x on the AMD EPYC, with the
# held-out bars met (clean ends 1.0 under the tools prompt; 8 bits 0.975). 8: symmetric,
# a scale a block; the rows graphs' weights (docs/results/2026-12-mixed-bits.md).
WEIGHT_BITS = 4
# 4 bits: the calibration sequences GPTQ chooses the weights on (export/gptq.py); 0: each
# weight rounded to its block's nearest level
GPTQ_SEQUENCES = 128
# A layer's weight products as the export packs them (export.gptq.PRODUCTS), and those a
# 4-bit file keeps at 8 bits with its head, as llama.cpp's Q4_K_M keeps its most
# sensitive ones wider: q/k/v (16% of a layer's weights) and down (25%) bring the most KL
# to the model back per byte (held out, 0.067 -> 0.029 with both; o 0.063, gate/up 0.042
# for half the weights; docs/results/2026-12-mixed-bits.md)
PRODUCT_KINDS: tuple[str, ...] = ("qkv", "o", "gate_up", "down")
WIDE_PRODUCTS: tuple[str, ...] = ("qkv", "down")
DEFAULT_NAME = f"smollm2-135m-instruct-onnx-v{FORMAT_VERSION}"


# The trained block-diffusion adapters shipped with the package (docs/training.md):
# package data of ``model`` (pyproject.toml), so a wheel install has them too. The
# served one is trained to call tools as well as to speak (docs/actions.md); the chat
# adapter it was continued from (``--adapter model/adapters``) only speaks.
SHIPPED_ADAPTER = Path(__file__).resolve().parent / "adapters-tools"
CHAT_ADAPTER = SHIPPED_ADAPTER.with_name("adapters")


def adapter_calls_tools(manifest: Mapping[str, Any] | None) -> bool:
    """An adapter manifest (``adapter.manifest``, or a model directory's
    ``source.adapter``) says it was trained on tool calls (``quicksilver data --actions``)."""
    data = (manifest or {}).get("data", {})
    return "--actions" in str(data.get("command", "")) if isinstance(data, dict) else False


def shipped_adapter() -> Path | None:
    """``model/adapters-tools/`` when the installation holds the served adapter."""
    return SHIPPED_ADAPTER if (SHIPPED_ADAPTER / "manifest.json").is_file() else None


def default_cache_dir() -> Path:
    return Path("~/.cache/quicksilver").expanduser()


def default_model_dir(cache_dir: Path | None = None, adapter: Path | None = None) -> Path:
    """``<cache>/models/smollm2-135m-instruct-onnx-v6``: the serving default's home; with
    an adapter, a directory named after the adapter's weights (a retrained adapter is
    built afresh, never mistaken for an older one)."""
    root = cache_dir.expanduser() if cache_dir is not None else default_cache_dir()
    return root / "models" / (adapter_model_name(adapter) if adapter else DEFAULT_NAME)


def adapter_model_name(adapter: Path) -> str:
    weights = adapter / "adapter.safetensors"
    if not weights.is_file():
        raise FileNotFoundError(f"{adapter} holds no adapter.safetensors (`quicksilver train`)")
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()[:12]
    return f"smollm2-135m-diffusion-{digest}-onnx-v{FORMAT_VERSION}"


def read_manifest(model_dir: Path) -> dict[str, Any]:
    path = model_dir / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(
            f"{model_dir} is not an exported model directory (no {MANIFEST}); "
            "build one with `quicksilver export --out DIR`"
        )
    manifest: dict[str, Any] = json.loads(path.read_text())
    return manifest


def is_complete(model_dir: Path, variant: Variant = "int8") -> bool:
    try:
        manifest = read_manifest(model_dir)
    except (FileNotFoundError, json.JSONDecodeError):
        return False
    name = FILES[variant]
    entry = manifest.get("files", {}).get(name)
    return (
        manifest.get("format_version") == FORMAT_VERSION
        and entry is not None
        and entry.get("attention", "fused") == ATTENTION[variant]
        and (model_dir / name).is_file()
    )


def _built(model_dir: Path, name: str | None) -> dict[str, Any] | None:
    """The manifest's entry of the file ``name`` in ``model_dir``, when it was built."""
    entry = read_manifest(model_dir).get("files", {}).get(name) if name else None
    if name is None or entry is None or not (model_dir / name).is_file():
        return None
    return dict(entry)


def batch_file(model_dir: Path, variant: Variant, rows: bool = False) -> tuple[Path, int] | None:
    """The batched graph of ``variant`` in ``model_dir`` and its rows, when built;
    ``rows``: the rows graphs' (:data:`ROWS_BATCH_FILES`)."""
    name = (ROWS_BATCH_FILES if rows else BATCH_FILES).get(variant)
    entry = _built(model_dir, name)
    return None if entry is None or name is None else (model_dir / name, int(entry["rows"]))


def rows_file(model_dir: Path, variant: Variant) -> Path | None:
    """The one-reply rows graph of ``variant`` in ``model_dir``, when built."""
    name = ROWS_FILES.get(variant)
    return None if name is None or _built(model_dir, name) is None else model_dir / name


def load_tokenizer(model_dir: Path) -> Tokenizer:
    data = json.loads((model_dir / TOKENIZER).read_text())
    return Tokenizer(TokenizerData(**data))
