"""The tool router (model/router.py) and its fit (model/training/router.py)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from model.actions import decode_call, shape_names, shapes
from model.diffusion_engine import smollm2_diffusion_config
from model.engine import ChatMessage, drain
from model.modeldir import SHIPPED_ADAPTER
from model.router import ROUTER_FILE, ToolRouter, find_router, tool_of
from model.tools import CALL_OPEN, DEFAULT_TOOLS, ToolCall, shape_name
from model.training.router import RouterOptions, accuracy, fit_router, fit_softmax

from .conftest import tiny_tokenizer
from .test_actions import TOOLS, USER, CallsFirst, prefilled
from .test_diffusion import tiny_diffusion, tiny_generator

SHAPES = ("lights.set(on=false)", "lights.set(on=true)", "timer.cancel()")
NAMES = ("lights.set", "timer.cancel", *SHAPES)  # the tool columns, then the shapes


def clusters(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Three Gaussian clusters in 6 dimensions, n points each."""
    centres = rng.normal(0, 3, (3, 6))
    x = np.concatenate([c + rng.normal(0, 1, (n, 6)) for c in centres]).astype(np.float32)
    return x, np.repeat(np.arange(3), n)


def test_the_softmax_fit_separates_what_is_separable() -> None:
    x, y = clusters(40, np.random.default_rng(0))
    w, b = fit_softmax(x, y, 3, l2=1e-3, steps=500, lr=0.05)
    assert ((x @ w + b).argmax(1) == y).mean() == 1.0
    w0, _ = fit_softmax(x, y, 3, l2=1e-3, steps=0, lr=0.05)
    assert not w0.any()  # it starts from zero: the fit is what separates them


def test_the_folded_router_scores_the_logits_as_the_fit_scored_the_states() -> None:
    """Projection, standardisation and regression fold into one (V, K) matrix."""
    rng = np.random.default_rng(1)
    table = rng.normal(size=(50, 6)).astype(np.float32)  # (V, C): a tied head
    to_hidden = np.linalg.pinv(table).astype(np.float32)  # (C, V)
    states, y = clusters(30, rng)
    logits = states @ table.T  # what the head writes for each state
    labels = [SHAPES[i] for i in y]
    router = fit_router(logits, labels, to_hidden, RouterOptions(Path(".")), "sha")
    assert router.names == NAMES and router.weights.shape == (50, 5)
    fitted = accuracy(router, logits, labels)
    assert fitted["accuracy"] == fitted["tool_accuracy"] == 1.0
    assert fitted["per_tool"] == {"lights.set": 1.0, "timer.cancel": 1.0}
    # the same scores as the unfolded pipeline
    hidden = logits @ to_hidden.T
    mu, sd = hidden.mean(0), hidden.std(0) + 1e-6
    w, b = fit_softmax((hidden - mu) / sd, y, 3, 3e-3, 1500, 0.05)  # the shape classifier
    assert np.allclose(router.scores(logits[0])[2:], ((hidden[0] - mu) / sd) @ w + b, atol=1e-3)


def a_router(favour: str, vocab: int = 8, sha: str = "abc") -> ToolRouter:
    """A router that favours the shape ``favour`` and its tool, whatever it reads."""
    bias = np.array([5.0 if n in (favour, tool_of(favour)) else 0.0 for n in NAMES], np.float32)
    return ToolRouter(NAMES, np.zeros((vocab, len(NAMES)), np.float32), bias, sha, {"n": 1})


def test_it_chooses_among_the_session_s_shapes_and_steps_aside_for_unknown_tools() -> None:
    router = a_router("lights.set(on=true)")
    row = np.zeros(8, np.float32)
    both = ["lights.set(on=true)", "lights.set(on=false)", "timer.cancel()"]
    assert router.choose(row, both) == "lights.set(on=true)"
    # the best tool first, then its best shape among the session's
    assert router.choose(row, ["lights.set(on=false)", "timer.cancel()"]) == "lights.set(on=false)"
    assert router.choose(row, ["timer.cancel()"]) == "timer.cancel()"
    # a tool it has no shape of: it cannot weigh that one
    assert router.choose(row, [*both, "doors.lock()"]) is None
    assert router.choose(row, ["timer.cancel(reason)"]) is None  # a tool of another schema
    assert router.choose(row, []) is None


def test_every_way_to_lay_out_a_call_has_one_name() -> None:
    names = shape_names(DEFAULT_TOOLS)
    assert len(names) == len(set(names)) == len(shapes(tiny_tokenizer(), DEFAULT_TOOLS))
    assert names == [s.name for s in shapes(tiny_tokenizer(), DEFAULT_TOOLS)]
    volume = next(t for t in DEFAULT_TOOLS if t.name == "volume.set")
    assert shape_name(volume, {"change": "down"}) == "volume.set(change=down)"
    assert shape_name(volume, {"level": 3, "change": "up"}) == "volume.set(level,change=up)"
    assert "volume.set(change=down)" in names and "lights.set(on=false)" in names


def test_a_saved_router_loads_the_same(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    weights = rng.normal(size=(8, len(NAMES))).astype(np.float32)
    router = ToolRouter(NAMES, weights, np.ones(len(NAMES), np.float32), "s", {"a": 1})
    router.save(tmp_path / ROUTER_FILE)
    back = ToolRouter.load(tmp_path / ROUTER_FILE)
    assert (back.names, back.adapter_sha256, back.info) == (NAMES, "s", {"a": 1})
    row = rng.normal(size=8).astype(np.float32)
    assert np.allclose(back.scores(row), router.scores(row), atol=1e-2)  # weights in fp16


def _model_dir(path: Path, sha: str | None) -> Path:
    adapter = {"weights": {"sha256": sha}} if sha else None
    path.mkdir()
    (path / "manifest.json").write_text(json.dumps({"source": {"adapter": adapter}}))
    return path


def test_a_model_directory_gets_the_router_of_its_own_adapter(tmp_path: Path) -> None:
    place = tmp_path / "adapter"
    place.mkdir()
    a_router("timer.cancel()", sha="mine").save(place / ROUTER_FILE)
    mine = _model_dir(tmp_path / "mine", "mine")
    found = find_router(mine, [tmp_path / "elsewhere", place], vocab=8)
    assert found is not None and found.adapter_sha256 == "mine"
    assert find_router(_model_dir(tmp_path / "other", "other"), [place]) is None
    assert find_router(_model_dir(tmp_path / "base", None), [place]) is None
    with pytest.raises(ValueError, match="reads 8 logits"):
        find_router(mine, [place], vocab=9)


def test_the_shipped_router_belongs_to_the_shipped_tools_adapter() -> None:
    """A retrained tools adapter needs its router refitted (`quicksilver router`)."""
    tools = SHIPPED_ADAPTER.with_name("adapters-tools")
    router = ToolRouter.load(tools / ROUTER_FILE)
    weights = hashlib.sha256((tools / "adapter.safetensors").read_bytes()).hexdigest()
    assert router.adapter_sha256 == weights
    assert router.weights.shape == (49152, len(router.names))
    tools = [t.name for t in DEFAULT_TOOLS]
    assert set(router.names) <= {*tools, *shape_names(DEFAULT_TOOLS)}
    assert {n for n in router.names if "(" not in n} == set(tools)
    assert router.info["heldout"]["tool_accuracy"] >= 0.9  # as fitted (docs/actions.md)


def test_a_routed_call_is_laid_out_as_routed_whatever_the_model_would_write() -> None:
    tools = {t.name: t for t in TOOLS}
    for shape in ("timer.cancel()", "lights.set(on=false)", "volume.set(change=down)"):
        backend, cache, last, tok = prefilled(0)
        config = smollm2_diffusion_config(tok)
        done = decode_call(backend, tok, cache, last, TOOLS, USER, config, block=8, shape=shape)
        assert done is not None
        assert shape_name(tools[done.call.name], done.call.arguments) == shape
    with pytest.raises(ValueError, match="is laid out as 'doors"):
        decode_call(backend, tok, cache, last, TOOLS, USER, config, block=8, shape="doors.lock()")


def test_the_engine_asks_its_router_which_tool() -> None:
    gen, _ = tiny_generator()
    tok = gen.tokenizer
    backend = CallsFirst(tiny_diffusion(4), max_len=1024)
    backend.open_id = tok.encode_plain(CALL_OPEN)[0]  # type: ignore[attr-defined]
    gen.backend = gen.prefixes.backend = backend
    convo = [ChatMessage("user", "set a timer for 5 minutes")]
    names = [t.name for t in TOOLS] + shape_names(TOOLS)
    for favour in ("timer.cancel()", "lights.set(on=false)"):
        bias = np.array([5.0 if n in (favour, tool_of(favour)) else 0.0 for n in names], np.float32)
        gen.router = ToolRouter(
            tuple(names), np.zeros((backend.vocab_size, len(names)), np.float32), bias, "s", {}
        )
        items, _ = drain(gen.generate(convo, 32, lambda: False, TOOLS))
        calls = [i for i in items if isinstance(i, ToolCall)]
        tools = {t.name: t for t in TOOLS}
        assert [shape_name(tools[c.name], c.arguments) for c in calls] == [favour]
