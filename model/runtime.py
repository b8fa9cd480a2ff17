"""Exported models in ONNX Runtime behind the :class:`model.backend.StepBackend` protocol.

This is the serving path: it imports numpy and onnxruntime, never torch. One session
per model file is shared by every reply (ONNX Runtime's ``run`` is thread-safe); each
reply owns its :class:`OrtCache`.

Execution providers are picked by availability and configuration: ``"auto"`` takes
TensorRT, then CUDA, then CPU, whichever the installed onnxruntime offers (the
``onnxruntime-gpu`` package, swapped in for ``onnxruntime`` on a GPU host as
docs/export.md says, brings CUDA and TensorRT); naming one that is not available is an
error that says so.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from model.backend import Attend, Logits, Rows

try:
    import onnxruntime as ort
except ImportError as exc:  # neither onnxruntime nor onnxruntime-gpu, or a broken one
    raise SystemExit(
        f"quicksilver: cannot import onnxruntime ({exc}): pip install 'onnxruntime>=1.22', "
        "or on a CUDA host 'onnxruntime-gpu>=1.22' instead, never both (docs/export.md)"
    ) from exc

Device = Literal["auto", "cpu", "cuda", "tensorrt"]
_PROVIDERS = {
    "tensorrt": "TensorrtExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "cpu": "CPUExecutionProvider",
}
MANIFEST = "manifest.json"


# The int8 recipes whose files multiply with ONNX Runtime's integer product
# (MatMulInteger, MatMulIntegerToFloat: MLAS QGEMM, u8 activations by s8 weights): the
# rows graphs (export/rows_graph.py) and quantize_dynamic's files; the blockwise files
# (MatMulNBits) have kernels of their own
INTEGER_PRODUCT_RECIPES = ("rows", "dynamic")


class IntegerProductError(RuntimeError):
    """A file that multiplies with ONNX Runtime's integer product, on a CPU where that
    product is not exact (:func:`integer_product_exact`)."""


@functools.cache
def integer_product_exact() -> bool:
    """Whether ONNX Runtime's u8 x s8 integer product is exact on this CPU.

    Without VNNI (AVX2 only, or AVX-512 without VNNI) MLAS multiplies with VPMADDUBSW,
    which sums two u8 x s8 products in 16 bits and saturates: 2 x 255 x 127 does not
    fit. The rows graphs' activations sit around their zero point of 128, so most sums
    overflow: on an AMD EPYC with AVX2 only every output of this probe was wrong, by up
    to 37% of the largest, while the blockwise files' kernel stayed exact. A product of
    activations at the ends of their range by weights at the ends of theirs, checked
    against numpy's, once a process (tens of ms, with onnx imported: only where such a
    file is to be loaded)."""
    from onnx import TensorProto, helper, numpy_helper

    k, n = 64, 8
    rng = np.random.default_rng(0)
    w = rng.choice(np.array([-127, 127], np.int8), size=(k, n))
    a = np.where(w.T > 0, 255, 0).astype(np.uint8)  # each row's sums at their largest
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "w", "zp"], ["y"])],
        "integer_product_probe",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [n, k])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [n, n])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(128, np.uint8), "zp")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, {"a": a})[0]
    return bool(np.array_equal(got, (a.astype(np.int64) - 128) @ w.astype(np.int64)))


class ProviderUnavailableError(RuntimeError):
    """The configured execution provider is not in this onnxruntime build."""


def choose_providers(
    device: Device = "auto",
    available: list[str] | None = None,
    trt_options: dict[str, Any] | None = None,
) -> list[Any]:
    """Providers for an InferenceSession, best first, always ending with the CPU."""
    have = ort.get_available_providers() if available is None else available
    if device == "auto":
        wanted = [k for k in ("tensorrt", "cuda") if _PROVIDERS[k] in have]
    elif device == "cpu":
        wanted = []
    else:
        if _PROVIDERS[device] not in have:
            raise ProviderUnavailableError(
                f"{_PROVIDERS[device]} is not available in this onnxruntime "
                f"(it offers {', '.join(have)}); on a host with CUDA swap onnxruntime "
                "for onnxruntime-gpu (docs/export.md, On a GPU host)"
                + (" and TensorRT" if device == "tensorrt" else "")
            )
        wanted = ["tensorrt", "cuda"] if device == "tensorrt" else ["cuda"]
    out: list[Any] = []
    for k in wanted:
        if k == "tensorrt" and trt_options:
            out.append((_PROVIDERS[k], trt_options))
        else:
            out.append(_PROVIDERS[k])
    return [*out, _PROVIDERS["cpu"]]


@dataclass(frozen=True)
class RuntimeConfig:
    device: Device = "auto"
    threads: int = 0  # intra-op threads; 0 = ONNX Runtime's default (all cores)
    max_len: int = 2048  # positions one reply's cache holds


# The buffers grow in steps of this many positions (up to max_len), the prefix copied once
# per growth: a reply's cache holds about what it uses, and the 32 conversations the
# diffusion engine keeps (model/diffusion_engine.py) cost what they hold, not max_len each.
GROW = 256


def grown_capacity(n: int, max_len: int) -> int:
    """The positions a cache grows to for ``n``: whole steps of :data:`GROW`, at most
    ``max_len``."""
    return min(max_len, -(-n // GROW) * GROW)


_DEVICE_OF = {"CUDAExecutionProvider": "cuda", "TensorrtExecutionProvider": "cuda"}


def cache_device(providers: list[str]) -> str:
    """Where the cache buffers live: "cuda" when the session runs on a GPU provider."""
    return _DEVICE_OF.get(providers[0], "cpu") if providers else "cpu"


class OrtCache:
    """Keys and values in per-layer buffers ``(L, 2, 1, n_kv, C, hd)``, head-major, each
    layer's keys and values bound to the graph's past and present of that layer, so ONNX
    Runtime reads them in place and writes a step's chunk right after its ``S`` entries.

    The buffers are one OrtValue on the session's device (``OrtBackend.device``): host
    memory on the CPU, GPU memory under CUDA or TensorRT, where a step then moves only
    its ids in and its logits out.

    The first ``length`` positions are the committed prefix. A step writes its chunk past
    them, so an uncommitted step changes nothing committed, and a commit only moves
    ``length``.
    """

    def __init__(self, backend: OrtBackend) -> None:
        self._backend = backend
        self.buffers: ort.OrtValue = backend.to_device(self._empty(0))
        self.binding: Any = None
        self.length = 0

    @property
    def capacity(self) -> int:
        return int(self.buffers.shape()[4])

    def room_for(self, chunk: int) -> None:
        """Room for a step of ``chunk`` tokens past the committed prefix, or the error
        of a full cache."""
        if self._backend.max_len < self.length + chunk:
            raise ValueError(f"KV cache full: {self.length} + {chunk} > {self._backend.max_len}")
        self.reserve(self.length + chunk)

    def reserve(self, n: int) -> None:
        """Room for ``n`` positions: a larger buffer, the prefix copied, bound afresh.
        On a GPU the old buffer passes through the host once per growth: ONNX Runtime's
        Python API copies whole tensors only."""
        if n > self.capacity:
            self._fill(grown_capacity(n, self._backend.max_len), self, self.length)

    def load_prefix(self, source: OrtCache, n: int) -> None:
        """Commit the first ``n`` positions of ``source`` here, in place of what this
        cache held: a conversation starts from another's system prompt, unprefilled."""
        self._fill(max(self.capacity, grown_capacity(n, self._backend.max_len)), source, n)
        self.length = n

    def _fill(self, capacity: int, source: OrtCache, n: int) -> None:
        """New buffers of ``capacity`` positions holding the first ``n`` of ``source``'s,
        bound afresh."""
        buffers = self._empty(capacity)
        if n:
            buffers[..., :n, :] = source.buffers.numpy()[..., :n, :]
        self.buffers = self._backend.to_device(buffers)
        self.binding = self._backend.bind(self.buffers)

    def _empty(self, capacity: int) -> NDArray[Any]:
        L, n_kv, hd = self._backend.dims
        # zeros, not garbage: the plain graph reads all C positions (masked, but a NaN
        # pattern times a zero weight is still NaN); on a CPU the pages are free anyway
        return np.zeros((L, 2, 1, n_kv, capacity, hd), self._backend.dtype)


FORCE_SPINNING_STOP = "session.force_spinning_stop"


def session_options(threads: int) -> ort.SessionOptions:
    """The options of every step graph's session: ``threads`` intra-op threads (0: ONNX
    Runtime's default, all cores)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        options.intra_op_num_threads = threads
    # Threads spin inside a pass (fast hand-offs between its operators) but stop
    # when it returns: spinning on, they took the cores from Piper for ~30 ms after
    # every pass (docs/latency.md, "Speech first"); a pass costs the same.
    options.add_session_config_entry(FORCE_SPINNING_STOP, "1")
    return options


class OrtBackend:
    """One exported step graph (``export/graph.py``) in an ONNX Runtime session."""

    def __init__(
        self,
        path: str | Path,
        config: RuntimeConfig | None = None,
        name: str = "onnx",
        rows: bool = False,
    ) -> None:
        config = config or RuntimeConfig()
        self.path = Path(path)
        # a rows graph (export/rows_graph.py): its batched twin and fitted probes are
        # the rows ones (model/assemble.py)
        self.rows = rows
        self.session = ort.InferenceSession(
            str(self.path),
            session_options(config.threads),
            providers=choose_providers(config.device),
        )
        inputs = {i.name: i for i in self.session.get_inputs()}
        if "past_key_0" not in inputs:
            raise ValueError(
                f"{self.path} is an older step graph (no per-layer cache buffers): rebuild "
                "its model directory with `quicksilver export` (format v4)"
            )
        _, n_kv, _, head_dim = inputs["past_key_0"].shape
        n_layer = sum(name.startswith("past_key_") for name in inputs)
        self.dims = (n_layer, int(n_kv), int(head_dim))
        is_fp16 = inputs["past_key_0"].type == "tensor(float16)"
        self.dtype = np.dtype(np.float16 if is_fp16 else np.float32)
        vocab = self.session.get_outputs()[0].shape[1]
        self.vocab_size = int(vocab) if isinstance(vocab, int) else _manifest_vocab(self.path)
        self.max_len = config.max_len
        self.threads = config.threads
        self.name = name
        self.device = cache_device(self.providers)

    @property
    def providers(self) -> list[str]:
        return list(self.session.get_providers())

    def to_device(self, array: NDArray[Any]) -> ort.OrtValue:
        """``array`` as an OrtValue on the cache device (on the CPU: the same memory)."""
        return ort.OrtValue.ortvalue_from_numpy(array, self.device, 0)

    def bind(self, buffers: ort.OrtValue) -> Any:
        """An IO binding of this graph with each layer's past and present on the same
        memory."""
        L, n_kv, hd = self.dims
        shape = [1, n_kv, buffers.shape()[4], hd]
        layer_bytes = int(np.prod(shape)) * self.dtype.itemsize
        binding = self.session.io_binding()
        binding.bind_output("logits")  # first: its index in get_outputs() stays 0
        for layer in range(L):
            for j, kv in enumerate(("key", "value")):
                ptr = buffers.data_ptr() + (2 * layer + j) * layer_bytes
                args = (self.device, 0, self.dtype.type, shape, ptr)
                binding.bind_input(f"past_{kv}_{layer}", *args)
                binding.bind_output(f"present_{kv}_{layer}", *args)
        return binding

    def run_bound(self, session: ort.InferenceSession, io: Any, rows: int) -> Logits:
        """Run ``session`` on ``io`` (this graph's or its batched twin's binding) and
        return the pass's ``rows`` logits. On the CPU they are bound to a new array the
        pass writes straight into (reading them back through ``get_outputs`` wraps every
        one of the graph's outputs, 61 in the served model: ~0.2 ms a pass); elsewhere
        ONNX Runtime sizes them and they are read back."""
        if self.device != "cpu":
            io.bind_output("logits")
            session.run_with_iobinding(io)
            return io.get_outputs()[0].numpy()  # type: ignore[no-any-return]
        logits = np.empty((rows, self.vocab_size), np.float32)
        io.bind_output("logits", "cpu", 0, np.float32, list(logits.shape), logits.ctypes.data)
        session.run_with_iobinding(io)
        return logits

    def new_cache(self) -> OrtCache:
        return OrtCache(self)

    def copy_prefix(self, cache: OrtCache, n: int) -> OrtCache:
        """A new cache holding the first ``n`` committed positions of ``cache``."""
        copy = self.new_cache()
        copy.load_prefix(cache, n)
        return copy

    def cache_length(self, cache: OrtCache) -> int:
        return cache.length

    def truncate(self, cache: OrtCache, length: int) -> None:
        if not 0 <= length <= cache.length:
            raise ValueError(f"cannot truncate a cache of {cache.length} to {length}")
        cache.length = length

    def step(
        self,
        cache: OrtCache,
        ids: NDArray[np.int64],
        attend: Attend,
        commit: bool,
        rows: Rows = None,
    ) -> Logits:
        P, T = cache.length, len(ids)
        cache.room_for(T)
        io = cache.binding
        io.bind_cpu_input("input_ids", np.ascontiguousarray(ids, dtype=np.int64))
        io.bind_cpu_input("positions", np.arange(P, P + T, dtype=np.int64))
        io.bind_cpu_input("past_length", np.array(P, np.int64))
        io.bind_cpu_input("block", np.array(attend == "block"))
        rows_ = np.arange(T) if rows is None else np.asarray(rows, np.int64)
        io.bind_cpu_input("logit_rows", rows_)
        logits = self.run_bound(self.session, io, len(rows_))
        if commit:
            cache.length = P + T  # the chunk is already in place at P..P+T-1
        return logits


def _manifest_vocab(model_path: Path) -> int:
    manifest = json.loads((model_path.parent / MANIFEST).read_text())
    return int(manifest["config"]["vocab_size"])
