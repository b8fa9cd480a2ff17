"""The voice page through a fleet's balancer (docs/deploy.md): the node serving it is
killed, the page reconnects to the same address, reaches the other node and resumes
the conversation there.

Real Chromium, HAProxy, redis-server and two nodes with the default models.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from audio.speech import SpeechFactory
from server.fleet import Fleet, FleetOptions
from tests.e2e.test_fleet import FACT, RECALL, needs_fleet_tools

from .conftest import browser_page
from .test_web_page import MICROPHONE, PLAYING, say

pytestmark = [pytest.mark.e2e, pytest.mark.models, pytest.mark.slow]

RESUMED = "document.querySelector('#session').textContent.includes('(resumed)')"


async def test_the_page_resumes_on_the_other_node_after_its_node_is_killed(
    tmp_path: Path, model_cache: Path, speech: SpeechFactory, chromium: Path
) -> None:
    needs_fleet_tools()
    options = FleetOptions(port=0, run_dir=tmp_path, serve_args=["--cache-dir", str(model_cache)])
    fleet = Fleet(options)
    await asyncio.to_thread(fleet.up)
    try:
        async with browser_page(chromium, PLAYING) as (page, errors):
            await page.add_init_script(MICROPHONE)
            await page.goto(fleet.page)
            await page.click("#toggle")
            await page.wait_for_function("window.qsStats.state === 'listening'")
            await say(page, speech.piper(FACT, lead_s=0.3, trail_s=1.0))
            await page.wait_for_function("window.qsStats.turns >= 1", timeout=150_000)
            [serving] = [n for n, k in (await asyncio.to_thread(fleet.serving)).items() if k]
            fleet.node_procs[serving].signal(signal.SIGKILL)
            await page.wait_for_function(
                f"{RESUMED} && window.qsStats.state === 'listening'", timeout=60_000
            )
            after_kill = await asyncio.to_thread(fleet.serving)
            await say(page, speech.piper(RECALL.text, lead_s=0.3, trail_s=1.0))
            await page.wait_for_function("window.qsStats.turns >= 2", timeout=150_000)
            replies = await page.eval_on_selector_all(
                ".turn .bot .text", "nodes => nodes.map((n) => n.textContent)"
            )
    finally:
        await asyncio.to_thread(fleet.down)
    assert not errors, errors
    assert serving not in after_kill and sum(after_kill.values()) == 1  # the other node
    RECALL.check(replies[-1])  # answered from the turn before the kill
