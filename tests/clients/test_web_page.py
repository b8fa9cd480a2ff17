"""The voice demo page in real headless Chromium, a WAV file as its microphone.

Needs /usr/bin/chromium (Debian package) and the ``playwright`` Python package; no
Playwright browser download: the page is driven through ``executable_path``.
"""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

import pytest

from audio.speech import SpeechFactory, word_error_rate, write_wav
from tests.serverproc import ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.models]

CHROMIUM = Path("/usr/bin/chromium")
QUESTION = "What is the capital of France?"


def browser_args(wav: Path) -> list[str]:
    return [
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--use-fake-ui-for-media-stream",  # grant the microphone without asking
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={wav}%noloop",  # the WAV is the microphone
        "--autoplay-policy=no-user-gesture-required",
    ]


@pytest.fixture
def chromium() -> Path:
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")
    pytest.importorskip("playwright", reason="the playwright Python package is missing")
    return CHROMIUM


def test_the_server_serves_the_page(server: ServerProcess) -> None:
    with urllib.request.urlopen(f"{server.http}/", timeout=10) as response:
        assert 'src="/web/app.js"' in response.read().decode()
    for name in ("app.js", "capture-worklet.js", "playback-worklet.js", "style.css"):
        with urllib.request.urlopen(f"{server.http}/web/{name}", timeout=10) as response:
            assert response.status == 200


async def test_a_spoken_question_in_the_browser(
    server: ServerProcess, speech: SpeechFactory, chromium: Path, tmp_path: Path
) -> None:
    from playwright.async_api import async_playwright

    # Leading silence: the page drops audio until the session is ready.
    wav = write_wav(tmp_path / "mic.wav", speech.piper(QUESTION, lead_s=2.0, trail_s=4.0))
    shot = Path(os.environ.get("QS_SCREENSHOT_DIR", tmp_path)) / "voice-page.png"
    errors: list[str] = []
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=str(chromium), args=browser_args(wav))
        try:
            page = await browser.new_page(viewport={"width": 900, "height": 640})
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            await page.goto(f"{server.http}/")
            await page.click("#toggle")
            await page.wait_for_function(
                "window.qsStats.turns > 0 && window.qsStats.playedFrames >= 3", timeout=150_000
            )
            heard = await page.inner_text(".turn .you .text")
            reply = await page.inner_text(".turn .bot .text")
            latency = await page.inner_text(".turn .latency")
            stats = await page.evaluate("window.qsStats")
            await page.screenshot(path=str(shot), full_page=True)
            await page.wait_for_function("window.qsStats.bufferedMs === 0", timeout=60_000)
            flushed = await page.evaluate(FLUSH_CHECK)
        finally:
            await browser.close()
    assert not errors, errors
    assert word_error_rate(QUESTION, heard) <= 0.2, heard
    assert reply.strip()
    for stage in ("endpointing", "ASR", "reply", "TTS first chunk", "total"):
        assert stage in latency
    assert stats["sentFrames"] > 100 and stats["errors"] == []
    assert stats["receivedFrames"] >= stats["playedFrames"] >= 3
    assert flushed["dropped"] >= 20 and flushed["bufferedMs"] == 0, flushed
    assert shot.stat().st_size > 10_000


# Barge-in in the playback worklet, once the real reply has played: queue two seconds
# of a fake turn, cancel it, and the jitter buffer is empty at once.
FLUSH_CHECK = """async () => {
  const port = window.qsSession.playback.port;
  const before = window.qsStats.droppedFrames;
  for (let i = 0; i < 20; i++) {
    const pcm = new Int16Array(1600).fill(3000).buffer;
    port.postMessage({type: "audio", turn: 9999, pcm}, [pcm]);
  }
  port.postMessage({type: "cancel", turn: 9999});
  await new Promise((resolve) => setTimeout(resolve, 300));
  return {dropped: window.qsStats.droppedFrames - before, bufferedMs: window.qsStats.bufferedMs};
}"""
