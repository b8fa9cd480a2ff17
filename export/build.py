"""Build an exported model directory: ONNX fp32, int8 (CPU), fp16 (GPU), TensorRT.

Steps: load the PyTorch model (the offline SmolLM2 GGUF, with the trained adapter merged
when one is given), give its embedding the mask-token row (id = vocab size; the mean
embedding until an adapter replaces it),
export one step (:mod:`export.graph`) to ONNX, quantise and convert, check every file
against the PyTorch model (:mod:`export.parity`), and write the tokenizer and the
manifest (sizes, sha256, parity figures) last.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import onnxruntime as ort
import torch

from export.gptq import (
    Table,
    apply_table,
    calibration_ids,
    describe,
    product_keys,
    quantise_model,
    weight_keys,
)
from export.graph import (
    BatchGraph,
    StepGraph,
    batch_dynamic_axes,
    batch_example_inputs,
    batch_input_names,
    batch_output_names,
    dynamic_axes,
    example_inputs,
    input_names,
    output_names,
)
from export.parity import ParityReport, check_parity
from export.rows_graph import ALPHA, HEAD_WEIGHT, build_rows_graphs
from export.tensorrt import build_engine
from model.modeldir import (
    ATTENTION,
    BATCH_FILES,
    BATCH_ROWS,
    FILES,
    FORMAT_VERSION,
    GPTQ_SEQUENCES,
    MANIFEST,
    ROWS_BATCH_FILES,
    ROWS_FILES,
    TOKENIZER,
    WEIGHT_BITS,
    WIDE_PRODUCTS,
    Attention,
    Variant,
    default_model_dir,
    is_complete,
)
from model.nn.adapter import apply_adapter, load_adapter
from model.nn.diffusion import with_mask_row
from model.nn.gguf import GGUFFile, find_smollm2_gguf
from model.nn.llama import Llama
from model.runtime import OrtBackend
from model.tokenizer import Tokenizer, TokenizerData

log = logging.getLogger("quicksilver")
OPSET = 17
Int8Method = Literal["blockwise", "dynamic"]
INT8_METHODS: tuple[Int8Method, ...] = ("blockwise", "dynamic")
# Weights (and activations) per scale along K. Larger blocks run faster (128 on the v6
# graph: a one-token pass 0.87x, a 64-token prefill 0.80x) and keep the held-out bars
# under blocks of one, but the int8 kernel then rounds a row of a several-row product
# differently from the same row alone (1e-7), and a reply must get the same logits
# whichever replies share its pass (docs/results/2026-12-packed-graph.md)
INT8_BLOCK = 32
# A 4-bit file keeps the tied head (a fifth of the weights) at 8 bits, as SmolLM2's GGUF
# does (Q4_1 layers, a Q8_0 embedding): GPTQ's head was a sixth of the file's KL to the
# model (0.083 -> 0.070 held out), for 14 MB more a pass (docs/results/2026-12-four-bit-fidelity.md)
HEAD_BITS = 8


@dataclass(frozen=True)
class BuildOptions:
    adapter: Path | None = None
    int8: bool = True
    fp16: bool = False
    tensorrt: bool = False
    keep_fp32: bool = True  # the int8 file is made from it
    check: bool = True  # parity figures in the manifest
    check_prompts: int = 3  # greedy replies compared with PyTorch's, per format
    check_tokens: int = 32
    # "blockwise": int8 weights in blocks of 32 along K, and int8 activations with a
    # scale per row and block (MatMulNBits, accuracy level 4); "dynamic": ONNX
    # Runtime's quantize_dynamic, one activation scale per call (docs/export.md)
    int8_method: Int8Method = "blockwise"
    bits: int = WEIGHT_BITS  # blockwise only: 4 or 8 bits a weight (WEIGHT_BITS)
    gptq_sequences: int = GPTQ_SEQUENCES  # 4 bits only (GPTQ_SEQUENCES)
    # 4 bits only: the layer products kept at HEAD_BITS (model.modeldir.WIDE_PRODUCTS)
    wide_products: tuple[str, ...] = WIDE_PRODUCTS
    # replies per pass of the batched graph built beside the fp32 and int8 files
    # (model/batch.py); 0 or 1: none, every reply's steps run alone
    batch_rows: int = BATCH_ROWS
    per_channel: bool = False  # dynamic only: int8 weight scales per output channel
    # the rows graphs beside the blockwise int8 files (export/rows_graph.py): int8 per
    # row on ONNX Runtime's integer kernel, served where faster (docs/export.md)
    rows_graphs: bool = False


@dataclass
class Source:
    """The PyTorch model to export and where it came from."""

    model: Llama
    tokenizer: TokenizerData
    info: dict[str, Any]


def load_source(adapter: Path | None = None) -> Source:
    """The offline SmolLM2 (GGUF), with ``adapter`` merged when given."""
    path = find_smollm2_gguf()
    f = GGUFFile(path)
    config = f.llama_config()
    model = Llama.from_state_dict(config, f.state_dict(config))
    info: dict[str, Any] = {"gguf": path.name, "gguf_sha256": sha256(path), "adapter": None}
    if adapter is not None:
        model, info["adapter"] = merge_adapter(model, adapter)
    return Source(model, f.tokenizer_data(), info)


def merge_adapter(model: Llama, path: Path) -> tuple[Llama, dict[str, Any]]:
    """The trained LoRA + mask row merged into a copy with the extra embedding row."""
    adapter = load_adapter(path)
    merged = apply_adapter(with_mask_row(model), adapter)
    merged = merged if isinstance(merged, Llama) else model
    manifest = path / "manifest.json" if path.is_dir() else path.with_name("manifest.json")
    info = json.loads(manifest.read_text()) if manifest.is_file() else {"path": str(path)}
    return merged, info


def export_onnx(model: Llama, path: Path, attention: Attention = "fused") -> Path:
    """One step of ``model`` (its dtype: fp32 or fp16) as an ONNX graph."""
    graph = StepGraph(model, attention).eval()
    n_layer = model.config.n_layer
    with torch.no_grad(), warnings.catch_warnings():
        # The TorchScript exporter is deprecated in favour of dynamo; it traces this
        # graph in seconds, exactly, with the dynamic axes we name, and emits the fused
        # attention node from GroupQueryAttention.symbolic.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            graph,
            example_inputs(model),
            str(path),
            input_names=input_names(n_layer),
            output_names=output_names(n_layer),
            dynamic_axes=dynamic_axes(n_layer),
            opset_version=OPSET,
            custom_opsets={"com.microsoft": 1},
            dynamo=False,
        )
    return path


def export_batch_onnx(model: Llama, path: Path, rows: int, attention: Attention = "fused") -> Path:
    """``rows`` replies' steps of ``model`` in one pass (:class:`BatchGraph`)."""
    graph = BatchGraph(model, rows, attention).eval()
    n_layer = model.config.n_layer
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # as export_onnx
        torch.onnx.export(
            graph,
            batch_example_inputs(model, rows),
            str(path),
            input_names=batch_input_names(n_layer, rows),
            output_names=batch_output_names(n_layer, rows),
            dynamic_axes=batch_dynamic_axes(n_layer, rows),
            opset_version=OPSET,
            custom_opsets={"com.microsoft": 1},
            dynamo=False,
        )
    return path


def quantize_int8(
    src: Path,
    dst: Path,
    method: Int8Method = "blockwise",
    per_channel: bool = False,
    bits: int = WEIGHT_BITS,
    table: Table | None = None,
    head_bits: int | None = None,
    wide: Collection[str] = (),
) -> Path:
    """int8 weights for the CPU, by ``method`` (see :class:`BuildOptions`); 4-bit
    weights from ``table`` (GPTQ's) where given; ``head_bits``: the head's (the product
    that reads the embedding table, :func:`head_product`) and the products whose weights
    have the :func:`export.gptq.weight_key` in ``wide``, where not ``bits``.

    SmolLM2 has large activation outliers on a few positions. Dynamic quantisation puts
    one scale on a whole call's activations, so those outliers crush every other value:
    the served diffusion replies ended cleanly 0.90 of the time against PyTorch's 1.0.
    Blockwise scales keep each row's outliers to its own blocks (0.975; docs/export.md).
    """
    if method not in INT8_METHODS:
        raise ValueError(f"unknown int8 method {method!r}: use one of {INT8_METHODS}")
    if bits not in (4, 8):
        raise ValueError(f"blockwise weights have 4 or 8 bits, not {bits}")
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # the quantisers log hints and every node via root
    try:
        if method == "dynamic":
            from onnxruntime.quantization import QuantType, quantize_dynamic

            quantize_dynamic(src, dst, weight_type=QuantType.QInt8, per_channel=per_channel)
        else:
            _quantize_blockwise(src, dst, bits, table, head_bits, wide)
    finally:
        root.setLevel(level)
    return dst


def _quantize_blockwise(
    src: Path,
    dst: Path,
    bits: int,
    table: Table | None,
    head_bits: int | None,
    wide: Collection[str],
) -> None:
    import onnx

    for name in ("onnxruntime.quantization.matmul_nbits_quantizer", "onnx_ir"):
        logging.getLogger(name).setLevel(logging.WARNING)  # one INFO line per node
    model = onnx.load(str(src))
    keys = weight_keys(model) if table is not None or wide else {}  # before the quantiser's edits
    if head_bits not in (None, bits):  # the wide products first: the second pass leaves them
        widened = {head_product(model)} | _products_with(model, keys, wide)
        others = [n.name for n in model.graph.node if n.op_type == "MatMul"]
        model = _blockwise(model, head_bits, [n for n in others if n not in widened])
    model = _blockwise(model, bits)
    if table is not None:
        apply_table(model, keys, table, INT8_BLOCK)
    onnx.save(model, str(dst))


def _blockwise(model: Any, bits: int, exclude: list[str] | None = None) -> Any:
    """``model`` with its MatMuls (those not in ``exclude``) as MatMulNBits of ``bits``."""
    try:
        from onnxruntime.quantization.matmul_nbits_quantizer import (
            DefaultWeightOnlyQuantConfig,
            MatMulNBitsQuantizer,
        )
    except ImportError as exc:  # onnxruntime < 1.22, or its onnx_ir dependency missing
        raise RuntimeError(
            f"blockwise int8 needs onnxruntime >= 1.22 with onnx-ir ({exc}); "
            "reinstall the project, or export with --int8-method dynamic"
        ) from exc

    q = {"block_size": INT8_BLOCK, "is_symmetric": bits == 8, "accuracy_level": 4, "bits": bits}
    config = DefaultWeightOnlyQuantConfig(**q)
    quantizer = MatMulNBitsQuantizer(model, algo_config=config, nodes_to_exclude=exclude, **q)
    quantizer.process()
    return quantizer.model.model


def _products_with(model: Any, keys: dict[str, str], wide: Collection[str]) -> set[str]:
    """The MatMuls of ``model`` whose weights' keys (``keys``, by initializer) are in
    ``wide``; every key must be found, or the graph is not the model's."""
    found = {
        n.name: keys[n.input[1]]
        for n in model.graph.node
        if n.op_type == "MatMul" and keys.get(n.input[1]) in wide
    }
    if len(set(found.values())) != len(set(wide)):
        raise ValueError(
            f"{len(set(wide)) - len(set(found.values()))} of the products to "
            "keep at 8 bits are not in the graph"
        )
    return set(found)


def head_product(model: Any) -> str:
    """The name of the tied head's MatMul in an fp32 step graph: the one that reads the
    embedding table (:data:`export.rows_graph.HEAD_WEIGHT`)."""
    heads = [n.name for n in model.graph.node if n.op_type == "MatMul" and HEAD_WEIGHT in n.input]
    if len(heads) != 1:
        raise ValueError(f"{len(heads)} MatMuls read {HEAD_WEIGHT}: not a step graph's head")
    return str(heads[0])


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def build(out: Path, options: BuildOptions, source: Source | None = None) -> dict[str, Any]:
    """Write every requested format into ``out``; the manifest last. Returns it."""
    if options.rows_graphs and options.int8_method == "blockwise" and options.bits != 8:
        raise ValueError("the rows graphs are made from 8-bit weights: export with --bits 8")
    t0 = time.perf_counter()
    src = source or _timed("loading SmolLM2 from its GGUF", lambda: load_source(options.adapter))
    out.mkdir(parents=True, exist_ok=True)
    model = src.model.float().eval()
    built: dict[Variant, Path] = {}
    fp32 = _timed(
        "exporting the fp32 ONNX step graph", lambda: export_onnx(model, out / FILES["fp32"])
    )
    built["fp32"] = fp32
    tok = Tokenizer(src.tokenizer)
    table, gptq_info = _gptq(model, tok, options)
    wide = product_keys(model, wide_products(options))
    if options.int8:
        built["int8"] = _timed(
            f"quantising ({_int8_words(options)})",
            lambda: quantize_int8(
                fp32,
                out / FILES["int8"],
                options.int8_method,
                options.per_channel,
                options.bits,
                table,
                head_bits(options),
                wide,
            ),
        )
    if options.fp16:
        half = copy.deepcopy(model).half()
        built["fp16"] = _timed(
            "exporting fp16 (plain attention, for GPUs)",
            lambda: export_onnx(half, out / FILES["fp16"], ATTENTION["fp16"]),
        )
    batched = _batched(out, model, built, options, table, wide)
    rows: list[Path] = []
    if "int8" in built and options.int8_method == "blockwise" and options.rows_graphs:
        twin = batched.get("int8")
        rows = _timed(
            "quantising the rows graphs (int8 per row)",
            lambda: build_rows_graphs(
                fp32,
                built["int8"],
                out / ROWS_FILES["int8"],
                tok,
                None if twin is None else (twin, out / ROWS_BATCH_FILES["int8"]),
            ),
        )
    parity: dict[str, Any] = {}
    memo: dict[tuple[int, ...], list[int]] = {}  # PyTorch's replies, computed once
    if options.check:
        for variant, path in built.items():
            report = _timed(
                f"checking {variant} against PyTorch",
                lambda p=path: _check(model, p, tok, memo, options),
            )
            parity[variant] = report.as_dict() if report else {"skipped": "needs a GPU"}
    if not options.keep_fp32:
        fp32.unlink()
        del built["fp32"]
        if "fp32" in batched:
            batched.pop("fp32").unlink()
    tensorrt = _tensorrt(out, built, model, options)
    (out / TOKENIZER).write_text(json.dumps(dataclasses.asdict(src.tokenizer)))
    manifest = _manifest(out, built, model, src, parity, tensorrt, time.perf_counter() - t0)
    for variant, path in batched.items():
        manifest["files"][path.name] = {
            "variant": variant,
            "attention": ATTENTION[variant],
            "rows": options.batch_rows,
            "bytes": path.stat().st_size,
            "sha256": sha256(path),
        }
    if "int8" in built:
        recipe = _int8_recipe(options) | ({"gptq": gptq_info} if gptq_info else {})
        manifest["files"][FILES["int8"]]["quantisation"] = recipe
        if "int8" in batched:
            manifest["files"][BATCH_FILES["int8"]]["quantisation"] = recipe
    for path in rows:
        manifest["files"][path.name] = {
            "variant": "int8",
            "attention": ATTENTION["int8"],
            **({"rows": options.batch_rows} if path.name == ROWS_BATCH_FILES["int8"] else {}),
            "bytes": path.stat().st_size,
            "sha256": sha256(path),
            "quantisation": {"method": "rows", "bits": 8, "smooth_alpha": ALPHA},
        }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return manifest


def _batched(
    out: Path,
    model: Llama,
    built: dict[Variant, Path],
    options: BuildOptions,
    table: Table | None = None,
    wide: Collection[str] = (),
) -> dict[Variant, Path]:
    """The batched graph beside the fp32 file, and beside the int8 one quantised the
    same way (its rows' logits are the one-reply graph's: tests/export/test_batch.py)."""
    if options.batch_rows < 2:
        return {}
    rows = options.batch_rows
    fp32 = _timed(
        f"exporting the batched step graph ({rows} replies a pass)",
        lambda: export_batch_onnx(model, out / BATCH_FILES["fp32"], rows),
    )
    batched: dict[Variant, Path] = {"fp32": fp32}
    if "int8" in built:
        batched["int8"] = _timed(
            "quantising the batched graph to int8",
            lambda: quantize_int8(
                fp32,
                out / BATCH_FILES["int8"],
                options.int8_method,
                options.per_channel,
                options.bits,
                table,
                head_bits(options),
                wide,
            ),
        )
    if "fp16" in built:
        half = copy.deepcopy(model).half()
        batched["fp16"] = _timed(
            "exporting the batched fp16 graph (plain attention, for GPUs)",
            lambda: export_batch_onnx(half, out / BATCH_FILES["fp16"], rows, ATTENTION["fp16"]),
        )
    return batched


def _check(
    model: Llama,
    path: Path,
    tok: Tokenizer,
    memo: dict[tuple[int, ...], list[int]],
    options: BuildOptions,
) -> ParityReport | None:
    try:
        backend = OrtBackend(path, name=path.name)
    except Exception as exc:  # an fp16 graph some CPU builds cannot run
        log.warning("cannot run %s here (%s): parity not checked", path.name, exc)
        return None
    n, k = options.check_prompts, options.check_tokens
    if path.name == FILES["fp16"] and backend.providers == ["CPUExecutionProvider"]:
        n = 0  # fp16 is for GPUs; on a CPU compare logits only (minutes otherwise)
    return check_parity(model, backend, tok, n, k, memo)


def _tensorrt(out: Path, built: dict[Variant, Path], model: Llama, options: BuildOptions) -> Any:
    if not options.tensorrt:
        return None
    src = built.get("fp16")  # plain attention: the fused kernel has no TensorRT or CUDA form
    if src is None:
        raise RuntimeError("--tensorrt builds from the fp16 ONNX file (add --fp16)")
    cfg = model.config
    engine = build_engine(src, out, (cfg.n_layer, cfg.n_kv_head, cfg.head_dim))
    return str(engine.relative_to(out))


def _gptq(
    model: Llama, tok: Tokenizer, options: BuildOptions
) -> tuple[Table | None, dict[str, Any] | None]:
    """GPTQ's 4-bit weights (export/gptq.py) where the options ask for 4 bits, with
    what the manifest says of them; (None, None) otherwise."""
    if not (options.int8 and options.int8_method == "blockwise" and options.bits == 4):
        return None, None
    if options.gptq_sequences <= 0:
        return None, None
    t0 = time.perf_counter()
    seqs = calibration_ids(tok, options.gptq_sequences)
    table = _timed(
        f"choosing 4-bit weights with GPTQ ({len(seqs)} calibration sequences, "
        f"{sum(map(len, seqs))} tokens)",
        lambda: quantise_model(
            model, seqs, INT8_BLOCK, head=head_bits(options) is None, skip=wide_products(options)
        ),
    )
    return table, describe(table, seqs, time.perf_counter() - t0)


def head_bits(options: BuildOptions) -> int | None:
    """The head's bits where they are not the other weights' (:data:`HEAD_BITS`)."""
    blockwise_4 = options.int8_method == "blockwise" and options.bits == 4
    return HEAD_BITS if blockwise_4 else None


def wide_products(options: BuildOptions) -> tuple[str, ...]:
    """The layer products a file keeps at :func:`head_bits` (none where every weight has
    the same bits)."""
    return options.wide_products if head_bits(options) else ()


def _int8_words(options: BuildOptions) -> str:
    if options.int8_method == "dynamic":
        return "int8, dynamic"
    wide = ", ".join(("the head", *wide_products(options)))
    head = f" ({wide} {b}-bit)" if (b := head_bits(options)) else ""
    return f"{options.bits}-bit weights{head} in blocks of {INT8_BLOCK}, int8 activations"


def _int8_recipe(options: BuildOptions) -> dict[str, Any]:
    if options.int8_method == "dynamic":
        return {"method": "dynamic", "per_channel": options.per_channel}
    return {
        "method": "blockwise",
        "bits": options.bits,
        "symmetric": options.bits == 8,
        "block": INT8_BLOCK,
        "accuracy_level": 4,
    } | (
        {"head_bits": b, "wide_products": list(wide_products(options))}
        if (b := head_bits(options))
        else {}
    )


def _manifest(
    out: Path,
    built: dict[Variant, Path],
    model: Llama,
    src: Source,
    parity: dict[str, Any],
    tensorrt: Any,
    seconds: float,
) -> dict[str, Any]:
    cfg = model.config
    files = {
        p.name: {
            "variant": v,
            "attention": ATTENTION[v],
            "bytes": p.stat().st_size,
            "sha256": sha256(p),
        }
        for v, p in built.items()
    }
    files[TOKENIZER] = {
        "bytes": (out / TOKENIZER).stat().st_size,
        "sha256": sha256(out / TOKENIZER),
    }
    return {
        "format_version": FORMAT_VERSION,
        "graph": {
            "inputs": input_names(cfg.n_layer),
            "outputs": output_names(cfg.n_layer),
            "opset": OPSET,
        },
        "config": {
            "vocab_size": cfg.vocab_size,
            "mask_id": cfg.vocab_size,  # the extra embedding row
            "n_layer": cfg.n_layer,
            "n_embd": cfg.n_embd,
            "n_head": cfg.n_head,
            "n_kv_head": cfg.n_kv_head,
            "head_dim": cfg.head_dim,
            "ffn_hidden": cfg.ffn_hidden,
            "max_seq_len": cfg.max_seq_len,
        },
        "source": src.info,
        "files": files,
        "tensorrt": tensorrt,
        "parity": parity,
        "built_with": {"torch": torch.__version__, "onnxruntime": ort.__version__},
        "build_seconds": round(seconds, 1),
    }


def build_atomic(final: Path, options: BuildOptions, source: Source | None = None) -> Path:
    """Build under a temporary name next to ``final`` and rename it into place.

    Another process sees nothing or the complete directory; when two race, the first
    rename wins and the other discards its copy.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        build(tmp, options, source)
        if final.exists() and not _current(final):
            shutil.rmtree(final, ignore_errors=True)  # unfinished, or an older format
        with contextlib.suppress(OSError):  # lost the race: the winner's copy stays
            os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _current(model_dir: Path) -> bool:
    try:
        manifest = json.loads((model_dir / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return bool(manifest.get("format_version") == FORMAT_VERSION)


def _timed(what: str, fn: Any) -> Any:
    log.info("export: %s ...", what)
    t0 = time.perf_counter()
    value = fn()
    log.info("export: %s done in %.1f s", what, time.perf_counter() - t0)
    return value


def ensure_model_dir(
    cache_dir: Path | None = None, variant: Variant = "int8", adapter: Path | None = None
) -> Path:
    """The default model directory (with ``adapter`` merged, its own directory), built
    on first use (needs torch, about a minute).

    Later calls find it complete and return at once, without importing torch.
    """
    model_dir = default_model_dir(cache_dir, adapter)
    if is_complete(model_dir, variant):
        return model_dir
    log.info(
        "building the %s ONNX reply model into %s (first start only: exports SmolLM2 with "
        "PyTorch and quantises it; later starts load it without torch)",
        variant,
        model_dir,
    )
    t0 = time.perf_counter()
    # A light parity check (one reply) keeps the first start short; `quicksilver
    # export` checks more.
    options = BuildOptions(
        adapter=adapter,
        int8=variant == "int8",
        fp16=variant == "fp16",
        keep_fp32=False,
        check_prompts=1,
        check_tokens=16,
    )
    build_atomic(model_dir, options)
    log.info("built %s in %.0f s", model_dir, time.perf_counter() - t0)
    return model_dir
