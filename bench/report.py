"""Results as tables: the terminal (80 columns), ``bench/results/latest.md``, README's performance table.

python -m bench.report            # print the table of bench/results/latest.json
python -m bench.report --readme   # rewrite README.md between <!-- bench:start --> and <!-- bench:end -->
python -m bench.report --markdown # rewrite bench/results/latest.md from it
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
LATEST_JSON = RESULTS / "latest.json"
#: The on-demand scale scenario's results (``bench.run --only scale``), shown below the main table.
SCALE_JSON = RESULTS / "scale.json"
LATEST_MD = RESULTS / "latest.md"
README = Path(__file__).resolve().parent.parent / "README.md"
START, END = "<!-- bench:start -->", "<!-- bench:end -->"

#: Default heartbeat TTL + recovery interval + 1 s (celeryapp/config.py).
REQUEUE_LIMIT_S = 15 + 10 + 1
FAILOVER_LIMIT_S = 40

Results = dict[str, Any]


@dataclass(frozen=True)
class Row:
    """A line of the results table: chordbeat's figure and, where there is one, raw Celery's."""

    label: str
    key: str
    part: str | None = None
    unit: str = ""


ROWS = (
    Row("advance p50, 20 groups x 4", "advance_ms", "p50", "ms"),
    Row("advance p95", "advance_ms", "p95", "ms"),
    Row("steps/s, 100 x 5 groups x 2", "steps_per_s"),
    Row("advance under that load, p50", "loaded_advance_ms", "p50", "ms"),
    Row("advance under that load, p95", "loaded_advance_ms", "p95", "ms"),
    Row("fire lateness p50, staggered", "fire_lateness_ms", "p50", "ms"),
    Row("fire lateness p99, staggered", "fire_lateness_ms", "p99", "ms"),
    Row("staggered slots that ran", "staggered_fired_pct", None, "%"),
    Row("beat CPU, staggered", "beat_cpu_pct", None, "%"),
    Row("all due at once, processed", "burst_fire_s", None, "s"),
    Row("slots due at once that ran", "burst_fired_pct", None, "%"),
    Row("requeue after worker SIGKILL", "requeue_s", None, "s"),
    Row("failover after beat SIGKILL", "failover_s", None, "s"),
    Row("worker RSS (prefork -c 2)", "worker_rss_mib", None, "MiB"),
    Row("worker PSS (prefork -c 2)", "worker_pss_mib", None, "MiB"),
    Row("database statements per step", "db_statements_per_step"),
    Row("database round trips per step", "db_round_trips_per_step"),
    Row("CPU per step: worker, pool, beat", "cpu_ms_per_step", "worker", "ms"),
    Row("CPU per step: PostgreSQL", "cpu_ms_per_step", "database", "ms"),
    Row("CPU per step: Redis", "cpu_ms_per_step", "redis", "ms"),
    Row("CPU per step: all of them", "cpu_ms_per_step", "all", "ms"),
    Row("Redis commands per step", "redis_commands_per_step"),
    Row("Redis bytes kept per step", "redis_bytes_per_step", None, "B"),
    Row("Redis bytes per schedule", "redis_bytes_per_schedule", None, "B"),
    Row("history: runs kept", "history_executions"),
    Row("history: slot records kept", "history_slots"),
    Row("history: dashboard page p50", "history_page_ms", "p50", "ms"),
    Row("history: dashboard page p95", "history_page_ms", "p95", "ms"),
    Row("history: Runs and trend pages p95", "history_runs_page_ms", "p95", "ms"),
    Row("history: list_executions p95", "history_list_ms", "first_p95", "ms"),
    Row("history: deep page p95", "history_list_ms", "deep_p95", "ms"),
    Row("history: housekeeping, a day", "housekeeping_pass_s", None, "s"),
    Row("history: fire lateness p99 then", "housekeeping_fire_lateness_ms", "p99", "ms"),
    Row("history: versions kept", "versions_rows"),
    Row("history: a changing apply p50", "versions_apply_ms", "p50", "ms"),
    Row("history: statements of that apply", "versions_apply_statements"),
    Row("history: diff of versions 1 and 50 p95", "versions_diff_versions_ms", "p95", "ms"),
    Row("history: version pages p95", "versions_page_ms", "p95", "ms"),
    Row("history: housekeeping over versions", "versions_housekeeping_s", None, "s"),
    Row("alert: failed run → receiver", "alert_failed_s", None, "s"),
    Row("alert: finish deadline → receiver", "alert_late_s", None, "s"),
    Row("alert: run's end → resolved", "alert_resolved_s", None, "s"),
    Row("alert: receiver back → delivered", "alert_after_outage_s", None, "s"),
    Row("backfill 1,000 slots, PostgreSQL", "backfill_postgresql_s", None, "s"),
    Row("backfill statements/slot, PostgreSQL", "backfill_postgresql_statements_per_slot"),
    Row("backfill 1,000 slots, SQLite", "backfill_sqlite_s", None, "s"),
    Row("backfill statements/slot, SQLite", "backfill_sqlite_statements_per_slot"),
    Row("limit: release → next start p50", "limit_admit_ms", "p50", "ms"),
    Row("limit: release → next start p99", "limit_admit_ms", "p99", "ms"),
    Row("limit: cycles/s, 10,000 keys held", "limit_cycles_per_s"),
    Row("limit: unrelated start, idle", "limit_unrelated_start_ms", "idle", "ms"),
    Row("limit: unrelated start, saturated", "limit_unrelated_start_ms", "saturated", "ms"),
    Row("limit: saturated / idle start", "limit_unrelated_start_ratio", None, "x"),
    Row("durable PostgreSQL via PgBouncer: steps/s", "durable_steps_per_s"),
    Row("durable: CPU per step, worker", "durable_cpu_ms_per_step", "worker", "ms"),
    Row("durable: CPU per step, PostgreSQL", "durable_cpu_ms_per_step", "database", "ms"),
    Row("durable: CPU per step, all", "durable_cpu_ms_per_step", "all", "ms"),
    Row("scale: schedules", "scale_schedules"),
    Row("scale: apply the file", "scale_apply_s", None, "s"),
    Row("scale: Redis bytes per schedule", "scale_redis_bytes_per_schedule", None, "B"),
    Row("scale: fire lateness p50, staggered", "scale_fire_lateness_ms", "p50", "ms"),
    Row("scale: fire lateness p99, staggered", "scale_fire_lateness_ms", "p99", "ms"),
    Row("scale: staggered slots that ran", "scale_fired_pct", None, "%"),
    Row("scale: beat CPU, staggered", "scale_beat_cpu_pct", None, "%"),
    Row("scale: beat restart", "scale_beat_restart_s", None, "s"),
    Row("scale: daily 00:00, all runs started", "scale_burst_start_s", None, "s"),
    Row("scale: daily 00:00, slots that ran", "scale_burst_fired_pct", None, "%"),
    Row("scale: daily 00:00, steps done by then", "scale_burst_steps_done_s", None, "s"),
    Row("scale: daily 00:00, share of steps done", "scale_burst_steps_done_pct", None, "%"),
    Row("scale: database bytes a day, daily", "scale_daily_db_bytes_per_day", None, "B"),
    Row("scale: database bytes a day, staggered", "scale_staggered_db_bytes_per_day", None, "B"),
)


@dataclass(frozen=True)
class Target:
    figure: str
    target: str
    measured: Callable[[Results], float]
    limit: Callable[[Results], float]
    #: True when the measured figure must stay at or below the limit, False for at or above.
    at_most: bool = True


def _get(key: str, part: str | None = None) -> Callable[[Results], float]:
    return lambda r: float(r[key][part] if part else r[key])


def _times(factor: float, key: str, part: str | None = None) -> Callable[[Results], float]:
    return lambda r: factor * _get(key, part)(r)


TARGETS = (
    Target("advance p50", "≤ 1.0x raw", _get("advance_ms", "p50"), _times(1.0, "raw_advance_ms", "p50")),
    Target("advance p95", "≤ 1.5x raw", _get("advance_ms", "p95"), _times(1.5, "raw_advance_ms", "p95")),
    Target(
        "loaded advance p50",
        "≤ 0.05x raw",
        _get("loaded_advance_ms", "p50"),
        _times(0.05, "raw_loaded_advance_ms", "p50"),
    ),
    Target("steps/s under load", "≥ 0.9x raw", _get("steps_per_s"), _times(0.9, "raw_steps_per_s"), at_most=False),
    Target("steps/s (issue 23)", "≥ 0.6x raw", _get("steps_per_s"), _times(0.6, "raw_steps_per_s"), at_most=False),
    Target(
        "worker CPU a step",
        "≤ 1.5x raw",
        _get("cpu_ms_per_step", "worker"),
        _times(1.5, "raw_cpu_ms_per_step", "worker"),
    ),
    Target("fire lateness p99", "≤ 1 s", _get("fire_lateness_ms", "p99"), lambda _: 1000.0),
    Target("beat CPU, staggered", "≤ 1.5x raw RedBeat", _get("beat_cpu_pct"), _times(1.5, "raw_beat_cpu_pct")),
    Target("all due at once", "≤ 1.5x raw RedBeat", _get("burst_fire_s"), _times(1.5, "raw_burst_fire_s")),
    Target("slots run, burst", "all (100 %)", _get("burst_fired_pct"), lambda _: 100.0, at_most=False),
    Target("slots run, stagger", "all (100 %)", _get("staggered_fired_pct"), lambda _: 100.0, at_most=False),
    Target("requeue", f"≤ TTL + interval + 1 s ({REQUEUE_LIMIT_S} s)", _get("requeue_s"), lambda _: REQUEUE_LIMIT_S),
    Target("failover", f"≤ {FAILOVER_LIMIT_S} s", _get("failover_s"), lambda _: FAILOVER_LIMIT_S),
    Target("worker RSS", "≤ 1.2x raw", _get("worker_rss_mib"), _times(1.2, "raw_worker_rss_mib")),
    Target("worker PSS", "≤ 1.2x raw", _get("worker_pss_mib"), _times(1.2, "raw_worker_pss_mib")),
    Target("history pages p95", "≤ 200 ms", _get("history_page_ms", "p95"), lambda _: 200.0),
    Target("history Runs/trend p95", "≤ 200 ms", _get("history_runs_page_ms", "p95"), lambda _: 200.0),
    Target("history list p95", "≤ 200 ms", _get("history_list_ms", "first_p95"), lambda _: 200.0),
    Target("history deep page", "≤ 200 ms", _get("history_list_ms", "deep_p95"), lambda _: 200.0),
    Target("housekeeping pass", "≤ 60 s", _get("housekeeping_pass_s"), lambda _: 60.0),
    Target("lateness in a pass", "p99 ≤ 1 s", _get("housekeeping_fire_lateness_ms", "p99"), lambda _: 1000.0),
    Target("limit admit p99", "≤ 50 ms (issue 39)", _get("limit_admit_ms", "p99"), lambda _: 50.0),
    Target("limit cycles/s", "≥ 1,000 (issue 39)", _get("limit_cycles_per_s"), lambda _: 1000.0, at_most=False),
    Target("start, limit full", "≤ 1.1x idle (issue 39)", _get("limit_unrelated_start_ratio"), lambda _: 1.1),
    Target("scale lateness p99", "≤ 1 s (issue 41)", _get("scale_fire_lateness_ms", "p99"), lambda _: 1000.0),
    Target("scale slots run", "all (100 %)", _get("scale_fired_pct"), lambda _: 100.0, at_most=False),
    Target("scale all at once", "≤ 60 s (issue 41)", _get("scale_burst_start_s"), lambda _: 60.0),
    Target("scale beat CPU", "≤ 15 % (issue 41)", _get("scale_beat_cpu_pct"), lambda _: 15.0),
    Target("scale Redis/schedule", "≤ 1 KiB (issue 41)", _get("scale_redis_bytes_per_schedule"), lambda _: 1024.0),
    Target("scale apply", "≤ 60 s (issue 41)", _get("scale_apply_s"), lambda _: 60.0),
    Target("scale beat restart", "≤ 60 s (issue 41)", _get("scale_beat_restart_s"), lambda _: 60.0),
)


def evaluate(results: Results) -> list[dict[str, Any]]:
    """Each target against this run's medians; a figure the run did not measure is left out."""
    rows = []
    for target in TARGETS:
        try:
            measured, limit = target.measured(results), target.limit(results)
        except KeyError:
            continue
        met = measured <= limit if target.at_most else measured >= limit
        rows.append(
            {
                "figure": target.figure,
                "target": target.target,
                "measured": _number(measured),
                "limit": _number(limit),
                "met": met,
            }
        )
    return rows


def _number(value: float) -> float:
    return round(value, 3 if abs(value) < 10 else 1)


def _fmt(value: float) -> str:
    if abs(value) >= 1_000_000:
        return f"{value / 1_000_000:.1f}M"
    if abs(value) >= 10_000:
        return f"{value / 1000:.1f}k"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"


def _cell(results: Results, key: str, part: str | None, *, spread: bool = True) -> str:
    if key not in results or (part and part not in results[key]):
        return "-"
    value = results[key][part] if part else results[key]
    text = _fmt(value)
    low_high = results.get("spread", {}).get(key)
    if spread and low_high is not None:
        low, high = low_high[part] if part else low_high
        if low != high:
            text += f" [{_fmt(low)}-{_fmt(high)}]"
    return text


def table_rows(results: Results, *, spread: bool = True) -> list[tuple[str, str, str]]:
    rows = []
    for row in ROWS:
        if row.key not in results:
            continue
        label = f"{row.label} ({row.unit})" if row.unit else row.label
        raw = _cell(results, f"raw_{row.key}", row.part, spread=spread)
        rows.append((label, _cell(results, row.key, row.part, spread=spread), raw))
    return rows


def _caption(results: Results) -> str:
    meta = results.get("meta", {})
    runs, schedules = meta.get("runs", "?"), meta.get("schedules", "?")
    return (
        f"chordbeat on PostgreSQL vs raw Celery, same Redis, prefork -c 2, {meta.get('cpus', '?')} CPUs; "
        f"{schedules:,} schedules; median of {runs} runs [min-max]; {meta.get('date', '')}"
        if isinstance(schedules, int)
        else f"chordbeat on PostgreSQL vs raw Celery; median of {runs} runs [min-max]"
    )


def text_table(results: Results, width: int = 80) -> str:
    """The results and targets, fixed width for a terminal."""
    rows = table_rows(results)
    first = max((len(r[0]) for r in rows), default=6)
    rest = (width - first - 4) // 2
    lines = [*textwrap.wrap(_caption(results), width), ""]
    lines.append(f"{'figure':<{first}}  {'chordbeat':<{rest}}  {'raw Celery':<{rest}}".rstrip())
    lines.append("-" * width)
    lines += [f"{a:<{first}}  {b[:rest]:<{rest}}  {c[:rest]}".rstrip() for a, b, c in rows]
    lines += ["", "targets (issues 10 and 23)", "-" * width]
    for t in results.get("targets", []):
        mark = "met" if t["met"] else "NOT MET"
        measured, limit = _fmt(t["measured"]), _fmt(t["limit"])
        lines.append(f"{t['figure']:<19} {t['target']:<30} {measured:>8} vs {limit:>8} {mark}"[:width])
    return "\n".join(lines)


def markdown(results: Results) -> str:
    """``latest.md``: the results table, the targets, and the run's notes."""
    out = [f"# Benchmark results\n\n{_caption(results)}\n", "| figure | chordbeat | raw Celery |", "|---|---|---|"]
    out += [f"| {a} | {b} | {c} |" for a, b, c in table_rows(results)]
    out += ["", "## Targets (issue 10)", "", "| figure | target | measured | limit | met |", "|---|---|---|---|---|"]
    for t in results.get("targets", []):
        met = "yes" if t["met"] else "**no**"
        out.append(f"| {t['figure']} | {t['target']} | {_fmt(t['measured'])} | {_fmt(t['limit'])} | {met} |")
    notes = results.get("meta", {}).get("notes", [])
    if notes:
        out += ["", "## How it was measured", ""] + [f"- {note}" for note in notes]
    return "\n".join(out) + "\n"


def readme_section(results: Results) -> str:
    """README's performance table (medians only; ``bench/results/latest.md`` has the spread)."""
    met = {t["figure"]: t for t in results.get("targets", [])}
    out = [f"{_caption(results)}:", "", "| figure | chordbeat | raw Celery |", "|---|---|---|"]
    out += [f"| {a} | {b} | {c} |" for a, b, c in table_rows(results, spread=False)]
    if met:
        reached = sum(t["met"] for t in met.values())
        missed = "; ".join(f for f, t in met.items() if not t["met"]) or "none"
        out += ["", f"Targets of issue 10 met: {reached} of {len(met)} (not met: {missed})."]
    return "\n".join(out)


def scale_section(scale: Results) -> str:
    """README's lines for the scale scenario: its own run, on demand."""
    meta = scale.get("meta", {})
    caption = (
        f'Scale scenario (`make bench BENCH_ARGS="--only scale"`, docs/scaling.md), '
        f"{meta.get('schedules', '?'):,} schedules, one run, {meta.get('date', '')}"
    )
    loads = [scale[k] for k in ("scale_staggered_loadavg", "scale_daily_loadavg") if k in scale]
    caption += f", load average {' and '.join(f'{x:.1f}' for x in loads)} at its parts' starts:" if loads else ":"
    out = ["", caption, "", "| figure | chordbeat |", "|---|---|"]
    out += [f"| {a} | {b} |" for a, b, _ in table_rows(scale, spread=False)]
    missed = [t["figure"] for t in scale.get("targets", []) if not t["met"]]
    out += ["", f"Targets of issue 41 not met: {'; '.join(missed) or 'none'}."]
    return "\n".join(out)


def rewrite_readme(results: Results, readme: Path = README, scale_json: Path = SCALE_JSON) -> None:
    section = readme_section(results)
    if scale_json.exists():
        section += "\n" + scale_section(json.loads(scale_json.read_text()))
    text = readme.read_text()
    head, found, rest = text.partition(START)
    _old, found_end, tail = rest.partition(END)
    if not (found and found_end):
        raise SystemExit(f"{readme}: no {START} … {END} section to rewrite")
    readme.write_text(f"{head}{START}\n{section}\n{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--readme", action="store_true", help="rewrite README.md's performance table")
    parser.add_argument("--markdown", action="store_true", help=f"rewrite {LATEST_MD.name} too")
    parser.add_argument("--json", type=Path, default=LATEST_JSON, help="results file (default: %(default)s)")
    args = parser.parse_args(argv)
    results = json.loads(args.json.read_text())
    if args.markdown:
        LATEST_MD.write_text(markdown(results))
    if args.readme:
        rewrite_readme(results)
    if not (args.readme or args.markdown):
        print(text_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
