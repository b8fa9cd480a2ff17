"""Exported models in ONNX Runtime behind the :class:`model.backend.StepBackend` protocol.

This is the serving path: it imports numpy and onnxruntime, never torch. One session
per model file is shared by every reply (ONNX Runtime's ``run`` is thread-safe); each
reply owns its :class:`OrtCache`.

Execution providers are picked by availability and configuration: ``"auto"`` takes
TensorRT, then CUDA, then CPU, whichever the installed onnxruntime offers (the
``onnxruntime-gpu`` package, installed by the ``gpu`` extra instead of ``onnxruntime``,
brings CUDA and TensorRT); naming one that is not available is an error that says so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnxruntime as ort
from numpy.typing import NDArray

from model.backend import Attend, Logits, Offsets, Rows, check_draft_step, unfed_draft

Device = Literal["auto", "cpu", "cuda", "tensorrt"]
_PROVIDERS = {
    "tensorrt": "TensorrtExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "cpu": "CPUExecutionProvider",
}
MANIFEST = "manifest.json"


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
                f"(it offers {', '.join(have)}); install onnxruntime-gpu "
                "(pip install 'quicksilver[gpu]') on a host with CUDA"
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


class OrtCache:
    """Committed keys and values, preallocated and position-major ``(S, L, n_kv, hd)``.

    Position-major so that the prefix ``keys[:length]`` is one contiguous slice that
    ONNX Runtime reads in place.
    """

    def __init__(self, shape: tuple[int, int, int, int], dtype: np.dtype[Any]) -> None:
        # empty, not zeros: only the first `length` positions are ever read
        self.keys: NDArray[Any] = np.empty(shape, dtype)
        self.values: NDArray[Any] = np.empty(shape, dtype)
        self.length = 0
        # offset after the prefix -> (keys, values) (L, n_kv, hd): an uncommitted block's
        # draft (model/backend.py), copied after the prefix for the steps that read it
        self.draft: dict[int, tuple[NDArray[Any], NDArray[Any]]] = {}


class OrtBackend:
    """One exported step graph (``export/graph.py``) in an ONNX Runtime session."""

    def __init__(
        self, path: str | Path, config: RuntimeConfig | None = None, name: str = "onnx"
    ) -> None:
        config = config or RuntimeConfig()
        self.path = Path(path)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if config.threads:
            options.intra_op_num_threads = config.threads
        self.session = ort.InferenceSession(
            str(self.path), options, providers=choose_providers(config.device)
        )
        inputs = {i.name: i for i in self.session.get_inputs()}
        _, n_layer, n_kv, head_dim = inputs["past_keys"].shape
        self._cache_shape = (config.max_len, int(n_layer), int(n_kv), int(head_dim))
        is_fp16 = inputs["past_keys"].type == "tensor(float16)"
        self._dtype = np.dtype(np.float16 if is_fp16 else np.float32)
        vocab = self.session.get_outputs()[0].shape[1]
        self.vocab_size = int(vocab) if isinstance(vocab, int) else _manifest_vocab(self.path)
        self.max_len = config.max_len
        self.name = name

    @property
    def providers(self) -> list[str]:
        return list(self.session.get_providers())

    def new_cache(self) -> OrtCache:
        return OrtCache(self._cache_shape, self._dtype)

    def cache_length(self, cache: OrtCache) -> int:
        return cache.length

    def truncate(self, cache: OrtCache, length: int) -> None:
        if not 0 <= length <= cache.length:
            raise ValueError(f"cannot truncate a cache of {cache.length} to {length}")
        cache.length = length
        cache.draft.clear()

    def step(
        self,
        cache: OrtCache,
        ids: NDArray[np.int64],
        attend: Attend,
        commit: bool,
        rows: Rows = None,
        at: Offsets = None,
        keep: Rows = None,
    ) -> Logits:
        P, T = cache.length, len(ids)
        offsets = check_draft_step(attend, commit, T, at, keep, bool(cache.draft))
        if commit:
            cache.draft.clear()  # the commit pass recomputes the block exactly
        old = unfed_draft(cache.draft, offsets)  # placed right after the prefix
        if self.max_len < P + len(old) + (T if commit else 0):
            raise ValueError(f"KV cache full: {P} + {len(old)} + {T} > {self.max_len}")
        for n, o in enumerate(old):
            cache.keys[P + n], cache.values[P + n] = cache.draft[o]
        S = P + len(old)
        feeds = {
            "input_ids": np.ascontiguousarray(ids, dtype=np.int64),
            "positions": P + offsets,
            "past_keys": cache.keys[:S],
            "past_values": cache.values[:S],
            "block": np.array(attend == "block"),
            "logit_rows": np.arange(T) if rows is None else np.asarray(rows, np.int64),
        }
        logits, keys, values = self.session.run(None, feeds)
        if commit:
            cache.keys[P : P + T] = keys
            cache.values[P : P + T] = values
            cache.length = P + T
        for c in np.asarray([] if keep is None else keep, np.int64).tolist():
            cache.draft[int(offsets[c])] = (keys[c].copy(), values[c].copy())
        out: Logits = logits
        return out


def _manifest_vocab(model_path: Path) -> int:
    manifest = json.loads((model_path.parent / MANIFEST).read_text())
    return int(manifest["config"]["vocab_size"])
