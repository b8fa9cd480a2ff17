"""``quicksilver router``: fit the tool router (``model/router.py``) for an adapter.

For every training command of ``quicksilver data --actions`` (``train.jsonl``, rows
``command:<tool>``, labelled with their call's shape, ``model.tools.shape_name``) the
served int8 graph prefills the prompt a session with the
default device tools builds, and its last row's logits are kept: exactly what the
engine reads when it decides to act. The logits become the model's final (normalised)
hidden state by least squares against the tied embedding (``pinv(E)``, from the GGUF
the model was built from), and a multinomial logistic regression with an L2 penalty is
fitted on the standardised states (numpy, full batch, Adam). The projection, the
standardisation and the regression fold into one ``(V, K)`` matrix and a bias.

The held-out commands (``heldout_commands.jsonl``: phrasings and values no training
command uses) measure it: the shape it names against the expected one, per tool.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from model.diffusion_engine import DiffusionGenerator
from model.router import ToolRouter, model_adapter_sha256, tool_of
from model.tools import DEFAULT_TOOLS, shape_name, split_call


@dataclass(frozen=True)
class RouterOptions:
    model_dir: Path  # the exported model whose prefill the router reads
    data: Path = Path("data/actions")
    l2: float = 3e-3  # on the mean cross-entropy; ~ scikit-learn's C = 0.1 at 1608 rows
    steps: int = 1500
    lr: float = 0.05
    threads: int = 2


def command_rows(path: Path) -> list[tuple[str, str]]:
    """(what the user said, the shape of its call) of every ``command:<tool>`` row of a
    split, the call read from the row's reply."""
    tools = {t.name: t for t in DEFAULT_TOOLS}
    out = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if not str(row.get("source", "")).startswith("command:"):
            continue
        call, _ = split_call(row["reply"])
        if call is None or call.name not in tools:
            raise ValueError(f"{path}: a command row without a default tool's call: {row}")
        out.append((row["question"], shape_name(tools[call.name], call.arguments)))
    return out


def prefill_logits(
    gen: DiffusionGenerator,
    texts: Sequence[str],
    log: Callable[[str], None] = print,
) -> NDArray[np.float32]:
    """The last prompt row's logits ``(N, V)`` for each request, as a session with the
    default device tools prompts the model."""
    from model.backend import last_row
    from model.chat import build_prompt
    from model.engine import ChatMessage
    from model.tools import tools_system_prompt

    tok, opts, backend = gen.tokenizer, gen.options, gen.backend
    system = tools_system_prompt(opts.system_prompt, DEFAULT_TOOLS)
    rows = []
    t0 = time.monotonic()
    for i, text in enumerate(texts, 1):
        prompt = build_prompt(tok, [ChatMessage("user", text)], opts.prompt_budget, system)
        ids = np.asarray(prompt, np.int64)
        rows.append(backend.step(backend.new_cache(), ids, "causal", True, last_row(ids))[-1])
        if i % 200 == 0 or i == len(texts):
            log(f"router: prefilled {i}/{len(texts)} ({time.monotonic() - t0:.0f} s)")
    return np.stack(rows).astype(np.float32)


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


def fit_router(
    logits: NDArray[np.float32],
    shapes: Sequence[str],
    to_hidden: NDArray[np.float32],
    options: RouterOptions,
    adapter_sha256: str,
) -> ToolRouter:
    """The router for these prefill ``logits`` (N, V) and their calls' ``shapes``: a
    tool classifier and a shape classifier on the same standardised states."""
    hidden = logits @ to_hidden.T  # (N, C)
    mu, sd = hidden.mean(0), hidden.std(0) + 1e-6
    x = (hidden - mu) / sd
    names: list[str] = []
    columns = []
    for labels in ([tool_of(s) for s in shapes], list(shapes)):
        classes = sorted(set(labels))
        y = np.array([classes.index(t) for t in labels], np.int64)
        w, b = fit_softmax(x, y, len(classes), options.l2, options.steps, options.lr)
        names += classes
        columns.append((w, b))
    w = np.concatenate([c[0] for c in columns], 1)
    b = np.concatenate([c[1] for c in columns])
    weights = to_hidden.T.astype(np.float64) @ (w / sd[:, None])  # (V, K)
    bias = b - (mu / sd) @ w
    info = {"l2": options.l2, "steps": options.steps, "train_commands": len(shapes)}
    return ToolRouter(
        tuple(names), weights.astype(np.float32), bias.astype(np.float32), adapter_sha256, info
    )


def accuracy(
    router: ToolRouter, logits: NDArray[np.float32], shapes: Sequence[str]
) -> dict[str, Any]:
    """How often the router names the expected shape, and the expected tool, overall
    and per tool."""
    every = [n for n in router.names if "(" in n]  # all shapes: a session of every tool
    chosen = [router.choose(row, every) for row in logits]
    per: dict[str, list[tuple[bool, bool]]] = {}
    for got, want in zip(chosen, shapes, strict=True):
        hit = (got == want, got is not None and tool_of(got) == tool_of(want))
        per.setdefault(tool_of(want), []).append(hit)
    hits = [h for v in per.values() for h in v]
    n = max(len(hits), 1)
    return {
        "n": len(hits),
        "accuracy": sum(s for s, _ in hits) / n,  # the whole shape
        "tool_accuracy": sum(t for _, t in hits) / n,
        "per_tool": {k: sum(s for s, _ in v) / len(v) for k, v in sorted(per.items())},
    }


def train_router(options: RouterOptions, log: Callable[[str], None] = print) -> ToolRouter:
    from model.assemble import load_onnx_diffusion_generator
    from model.runtime import RuntimeConfig

    sha = model_adapter_sha256(options.model_dir)
    if sha is None:
        raise ValueError(f"{options.model_dir} merges no adapter: a router reads a tools adapter")
    train = command_rows(options.data / "train.jsonl")
    heldout = command_rows(options.data / "heldout_commands.jsonl")
    if not train:
        raise FileNotFoundError(f"{options.data / 'train.jsonl'} has no command rows")
    gen = load_onnx_diffusion_generator(
        options.model_dir, "int8", RuntimeConfig(threads=options.threads, max_len=1024)
    )
    log(f"router: {len(train)} training commands through {options.model_dir}")
    x_train = prefill_logits(gen, [t for t, _ in train], log)
    router = fit_router(x_train, [n for _, n in train], hidden_map(), options, sha)
    fitted = accuracy(router, x_train, [n for _, n in train])
    report: dict[str, Any] = {"train_accuracy": fitted["accuracy"]}
    if heldout:
        x_held = prefill_logits(gen, [t for t, _ in heldout], log)
        report["heldout"] = accuracy(router, x_held, [n for _, n in heldout])
    return ToolRouter(router.names, router.weights, router.bias, sha, {**router.info, **report})
