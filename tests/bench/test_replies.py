"""``bench replies``' arithmetic and its chart (bench/replies.py, bench/svg.py); the
bench itself runs the served model, as docs/results/ records."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from bench.replies import _Reply, plot, steady_rate
from bench.svg import Panel, nice_top, panels_svg


def test_the_steady_rate_counts_only_the_window_with_every_reply_in_flight() -> None:
    replies = [
        _Reply(asked=0.0, tokens=10, ended=1.0),  # wholly inside
        _Reply(asked=1.0, tokens=20, ended=3.0),  # half inside: 10 tokens
        _Reply(asked=2.5, tokens=40, ended=4.0),  # the tail: not counted
    ]
    assert steady_rate(replies, 0.0, 2.0) == pytest.approx((10 + 10) / 2.0)
    assert steady_rate(replies, 1.0, 1.0) == 0.0


def test_nice_tops_are_one_two_or_five_times_a_power_of_ten() -> None:
    assert [nice_top(v) for v in (0.37, 1.0, 1.3, 4.2, 7, 180)] == [0.5, 1, 2, 5, 10, 200]


def test_the_chart_is_svg_with_a_line_and_a_legend_entry_per_series() -> None:
    levels = [1, 4, 8]
    row = lambda n, k: {  # noqa: E731
        "concurrent": n,
        "first_sentence_p50_s": 0.3 * n * k,
        "first_sentence_p95_s": 0.625 * n * k,  # 10 s at 8 one at a time: a nice top
        "steady_tokens_per_s": 40.0 * n / k,
    }
    results = {
        "levels": {
            "batched": [row(n, 1) for n in levels],
            "one-at-a-time": [row(n, 2) for n in levels],
        }
    }
    svg = ET.fromstring(plot(results))
    ns = "{http://www.w3.org/2000/svg}"
    lines = svg.findall(f"{ns}polyline")
    assert len(lines) == 4 + 2  # p50 and p95 of each, then tokens/s of each
    texts = [t.text for t in svg.iter(f"{ns}text")]
    assert {"batched p50", "one-at-a-time p95", "batched", "replies at once"} <= set(texts)
    # the highest p95 (one at a time at 8) is the top of its panel: y = TOP
    tops = [min(float(p.split(",")[1]) for p in line.get("points", "").split()) for line in lines]
    assert min(tops[:4]) == pytest.approx(34.0)


def test_a_panel_without_points_is_an_error() -> None:
    with pytest.raises(ValueError, match="no points"):
        panels_svg([Panel("empty", "x", "y", {"a": []})])


def test_a_p50_and_its_p95_share_a_colour_and_the_p95_is_dashed() -> None:
    series = {"a p50": [(1, 1.0)], "a p95": [(1, 2.0)], "b p50": [(1, 1.5)]}
    svg = ET.fromstring(panels_svg([Panel("t", "x", "y", series)]))
    lines = svg.findall("{http://www.w3.org/2000/svg}polyline")
    colours = [line.get("stroke") for line in lines]
    assert colours[0] == colours[1] != colours[2]
    assert [line.get("stroke-dasharray") for line in lines] == [None, "5,3", None]
