"""The rows graphs: the int8 step graphs (one reply's and the batched) with their layer
products quantised per row.

The blockwise int8 files (``MatMulNBits``) run a one-token step near the memory floor,
but a prompt, or a pass of several replies' tokens, at ~200-600 GFLOP/s on the 2-core
CPUs: the kernel quantises activations per row and block of 32 and does not use AMX.
ONNX Runtime's integer product (``MatMulIntegerToFloat``, MLAS QGEMM: AVX-512 VNNI,
and AMX where the CPU has it) runs the same arithmetic several times faster (1.7
TFLOP/s on the AMD EPYC, 3 on the Intel Xeon with AMX), but takes one activation scale
per tensor. These graphs quantise each row themselves (its largest magnitude over 127:
``Abs``, ``ReduceMax``, per-axis ``QuantizeLinear``), hand the integer product the
rows, and scale its output back per row and per weight column. A row's result then
depends on that row alone: a prompt gives the same logits in one step or in chunks,
and a reply the same tokens alone or beside others in a batched pass. A host serves
these graphs or the blockwise files, whichever it measures faster
(``model.schedule.host_kernel``).

Per-row activation scales lose to the blockwise file on the channels whose activations
run far larger than the rest. SmoothQuant (Xiao et al., 2023) moves those ranges into
the weights: the inputs of the q/k/v and gate/up products are divided by ``s_j =
max|x_j|^a / max|w_j|^(1-a)`` (one ``Mul``) and the weights' rows multiplied by it
(``ALPHA`` 0.5; the channel maxima from the prompts below, through the fp32 graph). The
o and down products are quantised per row without it (smoothing them lost agreement
here), and the head stays blockwise (most passes read one row of logits a reply).
docs/results/2026-12-prompt-graph.md and 2026-12-rows-kernel.md have the measurements.

Numpy, onnx and ONNX Runtime only: no torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from numpy.typing import NDArray
from onnx import TensorProto, helper, numpy_helper

from model.chat import SPOKEN_SYSTEM_PROMPT, build_prompt
from model.engine import ChatMessage
from model.tokenizer import Tokenizer
from model.tools import DEFAULT_TOOLS, tools_system_prompt

ALPHA = 0.5
# Calibration: what a prompt holds (the spoken and the tools system prompts, commands,
# questions, earlier replies). None is a held-out line of data/ or a bench prompt.
CALIBRATION = (
    ("Turn the heating up a little, it's cold in here.", "Sure, I turned the heat up."),
    (
        "What time does the sun set today?",
        "I can't see the time outside, but your phone's weather app can tell you.",
    ),
    ("Play something relaxing for the drive.", "Playing some calm music for the road."),
    ("Remind me to water the plants on Sunday.", "Okay, I'll remind you on Sunday."),
    (
        "How do I get a stain out of a white shirt?",
        "Soak it in cold water with a little dish soap, then wash it as usual.",
    ),
    ("Set a timer for twelve minutes.", "Timer set for twelve minutes."),
    (
        "Why do cats purr?",
        "Cats purr when they are content, and sometimes to calm themselves down.",
    ),
    ("Send a message to Sam saying I'm on my way.", "Sending Sam your message."),
    (
        "What's the best way to learn a new language?",
        "Practice a little every day and talk with native speakers as soon as you can.",
    ),
    ("Dim the lights, please.", "Dimming the lights."),
    ("How many ounces are in a cup?", "There are eight fluid ounces in a cup."),
    ("Navigate to the nearest gas station.", "Starting directions to the nearest gas station."),
    (
        "Tell me something interesting about volcanoes.",
        "Some volcanoes are under the sea, and they build new islands over time.",
    ),
    ("Can you pause the podcast for a second?", "Paused."),
    (
        "What is a healthy breakfast I can make in five minutes?",
        "Try yogurt with fruit and a handful of oats.",
    ),
    ("Call the office and tell them I'm running late.", "Calling the office now."),
)


@dataclass(frozen=True)
class _Product:
    node: onnx.NodeProto
    kind: str  # "qkv", "o", "gate_up", "down"
    weight: NDArray[np.float32]  # (K, N), from the fp32 file


def build_rows_graphs(
    fp32: Path, int8: Path, out: Path, tok: Tokenizer, batch: tuple[Path, Path] | None = None
) -> list[Path]:
    """Write the rows graph of the int8 file ``int8`` (made from ``fp32``) to ``out``,
    and with ``batch`` (the int8 batched file, its out path) the batched one: the same
    weights, smoothed alike (the calibration runs through the one-reply fp32 file).
    Returns the paths written."""
    model, reference = onnx.load(str(int8)), onnx.load(str(fp32))  # 540 MB: loaded once
    products = _products(model, reference)
    maxima = _input_maxima(reference, [p.node.input[0] for p in products], tok)
    scales: list[NDArray[np.float32] | None] = []
    for p in products:
        if p.kind in ("qkv", "gate_up"):
            x = np.maximum(maxima[p.node.input[0]], 1e-5)
            w = np.maximum(np.abs(p.weight).max(axis=1), 1e-5)
            scales.append(np.clip(x**ALPHA / w ** (1 - ALPHA), 1e-2, 1e2).astype(np.float32))
        else:
            scales.append(None)
    graphs = [(model, products, out)]
    if batch is not None:
        batched = onnx.load(str(batch[0]))
        graphs.append((batched, _twins(batched, model, products), batch[1]))
    del reference
    for graph, prods, path in graphs:
        smooth: dict[int, NDArray[np.float32]] = {}
        for p, s in zip(prods, scales, strict=True):
            if s is not None:
                p.weight[...] *= s[:, None]  # in place: the product's own copy
                smooth[id(p.node)] = (1 / s).astype(np.float32)
        _rewrite(graph, prods, smooth)
        onnx.save(graph, str(path))
    return [path for _, _, path in graphs]


_KINDS = ("qkv", "o", "gate_up", "down")
HEAD_WEIGHT = "embed_t"  # export/graph.py: the head reads the tied embedding


def _products(model: onnx.ModelProto, fp32: onnx.ModelProto) -> list[_Product]:
    """The layer products of the int8 graph in order (q/k/v, o, gate/up, down per
    layer), each with its fp32 weight; not the head (the tied embedding's product)."""
    weights = {i.name: i for i in fp32.graph.initializer}
    nodes = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    layers = [n for n in nodes if not n.input[1].startswith(HEAD_WEIGHT)]
    if len(layers) != len(nodes) - 1 or len(layers) % len(_KINDS):
        raise ValueError(f"{len(nodes)} int8 products: not a head and {len(_KINDS)} a layer")
    for gate_up, down in zip(layers[2 :: len(_KINDS)], layers[3 :: len(_KINDS)], strict=True):
        if _attr(gate_up, "N") != 2 * _attr(down, "K"):
            raise ValueError(f"{gate_up.name} and {down.name} are not a layer's MLP products")
    out = []
    for i, node in enumerate(layers):
        name = node.input[1].removesuffix("_Q8")
        if name not in weights:
            raise ValueError(f"the fp32 file has no weight {name} for {node.name}")
        weight = numpy_helper.to_array(weights[name]).astype(np.float32)
        if weight.shape != (_attr(node, "K"), _attr(node, "N")):
            raise ValueError(f"{name}: {weight.shape} is not {node.name}'s K x N")
        out.append(_Product(node, _KINDS[i % len(_KINDS)], weight.copy()))
    return out


def _twins(
    batched: onnx.ModelProto, model: onnx.ModelProto, products: list[_Product]
) -> list[_Product]:
    """The batched int8 graph's layer products, in the order of ``model``'s
    ``products``, each with its own copy of the fp32 weight: the same int8 weights,
    checked (the batched export names its initializers otherwise)."""

    def quantised(graph: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
        return {i.name: i for i in graph.graph.initializer}

    mine, theirs = quantised(model), quantised(batched)
    nodes = [n for n in batched.graph.node if n.op_type == "MatMulNBits"]
    nodes = [n for n in nodes if not n.input[1].startswith(HEAD_WEIGHT)]
    if len(nodes) != len(products):
        raise ValueError(f"the batched graph has {len(nodes)} layer products, not {len(products)}")
    out = []
    for node, p in zip(nodes, products, strict=True):
        if theirs[node.input[1]].raw_data != mine[p.node.input[1]].raw_data:
            raise ValueError(f"{node.name} does not hold the weights of {p.node.name}")
        out.append(_Product(node, p.kind, p.weight.copy()))
    return out


def _attr(node: onnx.NodeProto, name: str) -> int:
    return int(next(helper.get_attribute_value(a) for a in node.attribute if a.name == name))


def _input_maxima(
    model: onnx.ModelProto, names: list[str], tok: Tokenizer
) -> dict[str, NDArray[np.float32]]:
    """Each product input's largest magnitude per channel over the calibration prompts,
    through the fp32 graph ``model`` (its inputs are the int8 graph's: the same export);
    ``model`` gains those inputs as outputs."""
    have = {o.name for o in model.graph.output}
    for name in names:
        if name not in have:
            model.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    maxima: dict[str, NDArray[np.float32]] = {}
    for ids in _calibration_prompts(tok):
        for name, value in zip(names, session.run(names, _feeds(session, ids)), strict=True):
            m = np.abs(value).reshape(-1, value.shape[-1]).max(axis=0)
            maxima[name] = np.maximum(maxima[name], m) if name in maxima else m
    return maxima


def _calibration_prompts(tok: Tokenizer) -> Iterable[list[int]]:
    """Each line asked after the one before it and its reply, under either system
    prompt: prompts as the server builds them, history included."""
    tools = tools_system_prompt("You are a helpful voice assistant.", DEFAULT_TOOLS)
    for i, (line, _) in enumerate(CALIBRATION):
        before, reply = CALIBRATION[i - 1]
        conversation = [
            ChatMessage("user", before),
            ChatMessage("assistant", reply),
            ChatMessage("user", line),
        ]
        for system_prompt in (SPOKEN_SYSTEM_PROMPT, tools):
            yield build_prompt(tok, conversation, 1024, system_prompt=system_prompt)


def _feeds(session: ort.InferenceSession, ids: list[int]) -> dict[str, NDArray[np.generic]]:
    """One causal step of ``ids`` on an empty cache."""
    T = len(ids)
    feeds: dict[str, NDArray[np.generic]] = {
        "input_ids": np.array(ids, np.int64),
        "positions": np.arange(T, dtype=np.int64),
        "past_length": np.array(0, np.int64),
        "block": np.array(False),
        "logit_rows": np.array([T - 1], np.int64),
    }
    for i in session.get_inputs():
        if i.name.startswith(("past_key_", "past_value_")):
            feeds[i.name] = np.zeros((1, i.shape[1], T, i.shape[3]), np.float32)
    return feeds


def _rewrite(
    model: onnx.ModelProto,
    products: list[_Product],
    smooth: dict[int, NDArray[np.float32]],
) -> None:
    """Each product as per-row int8: its input divided by the smoothing scales (where
    it has them: one ``Mul``; the norm before it may share its weight with others), the
    row scale, the row quantised (zero point 128, one per row: ``positions`` gives the
    rows' count), the integer product scaled by the weight columns' scales, then by the
    row's."""
    g = model.graph
    consts: dict[str, NDArray[np.generic]] = {
        "pg_inv127": np.array(1 / 127, np.float32),
        "pg_tiny": np.array(1e-10, np.float32),
        "pg_zero": np.array(0.0, np.float32),
        "pg_128": np.array(128.0, np.float32),
        "pg_zp": np.array(128, np.uint8),
        "pg_one": np.array(1.0, np.float32),
        "pg_axis1": np.array([1], np.int64),
    }
    g.initializer.extend(numpy_helper.from_array(v, k) for k, v in consts.items())
    nodes = [
        helper.make_node("Cast", ["positions"], ["pg_pos"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["pg_pos", "pg_zero"], ["pg_rows0"]),
        helper.make_node("Add", ["pg_rows0", "pg_128"], ["pg_rows128"]),
        helper.make_node("Cast", ["pg_rows128"], ["pg_row_zp"], to=TensorProto.UINT8),
    ]
    by_node = {id(p.node): p for p in products}
    dropped: set[str] = set()
    for node in g.node:
        p = by_node.get(id(node))
        if p is None:
            nodes.append(node)
            continue
        scale = np.maximum(np.abs(p.weight).max(axis=0), 1e-12) / 127
        q = np.clip(np.round(p.weight / scale), -127, 127).astype(np.int8)
        n, x = node.name, node.input[0]
        g.initializer.extend(
            [
                numpy_helper.from_array(q, f"{n}_w"),
                numpy_helper.from_array(scale.astype(np.float32), f"{n}_ws"),
            ]
        )
        dropped.update(node.input[1:])
        if (inverse := smooth.get(id(node))) is not None:
            g.initializer.append(numpy_helper.from_array(inverse, f"{n}_smooth"))
            nodes.append(helper.make_node("Mul", [x, f"{n}_smooth"], [f"{n}_x"]))
            x = f"{n}_x"
        nodes += [
            helper.make_node("Abs", [x], [f"{n}_abs"]),
            # the hidden states are (1, T, C): one scale per row, as a (T,) vector
            helper.make_node("ReduceMax", [f"{n}_abs"], [f"{n}_max"], axes=[0, 2], keepdims=0),
            helper.make_node("Mul", [f"{n}_max", "pg_inv127"], [f"{n}_s0"]),
            helper.make_node("Max", [f"{n}_s0", "pg_tiny"], [f"{n}_s"]),
            helper.make_node("QuantizeLinear", [x, f"{n}_s", "pg_row_zp"], [f"{n}_q"], axis=1),
            helper.make_node(
                "MatMulIntegerToFloat",
                [f"{n}_q", f"{n}_w", "pg_one", f"{n}_ws", "pg_zp"],
                [f"{n}_y"],
                domain="com.microsoft",
            ),
            helper.make_node("Unsqueeze", [f"{n}_s", "pg_axis1"], [f"{n}_s1"]),
            helper.make_node("Mul", [f"{n}_y", f"{n}_s1"], [node.output[0]]),
        ]
    del g.node[:]
    g.node.extend(nodes)
    kept = [i for i in g.initializer if i.name not in dropped]
    del g.initializer[:]
    g.initializer.extend(kept)
