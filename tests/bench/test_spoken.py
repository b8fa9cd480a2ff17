"""``quicksilver eval actions --spoken``: its scoring on the held-out lines and the calls
the server sends, its noise, and one small run through the real server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.spoken import (
    NOT_COMMANDS,
    Heard,
    Line,
    Noise,
    babble,
    by_condition,
    eval_lines,
    parse_noise,
    score,
    summarize,
    table,
    utterance,
    white,
)
from cli.main import main
from tests.serverproc import ServerProcess

DATA = Path(__file__).resolve().parents[2] / "data" / "actions"


@pytest.fixture(scope="module")
def lines() -> list[Line]:
    return eval_lines(DATA, per_tool=1, chat_limit=3)


def _line(lines: list[Line], text: str) -> Line:
    return next(line for line in lines if line.text == text)


def test_the_lines_are_held_out_commands_chat_and_the_sound_alikes(lines: list[Line]) -> None:
    kinds = [line.kind for line in lines]
    assert kinds.count("command") == 12  # one per default tool
    assert kinds.count("chat") == 3 and kinds.count("other") == len(NOT_COMMANDS)
    assert kinds[:3] == ["command", "chat", "other"]  # interleaved: --limit keeps each kind
    train = {json.loads(r)["question"] for r in (DATA / "train.jsonl").read_text().splitlines()}
    assert not train & {line.text for line in lines}
    assert all(line.expected is not None for line in lines if line.kind == "command")


def _row(line: Line, heard: Heard, voice: str = "piper", noise: str = "clean") -> dict[str, Any]:
    return {"voice": voice, "noise": noise, **score(line, heard)}


def test_scores_exact_wrong_false_asked_and_contradicting_calls(lines: list[Line]) -> None:
    timer = _line(lines, "Uh I want you to start counting down from 35 minutes.")
    right = {"name": "timer.set", "arguments": {"seconds": 2100}}
    heard = "I want you to start counting down from 35 minutes."
    exact = _row(timer, Heard(heard, right, 1, "Okay, counting down from 35 minutes."))
    assert exact["exact"] and not exact["wrong_call"] and exact["contradiction"] == []
    assert exact["word_errors"] == 1  # Whisper drops the "Uh"

    misheard = "I want you to start counting down from 30, I'm mid-"
    thirty = {"name": "timer.set", "arguments": {"seconds": 30}}
    wrong = _row(timer, Heard(misheard, thirty, 1, "Okay, counting down from 30."), "espeak-us")
    assert wrong["wrong_call"] and not wrong["exact"] and wrong["contradiction"] == []

    said_wrong = Heard(timer.text, right, 1, "Okay, counting down from ninety minutes.")
    contradicts = _row(timer, said_wrong, noise="babble 10 dB")
    assert contradicts["exact"] and contradicts["contradiction"]

    emily = _line(lines, "So shoot Emily a message saying I'll be there in ten minutes.")
    to_emily = {"to": "Emily", "text": "I'll be there in 10 minutes"}  # as Whisper writes it
    sent = score(emily, Heard(emily.text, {"name": "message.send", "arguments": to_emily}, 1))
    assert sent["exact"]
    to_family = {**to_emily, "to": "family"}
    sent = score(emily, Heard(emily.text, {"name": "message.send", "arguments": to_family}, 1))
    assert sent["wrong_call"]

    lights = _line(lines, "The lights in this city are beautiful.")
    on = {"name": "lights.set", "arguments": {"on": True}}
    false = _row(lights, Heard(lights.text, on, 1, "Okay, the lights are on."))
    assert false["false_action"] and not false["false_ask"] and not false["wrong_call"]

    read = _line(lines, "Read me my last message.")
    send = {"name": "message.send", "arguments": {"to": "me", "text": "my last message"}}
    question = "Send 'my last message' to you?"
    asked = _row(read, Heard(read.text, send, 1, "", question, asked=True))
    assert asked["false_ask"] and not asked["false_action"]

    chat = next(line for line in lines if line.kind == "chat")
    answered = _row(chat, Heard(chat.text, None, 0, "The capital of Australia is Canberra."))
    assert not any(answered[k] for k in ("exact", "false_action", "false_ask", "wrong_call"))

    rows = [exact, wrong, contradicts, false, asked, answered]
    conditions = by_condition(rows)
    assert list(conditions) == ["piper, clean", "espeak-us, clean", "piper, babble 10 dB", "all"]
    s = conditions["all"]
    assert (s["commands"], s["exact"], s["wrong_calls"], s["contradictions"]) == (3, 2, 1, 1)
    assert (s["not_commands"], s["false_actions"], s["false_asks"]) == (3, 1, 1)
    assert s["exact_rate"] == round(2 / 3, 4) and s["false_action_rate"] == round(1 / 3, 4)
    piper = conditions["piper, clean"]
    assert (piper["commands"], piper["exact"], piper["false_actions"]) == (1, 1, 1)
    assert (s["wrong_calls_misheard"], s["false_actions_misheard"]) == (1, 0)
    assert s["contradictions_after_yes"] == 0
    assert "| piper, clean | 1/1 | 1/3 (0) | 0/1 (0) | 0 (0) | 0 / 0 / 1 |" in table(conditions)
    # a command made right after a question and a yes is right, and counted as asked
    said = "Send 'I'll be there in ten minutes' to Emily?"
    call = {"name": "message.send", "arguments": to_emily}
    asked_right = summarize([score(emily, Heard(emily.text, call, 1, "", said, asked=True))])
    assert (asked_right["exact"], asked_right["right_asks"], asked_right["wrong_asks"]) == (1, 1, 0)


def test_noise_is_seeded_and_at_the_stated_snr() -> None:
    rng = np.random.default_rng(0)
    speech = (0.1 * np.sin(np.arange(16_000) / 5)).astype(np.float32)
    talkers = [rng.standard_normal(8000).astype(np.float32) for _ in range(4)]
    n = 16_000 + 9600  # the speech and the silence around it
    for source in (white(n, 3), babble(talkers, n, 3)):
        noisy = utterance(speech, Noise("white", 10), source)
        clean = utterance(speech, Noise("clean"), source)
        added = noisy - clean
        ratio = np.mean(speech.astype(np.float64) ** 2) / np.mean(added.astype(np.float64) ** 2)
        assert 10 * np.log10(ratio) == pytest.approx(10, abs=0.2)
    assert np.array_equal(babble(talkers, n, 3), babble(talkers, n, 3))
    assert not np.array_equal(white(n, 3), white(n, 4))
    assert parse_noise("babble:5") == Noise("babble", 5.0)
    with pytest.raises(ValueError):
        parse_noise("pink:10")


@pytest.mark.e2e
@pytest.mark.models
def test_spoken_eval_through_the_real_server(server: ServerProcess, tmp_path: Path) -> None:
    """A held-out command and a chat question in Piper's voice through the server: the
    command's call exact, the question not acted on, both heard nearly word for word."""
    out = tmp_path / "spoken.json"
    rc = main(
        ["eval", "actions", "--spoken", "--url", server.url, "--json", str(out),
         "--voices", "piper", "--noise", "clean", "--limit", "2", "--data", str(DATA)]
    )  # fmt: skip
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert rc == 0, rows
    assert [(r["kind"], r["voice"], r["noise"]) for r in rows] == [
        ("command", "piper", "clean"),
        ("chat", "piper", "clean"),
    ]
    command, chat = rows
    assert command["exact"], command
    assert command["call"] == {"name": "timer.set", "arguments": {"seconds": 2100}}
    assert command["contradiction"] == [] and command["reply"], command
    assert chat["call"] is None and not chat["question"] and chat["reply"], chat
    assert command["word_errors"] + chat["word_errors"] <= 2, rows
    assert report["summary"]["exact_rate"] == 1.0
    assert report["summary"]["false_actions"] == 0
    assert report["server"]["asr"] and report["server"]["engine"]
