"""The prompt graph (export/prompt_graph.py): the int8 file's layer products quantised
per row, for the steps that read a prompt; chosen per host (model.schedule)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from export.build import BuildOptions, build_atomic
from model.batch import BatchRunner, Request, host_key
from model.modeldir import MANIFEST, PROMPT_FILES, batch_file, prompt_file, read_manifest
from model.runtime import PROMPT_MIN, OrtBackend, OrtCache, RuntimeConfig
from model.schedule import PROMPTS, host_prompt_kernel
from tests.export.conftest import TINY, ort_backend, tiny_source

VOCAB = TINY.vocab_size


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's int8 export with the prompt graph beside it."""
    out = tmp_path_factory.mktemp("tiny-prompt") / "model"
    return build_atomic(out, BuildOptions(prompt_graph=True, check=False), tiny_source())


def int8_with_prompt_graph(tiny_dir: Path) -> OrtBackend:
    backend = ort_backend(tiny_dir, "model.int8.onnx")
    path = prompt_file(tiny_dir, "int8")
    assert path is not None
    backend.attach_prompt_graph(path)
    return backend


def prefill(backend: OrtBackend, ids: np.ndarray, chunks: tuple[int, ...] = ()) -> np.ndarray:
    """The last row's logits of ``ids`` committed to a new cache, in ``chunks``."""
    cache, at, logits = backend.new_cache(), 0, np.empty(0)
    for n in (*chunks, len(ids) - sum(chunks)):
        logits = backend.step(cache, ids[at : at + n], "causal", commit=True)
        at += n
    return logits[-1]


def test_the_build_writes_a_prompt_graph_beside_the_int8_file(tiny_dir: Path) -> None:
    entry = read_manifest(tiny_dir)["files"][PROMPT_FILES["int8"]]
    assert entry["quantisation"] == {"method": "rows", "bits": 8, "smooth_alpha": 0.5}
    assert prompt_file(tiny_dir, "int8") == tiny_dir / PROMPT_FILES["int8"]
    assert prompt_file(tiny_dir, "fp16") is None


def test_the_default_build_has_no_prompt_graph(tiny_dir: Path, tmp_path: Path) -> None:
    """Not the default (docs/export.md): the served int8 file reads prompts too."""
    plain = build_atomic(tmp_path / "m", BuildOptions(check=False), tiny_source())
    assert prompt_file(plain, "int8") is None


def test_a_prompt_step_runs_on_the_prompt_graph_near_the_fp32_file(tiny_dir: Path) -> None:
    ids = np.random.default_rng(0).integers(0, VOCAB, 40)
    fp32 = prefill(ort_backend(tiny_dir), ids)
    blockwise = prefill(ort_backend(tiny_dir, "model.int8.onnx"), ids)
    rows = prefill(int8_with_prompt_graph(tiny_dir), ids)
    assert not np.array_equal(rows, blockwise)  # it ran on the other graph
    scale = float(np.abs(fp32).max())
    assert np.abs(rows - fp32).max() < 0.05 * scale, np.abs(rows - fp32).max() / scale
    assert np.abs(blockwise - fp32).max() < 0.05 * scale


def test_a_row_s_logits_do_not_depend_on_the_rows_beside_it(tiny_dir: Path) -> None:
    """Scales per row: a prompt in one step or in chunks, or followed by other words,
    gives its rows the same logits."""
    backend = int8_with_prompt_graph(tiny_dir)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, VOCAB, 32)
    whole = prefill(backend, ids)
    np.testing.assert_allclose(prefill(backend, ids, (PROMPT_MIN, 16)), whole, atol=1e-5)
    longer = np.concatenate([ids, rng.integers(0, VOCAB, 9)])
    cache = backend.new_cache()
    rows = backend.step(cache, longer, "causal", commit=True, rows=np.array([len(ids) - 1]))
    np.testing.assert_allclose(rows[0], whole, atol=1e-5)


def test_only_committed_causal_steps_of_a_prompt_s_width_take_the_prompt_graph(
    tiny_dir: Path,
) -> None:
    plain = ort_backend(tiny_dir, "model.int8.onnx")
    assert not plain.takes_prompt(64, "causal", True)  # nothing attached
    backend = int8_with_prompt_graph(tiny_dir)
    assert backend.takes_prompt(PROMPT_MIN, "causal", True)
    assert not backend.takes_prompt(PROMPT_MIN - 1, "causal", True)  # a decoding step
    assert not backend.takes_prompt(16, "block", False)  # a diffusion block
    assert not backend.takes_prompt(16, "causal", False)  # looked at, not kept
    # a one-token step reads the int8 file: the same logits as without the prompt graph
    ids = np.random.default_rng(2).integers(0, VOCAB, 20)
    caches = [plain.new_cache(), backend.new_cache()]
    for be, cache in zip((plain, backend), caches, strict=True):
        be.step(cache, ids[:4], "causal", commit=True)  # under PROMPT_MIN: the int8 file
    pairs = zip((plain, backend), caches, strict=True)
    one = [be.step(c, ids[4:5], "causal", True) for be, c in pairs]
    np.testing.assert_array_equal(one[0], one[1])


def test_a_prompt_step_in_a_shared_pass_gets_what_it_gets_alone(tiny_dir: Path) -> None:
    found = batch_file(tiny_dir, "int8")
    assert found is not None
    runner = BatchRunner(int8_with_prompt_graph(tiny_dir), found[0])
    single, rng = runner.single, np.random.default_rng(3)
    pasts = [rng.integers(0, VOCAB, n) for n in (6, 0, 9)]
    chunks = [rng.integers(0, VOCAB, n) for n in (1, 24, 1)]

    def caches() -> list[OrtCache]:
        out = []
        for past in pasts:
            cache = single.new_cache()
            if len(past):
                single.step(cache, past, "causal", commit=True)
            out.append(cache)
        return out

    alone = [single.step(c, x, "causal", True) for c, x in zip(caches(), chunks, strict=True)]
    requests = [
        Request((False, 0), i, c, x, "causal", True, np.arange(len(x)))
        for i, (c, x) in enumerate(zip(caches(), chunks, strict=True))
    ]
    for a, b in zip(alone, runner.run(requests), strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_host_s_prompt_kernel_is_measured_once_and_kept_in_the_model_dir(
    tiny_dir: Path, tmp_path: Path
) -> None:
    for name in (MANIFEST, PROMPT_FILES["int8"]):
        shutil.copy(tiny_dir / name, tmp_path / name)
    backend = ort_backend(tiny_dir, "model.int8.onnx")
    kernel, measured = host_prompt_kernel(backend, tmp_path)
    assert measured and set(kernel.costs_ms) == {"blockwise", "rows"}
    assert kernel.rows == (kernel.costs_ms["rows"] < kernel.costs_ms["blockwise"])
    assert (backend.prompt_session is not None) == kernel.rows
    key = host_key(backend.session.get_providers())
    kept = json.loads((tmp_path / PROMPTS).read_text())
    assert kept == {key: kernel.costs_ms}
    # what is kept decides, not measured again
    kept[key] = {"blockwise": 9.0, "rows": 3.0}
    (tmp_path / PROMPTS).write_text(json.dumps(kept))
    again = ort_backend(tiny_dir, "model.int8.onnx")
    kernel, measured = host_prompt_kernel(again, tmp_path)
    assert (kernel.rows, measured) == (True, False) and again.prompt_session is not None
    assert "prompt graph" in kernel.why()
    # a directory without a prompt graph keeps the int8 file
    (tmp_path / PROMPT_FILES["int8"]).unlink()
    bare = ort_backend(tiny_dir, "model.int8.onnx")
    kernel, measured = host_prompt_kernel(bare, tmp_path)
    assert (kernel.rows, measured, bare.prompt_session) == (False, False, None)


def test_a_file_that_is_not_this_model_s_prompt_graph_is_refused(tiny_dir: Path) -> None:
    backend = OrtBackend(tiny_dir / "model.int8.onnx", RuntimeConfig(device="cpu"))
    found = batch_file(tiny_dir, "int8")
    assert found is not None
    try:
        backend.attach_prompt_graph(found[0])
    except ValueError as exc:
        assert "not a prompt graph" in str(exc)
    else:
        raise AssertionError("a batched graph was taken as the prompt graph")
