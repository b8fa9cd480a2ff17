"""The self-distillation corpus: voice-assistant questions answered by SmolLM2 itself.

There is no chat corpus offline, so the project builds one (``quicksilver data``):

* questions come from templates with slot fillers (``training/prompts/templates.json``)
  and from the model itself (asked, with seeded sampling, to write a question a person
  might ask a voice assistant about a topic);
* replies are written by the autoregressive SmolLM2-135M-Instruct with the spoken-answer
  system prompt, decoded greedily (exactly what ``smollm2-ar`` says), so the diffusion
  model learns to say what the autoregressive one would.

``quicksilver data --own-replies DIR`` writes a second kind of corpus: the diffusion
model's own replies to training questions (:func:`own_replies`), for certainty forcing.

The held-out questions (``training/prompts/heldout.txt``) are fixed, answered the same way,
and never trained on: training questions equal to one of them are dropped.
Everything is drawn from one seed, so the same seed writes the same files.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from model.backend import StepBackend
from model.chat import SPOKEN_SYSTEM_PROMPT, build_prompt, encode_chat
from model.engine import ChatMessage
from model.nn.llama import Llama
from model.tokenizer import Tokenizer

PROMPTS_DIR = Path(__file__).parent / "prompts"
HELDOUT_FILE = PROMPTS_DIR / "heldout.txt"
TEMPLATES_FILE = PROMPTS_DIR / "templates.json"
PROMPT_BUDGET = 1024  # as AROptions.prompt_budget

QUESTION_WRITER = (
    "Write one short question that a person might ask a voice assistant about {topic}. "
    "Reply with the question only."
)


@dataclass(frozen=True)
class DataConfig:
    seed: int = 1234
    n: int = 400  # training questions
    model_share: float = 0.25  # of them written by the model itself
    max_reply_tokens: int = 96  # replies that do not end inside it are dropped
    question_temperature: float = 0.9
    batch: int = 16  # questions decoded together
    # Held-out replies are the fp32 greedy ones the eval compares against; training
    # replies may be written in bf16 (faster on an AMX CPU; the fp32 held-out replies
    # stay the reference).
    train_dtype: str = "float32"
    # where the replies are decoded: "cpu", "cuda", "cuda:N" or "auto"
    # (training.train.train_device); a GPU writes a 20k-reply corpus in minutes
    device: str = "cpu"


@dataclass(frozen=True)
class Example:
    question: str
    source: str  # "template", "model" or "heldout"
    reply: str
    reply_ids: list[int]  # the reply's tokens, ending with <|im_end|> when it ended
    ended: bool
    # the system prompt the example is trained with; "": the spoken-answer one. A tool
    # call's reply_ids are made piece by piece (model.tools.call_ids), not from `reply`
    system: str = ""


# ---------------------------------------------------------------- questions


def read_heldout(path: Path = HELDOUT_FILE) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]


def _norm(q: str) -> str:
    return " ".join(q.lower().split()).rstrip("?.! ")


def template_questions(rng: random.Random, n: int, templates: dict[str, Any]) -> list[str]:
    """``n`` distinct questions from the templates (fewer if the space runs out)."""
    out: dict[str, None] = {}
    for _ in range(n * 50):
        if len(out) >= n:
            break
        t = rng.choice(templates["templates"])
        slots = {k: rng.choice(v) for k, v in templates["slots"].items()}
        out.setdefault(t.format(**slots), None)
    return list(out)


def decode_batch(
    model: Llama,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    stop_ids: Collection[int],
    temperature: float = 0.0,
    gen: torch.Generator | None = None,
) -> list[tuple[list[int], bool]]:
    """Greedy (temperature 0) or sampled replies for a batch of prompts, left-padded.

    On this shared 2-core CPU one batch-16 step costs little more than a batch-1 step,
    so the corpus is written far faster than one question at a time. Returns per
    prompt (tokens without the stop token, ended). Padded keys are masked out and the
    positions start at 0 for each prompt, so each row is the same computation as
    model.generate.greedy up to float rounding.
    """
    dev = model.tok_emb.weight.device  # every tensor where the model is (CPU or a GPU)
    B, L = len(prompts), max(len(p) for p in prompts)
    n_pad = torch.tensor([L - len(p) for p in prompts], device=dev)  # (B,)
    x = torch.tensor([[0] * (L - len(p)) + list(p) for p in prompts], device=dev)  # (B, L)
    i = torch.arange(L, device=dev)
    real = i[None] >= n_pad[:, None]  # (B, L) key is a real token
    pos = (i[None] - n_pad[:, None]).clamp(min=0)  # (B, L)
    # causal over real keys; a pad query sees itself only (no all-masked rows: NaN)
    mask = ((i[None, :] <= i[:, None]) & real[:, None, :]) | torch.eye(
        L, dtype=torch.bool, device=dev
    )
    mask = mask[:, None]  # (B, 1, L, L)
    cache = model.new_cache(B, L + max_new_tokens)
    out: list[list[int]] = [[] for _ in range(B)]
    ended = [False] * B
    alive = list(range(B))  # batch row j is prompt alive[j]; finished rows are dropped
    with torch.inference_mode():
        for step in range(max_new_tokens):
            rows = [x.shape[1] - 1]  # the last token's logits only
            logits = model(x, pos=pos, cache=cache, mask=mask, rows=rows)[:, -1].float()
            if temperature > 0:
                probs = torch.softmax(logits / temperature, dim=-1)
                token = torch.multinomial(probs, 1, generator=gen)[:, 0]  # (B,)
            else:
                token = logits.argmax(-1)  # (B,)
            for b, t in zip(alive, token.tolist(), strict=True):  # one copy off a GPU
                if t in stop_ids:
                    ended[b] = True
                else:
                    out[b].append(t)
            keep = torch.tensor([not ended[b] for b in alive], device=dev)
            if not keep.any():
                break
            if not keep.all():
                # Half the replies end well before the longest one: compacting the batch
                # saves about a third of the corpus's decoding time.
                alive = [b for b, k in zip(alive, keep.tolist(), strict=True) if k]
                token, n_pad, real = token[keep], n_pad[keep], real[keep]
                cache.keep_rows(keep)
            x = token[:, None]  # (B, 1)
            pos = (L - n_pad + step)[:, None]  # (B, 1)
            real = torch.cat((real, real.new_ones(len(alive), 1)), dim=1)
            mask = real[:, None, None, :]  # (B, 1, 1, S)
    return list(zip(out, ended, strict=True))


def model_questions(
    model: Llama,
    tok: Tokenizer,
    rng: random.Random,
    n: int,
    cfg: DataConfig,
    log: Callable[[str], None] = print,
) -> list[str]:
    """Questions SmolLM2 writes itself, one per topic draw (seeded sampling)."""
    topics = json.loads(TEMPLATES_FILE.read_text())["topics_for_model_questions"]
    # sampling draws on the model's device (a CPU generator cannot feed a GPU's)
    gen = torch.Generator(model.tok_emb.weight.device).manual_seed(rng.randrange(2**31))
    out: dict[str, None] = {}
    for _ in range(max(8, 5 * n // cfg.batch + 1)):  # a quarter to a half of the drafts are kept
        if len(out) >= n:
            break
        drafts = [rng.choice(topics) for _ in range(cfg.batch)]
        prompts = [
            encode_chat(tok, [ChatMessage("user", QUESTION_WRITER.format(topic=t))]) for t in drafts
        ]
        replies = decode_batch(model, prompts, 24, tok.stop_ids, cfg.question_temperature, gen)
        for ids, _ in replies:
            q = tok.decode(ids).strip().split("\n")[0].strip().strip('"')
            if _is_question(q):
                out.setdefault(q, None)
        log(f"model-written questions: {len(out)} of {n}")
    return list(out)[:n]


def _is_question(q: str) -> bool:
    words = q.split()
    return 3 <= len(words) <= 16 and q.endswith("?") and ":" not in q and "assist" not in q


def training_questions(
    model: Llama, tok: Tokenizer, cfg: DataConfig, log: Callable[[str], None] = print
) -> list[tuple[str, str]]:
    """(question, source) pairs, held-out questions removed, in a seeded order."""
    rng = random.Random(cfg.seed)
    templates = json.loads(TEMPLATES_FILE.read_text())
    n_model = round(cfg.n * cfg.model_share)
    held = {_norm(q) for q in read_heldout()}
    pairs = [(q, "model") for q in model_questions(model, tok, rng, n_model, cfg, log)]
    pairs += [(q, "template") for q in template_questions(rng, cfg.n - len(pairs), templates)]
    seen: set[str] = set(held)
    out = []
    for q, src in pairs:
        if _norm(q) not in seen:
            seen.add(_norm(q))
            out.append((q, src))
    rng.shuffle(out)
    return out


# ---------------------------------------------------------------- replies


def prompt_ids(
    tok: Tokenizer, question: str, history: Sequence[tuple[str, str]] = (), system: str = ""
) -> list[int]:
    """The prompt the engines build for ``question`` after the earlier turns
    ``history`` ((question, reply) pairs, oldest first) of the same conversation, under
    ``system`` ("": the spoken-answer system prompt)."""
    earlier = [m for q, a in history for m in (ChatMessage("user", q), ChatMessage("assistant", a))]
    conversation = [*earlier, ChatMessage("user", question)]
    return build_prompt(tok, conversation, PROMPT_BUDGET, system or SPOKEN_SYSTEM_PROMPT)


def answer_all(
    model: Llama,
    tok: Tokenizer,
    questions: Sequence[tuple[str, str]],
    cfg: DataConfig,
    log: Callable[[str], None] = print,
) -> Iterator[Example]:
    """Greedy replies, ``cfg.batch`` questions per batch, in order."""
    t0, n_tok = time.perf_counter(), 0
    for i in range(0, len(questions), cfg.batch):
        chunk = questions[i : i + cfg.batch]
        prompts = [prompt_ids(tok, q) for q, _ in chunk]
        for (q, src), (ids, ended) in zip(
            chunk, decode_batch(model, prompts, cfg.max_reply_tokens, tok.stop_ids), strict=True
        ):
            reply_ids = [*ids, tok.im_end_id] if ended else ids
            n_tok += len(reply_ids)
            yield Example(q, src, tok.decode(ids).strip(), reply_ids, ended)
        dt = time.perf_counter() - t0
        log(f"[{i + len(chunk)}/{len(questions)}] {n_tok / dt:.1f} tok/s {dt:.0f} s")


# ---------------------------------------------------------------- files


def write_jsonl(path: Path, examples: Iterable[Example]) -> list[Example]:
    done = []
    with path.open("w") as f:
        for ex in examples:
            row = asdict(ex)
            if not ex.system:  # the spoken prompt: rows as the corpus always had them
                del row["system"]
            f.write(json.dumps(row) + "\n")
            f.flush()  # a long run can be watched and used partially
            done.append(ex)
    return done


def read_jsonl(path: Path | str) -> list[Example]:
    return [Example(**json.loads(line)) for line in Path(path).read_text().splitlines() if line]


def corpus_counts(train: list[Example], asked: int) -> dict[str, Any]:
    """The recipe's counts of a written training file: kept, dropped, tokens, sources."""
    return {
        "train": len(train),
        "dropped_unended": asked - len(train),
        "train_reply_tokens": sum(len(e.reply_ids) for e in train),
        "sources": {s: sum(e.source == s for e in train) for s in ("template", "model")},
    }


def reply_budget(source: Path) -> int:
    """The reply budget a corpus was written with (its recipe's ``max_reply_tokens``)."""
    return recipe_budget(json.loads((source / "recipe.json").read_text()))


def recipe_budget(recipe: dict[str, Any]) -> int:
    """The reply budget in an already read ``recipe.json``."""
    return int(recipe["config"]["max_reply_tokens"])


def make_dataset(
    model: Llama,
    tok: Tokenizer,
    cfg: DataConfig,
    out: Path,
    log: Callable[[str], None] = print,
    heldout: list[str] | None = None,
) -> dict[str, Any]:
    """Write heldout.jsonl, train.jsonl (ended replies only) and recipe.json into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    model = model.to(torch.device(cfg.device))
    heldout = read_heldout() if heldout is None else heldout
    held = [(q, "heldout") for q in heldout]
    held_file = out / "heldout.jsonl"
    # The held-out replies do not depend on cfg.n: a complete file is kept, so a corpus
    # can be regrown with another n without answering them again.
    if held_file.exists() and [e.question for e in read_jsonl(held_file)] == heldout:
        held_ex = read_jsonl(held_file)
    else:
        held_ex = write_jsonl(held_file, answer_all(model, tok, held, cfg, log))
    model = model.to(getattr(torch, cfg.train_dtype))
    questions = training_questions(model, tok, cfg, log)
    answered: list[Example] = []

    def kept() -> Iterator[Example]:  # the ended replies, streamed; `answered` counts all
        for e in answer_all(model, tok, questions, cfg, log):
            answered.append(e)
            if e.ended:
                yield e

    train = write_jsonl(out / "train.jsonl", kept())
    recipe = {
        "config": asdict(cfg),
        "replies": "greedy SmolLM2-135M-Instruct (batched, training.data.decode_batch), "
        "spoken system prompt; held-out in float32",
        "heldout": len(held_ex),
        **corpus_counts(train, len(answered)),
    }
    (out / "recipe.json").write_text(json.dumps(recipe, indent=2) + "\n")
    return recipe


def own_replies(
    backend: StepBackend,
    teacher: str,
    tok: Tokenizer,
    source: Path,
    out: Path,
    limit: int,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """A corpus of the diffusion model's own replies (dParallel's teacher trajectories).

    ``limit`` training questions of the corpus in ``source`` (a seeded draw) are answered
    by the served sampler (``backend``: the exported graph; default ``SamplerSettings``,
    deterministic), and the replies that end inside ``max_reply_tokens`` become
    ``out/train.jsonl``; ``teacher`` names the graph in the recipe. Training on them with
    certainty forcing sharpens the model towards what it already says instead of towards
    text it cannot yet predict. The held-out file is copied unchanged: the eval still
    compares against the AR replies.
    """
    from model.diffusion_engine import smollm2_diffusion_config
    from model.engine import drain
    from model.sampler import SamplerSettings, sample

    recipe = json.loads((source / "recipe.json").read_text())
    budget = recipe_budget(recipe)
    questions = [(e.question, e.source) for e in read_jsonl(source / "train.jsonl")]
    random.Random(seed).shuffle(questions)
    questions = questions[:limit]
    config, settings = smollm2_diffusion_config(tok), SamplerSettings()
    out.mkdir(parents=True, exist_ok=True)
    (out / "heldout.jsonl").write_text((source / "heldout.jsonl").read_text())
    t0 = time.perf_counter()

    def answer() -> Iterator[Example]:
        for i, (q, src) in enumerate(questions):
            rng = np.random.default_rng(seed)
            ids, stats = drain(sample(backend, prompt_ids(tok, q), config, settings, rng, budget))
            if i % 20 == 19 or i + 1 == len(questions):
                log(f"[{i + 1}/{len(questions)}] {time.perf_counter() - t0:.0f} s")
            if stats.stopped_by == "end":
                yield Example(q, src, tok.decode(ids).strip(), [*ids, tok.im_end_id], True)

    train = write_jsonl(out / "train.jsonl", answer())
    recipe = {
        "config": {**recipe["config"], "trajectories": len(questions), "trajectory_seed": seed},
        "replies": f"the diffusion model's own replies ({teacher}, default SamplerSettings) "
        f"to training questions of {source}",
        "heldout": recipe["heldout"],
        **corpus_counts(train, len(questions)),  # the generator above ran to the end
    }
    (out / "recipe.json").write_text(json.dumps(recipe, indent=2) + "\n")
    return recipe
