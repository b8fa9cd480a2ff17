"""The failover benchmark's report (the benchmark itself runs a fleet: python -m
bench.failover; docs/deploy.md has its figures)."""

from __future__ import annotations

from bench.failover import Failover, Report


def test_lost_turns_count_completed_turns_missing_from_the_resumed_history() -> None:
    report = Report(sessions=3, kills=2, nodes=2)
    report.failovers = [
        Failover(kill=1, drop_to_ready_s=0.5, completed=3, restored=3, refused=False),
        Failover(kill=1, drop_to_ready_s=1.5, completed=2, restored=1, refused=False),
        Failover(kill=2, drop_to_ready_s=0.7, completed=4, restored=0, refused=True),
    ]
    summary = report.summary()
    assert summary["completed_turns_lost"] == 1 + 4
    assert summary["resumes_refused"] == 1
    assert summary["drop_to_ready_p50_s"] == 0.7
    assert summary["drop_to_ready_p95_s"] == 1.5  # nearest rank: a time that happened
    assert summary["drop_to_ready_max_s"] == 1.5


def test_no_failover_no_figures() -> None:
    summary = Report(sessions=1, kills=0, nodes=2).summary()
    assert summary["drop_to_ready_p50_s"] is None and summary["completed_turns_lost"] == 0
