"""The block-diffusion training objective on tiny random models."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from model.nn.adapter import attach_lora
from model.nn.backend import TorchBackend
from model.nn.llama import Llama
from tests.model.conftest import TINY
from training.train import (
    TrainConfig,
    build,
    certainty_loss,
    confident_share,
    diffusion_loss,
    forward_rows,
    make_batch,
    noise_block,
    pad_reply,
    parse_overrides,
    predictor_rows,
    train_step,
)

V = TINY.vocab_size
MASK = V  # the extra embedding row
CFG = replace(TINY, embedding_size=V + 1)


def tiny_diffusion(seed: int = 0) -> Llama:
    torch.manual_seed(seed)
    return Llama(CFG).eval()


def test_pad_reply_fills_the_last_block_with_end():
    assert pad_reply([5, 6, 7, 9], 3, 9) == [5, 6, 7, 9, 9, 9]
    assert pad_reply([5, 9], 2, 9) == [5, 9]


def test_noise_block_masks_only_inside_the_block():
    x0 = torch.arange(10, 20)
    gen = torch.Generator().manual_seed(0)
    x, masked = noise_block(x0, 4, 8, 1.0, MASK, gen)  # t = 1: everything in the block
    assert masked.tolist() == [False] * 4 + [True] * 4 + [False] * 2
    assert x.tolist() == [10, 11, 12, 13, MASK, MASK, MASK, MASK, 18, 19]
    rates = [noise_block(x0, 0, 10, 0.3, MASK, gen)[1].float().mean() for _ in range(400)]
    assert abs(float(torch.stack(rates).mean()) - 0.3) < 0.03


def test_loss_weights_masked_positions_by_one_over_t():
    # Two examples, block size 2 -> 4 block positions. Example 1 (t = 0.5) has masked
    # positions with CE a and b; example 2 (t = 0.25) one position with CE c.
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 3.0]])
    targets = torch.tensor([0, 2, 1])
    weights = torch.tensor([2.0, 2.0, 4.0])
    ce = [
        -math.log(math.e**2 / (math.e**2 + 2)),
        -math.log(1 / (2 + math.e)),
        -math.log(1 / (2 + math.e**3)),
    ]
    expected = (ce[0] / 0.5 + ce[1] / 0.5 + ce[2] / 0.25) / 4
    assert float(diffusion_loss(logits, targets, weights, 4)) == pytest.approx(expected)


def test_make_batch_layout_rows_targets_and_weights():
    # prompt of 3, reply of 2 blocks of 2; t = 1 masks every reply position
    cfg = TrainConfig(block_size=2)
    prompt, reply = [1, 2, 3], [10, 11, 12, 13]
    gen = torch.Generator().manual_seed(0)
    batch = make_batch([(prompt, reply)], cfg, MASK, gen, t=torch.tensor([1.0]))
    assert batch.idx[0].tolist() == prompt + reply + [MASK] * 4
    assert batch.pos[0].tolist() == [0, 1, 2, 3, 4, 5, 6, 3, 4, 5, 6]  # noised copy in place
    # Dream shift: block 0 from the last prompt row (2), then its own noised row (7);
    # block 1 from the last clean row of block 0 (4), then its own noised row (9)
    assert batch.rows.tolist() == [2, 7, 4, 9]
    assert batch.targets.tolist() == reply
    assert batch.weights.tolist() == [1.0] * 4
    assert (batch.n_positions, batch.n_tokens) == (4, 11)


def contract_mask(P: int, R: int, B: int) -> torch.Tensor:
    """The block-causal training pattern (docs/diffusion.md) written out by hand for
    [prompt | clean reply | noised reply]: prompt causal; clean block k sees the prompt
    and clean blocks <= k; noised block k sees the prompt, clean blocks < k and its own
    noised block."""
    T = P + 2 * R
    m = torch.zeros(T, T, dtype=torch.bool)
    for i in range(T):
        for j in range(T):
            if i < P:
                m[i, j] = j <= i
            elif i < P + R:
                k = (i - P) // B
                m[i, j] = j < P + (k + 1) * B
            else:
                k = (i - P - R) // B
                own = P + R + k * B <= j < P + R + (k + 1) * B
                m[i, j] = j < P + k * B or own
    return m


def test_attention_mask_is_the_contracts():
    cfg = TrainConfig(block_size=4)
    items = [([1, 2, 3], list(range(20, 32))), ([1, 2, 3, 4, 5], list(range(40, 48)))]
    gen = torch.Generator().manual_seed(3)
    batch = make_batch(items, cfg, MASK, gen)
    T = batch.idx.shape[1]
    for n, (prompt, reply) in enumerate(items):
        n_real = len(prompt) + 2 * len(reply)
        real = batch.attn[n, 0, :n_real, :n_real]
        assert torch.equal(real, contract_mask(len(prompt), len(reply), 4))
        assert not batch.attn[n, 0, :n_real, n_real:].any()  # nothing real sees a pad
        assert batch.attn[n, 0, n_real:, n_real:].equal(torch.eye(T - n_real, dtype=torch.bool))


def test_training_logits_equal_the_samplers_cached_block_steps():
    """For every block, the training pass predicts what the sampler would: causal
    prefill, the clean blocks before it committed, one step over the noised block."""
    model = tiny_diffusion()
    B, prompt = 4, [5, 6, 7, 8, 9]
    clean = [20, 21, 22, 23, 30, 31, 32, 33, 40, 41, 42, 43]
    noised = [MASK, 21, MASK, MASK, 30, MASK, MASK, 33, MASK, MASK, MASK, MASK]
    P, R = len(prompt), len(clean)
    idx = torch.tensor([prompt + clean + noised])
    pos = torch.tensor([[*range(P + R), *range(P, P + R)]])
    attn = contract_mask(P, R, B)[None, None]
    rows = predictor_rows(P, R, B)
    with torch.no_grad():
        got = forward_rows(model, model.tok_emb.weight[MASK], idx, pos, attn, rows)
    be = TorchBackend(model, max_len=64)
    ids = lambda xs: np.array(xs, dtype=np.int64)  # noqa: E731
    for k in range(R // B):
        cache = be.new_cache()
        last = be.step(cache, ids(prompt), "causal", commit=True)[-1]
        for c in range(k):
            last = be.step(cache, ids(clean[c * B : (c + 1) * B]), "block", commit=True)[-1]
        block = be.step(cache, ids(noised[k * B : (k + 1) * B]), "block", commit=False)
        want = np.concatenate([last[None], block[:-1]])
        np.testing.assert_allclose(got[k * B : (k + 1) * B].numpy(), want, rtol=1e-4, atol=1e-5)


def test_loss_decreases_on_a_tiny_batch():
    model = tiny_diffusion()
    with torch.no_grad():  # N(0, 0.02) tied embeddings cap a tiny model's logits near 0
        model.tok_emb.weight.mul_(10)
    cfg = TrainConfig(block_size=4, rank=8, alpha=16, lr=1e-2, mask_lr=1e-2, warmup=1)
    cfg = replace(cfg, max_steps=1000, bf16=False)
    params, mask_emb, opt = build(cfg, model)
    items = [([1, 2, 3], [10, 11, 12, 13, 14, 15, 16, 2]), ([4, 5], [20, 21, 22, 2])]
    gen = torch.Generator().manual_seed(0)
    batch = make_batch(items, cfg, MASK, gen, t=torch.tensor([0.7, 0.9]))
    losses = [train_step(model, mask_emb, opt, params, batch, cfg, s) for s in range(30)]
    assert max(losses[-5:]) < 0.5 * losses[0], losses
    # only the adapter and the mask row moved
    assert all(not p.requires_grad for n, p in model.named_parameters() if "lora" not in n)


def test_certainty_loss_is_the_entropy_of_right_predictions_only():
    # row 0 right (argmax 0 = target), row 1 wrong (argmax 1, target 2), row 2 right
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 3.0]])
    targets = torch.tensor([0, 2, 2])

    def entropy(row: torch.Tensor, temp: float) -> float:
        p = (row / temp).softmax(-1)
        return float(-(p * p.log()).sum())

    want = (entropy(logits[0], 0.5) + entropy(logits[2], 0.5)) / 2
    assert math.isclose(float(certainty_loss(logits, targets, 0.5)), want, rel_tol=1e-6)
    assert float(certainty_loss(logits, torch.tensor([1, 0, 0]), 0.5)) == 0.0  # none right
    # its gradient sharpens the right rows and leaves the wrong one to the cross-entropy
    x = logits.clone().requires_grad_(True)
    certainty_loss(x, targets, 0.5).backward()
    assert x.grad[1].abs().sum() == 0 and x.grad[0, 0] < 0 and x.grad[2, 2] < 0
    # the share a threshold sampler could commit: right and sure enough
    assert confident_share(logits, targets, 0.8) == pytest.approx(1 / 3)  # row 2 (p 0.91)
    assert confident_share(logits, targets, 0.7) == pytest.approx(2 / 3)  # and row 0 (0.79)


def test_certainty_forcing_raises_the_confident_share():
    model = tiny_diffusion()
    with torch.no_grad():
        model.tok_emb.weight.mul_(10)
    items = [([1, 2, 3], [10, 11, 12, 13, 14, 15, 16, 2]), ([4, 5], [20, 21, 22, 2])]
    shares, entropy = {}, {}
    for weight in (0.0, 1.0):
        m = tiny_diffusion()
        m.load_state_dict(model.state_dict())
        cfg = TrainConfig(block_size=4, rank=8, alpha=16, lr=1e-2, mask_lr=1e-2, warmup=1)
        cfg = replace(cfg, max_steps=1000, bf16=False, certainty=weight)
        params, mask_emb, opt = build(cfg, m)
        t = torch.tensor([1.0, 1.0])  # every reply position masked
        batch = make_batch(items, cfg, MASK, torch.Generator().manual_seed(0), t)
        for s in range(12):
            train_step(m, mask_emb, opt, params, batch, cfg, s)
        with torch.no_grad():
            logits = forward_rows(m, mask_emb, batch.idx, batch.pos, batch.attn, batch.rows)
        # a tiny model after 12 steps is far from 0.9 sure: compare at a low threshold
        shares[weight] = confident_share(logits, batch.targets, 0.3)
        entropy[weight] = float(certainty_loss(logits, batch.targets, 1.0))
    assert shares[1.0] > shares[0.0], shares
    assert entropy[1.0] < entropy[0.0], entropy


def test_init_starts_from_a_saved_adapter(tmp_path):
    from model.nn.adapter import extract_adapter, save_adapter
    from training.train import evaluate, heldout_batches

    cfg = TrainConfig(block_size=4, rank=8, alpha=16, lr=1e-2, mask_lr=1e-2, warmup=1)
    cfg = replace(cfg, max_steps=1000, bf16=False)
    model = tiny_diffusion()
    params, mask_emb, opt = build(cfg, model)
    items = [([1, 2, 3], [10, 11, 12, 13, 14, 15, 16, 2]), ([4, 5], [20, 21, 22, 2])]
    batch = make_batch(items, cfg, MASK, torch.Generator().manual_seed(0))
    for s in range(3):
        train_step(model, mask_emb, opt, params, batch, cfg, s)
    save_adapter(tmp_path / "a", extract_adapter(model, mask_emb, 8, 16), dtype=torch.float32)
    held = heldout_batches(items, cfg, MASK)

    again = tiny_diffusion()
    _, mask2, _ = build(replace(cfg, init=str(tmp_path / "a")), again)
    assert evaluate(again, mask2, held, cfg) == pytest.approx(evaluate(model, mask_emb, held, cfg))
    with pytest.raises(ValueError, match="rank 8"):
        build(replace(cfg, rank=4, init=str(tmp_path / "a")), tiny_diffusion())


def test_attach_lora_starts_as_the_base_model():
    model = tiny_diffusion()
    x = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        before = model(x)
        attach_lora(model, 4, 8)
        after = model(x)
    torch.testing.assert_close(before, after)


def test_parse_overrides_types_values():
    cfg = parse_overrides(TrainConfig(), ["block_size=16", "lr=3e-4", "bf16=false", "schedule=low"])
    assert (cfg.block_size, cfg.lr, cfg.bf16, cfg.schedule) == (16, 3e-4, False, "low")
    with pytest.raises(ValueError, match="no setting 'steps'"):
        parse_overrides(TrainConfig(), ["steps=10"])
    with pytest.raises(ValueError, match="max_steps takes int values"):
        parse_overrides(TrainConfig(), ["max_steps=ten"])


def test_history_puts_earlier_turns_before_the_question_and_keeps_the_reply():
    from model.chat import ChatMessage, build_prompt
    from tests.model.conftest import tiny_tokenizer
    from training.data import PROMPT_BUDGET, Example, prompt_ids
    from training.train import encode_examples, with_history

    tok = tiny_tokenizer()
    examples = [
        Example(f"question {i}?", "template", f"reply {i}.", [40 + i, tok.im_end_id], True)
        for i in range(5)
    ]
    items = encode_examples(tok, examples, 2)
    cfg = TrainConfig(history=2)
    got = with_history(tok, examples, [0, 1, 2, 3], items, cfg, torch.Generator().manual_seed(0))
    again = with_history(tok, examples, [0, 1, 2, 3], items, cfg, torch.Generator().manual_seed(0))
    assert got == again  # seeded
    assert [r for _, r in got] == [items[i][1] for i in range(4)]  # the targets stay
    lengths = [len(p) - len(items[i][0]) for i, (p, _) in enumerate(got)]
    assert any(n > 0 for n in lengths) and all(n >= 0 for n in lengths)
    for i, (p, _) in enumerate(got):  # always the picked question last
        assert tok.decode(p).endswith(f"user\nquestion {i}?\nassistant\n")  # specials dropped
    # the conversation layout is the engines' (build_prompt), earlier turns first
    turn = [ChatMessage("user", "question 4?"), ChatMessage("assistant", "reply 4.")]
    want = build_prompt(tok, [*turn, ChatMessage("user", "question 0?")], PROMPT_BUDGET)
    assert prompt_ids(tok, "question 0?", [("question 4?", "reply 4.")]) == want


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a host without a GPU")
def test_train_device_says_plainly_when_there_is_no_gpu():
    from training.train import train_device

    assert train_device("auto") == torch.device("cpu")
    assert train_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="sees no CUDA GPU"):
        train_device("cuda")
    with pytest.raises(ValueError, match="sees no CUDA GPU"):
        build(replace(TrainConfig(), device="cuda:0"), tiny_diffusion())
    for bad in ("gpu", "meta"):
        with pytest.raises(ValueError, match="use cpu, cuda, cuda:N or auto"):
            train_device(bad)


def test_train_device_refuses_a_gpu_index_past_the_last(monkeypatch):
    from training.train import train_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert train_device("cuda:0") == torch.device("cuda", 0)
    assert train_device("cuda") == torch.device("cuda")
    with pytest.raises(ValueError, match=r"device=cuda:1: PyTorch sees 1 GPU\(s\) here"):
        train_device("cuda:1")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a host without a GPU")
def test_train_command_refuses_a_missing_gpu_before_loading(tmp_path, capsys):
    from cli.main import main

    argv = ["train", "--out", str(tmp_path / "run"), "--set", "device=cuda"]
    assert main(argv) == 2
    assert "sees no CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # nothing loaded, nothing written
    assert main(["train", "--out", str(tmp_path / "run"), "--set", "max_step=3"]) == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a host without a GPU")
def test_model_commands_run_without_the_server_and_refuse_a_missing_gpu(tmp_path):
    """``python -m training`` (what a GPU host runs: gpu_distill.sh) needs no
    server dependency, and ``data --device cuda`` without a GPU stops before loading."""
    import subprocess
    import sys

    probe = (
        "import sys; from training.__main__ import main; rc = main(sys.argv[1:]); "
        "print(rc, sorted(m for m in ('websockets', 'faster_whisper', 'piper', 'server') "
        "if m in sys.modules))"
    )
    out = tmp_path / "corpus"
    for argv, says in (
        (["data", "--device", "cuda", "--out", str(out)], "--device cuda: PyTorch"),
        (["data", "--device", "cuda", "--own-replies", str(out)], "runs the exported graph"),
    ):
        run = subprocess.run(
            [sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=120
        )
        assert run.stdout.strip() == "2 []", run.stderr
        assert says in run.stderr
    assert not out.exists()


def test_train_command_names_a_missing_base_file(tmp_path, capsys, monkeypatch):
    from cli.main import main
    from model.nn.gguf import GGUF_ENV

    monkeypatch.setenv(GGUF_ENV, str(tmp_path / "none.gguf"))
    assert main(["train", "--out", str(tmp_path / "run")]) == 1
    assert f"{GGUF_ENV}={tmp_path / 'none.gguf'}: no such file" in capsys.readouterr().err


def test_batches_and_lora_follow_the_device():
    from model.nn.adapter import LoRALinear

    cfg = TrainConfig(block_size=4)
    items = [([1, 2, 3], [10, 11, 12, 2])]
    batch = make_batch(items, cfg, MASK, torch.Generator().manual_seed(0))
    assert batch.to(torch.device("cpu")) is batch  # already there: no copy per step
    moved = batch.to(torch.device("meta"))  # every tensor goes, the counts stay
    tensors = {k: v for k, v in vars(moved).items() if isinstance(v, torch.Tensor)}
    assert len(tensors) == 6 and all(v.is_meta for v in tensors.values())
    assert (moved.n_positions, moved.n_tokens) == (batch.n_positions, batch.n_tokens)
    lora = LoRALinear(torch.nn.Linear(4, 6, bias=False, device="meta"), 2, 4.0)
    assert lora.lora_A.is_meta and lora.lora_B.is_meta  # created beside the base weight
