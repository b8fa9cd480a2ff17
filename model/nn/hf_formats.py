"""Published diffusion LMs into :class:`model.nn.llama.Llama`: LLaDA-8B-Instruct and
Dream-v0-Instruct-7B, read from their Hugging Face folders (config.json + safetensors).

LLaDA (GSAI-ML, ``modeling_llada.py``, OLMo-derived): ``model_type "llada"``, keys
``d_model, n_layers, n_heads, n_kv_heads, mlp_hidden_size, rope_theta, rms_norm_eps,
vocab_size, embedding_size, mask_token_id``; weights ``model.transformer.wte``,
``...blocks.N.{q_proj,k_proj,v_proj,attn_out,ff_proj,up_proj,ff_out,attn_norm,ff_norm}``
(``ff_proj`` is SwiGLU's gate, ``ff_out`` inside a block its down projection),
``model.transformer.ln_f`` and the head ``model.transformer.ff_out``. Bidirectional, no
logit shift.

Dream (HKUNLP, ``modeling_dream.py``): a Qwen2 body, ``model_type "Dream"``, keys
``hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
intermediate_size, rope_theta, rms_norm_eps, vocab_size, mask_token_id``; weights
``model.embed_tokens``, ``model.layers.N.self_attn.{q,k,v,o}_proj`` (q, k, v with
biases), ``mlp.{gate,up,down}_proj``, ``input_layernorm``, ``post_attention_layernorm``,
``model.norm``, ``lm_head``. Bidirectional, with the one-position logit shift.

Both use Hugging Face's rotate-half RoPE, as :mod:`model.nn.llama` does. On a GPU host::

    python -m model.nn.hf_formats /models/LLaDA-8B-Instruct "Why is the sky blue?"

loads the folder in bf16 on CUDA and answers with the full-attention sampler.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from model.nn.backend import TorchBackend
from model.nn.llama import Llama, LlamaConfig
from model.sampler import DiffusionConfig, SamplerSettings


def read_config(folder: str | Path) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((Path(folder) / "config.json").read_text())
    return config


def read_safetensors(folder: str | Path, device: str = "cpu") -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint: one file, or the shards an index names."""
    from safetensors.torch import load_file

    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors in {folder}")
    state: dict[str, torch.Tensor] = {}
    for name in files:
        state.update(load_file(folder / name, device=device))
    return state


# --------------------------------------------------------------------------- LLaDA

_LLADA_BLOCK = {
    "q_proj": "attn.q_proj",
    "k_proj": "attn.k_proj",
    "v_proj": "attn.v_proj",
    "attn_out": "attn.o_proj",
    "ff_proj": "mlp.gate_proj",
    "up_proj": "mlp.up_proj",
    "ff_out": "mlp.down_proj",
    "attn_norm": "attn_norm",
    "ff_norm": "mlp_norm",
}
_LLADA_TOP = {"wte": "tok_emb", "ln_f": "norm", "ff_out": "lm_head"}


def llada_config(cfg: dict[str, Any]) -> LlamaConfig:
    _require(cfg, block_type="llama", activation_type="silu", layer_norm_type="rms")
    _require(cfg, include_bias=False, input_emb_norm=False, scale_logits=False, alibi=False)
    d, nh = cfg["d_model"], cfg["n_heads"]
    return LlamaConfig(
        vocab_size=cfg.get("embedding_size") or cfg["vocab_size"],  # the head's width
        n_layer=cfg["n_layers"],
        n_embd=d,
        n_head=nh,
        n_kv_head=cfg.get("n_kv_heads") or nh,
        ffn_hidden=cfg.get("mlp_hidden_size") or cfg.get("mlp_ratio", 4) * d,
        rope_theta=float(cfg.get("rope_theta", 10000.0)),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
        max_seq_len=cfg.get("max_sequence_length", 4096),
        tie_embeddings=bool(cfg.get("weight_tying", False)),
        attn_bias=bool(cfg.get("include_qkv_bias", False)),
    )


def llada_name(name: str) -> str:
    m = re.fullmatch(r"model\.transformer\.blocks\.(\d+)\.(\w+)\.(weight|bias)", name)
    if m and m[2] in _LLADA_BLOCK:
        return f"blocks.{m[1]}.{_LLADA_BLOCK[m[2]]}.{m[3]}"
    m = re.fullmatch(r"model\.transformer\.(\w+)\.weight", name)
    if m and m[1] in _LLADA_TOP:
        return f"{_LLADA_TOP[m[1]]}.weight"
    raise KeyError(f"unexpected LLaDA tensor {name!r}")


# --------------------------------------------------------------------------- Dream

_DREAM_BLOCK = {
    "self_attn.q_proj": "attn.q_proj",
    "self_attn.k_proj": "attn.k_proj",
    "self_attn.v_proj": "attn.v_proj",
    "self_attn.o_proj": "attn.o_proj",
    "mlp.gate_proj": "mlp.gate_proj",
    "mlp.up_proj": "mlp.up_proj",
    "mlp.down_proj": "mlp.down_proj",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "mlp_norm",
}
_DREAM_TOP = {"model.embed_tokens": "tok_emb", "model.norm": "norm", "lm_head": "lm_head"}


def dream_config(cfg: dict[str, Any]) -> LlamaConfig:
    _require(cfg, hidden_act="silu", rope_scaling=None)
    nh = cfg["num_attention_heads"]
    return LlamaConfig(
        vocab_size=cfg["vocab_size"],
        n_layer=cfg["num_hidden_layers"],
        n_embd=cfg["hidden_size"],
        n_head=nh,
        n_kv_head=cfg.get("num_key_value_heads") or nh,
        ffn_hidden=cfg["intermediate_size"],
        rope_theta=float(cfg.get("rope_theta", 10000.0)),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        max_seq_len=cfg.get("max_position_embeddings", 32768),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attn_bias=True,  # Qwen2: q, k, v carry biases
    )


def dream_name(name: str) -> str:
    m = re.fullmatch(r"model\.layers\.(\d+)\.([\w.]+)\.(weight|bias)", name)
    if m and m[2] in _DREAM_BLOCK:
        return f"blocks.{m[1]}.{_DREAM_BLOCK[m[2]]}.{m[3]}"
    m = re.fullmatch(r"([\w.]+)\.weight", name)
    if m and m[1] in _DREAM_TOP:
        return f"{_DREAM_TOP[m[1]]}.weight"
    raise KeyError(f"unexpected Dream tensor {name!r}")


# --------------------------------------------------------------------------- loading

_FORMATS: dict[str, tuple[Callable[[dict[str, Any]], LlamaConfig], Callable[[str], str], bool]] = {
    # model_type: (config reader, weight renamer, logit shift)
    "llada": (llada_config, llada_name, False),
    "dream": (dream_config, dream_name, True),
}


def load_hf_diffusion(
    folder: str | Path, dtype: torch.dtype = torch.bfloat16, device: str = "cpu"
) -> tuple[Llama, DiffusionConfig]:
    """A LLaDA or Dream folder as a Llama (bidirectional) and its sampler config."""
    cfg = read_config(folder)
    kind = str(cfg.get("model_type", "")).lower()
    if kind not in _FORMATS:
        raise ValueError(f"{folder}: model_type {kind!r} is neither LLaDA nor Dream")
    to_config, rename, shift = _FORMATS[kind]
    config = to_config(cfg)
    raw = read_safetensors(folder, device)
    state = {rename(k): v for k, v in raw.items() if not k.endswith("rotary_emb.inv_freq")}
    model = Llama.from_state_dict(config, state, dtype)
    diffusion = DiffusionConfig(
        mask_id=int(cfg["mask_token_id"]),
        end_ids=_end_ids(Path(folder), cfg),
        attention="full",
        shift=shift,
    )
    return model, diffusion


def _end_ids(folder: Path, cfg: dict[str, Any]) -> frozenset[int]:
    """eos ids from config.json and generation_config.json (int or list in either)."""
    ids: set[int] = set()
    gen = folder / "generation_config.json"
    for c in (cfg, json.loads(gen.read_text()) if gen.is_file() else {}):
        eos = c.get("eos_token_id")
        ids.update([eos] if isinstance(eos, int) else eos or [])
    if not ids:
        raise ValueError(f"{folder}: no eos_token_id in config.json or generation_config.json")
    return frozenset(ids)


def _require(cfg: dict[str, Any], **expected: Any) -> None:
    for key, want in expected.items():
        if key in cfg and cfg[key] != want:
            raise ValueError(f"unsupported {key}={cfg[key]!r} (expected {want!r})")


def chat_prompt(folder: str | Path, question: str) -> list[int]:
    """The checkpoint's own chat template (tokenizer_config.json) over one question."""
    import jinja2
    from tokenizers import Tokenizer as HFTokenizer

    folder = Path(folder)
    tk_cfg = json.loads((folder / "tokenizer_config.json").read_text())
    template = jinja2.Environment().from_string(tk_cfg["chat_template"])
    text = template.render(
        messages=[{"role": "user", "content": question}],
        add_generation_prompt=True,
        bos_token=tk_cfg.get("bos_token") or "",
        eos_token=tk_cfg.get("eos_token") or "",
    )
    tk = HFTokenizer.from_file(str(folder / "tokenizer.json"))
    return tk.encode(text, add_special_tokens=False).ids


def answer(
    folder: str | Path,
    question: str,
    max_tokens: int = 128,
    settings: SamplerSettings | None = None,
    dtype: torch.dtype = torch.bfloat16,
    device: str = "cpu",
) -> str:
    """One reply from a LLaDA / Dream folder (full attention, LLaDA's defaults)."""
    from tokenizers import Tokenizer as HFTokenizer

    from model.sampler import sample

    model, diffusion = load_hf_diffusion(folder, dtype, device)
    prompt = chat_prompt(folder, question)
    backend = TorchBackend(model, max_len=len(prompt) + max_tokens + 64)
    settings = settings or SamplerSettings(block_size=32, rule="lowconf", steps_per_block=16)
    gen = sample(backend, prompt, diffusion, settings, np.random.default_rng(0), max_tokens)
    tokens = list(gen)
    tk = HFTokenizer.from_file(str(Path(folder) / "tokenizer.json"))
    return tk.decode(tokens, skip_special_tokens=True)


def _main() -> None:  # python -m model.nn.hf_formats FOLDER "question"
    import sys

    folder, question = sys.argv[1], " ".join(sys.argv[2:]) or "Why is the sky blue?"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(answer(folder, question, device=device))


if __name__ == "__main__":
    _main()
