from __future__ import annotations

import pytest
import torch

from model.nn.gguf import GGUFFile, TokenizerData, find_smollm2_gguf
from model.nn.llama import Llama, LlamaConfig
from model.tokenizer import Tokenizer, _unicode_to_byte
from tests.speech import missing

TINY = LlamaConfig(
    vocab_size=300, n_layer=2, n_embd=32, n_head=4, n_kv_head=2, ffn_hidden=64, max_seq_len=128
)


def tiny_model(seed: int = 0, config: LlamaConfig = TINY) -> Llama:
    """A randomly initialised Llama in the same layout as SmolLM2, small and fast."""
    torch.manual_seed(seed)
    return Llama(config).eval()


def tiny_tokenizer() -> Tokenizer:
    """A real byte-level BPE tokenizer with a 259-token vocabulary (no merges)."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = specials + sorted(_unicode_to_byte(), key=_unicode_to_byte().get)
    return Tokenizer(
        TokenizerData(
            tokens=tokens,
            merges=[],
            token_types=[3] * len(specials) + [1] * 256,
            bos_id=1,
            eos_id=2,
            model="gpt2",
            pre="smollm",
        )
    )


@pytest.fixture(scope="session")
def smollm2_gguf() -> GGUFFile:
    try:
        return GGUFFile(find_smollm2_gguf())
    except FileNotFoundError as exc:
        missing(str(exc))
