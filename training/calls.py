"""``quicksilver eval calls``: does the adapter call tools with the plain diffusion sampler?

A quick check of the tool-call training (docs/training.md, "Tool calls"), before any
constrained decoding: on the held-out split of ``quicksilver data --actions``, the
served sampler (``model.sampler.sample``, default settings, no masks) writes each reply
under the tools system prompt, and

* a command counts as **exact** when its reply starts with ``<tool_call>`` and the call
  parses (:func:`model.tools.split_call`) to the expected tool and arguments;
* a chat question counts as a **false trigger** when its reply starts with a call.

The constrained decoder (``model/actions.py``) is measured on its own; this measures
what the model writes unaided.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from model.tokenizer import Tokenizer
from model.tools import CALL_OPEN, split_call
from training.data import Example, prompt_ids, read_jsonl

if TYPE_CHECKING:
    from model.backend import StepBackend
    from model.sampler import SamplerSettings


@dataclass(frozen=True)
class CallsOptions:
    data: Path = Path("data/actions")  # heldout_commands.jsonl, heldout_chat.jsonl
    onnx: Path | None = None  # an exported model directory (as served)
    onnx_variant: str = "int8"
    adapter: Path | None = None  # else: PyTorch, the base + this adapter
    per_tool: int | None = None  # the first N held-out commands of each tool; None: all
    chat_limit: int | None = None
    max_tokens: int = 64
    seed: int = 0
    threads: int = 2


def reply(
    backend: StepBackend,
    tok: Tokenizer,
    e: Example,
    settings: SamplerSettings,
    max_tokens: int,
    seed: int,
) -> tuple[str, int]:
    """The sampler's reply to ``e.question`` under ``e.system``, and its passes."""
    from model.diffusion_engine import smollm2_diffusion_config
    from model.engine import drain
    from model.sampler import sample

    prompt = prompt_ids(tok, e.question, system=e.system)
    rng = np.random.default_rng(seed)
    config = smollm2_diffusion_config(tok)
    ids, stats = drain(sample(backend, prompt, config, settings, rng, max_tokens))
    return tok.decode(ids).strip(), stats.forward_passes


def command_row(e: Example, text: str, passes: int) -> dict[str, Any]:
    want, _ = split_call(e.reply)
    got, spoken = split_call(text)
    assert want is not None, e.reply
    exact = got is not None and (got.name, dict(got.arguments)) == (want.name, want.arguments)
    return {
        "question": e.question,
        "tool": want.name,
        "reply": text,
        "starts_call": text.startswith(CALL_OPEN),
        "parsed": got is not None,
        "right_tool": got is not None and got.name == want.name,
        "exact": exact,
        "spoken": spoken if got is not None else "",
        "passes": passes,
    }


def check_calls(
    backend: StepBackend,
    tok: Tokenizer,
    commands: Sequence[Example],
    chat: Sequence[Example],
    settings: SamplerSettings,
    opts: CallsOptions,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    t0 = time.perf_counter()
    rows = []
    for i, e in enumerate(commands):
        rows.append(command_row(e, *reply(backend, tok, e, settings, opts.max_tokens, opts.seed)))
        if i % 20 == 19:
            log(f"[{i + 1}/{len(commands)}] commands, {time.perf_counter() - t0:.0f} s")
    chat_rows = []
    for e in chat:
        text, passes = reply(backend, tok, e, settings, opts.max_tokens, opts.seed)
        chat_rows.append(
            {"question": e.question, "reply": text, "trigger": text.startswith(CALL_OPEN)}
            | {"mentions_call": CALL_OPEN in text, "passes": passes}
        )
    log(f"{len(chat)} chat questions, {time.perf_counter() - t0:.0f} s")
    return {
        "summary": summary(rows, chat_rows),
        "commands": rows,
        "chat": chat_rows,
        "wall_s": time.perf_counter() - t0,
    }


def _rate(rows: Sequence[dict[str, Any]], key: str) -> float:
    return sum(bool(r[key]) for r in rows) / len(rows) if rows else float("nan")


def summary(rows: Sequence[dict[str, Any]], chat_rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    tools = sorted({r["tool"] for r in rows})
    per_tool = {
        t: {
            "n": len(sub),
            "starts_call": _rate(sub, "starts_call"),
            "right_tool": _rate(sub, "right_tool"),
            "exact": _rate(sub, "exact"),
            "passes": statistics.mean(r["passes"] for r in sub),
        }
        for t in tools
        for sub in [[r for r in rows if r["tool"] == t]]
    }
    return {
        "commands": len(rows),
        "starts_call": _rate(rows, "starts_call"),
        "parsed": _rate(rows, "parsed"),
        "right_tool": _rate(rows, "right_tool"),
        "exact": _rate(rows, "exact"),
        "passes_per_command": statistics.mean(r["passes"] for r in rows) if rows else None,
        "chat": len(chat_rows),
        "false_triggers": _rate(chat_rows, "trigger"),
        "chat_mentions_call": _rate(chat_rows, "mentions_call"),
        "per_tool": per_tool,
    }


def first_per_tool(commands: Sequence[Example], n: int | None) -> list[Example]:
    if n is None:
        return list(commands)
    out: list[Example] = []
    for src in dict.fromkeys(e.source for e in commands):
        out += [e for e in commands if e.source == src][:n]
    return out


def run_calls(opts: CallsOptions, log: Callable[[str], None] = print) -> dict[str, Any]:
    """`quicksilver eval calls`: the held-out split on an exported graph or in PyTorch."""
    from model.sampler import SamplerSettings
    from training.data import PROMPT_BUDGET

    commands = first_per_tool(read_jsonl(opts.data / "heldout_commands.jsonl"), opts.per_tool)
    chat = read_jsonl(opts.data / "heldout_chat.jsonl")[: opts.chat_limit]
    settings = SamplerSettings()
    max_len = PROMPT_BUDGET + opts.max_tokens + 2 * settings.block_size
    backend: StepBackend
    if opts.onnx:
        from model.assemble import load_onnx_backend
        from model.runtime import RuntimeConfig

        cfg = RuntimeConfig(max_len=max_len, threads=opts.threads)
        backend = load_onnx_backend(opts.onnx, opts.onnx_variant, cfg)  # type: ignore[arg-type]
        source = f"{opts.onnx} {opts.onnx_variant}"
    else:
        import torch

        from model.nn.adapter import load_adapter
        from model.nn.backend import TorchBackend
        from model.nn.diffusion import load_smollm2_diffusion

        torch.set_num_threads(opts.threads)
        adapter = load_adapter(opts.adapter) if opts.adapter else None
        backend = TorchBackend(load_smollm2_diffusion(None, adapter), max_len=max_len)
        source = f"torch {opts.adapter}"
    from model.nn.gguf import gguf_tokenizer

    log(f"{len(commands)} commands, {len(chat)} chat questions; {source}")
    report = check_calls(backend, gguf_tokenizer(), commands, chat, settings, opts, log)
    return {"model": source, **report}
