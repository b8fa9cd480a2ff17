"""llama.cpp as an engine of ``quicksilver bench llm`` (bench/llamacpp.py).

The real twin runs llama-cpp-python on the SmolLM2 GGUF (it compiles llama.cpp:
``$QUICKSILVER_LLAMA_CPP_PYTHON``, docs/export.md; .ci/run builds it, and in CI its
absence is a failure). Beside it, a stand-in ``llama_cpp`` module checks the worker's
protocol and the bench's llama.cpp row on any machine.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench.llamacpp import LlamaCppError, LlamaCppWorker, llama_cpp_python
from bench.llm import LLAMA_ENGINE, LLAMA_RUNTIME, BenchOptions, print_table, run_llm_bench
from model.engine import ChatMessage, GenerationStats, drain
from tests.chatserver import llama_python_or_skip
from tests.model.conftest import smollm2_gguf  # noqa: F401 (a fixture)

# llama_cpp.Llama's generate() as the worker uses it: an endless stream of token ids
# (here 7, 8, 9, ..., and the stop token 2 after 9 when the prompt starts with 5, so a test
# can make it stop), after reset() or, where the request keeps K tokens, after its cache
# was cut to K (n_tokens, which generate() then matches against the prompt); the keyword
# arguments are checked to be greedy's.
FAKE = """
__version__ = "stand-in"

class Llama:
    def __init__(self, model_path, n_ctx, n_threads, n_threads_batch, n_batch, verbose):
        self.fed = self.n_tokens = 0

    def reset(self):
        self.fed = self.n_tokens = 0

    def generate(self, tokens, top_k, top_p, min_p, temp, repeat_penalty):
        assert self.fed == 0 or self.n_tokens == min(self.fed, 3), "not reset, not cut to 3"
        assert top_k == 1 and temp == 0.0 and repeat_penalty == 1.0
        self.fed = self.n_tokens = len(tokens)
        token = 7
        while True:
            yield 2 if tokens[0] == 5 and token == 10 else token
            token += 1
"""


@pytest.fixture
def fake_llama(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "llama_cpp.py").write_text(FAKE)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")  # the stand-in never reads it
    monkeypatch.setenv("QUICKSILVER_SMOLLM2_GGUF", str(gguf))
    monkeypatch.setenv("QUICKSILVER_LLAMA_CPP_PYTHON", sys.executable)
    return sys.executable


def _reply(
    worker: LlamaCppWorker, prompt: list[int], n: int, stop: set[int] | None = None
) -> tuple[list[int], GenerationStats]:
    return drain(worker.generate(prompt, n, stop_ids={2} if stop is None else stop))


def test_the_worker_streams_greedy_tokens_until_a_stop_or_the_budget(
    fake_llama: str, tmp_path: Path
) -> None:
    with LlamaCppWorker(fake_llama, tmp_path / "model.gguf") as worker:
        assert worker.version == "stand-in"
        out, stats = _reply(worker, [5, 1], 8)  # the stand-in ends after 7, 8, 9
        assert out == [7, 8, 9]
        assert (stats.tokens, stats.forward_passes, stats.stopped_by) == (3, 4, "end")
        out, stats = _reply(worker, [4, 5], 5)  # a second reply: a fresh prefill, no stop
        assert out == [7, 8, 9, 10, 11]
        assert (stats.tokens, stats.forward_passes, stats.stopped_by) == (5, 5, "budget")


def test_the_worker_keeps_the_first_tokens_it_is_told_and_resets_otherwise(
    fake_llama: str,
) -> None:
    with LlamaCppWorker(fake_llama, Path("model.gguf")) as worker:
        for keep in (3, 3, 0, 3):  # the stand-in fails a request that was neither
            out, _ = drain(worker.generate([1, 2, 3, 4, 5], 2, {2}, keep))
            assert out == [7, 8]


def test_a_worker_that_cannot_start_says_why(tmp_path: Path) -> None:
    # this Python without llama_cpp on its path
    if llama_cpp_python() == sys.executable:
        pytest.skip("llama_cpp imports here")
    with pytest.raises(LlamaCppError, match="cannot import llama_cpp"):
        LlamaCppWorker(sys.executable, tmp_path / "model.gguf")
    with pytest.raises(LlamaCppError, match="cannot run"):
        LlamaCppWorker(str(tmp_path / "no-python"), tmp_path / "model.gguf")


def test_a_worker_that_dies_mid_reply_is_an_error_with_its_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "llama_cpp.py").write_text(
        FAKE.replace("            token += 1", "            raise SystemExit('out of memory')")
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    worker = LlamaCppWorker(sys.executable, tmp_path / "model.gguf")
    with worker, pytest.raises(LlamaCppError, match="out of memory"):
        _reply(worker, [4, 5], 5)


def test_the_bench_times_llama_cpp_beside_the_engines(
    fake_llama: str, tiny_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    r = run_llm_bench(BenchOptions(tiny_dir, prompts=2, budgets=(6,), torch_reference=False))
    rows = {(x["engine"], x["runtime"]): x for x in r["rows"]}
    engines = {"ar", "diffusion", "diffusion-b1"}  # every width's row (bench/llm.py)
    assert set(rows) == {(e, "onnx-int8") for e in engines} | {(LLAMA_ENGINE, "gguf")}
    llama = rows[(LLAMA_ENGINE, LLAMA_RUNTIME)]
    assert llama["replies"] == 2 and llama["tokens_per_reply"] == 6  # never stops: budget
    assert llama["tokens_per_s"] == pytest.approx(llama["tokens_per_reply"] / llama["mean_s"])
    assert llama["first_sentence_p50_s"] <= llama["p50_s"]  # a part of the reply
    assert llama["floor_s_per_reply"] is None  # ONNX Runtime's roofline is not its own
    ratios = r["llama_cpp"]["over_llama_cpp"]
    assert set(ratios) == engines
    ar = rows[("ar", "onnx-int8")]
    assert ratios["ar"]["tokens_per_s"] == ar["tokens_per_s"] / llama["tokens_per_s"]
    assert r["llama_cpp"]["version"] == "stand-in"
    assert LLAMA_ENGINE not in r["speedup_by_engine"]  # the speedup is diffusion over AR
    print_table(r)
    out = capsys.readouterr().out
    assert "ar / llama.cpp tokens/s: " in out and "diffusion / llama.cpp tokens/s: " in out


def test_the_bench_leaves_llama_cpp_out_when_told(fake_llama: str, tiny_dir: Path) -> None:
    opts = BenchOptions(tiny_dir, prompts=1, budgets=(4,), torch_reference=False, llama_cpp="off")
    r = run_llm_bench(opts)
    assert [x["engine"] for x in r["rows"]] == ["ar", "diffusion", "diffusion-b1"]
    assert r["llama_cpp"] is None


@pytest.mark.models
def test_llama_cpp_answers_on_the_smollm2_gguf(smollm2_gguf) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    from model.chat import build_prompt
    from model.nn.gguf import find_smollm2_gguf
    from model.tokenizer import Tokenizer

    python = llama_python_or_skip()
    tok = Tokenizer(smollm2_gguf.tokenizer_data())
    prompt = build_prompt(tok, [ChatMessage("user", "What is the capital of France?")], 1024)
    with LlamaCppWorker(python, find_smollm2_gguf()) as worker:
        out, stats = _reply(worker, prompt, 24, set(tok.stop_ids))
    assert "Paris" in tok.decode(out)
    assert stats.tokens == len(out) and stats.forward_passes >= len(out)


@pytest.mark.models
def test_llama_cpp_keeps_only_the_head_it_is_told_and_answers_as_from_scratch(smollm2_gguf) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """``keep``: the system prompt's cache is reused (llama.cpp's own prefix match, cut
    at ``keep``), and the reply is the one a whole prefill gives."""
    from model.chat import build_prompt, system_head
    from model.nn.gguf import find_smollm2_gguf
    from model.tokenizer import Tokenizer

    python = llama_python_or_skip()
    tok = Tokenizer(smollm2_gguf.tokenizer_data())
    ask = ["What is the capital of France?", "What is the capital of Italy?"]
    prompts = [build_prompt(tok, [ChatMessage("user", q)], 1024) for q in ask]
    keep = len(system_head(tok))
    assert prompts[0][:keep] == prompts[1][:keep] and keep < len(prompts[1]) - 8
    stop = set(tok.stop_ids)
    with LlamaCppWorker(python, find_smollm2_gguf()) as worker:
        whole = [_reply(worker, p, 16, stop)[0] for p in prompts]
        _reply(worker, prompts[0], 16, stop)
        kept = drain(worker.generate(prompts[1], 16, stop, keep))[0]
    assert kept == whole[1] and "Italy" in tok.decode(kept)
