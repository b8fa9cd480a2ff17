from __future__ import annotations

import torch

from model.engine import GenerationStats, drain
from model.generate import greedy
from model.nn.backend import TorchBackend
from tests.model.conftest import tiny_model

PROMPT = [5, 17, 42, 7, 99, 3]


@torch.inference_mode()
def greedy_without_cache(model, prompt, n) -> list[int]:
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt) :]


def test_cached_greedy_matches_recomputing_everything() -> None:
    model = tiny_model()
    out, stats = drain(greedy(TorchBackend(model, 128), PROMPT, 10, stop_ids=()))
    assert out == greedy_without_cache(model, PROMPT, 10)
    assert stats == GenerationStats(tokens=10, forward_passes=10, stopped_by="budget")


def test_stops_at_a_stop_token_without_yielding_it() -> None:
    model = tiny_model()
    free, _ = drain(greedy(TorchBackend(model, 128), PROMPT, 10, stop_ids=()))
    stop = free[3]
    k = free.index(stop)  # first occurrence
    out, stats = drain(greedy(TorchBackend(model, 128), PROMPT, 10, stop_ids={stop}))
    assert out == free[:k]
    assert stats == GenerationStats(tokens=k, forward_passes=k + 1, stopped_by="end")


def test_should_stop_is_checked_before_every_pass() -> None:
    model = tiny_model()
    passes = 0
    received: list[int] = []
    gen = greedy(
        TorchBackend(model, 128), PROMPT, 50, stop_ids=(), should_stop=lambda: len(received) >= 3
    )

    def count(*_):
        nonlocal passes
        passes += 1

    model.register_forward_pre_hook(count)
    for token in gen:
        received.append(token)  # after the 3rd token the flag turns true
    # the 3 passes that made the tokens, and not one more
    assert passes == 3


def test_should_stop_true_from_the_start_runs_nothing() -> None:
    out, stats = drain(
        greedy(TorchBackend(tiny_model(), 128), PROMPT, 50, stop_ids=(), should_stop=lambda: True)
    )
    assert out == [] and stats == GenerationStats(0, 0, "cancel")


def test_cancel_stats() -> None:
    received: list[int] = []
    gen = greedy(
        TorchBackend(tiny_model(), 128),
        PROMPT,
        50,
        stop_ids=(),
        should_stop=lambda: len(received) >= 2,
    )
    while True:
        try:
            received.append(next(gen))
        except StopIteration as done:
            assert done.value == GenerationStats(tokens=2, forward_passes=2, stopped_by="cancel")
            break


def test_budget() -> None:
    out, stats = drain(greedy(TorchBackend(tiny_model(), 128), PROMPT, 4, stop_ids=()))
    assert len(out) == 4 and stats == GenerationStats(4, 4, "budget")
    assert (
        drain(greedy(TorchBackend(tiny_model(), 128), PROMPT, 0, stop_ids=()))[1].stopped_by
        == "budget"
    )
