"""The serving path: no torch, the ONNX engines, TensorRT's plain "not installed"."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from export import tensorrt
from model.runtime import ProviderUnavailableError, choose_providers

ROOT = Path(__file__).resolve().parents[2]


def test_importing_the_serving_path_does_not_import_torch() -> None:
    code = (
        "import sys; import model.assemble, model.runtime, model.generate, server.runtime, "
        "cli.main; assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_the_onnx_ar_engine_replies_without_torch(tiny_dir: Path) -> None:
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from model.assemble import load_onnx_ar_generator\n"
        "from model.engine import ChatMessage, GenerationStats\n"
        f"gen = load_onnx_ar_generator(Path({str(tiny_dir)!r}))\n"
        "it = gen.generate([ChatMessage('user', 'hi')], 8, lambda: False)\n"
        "pieces = []\n"
        "while True:\n"
        "    try: pieces.append(next(it))\n"
        "    except StopIteration as done: stats = done.value; break\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "assert gen.name == 'smollm2-ar-onnx', gen.name\n"
        # the tiny model never stops: one pass per token, the prompt's giving the first
        "assert stats == GenerationStats(8, 8, 'budget'), stats\n"
        "assert len(pieces) == 8, pieces\n"
        "print(stats)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True
    )
    assert "GenerationStats" in out.stdout


def test_the_onnx_diffusion_engine_replies(tiny_dir: Path) -> None:
    from model.assemble import Batching, load_onnx_diffusion_generator
    from model.engine import ChatMessage, GenerationStats, drain

    wide = load_onnx_diffusion_generator(tiny_dir, batching=Batching(rows=1, block_size=16))
    pieces, stats = drain(wide.generate([ChatMessage("user", "hi")], 16, lambda: False))
    assert wide.name == "diffusion-onnx"
    # The tiny model is never 0.9 sure and never ends: one block of 16, one token per
    # pass (the leftmost fallback), after the prompt's pass.
    assert stats == GenerationStats(16, 1 + 16, "budget") and len(pieces) == 16
    # blocks of one: the prompt's pass gives the first token, each commit the next
    narrow = load_onnx_diffusion_generator(tiny_dir, batching=Batching(rows=1, block_size=1))
    pieces, stats = drain(narrow.generate([ChatMessage("user", "hi")], 16, lambda: False))
    assert stats == GenerationStats(16, 16, "budget") and len(pieces) == 16


def test_an_adapter_trained_on_calls_ends_every_reply_after_a_sentence(
    tiny_dir: Path, tmp_path: Path
) -> None:
    """Its replies end only after a sentence's end in every session, tools or not: the
    loader reads the model directory's adapter manifest."""
    import json
    import shutil

    from model.assemble import load_onnx_diffusion_generator

    assert load_onnx_diffusion_generator(tiny_dir).options.end_after_sentence == "tools"
    calls = tmp_path / "calls"
    shutil.copytree(tiny_dir, calls)
    manifest = json.loads((calls / "manifest.json").read_text())
    data = {"command": "quicksilver data --actions --seed 1 --out data/actions"}
    manifest.setdefault("source", {})["adapter"] = {"data": data}
    (calls / "manifest.json").write_text(json.dumps(manifest))
    assert load_onnx_diffusion_generator(calls).options.end_after_sentence == "always"


@pytest.mark.skipif(tensorrt.unavailable_reason() is None, reason="TensorRT is installed here")
def test_tensorrt_says_plainly_that_it_is_not_installed(tiny_dir: Path, tmp_path: Path) -> None:
    reason = tensorrt.unavailable_reason()
    assert reason is not None and reason.startswith("TensorRT is not installed on this host")
    with pytest.raises(tensorrt.TensorRTUnavailableError, match="TensorRT is not installed"):
        tensorrt.build_engine(tiny_dir / "model.fp16.onnx", tmp_path, (2, 2, 8))
    with pytest.raises(ProviderUnavailableError, match="TensorrtExecutionProvider is not"):
        choose_providers("tensorrt")


def test_tensorrt_without_the_provider_says_why_the_package_alone_is_not_enough(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.util

    monkeypatch.setattr(tensorrt.ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "tensorrt" else real(name)
    )
    reason = tensorrt.unavailable_reason()
    assert reason is not None and "no TensorRT execution provider" in reason
    assert "built and served through that provider" in reason


def test_tensorrt_profile_covers_empty_and_full_caches() -> None:
    shapes = tensorrt.profile_shapes(30, 3, 64, max_len=2048)
    assert len(shapes) == 3 + 2 * 30  # every layer's key and value buffer
    assert shapes["past_value_29"]["min"] == [1, 3, 1, 64]
    assert shapes["past_key_0"]["max"] == [1, 3, 2048, 64]
    assert shapes["input_ids"]["max"] == [512]
    opts = tensorrt.trt_provider_options(Path("/x"), shapes)
    assert "past_key_0:1x3x1x64" in opts["trt_profile_min_shapes"]
    assert opts["trt_fp16_enable"] is True
