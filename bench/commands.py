"""``quicksilver bench llm``, ``bench loop``, ``bench passes`` and ``bench replies``.

Each benchmark's heavy imports (torch for the PyTorch reference column, the server's
client for the loop) wait until it runs or registers, so registering them costs
``quicksilver serve`` nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    llm = bench_sub.add_parser("llm", help="autoregressive vs diffusion reply engines")
    llm.add_argument("--json", type=Path, default=None, help="write the results here")
    llm.add_argument(
        "--model-dir",
        type=Path,
        default=None,
        help="exported model directory (default: the one `quicksilver serve` serves, built "
        "on first use as serve builds it)",
    )
    llm.add_argument("--cache-dir", type=Path, default=None)
    llm.add_argument(
        "--prompts", type=_at_least_one, default=20, help="how many of the fixed questions"
    )
    llm.add_argument("--budgets", type=int, nargs="+", default=[32, 64])
    llm.add_argument("--no-torch", action="store_true", help="skip the PyTorch reference")
    llm.add_argument(
        "--torch-prompts",
        type=int,
        default=None,
        help="prompts for the PyTorch reference (0: none, as --no-torch)",
    )
    llm.add_argument(
        "--rounds",
        type=_at_least_one,
        default=1,
        help="answer every prompt this many times per ONNX engine (interleaved; the "
        "speedup of each round is printed)",
    )
    llm.add_argument(
        "--llama-cpp",
        default="auto",
        metavar="auto|off|PYTHON",
        help="llama.cpp on the same GGUF beside the ONNX engines: auto (when "
        "$QUICKSILVER_LLAMA_CPP_PYTHON is set or llama_cpp imports here), off, or the "
        "path of a Python that has llama-cpp-python (docs/export.md)",
    )
    llm.add_argument(
        "--system-cached",
        action="store_true",
        help="every engine keeps the system prompt's cache between replies, as serve "
        "(its heads) and llama.cpp's server (its prompt cache) run: a reply prefills only "
        "its own message (default: every reply prefills its whole prompt)",
    )
    llm.set_defaults(run=run_bench)
    llm.add_argument("--log-level", default="INFO")
    register_bench_loop(bench_sub)
    register_bench_passes(bench_sub)
    register_bench_replies(bench_sub)


def register_bench_loop(bench_sub: Any) -> None:
    """``quicksilver bench loop``: WAVs through a real server, as a user hears it."""
    from bench import loop

    _register_module(bench_sub, "loop", "end of speech -> first reply audio, per turn", loop)


def register_bench_passes(bench_sub: Any) -> None:
    """``quicksilver bench passes``: one forward pass's cost by width and cache length."""
    from bench import passes

    help = "cost of one forward pass: 1-32 tokens x 100/1000 cached, per step graph"
    _register_module(bench_sub, "passes", help, passes)


def register_bench_replies(bench_sub: Any) -> None:
    """``quicksilver bench replies``: many replies at once, sharing passes or not."""
    from bench import replies

    help = "1-16 replies at once: tokens/s and first sentence, batched and one at a time"
    _register_module(bench_sub, "replies", help, replies)


def _register_module(bench_sub: Any, name: str, help: str, module: Any) -> None:
    """A bench command whose module has ``add_arguments(parser)`` and ``run_command``."""
    parser = bench_sub.add_parser(
        name, help=help, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    module.add_arguments(parser)
    parser.set_defaults(run=module.run_command)


def _at_least_one(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"needs 1 or more, got {n}")
    return n


def served_model_dir(cache_dir: Path | None) -> Path:
    """The model directory of what `quicksilver serve` serves by default (the diffusion
    engine with the shipped adapter), built on first use as serve builds it: the bench's
    "served" row must time those weights, not the base model's."""
    from export.commands import prepare_model
    from model.assemble import DEFAULT_ENGINE, engine_model_dir

    prepare_model(DEFAULT_ENGINE, cache_dir, "cpu")  # the int8 files the bench times
    return engine_model_dir(DEFAULT_ENGINE, cache_dir)


def run_bench(args: argparse.Namespace) -> int:
    from bench.llamacpp import LlamaCppError
    from bench.llm import BenchOptions, print_table, run_llm_bench

    options = BenchOptions(
        model_dir=args.model_dir or served_model_dir(args.cache_dir),
        prompts=args.prompts,
        budgets=tuple(args.budgets),
        torch_reference=not args.no_torch and args.torch_prompts != 0,
        torch_prompts=args.torch_prompts,
        rounds=args.rounds,
        llama_cpp=args.llama_cpp,
        system_cached=args.system_cached,
    )
    try:
        results = run_llm_bench(options)
    except (LlamaCppError, FileNotFoundError) as exc:
        print(f"quicksilver bench llm: {exc}", file=sys.stderr)
        return 1
    print_table(results)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
        print(f"wrote {args.json}")
    return 0
