"""The wheel, installed the way a plain ``pip install .`` installs it, holds what serving
needs: the shipped diffusion adapter is package data, and ``quicksilver serve`` from the
installed package answers a turn.

The wheel is built from a copy of the checkout's files (tracked and untracked, not the
ignored ones), so a stale ``build/`` never leaks into it and the checkout is left as it
was; pip builds it offline with the project venv's setuptools (torch requires a recent
one). It goes into a fresh venv with ``--no-deps``; a ``.pth`` file then lets that venv
see the project venv's site-packages for the dependencies only: a ``.pth`` path entry's
own ``.pth`` files are not run, so the checkout's editable install stays out. Every
command runs from a folder outside the checkout, so the checkout is never on sys.path.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from model.assemble import DEFAULT_ENGINE, engine_model_dir, serving_variant
from model.modeldir import CHAT_ADAPTER, SHIPPED_ADAPTER, default_cache_dir, is_complete
from server import protocol as p

pytestmark = [pytest.mark.slow, pytest.mark.models]

ROOT = Path(__file__).resolve().parents[1]
_URL = re.compile(r"listening on (ws://\S+)")


@dataclass(frozen=True)
class Install:
    venv: Path
    site: Path  # the venv's own site-packages, where the wheel went
    outside: Path  # a working directory outside the checkout
    env: dict[str, str]


def _run(
    cmd: list[str | Path], cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    run = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    assert run.returncode == 0, f"{cmd} failed ({run.returncode}):\n{run.stdout}\n{run.stderr}"
    return run


def _copy_checkout(dest: Path) -> None:
    """The files a fresh checkout with today's edits holds: tracked (minus deleted) and
    untracked, never what .gitignore names (build/, *.egg-info, .venv, exported models)."""
    listed = _run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT)
    for name in filter(None, listed.stdout.split("\0")):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def install(tmp_path_factory: pytest.TempPathFactory) -> Install:
    base = tmp_path_factory.mktemp("wheel")
    src, dist, venv, outside = base / "src", base / "dist", base / "venv", base / "run"
    outside.mkdir()
    _copy_checkout(src)
    pip: list[str | Path] = [sys.executable, "-m", "pip", "-q"]
    _run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", dist, src], outside
    )
    (wheel,) = dist.glob("quicksilver-*.whl")
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=outside)
    python = venv / "bin" / "python"
    # pip of this venv installs into the new one (--python); nothing of the project venv
    # is visible to it yet, so it installs the wheel rather than find quicksilver there.
    _run([*pip, "--python", python, "install", "--no-deps", "--no-index", wheel], outside)
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(_run([python, "-c", code], cwd=outside).stdout.strip())
    deps = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (site / "project-deps.pth").write_text("".join(f"{d}\n" for d in deps))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return Install(venv, site, outside, {**env, "PYTHONUNBUFFERED": "1"})


def test_wheel_ships_the_adapter(install: Install) -> None:
    code = (
        "import json, sys, model.modeldir as m, cli.main; print(json.dumps({"
        "'adapter': str(m.shipped_adapter()), 'cli': cli.main.__file__, 'path': sys.path}))"
    )
    python = install.venv / "bin" / "python"
    out = json.loads(_run([python, "-c", code], cwd=install.outside, env=install.env).stdout)
    assert str(ROOT) not in out["path"]
    assert Path(out["cli"]).resolve().is_relative_to(install.site.resolve())
    adapter = Path(out["adapter"]).resolve()
    assert adapter.is_relative_to(install.site.resolve()), adapter
    # the served adapter with its router and span pointers (model/router.py, model/spans.py)
    for name in ("adapter.safetensors", "manifest.json", "router.npz", "spans.npz"):
        assert _sha256(adapter / name) == _sha256(SHIPPED_ADAPTER / name), name
    chat = adapter.with_name(CHAT_ADAPTER.name)  # the chat adapter, --adapter model/adapters
    for name in ("adapter.safetensors", "manifest.json"):
        assert _sha256(chat / name) == _sha256(CHAT_ADAPTER / name), name


def _serve_cache(model_cache: Path) -> Path:
    """The test session's cache once a server of this session has built the reply model
    there; else ~/.cache/quicksilver if its model is complete (only read: no build);
    else the test session's, where this server builds it (a minute or more)."""
    variant = serving_variant(DEFAULT_ENGINE)
    for cache in (model_cache, default_cache_dir()):
        if is_complete(engine_model_dir(DEFAULT_ENGINE, cache), variant):
            return cache
    return model_cache


@dataclass
class Served:
    proc: subprocess.Popen[str]
    url: str
    log: Path


@pytest.fixture
def served(install: Install, model_cache: Path) -> Iterator[Served]:
    """``quicksilver serve`` of the installed wheel, its console script."""
    log = install.outside / "server.log"
    cmd: list[str | Path] = [install.venv / "bin" / "quicksilver", "serve", "--host", "127.0.0.1"]
    cmd += ["--port", "0", "--cache-dir", _serve_cache(model_cache)]
    with log.open("w") as err:
        proc = subprocess.Popen(
            cmd, cwd=install.outside, env=install.env, stdout=subprocess.PIPE, stderr=err, text=True
        )
    found: list[str] = []
    done = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if (m := _URL.search(line)) and not found:
                found.append(m.group(1))
                done.set()
        done.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if not done.wait(600) or not found:
            raise RuntimeError(f"server did not start; its log:\n{log.read_text()[-4000:]}")
        yield Served(proc, found[0], log)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
        reader.join(30)
        assert proc.stdout is not None
        proc.stdout.close()


async def test_installed_server_answers_a_text_turn(served: Served) -> None:
    async with connect(served.url) as ws:
        await ws.send(p.encode(p.Start(sample_rate=16000, client="test_wheel")))
        ready = p.decode_server(await ws.recv())
        assert isinstance(ready, p.Ready) and ready.reply_engine == DEFAULT_ENGINE
        await ws.send(p.encode(p.Text("What is the capital of France?")))
        audio = 0
        async with asyncio.timeout(120):
            while True:
                raw = await ws.recv()
                if isinstance(raw, bytes):
                    audio += len(raw)
                    continue
                match p.decode_server(raw):
                    case p.ReplyDone(text=text):
                        break
                    case p.ReplyCancelled() | p.Error() as bad:
                        pytest.fail(f"no reply: {bad}")
    assert text.strip() and audio > 0, (text, audio)
    served.proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(served.proc.wait, 30) == 0, served.log.read_text()[-4000:]
