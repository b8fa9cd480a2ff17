"""Is an exported model the PyTorch model it came from? Logits and greedy tokens.

Three steps cover what the decoders do: a causal prefill of a chat prompt, one
autoregressive step against the cache, and one uncommitted block step (mask tokens
and committed ones, ``attend="block"``) as a diffusion sampler takes it. Greedy
replies to fixed questions are then compared token by token: int8 moves logits by
more than float rounding, and what matters is whether it changes the words.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from export.prompts import QUESTIONS
from model.backend import StepBackend
from model.chat import build_prompt
from model.engine import ChatMessage
from model.generate import greedy
from model.nn.backend import TorchBackend
from model.nn.diffusion import with_mask_row
from model.nn.llama import Llama
from model.tokenizer import Tokenizer


@dataclass(frozen=True)
class ParityReport:
    prefill_max_abs: float  # max |logit difference| over every prefill row
    ar_step_max_abs: float
    block_step_max_abs: float
    prefill_top1: float  # share of prefill rows whose most likely next token agrees
    replies_identical: int  # greedy replies equal token for token
    replies: int
    token_agreement: float | None  # matching prefix tokens / reply tokens; None: not run
    reply_tokens: int  # budget per reply

    def as_dict(self) -> dict[str, Any]:
        return {
            k: float(f"{v:.4g}") if isinstance(v, float) else v for k, v in asdict(self).items()
        }


def reference_backend(model: Llama, max_len: int = 2048) -> TorchBackend:
    """The PyTorch model with the mask row the export adds, so block steps can use it."""
    return TorchBackend(with_mask_row(model), max_len=max_len, name="torch")


def logit_diffs(
    ref: StepBackend, other: StepBackend, prompt: Sequence[int], mask_id: int
) -> tuple[float, float, float, float]:
    """Max |diff| for a causal prefill, one AR step, one block step of 8; prefill top-1."""
    ids = np.asarray(prompt, dtype=np.int64)
    ca, cb = ref.new_cache(), other.new_cache()
    a, b = ref.step(ca, ids, "causal", True), other.step(cb, ids, "causal", True)
    prefill = float(np.abs(a - b).max())
    top1 = float((a.argmax(-1) == b.argmax(-1)).mean())
    nxt = np.array([int(a[-1].argmax())], np.int64)
    a, b = ref.step(ca, nxt, "causal", True), other.step(cb, nxt, "causal", True)
    step = float(np.abs(a - b).max())
    has_mask = ref.vocab_size < _embedding_rows(ref)
    fill = mask_id if has_mask else int(nxt[0])
    block = np.array([*ids[-3:], *([fill] * 5)], np.int64)
    a = ref.step(ca, block, "block", False)
    b = other.step(cb, block, "block", False)
    return prefill, step, float(np.abs(a - b).max()), top1


def _embedding_rows(backend: StepBackend) -> int:
    model = getattr(backend, "model", None)
    return int(model.tok_emb.weight.shape[0]) if model is not None else backend.vocab_size


def greedy_agreement(
    ref: StepBackend,
    other: StepBackend,
    prompts: Sequence[Sequence[int]],
    n: int,
    stop: Any,
    memo: dict[tuple[int, ...], list[int]] | None = None,
) -> tuple[int, float]:
    """Replies identical, and the share of reply tokens before the first difference.

    ``memo`` keeps the reference's replies, so several formats compare against one run.
    """
    memo = {} if memo is None else memo
    same = matched = total = 0
    for p in prompts:
        key = (*p, -n)
        if key not in memo:
            memo[key] = list(greedy(ref, p, n, stop))
        a, b = memo[key], list(greedy(other, p, n, stop))
        k = next(
            (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
        )
        same += a == b
        matched += k
        total += max(len(a), len(b), 1)
    return same, matched / total


def check_parity(
    model: Llama,
    backend: StepBackend,
    tok: Tokenizer,
    n_prompts: int = 3,
    n_tokens: int = 32,
    memo: dict[tuple[int, ...], list[int]] | None = None,
) -> ParityReport:
    ref = reference_backend(model, backend.max_len)
    questions = QUESTIONS[: max(n_prompts, 1)]
    prompts = [build_prompt(tok, [ChatMessage("user", q)], 1024) for q in questions]
    with torch.inference_mode():
        diffs = logit_diffs(ref, backend, prompts[0], model.config.vocab_size)
    if n_prompts == 0:  # logits only (fp16 on a CPU: ONNX Runtime runs it slowly)
        return ParityReport(*diffs, 0, 0, None, n_tokens)
    same, agree = greedy_agreement(ref, backend, prompts, n_tokens, tok.stop_ids, memo)
    return ParityReport(*diffs, same, len(prompts), agree, n_tokens)
