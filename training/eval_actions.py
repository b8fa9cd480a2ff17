"""``quicksilver eval actions``: the served engine's tool calls on held-out speech.

Each held-out command of ``quicksilver data --actions`` (``heldout_commands.jsonl``,
phrasings never trained on) and each held-out chat question (``heldout_chat.jsonl``)
goes through the reply engine exactly as a session's turn does: the served int8
diffusion model, the default device tools, ``model/actions.py``'s constrained decoder.

* a command is **exact** when the engine's call has the expected tool and arguments
  (strings compared without case, spacing or end punctuation: Whisper's spelling of what
  the user said, numbers as numbers);
* a chat question is a **false trigger** when the engine calls anything;
* ``--tool-set``: the session's tools. ``default``: the default device set for every
  line. ``own``: each command's own tool alone (a chat question: one of the set, in
  turn), as a client that gives a session only the tools it needs. ``without``: the set
  less each command's own tool (a chat question: less one, in turn), where the only
  right answer is no call: the nearest tool is a **wrong call**;
* **passes per call** are the model passes the call took (no pass for the decision,
  one per branching position and per slot pass, one per block committed), and **time to
  action** the wall time from the reply's start to the call being ready (prefill
  included), the figure that becomes the ``action`` event's latency after the turn is
  final.

No torch: this runs the serving code only.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from model.diffusion_engine import DiffusionGenerator
from model.engine import ChatMessage
from model.tools import DEFAULT_TOOLS, Tool, ToolCall, split_call


@dataclass(frozen=True)
class ActionsEvalOptions:
    data: Path = Path("data/actions")  # heldout_commands.jsonl, heldout_chat.jsonl
    onnx: Path | None = None  # an exported model directory; None: the served one
    onnx_variant: str = "int8"
    per_tool: int | None = None  # the first N held-out commands of each tool; None: all
    chat_limit: int | None = None
    max_tokens: int = 64
    threads: int = 2
    calibrate: bool = False  # the call's branches calibrated (model.actions.ContentFree)
    spans: bool = True  # string values pointed at (model/spans.py) where the adapter has pointers
    tool_set: str = "default"  # the session's tools a line: TOOL_SETS


# the session's tools a line (``--tool-set``), as the run's log names them
TOOL_SETS = {
    "default": "the default device set",
    "own": "each command's own tool alone",
    "without": "the default set less each command's tool",
}


def _described(tool_set: str) -> str:
    """How the log names ``tool_set``; an unknown one is an error naming those there are."""
    if tool_set not in TOOL_SETS:
        raise ValueError(f"tool set {tool_set!r}: one of {', '.join(TOOL_SETS)}")
    return TOOL_SETS[tool_set]


@dataclass(frozen=True)
class Case:
    text: str  # what the user said
    expected: ToolCall | None  # None: chat, no call


def read_cases(path: Path, limit_per_tool: int | None = None) -> list[Case]:
    """Held-out rows (``question``, ``reply``): the expected call is the reply's."""
    cases: list[Case] = []
    seen: dict[str, int] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        call, _ = split_call(row["reply"])
        name = call.name if call is not None else ""
        if limit_per_tool is not None and seen.get(name, 0) >= limit_per_tool:
            continue
        seen[name] = seen.get(name, 0) + 1
        cases.append(Case(row["question"], call))
    return cases


def _norm(v: Any) -> Any:
    if isinstance(v, str):
        return " ".join(v.lower().strip(" .,!?;:'\"").split())
    if isinstance(v, bool):
        return v
    return float(v) if isinstance(v, int | float) else v


def same_call(a: ToolCall | None, b: ToolCall | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.name == b.name and _norm_args(a.arguments) == _norm_args(b.arguments)


def _norm_args(args: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _norm(v) for k, v in args.items()}


def session_tools(case: Case, tool_set: str, turn: int) -> list[Tool]:
    """The tools a line's session has under ``tool_set`` (:data:`TOOL_SETS`); ``turn``
    picks a chat question's tool in turn."""
    _described(tool_set)  # an unknown set is an error
    if tool_set == "default":
        return list(DEFAULT_TOOLS)
    name = case.expected.name if case.expected else DEFAULT_TOOLS[turn % len(DEFAULT_TOOLS)].name
    own = tool_set == "own"
    return [t for t in DEFAULT_TOOLS if (t.name == name) == own]


def run_case(
    gen: DiffusionGenerator, case: Case, max_tokens: int, tools: Sequence[Tool] = DEFAULT_TOOLS
) -> dict[str, Any]:
    """One turn in a session with ``tools``: the call the engine made (if any), when,
    and the words it spoke. A command whose tool the session lacks is right with no
    call."""
    t0 = time.perf_counter()
    call: ToolCall | None = None
    t_call: float | None = None
    words: list[str] = []
    it = gen.generate([ChatMessage("user", case.text)], max_tokens, lambda: False, tools)
    while True:
        try:
            item = next(it)
        except StopIteration as done:
            stats = done.value
            break
        if isinstance(item, ToolCall):
            call, t_call = item, time.perf_counter()
        else:
            words.append(item)
    offered = {t.name for t in tools}
    want = case.expected if case.expected and case.expected.name in offered else None
    return {
        "text": case.text,
        "tools": sorted(offered) if len(offered) < len(DEFAULT_TOOLS) else "default",
        "expected": _call_json(case.expected),
        "call": _call_json(call),
        "exact": same_call(call, want),
        "passes": call.passes if call is not None else None,
        "action_ms": round((t_call - t0) * 1000, 1) if t_call is not None else None,
        "reply": "".join(words).strip(),
        "reply_passes": stats.forward_passes,
    }


def _call_json(call: ToolCall | None) -> dict[str, Any] | None:
    if call is None:
        return None
    out: dict[str, Any] = {"name": call.name, "arguments": dict(call.arguments)}
    return out if call.margin is None else {**out, "margin": round(call.margin, 3)}


def summarize(
    commands: Sequence[Mapping[str, Any]], chat: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """Per tool and overall: exact rate, wrong calls (a command's call that is not
    right: a wrong tool or value, or any call where the session lacks the tool), passes
    p50, time to action p50 / p95; false triggers on chat."""
    by_tool: dict[str, list[Mapping[str, Any]]] = {}
    for row in commands:
        by_tool.setdefault(row["expected"]["name"], []).append(row)
    tools = {name: _rates(rows) for name, rows in sorted(by_tool.items())}
    triggers = sum(row["call"] is not None for row in chat)
    return {
        "commands": len(commands),
        **_rates(commands),
        "wrong_calls": sum(r["call"] is not None and not r["exact"] for r in commands),
        "chat": len(chat),
        "false_triggers": triggers,
        "false_trigger_rate": round(triggers / len(chat), 4) if chat else None,
        "goals": {"exact_rate": ">= 0.90", "false_trigger_rate": "<= 0.02"},
        "per_tool": tools,
    }


def _rates(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    called = [r for r in rows if r["call"] is not None]
    passes = [r["passes"] for r in called]
    ms = sorted(r["action_ms"] for r in called)
    return {
        "n": len(rows),
        "exact_rate": round(sum(r["exact"] for r in rows) / len(rows), 4) if rows else None,
        "called_rate": round(len(called) / len(rows), 4) if rows else None,
        "passes_p50": statistics.median(passes) if passes else None,
        "action_ms_p50": statistics.median(ms) if ms else None,
        "action_ms_p95": ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))] if ms else None,
    }


def run_actions_eval(
    opts: ActionsEvalOptions, log: Callable[[str], None] = print
) -> dict[str, Any]:
    from model.assemble import engine_model_dir, load_onnx_diffusion_generator
    from model.runtime import RuntimeConfig

    model_dir = opts.onnx or engine_model_dir("diffusion-onnx")
    config = RuntimeConfig(threads=opts.threads)
    gen = load_onnx_diffusion_generator(model_dir, opts.onnx_variant, config)  # type: ignore[arg-type]
    actions = dataclasses.replace(gen.options.actions, calibrate=opts.calibrate)
    gen.options = dataclasses.replace(gen.options, actions=actions)
    if not opts.spans:
        gen.spans = None
    log(
        f"eval actions: {model_dir} ({opts.onnx_variant}), tools: {_described(opts.tool_set)}, "
        f"branches {'calibrated' if opts.calibrate else 'as the model ranks them'}, "
        f"string values {'pointed at' if gen.spans is not None else 'written by the model'}"
    )
    commands = read_cases(opts.data / "heldout_commands.jsonl", opts.per_tool)
    chat = read_cases(opts.data / "heldout_chat.jsonl")[: opts.chat_limit]
    rows: dict[str, list[dict[str, Any]]] = {"commands": [], "chat": []}
    for kind, cases in (("commands", commands), ("chat", chat)):
        for i, case in enumerate(cases):
            row = run_case(gen, case, opts.max_tokens, session_tools(case, opts.tool_set, i))
            rows[kind].append(row)
            mark = "ok" if row["exact"] else "MISS"
            got = f"{row['call']} {row['reply']!r}"
            log(f"{kind} {i + 1}/{len(cases)} {mark} {case.text!r} -> {got}")
    return {
        "model_dir": str(model_dir),
        "variant": opts.onnx_variant,
        "router": gen.router is not None,
        "spans": gen.spans is not None,
        "tool_set": opts.tool_set,
        "summary": summarize(rows["commands"], rows["chat"]),
        **rows,
    }
