"""quicksilver eval llm: the measures, and the command end to end on two questions."""

from __future__ import annotations

import json

import pytest
import torch

from cli.main import main
from tests.model.conftest import tiny_model, tiny_tokenizer
from training.eval import (
    GOALS,
    Replies,
    distinct_bigrams,
    ends_a_sentence,
    from_references,
    headline,
    per_token,
    reply_nll,
)


def test_distinct_bigrams():
    assert distinct_bigrams([1, 2, 3, 4]) == 1.0
    assert distinct_bigrams([1, 2, 1, 2, 1]) == 0.5  # (1,2) (2,1) (1,2) (2,1)
    assert distinct_bigrams([7]) == 1.0


def test_references_are_cut_to_the_budget():
    r = from_references([[5, 6, 2], [5, 6, 7, 8, 2], [5, 6, 7]], end_id=2, max_tokens=3)
    assert r.ids == [[5, 6], [5, 6, 7], [5, 6, 7]]
    assert r.ended == [True, False, False]
    assert r.passes == [3, 3, 3]


def test_reply_nll_is_teacher_forced_and_counts_the_end_token():
    model, tok = tiny_model(), tiny_tokenizer()
    prompts = [[5, 6, 7], [8, 9]]
    r = Replies([[10, 11], [12]], [True, False], [3, 1])
    got = reply_nll(model, tok, prompts, r, batch=2)
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([[5, 6, 7, 10, 11]])), -1)[0]
    want = -(logp[2, 10] + logp[3, 11] + logp[4, tok.im_end_id])
    assert got[0][1] == 3 and got[0][0] == pytest.approx(float(want), rel=1e-5)
    assert got[1][1] == 1
    assert per_token(got) == pytest.approx((got[0][0] + got[1][0]) / 4)


@pytest.mark.models
@pytest.mark.slow
def test_eval_command_end_to_end(tmp_path, smollm2_gguf):
    prompts = tmp_path / "q.txt"
    prompts.write_text("What is the capital of France?\nName a fruit.\n")
    out = tmp_path / "eval.json"
    argv = ["eval", "llm", "--prompts", str(prompts), "--data", str(tmp_path / "none")]
    argv += ["--max-tokens", "8", "--block-size", "4", "--threshold", "0.9", "--json", str(out)]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    s = report["summary"]
    # the engines' default fallback; the served adapter's replies end after a sentence
    assert s["setting"] == "diffusion-B4-th0.9-left-sentend"
    assert [row["setting"] for row in report["rows"]] == ["ar-greedy", "ar-t0.7", s["setting"]]
    assert {name: len(r) for name, r in report["replies"].items()} == {
        "ar-greedy": 2,
        "ar-sampled": 2,
        s["setting"]: 2,
    }
    for row in report["rows"]:  # rates over two replies: 0, 1/2 or 1
        assert 2 * row["clean_end_rate"] in (0, 1, 2), row
        assert 2 * row["whole_sentence_rate"] in (0, 1, 2), row
        assert row["whole_sentence_rate"] <= row["clean_end_rate"], row
    # greedy AR: one pass per token, and one more for each reply that ended
    ar = report["rows"][0]
    assert ar["passes_per_reply"] == ar["tokens_per_reply"] + ar["clean_end_rate"]
    # diffusion: a prefill, at most 4 steps in each of the two blocks of 4, one commit
    assert 2 <= s["passes_per_reply"] <= 1 + 2 * 4 + 1
    # the headline is the first diffusion setting's row beside the sampled AR row's
    rows = report["rows"]
    assert s["nll_diffusion"] == rows[2]["nll_per_token"]
    assert s["nll_ar_sampled"] == rows[1]["nll_per_token"]
    assert s["similarity_median"] == rows[2]["similarity_median"]
    assert "similarity_median" not in rows[0]  # the greedy replies are the references
    assert set(s["goals"]) == {"nll_no_worse", "similarity_median", "clean_end_rate"}


def _row(nll: float, similarity: float = 0.0, clean: float = 1.0) -> dict[str, float]:
    keys = ("whole_sentence_rate", "distinct_bigrams", "passes_per_reply")
    return {
        "setting": "x",
        "nll_per_token": nll,
        "similarity_median": similarity,
        "clean_end_rate": clean,
        **dict.fromkeys(keys, 0.0),
    }


@pytest.mark.parametrize(
    ("diffusion", "met"),
    [
        (_row(1.0, 0.9, 1.0), (True, True, True)),
        (_row(2.5, 0.5, 0.9), (False, False, False)),
        (_row(2.0, GOALS["similarity_median"], GOALS["clean_end_rate"]), (True, True, True)),
    ],
)
def test_the_headline_says_which_goals_the_diffusion_setting_meets(diffusion, met):
    """Against the sampled AR replies' NLL (2.0) and the fixed goals; a figure exactly at
    its goal meets it."""
    s = headline([_row(1.5), _row(2.0), diffusion])
    assert tuple(s["goals"].values()) == met
    assert list(s["goals"]) == ["nll_no_worse", "similarity_median", "clean_end_rate"]


@pytest.mark.models
@pytest.mark.slow
def test_eval_scores_the_exported_int8_model(tmp_path, smollm2_gguf, model_cache):
    """--onnx: the diffusion replies come from the served int8 graph, not PyTorch."""
    from export.build import ensure_model_dir
    from model.modeldir import shipped_adapter

    # what serve builds, once per test session, in its cache (tests/conftest.py)
    model_dir = ensure_model_dir(model_cache, adapter=shipped_adapter())
    prompts = tmp_path / "q.txt"
    prompts.write_text("Name a fruit.\n")
    out = tmp_path / "eval.json"
    argv = ["eval", "llm", "--prompts", str(prompts), "--data", str(tmp_path / "none")]
    argv += ["--max-tokens", "8", "--block-size", "4", "--onnx", str(model_dir)]
    assert main([*argv, "--fallback", "leftmost", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["diffusion_runtime"] == "onnx-int8"
    manifest = json.loads((model_dir / "manifest.json").read_text())
    assert report["adapter_manifest"] == manifest["source"]["adapter"]  # what the graph holds
    # as served: the served adapter was trained on calls, so its replies end only after
    # a sentence's end, and the setting's name says so against the sampler's default
    assert report["summary"]["setting"] == "diffusion-B4-th0.9-left-sentend-onnx-int8"
    assert report["summary"]["passes_per_reply"] >= 2


def test_eval_refuses_a_graph_the_model_directory_lacks(tmp_path, capsys):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    files = {"model.int8.onnx": {"bytes": 1}, "tokenizer.json": {"bytes": 1}}
    (model_dir / "manifest.json").write_text(json.dumps({"files": files}))
    argv = ["eval", "llm", "--onnx", str(model_dir), "--onnx-variant", "fp32"]
    assert main([*argv, "--json", str(tmp_path / "eval.json")]) == 2
    assert "has no fp32 graph (it has model.int8.onnx)" in capsys.readouterr().err


def test_eval_scores_the_settings_the_engines_serve():
    """Without options the eval decodes exactly as the served engines (and the bench's
    diffusion decoder, which takes DiffusionOptions().sampler) do."""
    from model.diffusion_engine import DiffusionOptions
    from model.sampler import SamplerSettings
    from training.eval import EvalOptions, sampler_settings

    assert sampler_settings(EvalOptions()) == [DiffusionOptions().sampler]
    # the engines' decoding is the sampler's defaults and the repeat stop
    assert DiffusionOptions().sampler == SamplerSettings(stop_repeats=True)
    stops = sampler_settings(EvalOptions(stop_repeats=(False, True)))
    assert [s.stop_repeats for s in stops] == [False, True]
    two = sampler_settings(EvalOptions(thresholds=(0.9, 0.7), fallbacks=("confident",)))
    assert [(s.threshold, s.fallback) for s in two] == [(0.9, "confident"), (0.7, "confident")]
    ends = sampler_settings(EvalOptions(end_lookaheads=(0, None)))
    assert [s.end_lookahead for s in ends] == [0, None]
    sentences = sampler_settings(EvalOptions(sentence_ends=(False, True)))
    assert [s.ends_after_sentence for s in sentences] == [False, True]
    # blocks of one end replies as the host's narrow schedule does (model.schedule)
    from model.schedule import sampler_for

    (narrow,) = sampler_settings(EvalOptions(block_size=1))
    assert narrow == sampler_for(DiffusionOptions().sampler, 1) and narrow.end_bar is not None
    (bar,) = sampler_settings(EvalOptions(block_size=1, end_bars=(None,)))
    assert bar.end_bar is None and bar.wrap_after == narrow.wrap_after


def test_end_lookahead_option_takes_a_count_or_any():
    import argparse

    from training.commands import _lookahead

    assert _lookahead("4") == 4 and _lookahead("any") is None
    with pytest.raises(argparse.ArgumentTypeError, match="'any'"):
        _lookahead("-1")


def test_history_takes_the_next_held_out_turns_cyclically(tmp_path):
    from training.eval import EvalOptions, earlier_turns

    rows = [
        {"question": f"q{i}?", "source": "heldout", "reply": f" r{i}.", "reply_ids": [i, 2]}
        for i in range(3)
    ]
    (tmp_path / "heldout.jsonl").write_text(
        "".join(json.dumps({**r, "ended": True}) + "\n" for r in rows)
    )
    opts = EvalOptions(data=tmp_path, history=2)
    assert earlier_turns(opts, 0) == [("q1?", "r1."), ("q2?", "r2.")]
    assert earlier_turns(opts, 2) == [("q0?", "r0."), ("q1?", "r1.")]
    assert earlier_turns(EvalOptions(data=tmp_path), 0) == []
    with pytest.raises(FileNotFoundError, match="--history 3 needs more than 3"):
        earlier_turns(EvalOptions(data=tmp_path, history=3), 0)


def test_a_whole_sentence_ends_on_its_last_mark():
    assert ends_a_sentence("The capital of Australia is Canberra.")
    assert ends_a_sentence('He said "Hola!" ') and ends_a_sentence("Really?)")
    assert not ends_a_sentence("Good morning in Spanish is")
    assert not ends_a_sentence("1. Boil water.\n2. Add tea,") and not ends_a_sentence("")


def test_eval_bans_the_openings_the_diffusion_engine_bans():
    from model.diffusion_engine import DiffusionOptions
    from model.engine import ChatMessage
    from model.openings import reply_openings
    from training.eval import EvalOptions, openings

    tok = tiny_tokenizer()
    history = [("Hi", "Hello there. I am fine.")]
    got = openings(tok, "Play jazz.", history, EvalOptions(opening_ban=3))
    want = {tuple(tok.encode_plain(t)[:3]) for t in ("Play jazz.", "Hello there.")}
    assert set(got) == want  # the earlier reply's and the question's, not the earlier question
    assert openings(tok, "Play jazz.", history, EvalOptions(opening_ban=0)) == ()
    default = reply_openings(tok, [ChatMessage("user", "x")], DiffusionOptions().opening_ban)
    assert openings(tok, "x", [], EvalOptions()) == default
