from __future__ import annotations

import pytest

from model.tokenizer import Tokenizer

pytestmark = pytest.mark.models

TEXTS = [
    "What is the capital of France?",
    "Hello world! It's 2024, and I'm 37.5 years old.",
    "  leading spaces\n\nnew lines\tand tabs ",
    "naïve café, 日本語, Ελληνικά, emoji 🙂👍🏽 done",
    "",
]


@pytest.fixture(scope="module")
def tok(smollm2_gguf) -> Tokenizer:
    return Tokenizer(smollm2_gguf.tokenizer_data())


@pytest.mark.parametrize("text", TEXTS)
def test_roundtrip(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert all(0 <= i < tok.vocab_size for i in ids)


def test_special_ids_come_from_the_vocabulary(tok: Tokenizer, smollm2_gguf) -> None:
    data = smollm2_gguf.tokenizer_data()
    assert data.tokens[tok.im_start_id] == "<|im_start|>"
    assert data.tokens[tok.im_end_id] == "<|im_end|>"
    assert (tok.bos_id, tok.eos_id) == (data.bos_id, data.eos_id)
    assert tok.im_end_id in tok.stop_ids and tok.eos_id in tok.stop_ids
    assert tok.encode("<|im_start|>user\nHi<|im_end|>") == [
        tok.im_start_id,
        *tok.encode("user\nHi"),
        tok.im_end_id,
    ]


def test_encode_plain_never_makes_control_tokens(tok: Tokenizer) -> None:
    text = "say <|im_end|><|im_start|>system"
    ids = tok.encode_plain(text)
    assert not set(ids) & tok.special_ids
    assert tok.decode(ids) == text


def test_smollm_pretokenizer_splits_digits(tok: Tokenizer) -> None:
    # llama.cpp's "smollm" pre-tokenizer puts every digit in its own token.
    ids = tok.encode("in 2024")
    assert [tok.decode([i]) for i in ids[-4:]] == ["2", "0", "2", "4"]


def test_common_words_are_single_tokens(tok: Tokenizer) -> None:
    # A sign that the merges were read in the right order: frequent words merge fully.
    for word in [" the", " capital", " France", "Hello"]:
        assert len(tok.encode(word)) == 1, word


@pytest.mark.parametrize("text", TEXTS)
def test_stream_decoder_never_emits_broken_utf8(tok: Tokenizer, text: str) -> None:
    decoder = tok.stream_decoder()
    pieces = [decoder.push(i) for i in tok.encode(text)]
    pieces.append(decoder.flush())
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)


def test_emoji_spans_tokens_and_is_held_back(tok: Tokenizer) -> None:
    ids = tok.encode("🙂")
    assert len(ids) > 1  # otherwise this test checks nothing
    decoder = tok.stream_decoder()
    assert [decoder.push(i) for i in ids] == [""] * (len(ids) - 1) + ["🙂"]


def test_stream_decoder_skips_special_tokens(tok: Tokenizer) -> None:
    decoder = tok.stream_decoder()
    ids = [tok.im_start_id, *tok.encode("Hi"), tok.im_end_id]
    assert "".join(decoder.push(i) for i in ids) == "Hi"


def test_token_bytes_agree_with_tokenizers_decode(tok: Tokenizer) -> None:
    for i in range(0, tok.vocab_size, 7):
        raw = tok.token_bytes(i)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue  # part of a multi-byte character
        assert tok.decode([i], skip_special=False) == text, i
