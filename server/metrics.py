"""Prometheus metrics of one server process (``GET /metrics``) and JSON log lines.

Each :class:`ServerMetrics` owns its registry, so two servers in one process (tests)
never share counters. Latency histograms come from the ``metrics`` event every turn
sends its client, so the numbers an operator sees are the ones a client sees.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from . import protocol as p

CONTENT_TYPE = CONTENT_TYPE_LATEST
# Seconds; a voice turn lives between 50 ms and a few seconds.
_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
# metrics-event field -> stage label
_STAGES = {
    "endpointing_ms": "endpointing",
    "asr_ms": "asr",
    "reply_first_sentence_ms": "reply_first_sentence",
    "reply_ms": "reply",
    "tts_first_chunk_ms": "tts_first_chunk",
    "first_audio_ms": "first_audio",
}


class ServerMetrics:
    def __init__(
        self,
        sessions: Callable[[], int],
        resumable: Callable[[], int],
        queued: Callable[[], dict[str, int]],
        handshakes: Callable[[], int] = lambda: 0,
        store_up: Callable[[], bool] = lambda: True,
    ) -> None:
        """``handshakes``: connections accepted whose opening handshake is not answered
        yet (refused ones count in ``rejected``, reasons ``handshakes*``)."""
        self.registry = CollectorRegistry()
        r = self.registry
        Gauge(
            "quicksilver_handshakes_in_flight", "Connections not answered yet", registry=r
        ).set_function(lambda: float(handshakes()))
        Gauge(
            "quicksilver_store_up", "The shared store (Redis) answers; 1 without one", registry=r
        ).set_function(lambda: float(store_up()))
        Gauge("quicksilver_sessions", "Open voice sessions", registry=r).set_function(
            lambda: float(sessions())
        )
        Gauge("quicksilver_resumable_sessions", "Parked conversations", registry=r).set_function(
            lambda: float(resumable())
        )
        depth = Gauge(
            "quicksilver_worker_queue_depth", "Jobs waiting or running", ["worker"], registry=r
        )
        for name in queued():
            depth.labels(name).set_function(functools.partial(_pick, queued, name))
        self.turns = Counter("quicksilver_turns", "Turns that ended", ["outcome"], registry=r)
        self.stage = Histogram(
            "quicksilver_stage_seconds",
            "Per-turn latency by stage (the metrics event)",
            ["stage"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.errors = Counter(
            "quicksilver_errors", "Error events sent, by code", ["code"], registry=r
        )
        self.rejected = Counter(
            "quicksilver_rejected_connections",
            "Connections refused, by reason",
            ["reason"],
            registry=r,
        )
        self.closes = Counter(
            "quicksilver_closes",
            "Sessions closed by the server, by close code",
            ["code"],
            registry=r,
        )

    def sent(self, message: p.ServerMessage) -> None:
        """Count what a session sends: errors, turn outcomes, stage latencies."""
        match message:
            case p.Error(code=code):
                self.errors.labels(code).inc()
            case p.ReplyDone():
                self.turns.labels("done").inc()
            case p.ReplyCancelled():
                self.turns.labels("cancelled").inc()
            case p.Metrics():
                for name, stage in _STAGES.items():
                    value = getattr(message, name)
                    if value is not None:
                        self.stage.labels(stage).observe(value / 1000)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def _pick(values: Callable[[], dict[str, int]], name: str) -> float:
    return float(values()[name])


class JsonFormatter(logging.Formatter):
    """One JSON object a line (``--log-format json``), for log shippers."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:  # formatted already (and redacted: server/auth.py)
            entry["exception"] = record.exc_text
        return json.dumps(entry)
