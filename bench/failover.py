"""Failover benchmark: nodes killed under talking sessions (docs/deploy.md, "Failover").

    python -m bench.failover --sessions 10 --kills 20 [--json report.json]

Starts a fleet on free loopback ports (Redis, ``--nodes`` nodes, HAProxy:
:class:`server.fleet.Fleet`), connects ``--sessions`` car clients through the balancer
and has each ask one spoken question after another. Every ``--interval`` seconds
(after the killed node is back and seen up by the balancer) it kills, with SIGKILL, the
node that serves the most sessions, then starts it again. It reports:

- **drop to ready**: for each session of a killed node, seconds from the SIGKILL to
  the ``ready`` of its resumed session on another node (reconnection with backoff,
  the balancer's retry, the resume from Redis);
- **turns lost**: completed turns (the client saw ``reply_done`` and ``metrics``)
  missing from the resumed conversation (``ready.history``), and resumes refused;
- **load spread**: the sessions each node held when a kill came, and the sessions
  the balancer sent to each node (HAProxy's ``stot``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import signal
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from audio.resample import float32_to_int16
from audio.speech import SpeechFactory
from clients.car import Car, CarOptions
from clients.common import ClientError, Pcm
from server import protocol as p
from server.fleet import Fleet, FleetOptions

QUESTIONS = (
    "What is the capital of Italy?",
    "What is the capital of Australia?",
    "What is the capital of Japan?",
    "How many legs does a spider have?",
)
# A conversation keeps its last 40 messages; a talker starts a new one before that, so
# ready.history counts every completed turn.
TURNS_PER_CONVERSATION = 15


@dataclass
class Failover:
    """What one kill did to one session."""

    kill: int
    drop_to_ready_s: float
    completed: int  # turns the client saw complete before the drop
    restored: int  # completed turns in the resumed conversation (history // 2)
    refused: bool  # the resume was refused: a new conversation


@dataclass
class Report:
    sessions: int
    kills: int
    nodes: int
    failovers: list[Failover] = field(default_factory=list)
    turns_completed: int = 0
    turns_failed: int = 0
    held_at_kill: list[dict[str, int]] = field(default_factory=list)
    sent_per_node: dict[str, int] = field(default_factory=dict)

    def summary(self) -> dict[str, object]:
        times = sorted(f.drop_to_ready_s for f in self.failovers)
        lost = sum(max(0, f.completed - f.restored) for f in self.failovers)
        return {
            "kills": self.kills,
            "sessions": self.sessions,
            "failovers": len(self.failovers),
            "drop_to_ready_p50_s": round(statistics.median(times), 2) if times else None,
            "drop_to_ready_p95_s": round(_quantile(times, 0.95), 2) if times else None,
            "drop_to_ready_max_s": round(times[-1], 2) if times else None,
            "completed_turns_lost": lost,
            "resumes_refused": sum(f.refused for f in self.failovers),
            "turns_completed": self.turns_completed,
            "turns_failed": self.turns_failed,
            "held_at_kill": self.held_at_kill,
            "sent_per_node": self.sent_per_node,
        }


def _quantile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank quantile: with few failovers, a value that happened."""
    rank = max(0, math.ceil(q * len(sorted_values)) - 1)
    return sorted_values[rank]


class Talker:
    """One car asking question after question; records its drops and resumes."""

    def __init__(self, url: str, questions: list[Pcm], clock: Kills, report: Report) -> None:
        self.url, self.questions, self.clock, self.report = url, questions, clock, report
        self.completed = 0  # turns of the current conversation
        self.dropped = False

    def on_frame(self, message: p.ServerMessage | None, _raw: str | bytes) -> None:
        if not isinstance(message, p.Ready) or not self.dropped:
            return
        self.dropped = False
        refused = not message.resumed
        self.report.failovers.append(
            Failover(
                self.clock.count,
                time.monotonic() - self.clock.last,
                self.completed,
                message.history // 2,
                refused,
            )
        )
        if refused:
            self.completed = 0

    async def run(self, stop: asyncio.Event, offset: int) -> None:
        while not stop.is_set():
            options = CarOptions(self.url, turn_timeout_s=600, retries=12, tools=[])
            car = _Car(options, self)
            self.completed = 0
            try:
                async with car:
                    while self.completed < TURNS_PER_CONVERSATION and not stop.is_set():
                        question = self.questions[(offset + self.completed) % len(self.questions)]
                        await car.ask(question)
                        self.completed += 1
                        self.report.turns_completed += 1
            except ClientError as exc:
                self.report.turns_failed += 1
                print(f"failover: a session gave up: {exc}", file=sys.stderr, flush=True)
                await asyncio.sleep(1)  # then a new conversation


class _Car(Car):
    """The car client, telling its talker when a drop starts a reconnection."""

    def __init__(self, options: CarOptions, talker: Talker) -> None:
        super().__init__(options, on_frame=talker.on_frame)
        self.talker = talker

    async def reconnect(self) -> p.Ready:
        self.talker.dropped = True
        return await super().reconnect()


@dataclass
class Kills:
    count: int = 0
    last: float = 0.0  # time.monotonic() of the last SIGKILL


async def run(args: argparse.Namespace) -> Report:
    speech = SpeechFactory()
    questions = [Pcm(float32_to_int16(speech.piper(q, lead_s=0.2)), 16000) for q in QUESTIONS]
    serve_args = ["--cache-dir", str(args.cache_dir)] if args.cache_dir else []
    fleet = Fleet(FleetOptions(nodes=args.nodes, port=0, serve_args=serve_args))
    report = Report(args.sessions, 0, args.nodes)
    await asyncio.to_thread(fleet.up)
    print(f"failover: fleet up ({fleet.run_dir})", file=sys.stderr, flush=True)
    kills, stop = Kills(), asyncio.Event()
    talkers = [Talker(fleet.url, questions, kills, report) for _ in range(args.sessions)]
    tasks = [asyncio.create_task(t.run(stop, i)) for i, t in enumerate(talkers)]
    try:
        for k in range(1, args.kills + 1):
            await asyncio.sleep(args.interval)
            held = await asyncio.to_thread(fleet.serving)
            victim = max(held, key=lambda n: held[n])
            report.held_at_kill.append(held)
            kills.count, kills.last = k, time.monotonic()
            fleet.node_procs[victim].signal(signal.SIGKILL)
            report.kills = k
            print(f"failover: kill {k}: {victim} (sessions {held})", file=sys.stderr, flush=True)
            await asyncio.to_thread(fleet.node_procs[victim].wait, 30)
            await asyncio.to_thread(fleet.start_node, victim)
            await asyncio.to_thread(_wait_up, fleet)
        await asyncio.sleep(args.interval)
    finally:
        stop.set()
        report.sent_per_node = _sent(fleet)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.to_thread(fleet.down)
    return report


def _wait_up(fleet: Fleet, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while set(fleet.server_states().values()) != {"UP"}:
        if time.monotonic() > deadline:
            raise RuntimeError("the restarted node did not come back up")
        time.sleep(0.2)


def _sent(fleet: Fleet) -> dict[str, int]:
    names = {n.name for n in fleet.nodes}
    try:
        return {r["svname"]: int(r["stot"]) for r in fleet.balancer_stats() if r["svname"] in names}
    except OSError:
        return {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.failover", description=__doc__)
    parser.add_argument("--sessions", type=int, default=10, help="talking sessions")
    parser.add_argument("--kills", type=int, default=20, help="nodes killed, one at a time")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument(
        "--interval", type=float, default=20.0, help="seconds of talk before each kill"
    )
    parser.add_argument("--cache-dir", type=Path, default=None, help="the nodes' --cache-dir")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    args = parser.parse_args(argv)
    report = asyncio.run(run(args))
    summary = report.summary()
    print(json.dumps(summary, indent=2))
    if args.json is not None:
        data = {"summary": summary, "failovers": [asdict(f) for f in report.failovers]}
        args.json.write_text(json.dumps(data, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
