"""The real SmolLM2-135M exported once per test session (slow on 2 cores: kept few)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from export.build import BuildOptions, build_atomic
from model.assemble import load_onnx_ar_generator
from model.engine import ChatMessage, drain

pytestmark = [pytest.mark.models, pytest.mark.slow]


@pytest.fixture(scope="session")
def real_dir(tmp_path_factory: pytest.TempPathFactory, smollm2_gguf) -> Path:
    out = tmp_path_factory.mktemp("smollm2-export") / "model"
    return build_atomic(out, BuildOptions(check_prompts=2, check_tokens=32))


def test_real_export_matches_pytorch(real_dir: Path) -> None:
    manifest = json.loads((real_dir / "manifest.json").read_text())
    fp32, int8 = manifest["parity"]["fp32"], manifest["parity"]["int8"]
    print(f"fp32: {fp32}\nint8: {int8}")
    assert max(fp32["prefill_max_abs"], fp32["ar_step_max_abs"], fp32["block_step_max_abs"]) < 1e-2
    assert fp32["replies_identical"] == fp32["replies"]
    assert manifest["config"]["mask_id"] == 49152
    # blockwise int8: the projections at a quarter of fp32 (the token table stays fp32)
    files = manifest["files"]
    assert files["model.int8.onnx"]["bytes"] < 0.55 * files["model.onnx"]["bytes"]
    assert files["model.int8.onnx"]["quantisation"]["method"] == "blockwise"
    # per-row activation scales keep the outlier positions from swamping the rest:
    # dynamic quantisation's single scale agreed on 0.58-0.66 of the prefill rows
    assert int8["prefill_top1"] > 0.9


def test_the_int8_onnx_engine_answers(real_dir: Path) -> None:
    gen = load_onnx_ar_generator(real_dir)
    question = [ChatMessage("user", "What is the capital of France?")]
    pieces, stats = drain(gen.generate(question, 32, lambda: False))
    assert "Paris" in "".join(pieces)
    assert stats.stopped_by == "end" and stats.forward_passes == stats.tokens + 1
