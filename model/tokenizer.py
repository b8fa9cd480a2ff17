"""The SmolLM2 byte-level BPE tokenizer, rebuilt from the vocabulary in the GGUF.

The GGUF carries ``tokenizer.ggml.tokens`` / ``merges`` / ``token_type`` (model "gpt2",
pre-tokenizer "smollm"). llama.cpp's "smollm" pre-tokenizer (the StarCoder one) splits
every digit on its own, then applies the GPT-2 regex; that is HF's
``Sequence([Digits(individual_digits=True), ByteLevel(add_prefix_space=False)])``.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Generator
from dataclasses import dataclass
from functools import cache
from typing import cast

from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from model.engine import GenerationStats

CONTROL = 3  # gguf.TokenType.CONTROL
IM_START, IM_END = "<|im_start|>", "<|im_end|>"


@dataclass(frozen=True)
class TokenizerData:
    """The byte-level BPE vocabulary embedded in the GGUF (``tokenizer.ggml.*``)."""

    tokens: list[str]
    merges: list[str]
    token_types: list[int]  # 1 normal, 3 control (gguf.TokenType)
    bos_id: int
    eos_id: int
    model: str  # "gpt2" = byte-level BPE
    pre: str  # pre-tokenizer name, "smollm" here


@cache
def _unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's ``bytes_to_unicode``: the printable stand-in for each byte."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    bs += range(ord("®"), ord("ÿ") + 1)
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


class Tokenizer:
    """encode / decode plus the special ids the chat format and sampler need."""

    def __init__(self, data: TokenizerData) -> None:
        if data.model != "gpt2":
            raise ValueError(f"only byte-level BPE (gpt2) is supported, got {data.model!r}")
        vocab = {tok: i for i, tok in enumerate(data.tokens)}
        # each GGUF merge is "left right": split in two
        merges = cast("list[tuple[str, str]]", [tuple(m.split(" ", 1)) for m in data.merges])
        tk = HFTokenizer(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
        tk.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
        tk.decoder = decoders.ByteLevel()
        special = [
            t for t, kind in zip(data.tokens, data.token_types, strict=True) if kind == CONTROL
        ]
        tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
        self._tk = tk
        # A twin that reads control-token text as plain text, for untrusted content.
        self._plain = HFTokenizer.from_str(tk.to_str())
        self._plain.encode_special_tokens = True
        self.vocab_size = len(data.tokens)
        self.special_ids = frozenset(vocab[t] for t in special)
        self.bos_id, self.eos_id = data.bos_id, data.eos_id
        self.im_start_id, self.im_end_id = vocab[IM_START], vocab[IM_END]
        # Raw bytes of every token, for streaming decode (control tokens: their text).
        u2b = _unicode_to_byte()
        self._bytes = [
            t.encode() if kind == CONTROL else bytes(u2b[c] for c in t)
            for t, kind in zip(data.tokens, data.token_types, strict=True)
        ]

    @property
    def stop_ids(self) -> frozenset[int]:
        """Tokens that end an assistant turn (ChatML ``<|im_end|>`` and eos)."""
        return frozenset({self.im_end_id, self.eos_id})

    def encode(self, text: str) -> list[int]:
        """Token ids; special-token text (e.g. ``<|im_end|>``) maps to its id."""
        return self._tk.encode(text, add_special_tokens=False).ids

    def encode_plain(self, text: str) -> list[int]:
        """Token ids with no control tokens: ``<|im_end|>`` in text stays text."""
        return self._plain.encode(text, add_special_tokens=False).ids

    def encode_plain_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """:meth:`encode_plain` with each token's character span in ``text``."""
        enc = self._plain.encode(text, add_special_tokens=False)
        return enc.ids, [(int(a), int(b)) for a, b in enc.offsets]

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return self._tk.decode(ids, skip_special_tokens=skip_special)

    def token_bytes(self, token_id: int) -> bytes:
        return self._bytes[token_id]

    def stream_decoder(self, skip_special: bool = True) -> StreamDecoder:
        return StreamDecoder(self, skip_special)


class StreamDecoder:
    """Turns token ids into text as they arrive, never splitting a UTF-8 character.

    A byte-level BPE token may hold part of a multi-byte character (an emoji often spans
    two tokens); the incremental UTF-8 decoder keeps those bytes until the character is
    complete.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = True) -> None:
        self._tok = tokenizer
        self._skip = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        if self._skip and token_id in self._tok.special_ids:
            return ""
        return self._utf8.decode(self._tok.token_bytes(token_id))

    def flush(self) -> str:
        """Whatever is left (an incomplete character becomes U+FFFD)."""
        return self._utf8.decode(b"", final=True)


def decoded(
    tokens: Generator[int, None, GenerationStats], push: Callable[[int], str]
) -> Generator[str, None, GenerationStats]:
    """Text pieces for token ids, skipping the empty ones (partial UTF-8, specials).

    Every engine that decodes a token stream uses it; it returns the stream's stats.
    """
    while True:
        try:
            token = next(tokens)
        except StopIteration as done:
            stats: GenerationStats = done.value
            return stats
        if piece := push(token):
            yield piece
