"""``quicksilver serve`` as a user runs it: start, serve, stop on a signal."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from server import protocol as p
from tests.serverproc import ROOT, start_server

pytestmark = [pytest.mark.e2e, pytest.mark.models]


# The SIGINT server also checks --speech-first ("auto" is on here, a CPU host),
# --turn-end (the default scores paused turns with the reply model), --asr-window
# ("auto" sizes tiny.en's window to the turn on a CPU) and --asr-beam (1 by default).
SCORED, WORDS = "scored by the reply model", "silence and words only"
OTHERS = ("--speech-first", "off", "--turn-end", "words", "--asr-window", "full", "--asr-beam", "5")


@pytest.mark.parametrize(
    ("sig", "args", "expected"),
    [
        (signal.SIGTERM, (), ("on", SCORED, "sized", 1)),
        (signal.SIGINT, OTHERS, ("off", WORDS, "full", 5)),
    ],
    ids=["SIGTERM", "SIGINT"],
)
async def test_signal_closes_every_session_with_1001_and_exits_0(
    tmp_path_factory: pytest.TempPathFactory,
    model_cache: Path,
    sig: signal.Signals,
    args: tuple[str, ...],
    expected: tuple[str, str, str, int],
) -> None:
    speech_first, turn_end, window, beam = expected
    log = tmp_path_factory.mktemp("cli") / "server.log"
    srv = start_server(log, "--cache-dir", str(model_cache), *args)
    try:
        assert f"first sentence): {speech_first}" in srv.log.read_text()
        assert f"end of turn: {turn_end}" in srv.log.read_text()
        assert f"Whisper's window: {window}" in srv.log.read_text()
        assert f"beam of {beam}" in srv.log.read_text()
        async with connect(srv.url) as a, connect(srv.url) as b:
            for ws in (a, b):
                await ws.send(p.encode(p.Start(sample_rate=16000)))
                assert isinstance(p.decode_server(await ws.recv()), p.Ready)
            srv.proc.send_signal(sig)
            for ws in (a, b):
                with pytest.raises(ConnectionClosed) as closed:
                    async with asyncio.timeout(30):
                        while True:
                            await ws.recv()
                assert closed.value.rcvd is not None
                assert closed.value.rcvd.code == p.CloseCode.GOING_AWAY
        assert srv.proc.wait(30) == 0
    finally:
        srv.stop(signal.SIGKILL)


def test_help_and_bad_engine() -> None:
    cmd = [sys.executable, "-m", "cli"]
    run = subprocess.run([*cmd, "serve", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0 and "--asr" in run.stdout and "--engine" in run.stdout
    run = subprocess.run(
        [*cmd, "serve", "--engine", "nope"], cwd=ROOT, capture_output=True, text=True
    )
    assert run.returncode == 2 and "invalid choice" in run.stderr
    run = subprocess.run(
        [*cmd, "serve", "--asr-beam", "0"], cwd=ROOT, capture_output=True, text=True
    )
    assert run.returncode == 2 and "'0' is not a whole number of at least 1" in run.stderr
    run = subprocess.run(  # the spoken eval starts its server with the same option
        [*cmd, "eval", "actions", "--spoken", "--asr-beam", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2 and "'0' is not a whole number of at least 1" in run.stderr
