"""One count of a schedule's runs: the dashboard's schedule page and ``chordbeat show`` (in a
terminal 80 columns wide) print the same number for a schedule with regular, retry, manual and
backfill runs, and it is every run kept (the CLI once left the backfill runs out)."""

from __future__ import annotations

import re
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from celery import Celery
from sqlalchemy import select

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.worker import firing
from models import Schedule, ScheduleExecution, Trigger, transaction, utcnow
from tests.support import processes
from tests.support.helpers import call, finished, wait_for
from tests.support.terminals import in_pty, plain_lines
from tests.support.web_server import ADMIN, WebServer

CHORDBEAT = str(Path(sys.executable).with_name("chordbeat"))
SGR = re.compile(r"\x1b\[[0-9;]*m")


def _triggers(app: ChordbeatCelery) -> list[str]:
    with transaction(app.settings.database_url) as session:
        query = select(ScheduleExecution.trigger).where(ScheduleExecution.schedule_name == "mixed")
        return sorted(t.value for t in session.scalars(query))


def _retry_at(app: ChordbeatCelery) -> datetime | None:
    with transaction(app.settings.database_url) as session:
        return session.scalar(select(Schedule.retry_at).where(Schedule.name == "mixed"))


def test_the_dashboard_and_show_count_the_same_runs(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings
) -> None:
    steps = [{"name": "s", "task": "chordbeat.examples.fail", "kwargs": {"message": "no"}}]
    definition = {"name": "mixed", "cron": "0 * * * *", "max_retries": 3, "retry_delay": 1, "steps": steps}
    call(client, "chordbeat.apply_schedule", definition=definition)
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    regular = firing.fire(app, "mixed", nominal_at=hour, trigger=Trigger.CRON)
    finished(client, regular["execution_id"])
    retry_at = _retry_at(app)
    assert retry_at is not None, "a failed regular run of a schedule with retries has its retry due"
    wait_for(lambda: utcnow() >= retry_at, 10, what="the retry to be due")
    retry = firing.fire(app, "mixed", nominal_at=retry_at, trigger=Trigger.RETRY)
    finished(client, retry["execution_id"])
    finished(client, call(client, "chordbeat.trigger_schedule", name="mixed")["execution_id"])
    start, end = hour - timedelta(hours=3), hour - timedelta(hours=1)
    backfill = call(client, "chordbeat.backfill_schedule", name="mixed", start=start.isoformat(), end=end.isoformat())
    assert backfill["count"] == 2, backfill
    wait_for(
        lambda: call(client, "chordbeat.get_backfill", backfill_id=backfill["backfill_id"])["status"] == "completed",
        30,
        what="the backfill to end",
    )
    triggers = _triggers(app)
    assert {"cron", "retry", "manual", "backfill"} <= set(triggers), triggers
    with WebServer(app) as web:
        page = web.session(ADMIN).get(web.url + "/schedule?name=mixed", timeout=10).text
    on_page = re.search(r'<span id="run-counts">runs (\d+)', page)
    assert on_page, page
    env = processes.settings_env(settings, TZ="UTC")
    status, output = in_pty([CHORDBEAT, "show", "mixed"], env, columns=80)
    assert status == 0, output
    shown = "\n".join(plain_lines(SGR.sub("", output)))
    in_terminal = re.search(r"^\s*runs (\d+)", shown, re.M)
    assert in_terminal, shown
    assert int(in_terminal.group(1)) == int(on_page.group(1)) == len(triggers), (shown, on_page.group(0))
