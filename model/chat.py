"""ChatML prompts for the reply model, with a spoken-answer system prompt.

SmolLM2-Instruct's template (embedded in its GGUF) is ChatML:
``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message, then
``<|im_start|>assistant\\n`` to ask for the reply. Prompts are built as token ids, one
message at a time: the special tokens come from the tokenizer, and text in a message
(say, a transcript containing "<|im_end|>") is never read as a control token.
"""

from __future__ import annotations

from collections.abc import Sequence

from model.engine import ChatMessage
from model.tokenizer import Tokenizer

SPOKEN_SYSTEM_PROMPT = (
    "You are a helpful voice assistant. Your answers are read aloud, so reply in one to "
    "three short sentences of plain spoken words. No markdown, no lists, no emoji."
)


def format_chatml(messages: Sequence[ChatMessage], add_generation_prompt: bool = True) -> str:
    """The prompt as text (for logs and tests; the model gets :func:`encode_chat`)."""
    text = "".join(f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def encode_message(tok: Tokenizer, message: ChatMessage) -> list[int]:
    body = tok.encode_plain(f"{message.role}\n{message.content}")
    return [tok.im_start_id, *body, tok.im_end_id, *tok.encode_plain("\n")]


def first_message_length(tok: Tokenizer, ids: Sequence[int]) -> int:
    """Tokens of the first message of an encoded prompt (:func:`encode_chat`): the
    system prompt and tools every conversation of a session kind starts with; 0 when
    the prompt holds no whole message."""
    try:
        end = list(ids).index(tok.im_end_id)
    except ValueError:
        return 0
    n = end + 1 + len(tok.encode_plain("\n"))
    return n if n <= len(ids) else 0


def encode_chat(
    tok: Tokenizer, messages: Sequence[ChatMessage], add_generation_prompt: bool = True
) -> list[int]:
    ids = [i for m in messages for i in encode_message(tok, m)]
    if add_generation_prompt:
        ids += [tok.im_start_id, *tok.encode_plain("assistant\n")]
    return ids


def with_system_prompt(
    conversation: Sequence[ChatMessage], system_prompt: str = SPOKEN_SYSTEM_PROMPT
) -> list[ChatMessage]:
    """The conversation with ``system_prompt`` in front, unless it brings its own."""
    if conversation and conversation[0].role == "system":
        return list(conversation)
    return [ChatMessage("system", system_prompt), *conversation]


# Oldest messages are dropped in steps of this many, so that the next turns of a
# conversation keep the same start and reuse its KV cache (model/prefix.py) instead of
# prefilling the whole history again after every drop.
TRIM_STEP = 4


def trim_history(
    tok: Tokenizer, messages: Sequence[ChatMessage], budget: int, window: int | None = None
) -> list[ChatMessage]:
    """Drop the oldest turns until the prompt fits in ``budget`` tokens and at most
    ``window`` messages come before the latest one.

    The system prompt and the latest message are always kept, even if they alone
    exceed the budget. Messages go in steps of :data:`TRIM_STEP` counted from the start
    of the conversation, and after a drop the history restarts at a user message, so
    the model never sees an answer without its question.
    """
    msgs = list(messages)
    head = msgs[:1] if msgs and msgs[0].role == "system" else []
    body = msgs[len(head) :]
    sizes = [len(encode_message(tok, m)) for m in body]
    drop = 0 if window is None else max(0, len(body) - 1 - window)
    total = sum(len(encode_message(tok, m)) for m in head) + sum(sizes[drop:])
    total += len(encode_chat(tok, []))  # + "<|im_start|>assistant\n"
    while drop < len(body) - 1 and total > budget:
        total -= sizes[drop]
        drop += 1
    if drop:  # round up to the step, then on to a user message
        drop = min(-(-drop // TRIM_STEP) * TRIM_STEP, len(body) - 1)
        while drop < len(body) - 1 and body[drop].role != "user":
            drop += 1
    return head + body[drop:]


def next_prompt_start(
    tok: Tokenizer,
    conversation: Sequence[ChatMessage],
    budget: int,
    system_prompt: str = SPOKEN_SYSTEM_PROMPT,
    window: int | None = None,
) -> list[int]:
    """Token ids the prompt of ``conversation``'s next turn starts with: every message
    :func:`build_prompt` will keep of it once a user message comes, up to where that
    message goes. The history is trimmed as for a short next message (a long one may
    trim more: its prompt then shares less of this start)."""
    coming = ChatMessage("user", "")
    messages = trim_history(
        tok, with_system_prompt([*conversation, coming], system_prompt), budget, window
    )
    return encode_chat(tok, messages[:-1], add_generation_prompt=False)


def system_head(tok: Tokenizer, system_prompt: str = SPOKEN_SYSTEM_PROMPT) -> list[int]:
    """Token ids every prompt with ``system_prompt`` starts with: its first message, as
    :func:`build_prompt` encodes it and :func:`first_message_length` measures it."""
    ids = encode_chat(tok, with_system_prompt([ChatMessage("user", "")], system_prompt))
    return ids[: first_message_length(tok, ids)]


def build_prompt(
    tok: Tokenizer,
    conversation: Sequence[ChatMessage],
    budget: int,
    system_prompt: str = SPOKEN_SYSTEM_PROMPT,
    window: int | None = None,
) -> list[int]:
    """Token ids of the prompt that asks for the next assistant reply, with at most
    ``window`` earlier messages (:func:`trim_history`). A latest message that alone
    passes the budget is cut to fit (its start kept)."""
    conversation = with_system_prompt(conversation, system_prompt)
    messages = trim_history(tok, conversation, budget, window)
    ids = encode_chat(tok, messages)
    if len(ids) <= budget or not messages:
        return ids
    *head, last = messages
    fixed = len(encode_chat(tok, [*head, ChatMessage(last.role, "")]))
    body = tok.encode_plain(last.content)[: max(0, budget - fixed)]
    return encode_chat(tok, [*head, ChatMessage(last.role, tok.decode(body))])
