"""Where the reply model runs, and so which graph it serves and whether speech comes first."""

from __future__ import annotations

import onnxruntime as ort
import pytest

from model.assemble import reply_on_cpu, serving_variant


def test_the_reply_model_shares_the_cpu_unless_onnx_runtime_offers_a_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert reply_on_cpu("diffusion") and reply_on_cpu("smollm2-ar")  # PyTorch: the CPU
    cpu_only = ["CPUExecutionProvider"]
    monkeypatch.setattr(ort, "get_available_providers", lambda: cpu_only)
    assert reply_on_cpu("diffusion-onnx") and reply_on_cpu("smollm2-ar-onnx")
    assert serving_variant("diffusion-onnx") == "int8"
    gpu = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    monkeypatch.setattr(ort, "get_available_providers", lambda: gpu)
    assert not reply_on_cpu("diffusion-onnx")
    assert serving_variant("diffusion-onnx") == serving_variant("smollm2-ar-onnx") == "fp16"
    # an explicit --device cpu keeps the CPU graph even where a GPU is offered
    assert (
        reply_on_cpu("diffusion-onnx", "cpu") and serving_variant("diffusion-onnx", "cpu") == "int8"
    )


def test_device_auto_needs_both_runtimes_to_see_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import ctranslate2

    from server.runtime import resolve_device

    gpu = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    monkeypatch.setattr(ort, "get_available_providers", lambda: gpu)
    monkeypatch.setattr(ctranslate2, "get_cuda_device_count", lambda: 0)
    assert resolve_device("auto") == "cpu"  # onnxruntime-gpu, but CTranslate2 sees none
    monkeypatch.setattr(ctranslate2, "get_cuda_device_count", lambda: 1)
    assert resolve_device("auto") == "cuda"
    assert resolve_device("cpu") == "cpu" and resolve_device("tensorrt") == "cuda"
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    assert resolve_device("auto") == "cpu"


def test_the_openai_chat_engine_runs_elsewhere_and_needs_its_server() -> None:
    from model.assemble import load_generator
    from model.openai_chat import ChatServerOptions, OpenAIChatGenerator

    assert not reply_on_cpu("openai-chat")  # pausing our reads would not pause its passes
    chat = ChatServerOptions("http://127.0.0.1:8000/v1", "m")
    assert isinstance(load_generator("openai-chat", chat=chat), OpenAIChatGenerator)
    with pytest.raises(ValueError, match="URL and model"):
        load_generator("openai-chat")
    with pytest.raises(ValueError, match="URL"):  # at start, not at the first turn
        load_generator("openai-chat", chat=ChatServerOptions("127.0.0.1:8000", "m"))


def test_the_shipped_adapters_say_which_was_trained_on_calls() -> None:
    from model.assemble import trained_for_tools
    from model.modeldir import CHAT_ADAPTER, SHIPPED_ADAPTER, adapter_calls_tools

    assert trained_for_tools(SHIPPED_ADAPTER) and not trained_for_tools(CHAT_ADAPTER)
    assert not trained_for_tools(None) and not adapter_calls_tools(None)
    assert not adapter_calls_tools({"data": "quicksilver data --actions"})  # not a record
