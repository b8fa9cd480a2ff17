"""How long a barge-in waits when the reply it cancels is queued behind another's.

    python -m bench.cancel [--rounds 5] [--engine diffusion-onnx]

Two sessions share the process's one reply thread. Session A asks for a long reply;
while A's reply is being written, session B's reply waits in the queue, and B's user
cuts in. The figure is the time from B's cancel until B's turn has stopped: what B's
receive loop waits (it reads no audio meanwhile). The real reply engine, built as the
server builds it; A's reply time is printed beside it for scale.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import get_args

from model.assemble import EngineName, load_generator
from model.engine import ChatMessage, ThreadedReplyEngine

LONG = [ChatMessage("user", "Can you tell me a long story about a dragon and a knight?")]
SHORT = [ChatMessage("user", "What is the capital of France?")]


async def one_round(engine: ThreadedReplyEngine, budget: int) -> tuple[float, float]:
    """(B's cancel wait, A's whole reply), in seconds."""
    t0 = time.perf_counter()
    first = asyncio.Event()

    async def session_a() -> float:
        async for _ in engine.stream(LONG, budget):
            first.set()
        return time.perf_counter() - t0

    async def session_b() -> None:
        async for _ in engine.stream(SHORT, budget):
            pass

    a = asyncio.create_task(session_a())
    await first.wait()  # A holds the reply thread
    b = asyncio.create_task(session_b())
    await asyncio.sleep(0.05)  # B's job is queued behind A's
    t_cancel = time.perf_counter()
    b.cancel()
    await asyncio.gather(b, return_exceptions=True)
    wait = time.perf_counter() - t_cancel
    return wait, await a


async def run(engine_name: EngineName, rounds: int, budget: int) -> dict[str, object]:
    generator = load_generator(engine_name)
    waits, replies = [], []
    with ThreadPoolExecutor(1, thread_name_prefix="reply") as pool:
        engine = ThreadedReplyEngine(generator, pool)
        for _ in range(rounds):
            wait, reply = await one_round(engine, budget)
            waits.append(wait)
            replies.append(reply)
    return {
        "engine": engine_name,
        "rounds": rounds,
        "cancel_wait_ms_p50": round(statistics.median(waits) * 1000, 1),
        "cancel_wait_ms_max": round(max(waits) * 1000, 1),
        "other_reply_s_p50": round(statistics.median(replies), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default="diffusion-onnx", choices=get_args(EngineName))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget", type=int, default=64, help="reply tokens")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args.engine, args.rounds, args.budget)), indent=2))


if __name__ == "__main__":
    main()
