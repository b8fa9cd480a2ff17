"""server.runtime: the threads the server's models run on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.inproc import ScriptedAsr, ScriptedReplies, runtime

ROOT = Path(__file__).resolve().parents[2]

# load_runtime up to its first model: the VAD's loader stops it there
PROBE = textwrap.dedent(
    """
    import json
    from threadpoolctl import threadpool_info
    import server.runtime as runtime

    def blas():
        return [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]

    before = blas()

    class Stop(Exception):
        pass

    def no_vad():
        raise Stop

    runtime.SileroVad = no_vad
    try:
        runtime.load_runtime(runtime.RuntimeOptions())
    except Stop:
        pass
    print(json.dumps({"before": before, "after": blas()}))
    """
)


def test_the_server_runs_numpy_blas_on_one_thread_before_it_loads_a_model() -> None:
    """OpenBLAS's second thread spun ~50 ms after each small product the router makes,
    on a core the reply model needed: the server holds BLAS to one thread from the
    start (in a child process: the limit is process-wide)."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "2"}  # a pool to limit, on any host
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    pools = json.loads(out.stdout.strip().splitlines()[-1])
    assert pools["before"] and all(n == 2 for n in pools["before"])
    assert pools["after"] == [1] * len(pools["before"])


@pytest.mark.models
def test_piper_writes_on_one_thread_unless_a_lone_turn_waits_for_its_first_sentence() -> None:
    """A reply's first sentence with no other turn being produced gets Piper's
    all-cores session (the reply model pauses for it); a later sentence, or any
    sentence beside other turns' work, the one-thread twin."""
    rt = runtime(ScriptedAsr(), ScriptedReplies())
    try:
        assert rt.tts.has_lean
        with rt.producing():
            assert not rt.lean_speech(first=True)
            assert rt.lean_speech(first=False)
            with rt.producing():  # another session's turn
                assert rt.lean_speech(first=True) and rt.lean_speech(first=False)
        assert not rt.lean_speech(first=True)
    finally:
        rt.close()
