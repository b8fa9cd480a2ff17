"""OrtBackend keeps the StepBackend semantics of TorchBackend: the same tests, both."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from model.backend import StepBackend
from model.generate import greedy
from model.runtime import ProviderUnavailableError, cache_device, choose_providers
from model.sampler import Rule
from tests.export.conftest import TINY, ort_backend, torch_backend


@pytest.fixture(params=["torch", "onnx", "onnx-plain"])
def b(request: pytest.FixtureRequest, tiny_ref) -> StepBackend:
    """The StepBackend contract tests, for TorchBackend and OrtBackend alike, the latter
    on both attention forms (export/graph.py)."""
    if request.param == "torch":
        return torch_backend(tiny_ref, 32)
    if request.param == "onnx-plain":
        plain = request.getfixturevalue("tiny_plain")
        return ort_backend(plain.parent, plain.name, max_len=32)
    return ort_backend(request.getfixturevalue("tiny_dir"), max_len=32)


def test_step_matches_one_pass_and_commit_grows_the_cache(b: StepBackend) -> None:
    ids = np.array([3, 9, 4, 7, 1], np.int64)
    full = b.step(b.new_cache(), ids, "causal", commit=False)
    cache = b.new_cache()
    first = b.step(cache, ids[:3], "causal", commit=True)
    assert b.cache_length(cache) == 3
    rest = b.step(cache, ids[3:], "causal", commit=True)
    assert b.cache_length(cache) == 5
    np.testing.assert_allclose(np.concatenate([first, rest]), full, atol=1e-5)


def test_uncommitted_block_steps_leave_the_cache_alone_and_truncate_rolls_back(
    b: StepBackend,
) -> None:
    cache = b.new_cache()
    b.step(cache, np.array([1, 2, 3], np.int64), "causal", commit=True)
    block = np.array([5, 6], np.int64)
    a = b.step(cache, block, "block", commit=False)
    again = b.step(cache, block, "block", commit=False)
    assert b.cache_length(cache) == 3
    np.testing.assert_array_equal(a, again)
    first = b.step(cache, block, "block", commit=False, rows=[0])  # only the rows asked for
    np.testing.assert_allclose(first, a[:1], atol=1e-5)
    last = b.step(cache, block, "block", commit=True, rows=[1])
    np.testing.assert_allclose(last, a[-1:], atol=1e-5)
    assert b.cache_length(cache) == 5
    b.truncate(cache, 3)
    np.testing.assert_allclose(b.step(cache, block, "block", commit=False), a, atol=1e-5)
    with pytest.raises(ValueError):
        b.truncate(cache, 4)


def test_block_attention_differs_from_causal_inside_the_chunk(b: StepBackend) -> None:
    cache = b.new_cache()
    b.step(cache, np.array([1, 2], np.int64), "causal", commit=True)
    ids = np.array([7, 8, 9], np.int64)
    causal = b.step(cache, ids, "causal", commit=False)
    block = b.step(cache, ids, "block", commit=False)
    assert not np.allclose(causal[0], block[0])
    np.testing.assert_allclose(b.step(cache, ids[:1], "block", commit=False), causal[:1], atol=1e-5)


def test_a_full_cache_is_an_error(b: StepBackend) -> None:
    cache = b.new_cache()
    b.step(cache, np.arange(30, dtype=np.int64), "causal", commit=True)
    with pytest.raises(ValueError, match="full"):
        b.step(cache, np.arange(3, dtype=np.int64), "causal", commit=True)


def test_greedy_gives_the_same_tokens_on_both(tiny_dir: Path, tiny_ref) -> None:
    prompt = [5, 17, 42, 7, 99, 3]
    a = list(greedy(torch_backend(tiny_ref), prompt, 20, ()))
    b = list(greedy(ort_backend(tiny_dir), prompt, 20, ()))
    assert a == b and len(a) == 20


@pytest.mark.parametrize("rule", ["threshold", "lowconf"])
def test_the_diffusion_sampler_samples_the_same_tokens_on_both(
    tiny_dir: Path, tiny_ref, rule: Rule
) -> None:
    from model.sampler import DiffusionConfig, SamplerSettings, sample

    model = DiffusionConfig(mask_id=300, end_ids=frozenset({2}), attention="block", shift=True)
    # lowconf commits 2 of 8 per step, most confident first
    s = SamplerSettings(block_size=8, rule=rule, steps_per_block=4)
    prompt = [5, 17, 42, 7, 99, 3]
    a = list(sample(torch_backend(tiny_ref), prompt, model, s, np.random.default_rng(0), 24))
    b = list(sample(ort_backend(tiny_dir), prompt, model, s, np.random.default_rng(0), 24))
    assert a == b and len(a) > 0


@pytest.fixture(params=["fused", "plain"])
def graph(request: pytest.FixtureRequest) -> Path:
    """The tiny model's fp32 step graph in each attention form (export/graph.py)."""
    if request.param == "plain":
        path: Path = request.getfixturevalue("tiny_plain")
        return path
    return Path(request.getfixturevalue("tiny_dir")) / "model.onnx"


def test_the_cache_buffers_grow_past_their_first_size_and_keep_the_prefix(
    graph: Path, tiny_ref
) -> None:
    from model.runtime import GROW

    t, o = torch_backend(tiny_ref, 600), ort_backend(graph.parent, graph.name, max_len=600)
    tc, oc = t.new_cache(), o.new_cache()
    ids = np.random.default_rng(0).integers(0, 300, 600)
    np.testing.assert_allclose(
        o.step(oc, ids[:250], "causal", commit=True, rows=[249]),
        t.step(tc, ids[:250], "causal", commit=True, rows=[249]),
        atol=1e-4,
    )
    assert oc.capacity == GROW
    for lo in range(250, 250 + 16 * 18, 16):  # committed blocks across 256 and 512
        block = ids[lo : lo + 16]
        for b, c in ((t, tc), (o, oc)):
            b.step(c, block, "block", commit=False)  # written past the prefix, not kept
        np.testing.assert_allclose(
            o.step(oc, block, "block", commit=True),
            t.step(tc, block, "block", commit=True),
            atol=1e-4,
        )
    assert o.cache_length(oc) == 538 and oc.capacity == 600  # max_len caps the last growth


def test_the_buffers_are_one_ortvalue_on_the_session_device(tiny_dir: Path) -> None:
    o = ort_backend(tiny_dir, max_len=600)
    oc = o.new_cache()
    o.step(oc, np.arange(300, dtype=np.int64) % 250, "causal", commit=True)
    assert o.device == "cpu" and oc.buffers.device_name() == "cpu"
    # on the CPU the numpy view is the memory the graph reads and writes
    assert oc.buffers.numpy().ctypes.data == oc.buffers.data_ptr()
    assert cache_device(["CUDAExecutionProvider", "CPUExecutionProvider"]) == "cuda"
    assert cache_device(["TensorrtExecutionProvider", "CUDAExecutionProvider"]) == "cuda"
    assert cache_device(["CPUExecutionProvider"]) == cache_device([]) == "cpu"


def test_an_older_step_graph_is_refused_by_name(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    from model.runtime import OrtBackend, RuntimeConfig

    x = helper.make_tensor_value_info("past_keys", TensorProto.FLOAT, ["P", 2, 2, 8])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["P", 2, 2, 8])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["past_keys"], ["logits"])], "v3", [x], [y]
    )
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx"
    )
    with pytest.raises(ValueError, match=r"older step graph.*quicksilver export"):
        OrtBackend(tmp_path / "m.onnx", RuntimeConfig(device="cpu"))


def test_every_layer_attends_through_one_fused_node_on_its_own_buffers(tiny_dir: Path) -> None:
    import onnx

    graph = onnx.load(str(tiny_dir / "model.onnx")).graph
    fused = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    assert len(fused) == TINY.n_layer
    for layer, node in enumerate(fused):
        assert node.domain == "com.microsoft"
        assert list(node.input[3:5]) == [f"past_key_{layer}", f"past_value_{layer}"]
        assert list(node.output[1:]) == [f"present_key_{layer}", f"present_value_{layer}"]
    # the buffers go nowhere else: nothing splits, concatenates or copies them
    buffers = {i.name for i in graph.input if i.name.startswith(("past_key_", "past_value_"))}
    assert [n for n in graph.node if buffers & set(n.input)] == fused


def test_the_plain_graph_writes_each_buffer_with_one_scatter_and_no_fused_kernel(
    tiny_plain: Path,
) -> None:
    """The GPU form: standard operators only, so CUDA and TensorRT can run all of it."""
    import onnx

    graph = onnx.load(str(tiny_plain)).graph
    assert all(n.domain in ("", "ai.onnx") for n in graph.node)
    for layer in range(TINY.n_layer):
        for kv in ("key", "value"):
            readers = [n for n in graph.node if f"past_{kv}_{layer}" in n.input]
            writes = [n for n in readers if n.op_type != "Shape"]  # Shape: the capacity only
            assert [n.op_type for n in writes] == ["ScatterElements"]
            assert list(writes[0].output) == [f"present_{kv}_{layer}"]


def test_replies_on_one_session_in_parallel_threads_keep_their_own_buffers(
    tiny_dir: Path,
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    b = ort_backend(tiny_dir, max_len=300)  # one session; a binding per reply's cache
    prompts = [[5, 17, 42, 7], [99, 3, 1], [250, 251, 252, 253, 254], [8] * 40]
    alone = [list(greedy(b, p, 250, ())) for p in prompts]  # 40 + 250 > 256: growth too
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda p: list(greedy(b, p, 250, ())), prompts * 3))
    assert together == alone * 3


def test_providers_by_availability_and_configuration() -> None:
    gpu = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    assert choose_providers("auto", gpu) == gpu
    assert choose_providers("cuda", gpu) == gpu[1:]
    assert choose_providers("cpu", gpu) == ["CPUExecutionProvider"]
    assert choose_providers("auto", ["CPUExecutionProvider"]) == ["CPUExecutionProvider"]
    with pytest.raises(ProviderUnavailableError, match="CUDAExecutionProvider is not available"):
        choose_providers("cuda", ["CPUExecutionProvider"])


def test_threads_stop_spinning_when_a_pass_returns(tiny_dir: Path) -> None:
    """Spinning between passes took the cores from Piper (docs/latency.md)."""
    options = ort_backend(tiny_dir, max_len=32).session.get_session_options()
    assert options.get_session_config_entry("session.force_spinning_stop") == "1"
