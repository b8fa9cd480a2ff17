"""Concurrency check: many connected sessions, a few talking at once.

    python -m clients.loadtest --url ws://127.0.0.1:8765/v1/voice --wav q1.wav [q2.wav ...] \\
        --sessions 50 --talkers 4 --turns 2 [--json out.json]

Every session starts and streams silence at real time (a worn device that is on but
quiet); ``--talkers`` of them speak the WAVs in turn, all at the same moment, and wait
for each reply. Prints, per round, the end of speech to first audio times and, at the
end, whether every turn completed and the server's event-loop lag (``GET /stats``).
Built on the latency harness's simulated clients (:mod:`clients.harness`), which
measure latency percentiles rather than capacity.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from dataclasses import asdict
from pathlib import Path

from server import protocol as p

from .harness import TurnRecord, Utterance, connect_talker, fetch_stats, run_turn


async def run(
    url: str, wavs: list[Path], sessions: int, talkers: int, turns: int, timeout_s: float
) -> dict[str, object]:
    utterances = [Utterance.load(w) for w in wavs]
    rate = utterances[0].pcm.rate
    if any(u.pcm.rate != rate for u in utterances):
        raise ValueError("all WAVs must have the same sample rate")
    clients = [await connect_talker(url, i, rate, "loadtest") for i in range(sessions)]
    records: list[TurnRecord] = []
    try:
        print(f"{sessions} sessions connected; {talkers} talking", file=sys.stderr)
        for k in range(turns):
            u = utterances[k % len(utterances)]
            batch = [
                run_turn(c, TurnRecord(c.index, k + 1, u.name), u, timeout_s)
                for c in clients[:talkers]
            ]
            done = [r for rs in await asyncio.gather(*batch) for r in rs]
            records += done
            firsts = [r.first_audio_ms for r in done]
            print(
                f"round {k + 1}/{turns}: end of speech -> first audio ms {firsts}", file=sys.stderr
            )
        stats = await asyncio.to_thread(fetch_stats, url)
    finally:
        await asyncio.gather(*(c.close() for c in clients))
    return summarize(records, stats, sessions, talkers)


def summarize(
    records: list[TurnRecord], stats: dict[str, object], sessions: int, talkers: int
) -> dict[str, object]:
    ok = [r for r in records if r.error is None and r.server]
    summary: dict[str, object] = {
        "sessions": sessions,
        "talkers": talkers,
        "turns": len(records),
        "completed": len(ok),
        "loop_lag": stats.get("loop_lag"),
    }
    for key in ("first_audio_ms", "endpointing_ms", "asr_ms", "reply_ms", "tts_first_chunk_ms"):
        values = [float(v) for r in ok if isinstance(v := (r.server or {}).get(key), int | float)]
        if values:
            summary[f"{key}_median"] = round(statistics.median(values), 1)
    return {"summary": summary, "turns": [asdict(r) for r in records]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m clients.loadtest", description=__doc__)
    parser.add_argument("--url", default=f"ws://127.0.0.1:8765{p.PATH}")
    parser.add_argument("--wav", type=Path, nargs="+", required=True)
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--talkers", type=int, default=4)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per turn")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if not 0 < args.talkers <= args.sessions:
        parser.error("need 0 < --talkers <= --sessions")
    report = asyncio.run(
        run(args.url, args.wav, args.sessions, args.talkers, args.turns, args.timeout)
    )
    print(json.dumps(report["summary"], indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    summary = report["summary"]
    assert isinstance(summary, dict)
    return 0 if summary["completed"] == summary["turns"] else 1


if __name__ == "__main__":
    sys.exit(main())
