"""The rows graphs (export/rows_graph.py): the int8 files' layer products quantised per
row, one reply's graph and the batched one; served where the host runs them faster
(model.schedule.host_kernel), with the probes fitted on them (model.assemble)."""

from __future__ import annotations

import json
import platform
import shutil
from pathlib import Path

import numpy as np
import pytest

from export.build import BuildOptions, build_atomic
from model.assemble import fitted_for_rows, load_onnx_backend
from model.batch import BatchRunner, Request, host_key
from model.modeldir import (
    BATCH_FILES,
    MANIFEST,
    ROWS_BATCH_FILES,
    ROWS_FILES,
    batch_file,
    read_manifest,
    rows_file,
)
from model.router import ROUTER_FILE, ROWS_DIR
from model.runtime import (
    IntegerProductError,
    OrtBackend,
    OrtCache,
    RuntimeConfig,
    integer_product_exact,
)
from model.schedule import KERNELS, Kernel, host_kernel
from tests.export.conftest import TINY, ort_backend, tiny_source
from tests.model.test_router import a_router
from training.precision import cpu_flags

VOCAB = TINY.vocab_size


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's int8 export with the rows graphs beside it."""
    out = tmp_path_factory.mktemp("tiny-rows") / "model"
    return build_atomic(out, BuildOptions(rows_graphs=True, check=False, bits=8), tiny_source())


def rows_backend(tiny_dir: Path) -> OrtBackend:
    path = rows_file(tiny_dir, "int8")
    assert path is not None
    return OrtBackend(path, RuntimeConfig(device="cpu"), rows=True)


def prefill(backend: OrtBackend, ids: np.ndarray, chunks: tuple[int, ...] = ()) -> np.ndarray:
    """The last row's logits of ``ids`` committed to a new cache, in ``chunks``."""
    cache, at, logits = backend.new_cache(), 0, np.empty(0)
    for n in (*chunks, len(ids) - sum(chunks)):
        logits = backend.step(cache, ids[at : at + n], "causal", commit=True)
        at += n
    return logits[-1]


def test_the_build_writes_both_rows_graphs_beside_the_int8_files(tiny_dir: Path) -> None:
    files = read_manifest(tiny_dir)["files"]
    for name in (ROWS_FILES["int8"], ROWS_BATCH_FILES["int8"]):
        assert files[name]["quantisation"] == {"method": "rows", "bits": 8, "smooth_alpha": 0.5}
    assert rows_file(tiny_dir, "int8") == tiny_dir / ROWS_FILES["int8"]
    assert rows_file(tiny_dir, "fp16") is None
    found, blockwise = batch_file(tiny_dir, "int8", rows=True), batch_file(tiny_dir, "int8")
    assert found is not None and blockwise is not None
    assert found == (tiny_dir / ROWS_BATCH_FILES["int8"], blockwise[1])


def test_the_default_build_has_no_rows_graphs(tmp_path: Path) -> None:
    plain = build_atomic(tmp_path / "m", BuildOptions(check=False), tiny_source())
    assert rows_file(plain, "int8") is None and batch_file(plain, "int8", rows=True) is None


def test_the_rows_graph_is_near_the_fp32_file(tiny_dir: Path) -> None:
    ids = np.random.default_rng(0).integers(0, VOCAB, 40)
    fp32 = prefill(ort_backend(tiny_dir), ids)
    blockwise = prefill(ort_backend(tiny_dir, "model.int8.onnx"), ids)
    rows = prefill(rows_backend(tiny_dir), ids)
    assert not np.array_equal(rows, blockwise)  # another graph
    scale = float(np.abs(fp32).max())
    assert np.abs(blockwise - fp32).max() < 0.05 * scale
    if integer_product_exact():
        assert np.abs(rows - fp32).max() < 0.05 * scale, np.abs(rows - fp32).max() / scale
    else:  # its products saturate on this CPU: it is never served here
        with pytest.raises(IntegerProductError):
            load_onnx_backend(tiny_dir, "int8", RuntimeConfig(device="cpu"), kernel="rows")


def test_a_row_s_logits_do_not_depend_on_the_rows_beside_it(tiny_dir: Path) -> None:
    """Scales per row: a prompt in one step or in chunks, or followed by other words,
    gives its rows the same logits."""
    backend = rows_backend(tiny_dir)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, VOCAB, 32)
    whole = prefill(backend, ids)
    np.testing.assert_allclose(prefill(backend, ids, (8, 16)), whole, atol=1e-5)
    longer = np.concatenate([ids, rng.integers(0, VOCAB, 9)])
    cache = backend.new_cache()
    rows = backend.step(cache, longer, "causal", commit=True, rows=np.array([len(ids) - 1]))
    np.testing.assert_allclose(rows[0], whole, atol=1e-5)


def test_a_reply_s_step_in_the_rows_batched_graph_gets_what_it_gets_alone(
    tiny_dir: Path,
) -> None:
    """One-token steps, a prompt chunk and a diffusion block of three replies in one
    pass of the rows batched graph: each gets the logits the rows graph gives it alone,
    so which replies share a pass never changes a reply."""
    found = batch_file(tiny_dir, "int8", rows=True)
    assert found is not None
    runner = BatchRunner(rows_backend(tiny_dir), found[0])
    single, rng = runner.single, np.random.default_rng(3)
    pasts = [rng.integers(0, VOCAB, n) for n in (6, 0, 9, 5)]
    chunks = [rng.integers(0, VOCAB, n) for n in (1, 24, 1, 4)]
    attends = ["causal", "causal", "causal", "block"]

    def caches() -> list[OrtCache]:
        out = []
        for past in pasts:
            cache = single.new_cache()
            if len(past):
                single.step(cache, past, "causal", commit=True)
            out.append(cache)
        return out

    steps = list(zip(caches(), chunks, attends, strict=True))
    alone = [single.step(c, x, a, a == "causal") for c, x, a in steps]  # type: ignore[arg-type]
    requests = [
        Request((False, 0), i, c, x, a, a == "causal", np.arange(len(x)))  # type: ignore[arg-type]
        for i, (c, x, a) in enumerate(zip(caches(), chunks, attends, strict=True))
    ]
    for a, b in zip(alone, runner.run(requests), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_the_host_s_kernel_is_measured_once_and_kept_in_the_model_dir(
    tiny_dir: Path, tmp_path: Path
) -> None:
    for name in (MANIFEST, ROWS_FILES["int8"]):
        shutil.copy(tiny_dir / name, tmp_path / name)
    key = host_key(["CPUExecutionProvider"])
    costs = {"blockwise 1": 2.0, "blockwise 32": 9.0, "rows 1": 2.5, "rows 32": 4.0}
    asked = []

    def measure() -> dict[str, float]:
        asked.append(1)
        return costs

    kernel, measured = host_kernel(tmp_path, key, measure)
    assert (kernel.rows, measured, len(asked)) == (True, True, 1)  # 6.5 ms against 11
    kept = json.loads((tmp_path / KERNELS).read_text())
    assert kept == {key: {"kernel": "rows", "costs_ms": costs}}
    kept[key]["costs_ms"]["rows 32"] = 9.5  # what is kept decides, not measured again
    (tmp_path / KERNELS).write_text(json.dumps(kept))
    kernel, measured = host_kernel(tmp_path, key, measure)
    assert (kernel.rows, measured, len(asked)) == (False, False, 1)
    assert "blockwise" in kernel.why() and "rows: 1 2.5, 32 9.5" in kernel.why()
    # a directory without rows graphs keeps the blockwise files, unmeasured
    (tmp_path / ROWS_FILES["int8"]).unlink()
    assert host_kernel(tmp_path, key, measure) == (Kernel(False), False)
    assert len(asked) == 1


def test_the_measured_passes_are_timed_on_both_kernels(tiny_dir: Path) -> None:
    """What ``load_onnx_backend`` measures on a host's first start, from the real files."""
    from model.schedule import measure_kernel_costs

    kernels = {}
    for single in (ort_backend(tiny_dir, "model.int8.onnx"), rows_backend(tiny_dir)):
        found = batch_file(tiny_dir, "int8", rows=single.rows)
        assert found is not None
        kernels["rows" if single.rows else "blockwise"] = (single, BatchRunner(single, found[0]))
    costs = measure_kernel_costs(kernels, repeats=1, cached=8)
    assert set(costs) == {f"{k} {p}" for k in kernels for p in ("1", "32", "8x1")}
    assert all(v > 0 for v in costs.values())


@pytest.fixture
def exact_product(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host whose integer product is exact (VNNI, AMX), whatever this one is: what
    the host chooses between is tested apart from the probe (tested below)."""
    monkeypatch.setattr("model.assemble.integer_product_exact", lambda: True)


def test_the_integer_product_probe_agrees_with_the_cpu(tiny_dir: Path) -> None:
    """ONNX Runtime's u8 x s8 product is exact where the CPU has VNNI or AMX and
    saturates without (MLAS's VPMADDUBSW path): the probe says which this host is."""
    flags = cpu_flags()
    if platform.machine() not in ("x86_64", "AMD64") or flags is None:
        pytest.fail("the probe's expectation is known for x86-64 Linux hosts only")
    assert integer_product_exact() == bool(flags & {"avx512_vnni", "avx_vnni", "amx_int8"})


def test_a_host_whose_integer_product_saturates_never_serves_the_rows_graphs(
    tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a CPU without VNNI the rows graphs' products are wrong: the host serves the
    blockwise files without timing the rows graphs, and asking for them is an error
    that says why; a quantize_dynamic file is refused the same way."""
    monkeypatch.setattr("model.assemble.integer_product_exact", lambda: False)
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_dir, model_dir)
    config = RuntimeConfig(device="cpu")
    backend = load_onnx_backend(model_dir, "int8", config)
    assert (backend.rows, backend.path.name) == (False, "model.int8.onnx")
    assert not (model_dir / KERNELS).exists()  # nothing timed, nothing kept
    with pytest.raises(IntegerProductError, match=r"saturates on this CPU.*blockwise"):
        load_onnx_backend(model_dir, "int8", config, kernel="rows")
    manifest = read_manifest(model_dir)
    manifest["files"]["model.int8.onnx"]["quantisation"] = {"method": "dynamic"}
    (model_dir / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(IntegerProductError, match="--int8-method blockwise"):
        load_onnx_backend(model_dir, "int8", config)


@pytest.mark.usefixtures("exact_product")
def test_the_server_loads_the_kernel_the_host_chose(tiny_dir: Path, tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_dir, model_dir)
    key = host_key(["CPUExecutionProvider"])
    config = RuntimeConfig(device="cpu")
    for rows in (True, False):
        costs = {"blockwise 1": 3.0, "rows 1": 2.0 if rows else 4.0}
        (model_dir / KERNELS).write_text(json.dumps({key: {"costs_ms": costs}}))
        backend = load_onnx_backend(model_dir, "int8", config)
        assert backend.rows is rows
        assert backend.path.name == (ROWS_FILES if rows else {"int8": "model.int8.onnx"})["int8"]
        found = batch_file(model_dir, "int8", rows=backend.rows)
        assert found is not None
        assert found[0].name == (ROWS_BATCH_FILES if rows else BATCH_FILES)["int8"]


def test_the_rows_graphs_serve_only_with_probes_fitted_on_them(tmp_path: Path) -> None:
    """A router fitted on the blockwise files' states reads the rows graphs' a little
    off (docs/export.md): where an adapter has one, the rows graphs need their own."""
    place = tmp_path / "adapter"
    place.mkdir()
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    adapter = {"weights": {"sha256": "mine"}}
    (model_dir / MANIFEST).write_text(json.dumps({"source": {"adapter": adapter}}))
    assert fitted_for_rows(model_dir, [place])  # nothing fitted: nothing to refit
    a_router("timer.cancel()", sha="mine").save(place / ROUTER_FILE)
    assert not fitted_for_rows(model_dir, [place])
    (place / ROWS_DIR).mkdir()
    a_router("timer.cancel()", sha="mine").save(place / ROWS_DIR / ROUTER_FILE)
    assert fitted_for_rows(model_dir, [place])


@pytest.mark.usefixtures("exact_product")
def test_a_kernel_asked_for_is_loaded_unmeasured(tiny_dir: Path, tmp_path: Path) -> None:
    """What the probes' fits read (``quicksilver router --rows``): the kernel asked for,
    whatever the host would choose; asking for rows graphs a directory lacks is an error."""
    config = RuntimeConfig(device="cpu")
    rows = load_onnx_backend(tiny_dir, "int8", config, kernel="rows")
    blockwise = load_onnx_backend(tiny_dir, "int8", config, kernel="blockwise")
    assert (rows.rows, rows.path.name) == (True, ROWS_FILES["int8"])
    assert (blockwise.rows, blockwise.path.name) == (False, "model.int8.onnx")
    plain = build_atomic(tmp_path / "m", BuildOptions(check=False), tiny_source())
    with pytest.raises(FileNotFoundError, match="--rows-graphs"):
        load_onnx_backend(plain, "int8", config, kernel="rows")
