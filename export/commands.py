"""``quicksilver export``.

Export imports torch only when it runs, so registering it costs the server nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from model.assemble import (
    ONNX_ENGINES,
    EngineName,
    engine_adapter,
    engine_model_dir,
    serving_variant,
)
from model.modeldir import (
    BATCH_ROWS,
    GPTQ_SEQUENCES,
    PRODUCT_KINDS,
    WEIGHT_BITS,
    WIDE_PRODUCTS,
    default_model_dir,
    is_complete,
)
from model.runtime import Device


def prepare_model(
    engine: EngineName, cache_dir: Path | None, device: Device = "auto", adapter: Path | None = None
) -> None:
    """Build an ONNX engine's model directory on first use (PyTorch, about a minute):
    `quicksilver serve`'s first start, the benchmarks' default; later calls find it
    complete and never import torch."""
    if engine not in ONNX_ENGINES:
        return
    variant = serving_variant(engine, device)
    if not is_complete(engine_model_dir(engine, cache_dir, adapter), variant):
        from export.build import ensure_model_dir

        ensure_model_dir(cache_dir, variant, engine_adapter(engine, adapter))


def register(sub: Any) -> None:
    ex = sub.add_parser("export", help="export the reply model to ONNX (int8, fp16, TensorRT)")
    ex.add_argument(
        "--out",
        type=Path,
        default=None,
        help="model directory (default: in the cache, per adapter)",
    )
    ex.add_argument("--cache-dir", type=Path, default=None)
    ex.add_argument(
        "--adapter", type=Path, default=None, help="a trained adapter (quicksilver train) to merge"
    )
    ex.add_argument("--int8", action="store_true", help="int8 model for the CPU (default)")
    ex.add_argument("--fp16", action="store_true", help="fp16 model for the GPU")
    ex.add_argument("--tensorrt", action="store_true", help="TensorRT engine (GPU hosts)")
    ex.add_argument(
        "--int8-method",
        default="blockwise",
        choices=("blockwise", "dynamic"),
        help="blockwise scales (default) or ONNX Runtime's quantize_dynamic",
    )
    ex.add_argument(
        "--bits",
        type=int,
        default=None,
        choices=(4, 8),
        help=f"blockwise: bits a weight of the CPU file (4: a scale and zero point a block of "
        "32, as the GGUF's Q4_1, the head and --wide-products at 8; 8: a scale a block). "
        f"Activations are int8 either way (default {WEIGHT_BITS}; 8 with --rows-graphs)",
    )
    ex.add_argument(
        "--gptq-sequences",
        type=int,
        default=GPTQ_SEQUENCES,
        metavar="N",
        help=f"4 bits: the calibration sequences GPTQ chooses the weights on (default "
        f"{GPTQ_SEQUENCES}, from the adapters' training sets; 0: round each weight to its "
        "block's nearest level)",
    )
    ex.add_argument(
        "--wide-products",
        type=_products,
        default=",".join(WIDE_PRODUCTS),  # a string default goes through type
        metavar="KINDS",
        help="4 bits: the layer products kept at 8 bits with the head, comma-separated "
        f"from {','.join(PRODUCT_KINDS)}, or none (default {','.join(WIDE_PRODUCTS)}: the most "
        "KL back per byte, docs/export.md)",
    )
    ex.add_argument(
        "--per-channel", action="store_true", help="dynamic int8: weight scales per channel"
    )
    ex.add_argument(
        "--batch-rows",
        type=int,
        default=BATCH_ROWS,
        metavar="N",
        help=f"replies per pass of the batched graph (default {BATCH_ROWS}; 0: none)",
    )
    ex.add_argument(
        "--rows-graphs",
        action="store_true",
        help="the rows graphs beside the blockwise int8 files: int8 per row on ONNX "
        "Runtime's integer kernel, served where the host runs them faster (docs/export.md)",
    )
    ex.add_argument("--no-check", action="store_true", help="skip the parity checks")
    ex.set_defaults(run=run_export)


def _products(text: str) -> tuple[str, ...]:
    """``--wide-products``' value: kinds from PRODUCT_KINDS, comma-separated, or none."""
    kinds = tuple(k.strip() for k in text.split(",") if k.strip() and k.strip() != "none")
    if unknown := [k for k in kinds if k not in PRODUCT_KINDS]:
        raise argparse.ArgumentTypeError(
            f"no product {', '.join(unknown)}: choose from {','.join(PRODUCT_KINDS)} or none"
        )
    return kinds


def run_export(args: argparse.Namespace) -> int:
    from export.build import BuildOptions, build_atomic
    from export.tensorrt import TensorRTUnavailableError

    out: Path = args.out or default_model_dir(args.cache_dir, args.adapter)
    options = BuildOptions(
        adapter=args.adapter,
        int8=args.int8 or not (args.fp16 or args.tensorrt),
        fp16=args.fp16 or args.tensorrt,
        tensorrt=args.tensorrt,
        check=not args.no_check,
        int8_method=args.int8_method,
        bits=args.bits or (8 if args.rows_graphs else WEIGHT_BITS),  # rows graphs: 8-bit only
        gptq_sequences=args.gptq_sequences,
        wide_products=args.wide_products,
        per_channel=args.per_channel,
        batch_rows=args.batch_rows,
        rows_graphs=args.rows_graphs,
    )
    try:
        build_atomic(out.expanduser(), options)
    except (TensorRTUnavailableError, RuntimeError, FileNotFoundError, ValueError) as exc:
        print(f"quicksilver export: {exc}", file=sys.stderr)
        return 1
    manifest = json.loads((out / "manifest.json").read_text())
    print(f"exported to {out}")
    for name, f in manifest["files"].items():
        print(f"  {name:20s} {f['bytes'] / 1e6:8.1f} MB  sha256 {f['sha256'][:16]}")
    for variant, p in manifest["parity"].items():
        print(f"  parity {variant}: {json.dumps(p)}")
    return 0
