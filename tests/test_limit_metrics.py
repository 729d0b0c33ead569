"""Prometheus metrics of shared limits: gauges read from the limit rows at scrape time, and the
admissions counted (with how long each waited) in the transaction that admits them, by limit;
a deleted limit's series end with it."""

from __future__ import annotations

from datetime import timedelta

import pytest

from celeryapp.application import ChordbeatCelery
from celeryapp.execution.limit_slots import Demand, Holder, acquire_or_wait, release
from celeryapp.interfaces import limit_service
from models import transaction, utcnow
from tests.support.scrapes import Samples, scrape

pytestmark = pytest.mark.both_databases


def of_limit(samples: Samples, name: str, limit: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted({"limit": limit, **labels}.items()))))


def test_limit_gauges_and_admissions_with_their_waits(app: ChordbeatCelery) -> None:
    url = app.settings.database_url
    limit_service.apply_limit(app, {"name": "erp", "slots": 1})
    limit_service.apply_limit(app, {"name": "warehouse", "slots": 3})
    first, second = Holder(1, 1, 10, "export"), Holder(2, 1, 11, "export")
    with transaction(url) as session:
        assert acquire_or_wait(session, [Demand("erp"), Demand("warehouse")], first)[0]
    # The second waits: enqueued a minute ago on the reference clock, as if it had waited that long.
    with transaction(url) as session:
        assert not acquire_or_wait(session, [Demand("erp")], second, now=utcnow() - timedelta(seconds=60))[0]

    samples = scrape(app)
    assert [of_limit(samples, f"chordbeat_limit_{g}", "erp") for g in ("slots", "in_use", "waiting")] == [1, 1, 1]
    assert [of_limit(samples, f"chordbeat_limit_{g}", "warehouse") for g in ("slots", "in_use", "waiting")] == [3, 1, 0]
    assert 60 <= (of_limit(samples, "chordbeat_limit_oldest_wait_seconds", "erp") or 0) < 3600
    assert of_limit(samples, "chordbeat_limit_oldest_wait_seconds", "warehouse") == 0
    assert of_limit(samples, "chordbeat_limit_admitted_total", "erp") == 1
    assert of_limit(samples, "chordbeat_limit_admitted_total", "warehouse") == 1

    with transaction(url) as session:
        assert release(session, first.worker_task_id, first.attempt).admitted.started == (second,)
    samples = scrape(app)
    assert of_limit(samples, "chordbeat_limit_admitted_total", "erp") == 2
    assert of_limit(samples, "chordbeat_limit_waiting", "erp") == 0
    assert of_limit(samples, "chordbeat_limit_oldest_wait_seconds", "erp") == 0
    assert of_limit(samples, "chordbeat_limit_wait_seconds_count", "erp") == 2
    # One admitted at once, one after its minute: cumulative buckets, the sum at least that minute.
    assert of_limit(samples, "chordbeat_limit_wait_seconds_bucket", "erp", le="0.05") == 1
    assert of_limit(samples, "chordbeat_limit_wait_seconds_bucket", "erp", le="30") == 1
    assert of_limit(samples, "chordbeat_limit_wait_seconds_bucket", "erp", le="300") == 2
    assert of_limit(samples, "chordbeat_limit_wait_seconds_bucket", "erp", le="+Inf") == 2
    assert 60 <= (of_limit(samples, "chordbeat_limit_wait_seconds_sum", "erp") or 0) < 3600

    with transaction(url) as session:
        release(session, second.worker_task_id, second.attempt)
    limit_service.delete_limit(app, "erp")
    samples = scrape(app)
    assert not [key for key in samples if ("limit", "erp") in key[1]], "a deleted limit's series end"
    assert of_limit(samples, "chordbeat_limit_admitted_total", "warehouse") == 1
