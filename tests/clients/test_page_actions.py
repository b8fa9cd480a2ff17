"""The demo page shows the assistant's actions as cards and answers them, in headless
Chromium. The actions come from a scripted peer (tests/clients/scripted.py) through the
page's own WebSocket and message handler; the page's files are the real ones. The
page's clock is Playwright's (``page.clock``): the test moves it, so a countdown shows
exactly the time the test let pass."""

from __future__ import annotations

import datetime
import os
from pathlib import Path

from server import protocol as p

from .conftest import browser_page
from .scripted import ScriptedServer, scripted_server

ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
    "--autoplay-policy=no-user-gesture-required",
]


async def turn(peer: ScriptedServer, turn_id: int, said: str, action: p.Action, reply: str) -> None:
    """A turn as the server sends it: the action goes before the spoken confirmation."""
    metrics = p.Metrics(
        turn_id, 410.0, 380.0, 520.0, 610.0, 240.0, 1290.0, action=action.name, action_passes=4
    )
    await peer.send(
        p.TranscriptFinal(turn_id, said),
        action,
        p.ReplyText(turn_id, 0, reply),
        p.ReplyDone(turn_id, reply),
        metrics,
    )


def card(call_id: str) -> str:
    return f'.action[data-call="{call_id}"]'


async def test_the_page_shows_actions_as_cards_and_answers_them(
    chromium: Path, tmp_path: Path
) -> None:
    shots = Path(os.environ.get("QS_SCREENSHOT_DIR", tmp_path))
    t0 = datetime.datetime(2026, 12, 2, 8, 0, 0, tzinfo=datetime.UTC)
    view = {"viewport": {"width": 900, "height": 760}, "locale": "en-GB", "timezone_id": "UTC"}
    async with (
        scripted_server() as peer,
        browser_page(chromium, ARGS, **view) as (page, errors),
    ):
        await page.clock.install(time=t0)
        await page.goto(f"{peer.http}/")
        await page.click("#toggle")
        start = await peer.next(p.Start)
        assert start.client == "web" and start.tools is None  # the default device tools
        await page.wait_for_function("window.qsStats.state === 'listening'")
        assert (await page.inner_text("#session")).endswith("· 12 tools")
        await page.clock.pause_at(t0 + datetime.timedelta(minutes=10))  # 08:10:00 from now on

        timer = p.Action(1, "call_t1", "timer.set", {"seconds": 2})
        await turn(peer, 1, "Set a timer for two seconds.", timer, "Timer set for two seconds.")
        assert await peer.next(p.ActionResult) == p.ActionResult(
            "call_t1", "Timer set for 2 seconds."
        )
        first = page.locator(f'.turn[data-turn="1"] {card("call_t1")}')
        assert await first.locator(".action-name").inner_text() == "timer.set"
        assert await first.locator(".action-args").inner_text() == "seconds: 2"
        countdown, note = first.locator(".action-countdown"), first.locator(".action-note")
        assert (await countdown.inner_text(), await note.inner_text()) == (
            "0:02",
            "ends at 08:10:02",
        )
        await page.clock.run_for(1000)
        assert await countdown.inner_text() == "0:01"
        assert await first.get_attribute("data-state") == "running"
        await page.clock.run_for(1000)
        assert await first.get_attribute("data-state") == "rang"
        assert await countdown.inner_text() == "0:00"
        assert await note.inner_text() == "done: rang at 08:10:02, after 2 seconds"
        latency = await page.inner_text('.turn[data-turn="1"] .latency')
        assert "The call to timer.set took 4 passes." in latency

        lights = p.Action(2, "call_l2", "lights.set", {"on": True})
        await turn(peer, 2, "Turn on the lights.", lights, "The lights are on.")
        assert await peer.next(p.ActionResult) == p.ActionResult("call_l2", "done")
        second = page.locator(f'.turn[data-turn="2"] {card("call_l2")}')
        assert await second.locator(".action-args").inner_text() == "on: true"
        assert await second.locator(".action-note").inner_text() == "done"
        assert await second.locator(".action-countdown").is_hidden()

        long = p.Action(3, "call_t3", "timer.set", {"seconds": 300})
        await turn(peer, 3, "Set a timer for five minutes.", long, "Timer set for five minutes.")
        assert (await peer.next(p.ActionResult)).output == "Timer set for 5 minutes."
        third = page.locator(f'.turn[data-turn="3"] {card("call_t3")}')
        await page.clock.run_for(10_000)
        assert await third.locator(".action-countdown").inner_text() == "4:50"
        assert await third.locator(".action-note").inner_text() == "ends at 08:15:02"
        assert await third.locator(".action-result").inner_text() == (
            "answered: Timer set for 5 minutes."
        )
        await page.screenshot(path=str(shots / "page-actions.png"), full_page=True)

        cancel = p.Action(4, "call_c4", "timer.cancel", {})
        await turn(peer, 4, "Cancel the timer.", cancel, "The timer is cancelled.")
        cancelled = await peer.next(p.ActionResult)
        assert cancelled.output == "Timer cancelled with 4 minutes 50 seconds left."
        assert await third.get_attribute("data-state") == "stopped"
        assert await third.locator(".action-note").inner_text() == "cancelled with 4:50 left"
        assert await page.locator(card("call_c4")).locator(".action-note").inner_text() == (
            "cancelled the timer with 4:50 left"
        )
        await page.clock.run_for(300_000)  # it never rings
        stats = await page.evaluate("window.qsStats")
        await page.screenshot(path=str(shots / "page-actions-cancelled.png"), full_page=True)
    assert not errors, errors
    assert stats["timersRung"] == 1 and stats["errors"] == []
    assert [a["call_id"] for a in stats["actions"]] == ["call_t1", "call_l2", "call_t3", "call_c4"]
