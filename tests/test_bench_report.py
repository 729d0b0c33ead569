"""The benchmark's modules import and its report renders from a results file (no servers)."""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from bench import harness, report
from bench.run import DEFAULT, _outputs, summarise
from bench.stats import combine

SAMPLE_RUNS: dict[str, list[Any]] = {
    "advance_ms": [{"p50": 5.0, "p95": 9.0}, {"p50": 6.0, "p95": 8.0}, {"p50": 4.0, "p95": 30.0}],
    "raw_advance_ms": [{"p50": 8.0, "p95": 10.0}] * 3,
    "steps_per_s": [240.0, 250.0, 260.0],
    "raw_steps_per_s": [360.0, 350.0, 370.0],
    "requeue_s": [19.0, 30.0, 20.0],
    "cpu_ms_per_step": [{"worker": 5.0, "database": 0.8, "redis": 0.4, "all": 6.2}] * 3,
    "raw_cpu_ms_per_step": [{"worker": 2.5, "redis": 0.4, "all": 2.9}] * 3,
    "worker_rss_mib": [280.0] * 3,
    "raw_worker_rss_mib": [170.0] * 3,
    "worker_pss_mib": [110.0, 112.0, 111.0],
    "raw_worker_pss_mib": [95.0] * 3,
}


@pytest.mark.parametrize(
    "module", ["harness", "pipelines", "faults", "beat_scale", "raw_app", "run", "report", "scale", "durable"]
)
def test_bench_modules_import(module: str) -> None:
    importlib.import_module(f"bench.{module}")


def test_medians_spread_and_targets_come_from_the_runs() -> None:
    results = summarise(dict(SAMPLE_RUNS), {"runs": 3})
    assert results["advance_ms"] == {"p50": 5.0, "p95": 9.0}
    assert results["spread"]["advance_ms"] == {"p50": [4.0, 6.0], "p95": [8.0, 30.0]}
    targets = {t["figure"]: t for t in results["targets"]}
    assert targets["advance p50"]["met"] and targets["advance p95"]["met"]
    assert not targets["steps/s under load"]["met"]  # 250 < 0.9 x 360
    assert targets["steps/s (issue 23)"]["met"]  # 250 >= 0.6 x 360
    assert not targets["worker CPU a step"]["met"] and targets["worker CPU a step"]["limit"] == 3.75  # 5.0 > 1.5 x 2.5
    assert targets["requeue"]["met"] and targets["requeue"]["limit"] == 26
    assert "failover" not in targets  # not measured in this run: not judged
    # Memory: RSS counts pages the pool shares with its parent in every process, PSS once.
    assert not targets["worker RSS"]["met"]
    assert targets["worker PSS"]["met"] and targets["worker PSS"]["limit"] == 114.0


def test_pss_divides_what_processes_share() -> None:
    pid = os.getpid()
    assert 0 < harness.pss_mib(pid) <= harness.rss_mib(pid)


def test_tables_fit_and_the_readme_section_is_rewritten(tmp_path: Path) -> None:
    results = summarise(dict(SAMPLE_RUNS), {"runs": 3, "date": "today"})
    text = report.text_table(results)
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "steps/s, 100 x 5 groups x 2" in text and "NOT MET" in text
    assert "| advance p50, 20 groups x 4 (ms) | 5.00 [4.00-6.00] | 8.00 |" in report.markdown(results)
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{report.START}\nold table\n{report.END}\n\nafter\n")
    report.rewrite_readme(results, readme)
    rewritten = readme.read_text()
    assert "old table" not in rewritten and rewritten.endswith(f"{report.END}\n\nafter\n")
    assert "| steps/s, 100 x 5 groups x 2 | 250 | 360 |" in rewritten
    assert "not met: steps/s under load" in rewritten
    # Raw Celery has no database: its cell is empty, not an error.
    assert "| CPU per step: PostgreSQL (ms) | 0.80 | - |" in rewritten
    assert "| CPU per step: all of them (ms) | 6.20 | 2.90 |" in rewritten
    assert "| worker PSS (prefork -c 2) (MiB) | 111 | 95.0 |" in rewritten


def test_the_scale_scenario_runs_on_demand_into_its_own_file(tmp_path: Path) -> None:
    assert "scale" not in DEFAULT and "durable" in DEFAULT
    assert _outputs(False, ["scale"])[0].name == "scale.json"
    assert _outputs(False, DEFAULT)[0].name == "latest.json"
    assert _outputs(False, ["scale", "pipelines"])[0].name == "partial.json"
    assert _outputs(True, ["scale"])[0].name == "quick.json"  # a smoke test never replaces the figures
    scale = summarise(
        {
            "scale_schedules": [100_000],
            "scale_apply_s": [900.0],
            "scale_fire_lateness_ms": [{"p50": 50.0, "p99": 400.0}],
        },
        {"runs": 1, "date": "today", "schedules": 100_000},
    )
    scale_json = tmp_path / "scale.json"
    scale_json.write_text(json.dumps(scale))
    readme = tmp_path / "README.md"
    readme.write_text(f"{report.START}\n{report.END}\n")
    report.rewrite_readme(summarise(dict(SAMPLE_RUNS), {"runs": 3}), readme, scale_json)
    rewritten = readme.read_text()
    assert "| scale: apply the file (s) | 900 |" in rewritten
    assert "| scale: fire lateness p99, staggered (ms) | 400 |" in rewritten
    assert "Targets of issue 41 not met: scale apply." in rewritten


def test_a_yes_or_no_of_each_run_stays_one() -> None:
    """Whether the scale scenario applied its whole file is kept as a yes/no, not as a median."""
    assert combine([{"whole": True, "s": 2.0}, {"whole": True, "s": 4.0}]) == (
        {"whole": True, "s": 3.0},
        {"whole": [True, True], "s": [2.0, 4.0]},
    )
    assert combine([True, False, True])[0] is False
