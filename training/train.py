"""Adapt SmolLM2-135M-Instruct to block diffusion: the training loop (nanoGPT style).

Objective: the masked-diffusion loss (MDLM, Sahoo et al. 2024; LLaDA, Nie et al. 2025)
in its block form (BD3-LM, Arriola et al. 2025; Fast-dLLM v2). Every reply block k gets
its own mask rate t_k ~ U(eps, 1]; each of its positions is replaced by the mask token
with probability t_k. As in BD3-LM's vectorised training, one sequence carries

    [prompt | clean reply | noised reply]

with the noised copy at the same positions as the clean one, and an attention mask
(:func:`doubled_mask`) that gives every position exactly what the sampler shows it
(docs/diffusion.md): the prompt causal, as prefilled; clean block k bidirectional inside and
causal across blocks, as committed; noised block k the prompt, clean blocks < k and
itself. So one pass trains every block. With Dream's logit shift (Ye et al. 2025) the
token at a position is predicted by the row before it: inside a noised block the
previous noised row, for a block's first position the last clean row before the block
(the last prompt token for block 0), which is the sampler's last committed row. The
loss is the cross-entropy on masked positions weighted by 1/t_k, summed, and divided by
the reply positions in the batch (LLaDA's normalisation). A reply ends with <|im_end|>
and the rest of its last block is filled with <|im_end|>, in the loss too,
so the model learns to end a reply inside a block.

Trainable: LoRA on q, k, v, o, gate, up, down (model.nn.adapter) and the mask-token
embedding; the base stays frozen. Checkpoints are resumable; the batch of step s comes
from a generator seeded with (seed, s), so a resumed run sees the same batches.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F

from model.nn.adapter import (
    Adapter,
    LoRALinear,
    attach_lora,
    base_manifest,
    extract_adapter,
    load_adapter,
    save_adapter,
    target_names,
)
from model.nn.llama import Llama, rope_cos_sin
from model.tokenizer import Tokenizer
from training.data import Example, prompt_ids, read_jsonl


@dataclass(frozen=True)
class TrainConfig:
    data: str = "data/distill"  # folder from `quicksilver data`
    out: str = "runs/adapter"  # checkpoints, log, adapter
    block_size: int = 8
    rank: int = 16
    alpha: float = 32.0
    lr: float = 1e-3
    mask_lr: float = 1e-3  # the mask embedding row
    weight_decay: float = 0.0
    warmup: int = 10
    max_steps: int = 300
    batch: int = 8  # examples (one block each) per step
    eps: float = 1e-3  # t ~ U(eps, 1]
    schedule: str = "linear"  # mask rate draw: "linear" U(eps, 1]; "low" biased to low t
    grad_clip: float = 1.0
    eval_every: int = 25
    ckpt_every: int = 25
    time_limit_s: float = 0.0  # stop (and checkpoint) after this much wall time; 0: none
    seed: int = 1337
    threads: int = 2
    # "cpu", "cuda" (or "cuda:N"), or "auto" (the GPU when PyTorch sees one): the same
    # loop, batches and seeds on either; only the tensors move
    device: str = "cpu"
    # frozen base in bf16 (LoRA and mask row stay fp32): faster than fp32 and than
    # autocast, which re-casts every frozen weight on every call (docs/training.md);
    # fp32 on a CPU without AVX512_BF16/AMX, where bf16 is slower (training.precision)
    bf16: bool = True
    resume: bool = True
    # voice sessions are conversations: each training prompt gets 0..history earlier
    # turns (other training examples' questions and replies) before its question, drawn
    # per step, so a reply does not end early after a short earlier one
    # (docs/results/2026-11-conversation-training.md: it did not help the shipped adapter)
    history: int = 0
    # certainty forcing (dParallel, Chen et al. 2025): weight of the entropy, at temperature
    # certainty_temp, of the masked positions the model already predicts right, so it
    # becomes confident at many positions of a block at once (more commits per pass)
    certainty: float = 0.0
    certainty_temp: float = 0.5
    # an adapter folder to start from (its LoRA factors and mask row) instead of B = 0
    init: str = ""


# ---------------------------------------------------------------- the objective


def pad_reply(reply: list[int], block_size: int, end_id: int) -> list[int]:
    """The reply filled with end tokens to whole blocks: the sampler fills whole blocks,
    so the model learns what follows a reply's end inside one."""
    n = -(-len(reply) // block_size) * block_size
    return reply + [end_id] * (n - len(reply))


def draw_t(n: int, cfg: TrainConfig, gen: torch.Generator) -> torch.Tensor:
    """Mask rates in (eps, 1]: uniform (MDLM), or "low": u**2, more lightly masked blocks
    (the sampler spends most steps on nearly finished blocks)."""
    u = 1.0 - torch.rand(n, generator=gen)  # (0, 1]
    if cfg.schedule == "low":
        u = u.square()
    elif cfg.schedule != "linear":
        raise ValueError(f"unknown mask schedule {cfg.schedule!r}")
    return cfg.eps + (1.0 - cfg.eps) * u


def noise_block(
    x0: torch.Tensor, lo: int, hi: int, t: float, mask_id: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask each position of ``x0[lo:hi]`` with probability t: (noised x, masked (T,))."""
    masked = torch.zeros_like(x0, dtype=torch.bool)
    masked[lo:hi] = torch.rand(hi - lo, generator=gen) < t
    return torch.where(masked, mask_id, x0), masked


def doubled_mask(P: int, R: int, B: int, T: int) -> torch.Tensor:
    """Bool ``(T, T)`` attention over [prompt P | clean reply R | noised reply R | pad].

    The sampler's block-causal pattern, written for every block at once (BD3-LM's
    vectorised training): the prompt is causal; clean block k sees the prompt and clean
    blocks <= k; noised block k sees the prompt, clean blocks < k and itself. Pad rows
    see only themselves (no all-masked row); nothing real sees a pad.
    """
    i = torch.arange(T)
    k = (i - P) % R // B  # block index of a reply position (clean or noised)
    clean = (i >= P) & (i < P + R)
    noised = (i >= P + R) & (i < P + 2 * R)
    j = i[None, :]
    sees_prompt_clean = j < torch.where(clean, P + (k + 1) * B, P + k * B)[:, None]
    own = (j >= P + R + k[:, None] * B) & (j < P + R + (k[:, None] + 1) * B)
    m = torch.where(clean[:, None], sees_prompt_clean, False)
    m |= noised[:, None] & (sees_prompt_clean | own)
    m |= (i < P)[:, None] & (j <= i[:, None])
    return m | torch.eye(T, dtype=torch.bool)


@dataclass
class Batch:
    idx: torch.Tensor  # (N, T) [prompt | clean reply | noised reply | pad]
    pos: torch.Tensor  # (N, T) positions: the noised copy sits where the clean one does
    attn: torch.Tensor  # (N, 1, T, T) bool
    rows: torch.Tensor  # (M,) flat indices n*T + r: the logits row predicting a target
    targets: torch.Tensor  # (M,) clean tokens at the masked positions
    weights: torch.Tensor  # (M,) 1/t of their block
    n_positions: int  # reply positions in the batch: the loss's denominator
    n_tokens: int  # real (unpadded) input tokens

    def to(self, device: torch.device) -> Batch:
        """The same batch on ``device`` (itself when it is there already)."""
        if self.idx.device == device:
            return self
        tensors = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        moved: dict[str, Any] = {
            k: v.to(device) for k, v in tensors.items() if isinstance(v, torch.Tensor)
        }
        return dataclasses.replace(self, **moved)


def predictor_rows(P: int, R: int, B: int) -> torch.Tensor:
    """For each noised reply position, the row whose logits predict it (Dream shift):
    the previous noised row inside a block; for a block's first position the last clean
    row before it (the last prompt token for block 0), as the sampler's committed prefix."""
    u = torch.arange(R)
    inside = P + R + u - 1
    first = torch.where(u == 0, P - 1, P + u - 1)  # clean row just before the block
    return torch.where(u % B == 0, first, inside)


def make_batch(
    items: list[tuple[list[int], list[int]]],
    cfg: TrainConfig,
    mask_id: int,
    gen: torch.Generator,
    t: torch.Tensor | None = None,
) -> Batch:
    """Each (prompt, padded reply) as [prompt | clean reply | noised reply]; every reply
    block gets its own mask rate t ~ draw_t (``t``: one rate per example, for tests)."""
    B = cfg.block_size
    T = max(len(p) + 2 * len(r) for p, r in items)
    N = len(items)
    idx = torch.zeros(N, T, dtype=torch.long)
    pos = torch.zeros(N, T, dtype=torch.long)
    attn = torch.zeros(N, 1, T, T, dtype=torch.bool)
    rows, targets, weights = [], [], []
    for n, (prompt, reply) in enumerate(items):
        P, R = len(prompt), len(reply)
        x0 = torch.tensor(reply)
        tb = draw_t(R // B, cfg, gen) if t is None else t[n].repeat(R // B)  # per block
        masked = torch.rand(R, generator=gen) < tb.repeat_interleave(B)  # (R,)
        noised = torch.where(masked, mask_id, x0)
        idx[n, : P + 2 * R] = torch.cat((torch.tensor(prompt), x0, noised))
        pos[n, : P + 2 * R] = torch.cat((torch.arange(P + R), torch.arange(P, P + R)))
        attn[n, 0] = doubled_mask(P, R, B, T)
        q = masked.nonzero()[:, 0]
        rows.append(n * T + predictor_rows(P, R, B)[q])
        targets.append(x0[q])
        weights.append(1.0 / tb.repeat_interleave(B)[q])
    return Batch(
        idx,
        pos,
        attn,
        torch.cat(rows),
        torch.cat(targets),
        torch.cat(weights),
        sum(len(r) for _, r in items),
        sum(len(p) + 2 * len(r) for p, r in items),
    )


def diffusion_loss(
    logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor, n_positions: int
) -> torch.Tensor:
    """sum over masked positions of CE / t, divided by the block positions (MDLM / LLaDA)."""
    ce = F.cross_entropy(logits.float(), targets, reduction="none")  # (M,)
    return (ce * weights).sum() / n_positions


def certainty_loss(logits: torch.Tensor, targets: torch.Tensor, temp: float) -> torch.Tensor:
    """Mean entropy of ``softmax(logits / temp)`` over the positions whose argmax is already
    the target (dParallel's certainty forcing); zero when there are none. Wrong predictions
    are left to the cross-entropy: sharpening them would make the sampler commit errors."""
    right = logits.argmax(-1) == targets
    if not bool(right.any()):
        return logits.new_zeros((), dtype=torch.float32)
    logp = F.log_softmax(logits[right].float() / temp, dim=-1)
    return -(logp.exp() * logp).sum(-1).mean()


def confident_share(logits: torch.Tensor, targets: torch.Tensor, threshold: float) -> float:
    """Share of masked positions predicted right with probability >= ``threshold``: the
    positions a threshold sampler could commit in parallel."""
    p = logits.float().softmax(-1).max(-1)
    return float(((p.values >= threshold) & (p.indices == targets)).float().mean())


def forward_rows(
    model: Llama,
    mask_emb: torch.Tensor,
    idx: torch.Tensor,
    pos: torch.Tensor,
    attn: torch.Tensor,
    rows: torch.Tensor,
) -> torch.Tensor:
    """Logits ``(M, V)`` at flat positions ``rows`` of ``idx (N, T)``, no cache.

    Like Llama.forward, but the mask token's embedding is the trainable ``mask_emb`` and
    the head runs only on the rows the loss reads (the head is a fifth of the model).
    """
    N, T = idx.shape
    V = model.config.vocab_size
    x = F.embedding(idx.clamp(max=V - 1), model.tok_emb.weight)  # (N, T, C)
    x = torch.where((idx == V)[..., None], mask_emb.to(x.dtype), x)
    rope = rope_cos_sin(pos, model.config.head_dim, model.config.rope_theta, x.dtype)
    for i, block in enumerate(model.blocks):
        x = block(x, rope, attn, None, i, True)
    h = x.reshape(N * T, -1)[rows]  # (M, C)
    return model.head(model.norm(h))  # (M, V)


# ---------------------------------------------------------------- data


def encode_examples(
    tok: Tokenizer, examples: list[Example], B: int
) -> list[tuple[list[int], list[int]]]:
    return [
        (prompt_ids(tok, e.question, system=e.system), pad_reply(e.reply_ids, B, tok.im_end_id))
        for e in examples
    ]


def with_history(
    tok: Tokenizer,
    examples: list[Example],
    pick: list[int],
    items: list[tuple[list[int], list[int]]],
    cfg: TrainConfig,
    gen: torch.Generator,
) -> list[tuple[list[int], list[int]]]:
    """The picked (prompt, reply) items, each prompt rebuilt after 0..cfg.history
    earlier turns drawn from the other examples (same reply, same targets)."""
    out: list[tuple[list[int], list[int]]] = []
    for i in pick:
        h = int(torch.randint(cfg.history + 1, (1,), generator=gen))
        if h == 0:
            out.append(items[i])
            continue
        others = torch.randint(len(examples), (h,), generator=gen).tolist()
        turns = [(examples[j].question, examples[j].reply.strip()) for j in others if j != i]
        out.append((prompt_ids(tok, examples[i].question, turns, examples[i].system), items[i][1]))
    return out


def heldout_batches(
    items: list[tuple[list[int], list[int]]], cfg: TrainConfig, mask_id: int
) -> list[Batch]:
    """Fixed noise for the held-out loss: the same blocks, rates and masks every eval."""
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    # t on a fixed grid, so each eval covers light and heavy masking alike
    t = torch.linspace(cfg.eps, 1.0, len(items) + 2)[1:-1]
    return [
        make_batch(items[i : i + cfg.batch], cfg, mask_id, gen, t[i : i + cfg.batch])
        for i in range(0, len(items), cfg.batch)
    ]


def evaluate(
    model: Llama,
    mask_emb: torch.Tensor,
    batches: list[Batch],
    cfg: TrainConfig,
    threshold: float = 0.9,
) -> tuple[float, float]:
    """Held-out loss per reply position, and the share of masked positions predicted
    right with probability >= ``threshold`` (the sampler's default threshold)."""
    total, n, sure, m = 0.0, 0, 0.0, 0
    with torch.no_grad():
        for b in batches:
            b = b.to(mask_emb.device)
            logits = forward_rows(model, mask_emb, b.idx, b.pos, b.attn, b.rows)
            total += float(diffusion_loss(logits, b.targets, b.weights, 1))
            n += b.n_positions
            sure += confident_share(logits, b.targets, threshold) * len(b.targets)
            m += len(b.targets)
    return total / n, sure / max(m, 1)


# ---------------------------------------------------------------- loop


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup, then cosine to a tenth (nanoGPT's get_lr)."""
    if step < cfg.warmup:
        return (step + 1) / cfg.warmup
    r = (step - cfg.warmup) / max(1, cfg.max_steps - cfg.warmup)
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(r, 1.0)))


def train_device(name: str, option: str = "--set device=") -> torch.device:
    """``TrainConfig.device`` (or another command's device ``name``, asked for as
    ``option``, which the messages name) as a torch device; a GPU that is not there is
    an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"{option}{name}: use cpu, cuda, cuda:N or auto") from exc
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"{option}{name}: use cpu, cuda, cuda:N or auto")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"{option}{name}: PyTorch {torch.__version__} sees no CUDA GPU here "
            f"(a CPU build, or no device); use {option}cpu or auto"
        )
    if device.type == "cuda" and (device.index or 0) >= (count := torch.cuda.device_count()):
        raise ValueError(f"{option}{name}: PyTorch sees {count} GPU(s) here, cuda:0 up")
    return device


def build(
    cfg: TrainConfig, model: Llama
) -> tuple[list[torch.nn.Parameter], torch.nn.Parameter, torch.optim.AdamW]:
    """LoRA on the frozen model, the mask row as a parameter, AdamW over both, all on
    ``cfg.device``."""
    torch.manual_seed(cfg.seed)
    model.to(train_device(cfg.device))
    mask_emb = torch.nn.Parameter(
        model.tok_emb.weight[model.config.vocab_size].detach().float().clone()
    )
    if cfg.bf16:
        model.to(torch.bfloat16)
    lora = attach_lora(model, cfg.rank, cfg.alpha)
    if cfg.init:
        start_from(model, mask_emb, load_adapter(cfg.init), cfg)
    opt = torch.optim.AdamW(
        [
            {"params": lora, "lr": cfg.lr, "weight_decay": cfg.weight_decay},
            {"params": [mask_emb], "lr": cfg.mask_lr, "weight_decay": 0.0},
        ],
        betas=(0.9, 0.99),
    )
    return lora, mask_emb, opt


def start_from(model: Llama, mask_emb: torch.Tensor, adapter: Adapter, cfg: TrainConfig) -> None:
    """Copy a trained adapter's factors and mask row into freshly attached LoRA."""
    if (adapter.rank, adapter.alpha) != (cfg.rank, cfg.alpha):
        raise ValueError(
            f"--set init={cfg.init}: adapter has rank {adapter.rank}, alpha {adapter.alpha}; "
            f"the run has rank {cfg.rank}, alpha {cfg.alpha}"
        )
    with torch.no_grad():
        for name in target_names(model):
            A, B = adapter.lora[name]
            lora = cast(LoRALinear, model.get_submodule(name))  # attached by build()
            lora.lora_A.copy_(A)
            lora.lora_B.copy_(B)
        mask_emb.copy_(adapter.mask_embedding)


def train_step(
    model: Llama,
    mask_emb: torch.Tensor,
    opt: torch.optim.Optimizer,
    params: list[torch.nn.Parameter],
    batch: Batch,
    cfg: TrainConfig,
    step: int,
) -> float:
    for g, base in zip(opt.param_groups, (cfg.lr, cfg.mask_lr), strict=True):
        g["lr"] = base * lr_at(step, cfg)
    batch = batch.to(mask_emb.device)
    logits = forward_rows(model, mask_emb, batch.idx, batch.pos, batch.attn, batch.rows)
    loss = diffusion_loss(logits, batch.targets, batch.weights, batch.n_positions)
    if cfg.certainty:
        loss = loss + cfg.certainty * certainty_loss(logits, batch.targets, cfg.certainty_temp)
    opt.zero_grad(set_to_none=True)
    loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
    torch.nn.utils.clip_grad_norm_([*params, mask_emb], cfg.grad_clip)
    opt.step()
    return float(loss.detach())


def save_checkpoint(
    path: Path,
    params: list[torch.nn.Parameter],
    mask_emb: torch.Tensor,
    opt: torch.optim.Optimizer,
    state: dict[str, Any],
) -> None:
    tmp = path.with_suffix(".tmp")
    blob = {"params": [p.detach() for p in params], "mask_emb": mask_emb.detach(), **state}
    torch.save({**blob, "opt": opt.state_dict()}, tmp)
    tmp.replace(path)  # atomic: a killed run never leaves half a checkpoint


def load_checkpoint(
    path: Path,
    params: list[torch.nn.Parameter],
    mask_emb: torch.Tensor,
    opt: torch.optim.Optimizer,
) -> dict[str, Any]:
    # a GPU run resumes anywhere
    ck: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=False)
    with torch.no_grad():
        for p, saved in zip(params, ck["params"], strict=True):
            p.copy_(saved)
        mask_emb.copy_(ck["mask_emb"])
    opt.load_state_dict(ck["opt"])
    return ck


def train(
    model: Llama,
    tok: Tokenizer,
    train_ex: list[Example],
    held_ex: list[Example],
    cfg: TrainConfig,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The loop; returns the run's record (steps, tokens, wall time, held-out curve)."""
    from tqdm import tqdm

    torch.set_num_threads(cfg.threads)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    mask_id = model.config.vocab_size
    items = encode_examples(tok, train_ex, cfg.block_size)
    held = heldout_batches(encode_examples(tok, held_ex, cfg.block_size), cfg, mask_id)
    params, mask_emb, opt = build(cfg, model)
    held = [b.to(mask_emb.device) for b in held]  # once, not at every eval
    state: dict[str, Any] = {"step": 0, "tokens": 0, "wall_s": 0.0, "curve": [], "losses": []}
    ckpt = out / "ckpt.pt"
    if cfg.resume and ckpt.exists():
        ck = load_checkpoint(ckpt, params, mask_emb, opt)
        state = {k: ck[k] for k in state}
        log(f"resumed from {ckpt} at step {state['step']}")

    def checkpoint_eval(step: int) -> None:
        loss, sure = evaluate(model, mask_emb, held, cfg)
        state["curve"].append((step, state["tokens"], loss, sure))
        log(f"step {step} held-out loss {loss:.4f}, confident share {sure:.3f}")

    if not state["curve"]:
        checkpoint_eval(0)
    t0, wall0 = time.perf_counter(), state["wall_s"]
    bar = tqdm(range(state["step"], cfg.max_steps), initial=state["step"], total=cfg.max_steps)
    for step in bar:
        gen = torch.Generator().manual_seed(cfg.seed * 100003 + step)
        pick = torch.randint(len(items), (cfg.batch,), generator=gen).tolist()
        chosen = [items[i] for i in pick]
        if cfg.history:
            chosen = with_history(tok, train_ex, pick, items, cfg, gen)
        batch = make_batch(chosen, cfg, mask_id, gen)
        model.train()
        loss = train_step(model, mask_emb, opt, params, batch, cfg, step)
        state["step"], state["tokens"] = step + 1, state["tokens"] + batch.n_tokens
        state["wall_s"] = wall0 + time.perf_counter() - t0
        state["losses"].append(loss)
        bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{state['tokens'] / state['wall_s']:.0f}")
        done = step + 1 == cfg.max_steps or (
            cfg.time_limit_s and state["wall_s"] > cfg.time_limit_s
        )
        if (step + 1) % cfg.eval_every == 0 or done:
            checkpoint_eval(step + 1)
        if (step + 1) % cfg.ckpt_every == 0 or done:
            save_checkpoint(ckpt, params, mask_emb, opt, state)
        if done:
            break
    bar.close()
    record = {"config": asdict(cfg), **{k: state[k] for k in ("step", "tokens", "wall_s", "curve")}}
    (out / "record.json").write_text(json.dumps(record, indent=2) + "\n")
    return {**record, "_params": (params, mask_emb)}


def portable_config(config: dict[str, Any]) -> dict[str, Any]:
    """The run's settings as a shipped manifest keeps them: the data, output and init
    folders by name only, never the training machine's paths."""
    paths = ("data", "out", "init")
    return {k: Path(v).name if k in paths and v else v for k, v in config.items()}


def parse_overrides(cfg: TrainConfig, pairs: list[str]) -> TrainConfig:
    """``--set key=value`` pairs onto the config, typed by the field's default."""
    changes: dict[str, Any] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        if key not in {f.name for f in dataclasses.fields(cfg)}:
            raise ValueError(
                f"--set {pair}: no setting {key!r} (see TrainConfig, training/train.py)"
            )
        kind = type(getattr(cfg, key))
        try:
            changes[key] = value.lower() in ("1", "true", "yes") if kind is bool else kind(value)
        except ValueError:
            raise ValueError(f"--set {pair}: {key} takes {kind.__name__} values") from None
    return dataclasses.replace(cfg, **changes)


def run_training(cfg: TrainConfig, ship: Path | None = None) -> dict[str, Any]:
    """`quicksilver train`: load SmolLM2 with the mask row, train, save the adapter."""
    from model.nn.diffusion import load_smollm2_diffusion
    from model.nn.gguf import gguf_tokenizer
    from training.precision import working_dtype

    if cfg.bf16 and working_dtype("bfloat16", train_device(cfg.device)) == "float32":
        cfg = dataclasses.replace(cfg, bf16=False)  # so the run's record says what ran
    tok = gguf_tokenizer()
    model = load_smollm2_diffusion()
    data = Path(cfg.data)
    record = train(
        model, tok, read_jsonl(data / "train.jsonl"), read_jsonl(data / "heldout.jsonl"), cfg
    )
    _, mask_emb = record.pop("_params")
    adapter = extract_adapter(model, mask_emb, cfg.rank, cfg.alpha)
    recipe = (
        json.loads((data / "recipe.json").read_text()) if (data / "recipe.json").exists() else {}
    )
    adapter.manifest = {
        **base_manifest(),
        "block_size": cfg.block_size,
        "mask_id": model.config.vocab_size,
        "logit_shift": True,
        "data": {"command": "quicksilver data", **recipe},
        "train": {k: record[k] for k in ("step", "tokens", "wall_s")}
        | {"config": portable_config(record["config"])},
        "steps": record["step"],
        "tokens_seen": record["tokens"],
        "heldout_loss": record["curve"][-1][2],
        "heldout_curve": record["curve"],
    }
    if cfg.init:  # the run continued another adapter: keep what that one was
        before = json.loads((Path(cfg.init) / "manifest.json").read_text())
        keep = ("steps", "tokens_seen", "heldout_loss", "train", "weights")
        adapter.manifest["init"] = {"from": Path(cfg.init).name, **{k: before.get(k) for k in keep}}
    for folder in [Path(cfg.out) / "adapter", *([ship] if ship else [])]:
        save_adapter(folder, adapter)
    return record
