"""The self-distillation corpus: deterministic for a seed, held-out never trained on."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import torch

import training.data as data
from model.generate import greedy
from model.nn.backend import TorchBackend
from model.nn.llama import Llama
from tests.model.conftest import TINY, tiny_model, tiny_tokenizer
from training.data import (
    DataConfig,
    _norm,
    decode_batch,
    make_dataset,
    read_heldout,
    read_jsonl,
    template_questions,
    training_questions,
)

HELD = ["What is two plus two?", "Name a color."]
CONFIG = DataConfig(n=6, max_reply_tokens=8, batch=4, model_share=0.5)


def ending_model() -> Llama:
    """The tiny model with its own output head, its <|im_end|> row scaled up: it ends
    some replies inside CONFIG's budget and not others (the plain tiny model never
    writes <|im_end|>, so every reply would be dropped and the training split empty).
    Any scale from 1.5 to 3.0 writes the same corpora here."""
    model = tiny_model(0, replace(TINY, tie_embeddings=False))
    with torch.no_grad():
        model.lm_head.weight[tiny_tokenizer().im_end_id] *= 2.5
    return model


def run(tmp_path, seed: int, name: str):
    out = tmp_path / name
    cfg = replace(CONFIG, seed=seed)
    recipe = make_dataset(
        ending_model(), tiny_tokenizer(), cfg, out, log=lambda _: None, heldout=HELD
    )
    return out, recipe


def test_same_seed_same_files(tmp_path):
    a, recipe = run(tmp_path, 7, "a")
    b, _ = run(tmp_path, 7, "b")
    for f in ("heldout.jsonl", "train.jsonl", "recipe.json"):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    held = read_jsonl(a / "heldout.jsonl")
    assert [e.question for e in held] == HELD
    # some replies ended inside the budget and were kept, the others were dropped
    assert recipe["train"] >= 1 and recipe["dropped_unended"] >= 1
    assert recipe["train"] + recipe["dropped_unended"] == CONFIG.n
    c, _ = run(tmp_path, 8, "c")
    qs = lambda d: [e.question for e in read_jsonl(d / "train.jsonl")]  # noqa: E731
    assert len(qs(a)) == recipe["train"] and qs(c)
    assert qs(a) != qs(c)


def test_train_questions_never_hold_out_questions(tmp_path):
    out, recipe = run(tmp_path, 7, "a")
    train = read_jsonl(out / "train.jsonl")
    assert len(train) == recipe["train"] >= 1
    held = {_norm(q) for q in read_heldout()}
    assert all(_norm(e.question) not in held for e in train)
    im_end = tiny_tokenizer().im_end_id
    assert all(e.ended and e.reply_ids[-1] == im_end for e in train)
    assert all(im_end not in e.reply_ids[:-1] for e in train)


def test_a_drawn_held_out_question_is_not_a_training_question(tmp_path, monkeypatch):
    """Templates that can write a held-out question: it is drawn, and dropped."""
    countries = ["Australia", "France", "Peru", "Japan", "Kenya", "Chile"]
    topics = json.loads(data.TEMPLATES_FILE.read_text())["topics_for_model_questions"]
    templates = {
        "templates": ["What is the capital of {country}?"],
        "slots": {"country": countries},
        "topics_for_model_questions": topics,
    }
    assert "What is the capital of Australia?" in read_heldout()
    (tmp_path / "templates.json").write_text(json.dumps(templates))
    monkeypatch.setattr(data, "TEMPLATES_FILE", tmp_path / "templates.json")
    cfg = replace(CONFIG, seed=7)  # the tiny model writes no questions of its own
    got = training_questions(tiny_model(), tiny_tokenizer(), cfg, log=lambda _: None)
    assert sorted(q for q, _ in got) == sorted(
        f"What is the capital of {c}?" for c in countries[1:]
    )
    assert {src for _, src in got} == {"template"}


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
