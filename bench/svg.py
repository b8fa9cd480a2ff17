"""Line charts as SVG text, for the benchmarks' ``--plot`` (no plotting library: the
figures in docs/ come from the same run as their tables)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
W, H = 420, 300  # one panel
LEFT, RIGHT, TOP, BOTTOM = 56, 16, 34, 74  # room for the ticks, title and legend


@dataclass(frozen=True)
class Panel:
    """One chart: ``series`` maps a name to its (x, y) points; "NAME p50" and
    "NAME p95" share a colour, the p95 dashed."""

    title: str
    x_label: str
    y_label: str
    series: Mapping[str, Sequence[tuple[float, float]]]


def nice_top(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at or above ``value``."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= value)


def panels_svg(panels: Sequence[Panel]) -> str:
    """The panels side by side in one SVG document."""
    body = [_panel(p, i * W) for i, p in enumerate(panels)]
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W * len(panels)}" height="{H}" '
        f'font-family="sans-serif" font-size="11">\n'
        f'<rect width="100%" height="100%" fill="white"/>\n{"".join(body)}</svg>\n'
    )


def _panel(p: Panel, x0: float) -> str:
    points = [pt for pts in p.series.values() for pt in pts]
    if not points:
        raise ValueError(f"panel {p.title!r} has no points")
    xs = sorted({x for x, _ in points})
    lo, hi = xs[0], xs[-1] if xs[-1] > xs[0] else xs[0] + 1
    top = nice_top(max(y for _, y in points))
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def at(x: float, y: float) -> tuple[float, float]:
        return x0 + LEFT + (x - lo) / (hi - lo) * pw, TOP + ph - y / top * ph

    out = [
        f'<text x="{x0 + W / 2}" y="18" text-anchor="middle" font-size="13">'
        f"{escape(p.title)}</text>\n",
        f'<rect x="{x0 + LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>\n',
    ]
    for i in range(6):  # y ticks at fifths of the top
        y = top * i / 5
        _, py = at(lo, y)
        out.append(
            f'<line x1="{x0 + LEFT}" x2="{x0 + LEFT + pw}" y1="{py:.1f}" y2="{py:.1f}" '
            f'stroke="#eee"/><text x="{x0 + LEFT - 4}" y="{py + 4:.1f}" '
            f'text-anchor="end">{y:g}</text>\n'
        )
    for x in xs:
        px, _ = at(x, 0)
        out.append(f'<text x="{px:.1f}" y="{TOP + ph + 14}" text-anchor="middle">{x:g}</text>\n')
    out.append(
        f'<text x="{x0 + LEFT + pw / 2}" y="{TOP + ph + 30}" text-anchor="middle">'
        f"{escape(p.x_label)}</text>\n"
        f'<text transform="translate({x0 + 14},{TOP + ph / 2}) rotate(-90)" '
        f'text-anchor="middle">{escape(p.y_label)}</text>\n'
    )
    bases = list(dict.fromkeys(_base(name) for name in p.series))
    for k, (name, pts) in enumerate(p.series.items()):
        colour = COLOURS[bases.index(_base(name)) % len(COLOURS)]
        dash = ' stroke-dasharray="5,3"' if name.endswith(" p95") else ""
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in (at(*pt) for pt in sorted(pts)))
        out.append(
            f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>\n'
        )
        lx, ly = x0 + LEFT + (k % 2) * pw / 2, TOP + ph + 46 + (k // 2) * 14
        out.append(
            f'<line x1="{lx}" x2="{lx + 18}" y1="{ly - 4}" y2="{ly - 4}" stroke="{colour}" '
            f'stroke-width="2"{dash}/><text x="{lx + 22}" y="{ly}">{escape(name)}</text>\n'
        )
    return "".join(out)


def _base(name: str) -> str:
    return name.removesuffix(" p50").removesuffix(" p95")
