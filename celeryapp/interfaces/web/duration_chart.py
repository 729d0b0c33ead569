"""A schedule's latest run durations as a small inline SVG bar chart (no script, no library):
oldest left, the latest window's bars darker than the window before, its p50 and p95 as lines.
Each bar says its run and duration in a ``<title>`` (a tooltip); the chart is one image to
assistive technology, its ``aria-label`` the figures. The bars are not links: links inside an
image are hidden from screen readers (axe-core's nested-interactive), and the runs-by-steps grid
below links every run."""

from __future__ import annotations

from tornado.escape import xhtml_escape

from celeryapp.domain.durations import TREND_RUNS
from celeryapp.domain.times import span
from celeryapp.interfaces.web.duration_trends import TREND_READ, ScheduleDurations

WIDTH = 400
HEIGHT = 80
#: Of each bar's slot, the bar (the rest is the gap to the next).
BAR_SHARE = 0.75


def summary(durations: ScheduleDurations) -> str:
    """``p50 40 s, p95 52 s over the latest 20 completed runs; the 20 before: p50 38 s``."""
    t = durations.trend
    if t.p50 is None:
        return "no completed runs yet"
    words = f"p50 {span(t.p50)}, p95 {span(t.p95)} over the latest {t.runs} completed run{'s' if t.runs != 1 else ''}"
    if t.previous_p50 is not None:
        words += f"; the {TREND_RUNS} before: p50 {span(t.previous_p50)}"
        if t.slower:
            words += " (getting slower)"
    return words


def scale(durations: ScheduleDurations) -> str:
    """What the chart's height means: ``tallest bar 1 min 40 s (#40)``; empty without runs."""
    if not durations.runs:
        return ""
    tallest = max(durations.runs, key=lambda r: (r.seconds, r.id))
    return f"tallest bar {span(tallest.seconds)} (#{tallest.id})"


def chart(durations: ScheduleDurations) -> str:
    """The SVG markup (escaped here: templates insert it raw); empty without runs."""
    runs = durations.runs[::-1]  # oldest first, left to right
    if not runs:
        return ""
    top = max(r.seconds for r in runs) or 1.0
    slot = WIDTH / TREND_READ
    recent_from = len(runs) - min(len(runs), TREND_RUNS)
    parts = [
        f'<svg class="durations" id="duration-chart" viewBox="0 0 {WIDTH} {HEIGHT}" preserveAspectRatio="none" '
        f'role="img" aria-label="Run durations: {xhtml_escape(summary(durations))}">'
    ]
    offset = (TREND_READ - len(runs)) * slot  # fewer runs than the chart holds: right-aligned
    for i, r in enumerate(runs):
        height = max(1.0, r.seconds / top * (HEIGHT - 2))
        kind = "recent" if i >= recent_from else "earlier"
        title = f"#{r.id}: {span(r.seconds)}"
        parts.append(
            f'<rect class="bar {kind}" data-run="{r.id}" x="{offset + i * slot:.1f}" '
            f'y="{HEIGHT - height:.1f}" width="{slot * BAR_SHARE:.1f}" height="{height:.1f}">'
            f"<title>{xhtml_escape(title)}</title></rect>"
        )
    t = durations.trend
    left = offset + recent_from * slot
    for name, value in (("p50", t.p50), ("p95", t.p95)):
        if value is not None:
            y = HEIGHT - max(1.0, value / top * (HEIGHT - 2))
            parts.append(
                f'<line class="{name}" x1="{left:.1f}" x2="{WIDTH}" y1="{y:.1f}" y2="{y:.1f}" '
                f'vector-effect="non-scaling-stroke"><title>{name} {xhtml_escape(span(value))}</title></line>'
            )
    parts.append("</svg>")
    return "".join(parts)
