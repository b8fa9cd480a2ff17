"""``quicksilver bench replies``: many replies at once on the served reply engine.

N threads start together, as N sessions' replies would in ``quicksilver serve``
(server/runtime.py gives each reply its thread), and take the held-out questions from
one queue, a reply after another, until none is left. Each configuration runs twice in one process,
interleaved per level: with the model directory's batched graph (replies share passes,
``model/batch.py``) and one reply at a time (``--reply-batch 1``: serve then has one
reply thread, and the others wait for it), the same-run baseline.

Per level: aggregate reply tokens per second (every reply's tokens over the wall time,
and while all N had a reply in flight: :func:`steady_rate`, which the speedup over one
reply is taken from), first sentence p50/p95 (from the moment a reply is asked for,
queueing included: what a listener waits for), passes run and rows per pass.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from audio.speech import QUESTIONS
from bench.svg import Panel, panels_svg
from model.assemble import Batching, load_onnx_diffusion_generator, serving_variant
from model.backend import begin_reply, spoke
from model.batch import BatchedBackend
from model.diffusion_engine import DiffusionGenerator, DiffusionOptions
from model.engine import ChatMessage, GenerationStats
from model.modeldir import batch_file
from model.runtime import Device, RuntimeConfig
from model.tools import DEFAULT_TOOLS
from server.speech import SentenceSplitter


@dataclass(frozen=True)
class RepliesOptions:
    model_dir: Path
    levels: Sequence[int] = (1, 4, 8, 16)
    replies: int = 16  # replies per level (each thread answers levels' share)
    max_tokens: int = 64
    tools: bool = False  # the default device tools in every prompt (as serve's sessions)
    device: Device = "cpu"  # cuda / tensorrt: the fp16 files, as serve --device serves
    block_size: int | None = None  # the sampler's block width (None: the served one)


@dataclass
class _Reply:
    asked: float
    first: float | None = None
    tokens: int = 0
    ended: float = 0.0


def steady_rate(replies: Sequence[_Reply], start: float, full_until: float) -> float:
    """Tokens a second while every thread had a reply in flight (``start`` to
    ``full_until``, when the first thread found no question left): each reply's tokens
    spread evenly over its own time, counted where that time lies in the window. The
    ramp and the tail, where fewer replies are in flight, are not in it."""
    span = full_until - start
    if span <= 0:
        return 0.0
    tokens = 0.0
    for r in replies:
        took = r.ended - r.asked
        inside = min(r.ended, full_until) - max(r.asked, start)
        if took > 0 and inside > 0:
            tokens += r.tokens * inside / took
    return tokens / span


def _answer(
    gen: DiffusionGenerator, question: str, opts: RepliesOptions, alone: threading.Lock | None
) -> _Reply:
    r = _Reply(time.perf_counter())
    with alone or contextlib.nullcontext():  # one at a time: as serve's one reply thread
        return _answered(gen, question, opts, r)


def _answered(gen: DiffusionGenerator, question: str, opts: RepliesOptions, r: _Reply) -> _Reply:
    begin_reply()
    tools = DEFAULT_TOOLS if opts.tools else ()
    it = gen.generate([ChatMessage("user", question)], opts.max_tokens, lambda: False, tools)
    splitter = SentenceSplitter()  # the server's: a sentence is whole at its end mark
    while True:
        try:
            piece = next(it)
        except StopIteration as done:
            stats: GenerationStats = done.value
            break
        if r.first is None and isinstance(piece, str) and splitter.feed(piece):
            r.first = time.perf_counter() - r.asked
            spoke()
    r.tokens = stats.tokens
    r.ended = time.perf_counter()
    if r.first is None:  # nothing said: its end is its first sentence
        r.first = r.ended - r.asked
    return r


def run_level(gen: DiffusionGenerator, n: int, opts: RepliesOptions) -> dict[str, Any]:
    """``n`` threads at once take the questions from one queue (``opts.replies`` in
    all, at least ``n``) until none is left, so ``n`` replies are in flight until the
    queue is empty."""
    questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(max(opts.replies, n))]
    left = iter(questions)
    done: list[_Reply] = []
    lock = threading.Lock()
    start = threading.Barrier(n + 1)
    full_until: list[float] = []  # when the first thread found the queue empty
    backend = gen.backend
    loop = backend.loop if isinstance(backend, BatchedBackend) else None
    alone = None if loop is not None else threading.Lock()
    passes0, rows0 = (loop.passes, loop.rows_run) if loop else (0, 0)

    def work() -> None:
        start.wait()
        while True:
            with lock:
                q = next(left, None)
                if q is None:
                    full_until.append(time.perf_counter())
                    return
            gen.prefixes.forget_conversation()  # every reply a new session's (heads kept, as serve)
            r = _answer(gen, q, opts, alone)
            with lock:
                done.append(r)

    threads = [threading.Thread(target=work) for _ in range(n)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    first = [r.first for r in done if r.first is not None]
    tokens = sum(r.tokens for r in done)
    out: dict[str, Any] = {
        "concurrent": n,
        "replies": len(done),
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "steady_tokens_per_s": steady_rate(done, t0, min(full_until)),
        "first_sentence_p50_s": statistics.median(first),
        "first_sentence_p95_s": float(np.percentile(first, 95)),
    }
    if loop is not None:
        passes = loop.passes - passes0
        out["passes"] = passes
        out["rows_per_pass"] = (loop.rows_run - rows0) / max(passes, 1)
    return out


def run_replies_bench(opts: RepliesOptions) -> dict[str, Any]:
    variant = serving_variant("diffusion-onnx", opts.device)
    found = batch_file(opts.model_dir, variant)
    if found is None:
        raise FileNotFoundError(
            f"{opts.model_dir} has no batched {variant} graph: rebuild it with "
            f"`quicksilver export{' --fp16' if variant == 'fp16' else ''}`"
        )
    config = RuntimeConfig(device=opts.device, max_len=DiffusionOptions().cache_len)
    engines = {  # block_size None: the host's schedule, as served
        "batched": load_onnx_diffusion_generator(
            opts.model_dir, variant, config, Batching(found[1], block_size=opts.block_size)
        ),
        "one-at-a-time": load_onnx_diffusion_generator(
            opts.model_dir, variant, config, Batching(1, block_size=opts.block_size)
        ),
    }
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in engines}
    for n in opts.levels:
        for name, gen in engines.items():  # interleaved: the same machine state for both
            row = run_level(gen, n, opts)
            rows[name].append(row)
            print(_line(name, row), flush=True)
    for gen in engines.values():
        if isinstance(gen.backend, BatchedBackend):
            gen.backend.loop.close()
    one = {name: r[0] for name, r in rows.items() if r and r[0]["concurrent"] == 1}
    return {
        "model_dir": str(opts.model_dir),
        "variant": variant,
        "providers": engines["batched"].backend.loop.runner.session.get_providers()
        if isinstance(engines["batched"].backend, BatchedBackend)
        else [],
        "batch_rows": found[1],
        "max_tokens": opts.max_tokens,
        "tools": opts.tools,
        "block_size": engines["batched"].options.sampler.block_size,
        "levels": rows,
        # tokens a second while that many replies were in flight, over one reply's
        "speedup_vs_one_reply": {
            name: [r["steady_tokens_per_s"] / one[name]["steady_tokens_per_s"] for r in r_list]
            for name, r_list in rows.items()
            if name in one
        },
    }


def _line(name: str, row: dict[str, Any]) -> str:
    extra = f"  rows/pass {row['rows_per_pass']:.2f}" if "rows_per_pass" in row else ""
    return (
        f"{name:14s} {row['concurrent']:3d} at once: {row['tokens_per_s']:7.1f} tokens/s "
        f"({row['steady_tokens_per_s']:.1f} while all in flight), "
        f"first sentence p50 {row['first_sentence_p50_s']:.3f} s "
        f"p95 {row['first_sentence_p95_s']:.3f} s ({row['replies']} replies){extra}"
    )


def add_arguments(parser: Any) -> None:
    parser.add_argument(
        "--model-dir",
        type=Path,
        default=None,
        help="the served diffusion model's directory (default: the cache's)",
    )
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument(
        "--levels", type=int, nargs="+", default=[1, 4, 8, 16], help="replies at once"
    )
    parser.add_argument("--replies", type=int, default=16, help="replies per level")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--tools", action="store_true", help="the default tools in every prompt")
    parser.add_argument(
        "--block-size",
        type=int,
        default=None,
        help="the sampler's block width (default: the served one; 1 is next-token decoding "
        "of the same model)",
    )
    parser.add_argument(
        "--device",
        default="cpu",
        choices=("cpu", "cuda", "tensorrt"),
        help="where the reply model runs (cuda, tensorrt: the fp16 files)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument(
        "--plot", type=Path, default=None, help="draw first sentence and tokens/s here (SVG)"
    )


def run_command(args: Any) -> int:
    import json
    import sys

    from model.assemble import engine_model_dir
    from model.modeldir import is_complete

    model_dir = args.model_dir or engine_model_dir("diffusion-onnx", args.cache_dir)
    if not is_complete(model_dir, serving_variant("diffusion-onnx", args.device)):
        print(
            f"quicksilver bench replies: no served model in {model_dir}: `quicksilver serve` "
            "builds it on first start (or `quicksilver export --adapter model/adapters-tools`)",
            file=sys.stderr,
        )
        return 1
    if min(args.levels) < 1 or args.replies < 1:
        print("quicksilver bench replies: --levels and --replies need 1 or more", file=sys.stderr)
        return 1
    opts = RepliesOptions(
        model_dir,
        args.levels,
        args.replies,
        args.max_tokens,
        args.tools,
        args.device,
        args.block_size,
    )
    try:
        results = run_replies_bench(opts)
    except FileNotFoundError as exc:
        print(f"quicksilver bench replies: {exc}", file=sys.stderr)
        return 1
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
        print(f"wrote {args.json}")
    if args.plot is not None:
        args.plot.write_text(plot(results))
        print(f"wrote {args.plot}")
    return 0


def plot(results: dict[str, Any]) -> str:
    """The levels as two charts: first sentence p50 and p95, and tokens a second while
    all were in flight, against replies at once, each configuration a line."""
    first: dict[str, list[tuple[float, float]]] = {}
    rate: dict[str, list[tuple[float, float]]] = {}
    for name, rows in results["levels"].items():
        for q in ("p50", "p95"):
            first[f"{name} {q}"] = [(r["concurrent"], r[f"first_sentence_{q}_s"]) for r in rows]
        rate[name] = [(r["concurrent"], r["steady_tokens_per_s"]) for r in rows]
    return panels_svg(
        [
            Panel("First sentence", "replies at once", "seconds", first),
            Panel("Reply tokens a second", "replies at once", "tokens/s", rate),
        ]
    )
