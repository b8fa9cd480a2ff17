"""``quicksilver eval sessions``: does a conversation hold for 20 turns?

``quicksilver eval llm --history N`` puts borrowed earlier turns (held-out questions and
AR replies) before each question; a voice session instead shows the model its OWN
earlier replies, and a 135M model copies them: the diffusion engine began every reply
after the first with the same apology, the AR engine answered "I'm running great." to
every later turn. Here each scripted session (``prompts/sessions.json``: device
commands, questions like the held-out ones, small talk) runs through a served engine
turn by turn, the conversation built as ``server/session.py`` builds it: the user's
words, then the reply as kept (its sentences joined by single spaces; an empty reply
is not kept).

Counted per reply (the detectors below, unit-tested on hand-made replies):

* **repeat**: its first sentence, normalised (case, punctuation and apostrophes
  dropped, whitespace collapsed), equals the first sentence of an earlier reply of the
  same session;
* **echo**: it only says the user's words back: every word of the reply (normalised as
  above) is one of the user's words, allowing one new word in ten ("Set a timer for
  five minutes." to "Set a timer for five minutes"; not "Setting a timer for five
  minutes.", which has one new word in six);
* **empty**: no word at all.

Quality inside the session, as ``quicksilver eval llm`` measures it (its functions):
clean end rate and whole-sentence rate, distinct bigrams, per-token NLL of the reply
under the AR model given the prompt the engine saw, and the similarity of each reply
to the AR greedy reply to the same words asked alone (all-MiniLM-L6-v2): a reply that
still answers what was asked scores as it would at a session's start.

The device commands among the turns (``prompts/session_calls.json``: each command's
expected call, as ``quicksilver eval actions`` compares calls) are scored as actions:
**exact** calls, commands not acted on, and **false triggers** (a call on a turn that
is not a command). The AR model does not act, and its greedy reply to a command alone
is no reference for a confirmation ("Turn off the lights." -> "I'm sorry for your
loss."), so ``chat_similarity_median`` is the similarity over the turns that are not
commands: the reply quality a session keeps; ``similarity_median`` stays over every
turn, as before the commands were scored.
"""

from __future__ import annotations

import dataclasses
import json
import re
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from model.chat import build_prompt
from model.diffusion_engine import DiffusionOptions
from model.engine import ChatMessage, GenerationStats
from model.openings import first_sentence as opening_sentence
from model.openings import words
from model.tools import (
    DEFAULT_TOOLS,
    Tool,
    ToolCall,
    kept_reply,
    render_call,
    tools_system_prompt,
)
from training.data import PROMPTS_DIR
from training.eval import distinct_bigrams, ends_a_sentence, per_token
from training.eval_actions import same_call

if TYPE_CHECKING:
    from model.ar import ARGenerator
    from model.diffusion_engine import DiffusionGenerator
    from model.nn.llama import Llama
    from model.tokenizer import Tokenizer

    Generator = ARGenerator | DiffusionGenerator

SCRIPTS_FILE = PROMPTS_DIR / "sessions.json"
CALLS_FILE = PROMPTS_DIR / "session_calls.json"  # the scripts' commands -> expected calls
ECHO_NEW_WORDS = 10  # an echo may add one word in this many


# ---------------------------------------------------------------- detectors


def first_sentence(text: str) -> str:
    """The normalised words of the text's first sentence (up to . ! ? or an ellipsis
    followed by a space or the end)."""
    return " ".join(words(opening_sentence(text)))


def repeats(reply: str, earlier: Sequence[str]) -> bool:
    """The reply's first sentence is an earlier reply's first sentence (normalised)."""
    first = first_sentence(reply)
    return bool(first) and first in {first_sentence(e) for e in earlier}


def echoes(reply: str, user: str) -> bool:
    """The reply only says the user's words back: at most one word in
    :data:`ECHO_NEW_WORDS` is not one of the user's."""
    said, heard = words(reply), set(words(user))
    new = sum(w not in heard for w in said)
    return bool(said) and new <= len(said) // ECHO_NEW_WORDS


# ---------------------------------------------------------------- sessions


@dataclass
class Turn:
    user: str
    reply: str
    stats: GenerationStats
    prompt: list[int]  # what the engine saw (for the NLL)
    reply_ms: float
    first_sentence_ms: float | None  # to the first sentence's mark; None: no mark
    repeat: bool = False
    echo: bool = False
    empty: bool = False
    nll: tuple[float, int] | None = None  # summed NLL, tokens (Scorer)
    similarity: float | None = None  # to the AR greedy reply to the words alone (Scorer)
    # prompt tokens not shared with the previous turn's prompt: what a warm engine
    # prefills (model/prefix.py; the AR engine also keeps the previous reply's tokens)
    prefill: int = 0
    call: ToolCall | None = None  # the action the reply took (a session with tools)


def read_scripts(path: Path = SCRIPTS_FILE) -> dict[str, list[str]]:
    """Session name -> the user's turns, in order."""
    scripts: dict[str, list[str]] = json.loads(path.read_text())
    return scripts


def read_calls(path: Path = CALLS_FILE) -> dict[str, ToolCall]:
    """A command's words -> the call it asks for (turns not listed are not commands)."""
    raw: dict[str, dict[str, Any]] = json.loads(path.read_text())
    return {text: ToolCall(c["name"], c["arguments"]) for text, c in raw.items()}


def run_session(
    gen: Generator, user_turns: Sequence[str], max_tokens: int, tools: Sequence[Tool] = ()
) -> list[Turn]:
    """One session through ``gen``, the engine's own replies as its history. ``tools``:
    the session's (a call is kept in the conversation before the words the user heard,
    as ``server/session.py`` keeps it; no client answers it with a result)."""
    conversation: list[ChatMessage] = []
    out: list[Turn] = []
    tools = tools if getattr(gen, "supports_tools", False) else ()
    by_name = {t.name: t for t in tools}
    for text in user_turns:
        conversation.append(ChatMessage("user", text))
        o = gen.options
        system = tools_system_prompt(o.system_prompt, tools)
        budget, window = o.prompt_budget, o.history_window
        prompt = build_prompt(gen.tokenizer, conversation, budget, system, window)
        turn = _reply(gen, conversation, max_tokens, tools)
        turn.prompt = prompt
        turn.prefill = len(prompt) - (_shared(out[-1].prompt, prompt) if out else 0)
        earlier = [t.reply for t in out]
        turn.repeat, turn.echo = repeats(turn.reply, earlier), echoes(turn.reply, text)
        turn.empty = not words(turn.reply)
        out.append(turn)
        call = render_call(by_name[turn.call.name], turn.call.arguments) if turn.call else ""
        # as the session keeps a reply: the call's text, then its sentences
        if kept := kept_reply(call, " ".join(turn.reply.split())):
            conversation.append(ChatMessage("assistant", kept))
    return out


def _shared(a: list[int], b: list[int]) -> int:
    n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    return min(len(a), len(b)) if n is None else n


def _reply(
    gen: Generator, conversation: list[ChatMessage], max_tokens: int, tools: Sequence[Tool]
) -> Turn:
    t0 = time.perf_counter()
    pieces: list[str] = []
    first: float | None = None
    call: ToolCall | None = None
    it = gen.generate(list(conversation), max_tokens, lambda: False, tools=tools)
    while True:
        try:
            piece = next(it)
        except StopIteration as done:
            stats: GenerationStats = done.value
            break
        if isinstance(piece, ToolCall):  # the reply's words are what is measured
            call = piece
        elif isinstance(piece, str):
            pieces.append(piece)
        if first is None and re.search(r"[.!?\u2026]\s", "".join(pieces)):
            first = (time.perf_counter() - t0) * 1000
    ms = (time.perf_counter() - t0) * 1000
    reply = "".join(pieces).strip()
    if first is None and ends_a_sentence(reply):
        first = ms
    return Turn(conversation[-1].content, reply, stats, [], ms, first, call=call)


# ---------------------------------------------------------------- scoring


@dataclass
class Scorer:
    """The AR model and sentence embedder that score replies (``quicksilver eval llm``)."""

    model: Llama  # in the scoring dtype
    tokenizer: Tokenizer
    embedder: Any
    references: dict[str, str] = field(default_factory=dict)  # user words -> AR greedy reply
    batch: int = 8


def score_turns(turns: list[Turn], scorer: Scorer) -> None:
    """Each reply's NLL under the AR model (given the prompt the engine saw) and its
    similarity to the AR greedy reply to the user's words asked alone."""
    from training.eval import Replies, cosine_similarities, reply_nll

    tok = scorer.tokenizer
    ids = [tok.encode_plain(t.reply) for t in turns]
    ended = [t.stats.stopped_by == "end" for t in turns]
    r = Replies(ids, ended, [t.stats.forward_passes for t in turns])
    nll = reply_nll(scorer.model, tok, [t.prompt for t in turns], r, scorer.batch)
    refs = [scorer.references[t.user] for t in turns]
    sims = cosine_similarities(scorer.embedder, [t.reply for t in turns], refs)
    for t, n, s in zip(turns, nll, sims, strict=True):
        t.nll, t.similarity = n, s


def score_session(
    turns: list[Turn], tok: Tokenizer, calls: Mapping[str, ToolCall] | None = None
) -> dict[str, Any]:
    """The counts and quality figures of ``turns`` (a session, or all of an engine's);
    with ``calls`` (:func:`read_calls`), its commands' actions too."""
    n = len(turns)
    ended = [t.stats.stopped_by == "end" for t in turns]
    out: dict[str, Any] = {
        "turns": n,
        "repeats": sum(t.repeat for t in turns),
        "echoes": sum(t.echo for t in turns),
        "empty": sum(t.empty for t in turns),
        "repeat_cuts": sum(t.stats.repeat_cut for t in turns),
        "actions": sum(t.call is not None for t in turns),
        "clean_end_rate": sum(ended) / n,
        "whole_sentence_rate": sum(
            e and ends_a_sentence(t.reply) for e, t in zip(ended, turns, strict=True)
        )
        / n,
        "distinct_bigrams": statistics.mean(
            distinct_bigrams(tok.encode_plain(t.reply)) for t in turns
        ),
        "tokens_per_reply": statistics.mean(t.stats.tokens for t in turns),
        "passes_per_reply": statistics.mean(t.stats.forward_passes for t in turns),
        "prompt_tokens": statistics.mean(len(t.prompt) for t in turns),
        "prefill_tokens": statistics.mean(t.prefill for t in turns),
        "first_sentence_ms_median": _median([t.first_sentence_ms for t in turns]),
        "reply_ms_median": statistics.median(t.reply_ms for t in turns),
    }
    if all(t.nll is not None and t.similarity is not None for t in turns):
        nll = [t.nll for t in turns if t.nll is not None]
        sims = [t.similarity for t in turns if t.similarity is not None]
        out["nll_per_token"] = per_token(nll)
        out["similarity_median"] = statistics.median(sims)
        out["similarity_mean"] = statistics.mean(sims)
    if calls is not None:
        commands = [t for t in turns if t.user in calls]
        chat = [t for t in turns if t.user not in calls]
        out["commands"] = len(commands)
        out["exact_calls"] = sum(same_call(t.call, calls[t.user]) for t in commands)
        out["commands_not_acted"] = sum(t.call is None for t in commands)
        out["false_triggers"] = sum(t.call is not None for t in chat)
        chat_sims = [t.similarity for t in chat if t.similarity is not None]
        if chat_sims and "similarity_median" in out:
            out["chat_similarity_median"] = statistics.median(chat_sims)
    return out


def _median(xs: list[float | None]) -> float | None:
    got = [x for x in xs if x is not None]
    return statistics.median(got) if got else None


# ---------------------------------------------------------------- the run


@dataclass(frozen=True)
class SessionOptions:
    scripts: Path = SCRIPTS_FILE
    calls: Path = CALLS_FILE  # the scripts' commands and their expected calls
    engines: tuple[str, ...] = ("diffusion-onnx", "smollm2-ar-onnx")
    turns: int | None = None  # the first N turns of each script
    max_tokens: int = 64  # the serve default
    # the engines' options, when set: earlier messages kept, opening ban (model/openings.py)
    history_window: int | None = None
    opening_ban: int | None = None
    # the diffusion engines' stop_repeats (model/sampler.py), when set
    stop_repeats: bool | None = None
    full_history: bool = False  # history_window None for the engines (their default aside)
    quality: bool = True  # NLL and similarity (loads the AR model in PyTorch)
    # an earlier report (--json) whose AR references to reuse instead of writing them again
    references: Path | None = None
    tools: bool = False  # the default device tools (the diffusion engines; the AR has none)
    adapter: Path | None = None  # the diffusion engines' adapter (None: the default)
    threads: int = 2
    dtype: str = "bfloat16"  # the scoring model, as quicksilver eval llm


def configure(gen: Generator, opts: SessionOptions) -> Generator:
    """``gen`` with the history window and opening ban the options ask for."""
    change: dict[str, Any] = {}
    if opts.history_window is not None or opts.full_history:
        change["history_window"] = opts.history_window
    if opts.opening_ban is not None:
        change["opening_ban"] = opts.opening_ban
    if opts.stop_repeats is not None and isinstance(gen.options, DiffusionOptions):
        change["sampler"] = dataclasses.replace(gen.options.sampler, stop_repeats=opts.stop_repeats)
    gen.options = dataclasses.replace(gen.options, **change)
    return gen


def evaluate(
    generators: Sequence[Generator],
    scripts: dict[str, list[str]],
    opts: SessionOptions,
    scorer: Scorer | None,
    log: Callable[[str], None] = print,
    calls: Mapping[str, ToolCall] | None = None,
) -> dict[str, Any]:
    """Every script through every generator: rows per session and engine, totals, and
    every reply; ``calls`` (:func:`read_calls`) scores the commands as actions."""
    rows: list[dict[str, Any]] = []
    replies: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for gen in generators:
        every: list[Turn] = []
        for name, user_turns in scripts.items():
            tools = DEFAULT_TOOLS if opts.tools else ()
            turns = run_session(gen, user_turns[: opts.turns], opts.max_tokens, tools)
            if scorer is not None:
                score_turns(turns, scorer)
            scores = score_session(turns, gen.tokenizer, calls)
            row = {"engine": gen.name, "session": name, **scores}
            log(f"{gen.name} {name}: {_brief(row)}")
            rows.append(row)
            replies.setdefault(gen.name, {})[name] = [_turn_json(t) for t in turns]
            every += turns
        total = score_session(every, gen.tokenizer, calls)
        rows.append({"engine": gen.name, "session": "total", **total})
    settings = {g.name: _options_json(g) for g in generators}
    return {"rows": rows, "replies": replies, "engine_options": settings}


def _brief(row: dict[str, Any]) -> str:
    keys = ("repeats", "echoes", "empty", "clean_end_rate", "similarity_median", "exact_calls")
    return ", ".join(f"{k} {row[k]:.3g}" for k in keys if k in row)


def _turn_json(t: Turn) -> dict[str, Any]:
    return {
        "user": t.user,
        "reply": t.reply,
        "stopped_by": t.stats.stopped_by,
        "repeat_cut": t.stats.repeat_cut,
        "tokens": t.stats.tokens,
        "passes": t.stats.forward_passes,
        "prompt_tokens": len(t.prompt),
        "prefill_tokens": t.prefill,
        "reply_ms": round(t.reply_ms, 1),
        "first_sentence_ms": None if t.first_sentence_ms is None else round(t.first_sentence_ms, 1),
        "repeat": t.repeat,
        "echo": t.echo,
        "empty": t.empty,
        "nll_per_token": None if not t.nll else t.nll[0] / max(t.nll[1], 1),
        "action": None if t.call is None else {"name": t.call.name, **dict(t.call.arguments)},
        "similarity": t.similarity,
    }


def _options_json(gen: Generator) -> dict[str, Any]:
    o = gen.options
    out = {"history_window": o.history_window, "opening_ban": o.opening_ban}
    if isinstance(o, DiffusionOptions):
        out["stop_repeats"] = o.sampler.stop_repeats
    return out


def load_scorer(opts: SessionOptions, questions: list[str]) -> Scorer:
    """The AR SmolLM2 in PyTorch: its fp32 greedy replies to ``questions`` asked alone
    (the references, as ``quicksilver eval llm`` writes them; or those of the earlier
    report ``opts.references``), then ``opts.dtype`` for the NLL; and the embedder."""
    import torch

    from model.nn.gguf import GGUFFile, find_smollm2_gguf
    from model.nn.llama import Llama
    from model.tokenizer import Tokenizer
    from training.data import prompt_ids
    from training.eval import EvalOptions, ar_replies, load_embedder
    from training.precision import working_dtype

    f = GGUFFile(find_smollm2_gguf())
    tok = Tokenizer(f.tokenizer_data())
    config = f.llama_config()
    model = Llama.from_state_dict(config, f.state_dict(config), torch.float32)
    old = json.loads(opts.references.read_text())["references"] if opts.references else {}
    new = [q for q in questions if q not in old]
    ev = EvalOptions(max_tokens=opts.max_tokens)
    greedy = ar_replies(model, tok, [prompt_ids(tok, q) for q in new], ev, 0.0)
    refs = {q: tok.decode(y).strip() for q, y in zip(new, greedy.ids, strict=True)}
    refs.update({q: old[q] for q in questions if q in old})
    return Scorer(model.to(getattr(torch, working_dtype(opts.dtype))), tok, load_embedder(), refs)


def run_sessions(opts: SessionOptions, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Load the served engines (``model.assemble``) and the scorer, and evaluate."""
    import torch

    from model.assemble import ENGINES, load_generator

    torch.set_num_threads(opts.threads)
    unknown = [e for e in opts.engines if e not in ENGINES]
    if unknown:
        raise ValueError(f"unknown engine {unknown[0]!r}; choose from {', '.join(ENGINES)}")
    t0 = time.perf_counter()
    scripts = {k: v[: opts.turns] for k, v in read_scripts(opts.scripts).items()}
    questions = sorted({q for turns in scripts.values() for q in turns})
    scorer = load_scorer(opts, questions) if opts.quality else None
    log(f"{len(scripts)} sessions, {len(questions)} distinct turns; scorer ready")
    gens = [
        configure(load_generator(e, adapter=opts.adapter), opts)  # type: ignore[arg-type]
        for e in opts.engines
    ]
    report = evaluate(gens, scripts, opts, scorer, log, read_calls(opts.calls))
    report["references"] = scorer.references if scorer else {}
    report["wall_s"] = time.perf_counter() - t0
    return report


def table(report: dict[str, Any]) -> str:
    """The rows as a markdown table."""
    cols = [
        ("engine", "engine", "{}"),
        ("session", "session", "{}"),
        ("turns", "turns", "{}"),
        ("repeats", "repeats", "{}"),
        ("echoes", "echoes", "{}"),
        ("empty", "empty", "{}"),
        ("repeat_cuts", "cut before a repeat", "{}"),
        ("clean_end_rate", "clean end", "{:.3f}"),
        ("whole_sentence_rate", "whole sentence", "{:.3f}"),
        ("nll_per_token", "NLL", "{:.3f}"),
        ("similarity_median", "similarity", "{:.3f}"),
        ("chat_similarity_median", "similarity, not commands", "{:.3f}"),
        ("exact_calls", "exact calls", "{}"),
        ("commands", "commands", "{}"),
        ("commands_not_acted", "not acted", "{}"),
        ("false_triggers", "false triggers", "{}"),
        ("distinct_bigrams", "distinct bigrams", "{:.3f}"),
        ("tokens_per_reply", "tokens", "{:.1f}"),
        ("prefill_tokens", "prefill", "{:.0f}"),
        ("first_sentence_ms_median", "first sentence ms", "{:.0f}"),
    ]
    cols = [c for c in cols if any(c[0] in r for r in report["rows"])]
    lines = ["| " + " | ".join(h for _, h, _ in cols) + " |", "|" + "---|" * len(cols)]
    for r in report["rows"]:
        cells = [fmt.format(r[k]) if r.get(k) is not None else "-" for k, _, fmt in cols]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
