"""``quicksilver export`` end to end into a temporary directory; the benchmark's parts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import export.build
from bench.llm import (
    CountingBackend,
    Decoder,
    Dims,
    KeptHead,
    Roofline,
    ar_decoder,
    diffusion_decoder,
    int8_bytes_per_weight,
    n_weights,
    recipe_bytes_per_weight,
    step_bytes,
    step_flops,
    time_engines,
)
from cli.main import main
from export.build import ensure_model_dir
from model.modeldir import (
    DEFAULT_NAME,
    default_model_dir,
    is_complete,
    load_tokenizer,
)
from tests.export.conftest import TINY, ort_backend, tiny_source

TINY_DIMS = Dims(
    TINY.n_layer,
    TINY.n_embd,
    TINY.n_head,
    TINY.n_kv_head,
    TINY.head_dim,
    TINY.ffn_hidden,
    TINY.vocab_size,
)


def test_quicksilver_export_builds_a_model_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(export.build, "load_source", lambda adapter=None: tiny_source())
    out = tmp_path / "model"
    assert main(["export", "--out", str(out), "--int8", "--fp16"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest["files"]) == {
        "model.onnx",
        "model.int8.onnx",
        "model.fp16.onnx",
        "model.batch.onnx",
        "model.int8.batch.onnx",
        "model.fp16.batch.onnx",
        "tokenizer.json",
    }
    for name, f in manifest["files"].items():
        assert (out / name).stat().st_size == f["bytes"] and len(f["sha256"]) == 64
    assert manifest["config"]["mask_id"] == TINY.vocab_size
    assert set(manifest["parity"]) == {"fp32", "int8", "fp16"}
    assert is_complete(out) and load_tokenizer(out).im_end_id == 2
    assert "exported to" in capsys.readouterr().out
    assert not list(tmp_path.glob(".model.*"))  # the temporary build directory is gone
    # the GPU file reads the cache with standard operators, the CPU files with the fused
    # kernel; an fp16 file of the fused form (built before) counts as missing
    attention = {name: f.get("attention") for name, f in manifest["files"].items()}
    assert attention == {
        "model.onnx": "fused",
        "model.int8.onnx": "fused",
        "model.fp16.onnx": "plain",
        "model.batch.onnx": "fused",
        "model.int8.batch.onnx": "fused",
        "model.fp16.batch.onnx": "plain",
        "tokenizer.json": None,
    }
    assert is_complete(out, "fp16")
    manifest["files"]["model.fp16.onnx"]["attention"] = "fused"
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert not is_complete(out, "fp16") and is_complete(out, "int8")


def test_the_rows_graphs_are_built_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(export.build, "load_source", lambda adapter=None: tiny_source())
    out = tmp_path / "model"
    four = ["export", "--out", str(out), "--rows-graphs", "--bits", "4", "--no-check"]
    assert main(four) == 1 and not out.exists()  # the rows graphs are 8-bit weights' own
    assert main(["export", "--out", str(out), "--rows-graphs", "--no-check"]) == 0
    files = json.loads((out / "manifest.json").read_text())["files"]
    for name in ("model.int8.rows.onnx", "model.int8.rows.batch.onnx"):
        assert files[name]["bytes"] == (out / name).stat().st_size
    assert is_complete(out)


def test_an_adapter_gets_its_own_cached_model_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """diffusion-onnx serves base + adapter: built once per adapter file, by its digest."""
    seen: list[Path | None] = []

    def source(adapter: Path | None = None) -> export.build.Source:
        seen.append(adapter)
        return tiny_source()

    monkeypatch.setattr(export.build, "load_source", source)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter.safetensors").write_bytes(b"weights one")
    cache = tmp_path / "cache"
    built = ensure_model_dir(cache, adapter=adapter)
    assert built.parent == cache / "models" and built.name != DEFAULT_NAME
    assert built.name.startswith("smollm2-135m-diffusion-") and is_complete(built)
    assert seen == [adapter]
    assert ensure_model_dir(cache, adapter=adapter) == built and len(seen) == 1  # cached
    (adapter / "adapter.safetensors").write_bytes(b"weights two")
    assert default_model_dir(cache, adapter) != built  # a retrained adapter: a new build
    assert default_model_dir(cache).name == DEFAULT_NAME
    with pytest.raises(FileNotFoundError, match=r"no adapter\.safetensors"):
        default_model_dir(cache, tmp_path)


def test_export_tensorrt_fails_plainly_without_tensorrt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from export.tensorrt import unavailable_reason

    if unavailable_reason() is None:
        pytest.skip("TensorRT is installed here")
    monkeypatch.setattr(export.build, "load_source", lambda adapter=None: tiny_source())
    assert main(["export", "--out", str(tmp_path / "m"), "--tensorrt", "--no-check"]) == 1
    assert "TensorRT is not installed" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def test_an_adapter_is_merged_before_export(tmp_path: Path) -> None:
    """TRAINING's adapter (model/nn/adapter.py): LoRA delta and mask row end up in the file."""
    import torch

    import model.nn.adapter as adapter_mod

    src = tiny_source()
    C = TINY.n_embd
    torch.manual_seed(1)
    lora = {"blocks.0.attn.q_proj": (torch.randn(2, C), torch.randn(C, 2))}
    mask = torch.randn(C)
    adapter = adapter_mod.Adapter(2, 4.0, lora, mask, {"test": "tiny"})
    adapter_mod.save_adapter(tmp_path / "adapter", adapter, torch.float32)
    before = src.model.blocks[0].attn.q_proj.weight.detach().clone()
    merged, info = export.build.merge_adapter(src.model, tmp_path / "adapter")
    delta = merged.blocks[0].attn.q_proj.weight.detach() - before
    torch.testing.assert_close(
        delta, 2.0 * lora["blocks.0.attn.q_proj"][1] @ lora["blocks.0.attn.q_proj"][0]
    )
    torch.testing.assert_close(merged.tok_emb.weight[TINY.vocab_size].detach(), mask)
    assert info["test"] == "tiny"
    out = export.build.build_atomic(
        tmp_path / "m",
        export.build.BuildOptions(check=False),
        export.build.Source(merged, src.tokenizer, {}),
    )
    b = ort_backend(out)
    cache = b.new_cache()
    got = b.step(cache, np.array([1, 2, TINY.vocab_size], np.int64), "block", False)
    from tests.export.conftest import torch_backend

    want = torch_backend(merged).step(
        torch_backend(merged).new_cache(),
        np.array([1, 2, TINY.vocab_size], np.int64),
        "block",
        False,
    )
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_flops_of_one_token_are_about_twice_the_parameters() -> None:
    d = Dims(30, 576, 9, 3, 64, 1536, 49152)
    # SmolLM2-135M: 134.5M parameters, 28.3M of them the (tied) embedding
    assert step_flops(d, 1, 0, 1) == pytest.approx(2 * 134.5e6, rel=0.02)
    assert step_flops(d, 16, 100, 16) > 16 * step_flops(d, 1, 0, 1)


def test_bytes_of_a_step_are_its_weights_once_whatever_the_chunk() -> None:
    d = Dims(30, 576, 9, 3, 64, 1536, 49152)
    one = step_bytes(d, 1, 0, 1.0, 4)
    assert one == pytest.approx(134.5e6, rel=0.02)  # int8: a byte per weight
    # 16 tokens cost 16x the FLOPs but only their own cache rows in bytes
    assert step_bytes(d, 16, 0, 1.0, 4) - one == 15 * (2 * 30 * 192 * 4 + 576 * 4)
    assert step_bytes(d, 1, 100, 1.0, 4) - one == 100 * 2 * 30 * 192 * 4
    assert int8_bytes_per_weight("blockwise") == 1.125  # a fp32 scale per 32 weights
    assert int8_bytes_per_weight("blockwise", 4) == 0.5 + 4.5 / 32  # and a 4-bit zero point
    assert int8_bytes_per_weight("dynamic") == 1.0
    # a 4-bit file keeps its head (28.3M of the 134.5M) at 8 bits
    four = {"method": "blockwise", "bits": 4}
    assert recipe_bytes_per_weight(four, d) == int8_bytes_per_weight("blockwise", 4)
    mixed = recipe_bytes_per_weight(four | {"head_bits": 8}, d)
    share = 576 * 49152 / n_weights(d)
    assert mixed == pytest.approx((1 - share) * (0.5 + 4.5 / 32) + share * 1.125)
    # ... and its wide products: q/k/v (576 x 960) and down (1536 x 576) in each layer
    wide = recipe_bytes_per_weight(four | {"head_bits": 8, "wide_products": ["qkv", "down"]}, d)
    share += 30 * (576 * 960 + 1536 * 576) / n_weights(d)
    assert wide == pytest.approx((1 - share) * (0.5 + 4.5 / 32) + share * 1.125)


def test_the_floor_is_the_slower_of_compute_and_memory_per_pass() -> None:
    d = Dims(30, 576, 9, 3, 64, 1536, 49152)
    roof = Roofline(flops=500e9, bandwidth=20e9, weight_bytes=1.0)
    c1, m1 = roof.step_s(d, 1, 100, 1)
    c16, m16 = roof.step_s(d, 16, 100, 16)
    assert m1 > c1  # one token: bound by reading the weights
    assert c16 > c1 * 15 and m16 < m1 * 1.1  # a block: the same bytes, 16x the work


def test_bench_times_the_ar_decoder_and_counts_its_passes(tiny_dir: Path) -> None:
    tok = load_tokenizer(tiny_dir)
    b = ort_backend(tiny_dir, "model.int8.onnx")
    roof = Roofline(flops=1e9, bandwidth=1e9, weight_bytes=1.0)
    prompts = [[1, 5, 6], [1, 7, 8, 9]]
    r = time_engines(b, {"ar": ar_decoder(tok)}, prompts, 8, roof, TINY_DIMS)["ar"]
    assert r["replies"] == 2 and r["p50_s"] > 0 and r["p95_s"] >= r["p50_s"]
    assert r["floor_s_per_reply"] >= max(
        r["floor_compute_s_per_reply"], r["floor_memory_s_per_reply"]
    )
    assert r["floor_s_per_reply"] <= r["floor_compute_s_per_reply"] + r["floor_memory_s_per_reply"]
    # the tiny model never writes a stop token: both replies run to the budget of 8, one
    # pass per token (the prompt's pass gives the first)
    assert r["tokens_per_reply"] == r["passes_per_reply"] == 8
    counter = CountingBackend(b)
    counter.step(counter.new_cache(), np.array([1, 2, 3]), "causal", True, rows=[2])
    assert counter.steps == [(3, 0, 1)]


def test_a_kept_system_head_gives_the_replies_a_whole_prefill_does(tiny_dir: Path) -> None:
    """--system-cached: the head is prefilled once, outside the timed replies; each reply
    prefills only what follows it, and writes what a whole prefill would have."""
    from model.engine import drain

    tok = load_tokenizer(tiny_dir)
    b = ort_backend(tiny_dir, "model.onnx")  # fp32: the same tokens, exactly
    ids = [1, *range(10, 42)]  # as long as a head is kept (model.prefix.MIN_COPIED)
    prompts = [[*ids, 8, 9], [*ids, 3, 4, 2]]
    head = KeptHead(ids)
    for make in (ar_decoder, lambda t, h=None: diffusion_decoder(t, 1, False, h)):
        for prompt in prompts:
            whole, _ = drain(make(tok)(b, prompt, 6))
            counter = CountingBackend(b)
            kept, _ = drain(make(tok, head)(counter, prompt, 6))
            assert kept == whole
            # the first timed pass: only the reply's own words, after the head kept
            assert counter.steps[0][:2] == (len(prompt) - len(ids), len(ids))
    # a prompt that does not start with the head is prefilled whole
    counter = CountingBackend(b)
    drain(ar_decoder(tok, head)(counter, [1, 5, 9, 7, 8], 2))
    assert counter.steps[0][:2] == (5, 0)


def test_bench_llm_times_the_model_serve_serves_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --model-dir the bench times the directory of serve's default engine (the
    shipped adapter merged), built as serve builds it, not the base model's."""
    import export.build
    from bench.commands import served_model_dir
    from model.modeldir import default_model_dir, shipped_adapter

    built: list[tuple[object, ...]] = []

    def ensure(*args: object) -> None:
        built.append(args)

    monkeypatch.setattr(export.build, "ensure_model_dir", ensure)
    assert served_model_dir(tmp_path) == default_model_dir(tmp_path, shipped_adapter())
    assert built == [(tmp_path, "int8", shipped_adapter())]
    assert default_model_dir(tmp_path, shipped_adapter()) != default_model_dir(tmp_path)
    missing = tmp_path / "nothing"
    from bench.llm import BenchOptions, run_llm_bench

    with pytest.raises(FileNotFoundError, match="no complete exported model"):
        run_llm_bench(BenchOptions(missing, torch_reference=False, llama_cpp="off"))


def test_bench_times_the_first_sentence(tiny_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bench.llm import BenchOptions, print_table, run_llm_bench
    from model.schedule import choose

    r = run_llm_bench(
        BenchOptions(tiny_dir, prompts=2, budgets=(8,), torch_reference=False, llama_cpp="off")
    )
    assert [row["engine"] for row in r["rows"]] == ["ar", "diffusion", "diffusion-b1"]
    tps = {row["engine"]: row["tokens_per_s"] for row in r["rows"]}  # the speedup is over AR's
    assert r["speedup"] == tps["diffusion"] / tps["ar"]
    assert r["speedup_by_engine"] == {
        "diffusion": r["speedup"],
        "diffusion-b1": tps["diffusion-b1"] / tps["ar"],
    }
    # the served row is one of the rows: the one serve's default engine runs in this
    # host's schedule (model/schedule.py), kept in the model directory
    width = r["schedule"]["block_size"]
    assert width == choose(r["schedule"]["pass_costs_ms"])
    engine = {16: "diffusion", 1: "diffusion-b1"}[width]
    row_of = {"engine": engine, "runtime": "onnx-int8", "budget": 8}
    # the tiny model is not what serve serves: the row is serve's schedule on its weights
    assert r["served"] == row_of | {"served_weights": False}
    assert sum(all(row[k] == v for k, v in row_of.items()) for row in r["rows"]) == 1
    for row in r["rows"]:  # each reply's first sentence comes no later than its end
        assert 0 < row["first_sentence_p50_s"] <= row["p50_s"]
        assert row["first_sentence_p95_s"] <= row["p95_s"]
    print_table(r)
    assert "speedup (diffusion / AR tokens/s at 8 tokens): " in capsys.readouterr().out


def test_the_first_sentence_needs_its_end_mark_and_the_space_after_it(tiny_dir: Path) -> None:
    from bench.llm import first_sentence_tokens

    tok = load_tokenizer(tiny_dir)
    count = first_sentence_tokens(tok)
    one, two = tok.encode("The capital is Rome."), tok.encode(" It is old.")
    assert count(one + two) == len(one) + 1  # released by the space that starts " It"
    assert count(one) == len(one)  # one sentence: at the end of the reply
    assert count([]) == 0


@pytest.mark.models
def test_the_first_sentence_in_smollm2_tokens(smollm2_gguf) -> None:  # type: ignore[no-untyped-def]
    from bench.llm import first_sentence_tokens
    from model.tokenizer import Tokenizer

    tok = Tokenizer(smollm2_gguf.tokenizer_data())
    one = tok.encode("The capital of Italy is Rome.")
    ids = tok.encode("The capital of Italy is Rome. It is old.")
    assert ids[: len(one)] == one and tok.decode(ids[len(one) : len(one) + 1]) == " It"
    assert first_sentence_tokens(tok)(ids) == len(one) + 1  # " It" carries the space


def test_bench_interleaves_the_engines_per_prompt_and_rotates_who_goes_first(
    tiny_dir: Path,
) -> None:
    from bench.llm import diffusion_decoder

    tok = load_tokenizer(tiny_dir)
    order: list[str] = []

    def logged(name: str, decode: Decoder) -> Decoder:
        def run(b, prompt, n):  # type: ignore[no-untyped-def]
            order.append(name)
            return decode(b, prompt, n)

        return run

    decoders = {
        "ar": logged("ar", ar_decoder(tok)),
        "diffusion": logged("d", diffusion_decoder(tok)),
    }
    roof = Roofline(flops=1e9, bandwidth=1e9, weight_bytes=1.0)
    b = ort_backend(tiny_dir, "model.int8.onnx")
    out = time_engines(b, decoders, [[1, 5, 6], [1, 7, 8, 9], [1, 3]], 6, roof, TINY_DIMS, rounds=2)
    warm, timed = order[:2], order[2:]
    assert warm == ["ar", "d"]
    firsts = timed[::2]  # who went first for each (round, prompt)
    assert firsts == ["ar", "d", "ar", "d", "ar", "d"]  # rotates with prompt + round
    assert sorted(timed) == ["ar"] * 6 + ["d"] * 6
    for r in out.values():
        assert r["replies"] == 6 and len(r["rounds_tokens_per_s"]) == 2
        # all the replies' tokens over all their time: between the two rounds' figures
        each = r["rounds_tokens_per_s"]
        assert min(each) * (1 - 1e-9) <= r["tokens_per_s"] <= max(each) * (1 + 1e-9)


def test_bench_reports_the_speedup_of_every_round(
    tiny_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bench.llm import BenchOptions, print_table, run_llm_bench

    r = run_llm_bench(
        BenchOptions(
            tiny_dir, prompts=2, budgets=(8,), torch_reference=False, rounds=2, llama_cpp="off"
        )
    )
    rounds = {row["engine"]: row["rounds_tokens_per_s"] for row in r["rows"]}
    assert r["speedup_per_round"] == [
        d / a for d, a in zip(rounds["diffusion"], rounds["ar"], strict=True)
    ]
    print_table(r)
    assert "per round: " in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["bench", "llm", "--rounds", "0"])
    assert "needs 1 or more, got 0" in capsys.readouterr().err


def test_wide_products_are_named_kinds_or_none(capsys: pytest.CaptureFixture[str]) -> None:
    """``--wide-products`` takes kinds from PRODUCT_KINDS (or none) and says which exist."""
    from export.commands import _products

    assert _products("qkv, down") == ("qkv", "down") and _products("none") == ()
    with pytest.raises(SystemExit) as exc:
        main(["export", "--wide-products", "qkv,attn"])
    assert exc.value.code == 2
    assert "no product attn: choose from qkv,o,gate_up,down or none" in capsys.readouterr().err
