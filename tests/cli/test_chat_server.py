"""``quicksilver serve``'s options for the openai-chat engine (no server started: the
engine against real servers is tests/model/test_openai_chat.py and tests/e2e)."""

from __future__ import annotations

import pytest

from cli.main import LLM_KEY_ENV, _parser, chat_server_options
from model.openai_chat import ChatServerOptions

CHAT = ("--engine", "openai-chat", "--llm-url", "http://h:8000/v1", "--llm-model", "m")


def options(*argv: str, env: dict[str, str] | None = None) -> ChatServerOptions | None:
    return chat_server_options(_parser().parse_args(["serve", *argv]), env or {})


def test_the_chat_server_options_go_with_the_engine() -> None:
    assert options() is None  # the default engine asks no server
    assert options(*CHAT) == ChatServerOptions("http://h:8000/v1", "m")
    with pytest.raises(ValueError, match="needs --llm-url and --llm-model"):
        options("--engine", "openai-chat", "--llm-url", "http://h:8000/v1")
    with pytest.raises(ValueError, match="are for --engine openai-chat"):
        options("--llm-url", "http://h:8000/v1")
    with pytest.raises(ValueError, match="positive"):
        options(*CHAT, "--llm-first-token-timeout", "0")
    forced = options(*CHAT, "--llm-tool-choice", "timer.set")
    assert forced is not None and forced.tool_choice == "timer.set"


def test_the_key_comes_from_the_option_or_else_the_environment() -> None:
    env = {LLM_KEY_ENV: "from-env"}
    assert (chat := options(*CHAT, env=env)) is not None and chat.api_key == "from-env"
    assert (chat := options(*CHAT, "--llm-key", "given", env=env)) is not None
    assert chat.api_key == "given"
