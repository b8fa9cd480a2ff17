"""``quicksilver bench loop`` against the real server, on two WAVs of its speech set."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from audio.speech import SpeechFactory
from bench.loop import STAGES, load_utterances, peer_result
from bench.speechset import Voice, write_set
from cli.main import main
from tests.serverproc import ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.models]

COMPLETE = "What is the capital of Australia?"
# The first half ends on a word no sentence ends with, so holding the turn does not hang
# on whether Whisper writes "eggs," or "eggs." for a bare list (it writes either on
# the same audio): the speech set's own pauses measure that, this test the loop.
PAUSED = ("Add milk, eggs, and", "bread to my shopping list.")


@pytest.fixture(scope="module")
def speechset(tmp_path_factory: pytest.TempPathFactory, speech: SpeechFactory) -> Path:
    out = tmp_path_factory.mktemp("speechset")
    specs = [
        ("complete", (COMPLETE,), Voice("piper"), 0.0),
        ("paused", PAUSED, Voice("piper"), 0.6),
    ]
    write_set(out, specs, speech)
    return out


@pytest.fixture(scope="module")
def loop_report(
    server: ServerProcess, speechset: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("loop") / "loop.json"
    rc = main(["bench", "loop", "--url", server.url, "--wavs", str(speechset), "--json", str(out)])
    report: dict[str, Any] = json.loads(out.read_text())
    report["rc"] = rc
    return report


def test_the_speech_set_knows_where_speech_ends(speechset: Path) -> None:
    manifest = json.loads((speechset / "manifest.json").read_text())
    assert [m["file"] for m in manifest] == ["c01-piper-joe.wav", "p01-piper-joe.wav"]
    assert [m["pause_s"] for m in manifest] == [0.0, 0.6]
    assert manifest[0]["longest_gap_s"] < 0.3 <= 0.6 <= manifest[1]["longest_gap_s"] < 0.7
    assert manifest[1]["text"] == " ".join(PAUSED)
    for m, u in zip(manifest, load_utterances([speechset], None), strict=True):
        assert 0.5 < m["speech_end_s"] == u.speech_end_s
        assert m["duration_s"] - m["speech_end_s"] == pytest.approx(2.5, abs=1e-3)  # the trail
        assert u.pcm.rate == 16000 and len(u.pcm.samples) == round(m["duration_s"] * 16000)


def test_one_turn_per_utterance_and_never_early(loop_report: dict[str, Any]) -> None:
    (run,) = loop_report["runs"]
    warmup, complete, paused = run["utterances"]
    assert warmup["warmup"] and warmup["file"] == complete["file"] == "c01-piper-joe.wav"
    assert not complete["warmup"] and paused["pause_s"] == 0.6
    for u in (complete, paused):
        assert u["turns"] == 1, u
        assert not u["early"], u
        assert set(u["stages"]) == set(STAGES)
    assert "australia" in complete["transcript"].lower()
    # The scorer is wired in: a finished question takes the 200 ms path, the list that
    # stops at "and" is never answered in half (its whole reads finished or unsure).
    assert complete["end_of_turn"] == "complete", complete
    assert paused["end_of_turn"] in ("complete", "unsure"), paused
    assert complete["reply"] and complete["latency_ms"] is not None
    assert complete["actions"] == []  # a question: the served adapter speaks, no call
    assert "milk" in paused["transcript"].lower() and "bread" in paused["transcript"].lower()
    summary = loop_report["summary"]
    assert summary["utterances"] == 2 and summary["early_replies"] == 0
    assert summary["paused"] == {"utterances": 1, "one_turn": 1, "turns": [1], "early_replies": 0}
    assert set(summary["latency_ms"]) == {"n", "p50", "p95", "max"}
    assert set(summary["stages_ms"]) == set(STAGES)
    assert loop_report["commit"] and loop_report["reply_engine"] == "diffusion-onnx"


def test_a_paused_utterance_is_answered_aloud(loop_report: dict[str, Any]) -> None:
    paused = loop_report["runs"][0]["utterances"][2]
    assert paused["latency_ms"] is not None, paused
    assert loop_report["rc"] == 0


def test_the_peer_result_in_the_same_form(tmp_path: Path, speechset: Path) -> None:
    """A run.sh result and its event log: the turns are the requests per utterance,
    matched by the transcripts' words however late they come."""
    t0 = 1000.0
    turns = [
        {"file": f, "warmup": warm, "stream_start": t0 + 20 * k,
         "speech_end_abs": t0 + 20 * k + 3.0, "latency_s": lat, "reply_text": "OK."}
        for k, (f, warm, lat) in enumerate([
            ("c01-piper-joe.wav", True, 0.8),
            ("c01-piper-joe.wav", False, 0.9),
            ("p01-piper-joe.wav", False, -0.4),
        ])
    ]  # fmt: skip
    result = tmp_path / "results" / "peer-1.json"
    result.parent.mkdir()
    result.write_text(json.dumps({"label": "peer", "turns": turns}))
    said = [
        (t0 + 3.5, "What is the capital of Australia?"),
        # the same again, so the next WAV's, though late: the paused WAV is playing
        (t0 + 45.0, "What is the capital of Australia?"),
        (t0 + 62.0, "Add milk, eggs."),
        (t0 + 63.0, "And bread to my shopping list."),
    ]
    log = [
        e
        for t, text in said
        for e in (
            {"t": t, "event": "transcript", "text": text},
            {"t": t + 0.1, "event": "llm_request"},
        )
    ]
    events = tmp_path / "logs" / "events-peer-1.jsonl"
    events.parent.mkdir()
    events.write_text("".join(json.dumps(e) + "\n" for e in log))
    report = peer_result(result, None, load_utterances([speechset], None))
    warm, complete, paused = report["runs"][0]["utterances"]
    assert (warm["turns"], complete["turns"], paused["turns"]) == (1, 1, 2)
    assert paused["transcript"] == "Add milk, eggs. | And bread to my shopping list."
    assert (paused["early"], paused["latency_ms"]) == (True, -400.0)
    assert report["summary"]["paused"] == {
        "utterances": 1, "one_turn": 0, "turns": [2], "early_replies": 1,
    }  # fmt: skip
