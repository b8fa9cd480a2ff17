"""``quicksilver spans``: fit the span pointers (``model/spans.py``) for an adapter.

The rows are the commands of ``quicksilver data --actions`` (``train.jsonl``) that
carry a string argument; each value is a run of the user's words (rows where it is not
are left out and counted). Each command is asked as a session with the default device
tools asks it, alone for half of them (seeded) and after one or two other rows of the
split (commands or chat, their replies kept as a session keeps them) for the rest, as
the router is fitted (``training/router.py``). The served int8 graph prefills each
prompt, and the logits of the user's tokens (with the token before and after them) are
kept, turned into hidden states by the router's least-squares map.

Each parameter's start and end pointers are softmaxes over the boundaries between the
words, fitted (numpy, full batch, Adam, L2) on the standardised states; the L2 weight is
chosen on a fifth of the training rows held back, then the pointers are refitted on all
of them. The held-out split (``heldout_commands.jsonl``) measures the exact span rate,
alone and after held-out history.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from model.diffusion_engine import DiffusionGenerator
from model.engine import ChatMessage
from model.router import model_adapter_sha256
from model.spans import SpanPointer, boundary_rows, find_span, span_text, user_tokens, words
from model.tools import DEFAULT_TOOLS, split_call
from training.router import Row, ask, hidden_map, prefill_rows, read_rows

L2_GRID = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1)


@dataclass(frozen=True)
class SpanOptions:
    model_dir: Path  # the exported model whose prefill the pointers read
    data: Path = Path("data/actions")
    steps: int = 600
    lr: float = 0.05
    threads: int = 2
    with_history: float = 0.5  # share of commands asked after one or two other rows
    seed: int = 0
    # read the model directory's rows graphs (export/rows_graph.py), not its blockwise file
    rows: bool = False


@dataclass(frozen=True)
class Example:
    text: str  # what the user said
    values: dict[str, tuple[int, int]]  # "tool.param" -> its span of the text's words


def string_params() -> list[str]:
    """``tool.param`` of every free string parameter of the default tools."""
    return [
        f"{t.name}.{p.name}"
        for t in DEFAULT_TOOLS
        for p in t.params
        if p.type == "string" and not p.enum
    ]


def read_examples(path: Path) -> tuple[list[Example], int]:
    """The command rows with string arguments, each value as a span of the user's words;
    and how many values were left out (not a run of the user's words)."""
    params, out, missed = set(string_params()), [], 0
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if not str(row.get("source", "")).startswith("command"):
            continue
        call, _ = split_call(row["reply"])
        if call is None:
            continue
        found = {}
        for name, value in call.arguments.items():
            key = f"{call.name}.{name}"
            if key in params and isinstance(value, str):
                span = find_span(row["question"], value)
                missed += span is None
                if span is not None:
                    found[key] = span
        if found:
            out.append(Example(row["question"], found))
    return out, missed


def asked(
    examples: Sequence[Example], pool: Sequence[Row], with_history: float, seed: int
) -> list[list[ChatMessage]]:
    """Each example as a session asks it: alone, or (a ``with_history`` share, seeded)
    after one or two rows of ``pool`` and their kept replies."""
    rng = random.Random(seed)
    return [
        ask(ex.text, [r for r in pool if r.text != ex.text], with_history, rng) for ex in examples
    ]


def features(
    gen: DiffusionGenerator,
    examples: Sequence[Example],
    convos: Sequence[Sequence[ChatMessage]],
    log: Callable[[str], None] = print,
) -> list[tuple[NDArray[np.float32], NDArray[np.int64]]]:
    """Per example, the logits rows of its user tokens (with one before and one after)
    and its boundaries' row pairs (``model.spans.boundary_rows``)."""
    found = []

    def pick(i: int, prompt: list[int]) -> NDArray[np.int64]:
        where = user_tokens(gen.tokenizer, prompt, examples[i].text)
        if where is None:
            raise ValueError(f"the prompt does not end with the words {examples[i].text!r}")
        found.append(where)
        return where.rows

    logits = prefill_rows(gen, convos, pick, log)
    return [
        (rows, boundary_rows(where.offsets, words(ex.text)))
        for rows, where, ex in zip(logits, found, examples, strict=True)
    ]


def pointer_inputs(
    feats: Sequence[tuple[NDArray[np.float32], NDArray[np.int64]]],
    to_hidden: NDArray[np.float32],
    mu: NDArray[np.float64],
    sd: NDArray[np.float64],
) -> list[NDArray[np.float64]]:
    """Per example, each boundary's standardised states before and after it ``(B, 2C)``."""
    out = []
    for rows, pairs in feats:
        h = (rows @ to_hidden.T - mu) / sd  # (R, C)
        out.append(np.concatenate([h[pairs[:, 0] + 1], h[pairs[:, 1] + 1]], 1))
    return out


def fit_pointer(
    xs: Sequence[NDArray[np.float64]], gold: Sequence[int], l2: float, steps: int, lr: float
) -> NDArray[np.float64]:
    """A pointer ``softmax_k(x_k . w)`` over each example's boundaries: mean cross-entropy
    of the ``gold`` boundary plus ``l2 * |w|^2``, full-batch Adam from zero."""
    n, width = len(xs), max(len(x) for x in xs)
    x = np.zeros((n, width, xs[0].shape[1]))
    valid = np.zeros((n, width), bool)
    for k, xk in enumerate(xs):
        x[k, : len(xk)], valid[k, : len(xk)] = xk, True
    onehot = np.eye(width)[list(gold)]
    w, m, v = np.zeros(x.shape[2]), np.zeros(x.shape[2]), np.zeros(x.shape[2])
    for t in range(1, steps + 1):
        z = np.where(valid, x @ w, -np.inf)
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        grad = np.einsum("nb,nbf->f", p - onehot, x) / n + 2 * l2 * w
        m = 0.9 * m + 0.1 * grad
        v = 0.999 * v + 0.001 * grad**2
        w = w - lr * (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + 1e-8)
    return w


def fit_spans(
    xs: Sequence[NDArray[np.float64]],
    examples: Sequence[Example],
    params: Sequence[str],
    l2: float,
    options: SpanOptions,
) -> NDArray[np.float64]:
    """Each parameter's start and end pointers ``(P, 2, 2C)`` on the examples that have
    it (a parameter no example has gets zero weights: its span is the first word)."""
    out = np.zeros((len(params), 2, xs[0].shape[1]))
    for p, name in enumerate(params):
        have = [k for k, ex in enumerate(examples) if name in ex.values]
        if not have:
            continue
        for end in (0, 1):
            gold = [examples[k].values[name][end] for k in have]
            out[p, end] = fit_pointer([xs[k] for k in have], gold, l2, options.steps, options.lr)
    return out


def fold(
    w: NDArray[np.float64], to_hidden: NDArray[np.float32], sd: NDArray[np.float64]
) -> NDArray[np.float32]:
    """Pointers over standardised states ``(P, 2, 2C)`` as one matrix over logits rows
    ``(V, 4P)`` in :class:`model.spans.SpanPointer`'s column order (the mean drops out:
    it moves every boundary's score alike)."""
    p, _, two_c = w.shape
    halves = w.reshape(p, 2, 2, two_c // 2) / sd  # (P, start|end, before|after, C)
    out = to_hidden.T.astype(np.float64) @ halves.reshape(-1, two_c // 2).T  # (V, 4P)
    return out.astype(np.float32)


def accuracy(
    pointer: SpanPointer,
    feats: Sequence[tuple[NDArray[np.float32], NDArray[np.int64]]],
    examples: Sequence[Example],
) -> dict[str, Any]:
    """How often the pointers' best span is the expected value, per parameter and over
    all values (as text: the same words however they were found)."""
    per: dict[str, list[bool]] = {}
    for (rows, pairs), ex in zip(feats, examples, strict=True):
        scores = pointer.scores(rows, pairs)
        spans = words(ex.text)
        for name, (i, j) in ex.values.items():
            tool, param = name.rsplit(".", 1)
            got = pointer.best(scores, tool, param)
            want = span_text(ex.text, spans, i, j)
            per.setdefault(name, []).append(span_text(ex.text, spans, *got) == want)
    hits = [h for v in per.values() for h in v]
    return {
        "values": len(hits),
        "exact": sum(hits) / max(len(hits), 1),
        "per_param": {k: round(sum(v) / len(v), 4) for k, v in sorted(per.items())},
    }


def train_spans(options: SpanOptions, log: Callable[[str], None] = print) -> SpanPointer:
    from model.assemble import load_onnx_diffusion_generator
    from model.runtime import RuntimeConfig

    sha = model_adapter_sha256(options.model_dir)
    if sha is None:
        raise ValueError(
            f"{options.model_dir} merges no adapter: the pointers read a tools adapter"
        )
    train, missed = read_examples(options.data / "train.jsonl")
    if not train:
        raise FileNotFoundError(f"{options.data / 'train.jsonl'} has no command with a string")
    pool = read_rows(options.data / "train.jsonl")
    gen = load_onnx_diffusion_generator(
        options.model_dir,
        "int8",
        RuntimeConfig(threads=options.threads, max_len=1024),
        kernel="rows" if options.rows else "blockwise",
    )
    log(f"spans: {len(train)} commands through {options.model_dir} ({missed} values not words)")
    feats = features(gen, train, asked(train, pool, options.with_history, options.seed), log)
    to_hidden = hidden_map()
    hidden = np.concatenate([rows for rows, _ in feats]) @ to_hidden.T
    mu, sd = hidden.mean(0), hidden.std(0) + 1e-6
    xs = pointer_inputs(feats, to_hidden, mu, sd)
    params = string_params()
    l2, tried = choose_l2(xs, train, feats, params, options, to_hidden, sd, sha)
    log(f"spans: l2 {l2} ({tried})")
    w = fold(fit_spans(xs, train, params, l2, options), to_hidden, sd)
    info: dict[str, Any] = {"l2": l2, "l2_tried": tried, "steps": options.steps}
    pointer = SpanPointer(tuple(params), w, sha, info)
    info["train"] = accuracy(pointer, feats, train) | {"values_not_words": missed}
    held, _ = read_examples(options.data / "heldout_commands.jsonl")
    if held:
        held_pool = [
            *read_rows(options.data / "heldout_commands.jsonl"),
            *read_rows(options.data / "heldout_chat.jsonl"),
        ]
        for name, share in (("heldout", 0.0), ("heldout_with_history", 1.0)):
            convos = asked(held, held_pool, share, options.seed)
            info[name] = accuracy(pointer, features(gen, held, convos, log), held)
    return pointer


def choose_l2(
    xs: Sequence[NDArray[np.float64]],
    examples: Sequence[Example],
    feats: Sequence[tuple[NDArray[np.float32], NDArray[np.int64]]],
    params: Sequence[str],
    options: SpanOptions,
    to_hidden: NDArray[np.float32],
    sd: NDArray[np.float64],
    sha: str,
) -> tuple[float, dict[str, float]]:
    """The L2 weight of :data:`L2_GRID` whose pointers, fitted on four fifths of the
    training examples, find the most spans of the fifth held back."""
    back = [k % 5 == 0 for k in range(len(examples))]
    fit = [k for k, b in enumerate(back) if not b]
    check = [k for k, b in enumerate(back) if b]
    tried = {}
    for l2 in L2_GRID:
        w = fit_spans([xs[k] for k in fit], [examples[k] for k in fit], params, l2, options)
        pointer = SpanPointer(tuple(params), fold(w, to_hidden, sd), sha, {})
        report = accuracy(pointer, [feats[k] for k in check], [examples[k] for k in check])
        tried[str(l2)] = round(report["exact"], 4)
    return float(max(tried, key=lambda k: tried[k])), tried
