"""The one place that assembles a reply engine for serving.

"diffusion-onnx" (the default) is :class:`model.diffusion_engine.DiffusionGenerator` on
the exported base + shipped adapter; "smollm2-ar-onnx" is
:class:`model.ar.ARGenerator` (greedy) on the base model's export. Both run an
:class:`model.runtime.OrtBackend` and import no torch, so the two engines differ only in
their decoder. The "diffusion" and "smollm2-ar" engines run the same decoders on the
PyTorch model (:mod:`model.nn.engines`), the only engines that import torch.
"openai-chat" runs no model here: :class:`model.openai_chat.OpenAIChatGenerator` streams
the reply from an OpenAI-compatible chat-completions server (vLLM, llama.cpp's, a hosted
API).

Building an exported model directory is build-time work (:mod:`export.build`); this
module only loads a directory that is already complete.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from model.ar import ARGenerator, AROptions
from model.backend import StepBackend
from model.batch import (
    NARROW,
    SHAPES,
    BatchedBackend,
    BatchRunner,
    CachePool,
    StepLoop,
    host_key,
    host_shape,
)
from model.diffusion_engine import (
    DiffusionGenerator,
    DiffusionOptions,
    served_options,
    smollm2_diffusion_config,
)
from model.engine import TextGenerator
from model.modeldir import (
    FILES,
    SHIPPED_ADAPTER,
    Variant,
    adapter_calls_tools,
    batch_file,
    default_model_dir,
    is_complete,
    load_tokenizer,
    read_manifest,
    rows_file,
    shipped_adapter,
)
from model.openai_chat import ChatServerOptions, OpenAIChatGenerator
from model.prefix import PrefixCache
from model.router import ADAPTER_DIRS, find_router, fitted_places
from model.runtime import (
    INTEGER_PRODUCT_RECIPES,
    Device,
    IntegerProductError,
    OrtBackend,
    RuntimeConfig,
    choose_providers,
    grown_capacity,
    integer_product_exact,
)
from model.schedule import (
    Schedule,
    host_kernel,
    host_schedule,
    measure_kernel_costs,
    sampler_for,
)
from model.spans import find_spans

log = logging.getLogger("quicksilver")

EngineName = Literal["diffusion-onnx", "diffusion", "smollm2-ar-onnx", "smollm2-ar", "openai-chat"]
ENGINES: tuple[EngineName, ...] = get_args(EngineName)
ONNX_ENGINES: tuple[EngineName, ...] = ("smollm2-ar-onnx", "diffusion-onnx")
# The diffusion engine on the int8 graph of base + shipped adapter: its held-out replies
# meet the quality bar as served (docs/training.md, "Quality").
DEFAULT_ENGINE: EngineName = "diffusion-onnx"


def reply_on_cpu(engine: EngineName, device: Device = "auto") -> bool:
    """Whether the reply model ``engine`` shares the CPU with Piper: the PyTorch engines
    run on it here, the ONNX ones unless ``device`` (auto: whatever ONNX Runtime offers)
    puts them on a GPU; "openai-chat" never (its model runs in the chat server, which
    pausing our reads of its stream would not pause)."""
    if engine == "openai-chat":
        return False
    if engine not in ONNX_ENGINES:
        return True
    return bool(choose_providers(device)[0] == "CPUExecutionProvider")


def serving_variant(engine: EngineName, device: Device = "auto") -> Literal["int8", "fp16"]:
    """The graph an ONNX engine serves: int8 on the CPU (its quality is validated as
    served, docs/training.md), fp16 on a GPU (the file whose attention the CUDA and
    TensorRT providers can run, docs/export.md)."""
    return "int8" if reply_on_cpu(engine, device) else "fp16"


def engine_adapter(engine: EngineName, adapter: Path | None = None) -> Path | None:
    """The adapter merged into ``engine``'s model: ``adapter``, or the shipped one, for
    diffusion."""
    if engine in ("diffusion", "diffusion-onnx") and adapter is not None:
        if not (adapter / "adapter.safetensors").is_file():
            raise FileNotFoundError(f"no adapter.safetensors in {adapter}")
        return adapter
    if engine in ("diffusion", "diffusion-onnx"):
        adapter = shipped_adapter()
        if adapter is None:
            raise FileNotFoundError(
                f"the diffusion engines need the shipped adapter in {SHIPPED_ADAPTER} "
                "(adapter.safetensors, manifest.json), and this installation lacks that "
                "package data: reinstall from a checkout (`pip install .`), or train one "
                f"there (`quicksilver train --ship {SHIPPED_ADAPTER}`, docs/training.md)"
            )
        return adapter
    return None


def engine_model_dir(
    engine: EngineName, cache_dir: Path | None = None, adapter: Path | None = None
) -> Path:
    """Where the exported model of an ONNX ``engine`` lives in the cache."""
    return default_model_dir(cache_dir, engine_adapter(engine, adapter))


def trained_for_tools(adapter: Path | None) -> bool:
    """The adapter was trained on tool calls (``quicksilver data --actions``, its
    manifest says): a session gets the default device tools only from such a model."""
    if adapter is None or not (adapter / "manifest.json").is_file():
        return False
    return adapter_calls_tools(json.loads((adapter / "manifest.json").read_text()))


Kernel = Literal["host", "blockwise", "rows"]


def load_onnx_backend(
    model_dir: Path,
    variant: Variant = "int8",
    config: RuntimeConfig | None = None,
    kernel: Kernel = "host",
) -> OrtBackend:
    """The one-reply graph of ``variant``; for int8 on a CPU, the rows graph where the
    model directory has one and this host runs it faster (:func:`host_kernel`).
    ``kernel`` "blockwise" or "rows" takes that one, unmeasured (the probes' fits:
    ``quicksilver router --rows``)."""
    manifest = read_manifest(model_dir)
    name = FILES[variant]
    if name not in manifest["files"]:
        built = ", ".join(manifest["files"])
        raise FileNotFoundError(f"{model_dir} has no {variant} model ({name}); it has {built}")
    rows = rows_file(model_dir, variant)
    if kernel == "rows":
        if rows is None:
            raise FileNotFoundError(
                f"{model_dir} has no rows graphs: build them with `quicksilver export "
                "--rows-graphs`"
            )
        backend = OrtBackend(rows, config, name=f"onnx-{variant}", rows=True)
        _check_integer_product(backend, manifest)
        return backend
    backend = OrtBackend(model_dir / name, config, name=f"onnx-{variant}")
    _check_integer_product(backend, manifest)
    if kernel == "blockwise" or variant != "int8" or backend.device != "cpu" or rows is None:
        return backend
    if not integer_product_exact():
        log.info(
            "int8 kernel: the blockwise files (ONNX Runtime's integer product, which the "
            "rows graphs use, saturates on this CPU: it has no VNNI)"
        )
        return backend
    if not fitted_for_rows(model_dir):
        log.info(
            "int8 kernel: the blockwise files (the rows graphs need the router and span "
            "pointers fitted on them, in %s)",
            ", ".join(str(p) for p in fitted_places(ADAPTER_DIRS, True)),
        )
        return backend
    loaded: list[OrtBackend] = []  # the rows graph, once loaded (only to be timed or served)

    def twin() -> OrtBackend:
        if not loaded:
            loaded.append(OrtBackend(rows, config, name=f"onnx-{variant}", rows=True))
        return loaded[0]

    def measure() -> dict[str, float]:
        kernels = {}
        for single in (backend, twin()):
            found = batch_file(model_dir, variant, rows=single.rows)
            runner = None if found is None else BatchRunner(single, found[0])
            kernels["rows" if single.rows else "blockwise"] = (single, runner)
        return measure_kernel_costs(kernels)

    chosen, measured = host_kernel(model_dir, host_key(backend.providers), measure)
    log.info("int8 kernel on this host%s: %s", " (measured now)" if measured else "", chosen.why())
    return twin() if chosen.rows else backend


def _check_integer_product(backend: OrtBackend, manifest: dict[str, Any]) -> None:
    """Refuse ``backend`` where its file (its int8 recipe in the model directory's
    ``manifest``) multiplies with ONNX Runtime's integer product and this CPU's is not
    exact: its logits would be wrong, every reply with them."""
    entry = manifest["files"].get(backend.path.name) or {}
    recipe = (entry.get("quantisation") or {}).get("method")
    if recipe not in INTEGER_PRODUCT_RECIPES or backend.device != "cpu":
        return
    if integer_product_exact():
        return
    fix = {
        "rows": "serve the blockwise files (the host's choice; `quicksilver router` and "
        "`spans` without `--rows`)",
        "dynamic": "rebuild the model directory with `quicksilver export --int8-method "
        "blockwise` (the default)",
    }[recipe]
    raise IntegerProductError(
        f"{backend.path} multiplies with ONNX Runtime's integer product, which saturates "
        f"on this CPU (it has no VNNI: 16-bit sums of u8 x s8 pairs), so its logits would "
        f"be wrong here: {fix}"
    )


def fitted_for_rows(model_dir: Path, places: Sequence[Path] = ADAPTER_DIRS) -> bool:
    """Every probe fitted for ``model_dir``'s adapter in ``places`` (router, span
    pointers) has its twin fitted on the rows graphs: a probe reads the states it was
    fitted on."""
    return all(
        find(model_dir, places) is None or find(model_dir, places, rows=True) is not None
        for find in (find_router, find_spans)
    )


@dataclass(frozen=True)
class Batching:
    """How replies share the model (``model/batch.py``). ``rows`` None: the model
    directory's batched graph, when it has one; 0 or 1: one reply's step per pass.
    ``kv_cache_mb`` None: room for every live reply and every kept conversation."""

    rows: int | None = None
    kv_cache_mb: float | None = None
    # the diffusion engine's block width (None: the host's schedule, model/schedule.py);
    # it decides each step's width, so what a pass holds
    block_size: int | None = None


def served_backend(
    single: OrtBackend,
    model_dir: Path,
    variant: Variant,
    batching: Batching | None,
    kept: int,
    cache_len: int | None = None,
    wide: bool = False,
) -> StepBackend:
    """What an engine runs on: ``single``, or with ``batching`` its model behind the step
    loop (:func:`shared_backend`). ``kept``: the conversations the engine keeps;
    ``cache_len``: positions a reply's cache needs (None: the backend's whole length)."""
    if batching is None:
        return single
    per_cache = grown_capacity(cache_len or single.max_len, single.max_len)
    shared = shared_backend(single, model_dir, variant, batching, kept, per_cache, wide)
    return shared or single


def give_way(backend: StepBackend, kept: PrefixCache) -> None:
    """Kept conversations give their caches up when live replies need the pool."""
    if isinstance(backend, BatchedBackend) and backend.pool is not None:
        backend.pool.evict = kept.evict_oldest


def shared_backend(
    single: OrtBackend,
    model_dir: Path,
    variant: Variant,
    batching: Batching,
    kept: int,
    per_cache: int,
    wide: bool = False,
) -> BatchedBackend | None:
    """``single``'s model behind a :class:`StepLoop` of the directory's batched graph,
    its caches in one :class:`CachePool` (None: no batched graph, or batching off).
    Left to itself (``batching.rows`` None), an engine whose steps are ``wide``
    (diffusion blocks) takes the loop only where such steps share a pass on this host:
    where they run one a pass (a CPU without cheap wide passes), replies stay one at a
    time, as the voice loop measured better end to end there (docs/latency.md)."""
    found = batch_file(model_dir, variant, rows=single.rows)
    if batching.rows is not None and batching.rows < 2:
        return None
    if found is None:
        if batching.rows is not None:
            raise FileNotFoundError(
                f"{model_dir} has no batched {variant} graph: rebuild it with "
                "`quicksilver export`, or serve with --reply-batch 1"
            )
        return None
    path, rows = found
    if batching.rows is not None and batching.rows > rows:
        raise ValueError(f"--reply-batch {batching.rows}: {path.name} holds {rows} rows")
    runner = BatchRunner(single, path, single.threads)
    shape, measured = host_shape(runner, model_dir)
    log.info(
        "reply passes on this host%s: up to %d wide and %d narrow steps a pass (%s)",
        " (measured now)" if measured else "",
        shape.wide,
        shape.narrow,
        model_dir / SHAPES,
    )
    if batching.rows is None and wide and shape.wide < 2:
        log.info("replies one at a time: this host runs one diffusion block a pass")
        return None
    loop = StepLoop(runner, shape=shape)
    L, n_kv, hd = single.dims
    position_bytes = L * 2 * n_kv * hd * single.dtype.itemsize
    if batching.kv_cache_mb is None:
        budget = (kept + rows) * per_cache
    else:
        budget = int(batching.kv_cache_mb * 2**20 // position_bytes)
    return BatchedBackend(loop, CachePool(budget))


def load_onnx_ar_generator(
    model_dir: Path,
    variant: Variant = "int8",
    config: RuntimeConfig | None = None,
    options: AROptions | None = None,
    batching: Batching | None = None,
) -> ARGenerator:
    """The AR engine; with ``batching``, its one-token steps share passes (narrow rows:
    on a CPU, several cost little more than one)."""
    options = options or AROptions()
    single = load_onnx_backend(model_dir, variant, config)
    backend = served_backend(single, model_dir, variant, batching, options.cache_sessions)
    gen = ARGenerator(backend, load_tokenizer(model_dir), options, "smollm2-ar-onnx")
    give_way(backend, gen.prefixes)
    return gen


def load_onnx_diffusion_generator(
    model_dir: Path,
    variant: Variant = "int8",
    config: RuntimeConfig | None = None,
    batching: Batching | None = None,
    kernel: Kernel = "host",
) -> DiffusionGenerator:
    """The served diffusion engine; with ``batching``, every reply's steps go through
    one step loop that shares passes between them (``model/batch.py``). ``kernel``: as
    :func:`load_onnx_backend`."""
    options = served_options(read_manifest(model_dir).get("source", {}).get("adapter"))
    asked = batching.block_size if batching is not None else None
    if asked is not None:
        options = with_block_size(options, asked)
    config = config or RuntimeConfig(max_len=options.cache_len)
    single = load_onnx_backend(model_dir, variant, config, kernel)
    schedule = Schedule(asked) if asked is not None else host_schedule(single, model_dir)[0]
    log.info("diffusion replies on this host: %s", schedule.why())
    options = with_block_size(options, schedule.block_size)
    kept, cache_len = options.cache_sessions, options.cache_len
    wide = options.sampler.block_size > NARROW
    backend = served_backend(single, model_dir, variant, batching, kept, cache_len, wide)
    tok = load_tokenizer(model_dir)
    model = smollm2_diffusion_config(tok)
    gen = DiffusionGenerator(backend, tok, model, options, name="diffusion-onnx")
    give_way(backend, gen.prefixes)
    gen.router = find_router(model_dir, vocab=backend.vocab_size, rows=single.rows)
    gen.spans = find_spans(model_dir, vocab=backend.vocab_size, rows=single.rows)
    return gen


def with_block_size(options: DiffusionOptions, block_size: int) -> DiffusionOptions:
    """``options`` decoding in blocks of ``block_size`` (the cache length follows), ending
    replies as that schedule does (:func:`model.schedule.sampler_for`)."""
    return dataclasses.replace(options, sampler=sampler_for(options.sampler, block_size))


def load_generator(
    engine: EngineName,
    cache_dir: Path | None = None,
    device: Device = "auto",
    chat: ChatServerOptions | None = None,
    adapter: Path | None = None,
    batching: Batching | None = None,
) -> TextGenerator:
    """The blocking generator of ``engine``. An ONNX engine's model directory must be
    complete (``quicksilver serve`` builds it on first start, :mod:`export.build`);
    "openai-chat" needs ``chat``, the server it asks."""
    if engine == "openai-chat":
        if chat is None:
            raise ValueError("the openai-chat engine needs a chat server's URL and model name")
        return OpenAIChatGenerator(chat)
    if engine == "smollm2-ar":
        from model.nn.engines import load_ar_generator  # PyTorch

        return load_ar_generator()
    if engine == "diffusion":
        from model.nn.engines import load_diffusion_generator  # PyTorch

        return load_diffusion_generator(adapter=engine_adapter(engine, adapter))
    if engine not in ONNX_ENGINES:
        raise ValueError(f"unknown reply engine {engine!r}; choose one of {', '.join(ENGINES)}")
    variant = serving_variant(engine, device)
    model_dir = engine_model_dir(engine, cache_dir, adapter)
    if not is_complete(model_dir, variant):
        raise FileNotFoundError(
            f"no exported {variant} model in {model_dir}: `quicksilver serve` builds it on "
            "first start, or `quicksilver export --out DIR` where PyTorch is installed"
        )
    if engine == "smollm2-ar-onnx":
        config = RuntimeConfig(device=device)
        return load_onnx_ar_generator(model_dir, variant, config, batching=batching or Batching())
    cache_len = DiffusionOptions().cache_len
    config = RuntimeConfig(device=device, max_len=cache_len)
    return load_onnx_diffusion_generator(model_dir, variant, config, batching or Batching())
