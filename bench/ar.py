"""Benchmark: SmolLM2 greedy decoding, eager PyTorch, fp32 vs bf16, on 2 threads.

    python -m bench.ar [repeats]

Prints medians over repeats (interleaved, so both dtypes see the same machine load)
and the bf16/fp32 ratio, and whether both produce the same greedy tokens.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from model.chat import build_prompt
from model.engine import ChatMessage
from model.generate import greedy
from model.nn.backend import TorchBackend
from model.nn.gguf import GGUFFile, find_smollm2_gguf
from model.nn.llama import Llama
from model.tokenizer import Tokenizer

QUESTION = "My flight lands at nine tonight. What should I do first when I reach the hotel?"
N_NEW = 40
AGREEMENT_QUESTIONS = [
    "What is the capital of France?",
    "What's a good way to fall asleep faster?",
    "How long should I boil an egg?",
    "Can you tell me a fun fact about octopuses?",
    "What is the weather usually like in London in spring?",
]


def run_once(model: Llama, prompt: list[int]) -> tuple[list[int], float, float]:
    """Tokens, seconds to the first token (prefill), seconds for the whole reply."""
    t0 = time.perf_counter()
    backend = TorchBackend(model, max_len=len(prompt) + N_NEW)
    it = greedy(backend, prompt, N_NEW, stop_ids=())  # no stop ids: always N_NEW tokens
    first = next(it)
    t1 = time.perf_counter()
    tokens = [first, *it]
    return tokens, t1 - t0, time.perf_counter() - t0


def main(repeats: int = 5) -> None:
    torch.set_num_threads(2)
    t0 = time.perf_counter()
    f = GGUFFile(find_smollm2_gguf())
    config = f.llama_config()
    state = f.state_dict(config)
    tok = Tokenizer(f.tokenizer_data())
    models = {d: Llama.from_state_dict(config, state, d) for d in (torch.float32, torch.bfloat16)}
    print(f"load (both dtypes): {time.perf_counter() - t0:.1f} s")
    prompt = build_prompt(tok, [ChatMessage("user", QUESTION)], 1024)
    print(f"prompt {len(prompt)} tokens, reply {N_NEW} tokens, threads {torch.get_num_threads()}")
    results: dict[torch.dtype, list[tuple[float, float]]] = {d: [] for d in models}
    outputs = {}
    for d, m in models.items():  # warm-up
        outputs[d] = run_once(m, prompt)[0]
    for _ in range(repeats):
        for d, m in models.items():
            _, ttft, total = run_once(m, prompt)
            results[d].append((ttft, total))
    med = {}
    for d, rs in results.items():
        ttft = statistics.median(r[0] for r in rs)
        total = statistics.median(r[1] for r in rs)
        decode = statistics.median((N_NEW - 1) / (r[1] - r[0]) for r in rs)
        med[d] = N_NEW / total
        print(
            f"{d!s:15s} prefill {ttft * 1e3:6.0f} ms  decode {decode:5.1f} tok/s  "
            f"reply {N_NEW / total:5.1f} tok/s (median of {repeats})"
        )
    print(f"bf16 / fp32 reply speed: {med[torch.bfloat16] / med[torch.float32]:.2f}x")
    same = outputs[torch.float32] == outputs[torch.bfloat16]
    print(f"same greedy tokens: {same}")
    for d, out in outputs.items():
        print(f"{d!s:15s} {tok.decode(out)!r}")
    agreement(models, tok)


def agreement(models: dict[torch.dtype, Llama], tok: Tokenizer) -> None:
    """Do the dtypes give the same greedy replies (up to 80 tokens) to other questions?"""
    same = 0
    for q in AGREEMENT_QUESTIONS:
        prompt = build_prompt(tok, [ChatMessage("user", q)], 1024)
        a, b = (
            list(greedy(TorchBackend(m, len(prompt) + 80), prompt, 80, tok.stop_ids))
            for m in models.values()
        )
        diff = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        same += a == b
        print(f"  {q!r}: {'same' if a == b else f'first differs at token {diff}'}")
    print(f"same greedy replies: {same}/{len(AGREEMENT_QUESTIONS)}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
