"""``quicksilver bench llm``: the autoregressive baseline against the diffusion engine.

One run, one machine, the same weights (one exported model directory), the same
runtime (ONNX Runtime, int8) and the same prompts (:data:`export.prompts.QUESTIONS`),
for each reply budget: time to the complete reply (p50, p95), tokens per second,
forward passes per reply. PyTorch eager (fp32) timings of the same decoders sit beside
them for reference. ``speedup`` is diffusion tokens/s over autoregressive tokens/s at
the largest budget (64).

The floor is a roofline: every forward pass (a chunk of T tokens against P cached
positions) is counted in FLOPs (:func:`step_flops`) and in bytes it must read
(:func:`step_bytes`: every weight once, the KV cache), and takes at least the longer of
FLOPs / peak rate and bytes / bandwidth. Both rates are measured in the same run with
the served kernel: a big int8 matrix product and an int8 matrix-vector product over
more weights than the caches hold, in ONNX Runtime (fp32 in PyTorch for its column).
An autoregressive step reads all 135 M weights for one token, so it is bound by memory;
a 16-token block pass does 16x the work on the same bytes.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import statistics
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from bench.llamacpp import LLAMA_PYTHON_ENV, LlamaCppWorker, llama_cpp_python
from export.prompts import QUESTIONS
from model.assemble import DEFAULT_ENGINE, engine_model_dir, load_onnx_backend
from model.backend import Attend, Prefix, Rows, StepBackend
from model.chat import build_prompt, system_head
from model.diffusion_engine import DiffusionOptions, served_options, smollm2_diffusion_config
from model.engine import ChatMessage, GenerationStats, drain
from model.generate import greedy
from model.modeldir import PRODUCT_KINDS, is_complete, load_tokenizer
from model.prefix import PrefixCache
from model.runtime import RuntimeConfig
from model.sampler import SENTENCE_BREAK, sample
from model.schedule import NARROW, WIDE, host_schedule, sampler_for
from model.tokenizer import Tokenizer
from server.speech import SentenceSplitter

log = logging.getLogger("quicksilver")
LLAMA_ENGINE = "llama.cpp"
LLAMA_RUNTIME = "gguf"


@dataclass(frozen=True)
class BenchOptions:
    model_dir: Path
    prompts: int = 20
    budgets: tuple[int, ...] = (32, 64)
    torch_reference: bool = True
    torch_prompts: int | None = None  # fewer prompts for the slow PyTorch column
    variant: str = "int8"
    rounds: int = 1  # every prompt this many times per engine (ONNX Runtime), interleaved
    # llama.cpp on the same GGUF beside the ONNX Runtime engines (bench/llamacpp.py):
    # "auto" (when a Python with llama_cpp is found), "off", or that Python's path
    llama_cpp: str = "auto"
    # every engine keeps the system prompt's cache between replies, as serve keeps its
    # heads (model/prefix.py) and llama.cpp's server its prompt cache: a reply prefills
    # only its own message; off, every reply prefills its whole prompt
    system_cached: bool = False


@dataclass(frozen=True)
class Dims:
    n_layer: int
    n_embd: int
    n_head: int
    n_kv_head: int
    head_dim: int
    ffn_hidden: int
    vocab_size: int


def step_flops(d: Dims, T: int, P: int, K: int) -> float:
    """Multiply-adds x 2 of one step: T new tokens, P cached, K logit rows.

    Per layer: q, o (C x C), k, v (C x n_kv*hd), the SwiGLU MLP (3 x C x F), and
    attention scores plus weighted values (2 x n_head x hd x T x (P+T)); then the head
    (C x V) for K rows. Norms, RoPE and softmax are left out (under 1%).
    """
    C, kv = d.n_embd, d.n_kv_head * d.head_dim
    linear = C * C * 2 + 2 * C * kv + 3 * C * d.ffn_hidden
    attention = 2 * d.n_head * d.head_dim * (P + T)
    return 2.0 * (d.n_layer * T * (linear + attention) + K * C * d.vocab_size)


def step_bytes(d: Dims, T: int, P: int, weight_bytes: float, kv_bytes: int) -> float:
    """Bytes one step must move at least: every projection and head weight once (at
    ``weight_bytes`` each, scales included), the P cached keys and values read, the T
    new ones written, and T embedding rows (fp32)."""
    C, kv = d.n_embd, d.n_kv_head * d.head_dim
    cache = 2 * d.n_layer * kv * (P + T) * kv_bytes
    return n_weights(d) * weight_bytes + cache + T * C * 4


def n_weights(d: Dims) -> int:
    """The weights a step reads: every layer's products and the (tied) head."""
    layer = sum(product_weights(d, kind) for kind in PRODUCT_KINDS)
    return d.n_layer * layer + d.n_embd * d.vocab_size


@dataclass(frozen=True)
class Roofline:
    """One runtime's measured peak rates and the storage of its weights and cache."""

    flops: float  # FLOP/s of a big matrix product
    bandwidth: float  # bytes/s streaming weights through a matrix-vector product
    weight_bytes: float  # bytes per weight in the timed model, scales included
    kv_bytes: int = 4  # bytes per cached key or value element

    def step_s(self, d: Dims, T: int, P: int, K: int) -> tuple[float, float]:
        """(compute, memory) seconds of one step at peak."""
        return step_flops(d, T, P, K) / self.flops, (
            step_bytes(d, T, P, self.weight_bytes, self.kv_bytes) / self.bandwidth
        )


class CountingBackend:
    """A StepBackend proxy that records each step's (T, P, K) for the FLOP count."""

    def __init__(self, inner: StepBackend) -> None:
        self.inner = inner
        self.name, self.vocab_size, self.max_len = inner.name, inner.vocab_size, inner.max_len
        self.steps: list[tuple[int, int, int]] = []

    def new_cache(self) -> Any:
        return self.inner.new_cache()

    def cache_length(self, cache: Any) -> int:
        return self.inner.cache_length(cache)

    def truncate(self, cache: Any, length: int) -> None:
        self.inner.truncate(cache, length)

    def step(
        self,
        cache: Any,
        ids: NDArray[np.int64],
        attend: Attend,
        commit: bool,
        rows: Rows = None,
    ) -> NDArray[np.float32]:
        T = len(ids)
        self.steps.append((T, self.inner.cache_length(cache), T if rows is None else len(rows)))
        return self.inner.step(cache, ids, attend, commit, rows)


Decoder = Callable[[StepBackend, list[int], int], Generator[int, None, GenerationStats]]


class KeptHead:
    """The system prompt kept as serve keeps it: a :class:`model.prefix.PrefixCache` per
    backend, its head primed once (outside the timed replies, as serve primes its heads
    at start), each reply's cache a copy of it that the pool hands out (``take``): the
    reply prefills only its own message. A backend that cannot copy a cache (PyTorch's)
    keeps no head, and each prompt is prefilled whole."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids
        self._kept: dict[int, PrefixCache] = {}  # by backend

    def prefix(self, b: StepBackend, prompt: list[int]) -> Prefix:
        inner = b.inner if isinstance(b, CountingBackend) else b  # the head is not timed
        if (kept := self._kept.get(id(inner))) is None:
            kept = self._kept[id(inner)] = PrefixCache(inner, capacity=0, heads=1)
            kept.prime(self.ids)
        return kept.take(prompt)


# The diffusion engine's rows: blocks of 16 ("diffusion") and of one position
# ("diffusion-b1", next-token decoding of the same model); serve takes the host's
# (model/schedule.py)
DIFFUSION_ROWS = {WIDE: "diffusion", NARROW: "diffusion-b1"}


def served_row(engine: str, block_size: int) -> str:
    """The row of what `quicksilver serve --engine engine` serves on this host."""
    return "ar" if engine == "smollm2-ar-onnx" else DIFFUSION_ROWS[block_size]


def ar_decoder(tok: Tokenizer, head: KeptHead | None = None) -> Decoder:
    def run(b: StepBackend, prompt: list[int], n: int) -> Generator[int, None, GenerationStats]:
        prefix = head.prefix(b, prompt) if head else None
        return greedy(b, prompt, n, tok.stop_ids, prefix=prefix)

    return run


def diffusion_decoder(
    tok: Tokenizer,
    block_size: int | None = None,
    after_sentence: bool = False,
    head: KeptHead | None = None,
) -> Decoder:
    """The diffusion sampler with its engine's default settings, seed 0 for every reply:
    in blocks of ``block_size``, ending replies as that schedule does; with
    ``after_sentence`` only after a sentence's end (as the engine decodes an adapter
    trained on tool calls); with ``head``, the system prompt's cache kept."""
    settings = DiffusionOptions().sampler
    settings = sampler_for(settings, block_size or settings.block_size)
    settings = dataclasses.replace(settings, ends_after_sentence=after_sentence)
    config = smollm2_diffusion_config(tok)

    def run(b: StepBackend, prompt: list[int], n: int) -> Generator[int, None, GenerationStats]:
        prefix = head.prefix(b, prompt) if head else None
        rng = np.random.default_rng(0)
        return sample(b, prompt, config, settings, rng, n, prefix=prefix, breaks=True)

    return run


@dataclass
class _Tally:
    """One engine's replies so far: times, sizes and the roofline floor of its passes."""

    times: list[float] = dataclasses.field(default_factory=list)
    tokens: list[int] = dataclasses.field(default_factory=list)
    passes: list[int] = dataclasses.field(default_factory=list)
    compute: float = 0.0
    memory: float = 0.0
    floor: float = 0.0
    replies: list[list[int]] = dataclasses.field(default_factory=list)
    first: list[float] = dataclasses.field(default_factory=list)  # to the first sentence

    def reply(
        self,
        counter: CountingBackend,
        decode: Decoder,
        prompt: list[int],
        budget: int,
        roof: Roofline,
        dims: Dims,
        first_sentence: Callable[[list[int]], int],
    ) -> None:
        counter.steps.clear()
        out: list[int] = []
        at: list[float] = []  # when each token came out
        breaks: dict[int, float] = {}  # tokens out -> when a sentence break followed them
        tokens = decode(counter, prompt, budget)
        t0 = time.perf_counter()
        while True:
            try:
                token = next(tokens)
            except StopIteration as done:
                stats: GenerationStats = done.value
                break
            if token == SENTENCE_BREAK:
                breaks[len(out)] = time.perf_counter() - t0
                continue
            out.append(token)
            at.append(time.perf_counter() - t0)
        self.times.append(time.perf_counter() - t0)
        k = first_sentence(out)  # the voice loop speaks it once it has k tokens,
        # or its k - 1 and the break that says the k-th starts the next sentence
        first = at[k - 1] if k < len(out) else self.times[-1]
        self.first.append(min(first, breaks.get(k - 1, first)))
        self.tokens.append(stats.tokens)
        self.passes.append(stats.forward_passes)
        for step in counter.steps:
            c, m = roof.step_s(dims, *step)
            self.compute, self.memory = self.compute + c, self.memory + m
            self.floor += max(c, m)
        self.replies.append(out)

    def summary(self) -> dict[str, Any]:
        total, n = sum(self.times), len(self.times)
        return {
            "replies": n,
            "p50_s": statistics.median(self.times),
            "p95_s": float(np.percentile(self.times, 95)),
            "mean_s": total / n,
            # what a listener waits for: the reply's first sentence (model.engine's
            # SentenceSplitter: its end mark and the space after it), or the whole reply
            "first_sentence_p50_s": statistics.median(self.first),
            "first_sentence_p95_s": float(np.percentile(self.first, 95)),
            "tokens_per_s": sum(self.tokens) / total,
            "tokens_per_reply": sum(self.tokens) / n,
            "passes_per_reply": sum(self.passes) / n,
            "floor_compute_s_per_reply": self.compute / n,
            "floor_memory_s_per_reply": self.memory / n,
            "floor_s_per_reply": self.floor / n,  # the roofline: the longer of the two per pass
            "fraction_of_peak": self.compute / total,
            "fraction_of_floor": self.floor / total,
            "_replies": self.replies,
        }


def first_sentence_tokens(tok: Tokenizer) -> Callable[[list[int]], int]:
    """How many of a reply's tokens the voice loop needs before it can synthesize the
    first sentence (the server's decoder and splitter); the length of the reply when it
    is one sentence, which is released at the end."""

    def count(ids: list[int]) -> int:
        decoder, splitter = tok.stream_decoder(), SentenceSplitter()
        for k, token in enumerate(ids, 1):
            if splitter.feed(decoder.push(token)):
                return k
        return len(ids)

    return count


def time_engines(
    backend: StepBackend,
    decoders: dict[str, Decoder],
    prompts: list[list[int]],
    budget: int,
    roof: Roofline,
    dims: Dims,
    rounds: int = 1,
    first_sentence: Callable[[list[int]], int] = len,
) -> dict[str, dict[str, Any]]:
    """Every engine's replies to every prompt, ``rounds`` times, interleaved: for each
    prompt the engines take turns, the first one rotating, so a machine that speeds up
    or slows down during the run (a shared VM does, by a quarter) weighs on all of them
    alike instead of on whichever ran in that stretch. ``rounds_tokens_per_s`` holds each
    round's own figure, for the spread. ``first_sentence(ids)``: how many tokens of a
    reply its first sentence needs (:func:`first_sentence_tokens`; default: all)."""
    counter = CountingBackend(backend)
    names = list(decoders)
    for name in names:  # warm-up (allocations, first-run costs)
        drain(decoders[name](counter, prompts[0], budget))
    tallies = {name: _Tally() for name in names}
    per_round: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for i, prompt in enumerate(prompts):
            k = (i + r) % len(names)
            for name in names[k:] + names[:k]:
                tallies[name].reply(
                    counter, decoders[name], prompt, budget, roof, dims, first_sentence
                )
        n = len(prompts)  # this round's replies are each tally's last n
        for name, t in tallies.items():
            per_round[name].append(sum(t.tokens[-n:]) / sum(t.times[-n:]))
    out = {}
    for name, t in tallies.items():
        out[name] = {**t.summary(), "rounds_tokens_per_s": per_round[name]}
    return out


def _int8_matmul(k: int, n: int, method: str) -> Callable[[NDArray[np.float32]], object]:
    """An ONNX Runtime session of x @ W (W: k x n, random) with W quantised as ``method``
    (blockwise: 8-bit weights, the int8 kernel's peak and the memory's bandwidth)."""
    import tempfile

    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from export.build import quantize_int8

    w = np.random.default_rng(0).standard_normal((k, n)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "peak",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])],
        [numpy_helper.from_array(w, "w")],
    )
    with tempfile.TemporaryDirectory() as d:
        src, dst = Path(d) / "mm.onnx", Path(d) / "mm.int8.onnx"
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), src)
        quantize_int8(src, dst, method, bits=8)  # type: ignore[arg-type]
        import onnxruntime as ort

        sess = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"])
    return lambda x: sess.run(None, {"x": x})


def peak_int8_ort(n: int = 1024, repeats: int = 5, method: str = "blockwise") -> float:
    """FLOP/s of an n x 4n x 4n product in ONNX Runtime, quantised as ``method``."""
    run = _int8_matmul(4 * n, 4 * n, method)
    x = np.random.default_rng(1).standard_normal((n, 4 * n)).astype(np.float32)
    return 2.0 * n * (4 * n) ** 2 / _median_time(lambda: run(x), repeats)


def bandwidth_int8_ort(k: int = 4096, n: int = 16384, repeats: int = 9) -> float:
    """Bytes/s of blockwise int8 weights (scales included) through one matrix-vector
    product, the AR step's kernel; k x n = 64 M weights, twice the biggest L3 here."""
    run = _int8_matmul(k, n, "blockwise")
    x = np.random.default_rng(1).standard_normal((1, k)).astype(np.float32)
    return k * n * int8_bytes_per_weight("blockwise") / _median_time(lambda: run(x), repeats)


def recipe_bytes_per_weight(recipe: dict[str, Any], d: Dims) -> float:
    """Stored bytes per weight of a file quantised by ``recipe`` (its manifest's
    ``quantisation``), averaged over :func:`n_weights`: a 4-bit file's head and its
    ``wide_products`` are at its own ``head_bits`` (export.build.HEAD_BITS)."""
    method, bits = recipe.get("method", "dynamic"), recipe.get("bits", 8)
    per = int8_bytes_per_weight(method, bits)
    if (head_bits := recipe.get("head_bits")) is None:
        return per
    wide = d.n_embd * d.vocab_size + d.n_layer * sum(
        product_weights(d, k) for k in recipe.get("wide_products", ())
    )
    return per + (int8_bytes_per_weight(method, head_bits) - per) * wide / n_weights(d)


def product_weights(d: Dims, kind: str) -> int:
    """The weights of one layer's product of ``kind`` (model.modeldir.PRODUCT_KINDS)."""
    C, kv, F = d.n_embd, d.n_kv_head * d.head_dim, d.ffn_hidden
    return {"qkv": C * (C + 2 * kv), "o": C * C, "gate_up": 2 * C * F, "down": C * F}[kind]


def int8_bytes_per_weight(method: str, bits: int = 8) -> float:
    """Stored bytes per weight: int8 (dynamic), or ``bits`` plus, blockwise, one fp32
    scale per block and at 4 bits a 4-bit zero point."""
    from export.build import INT8_BLOCK

    if method != "blockwise":
        return 1.0
    return (bits + 32 / INT8_BLOCK + (4 / INT8_BLOCK if bits == 4 else 0)) / 8


def peak_fp32_torch(n: int = 2048, repeats: int = 5) -> float:
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2.0 * n**3 / _median_time(lambda: a @ b, repeats)


def bandwidth_fp32_torch(k: int = 4096, n: int = 16384, repeats: int = 9) -> float:
    import torch

    x, w = torch.randn(1, k), torch.randn(k, n)
    return 4.0 * k * n / _median_time(lambda: x @ w, repeats)


def _median_time(fn: Callable[[], object], repeats: int) -> float:
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _dims(manifest_config: dict[str, Any]) -> Dims:
    return Dims(**{k: int(manifest_config[k]) for k in Dims.__dataclass_fields__})


def run_llm_bench(options: BenchOptions) -> dict[str, Any]:
    import json

    model_dir = options.model_dir
    if not is_complete(model_dir):
        raise FileNotFoundError(
            f"{model_dir} holds no complete exported model (`quicksilver export`; without "
            "--model-dir the bench times the one `quicksilver serve` serves)"
        )
    # the "served" row is serve's engine and schedule; the weights are serve's only in
    # its directory (named after the shipped adapter's digest)
    served_weights = model_dir.name == engine_model_dir(DEFAULT_ENGINE).name
    if not served_weights:
        log.warning(
            'bench: %s is not the model `quicksilver serve` serves: its "served" row is '
            "serve's schedule on these weights",
            model_dir,
        )
    manifest = json.loads((model_dir / "manifest.json").read_text())
    dims = _dims(manifest["config"])
    tok = load_tokenizer(model_dir)
    questions = QUESTIONS[: options.prompts]
    prompts = [build_prompt(tok, [ChatMessage("user", q)], 1024) for q in questions]
    # The machine's int8 peak is its fastest int8 kernel (dynamic quantisation's QGEMM);
    # the served file's own kernel is reported beside it.
    kernel_peaks = {m: peak_int8_ort(method=m) for m in ("dynamic", "blockwise")}
    recipe = manifest["files"]["model.int8.onnx"].get("quantisation") or {}
    roofs = {
        "onnx-int8": Roofline(
            max(kernel_peaks.values()),
            bandwidth_int8_ort(),
            recipe_bytes_per_weight(recipe, dims),
        )
    }
    served = load_onnx_backend(model_dir, "int8", RuntimeConfig(max_len=1024))
    backends: dict[str, StepBackend] = {"onnx-int8": served}
    if options.torch_reference:
        backends["torch-fp32"] = _torch_backend()
        roofs["torch-fp32"] = Roofline(peak_fp32_torch(), bandwidth_fp32_torch(), 4.0)
    head = KeptHead(system_head(tok)) if options.system_cached else None
    decoders: dict[str, Decoder] = {"ar": ar_decoder(tok, head)}
    after = served_options(manifest.get("source", {}).get("adapter")).end_after_sentence
    for width, name in DIFFUSION_ROWS.items():
        decoders[name] = diffusion_decoder(tok, width, after == "always", head)
    schedule, _ = host_schedule(served, model_dir)
    log.info("bench: serve's schedule on this host: %s", schedule.why())
    sentence = first_sentence_tokens(tok)
    llama = _llama_cpp_worker(options.llama_cpp)
    if llama is not None:
        decoders[LLAMA_ENGINE] = llama.decoder(tok.stop_ids, len(head.ids) if head else 0)
    try:
        rows = _time_all(options, backends, decoders, prompts, roofs, dims, sentence)
    finally:
        if llama is not None:
            llama.close()
    row = served_row(DEFAULT_ENGINE, schedule.block_size)
    results = _results(rows, options, roofs, dims, manifest, questions, row)
    results["served"]["served_weights"] = served_weights
    results["system_cached"] = options.system_cached
    results["schedule"] = {"block_size": schedule.block_size, "pass_costs_ms": schedule.costs_ms}
    results["int8_kernel_peak_flops"] = kernel_peaks
    if llama is not None:
        results["llama_cpp"] |= {"version": llama.version, "gguf": llama.gguf.name}
    return results


def _time_all(
    options: BenchOptions,
    backends: dict[str, StepBackend],
    decoders: dict[str, Decoder],
    prompts: list[list[int]],
    roofs: dict[str, Roofline],
    dims: Dims,
    sentence: Callable[[list[int]], int],
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for budget in options.budgets:
        for runtime, backend in backends.items():
            torch = runtime.startswith("torch")
            # the variants of the diffusion sampler, and llama.cpp, are timed beside ONNX
            # Runtime only
            engines = {e: d for e, d in decoders.items() if e in ("ar", "diffusion") or not torch}
            rounds = 1 if torch else options.rounds
            log.info(
                "bench: %s on %s, budget %d, %d round(s) ...",
                ", ".join(engines),
                runtime,
                budget,
                rounds,
            )
            n = options.torch_prompts if torch else None
            timed = time_engines(
                backend, engines, prompts[:n], budget, roofs[runtime], dims, rounds, sentence
            )
            for engine, r in timed.items():
                if engine == LLAMA_ENGINE:  # its own runtime; the roofline is ONNX Runtime's
                    runtime_of = LLAMA_RUNTIME
                    r.update({k: None for k in r if k.startswith(("floor_", "fraction_"))})
                else:
                    runtime_of = runtime
                rows.append({"engine": engine, "runtime": runtime_of, "budget": budget, **r})
    return rows


def _llama_cpp_worker(choice: str) -> LlamaCppWorker | None:
    """llama.cpp for the bench: None when ``choice`` is "off", or "auto" and no Python
    with llama_cpp is found (said in the log); a failure to start a Python that was
    named, or found, is an error."""
    if choice == "off":
        return None
    python = llama_cpp_python() if choice == "auto" else choice
    if python is None:
        log.info(
            "bench: no llama.cpp row (llama_cpp does not import here and $%s is not set; "
            "docs/export.md says how to build it)",
            LLAMA_PYTHON_ENV,
        )
        return None
    from model.nn.gguf import find_smollm2_gguf

    worker = LlamaCppWorker(python, find_smollm2_gguf(), threads=os.cpu_count() or 1)
    log.info("bench: llama.cpp %s under %s", worker.version, python)
    return worker


def _torch_backend() -> StepBackend:
    from model.nn.backend import TorchBackend
    from model.nn.diffusion import with_mask_row
    from model.nn.gguf import load_smollm2

    model = with_mask_row(load_smollm2())  # the diffusion sampler feeds the mask id
    return TorchBackend(model, max_len=1024, name="torch")


def _adapter_summary(manifest: dict[str, Any]) -> dict[str, Any] | None:
    """Which diffusion adapter the directory merged (None: the base model)."""
    adapter = (manifest.get("source") or {}).get("adapter")
    if not adapter:
        return None
    keys = ("weights", "steps", "tokens_seen", "heldout_loss", "block_size")
    return {k: adapter[k] for k in keys if k in adapter}


def _results(
    rows: list[dict[str, Any]],
    options: BenchOptions,
    roofs: dict[str, Roofline],
    dims: Dims,
    manifest: dict[str, Any],
    questions: tuple[str, ...],
    served: str,
) -> dict[str, Any]:
    top = max(options.budgets)

    def row(engine: str, runtime: str = "onnx-int8") -> dict[str, Any] | None:
        return next(
            (
                x
                for x in rows
                if x["engine"] == engine and x["runtime"] == runtime and x["budget"] == top
            ),
            None,
        )

    def tps(engine: str) -> float | None:
        return r["tokens_per_s"] if (r := row(engine)) else None

    ar, diff = tps("ar"), tps("diffusion")
    a, d = row("ar"), row("diffusion")
    rounds = (
        [x / y for x, y in zip(d["rounds_tokens_per_s"], a["rounds_tokens_per_s"], strict=True)]
        if a and d
        else []
    )
    llama = row(LLAMA_ENGINE, LLAMA_RUNTIME)
    over_llama = None
    if llama is not None:
        over_llama = {  # the yardsticks: tokens/s ratios, first sentences side by side
            e: {
                "tokens_per_s": r["tokens_per_s"] / llama["tokens_per_s"],
                "first_sentence_p50_s": r["first_sentence_p50_s"],
                "llama_cpp_first_sentence_p50_s": llama["first_sentence_p50_s"],
            }
            for e in ("ar", *DIFFUSION_ROWS.values())
            if (r := row(e))
        }
    # Same words? Diffusion and AR replies differ by design; int8 vs fp32 per engine.
    for x in rows:
        x.pop("_replies")
    return {
        "machine_peak_flops": {k: r.flops for k, r in roofs.items()},
        "machine_bandwidth_bytes_per_s": {k: r.bandwidth for k, r in roofs.items()},
        "weight_bytes_per_weight": {k: r.weight_bytes for k, r in roofs.items()},
        "flops_per_pass_example": {
            "T=1,P=100": step_flops(dims, 1, 100, 1),
            "T=16,P=100,K=16": step_flops(dims, 16, 100, 16),
            "T=80,P=0,K=1": step_flops(dims, 80, 0, 1),
        },
        "model_files": {k: v["bytes"] for k, v in manifest["files"].items()},
        "int8_quantisation": manifest["files"]["model.int8.onnx"].get("quantisation"),
        "adapter": _adapter_summary(manifest),
        "prompts": list(questions),
        "rows": rows,
        # the row `quicksilver serve` serves by default on this host (model/assemble.py's
        # DEFAULT_ENGINE in the host's schedule, model/schedule.py)
        "served": {
            "engine": served,
            "runtime": "onnx-int8",
            "budget": top,
        },
        "speedup": (diff / ar) if (ar and diff) else None,
        "speedup_per_round": rounds,
        # each diffusion engine's tokens/s over AR's, by name (the one served today)
        "speedup_by_engine": {
            x["engine"]: x["tokens_per_s"] / ar
            for x in rows
            if ar and x["engine"] != "ar" and x["runtime"] == "onnx-int8" and x["budget"] == top
        },
        "speedup_budget": top,
        "llama_cpp": {"over_llama_cpp": over_llama} if llama is not None else None,
    }


def print_table(results: dict[str, Any]) -> None:
    print(
        f"{'engine':18s} {'runtime':11s} {'budget':>6s} {'p50 s':>7s} {'p95 s':>7s} "
        f"{'1st s':>6s} {'tok/s':>7s} {'tok':>6s} {'passes':>7s} {'floor s':>8s} "
        f"{'%floor':>6s} {'%peak':>6s}"
    )
    for r in results["rows"]:
        print(
            f"{r['engine']:18s} {r['runtime']:11s} {r['budget']:6d} {r['p50_s']:7.3f} "
            f"{r['p95_s']:7.3f} {r['first_sentence_p50_s']:6.3f} "
            f"{r['tokens_per_s']:7.1f} {r['tokens_per_reply']:6.1f} "
            f"{r['passes_per_reply']:7.1f} {_cell(r['floor_s_per_reply'], 8, '.4f')} "
            f"{_cell(r['fraction_of_floor'], 6, '.1f', 100)} "
            f"{_cell(r['fraction_of_peak'], 6, '.1f', 100)}"
        )
    peaks = ", ".join(
        f"{k} {v / 1e9:.0f} GFLOP/s, {results['machine_bandwidth_bytes_per_s'][k] / 1e9:.1f} GB/s"
        for k, v in results["machine_peak_flops"].items()
    )
    print(f"peak: {peaks} (floor: the longer of FLOPs/peak and bytes/bandwidth per pass)")
    print("1st s: p50 time to the reply's first sentence, what a listener waits for")
    if results.get("system_cached"):
        print("system prompt cached: every engine prefilled only each reply's own message")
    else:
        print("every reply prefilled its whole prompt (--system-cached: as serve runs)")
    if kernels := results.get("int8_kernel_peak_flops"):
        rates = ", ".join(f"{k} {v / 1e9:.0f} GFLOP/s" for k, v in kernels.items())
        print(f"int8 kernels: {rates}")
    if results["speedup"] is not None:
        at, x = results["speedup_budget"], results["speedup"]
        print(f"speedup (diffusion / AR tokens/s at {at} tokens): {x:.2f}")
        if len(each := results.get("speedup_per_round") or []) > 1:
            print(f"  per round: {', '.join(f'{v:.2f}' for v in each)}")
    if llama := results.get("llama_cpp"):
        for engine, x in (llama.get("over_llama_cpp") or {}).items():
            first, theirs = x["first_sentence_p50_s"], x["llama_cpp_first_sentence_p50_s"]
            print(
                f"{engine} / llama.cpp tokens/s: {x['tokens_per_s']:.2f} "
                f"(first sentence p50 {first:.3f} s against {theirs:.3f} s)"
            )


def _cell(x: float | None, width: int, spec: str, scale: float = 1.0) -> str:
    """A table cell, "-" where the figure does not apply (llama.cpp has no roofline here)."""
    return f"{'-':>{width}s}" if x is None else f"{scale * x:{width}{spec}}"
