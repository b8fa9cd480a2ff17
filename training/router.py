"""``quicksilver router``: fit the tool router (``model/router.py``) for an adapter.

The rows are those of ``quicksilver data --actions`` (``train.jsonl``): the commands
(``command:<tool>``, labelled with their call's shape, ``model.tools.shape_name``) and
the chat (held-in questions, hard negatives about timers or music). Each is asked as a
session with the default device tools asks it, alone for half of them (seeded) and
after one or two other rows for the rest, those rows' replies kept as a session keeps
them (a call's text, then its words): a session's history moves the model's state, and
an adapter trained on single turns acts on 7 of 32 chat turns inside a 20-turn session
(docs/training.md). The served int8 graph prefills each prompt and its last row's
logits are kept: exactly what the engine reads when it decides to act.

The logits become the model's final (normalised) hidden state by least squares
against the tied embedding (``pinv(E)``, from the GGUF the model was built from);
three multinomial logistic regressions with an L2 penalty are fitted on the
standardised states (numpy, full batch, Adam): act or speak (every row), the tool and
the shape (the commands). The projection, the standardisation and the regressions
fold into one ``(V, K)`` matrix and a bias.

The word expert (``model.router.WordExpert``) is fitted on the training rows' words
alone: logistic regressions on which words a request has, the tool and the shape (on
the commands), then act or speak (on every row), each part's L2 and weight beside the
state chosen on the development split, where a weight of zero is one of the choices.
The act part is chosen for the fewest development chat rows acted on, then the most
commands called right.

The held-out split (``heldout_commands.jsonl``, ``heldout_chat.jsonl``: phrasings and
values no training row uses) measures it, alone and after held-out history.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from model.actions import call_starts
from model.diffusion_engine import DiffusionGenerator
from model.engine import ChatMessage
from model.router import (
    ACT,
    SPEAK,
    ToolRouter,
    WordExpert,
    model_adapter_sha256,
    tool_of,
    word_set,
)
from model.tokenizer import Tokenizer
from model.tools import DEFAULT_TOOLS, kept_reply, render_call, shape_name, split_call

CHAT_SOURCES = ("negative", "template", "model", "heldout")


@dataclass(frozen=True)
class RouterOptions:
    model_dir: Path  # the exported model whose prefill the router reads
    data: Path = Path("data/actions")
    # on the mean cross-entropy (3e-3 ~ scikit-learn's C = 0.1 at 1608 rows); None: each
    # classifier's chosen on the development split
    l2: float | None = None
    steps: int = 1500
    lr: float = 0.05
    threads: int = 2
    with_history: float = 0.5  # share of rows asked after one or two other rows
    seed: int = 0
    # a router file whose state classifiers are kept (only its word expert is fitted)
    keep: Path | None = None
    # read the model directory's rows graphs (export/rows_graph.py), not its blockwise file
    rows: bool = False


@dataclass(frozen=True)
class Row:
    text: str  # what the user said
    shape: str | None  # its call's shape; None: chat, the reply speaks
    kept: str  # the reply as a session keeps it (a call's text, then its words)


def read_rows(path: Path) -> list[Row]:
    """The command and chat rows of a split, each call read from the row's reply."""
    tools = {t.name: t for t in DEFAULT_TOOLS}
    out = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        source = str(row.get("source", "")).split(":")[0]
        call, words = split_call(row["reply"])
        words = " ".join(words.split())
        if source == "command":
            if call is None or call.name not in tools:
                raise ValueError(f"{path}: a command row without a default tool's call: {row}")
            tool = tools[call.name]
            kept = kept_reply(render_call(tool, call.arguments), words)
            out.append(Row(row["question"], shape_name(tool, call.arguments), kept))
        elif source in CHAT_SOURCES:
            out.append(Row(row["question"], None, words))
    return out


def conversations(rows: Sequence[Row], with_history: float, seed: int) -> list[list[ChatMessage]]:
    """Each row as a session asks it: alone, or (a ``with_history`` share, seeded)
    after one or two other rows of the same list and their kept replies."""
    rng = random.Random(seed)
    return [ask(row.text, [r for r in rows if r is not row], with_history, rng) for row in rows]


def ask(
    text: str, others: Sequence[Row], with_history: float, rng: random.Random
) -> list[ChatMessage]:
    """``text`` as a session asks it: alone, or (with probability ``with_history``)
    after one or two of ``others`` and their replies as a session keeps them."""
    convo: list[ChatMessage] = []
    if others and rng.random() < with_history:
        for earlier in rng.sample(list(others), rng.randint(1, 2)):
            convo += [ChatMessage("user", earlier.text), ChatMessage("assistant", earlier.kept)]
    return [*convo, ChatMessage("user", text)]


def prefill_logits(
    gen: DiffusionGenerator,
    convos: Sequence[Sequence[ChatMessage]],
    log: Callable[[str], None] = print,
) -> NDArray[np.float32]:
    """The last prompt row's logits ``(N, V)`` for each conversation, as a session with
    the default device tools prompts the model."""
    rows = prefill_rows(gen, convos, lambda _, ids: np.array([len(ids) - 1]), log)
    return np.stack([r[-1] for r in rows]).astype(np.float32)


def prefill_rows(
    gen: DiffusionGenerator,
    convos: Sequence[Sequence[ChatMessage]],
    pick: Callable[[int, list[int]], NDArray[np.int64]],
    log: Callable[[str], None] = print,
) -> list[NDArray[np.float32]]:
    """The logits of the prompt rows ``pick(i, prompt)`` (ascending positions after the
    system prompt) for each conversation ``i``, as a session with the default device tools
    prompts the model.

    Every prompt opens with the same system prompt (the tool list, ~100 tokens), so it
    is prefilled once and each conversation prefills only what follows it, as a session
    does from its prefix cache: ~3x fewer positions (a 140-token int8 prefill took 0.9 s
    on an AVX2 CPU without VNNI, and a refit prefills ~5,000 prompts)."""
    from model.backend import last_row
    from model.chat import build_prompt
    from model.prefix import common_prefix
    from model.tools import tools_system_prompt

    tok, opts, backend = gen.tokenizer, gen.options, gen.backend
    system = tools_system_prompt(opts.system_prompt, DEFAULT_TOOLS)
    prompts = [
        build_prompt(tok, c, opts.prompt_budget, system, opts.history_window) for c in convos
    ]
    if not prompts:
        raise ValueError("no conversations to prefill")
    wanted = [pick(i, p) for i, p in enumerate(prompts)]
    # the shared head, less one token so that every prompt has something to prefill
    arrays = [np.asarray(p, np.int64) for p in prompts]
    shared = min(common_prefix(arrays[0], a) for a in arrays) - 1
    shared = max(min([shared, *(int(w[0]) for w in wanted)]), 0)
    cache = backend.new_cache()
    head = arrays[0][:shared]
    if shared:
        backend.step(cache, head, "causal", True, last_row(head))
    out = []
    t0 = time.monotonic()
    for i, (ids, rows) in enumerate(zip(arrays, wanted, strict=True), 1):
        backend.truncate(cache, shared)
        tail = ids[shared:]
        out.append(backend.step(cache, tail, "causal", True, rows - shared).astype(np.float32))
        if i % 400 == 0 or i == len(prompts):
            log(f"prefilled {i}/{len(prompts)} ({time.monotonic() - t0:.0f} s)")
    return out


def fit_softmax(
    x: NDArray[np.float32], y: NDArray[np.int64], k: int, l2: float, steps: int, lr: float
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Multinomial logistic regression ``softmax(x @ W + b)``: mean cross-entropy plus
    ``l2 * |W|^2``, full-batch Adam from zero. Returns (W (C, K), b (K,))."""
    n, c = x.shape
    xd = x.astype(np.float64)
    onehot = np.eye(k)[y]
    params = [np.zeros((c, k)), np.zeros(k)]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    for t in range(1, steps + 1):
        z = xd @ params[0] + params[1]
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        g = (p - onehot) / n
        grads = [xd.T @ g + 2 * l2 * params[0], g.sum(0)]
        for j, grad in enumerate(grads):
            m[j] = 0.9 * m[j] + 0.1 * grad
            v[j] = 0.999 * v[j] + 0.001 * grad**2
            step = lr * (m[j] / (1 - 0.9**t)) / (np.sqrt(v[j] / (1 - 0.999**t)) + 1e-8)
            params[j] = params[j] - step
    return params[0], params[1]


def hidden_map() -> NDArray[np.float32]:
    """``pinv(E) (C, V)``: logits of the tied head back to the normalised hidden state
    (E, the token embedding of the GGUF every model directory is built from)."""
    from model.nn.gguf import GGUFFile, find_smollm2_gguf

    gguf = GGUFFile(find_smollm2_gguf())
    table = gguf.state_dict(gguf.llama_config())["tok_emb.weight"].float().numpy()
    return np.linalg.pinv(table.astype(np.float64)).astype(np.float32)


HEADS = ("act", "tool", "shape")
DEFAULT_L2 = 3e-3
L2_GRID = (3e-4, 1e-3, 3e-3, 1e-2, 3e-2)


def _heads(
    x: NDArray[np.float32], shapes: Sequence[str | None]
) -> list[tuple[str, NDArray[np.float32], list[str], list[str]]]:
    """Each classifier's rows, labels and classes: act or speak on every row, the tool
    and the shape on the commands."""
    acts = np.array([s is not None for s in shapes])
    commands = [s for s in shapes if s is not None]
    tools = [tool_of(s) for s in commands]
    return [
        ("act", x, [ACT if s is not None else SPEAK for s in shapes], [SPEAK, ACT]),
        ("tool", x[acts], tools, sorted(set(tools))),
        ("shape", x[acts], commands, sorted(set(commands))),
    ]


def _standardised(
    logits: NDArray[np.float32], to_hidden: NDArray[np.float32]
) -> tuple[NDArray[np.float32], NDArray[np.float32], NDArray[np.float32]]:
    """The training rows' hidden states (logits mapped back), standardised, with the
    mean and deviation that other rows are standardised by."""
    hidden = logits @ to_hidden.T  # (N, C)
    mu, sd = hidden.mean(0), hidden.std(0) + 1e-6
    return (hidden - mu) / sd, mu, sd


def fit_router(
    logits: NDArray[np.float32],
    shapes: Sequence[str | None],
    to_hidden: NDArray[np.float32],
    options: RouterOptions,
    adapter_sha256: str,
    l2: dict[str, float] | None = None,
) -> ToolRouter:
    """The router for these prefill ``logits`` (N, V) and their calls' ``shapes`` (None:
    the reply speaks): act or speak on every row, then the tool and the shape on the
    commands, on the same standardised states. ``l2``: per classifier (default: all
    ``options.l2``, or ``DEFAULT_L2``)."""
    x, mu, sd = _standardised(logits, to_hidden)
    base = DEFAULT_L2 if options.l2 is None else options.l2
    penalty = {h: base for h in HEADS} | (l2 or {})
    names: list[str] = []
    columns = []
    for head, rows, labels, classes in _heads(x, shapes):
        y = np.array([classes.index(t) for t in labels], np.int64)
        w, b = fit_softmax(rows, y, len(classes), penalty[head], options.steps, options.lr)
        names += classes
        columns.append((w, b))
    w = np.concatenate([c[0] for c in columns], 1)
    b = np.concatenate([c[1] for c in columns])
    weights = to_hidden.T.astype(np.float64) @ (w / sd[:, None])  # (V, K)
    bias = b - (mu / sd) @ w
    info = {
        "l2": penalty,
        "steps": options.steps,
        "train_rows": len(shapes),
        "train_commands": sum(s is not None for s in shapes),
    }
    return ToolRouter(
        tuple(names), weights.astype(np.float32), bias.astype(np.float32), adapter_sha256, info
    )


def choose_l2(
    logits: NDArray[np.float32],
    shapes: Sequence[str | None],
    dev_logits: NDArray[np.float32],
    dev_shapes: Sequence[str | None],
    to_hidden: NDArray[np.float32],
    options: RouterOptions,
    grid: Sequence[float] = L2_GRID,
) -> tuple[dict[str, float], dict[str, dict[str, list[float]]]]:
    """Each classifier's L2, chosen on the development split (phrasings neither the
    training rows nor the held-out split have): the most dev rows right (for the shape,
    among the right tool's shapes, as the engine asks it once the tool is named), ties to
    the lower mean cross-entropy; act or speak, which the engine only takes where it is
    sure, by the cross-entropy alone. Returns the choice and, per classifier and L2,
    [accuracy, cross-entropy]."""
    x, mu, sd = _standardised(logits, to_hidden)
    train = _heads(x, shapes)
    dev = _heads((dev_logits @ to_hidden.T - mu) / sd, dev_shapes)
    chosen: dict[str, float] = {}
    tried: dict[str, dict[str, list[float]]] = {}
    for (head, rows, labels, classes), (_, dev_rows, dev_labels, _) in zip(train, dev, strict=True):
        y = np.array([classes.index(t) for t in labels], np.int64)
        known = [k for k, t in enumerate(dev_labels) if t in classes]
        dy = np.array([classes.index(dev_labels[k]) for k in known], np.int64)
        # the shape is chosen among its tool's shapes; the others classify among all
        allowed = np.ones((len(known), len(classes)), bool)
        if head == "shape":
            allowed = np.array(
                [[tool_of(c) == tool_of(dev_labels[k]) for c in classes] for k in known]
            )
        scores = {}
        for l2 in grid:
            w, b = fit_softmax(rows, y, len(classes), l2, options.steps, options.lr)
            z = np.where(allowed, dev_rows[known] @ w + b, -np.inf)
            logp = z - np.logaddexp.reduce(z, axis=1, keepdims=True)
            acc = float((z.argmax(1) == dy).mean())
            xent = float(-logp[np.arange(len(dy)), dy].mean())
            scores[l2] = (acc if head != "act" else 0.0, -xent)
            tried.setdefault(head, {})[str(l2)] = [round(acc, 4), round(xent, 4)]
        chosen[head] = max(grid, key=lambda v: scores[v])
    return chosen, tried


WORD_L2_GRID = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3)
WORD_WEIGHT_GRID = (0.0, 0.5, 1.0, 2.0, 4.0)  # 0: no word expert
# act or speak: the state's margin is large (|log-odds| > 3 decides), so the words
# need room to outweigh it
ACT_WEIGHT_GRID = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0)


def bag_of_words(words: Sequence[str], texts: Sequence[str]) -> NDArray[np.float32]:
    """``(N, W)``: 1 where text n has word w."""
    index = {w: i for i, w in enumerate(words)}
    out = np.zeros((len(texts), len(words)), np.float32)
    for n, text in enumerate(texts):
        out[n, [index[w] for w in word_set(text) if w in index]] = 1.0
    return out


def fit_words(
    router: ToolRouter,
    texts: Sequence[str],
    shapes: Sequence[str | None],
    dev: tuple[NDArray[np.float32], Sequence[str | None], Sequence[str]],
    options: RouterOptions,
    l2_grid: Sequence[float] = WORD_L2_GRID,
    weight_grid: Sequence[float] = WORD_WEIGHT_GRID,
    tok: Tokenizer | None = None,
    act_weight_grid: Sequence[float] = ACT_WEIGHT_GRID,
) -> tuple[ToolRouter, dict[str, Any]]:
    """``router`` with a word expert fitted on the training rows' ``texts`` (``shapes``
    None: chat): first its tool and shape columns, on the commands, with the L2 and the
    weight beside the state that name the most development rows' shapes right (``dev``:
    logits, shapes, texts; ties: the most tools, then the lighter weight), the weight 0
    (the router as it was) among them; then, where the router has an act classifier,
    its act-or-speak columns, on every row (:func:`fit_act_words`; ``tok``: the model's
    first token decides where the router is unsure, as in the engine). Returns it and
    every try: per L2 and weight, [shape accuracy, tool accuracy] on the development
    commands, and the act part's under ``act``."""
    commands = [(t, s) for t, s in zip(texts, shapes, strict=True) if s is not None]
    words = tuple(sorted({w for t in texts for w in word_set(t)}))
    x = bag_of_words(words, [t for t, _ in commands])
    columns = {n: k for k, n in enumerate(router.names)}
    dev_logits, dev_shapes, dev_texts = dev
    reads_scores, dev_scores = _reading_scores(router, dev_logits)
    best: tuple[tuple[float, float, float], ToolRouter] | None = None
    tried: dict[str, Any] = {}
    for l2 in l2_grid:
        weights = np.zeros((len(words), len(router.names)))
        bias = np.zeros(len(router.names))
        for classes, label in ((router.tools, tool_of), (router.shapes, lambda s: s)):
            y = np.array([classes.index(label(s)) for _, s in commands], np.int64)
            w, b = fit_softmax(x, y, len(classes), l2, options.steps, options.lr)
            cols = [columns[c] for c in classes]
            weights[:, cols], bias[cols] = w, b
        for weight in weight_grid:
            expert = WordExpert(
                words, (weight * weights).astype(np.float32), (weight * bias).astype(np.float32)
            )
            got = accuracy(
                replace(reads_scores, words=expert), dev_scores, dev_shapes, texts=dev_texts
            )
            shape_right, tool_right = got["accuracy"], got["tool_accuracy"]
            tried[f"{l2:g} x {weight:g}"] = [round(shape_right, 4), round(tool_right, 4)]
            key = (shape_right, tool_right, -weight)
            if best is None or key > best[0]:
                info = {**router.info, "words": {"l2": l2, "weight": weight, "words": len(words)}}
                best = (key, replace(router, words=expert, info=info))
    assert best is not None, "an empty grid"
    chosen = best[1]
    if chosen.names[:2] == (SPEAK, ACT):
        all_x = bag_of_words(words, texts)
        acts = np.array([s is not None for s in shapes], np.int64)
        chosen, tried["act"] = fit_act_words(
            chosen, all_x, acts, dev, options, l2_grid, act_weight_grid, tok
        )
    kept = chosen.words
    if kept is not None and not kept.weights.any() and not kept.bias.any():
        chosen = replace(chosen, words=None)  # every part's weight 0: no expert
    return chosen, tried


def _reading_scores(
    router: ToolRouter, logits: NDArray[np.float32]
) -> tuple[ToolRouter, NDArray[np.float32]]:
    """The state's scores are linear in the logits: read them once (``logits`` through
    ``router``), and a copy of ``router`` that reads those scores through an identity
    map, for each candidate expert to be tried on."""
    k = len(router.names)
    reads = replace(router, weights=np.eye(k, dtype=np.float32), bias=np.zeros(k, np.float32))
    return reads, logits @ router.weights + router.bias


def fit_act_words(
    router: ToolRouter,
    x: NDArray[np.float32],
    acts: NDArray[np.int64],
    dev: tuple[NDArray[np.float32], Sequence[str | None], Sequence[str]],
    options: RouterOptions,
    l2_grid: Sequence[float],
    weight_grid: Sequence[float],
    tok: Tokenizer | None,
) -> tuple[ToolRouter, dict[str, list[float]]]:
    """``router`` (its word expert's tool and shape columns fitted) with the expert's
    act-or-speak columns fitted on ``x`` (every training row's words) against ``acts``
    (1: a command): the L2 and weight that act on the fewest development chat rows,
    then call the most development commands right (ties: the lighter weight); weight 0
    leaves the state to decide alone. Returns it and every try, per L2 and weight,
    [chat acted, shape accuracy]."""
    assert router.words is not None
    dev_logits, dev_shapes, dev_texts = dev
    reads_scores, dev_scores = _reading_scores(router, dev_logits)
    # the model's first token, where the router is unsure, reads the real logits: the
    # decision is made on them once per row, as the engine makes it
    first = [call_starts(tok, row) if tok else False for row in dev_logits]
    best: tuple[tuple[float, float, float], ToolRouter] | None = None
    tried: dict[str, list[float]] = {}
    base = router.words
    for l2 in l2_grid:
        w, b = fit_softmax(x, acts, 2, l2, options.steps, options.lr)
        for weight in weight_grid:
            weights, bias = base.weights.copy(), base.bias.copy()
            weights[:, :2], bias[:2] = weight * w, weight * b
            expert = replace(base, weights=weights.astype(np.float32), bias=bias.astype(np.float32))
            candidate = replace(reads_scores, words=expert)
            got = accuracy(candidate, dev_scores, dev_shapes, texts=dev_texts, first=first)
            chat, right = got["chat_acted"], got["accuracy"]
            tried[f"{l2:g} x {weight:g}"] = [round(chat, 4), round(right, 4)]
            key = (-chat, right, -weight)
            if best is None or key > best[0]:
                info = {**router.info, "act_words": {"l2": l2, "weight": weight}}
                best = (key, replace(router, words=expert, info=info))
    assert best is not None, "an empty grid"
    return best[1], tried


def accuracy(
    router: ToolRouter,
    logits: NDArray[np.float32],
    shapes: Sequence[str | None],
    tok: Tokenizer | None = None,
    texts: Sequence[str] | None = None,
    first: Sequence[bool] | None = None,
) -> dict[str, Any]:
    """How often the engine acts on the commands and on the chat (the router where it
    is sure, else ``tok``'s call token first, echoes aside; without ``tok``: speak),
    and how often the router names the expected tool and shape of the commands (of all
    of them: a command not acted on counts as missed), overall and per tool. ``texts``:
    the requests, for the router's word expert (without them it reads the state alone).
    ``first``: the model's first-token decisions, made already (for a router that
    reads precomputed scores rather than the logits ``tok`` would read)."""
    per: dict[str, list[tuple[bool, bool]]] = {}
    acted: dict[str, list[bool]] = {"commands": [], "chat": []}
    said: Sequence[str | None] = texts if texts is not None else [None] * len(shapes)
    for i, (row, want, text) in enumerate(zip(logits, shapes, said, strict=True)):
        sure = router.acts(row, text)  # unsure: the model's first token, as the engine does
        if sure is not None:
            act = sure
        elif first is not None:
            act = first[i]
        else:
            act = call_starts(tok, row) if tok else False
        acted["commands" if want is not None else "chat"].append(act)
        if want is None:
            continue
        got = router.choose(row, router.shapes, text=text) if act else None
        hit = (got == want, got is not None and tool_of(got) == tool_of(want))
        per.setdefault(tool_of(want), []).append(hit)
    hits = [h for v in per.values() for h in v]
    n = max(len(hits), 1)
    return {
        "commands": len(hits),
        "chat": len(acted["chat"]),
        "commands_acted": sum(acted["commands"]) / max(len(acted["commands"]), 1),
        "chat_acted": sum(acted["chat"]) / max(len(acted["chat"]), 1),
        "accuracy": sum(s for s, _ in hits) / n,  # the whole shape
        "tool_accuracy": sum(t for _, t in hits) / n,
        "per_tool": {k: sum(s for s, _ in v) / len(v) for k, v in sorted(per.items())},
    }


def train_router(options: RouterOptions, log: Callable[[str], None] = print) -> ToolRouter:
    """Fit the router over ``options.model_dir``'s prefills of ``options.data``'s
    training rows; with ``options.l2`` None, each classifier's L2 is chosen on the
    development split (``dev_commands.jsonl``, ``dev_chat.jsonl``), asked alone and after
    other turns as the training rows are, and so is its word expert's. With
    ``options.keep`` the state classifiers are that router file's, and only the word
    expert is fitted. The record has the development and held-out figures, alone and
    after 1-2 earlier turns, with the word expert and (``state_alone``) without."""
    from model.assemble import load_onnx_diffusion_generator
    from model.runtime import RuntimeConfig

    sha = model_adapter_sha256(options.model_dir)
    if sha is None:
        raise ValueError(f"{options.model_dir} merges no adapter: a router reads a tools adapter")
    train = read_rows(options.data / "train.jsonl")
    if not any(r.shape for r in train):
        raise FileNotFoundError(f"{options.data / 'train.jsonl'} has no command rows")
    kept = ToolRouter.load(options.keep) if options.keep is not None else None
    if kept is not None and kept.adapter_sha256 != sha:
        raise ValueError(f"{options.keep} reads another adapter than {options.model_dir}'s")
    splits = {
        name: [*read_rows(options.data / f"{name}_commands.jsonl"), *read_rows(chat)]
        for name in ("dev", "heldout")
        if (chat := options.data / f"{name}_chat.jsonl").exists()
    }
    if (options.l2 is None or kept is not None) and "dev" not in splits:
        raise FileNotFoundError(
            f"{options.data} has no development split to choose the L2 on "
            "(regenerate it with quicksilver data --actions, or give --l2)"
        )
    gen = load_onnx_diffusion_generator(
        options.model_dir,
        "int8",
        RuntimeConfig(threads=options.threads, max_len=1024),
        kernel="rows" if options.rows else "blockwise",
    )
    tok = gen.tokenizer
    asked: dict[str, tuple[NDArray[np.float32], list[str | None], list[str]]] = {}
    for name, rows in splits.items():
        for suffix, share in (("", 0.0), ("_with_history", 1.0)):
            x = prefill_logits(gen, conversations(rows, share, options.seed), log)
            asked[name + suffix] = (x, [r.shape for r in rows], [r.text for r in rows])
    report: dict[str, Any] = {}
    if kept is None:
        log(f"router: {len(train)} training rows through {options.model_dir}")
        convos = conversations(train, options.with_history, options.seed)
        x_train = prefill_logits(gen, convos, log)
        shapes = [r.shape for r in train]
        to_hidden = hidden_map()
        l2 = None
        if options.l2 is None:
            dev_x = np.concatenate([asked["dev"][0], asked["dev_with_history"][0]])
            dev_shapes = asked["dev"][1] * 2
            l2, report["l2_tried"] = choose_l2(
                x_train, shapes, dev_x, dev_shapes, to_hidden, options
            )
            log(f"router: l2 {l2} (development split)")
        router = fit_router(x_train, shapes, to_hidden, options, sha, l2)
    else:
        router = replace(kept, words=None)
        log(f"router: the state classifiers of {options.keep}; fitting its word expert")
    if "dev" in splits:
        dev = (
            np.concatenate([asked["dev"][0], asked["dev_with_history"][0]]),
            asked["dev"][1] * 2,
            asked["dev"][2] * 2,
        )
        texts = [r.text for r in train]
        router, report["words_tried"] = fit_words(
            router, texts, [r.shape for r in train], dev, options, tok=tok
        )
        log(f"router: word expert {router.info.get('words')} (development split)")
    if kept is None:
        report["train"] = accuracy(router, x_train, shapes, tok, [r.text for r in train])
    report["state_alone"] = {}
    for name, (x, held, texts) in asked.items():
        report[name] = accuracy(router, x, held, tok, texts)
        report["state_alone"][name] = accuracy(router, x, held, tok)
    return replace(router, adapter_sha256=sha, info={**router.info, **report})
