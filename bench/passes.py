"""``quicksilver bench passes``: what one forward pass costs, by width and cache length.

A reply engine's speed is its passes times their cost: the AR engine runs one-token
passes, the diffusion engine block passes of 16 (docs/diffusion.md). This times one
uncommitted pass of T tokens (every row's logits when T > 1, as a block pass asks; the
last row for T = 1, as an AR step) against P cached positions, for each step graph
given, interleaved (on a shared VM the machine drifts within a minute, so every file is
timed in every stretch) and reports medians, in ms. ``ratio`` is each cost over the
same file's one-token pass at the same P: how many AR steps a block pass is worth.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from model.backend import Attend
from model.modeldir import default_model_dir, shipped_adapter
from model.runtime import OrtBackend, RuntimeConfig

WIDTHS = (1, 4, 8, 16, 32)
CACHED = (100, 1000)


def pass_timer(backend: OrtBackend, P: int, T: int, seed: int = 0) -> Callable[[], object]:
    """One uncommitted pass of T random tokens after a prefill of P: run it to time it."""
    rng = np.random.default_rng(seed)
    vocab = backend.vocab_size
    cache = backend.new_cache()
    cache.reserve(P + T)
    backend.step(cache, rng.integers(0, vocab, P), "causal", commit=True, rows=[P - 1])
    ids = rng.integers(0, vocab, T)
    attend: Attend = "block" if T > 1 else "causal"
    rows = list(range(T))
    return lambda: backend.step(cache, ids, attend, commit=False, rows=rows)


def time_passes(
    files: dict[str, Path],
    widths: tuple[int, ...] = WIDTHS,
    cached: tuple[int, ...] = CACHED,
    repeats: int = 25,
    threads: int = 0,
) -> list[dict[str, Any]]:
    """Median ms of each (file, P, T), the files interleaved pass by pass."""
    backends = {
        name: OrtBackend(path, RuntimeConfig(threads=threads, max_len=max(cached) + max(widths)))
        for name, path in files.items()
    }
    rows: list[dict[str, Any]] = []
    for P in cached:
        one: dict[str, float] = {}
        for T in widths:
            runs = {name: pass_timer(b, P, T) for name, b in backends.items()}
            for run in runs.values():  # warm-up: first-run allocations
                run()
            times: dict[str, list[float]] = {name: [] for name in runs}
            for _ in range(repeats):
                for name, run in runs.items():
                    t0 = time.perf_counter()
                    run()
                    times[name].append(time.perf_counter() - t0)
            for name, ts in times.items():
                ms = 1000 * statistics.median(ts)
                one.setdefault(name, ms)  # widths start at 1
                rows.append({"file": name, "P": P, "T": T, "ms": ms, "ratio": ms / one[name]})
    return rows


def print_passes(rows: list[dict[str, Any]]) -> None:
    files = list(dict.fromkeys(r["file"] for r in rows))
    print(f"{'P':>5s} {'T':>3s} " + " ".join(f"{f[:22]:>22s}" for f in files))
    keys = list(dict.fromkeys((r["P"], r["T"]) for r in rows))
    by = {(r["file"], r["P"], r["T"]): r for r in rows}
    for P, T in keys:
        cells = [by[(f, P, T)] for f in files]
        print(
            f"{P:5d} {T:3d} " + " ".join(f"{c['ms']:9.2f} ms ({c['ratio']:4.2f}x) " for c in cells)
        )
    print("median ms of one pass of T tokens against P cached; (x): over T = 1 at that P")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model-dir", type=Path, default=None, help="model directory (default: the served one)"
    )
    parser.add_argument(
        "--onnx",
        type=Path,
        action="append",
        default=[],
        help="another step graph to time beside it (repeatable), e.g. a quantisation variant",
    )
    parser.add_argument("--widths", type=int, nargs="+", default=list(WIDTHS))
    parser.add_argument("--cached", type=int, nargs="+", default=list(CACHED))
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument("--threads", type=int, default=0, help="0: ONNX Runtime's default")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")


def run_command(args: argparse.Namespace) -> int:
    model_dir = args.model_dir or default_model_dir(None, shipped_adapter())
    served = model_dir / "model.int8.onnx"
    paths = ([served] if served.is_file() or not args.onnx else []) + list(args.onnx)
    names = [p.name for p in paths]
    files = {
        (p.name if names.count(p.name) == 1 else f"{p.parent.name}/{p.name}"): p for p in paths
    }
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        print(
            f"quicksilver bench passes: no step graph at {', '.join(missing)} (build the "
            "served model with `quicksilver export --adapter model/adapters`, or name files "
            "with --onnx)",
            file=sys.stderr,
        )
        return 1
    if min(args.widths) != 1:
        args.widths = [1, *args.widths]  # the ratio's denominator
    rows = time_passes(
        files, tuple(sorted(set(args.widths))), tuple(args.cached), args.repeats, args.threads
    )
    print_passes(rows)
    if args.json is not None:
        named = {k: str(v) for k, v in files.items()}
        args.json.write_text(json.dumps({"files": named, "rows": rows}, indent=2))
        print(f"wrote {args.json}")
    return 0
