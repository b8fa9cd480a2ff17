"""quicksilver data --own-replies: a corpus of the diffusion model's own replies."""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import numpy as np
import pytest
import torch

from model.diffusion_engine import smollm2_diffusion_config
from model.engine import drain
from model.nn.backend import TorchBackend
from model.nn.llama import Llama
from model.sampler import SamplerSettings, sample
from tests.model.conftest import TINY, tiny_tokenizer
from training.data import Example, own_replies, prompt_ids, read_jsonl


@pytest.mark.parametrize("seed, ended", [(0, 0), (1, 5)])  # never ends / always ends
def test_own_replies_keeps_the_samplers_ended_replies(tmp_path, seed, ended):
    tok = tiny_tokenizer()
    V = tok.vocab_size
    torch.manual_seed(seed)
    model = Llama(replace(TINY, vocab_size=V, embedding_size=V + 1, max_seq_len=1024)).eval()
    with torch.no_grad():  # an end token the random model can pick
        model.tok_emb.weight[tok.im_end_id] *= 5
    backend = TorchBackend(model, max_len=1024)
    source = tmp_path / "distill"
    source.mkdir()
    questions = [f"question {i}?" for i in range(6)]
    end = [5, tok.im_end_id]
    lines = [json.dumps(asdict(Example(q, "template", "r", end, True))) for q in questions]
    (source / "train.jsonl").write_text("\n".join(lines) + "\n")
    (source / "heldout.jsonl").write_text(lines[0] + "\n")
    recipe = {"config": {"max_reply_tokens": 6, "seed": 1}, "heldout": 1}
    (source / "recipe.json").write_text(json.dumps(recipe))

    out_dir = tmp_path / "own"
    got = own_replies(backend, "tiny", tok, source, out_dir, 5, seed=3, log=lambda _: None)

    out = read_jsonl(out_dir / "train.jsonl")
    assert got["train"] == len(out) == ended and got["dropped_unended"] == 5 - ended
    assert (tmp_path / "own" / "heldout.jsonl").read_text() == lines[0] + "\n"
    assert got["config"]["trajectories"] == 5 and got["config"]["max_reply_tokens"] == 6
    config = smollm2_diffusion_config(tok)
    for e in out:  # each is exactly what the served sampler says, with its end token
        assert e.question in questions and e.ended
        rng = np.random.default_rng(3)
        prompt = prompt_ids(tok, e.question)
        ids, stats = drain(sample(backend, prompt, config, SamplerSettings(), rng, 6))
        assert stats.stopped_by == "end" and e.reply_ids == [*ids, tok.im_end_id]
