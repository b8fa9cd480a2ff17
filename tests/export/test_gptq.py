"""GPTQ's 4-bit weights: MatMulNBits' own layout, closer outputs than rounding, served."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper
from onnxruntime.capi._pybind_state import quantize_matmul_4bits

import export.build
from export.build import BuildOptions, build_atomic, quantize_int8
from export.gptq import Quantised, Table, gptq, pack, product_keys, quantise_model, weight_key
from model.modeldir import WIDE_PRODUCTS
from tests.export.conftest import tiny_source
from tests.export.test_quantize import matmul_model, run

K, N, BLOCK = 128, 64, 32


def correlated_inputs(rng: np.random.Generator, n: int = 512) -> np.ndarray:
    """Inputs whose channels move together, as a layer's do."""
    mix = rng.standard_normal((K, K)) * (rng.random(K) < 0.2)  # a few shared directions
    return (rng.standard_normal((n, K)) @ (np.eye(K) + mix)).astype(np.float32)


def hessian(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(2 * x.T.astype(np.float64) @ x / len(x))


def test_with_independent_inputs_gptq_is_matmulnbits_rounding_in_its_layout() -> None:
    """Nothing to spread the error over and each block's whole range: GPTQ rounds as
    ONNX Runtime's quantiser does, and the packed codes, scales and zero points are the
    quantiser's byte for byte. Shrinking the ranges rounds the weights closer."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((N, K)).astype(np.float32)
    w[3] = np.abs(w[3])  # a row with no negative weight: the zero point is code 0
    eye = torch.eye(K, dtype=torch.float64)
    q = gptq(torch.from_numpy(w), eye, BLOCK, search=False)
    shrunk = gptq(torch.from_numpy(w), eye, BLOCK).dequantised(BLOCK)
    assert np.square(shrunk - w).sum() < 0.95 * np.square(q.dequantised(BLOCK) - w).sum()
    packed = np.zeros((N, K // BLOCK, BLOCK // 2), np.uint8)
    scales = np.zeros((N, K // BLOCK), np.float32)
    zeros = np.zeros((N, (K // BLOCK + 1) // 2), np.uint8)
    quantize_matmul_4bits(packed, np.ascontiguousarray(w.T), scales, zeros, BLOCK, N, K, False)
    mine = pack(q, BLOCK)
    assert np.array_equal(mine[0], packed) and np.array_equal(mine[2], zeros)
    np.testing.assert_allclose(mine[1], scales, rtol=1e-6)


def test_gptq_keeps_a_layers_outputs_closer_than_rounding_each_weight() -> None:
    rng = np.random.default_rng(1)
    x = correlated_inputs(rng)
    w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    want = x @ w.T
    err = {}
    for name, h in (("rounding", torch.eye(K, dtype=torch.float64)), ("gptq", hessian(x))):
        got = x @ gptq(torch.from_numpy(w), h, BLOCK).dequantised(BLOCK).T
        err[name] = float(np.square(got - want).mean())
    print(f"output MSE: {err}")
    assert err["gptq"] < 0.7 * err["rounding"]


def test_the_table_is_what_the_quantised_file_computes(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    x = correlated_inputs(rng, 64)
    w = (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32)  # as ONNX holds it
    src = matmul_model(tmp_path / "mm.onnx", w)
    q = gptq(torch.from_numpy(w.T.copy()), hessian(x), BLOCK)
    dst = quantize_int8(src, tmp_path / "mm.gptq.onnx", bits=4, table={weight_key(w): q})
    rtn = run(quantize_int8(src, tmp_path / "mm.rtn.onnx", bits=4), x)
    want = x @ q.dequantised(BLOCK).T
    got = run(dst, x)
    scale = np.abs(want).max()
    assert np.abs(got - want).max() / scale < 0.02  # int8 activations' error only
    assert np.abs(rtn - want).max() / scale > 0.05  # not the quantiser's own weights
    other = Quantised(q.codes, q.scales, q.zeros)
    with pytest.raises(ValueError, match="GPTQ has no weights"):
        quantize_int8(src, tmp_path / "x.onnx", bits=4, table={"another weight": other})


def test_a_four_bit_build_takes_gptqs_weights_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tiny model built at 4 bits on 8 calibration sequences: the manifest names
    GPTQ, and every 4-bit product of both graphs holds the table GPTQ chose for its
    fp32 weight, packed; without calibration the quantiser's own rounding. The head
    (the product that reads the embedding table) and every layer's WIDE_PRODUCTS are
    8-bit in both, and not in the table; with none wide, the head alone."""
    tables: list[Table] = []

    def spy(*args: object, **kwargs: object) -> Table:
        tables.append(quantise_model(*args, **kwargs))  # type: ignore[arg-type]
        return tables[-1]

    monkeypatch.setattr(export.build, "quantise_model", spy)
    out: dict[int, Path] = {}
    for n in (0, 8):
        options = BuildOptions(bits=4, gptq_sequences=n, batch_rows=2, check=False)
        out[n] = build_atomic(tmp_path / f"m{n}", options, tiny_source())
    (table,) = tables  # GPTQ ran for the calibrated build only
    source = tiny_source()
    wide = product_keys(source.model, WIDE_PRODUCTS)
    assert len(wide) == 2 * source.model.config.n_layer and not wide & table.keys()
    narrow = BuildOptions(bits=4, gptq_sequences=8, batch_rows=0, check=False, wide_products=())
    built = build_atomic(tmp_path / "narrow", narrow, source)
    (_, narrow_table) = tables
    assert len(narrow_table) == len(table) + len(wide)  # GPTQ chose them too
    nodes = [
        n
        for n in onnx.load(str(built / "model.int8.onnx")).graph.node
        if n.op_type == "MatMulNBits"
    ]
    assert [helper.get_node_attr_value(n, "bits") for n in nodes].count(8) == 1  # the head
    files = json.loads((out[8] / "manifest.json").read_text())["files"]
    recipe = files["model.int8.onnx"]["quantisation"]
    assert recipe["gptq"]["method"] == "gptq" and recipe["gptq"]["calibration_sequences"] == 8
    assert files["model.int8.batch.onnx"]["quantisation"] == recipe
    assert recipe["bits"] == 4 and recipe["head_bits"] == 8
    assert recipe["wide_products"] == list(WIDE_PRODUCTS)
    rounded = json.loads((out[0] / "manifest.json").read_text())["files"]
    assert "gptq" not in rounded["model.int8.onnx"]["quantisation"]
    for fp32, int8 in (
        ("model.onnx", "model.int8.onnx"),
        ("model.batch.onnx", "model.int8.batch.onnx"),
    ):
        weights = {i.name: i for i in onnx.load(str(out[8] / fp32)).graph.initializer}
        held = {i.name: i for i in onnx.load(str(out[8] / int8)).graph.initializer}
        rtn = {i.name: i for i in onnx.load(str(out[0] / int8)).graph.initializer}
        nodes = [n for n in onnx.load(str(out[8] / int8)).graph.node if n.op_type == "MatMulNBits"]
        bits = {n.name: helper.get_node_attr_value(n, "bits") for n in nodes}
        products = [n for n in nodes if bits[n.name] == 4]
        eight = [n for n in nodes if bits[n.name] == 8]
        heads = [n for n in eight if n.input[1].startswith("embed_t")]  # the tied embedding's
        assert len(heads) == 1 and len(eight) == 1 + len(wide)
        for node in eight:
            key = weight_key(numpy_helper.to_array(weights[node.input[1].removesuffix("_Q8")]))
            assert node in heads or key in wide
        assert len(products) == len(table)
        for node in products:
            w = numpy_helper.to_array(weights[node.input[1].removesuffix("_Q4")])
            b, scales, zeros = pack(table[weight_key(w)], BLOCK)
            assert np.array_equal(numpy_helper.to_array(held[node.input[1]]), b)
            assert np.array_equal(numpy_helper.to_array(held[node.input[3]]).ravel(), zeros.ravel())
            assert np.allclose(numpy_helper.to_array(held[node.input[2]]).ravel(), scales.ravel())
            assert held[node.input[1]].raw_data != rtn[node.input[1]].raw_data
