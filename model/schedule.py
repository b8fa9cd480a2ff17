"""The decoding schedule a host serves: the diffusion engine's block width.

The adapted model decodes in blocks of any width (docs/diffusion.md). A wide block
writes several tokens a pass where the model is sure of them and one where it is not:
held out the served adapter commits ~0.9 tokens a pass, so a wide pass pays only where
it costs less than that many one-token passes: nowhere with this adapter; with one that
commits several tokens a pass, where wide passes are cheap (a GPU;
``bench/gpu_replies.sh``). A block of one position is next-token decoding of the same
model, with its tools, sessions and clean ends (:func:`sampler_for`): one token a pass,
at the cost of a pass that reads the weights once. On a CPU a 16-token pass costs 2-5
one-token passes (docs/results/2026-12-runtimes.md), so there the narrow schedule gets
every token, the first sentence's included, sooner.

Which is faster follows from this host's measured pass costs and the tokens a pass each
schedule commits: :func:`host_schedule` times both widths once (about a second) and
keeps the choice in the model directory (``schedule.json``) under the host's processor
and providers, beside the pass shape of ``passes.json``.

The int8 kernel is chosen the same way: where the model directory has the rows graphs
(``quicksilver export --rows-graphs``, export/rows_graph.py), :func:`host_kernel` times
a one-token step, a prompt step and a batched pass on them and on the blockwise files
once, and the host serves the cheaper (``kernels.json``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from model.batch import BatchRunner, Request, host_key, host_records, keep_host_record
from model.modeldir import rows_file
from model.runtime import OrtBackend, OrtCache
from model.sampler import SamplerSettings

SCHEDULES = "schedule.json"
KERNELS = "kernels.json"  # in the model directory: the int8 kernel measured per host
PROMPT_WIDTH = 32  # the prompt step the kernels are timed on (a question and its history)
WIDE, NARROW = 16, 1  # the block widths a host chooses between
# Reply tokens a pass (prefill, denoising steps and commits counted), the
# served int8 graph on the 40 held-out questions, budget 64 (`quicksilver eval llm
# --onnx DIR --block-size N`; docs/results/2026-12-narrow-schedule.md). A property of the
# model and the sampler, not of the host: what the measured pass costs are divided by.
TOKENS_PER_PASS = {WIDE: 0.90, NARROW: 0.96}
# How the narrow schedule ends a reply. Decoded a token a pass, the adapter proposes the
# end from the committed row alone and rarely as its likeliest token: held out, blocks of
# 1 end 0.775 of the replies cleanly against 0.925 for blocks of 16 (which seem to plan a
# reply's length in the block). An end is taken after a sentence's end where its
# probability reaches the bar, and a reply this long wraps up at its next sentence's end
# (docs/results/2026-12-narrow-schedule.md)
NARROW_END_BAR = 0.05
NARROW_WRAP_AFTER = 40


@dataclass(frozen=True)
class Schedule:
    """The block width served, and what it was chosen from."""

    block_size: int
    # ms of one pass of "<width>" tokens after a short prefill (empty when not measured)
    costs_ms: dict[str, float] = field(default_factory=dict, compare=False)

    def why(self) -> str:
        if not self.costs_ms:
            return f"blocks of {self.block_size}, as asked"
        per_token = {w: self.costs_ms[str(w)] / TOKENS_PER_PASS[w] for w in TOKENS_PER_PASS}
        said = ", ".join(f"{w}: {ms:.1f} ms a token" for w, ms in per_token.items())
        return f"blocks of {self.block_size} ({said})"


def sampler_for(settings: SamplerSettings, block_size: int) -> SamplerSettings:
    """``settings`` decoding in blocks of ``block_size``; blocks of one end replies as
    the narrow schedule does (``NARROW_END_BAR``, ``NARROW_WRAP_AFTER``)."""
    if block_size != NARROW:
        return dataclasses.replace(settings, block_size=block_size)
    return dataclasses.replace(
        settings, block_size=block_size, end_bar=NARROW_END_BAR, wrap_after=NARROW_WRAP_AFTER
    )


def choose(costs_ms: dict[str, float], tokens: dict[int, float] = TOKENS_PER_PASS) -> int:
    """The width whose tokens cost least here: a pass's cost over the ``tokens`` it
    commits. With the served adapter's ~0.9 a wide pass never pays, not even where it
    costs what a narrow one does; an adapter distilled to commit several tokens a pass
    (``training/gpu_distill.sh``) makes it pay wherever wide passes are cheap."""
    return min(tokens, key=lambda w: costs_ms[str(w)] / tokens[w])


def measure_costs(single: OrtBackend, repeats: int = 7, cached: int = 64) -> dict[str, float]:
    """Median ms of one uncommitted pass of each width after a prefill of ``cached``,
    the two widths interleaved so a busy moment costs both alike."""
    rng = np.random.default_rng(0)
    cache = OrtCache(single)
    single.step(cache, rng.integers(0, single.vocab_size, cached), "causal", commit=True)
    times: dict[int, list[float]] = {w: [] for w in TOKENS_PER_PASS}
    for i in range(repeats + 1):
        for width in TOKENS_PER_PASS:
            ids = rng.integers(0, single.vocab_size, width)
            t0 = time.perf_counter()
            single.step(cache, ids, "block", commit=False, rows=np.arange(width))
            if i:  # the first round warms the kernels up
                times[width].append(time.perf_counter() - t0)
    return {str(w): round(float(np.median(t)) * 1e3, 2) for w, t in times.items()}


def host_schedule(single: OrtBackend, model_dir: Path) -> tuple[Schedule, bool]:
    """This host's schedule: measured once and kept in ``model_dir`` (a read-only
    directory measures at every start). Returns it and whether it was measured now."""
    key = host_key(single.session.get_providers())
    path = model_dir / SCHEDULES
    found = host_records(path).get(key)
    widths = {str(w) for w in TOKENS_PER_PASS}
    if isinstance(found, dict) and widths <= set(found.get("costs_ms", {})):
        costs = {k: float(v) for k, v in found["costs_ms"].items()}
        return Schedule(choose(costs), costs), False
    costs = measure_costs(single)
    schedule = Schedule(choose(costs), costs)
    keep_host_record(path, key, {"block_size": schedule.block_size, "costs_ms": costs})
    return schedule, True


@dataclass(frozen=True)
class Kernel:
    """Whether this host serves the rows graphs (export/rows_graph.py: int8 per row on
    ONNX Runtime's integer kernel) or the blockwise files, and the measured costs it was
    chosen from: "<kernel> <pass>" -> ms, the passes of :data:`KERNEL_PASSES`."""

    rows: bool
    costs_ms: dict[str, float] = field(default_factory=dict, compare=False)

    @property
    def name(self) -> str:
        return "rows" if self.rows else "blockwise"

    def total(self, kernel: str) -> float:
        """The measured passes' ms on ``kernel``, summed: what the choice compares."""
        return sum(v for k, v in self.costs_ms.items() if k.split()[0] == kernel)

    def why(self) -> str:
        if not self.costs_ms:
            return "the blockwise int8 files (no rows graphs in the model directory)"
        said = "; ".join(
            f"{k}: " + ", ".join(f"{p} {self.costs_ms[f'{k} {p}']:.1f}" for p in KERNEL_PASSES
                                 if f"{k} {p}" in self.costs_ms)
            for k in ("blockwise", "rows")
        )  # fmt: skip
        kernel = "the rows graphs, int8 per row" if self.rows else "the blockwise int8 files"
        return f"{kernel} (ms a pass, {said})"


# The passes a host's kernels are timed on: a reply's one-token step, a prompt step of
# PROMPT_WIDTH tokens (a question and its history) and, where both have batched graphs,
# a pass of 8 replies' one-token steps. What the served schedule's passes are made of.
KERNEL_PASSES = ("1", str(PROMPT_WIDTH), "8x1")


def measure_kernel_costs(
    kernels: dict[str, tuple[OrtBackend, BatchRunner | None]], repeats: int = 7, cached: int = 64
) -> dict[str, float]:
    """Median ms of each of :data:`KERNEL_PASSES` after ``cached`` positions on each
    kernel (its one-reply backend and batched runner), the kernels interleaved so a busy
    moment costs both alike. A pass a kernel cannot run (no batched graph) is left out
    for every kernel."""
    rng = np.random.default_rng(0)
    batched = all(runner is not None for _, runner in kernels.values())
    caches = {}
    for name, (single, _) in kernels.items():
        caches[name] = [OrtCache(single) for _ in range(8 if batched else 1)]
        for cache in caches[name]:
            single.step(cache, rng.integers(0, single.vocab_size, cached), "causal", commit=True)
    times: dict[str, list[float]] = {}
    for i in range(repeats + 1):
        for name, (single, runner) in kernels.items():
            cache = caches[name][0]
            for width in (1, PROMPT_WIDTH):
                ids = rng.integers(0, single.vocab_size, width)
                t0 = time.perf_counter()
                single.step(cache, ids, "causal", commit=True, rows=[width - 1])
                if i:  # the first round warms the kernels up
                    times.setdefault(f"{name} {width}", []).append(time.perf_counter() - t0)
                single.truncate(cache, cached)
            if runner is not None and batched:
                requests = [
                    Request(
                        (False, 0), j, c, rng.integers(0, 100, 1), "causal", False, np.arange(1)
                    )
                    for j, c in enumerate(caches[name])
                ]
                t0 = time.perf_counter()
                runner.run(requests)
                if i:
                    times.setdefault(f"{name} 8x1", []).append(time.perf_counter() - t0)
    return {k: round(float(np.median(t)) * 1e3, 2) for k, t in times.items()}


def host_kernel(
    model_dir: Path,
    key: str,
    measure: Callable[[], dict[str, float]],
) -> tuple[Kernel, bool]:
    """This host's kernel: the rows graphs where their measured passes cost less in all
    than the blockwise files', measured once (``measure``, a few seconds) and kept in
    ``model_dir`` (``kernels.json``) under the host's ``key``. Returns the choice and
    whether it was measured now. A directory without rows graphs keeps the blockwise
    files, unmeasured."""
    if rows_file(model_dir, "int8") is None:
        return Kernel(False), False
    path = model_dir / KERNELS
    found = host_records(path).get(key)
    if isinstance(found, dict) and isinstance(found.get("costs_ms"), dict):
        costs, measured = {k: float(v) for k, v in found["costs_ms"].items()}, False
    else:
        costs, measured = measure(), True
    kernel = Kernel(False, costs)
    kernel = Kernel(kernel.total("rows") < kernel.total("blockwise"), costs)
    if measured:
        keep_host_record(path, key, {"kernel": kernel.name, "costs_ms": costs})
    return kernel, measured
