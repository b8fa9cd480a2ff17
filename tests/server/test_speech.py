"""The reply's text cut into chunks for Piper (no models)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from model.engine import GenerationStats, ReplyChunk, ReplyEnd
from server.speech import Sentence, SentenceSplitter, sentences


def split(text: str, first_clause: bool) -> list[str]:
    """Fed a word at a time, as a reply model streams."""
    splitter = SentenceSplitter(first_clause=first_clause)
    out: list[str] = []
    for i, word in enumerate(text.split(" ")):
        out += splitter.feed(word if i == 0 else " " + word)
    return out + splitter.flush()


@pytest.mark.parametrize(
    ("text", "chunks"),
    [
        (  # a clause mark after enough words
            "Paris is the capital of France, and it is known for art. It rains.",
            ["Paris is the capital of France,", "and it is known for art.", "It rains."],
        ),
        (  # before a word that opens a phrase, when no mark comes
            "The weather in Paris will be sunny and warm with a light breeze. Enjoy.",
            ["The weather in Paris", "will be sunny and warm", "with a light breeze.", "Enjoy."],
        ),
        (  # after three words at the soonest
            "Set a timer for twenty minutes.",
            ["Set a timer", "for twenty minutes."],
        ),
        (  # a short clause
            "Of course, the nearest gas station is a mile away.",
            ["Of course,", "the nearest gas station is a mile away."],
        ),
        (  # never a phrase that ends on a preposition or an article
            "The weather in in Paris is sunny.",
            ["The weather in in Paris", "is sunny."],
        ),
        (  # "of" holds its noun phrase together
            "The capital of Australia is Canberra.",
            ["The capital of Australia", "is Canberra."],
        ),
        ("Sure. I can help, of course.", ["Sure.", "I can help, of course."]),  # short first
        ("Yes, it is.", ["Yes, it is."]),  # too few words before the comma
        (  # only the first sentence is cut
            "Hello there. Paris is the capital of France, and more.",
            ["Hello there.", "Paris is the capital of France, and more."],
        ),
    ],
)
def test_a_long_first_sentence_is_cut_at_its_first_phrase(text: str, chunks: list[str]) -> None:
    assert split(text, first_clause=True) == chunks
    assert " ".join(chunks) == text  # nothing lost or moved


def test_the_rest_of_the_first_sentence_goes_in_phrases_too() -> None:
    """A long first sentence is not written to its end before its second chunk."""
    text = (
        "The novel Pride and Prejudice by Jane Austen is attributed to the English "
        "novelist Jane Austen. It is old."
    )
    assert split(text, first_clause=True) == [
        "The novel Pride",
        "and Prejudice by Jane Austen",
        "is attributed to the English novelist Jane Austen.",
        "It is old.",
    ]


def test_without_first_clause_only_sentences_are_released() -> None:
    text = "Paris is the capital of France, and it is known for art. It rains."
    assert split(text, first_clause=False) == [
        "Paris is the capital of France, and it is known for art.",
        "It rains.",
    ]


async def test_markup_in_a_reply_is_never_spoken() -> None:
    """A reply model's stray tags (seen: "<name>My sister sent ...</name>I'm sorry")
    are left out of the sentences Piper reads; a "<" that opens no tag stays."""

    async def reply() -> AsyncIterator[ReplyChunk]:
        for piece in ["<name>My sister sent", " a message.</name>", "<b></b>", " So 3 < 5. Ok."]:
            yield piece
        yield ReplyEnd(GenerationStats(0, 0, "end"))

    out = [c async for c in sentences(reply())]
    said = [c.text for c in out if isinstance(c, Sentence)]
    assert said == ["My sister sent a message.", "So 3 < 5.", "Ok."]
    assert [c.index for c in out if isinstance(c, Sentence)] == [0, 1, 2]
