"""A second Realtime client that no one here wrote: the OpenAI Agents SDK for
JavaScript (npm ``@openai/agents``), its ``RealtimeSession`` over the Node WebSocket
transport with the SDK's default session config, holds a text turn with the real
server's ``/v1/realtime``. The SDK is pinned in tests/e2e/agents_js (``npm ci`` there;
.ci/run does it); without Node or the package the tests skip, and fail in CI."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from model.chat import SPOKEN_SYSTEM_PROMPT
from tests.serverproc import ServerProcess
from tests.speech import ITALY, missing

pytestmark = [pytest.mark.e2e, pytest.mark.models]

HERE = Path(__file__).parent / "agents_js"
DRIVER = HERE / "realtime_turn.mjs"
RATE = 24_000


@pytest.fixture(scope="module")
def turn(server: ServerProcess) -> dict[str, Any]:
    """The summary of one text turn through the SDK: status, audio bytes, transcript,
    the server's error events."""
    node = shutil.which("node")
    if node is None:
        missing("node is not installed (the Agents SDK for JavaScript runs on it)")
    if not (HERE / "node_modules" / "@openai" / "agents").is_dir():
        missing(f"@openai/agents is not installed: `npm ci` in {HERE}")
    url = server.url.removesuffix("/voice") + "/realtime"
    # the agent's instructions are the server's own prompt: the answer below is the one
    # the default model gives under it, whether or not the server takes the SDK's update
    done = subprocess.run(
        [node, str(DRIVER), url, ITALY.text, SPOKEN_SYSTEM_PROMPT],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, (done.returncode, done.stdout[-3000:], done.stderr)
    summary: dict[str, Any] = lines[-1]["summary"]
    return summary


def test_a_text_turn_gets_a_spoken_answer_and_a_completed_response(turn: dict[str, Any]) -> None:
    assert turn["status"] == "completed"
    ITALY.check(turn["transcript"])  # the SDK's own session history holds the answer
    assert turn["audio_bytes"] // 2 > RATE // 2  # over half a second of 24 kHz speech


def test_the_sdk_s_default_session_config_is_accepted(turn: dict[str, Any]) -> None:
    """Its transcription model is echoed, semantic_vad maps onto the end-of-turn policy,
    the agent's instructions apply, tracing "auto" is taken (nothing is recorded)."""
    assert turn["errors"] == []
