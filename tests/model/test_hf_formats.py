"""LLaDA and Dream loaders on tiny random checkpoints written here in the published
formats (config.json + safetensors with the published tensor names), checked against
a reference forward pass computed straight from those tensors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from model.nn.hf_formats import answer, load_hf_diffusion

D, H, KV, FF, V, LAYERS = 32, 4, 2, 48, 64, 2
MASK_ID, EOS = 60, 61

LLADA_CONFIG = {
    "architectures": ["LLaDAModelLM"],
    "model_type": "llada",
    "d_model": D,
    "n_heads": H,
    "n_kv_heads": KV,
    "n_layers": LAYERS,
    "mlp_hidden_size": FF,
    "mlp_ratio": 4,
    "vocab_size": V,
    "embedding_size": V,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-5,
    "max_sequence_length": 128,
    "mask_token_id": MASK_ID,
    "eos_token_id": EOS,
    "pad_token_id": EOS,
    "weight_tying": False,
    "include_bias": False,
    "include_qkv_bias": False,
    "block_type": "llama",
    "activation_type": "silu",
    "layer_norm_type": "rms",
    "input_emb_norm": False,
    "scale_logits": False,
    "alibi": False,
    "rope": True,
}

DREAM_CONFIG = {
    "architectures": ["DreamModel"],
    "model_type": "Dream",
    "hidden_size": D,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": H,
    "num_key_value_heads": KV,
    "intermediate_size": FF,
    "vocab_size": V,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 128,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "rope_scaling": None,
    "mask_token_id": MASK_ID,
    "eos_token_id": EOS,
    "pad_token_id": EOS,
}


def rand(*shape: int, scale: float = 0.2) -> torch.Tensor:
    return torch.randn(*shape) * scale


def llada_tensors() -> dict[str, torch.Tensor]:
    hd = D // H
    t = {
        "model.transformer.wte.weight": rand(V, D, scale=1.0),
        "model.transformer.ln_f.weight": 1 + rand(D),
        "model.transformer.ff_out.weight": rand(V, D),
    }
    for i in range(LAYERS):
        p = f"model.transformer.blocks.{i}."
        t |= {
            p + "q_proj.weight": rand(D, D),
            p + "k_proj.weight": rand(KV * hd, D),
            p + "v_proj.weight": rand(KV * hd, D),
            p + "attn_out.weight": rand(D, D),
            p + "ff_proj.weight": rand(FF, D),
            p + "up_proj.weight": rand(FF, D),
            p + "ff_out.weight": rand(D, FF),
            p + "attn_norm.weight": 1 + rand(D),
            p + "ff_norm.weight": 1 + rand(D),
        }
    return {k: v.to(torch.bfloat16) for k, v in t.items()}  # published in bf16


def dream_tensors() -> dict[str, torch.Tensor]:
    hd = D // H
    t = {
        "model.embed_tokens.weight": rand(V, D, scale=1.0),
        "model.norm.weight": 1 + rand(D),
        "lm_head.weight": rand(V, D),
    }
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t |= {
            p + "self_attn.q_proj.weight": rand(D, D),
            p + "self_attn.q_proj.bias": rand(D),
            p + "self_attn.k_proj.weight": rand(KV * hd, D),
            p + "self_attn.k_proj.bias": rand(KV * hd),
            p + "self_attn.v_proj.weight": rand(KV * hd, D),
            p + "self_attn.v_proj.bias": rand(KV * hd),
            p + "self_attn.o_proj.weight": rand(D, D),
            p + "mlp.gate_proj.weight": rand(FF, D),
            p + "mlp.up_proj.weight": rand(FF, D),
            p + "mlp.down_proj.weight": rand(D, FF),
            p + "input_layernorm.weight": 1 + rand(D),
            p + "post_attention_layernorm.weight": 1 + rand(D),
        }
    return t


def reference_logits(ids: list[int], W: dict[str, torch.Tensor], fmt: str) -> torch.Tensor:
    """Bidirectional forward written from the published names: (T, V) logits."""
    W = {k: v.float() for k, v in W.items()}
    if fmt == "llada":
        top, layer = "model.transformer.", "model.transformer.blocks.{}."
        emb, norm, head = W[top + "wte.weight"], W[top + "ln_f.weight"], W[top + "ff_out.weight"]
        names = dict(q="q_proj", k="k_proj", v="v_proj", o="attn_out", gate="ff_proj")
        names |= dict(up="up_proj", down="ff_out", n1="attn_norm", n2="ff_norm")
        theta, eps = 500000.0, 1e-5
    else:
        layer = "model.layers.{}."
        emb, norm = W["model.embed_tokens.weight"], W["model.norm.weight"]
        head = W["lm_head.weight"]
        names = dict(q="self_attn.q_proj", k="self_attn.k_proj", v="self_attn.v_proj")
        names |= dict(o="self_attn.o_proj", gate="mlp.gate_proj", up="mlp.up_proj")
        names |= dict(down="mlp.down_proj", n1="input_layernorm", n2="post_attention_layernorm")
        theta, eps = 1000000.0, 1e-6
    hd, T = D // H, len(ids)

    def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)

    angle = torch.arange(T)[:, None] * theta ** (-torch.arange(0, hd, 2) / hd)  # (T, hd/2)
    cos, sin = angle.cos(), angle.sin()

    def rope(t: torch.Tensor) -> torch.Tensor:  # (h, T, hd): rotate pairs (i, i + hd/2)
        a, b = t[..., : hd // 2], t[..., hd // 2 :]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)

    def proj(x: torch.Tensor, name: str, heads: int) -> torch.Tensor:
        y = x @ W[name + ".weight"].T + W.get(name + ".bias", 0)
        return y.view(T, heads, hd).transpose(0, 1)  # (heads, T, hd)

    x = emb[ids]  # (T, D)
    for i in range(LAYERS):
        n = {k: layer.format(i) + v for k, v in names.items()}
        h = rms(x, W[n["n1"] + ".weight"])
        q, k, v = rope(proj(h, n["q"], H)), rope(proj(h, n["k"], KV)), proj(h, n["v"], KV)
        k, v = k.repeat_interleave(H // KV, 0), v.repeat_interleave(H // KV, 0)
        att = torch.softmax(q @ k.transpose(1, 2) / hd**0.5, -1) @ v  # no mask: bidirectional
        x = x + att.transpose(0, 1).reshape(T, D) @ W[n["o"] + ".weight"].T
        h = rms(x, W[n["n2"] + ".weight"])
        gate, up = h @ W[n["gate"] + ".weight"].T, h @ W[n["up"] + ".weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ W[n["down"] + ".weight"].T
    return rms(x, norm) @ head.T


def write_checkpoint(folder: Path, config: dict, tensors: dict, shards: int = 1) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    if shards == 1:
        save_file(tensors, folder / "model.safetensors")
        return
    names, weight_map = sorted(tensors), {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: tensors[k].contiguous() for k in names[s::shards]}
        save_file(part, folder / file)
        weight_map |= dict.fromkeys(part, file)
    index = {"metadata": {}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


@pytest.mark.parametrize(
    ("fmt", "config", "tensors", "shards"),
    [("llada", LLADA_CONFIG, llada_tensors, 1), ("dream", DREAM_CONFIG, dream_tensors, 2)],
)
def test_loader_matches_a_reference_forward(tmp_path, fmt, config, tensors, shards) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    W = tensors()
    write_checkpoint(tmp_path, config, W, shards)
    model, diffusion = load_hf_diffusion(tmp_path, dtype=torch.float32)
    ids = [3, 17, MASK_ID, MASK_ID, 42, 5, MASK_ID]
    with torch.inference_mode():
        logits = model(torch.tensor([ids]), mask="full")[0]
    torch.testing.assert_close(logits, reference_logits(ids, W, fmt), atol=1e-4, rtol=1e-4)
    assert diffusion.mask_id == MASK_ID and diffusion.attention == "full"
    assert diffusion.shift == (fmt == "dream") and EOS in diffusion.end_ids


def test_end_ids_come_from_config_and_generation_config(tmp_path) -> None:  # type: ignore[no-untyped-def]
    write_checkpoint(tmp_path, DREAM_CONFIG, dream_tensors())
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [61, 62]}))
    _, diffusion = load_hf_diffusion(tmp_path, dtype=torch.float32)
    assert diffusion.end_ids == {61, 62}


def test_unknown_formats_and_unsupported_options_are_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    write_checkpoint(tmp_path, {**LLADA_CONFIG, "scale_logits": True}, llada_tensors())
    with pytest.raises(ValueError, match="scale_logits"):
        load_hf_diffusion(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ValueError, match="neither"):
        load_hf_diffusion(tmp_path)


def test_answer_runs_the_full_attention_sampler_with_the_checkpoint_template(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer, models, pre_tokenizers

    torch.manual_seed(0)
    write_checkpoint(tmp_path, LLADA_CONFIG, llada_tensors())
    words = ["<user>", "<assistant>", "<eos>", *(f"w{i}" for i in range(V - 3))]
    vocab = {w: i for i, w in enumerate(words)}
    vocab["<eos>"], vocab[f"w{EOS - 3}"] = EOS, 2  # the checkpoint's eos id
    tk = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.save(str(tmp_path / "tokenizer.json"))
    template = (
        "{% for m in messages %}<user> {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    tk_config = {"chat_template": template, "eos_token": "<eos>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(tk_config))
    text = answer(tmp_path, "w5 w6 w7", max_tokens=8, dtype=torch.float32)
    assert isinstance(text, str) and len(text.split()) <= 8
    assert all(w.startswith("w") for w in text.split())
