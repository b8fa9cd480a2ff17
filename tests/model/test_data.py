"""The self-distillation corpus: deterministic for a seed, held-out never trained on."""

from __future__ import annotations

import random

import torch

from model.generate import greedy
from model.nn.backend import TorchBackend
from model.training.data import (
    DataConfig,
    _norm,
    decode_batch,
    make_dataset,
    read_heldout,
    read_jsonl,
    template_questions,
)
from tests.model.conftest import tiny_model, tiny_tokenizer

HELD = ["What is two plus two?", "Name a color."]


def run(tmp_path, seed: int, name: str):
    out = tmp_path / name
    cfg = DataConfig(seed=seed, n=6, max_reply_tokens=6, batch=4, model_share=0.5)
    recipe = make_dataset(
        tiny_model(), tiny_tokenizer(), cfg, out, log=lambda _: None, heldout=HELD
    )
    return out, recipe


def test_same_seed_same_files(tmp_path):
    a, recipe = run(tmp_path, 7, "a")
    b, _ = run(tmp_path, 7, "b")
    for f in ("heldout.jsonl", "train.jsonl", "recipe.json"):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    held = read_jsonl(a / "heldout.jsonl")
    assert [e.question for e in held] == HELD
    assert recipe["train"] + recipe["dropped_unended"] >= 1
    c, _ = run(tmp_path, 8, "c")
    qs = lambda d: [e.question for e in read_jsonl(d / "train.jsonl")]  # noqa: E731
    assert qs(a) != qs(c) or not qs(a)


def test_train_questions_never_hold_out_questions(tmp_path):
    out, _ = run(tmp_path, 7, "a")
    held = {_norm(q) for q in read_heldout()}
    assert all(_norm(e.question) not in held for e in read_jsonl(out / "train.jsonl"))
    assert all(e.ended and e.reply_ids[-1] == 2 for e in read_jsonl(out / "train.jsonl"))


def test_template_questions_are_distinct_and_seeded():
    templates = {"templates": ["How big is {x}?", "Where is {x}?"], "slots": {"x": list("abcd")}}
    a = template_questions(random.Random(1), 5, templates)
    assert a == template_questions(random.Random(1), 5, templates)
    assert len(a) == len(set(a)) == 5


def test_batched_greedy_equals_one_at_a_time():
    """Left padding, masked pad keys and per-row positions change nothing."""
    model = tiny_model()
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
    stops = {2}
    for prompt, (ids, _) in zip(prompts, decode_batch(model, prompts, 8, stops), strict=True):
        assert ids == list(greedy(TorchBackend(model, 128), prompt, 8, stops))


def test_finished_rows_leave_the_batch_without_changing_the_others():
    """A row that ends early is dropped from the batch (and its cache rows with it)."""
    model = tiny_model()
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14], [15]]
    free = [list(greedy(TorchBackend(model, 128), p, 8, set())) for p in prompts]
    stop = free[1][2]  # row 1 ends at its third token, before the others
    stops = {stop}
    got = decode_batch(model, prompts, 8, stops)
    want = [list(greedy(TorchBackend(model, 128), p, 8, stops)) for p in prompts]
    assert [ids for ids, _ in got] == want
    assert got[1][1] and len(got[1][0]) < 8
    assert any(not ended for _, ended in got), "every row ended: compaction not exercised"


def test_sampling_is_seeded():
    model = tiny_model()
    p = [[5, 6, 7], [8, 9]]
    run1 = decode_batch(model, p, 6, {2}, 1.0, torch.Generator().manual_seed(3))
    run2 = decode_batch(model, p, 6, {2}, 1.0, torch.Generator().manual_seed(3))
    assert run1 == run2
