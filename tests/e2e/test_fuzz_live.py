"""The live fuzzer (clients/fuzz.py) against the real server: thousands of random and
mutated frames from several connections while a well-behaved session asks questions.
Nothing may close with 1011, every answer must be right, and the server must live on."""

from __future__ import annotations

import json
import random

import pytest

from clients import fuzz
from tests.serverproc import ServerProcess


@pytest.mark.e2e
@pytest.mark.models
async def test_fuzzing_never_breaks_the_server_or_the_well_behaved_session(
    server: ServerProcess,
) -> None:
    opts = fuzz.Options(server.url, frames=8000, connections=3, seed=17, pid=server.proc.pid)
    report = await fuzz.run(opts)
    summary = report["summary"]
    assert isinstance(summary, dict)
    print(json.dumps(summary, indent=2))  # the figures, in the test's output
    closes = {int(code): n for code, n in summary["close_codes"].items()}
    assert 1011 not in closes, report["crashes"]
    assert set(closes) <= set(fuzz.EXPECTED_CLOSES), report["crashes"]
    # the frames reached the server's checks: sessions were closed for bad input
    assert closes.get(4002, 0) > 0 and summary["server_errors"]
    witness = summary["witness"]
    assert witness["asked"] >= 1 and witness["ok"] == witness["asked"], witness
    assert witness["close_codes"] == {"1000": witness["sessions"]}
    assert summary["undecodable"] == []
    assert summary["server_alive"] and server.proc.poll() is None
    assert summary["ok"], summary["failures"]


@pytest.mark.parametrize(
    "url",
    ["ws://10.0.0.1:8765/v1/voice", "ws://example.com/v1/voice", "ws://[::2]:1/v1/voice"],
)
def test_only_loopback_targets_are_fuzzed(url: str) -> None:
    with pytest.raises(ValueError, match="loopback"):
        fuzz.require_loopback(url)
    assert fuzz.main(["--url", url, "--frames", "1"]) == 2


@pytest.mark.parametrize(
    "url",
    ["ws://127.0.0.1:1/v1/voice", "ws://127.1.2.3/v1/voice", "ws://[::1]:1/", "ws://localhost/"],
)
def test_loopback_targets_are_accepted(url: str) -> None:
    fuzz.require_loopback(url)


def test_frames_cover_every_kind_and_the_frame_limit() -> None:
    maker = fuzz.FrameMaker(random.Random(0), fuzz.Shared())
    made = [maker.next() for _ in range(20_000)]
    assert {f.kind for f in made} == set(maker.kinds)
    sizes = [len(f.data) for f in made]
    assert min(sizes) == 0 and max(sizes) > fuzz.FRAME_LIMIT
    for f in made:  # a str frame must travel as UTF-8; bad UTF-8 only on purpose
        if isinstance(f.data, str):
            f.data.encode()
        else:
            assert f.as_text == (f.kind == "text_bad_utf8")
