"""The diffusion adapter: low-rank updates of SmolLM2's projections plus the mask token.

What the repository ships instead of a copy of the base weights (docs/training.md): LoRA
(Hu et al. 2021) factors ``A (r, in)`` and ``B (out, r)`` for the q, k, v, o, gate, up
and down projections of every layer, and the embedding row of the mask token (id = vocab
size; the mean embedding before training). Merging is ``W += alpha / r * B @ A``.

On disk: ``adapter.safetensors`` (``blocks.{i}.{attn|mlp}.{proj}.lora_A`` / ``lora_B``,
``mask_embedding``) and ``manifest.json`` (base package, version and sha256 of the GGUF,
rank, alpha, block size, data recipe and seed, steps, tokens seen, held-out loss).

For training, :func:`attach_lora` wraps the projections of a frozen Llama in
:class:`LoRALinear` (base output + scaled low-rank path); :func:`extract_adapter` reads
the trained factors back out.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from model.nn.llama import Llama

TARGETS: tuple[str, ...] = ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj")
TARGETS += ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
WEIGHTS_FILE, MANIFEST_FILE = "adapter.safetensors", "manifest.json"


@dataclass
class Adapter:
    rank: int
    alpha: float
    lora: dict[str, tuple[torch.Tensor, torch.Tensor]]  # "blocks.3.attn.q_proj" -> (A, B)
    mask_embedding: torch.Tensor  # (C,)
    manifest: dict[str, Any] = field(default_factory=dict)

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


class LoRALinear(nn.Module):
    """``base(x) + alpha/r * x A^T B^T`` with the base frozen; B starts at zero, so the
    wrapped model starts as the base model (Hu et al. 2021, section 4.1)."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float) -> None:
        super().__init__()
        self.base = base
        self.scale = alpha / rank
        device = base.weight.device  # fp32 masters beside the (maybe GPU) base
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, device=device))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, device=device))
        nn.init.kaiming_uniform_(self.lora_A, a=5**0.5)  # as nn.Linear (and peft) do

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        A, B = self.lora_A.to(x.dtype), self.lora_B.to(x.dtype)  # fp32 masters, bf16 base
        out: torch.Tensor = self.base(x) + self.scale * ((x @ A.t()) @ B.t())
        return out


def _parent(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    path, _, attr = name.rpartition(".")
    return model.get_submodule(path), attr


def target_names(model: Llama) -> list[str]:
    return [f"blocks.{i}.{t}" for i in range(model.config.n_layer) for t in TARGETS]


def attach_lora(model: Llama, rank: int, alpha: float) -> list[nn.Parameter]:
    """Freeze ``model`` and wrap its projections; returns the new trainable parameters."""
    for p in model.parameters():
        p.requires_grad_(False)
    params: list[nn.Parameter] = []
    for name in target_names(model):
        parent, attr = _parent(model, name)
        lora = LoRALinear(getattr(parent, attr), rank, alpha)
        setattr(parent, attr, lora)
        params += [lora.lora_A, lora.lora_B]
    return params


def extract_adapter(model: Llama, mask_embedding: torch.Tensor, rank: int, alpha: float) -> Adapter:
    lora = {}
    for name in target_names(model):
        m = model.get_submodule(name)
        assert isinstance(m, LoRALinear), f"{name} has no LoRA attached"
        lora[name] = (m.lora_A.detach().cpu().clone(), m.lora_B.detach().cpu().clone())
    return Adapter(rank, alpha, lora, mask_embedding.detach().cpu().clone().reshape(-1))


def apply_adapter(model: Llama, adapter: Adapter) -> Llama:
    """Merge into a plain Llama that has the extra mask row: ``W += alpha/r * B @ A``,
    embedding row ``vocab_size`` = the trained mask embedding. In place; returns it."""
    V = model.config.vocab_size
    emb = model.tok_emb.weight
    if emb.shape[0] != V + 1:
        raise ValueError(f"model has {emb.shape[0]} embedding rows; expected {V + 1} (mask row)")
    with torch.no_grad():
        for name, (A, B) in adapter.lora.items():
            lin = model.get_submodule(name)
            if not isinstance(lin, nn.Linear):
                raise TypeError(f"{name} is {type(lin).__name__}, not a plain Linear")
            delta = adapter.scale * (B.float() @ A.float())  # (out, in)
            lin.weight += delta.to(lin.weight.dtype)
        emb[V] = adapter.mask_embedding.to(emb.dtype)
    return model


def save_adapter(path: str | Path, adapter: Adapter, dtype: torch.dtype = torch.float16) -> Path:
    """Write ``adapter.safetensors`` + ``manifest.json`` into the folder ``path``."""
    from safetensors.torch import save_file

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {"mask_embedding": adapter.mask_embedding.to(dtype).contiguous()}
    for name, (A, B) in adapter.lora.items():
        tensors[f"{name}.lora_A"] = A.to(dtype).contiguous()
        tensors[f"{name}.lora_B"] = B.to(dtype).contiguous()
    save_file(tensors, out / WEIGHTS_FILE)
    manifest = {**adapter.manifest, "rank": adapter.rank, "alpha": adapter.alpha}
    manifest["weights"] = {"file": WEIGHTS_FILE, "dtype": str(dtype).removeprefix("torch.")}
    manifest["weights"]["sha256"] = sha256_file(out / WEIGHTS_FILE)
    (out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
    return out


def load_adapter(path: str | Path) -> Adapter:
    """Read a folder written by :func:`save_adapter` (tensors come back as float32)."""
    from safetensors.torch import load_file

    folder = Path(path)
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    tensors = {k: v.float() for k, v in load_file(folder / WEIGHTS_FILE).items()}
    names = sorted({k.rsplit(".", 1)[0] for k in tensors if k.endswith(".lora_A")})
    lora = {n: (tensors[f"{n}.lora_A"], tensors[f"{n}.lora_B"]) for n in names}
    return Adapter(
        int(manifest["rank"]), float(manifest["alpha"]), lora, tensors["mask_embedding"], manifest
    )


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def base_manifest() -> dict[str, Any]:
    """Which base weights the adapter belongs to: package, version, GGUF sha256."""
    from importlib.metadata import PackageNotFoundError, version

    from model.nn.gguf import SMOLLM2_PACKAGE, find_smollm2_gguf

    path, package = find_smollm2_gguf(), SMOLLM2_PACKAGE.replace("_", "-")
    try:
        installed: str | None = version(package)
    except PackageNotFoundError:  # the GGUF came from $QUICKSILVER_SMOLLM2_GGUF
        installed = None
    return {
        "base": {
            "package": package,
            "version": installed,
            "file": path.name,
            "sha256": sha256_file(path),  # what identifies the weights
        }
    }
