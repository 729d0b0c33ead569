"""Steps wait for the shared limits they use, with a real worker: a limit of 1 used by two
schedules' steps never runs them together and both complete; the waiting one shows why; a step
of an unrelated schedule runs while the limit is full; cancelling runs that hold or wait leaves
nothing held and no waiter; a fenced attempt's late outcome releases nothing of its successor's;
a SIGKILLed holder's slot is given back by recovery and the waiter runs."""

from __future__ import annotations

import itertools
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import func, select

import tasks.control
from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.domain.effects import Effects
from celeryapp.errors import InvalidArgument
from celeryapp.execution.limit_steps import release_attempt
from celeryapp.execution.steps import claim_step, finish_step
from celeryapp.interfaces import limit_service, service
from celeryapp.recovery.recovery import RESEND_GRACE_S, recover
from celeryapp.recovery.repair import requeue_attempt
from celeryapp.scheduling.schedule_file import apply_file
from models import ActivityStatus, WorkerTask, transaction, utcnow
from models.alert_tables import ALERTS
from models.limit_tables import LIMIT_HOLDS, LIMIT_WAITERS, LIMITS
from models.session import connection
from tests.support import processes
from tests.support.helpers import recorded_statements, step, ts
from tests.support.servers import wait_for

pytestmark = pytest.mark.both_databases


def schedule(name: str, seconds: float, uses: list[Any] | None = None) -> dict[str, Any]:
    load = step("load", kwargs={"seconds": seconds}, **({"uses": uses} if uses else {}))
    return {"name": name, "every": 3600, "steps": [load]}


def task_of(app: ChordbeatCelery, execution_id: int) -> dict[str, Any] | None:
    tasks = service.get_execution(app, execution_id)["tasks"]
    return tasks[0] if tasks else None


def status_of(app: ChordbeatCelery, execution_id: int) -> str | None:
    task = task_of(app, execution_id)
    return None if task is None else str(task["status"])


def finished(app: ChordbeatCelery, execution_id: int, timeout: float = 30) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        run = service.get_execution(app, execution_id)
        return run if run["status"] != "in_progress" else None

    found = wait_for(done, timeout, interval=0.05, what=f"execution {execution_id} to finish")
    assert isinstance(found, dict)
    return found


def held(app: ChordbeatCelery) -> tuple[int, int, int]:
    """Slots held (counted from the holds, and as the limits' ``in_use``) and waiter rows."""
    with transaction(app.settings.database_url, read_only=True) as session:
        holds = session.scalar(select(func.coalesce(func.sum(LIMIT_HOLDS.c.slots), 0)))
        in_use = session.scalar(select(func.coalesce(func.sum(LIMITS.c.in_use), 0)))
        waiters = session.scalar(select(func.count()).select_from(LIMIT_WAITERS))
    return int(holds or 0), int(in_use or 0), int(waiters or 0)


@pytest.mark.timeout(90)
def test_a_limit_of_one_runs_two_schedules_steps_one_at_a_time_and_leaves_others_alone(
    app: ChordbeatCelery, worker: Any, tmp_path: Path
) -> None:
    limit_service.apply_limit(app, {"name": "warehouse", "slots": 1}, actor="ops")
    service.apply_schedule(app, schedule("finance", 1.5, ["warehouse"]))
    service.apply_schedule(app, schedule("sales", 0.2, ["warehouse"]))
    service.apply_schedule(app, schedule("unrelated", 0.05))
    first = service.trigger_schedule(app, "finance")["execution_id"]
    wait_for(lambda: status_of(app, first) == "processing", 20, what="finance's load to run")
    second = service.trigger_schedule(app, "sales")["execution_id"]
    waiting = task_of(app, second)
    assert waiting is not None and waiting["status"] == "waiting_for_limit"
    assert waiting["waiting_for"] == f"warehouse 1/1 (held by #{first} load)"
    assert held(app) == (1, 1, 1)

    # The limit is full: a step of a schedule that does not use it starts all the same.
    other = finished(app, service.trigger_schedule(app, "unrelated")["execution_id"])
    assert other["status"] == "completed"
    assert status_of(app, first) == "processing" and status_of(app, second) == "waiting_for_limit"

    done = [finished(app, first), finished(app, second)]
    assert [run["status"] for run in done] == ["completed", "completed"]
    (a,), (b,) = (run["activities"] for run in done)
    assert ts(a["completed_at"]) <= ts(b["started_at"]), (a, b)
    assert held(app) == (0, 0, 0)

    # Six runs of two schedules at once on 4 worker threads: each release admits the next, one at a time.
    for name in ("burst-a", "burst-b"):
        service.apply_schedule(app, {**schedule(name, 0.1, ["warehouse"]), "overlap": "allow"})
    burst = [service.trigger_schedule(app, name)["execution_id"] for name in ("burst-a", "burst-b") * 3]
    loads = sorted(
        (ts(a["started_at"]), ts(a["completed_at"])) for run in burst for a in finished(app, run)["activities"]
    )
    assert len(loads) == 6 and all(end <= start for (_, end), (start, _) in itertools.pairwise(loads))
    assert held(app) == (0, 0, 0)

    # Cancelling runs that hold and wait leaves nothing held and no waiter behind.
    service.apply_schedule(app, schedule("finance", 30, ["warehouse"]))
    holder = service.trigger_schedule(app, "finance")["execution_id"]
    wait_for(lambda: status_of(app, holder) == "processing", 20, what="finance's load to run")
    waiter = service.trigger_schedule(app, "sales")["execution_id"]
    assert status_of(app, waiter) == "waiting_for_limit"
    assert service.cancel_execution(app, waiter)["status"] == "cancelled"
    assert held(app) == (1, 1, 0)
    assert service.cancel_execution(app, holder)["status"] == "cancelled"
    assert held(app) == (0, 0, 0)

    # A schedule file that makes the limit larger admits the waiter at once, as a resize does.
    holder = service.trigger_schedule(app, "finance")["execution_id"]
    wait_for(lambda: status_of(app, holder) == "processing", 20, what="finance's load to run")
    waiter = service.trigger_schedule(app, "sales")["execution_id"]
    assert status_of(app, waiter) == "waiting_for_limit"
    (tmp_path / "ops.yaml").write_text(yaml.safe_dump({"limits": [{"name": "warehouse", "slots": 2}], "schedules": []}))
    assert apply_file(app, tmp_path / "ops.yaml").limits["changed"] == ["warehouse"]
    assert finished(app, waiter)["status"] == "completed"
    assert service.cancel_execution(app, holder)["status"] == "cancelled"
    assert held(app) == (0, 0, 0)

    # on_full: skip: the step is not run, recorded with a warning, and its run goes on.
    limit_service.apply_limit(app, {"name": "erp", "slots": 1, "on_full": "skip"}, actor="ops")
    service.apply_schedule(app, schedule("export", 30, ["erp"]))
    service.apply_schedule(
        app, {**schedule("export-again", 0.05, ["erp"]), "steps": [step("load", uses=["erp"]), step("after")]}
    )
    holder = service.trigger_schedule(app, "export")["execution_id"]
    wait_for(lambda: status_of(app, holder) == "processing", 20, what="export's load to run")
    skipped = finished(app, service.trigger_schedule(app, "export-again")["execution_id"])
    assert skipped["status"] == "completed"
    service.cancel_execution(app, holder)
    assert [(a["step"], a["status"]) for a in skipped["activities"]] == [
        ("load", "complete_with_warning"),
        ("after", "complete"),
    ]
    assert skipped["activities"][0]["message"] == "skipped: erp 1/1 full (on_full: skip)"
    assert held(app) == (0, 0, 0)


def test_a_fenced_late_outcome_keeps_the_successors_slot_and_unsent_admissions_are_resent(app: ChordbeatCelery) -> None:
    url = app.settings.database_url
    limit_service.apply_limit(app, {"name": "warehouse", "slots": 1}, actor="ops")
    service.apply_schedule(app, schedule("finance", 1, ["warehouse"]))
    execution_id = service.trigger_schedule(app, "finance")["execution_id"]  # no worker: stays queued
    with transaction(url, read_only=True) as session:
        task_id = session.scalars(select(WorkerTask.id).where(WorkerTask.execution_id == execution_id)).one()
    with connection(url) as conn:
        claim = claim_step(conn, task_id, 1, node="frozen@host", now=utcnow())
    assert claim is not None and held(app) == (1, 1, 0)
    # Recovery declares attempt 1 lost: its slot goes back, and attempt 2 takes it again.
    with transaction(url) as session:
        effects = requeue_attempt(session, task_id, 1, reason="worker lost", now=utcnow())
    assert [(s.worker_task_id, s.attempt) for group in effects.dispatch for s in group.steps] == [(task_id, 2)]
    assert held(app) == (1, 1, 0)
    # Attempt 1 wakes and records its outcome late, as the runner does: nothing of attempt 2's goes.
    with connection(url) as conn:
        now = utcnow()
        recorded = finish_step(conn, claim, ActivityStatus.COMPLETE, now=now)
        admitted = release_attempt(conn, task_id, 1, now=now)
    assert not recorded.closed and admitted == Effects()
    assert held(app) == (1, 1, 0)
    with transaction(url, read_only=True) as session:
        assert session.execute(select(LIMIT_HOLDS.c.worker_task_id, LIMIT_HOLDS.c.attempt)).all() == [(task_id, 2)]

    # Attempt 2 ends and its release admits a waiter; the process dies before sending it.
    service.apply_schedule(app, schedule("sales", 1, ["warehouse"]))
    waiter = service.trigger_schedule(app, "sales")["execution_id"]
    assert status_of(app, waiter) == "waiting_for_limit"
    with connection(url) as conn:
        claim = claim_step(conn, task_id, 2, node="w2@host", now=utcnow())
        assert claim is not None
        now = utcnow()
        finish_step(conn, claim, ActivityStatus.COMPLETE, now=now)
        admitted = release_attempt(conn, task_id, 2, now=now)
    assert [step.spec.name for group in admitted.dispatch for step in group.steps] == ["load"]
    assert status_of(app, waiter) == "queued" and held(app) == (1, 1, 0)
    # Queued without a dispatch marker: recovery's pass sends it (its task id makes a second harmless).
    report = recover(app, now=utcnow() + timedelta(seconds=RESEND_GRACE_S + 1))
    assert report.resent == [admitted.dispatch[0].steps[0].worker_task_id]


@pytest.mark.timeout(60)
def test_rate_waiters_are_woken_when_their_token_is_due_not_by_recovery(app: ChordbeatCelery, worker: Any) -> None:
    """A limit of one start a second, three runs at once, a worker and no recovery (no beat): the
    first starts, the two others wait for tokens; each is started by the pass sent for its token's
    moment (``chordbeat.settle_limits``), one per moment however many passes asked for it."""
    limit_service.apply_limit(app, {"name": "tap", "slots": 5, "rate": "1/s"}, actor="ops")
    service.apply_schedule(app, {**schedule("drip", 0.01, ["tap"]), "overlap": "allow"})
    runs = [service.trigger_schedule(app, "drip")["execution_id"] for _ in range(3)]
    assert [status_of(app, run) for run in runs[1:]] == ["waiting_for_limit", "waiting_for_limit"]
    done = [finished(app, run, 20) for run in runs]
    assert [run["status"] for run in done] == ["completed"] * 3
    starts = sorted(ts(run["activities"][0]["started_at"]) for run in done)
    # The rate is kept: a token a second (on the reference clock; the workers' own time may lag).
    assert all(later - earlier >= timedelta(seconds=0.9) for earlier, later in itertools.pairwise(starts))
    assert held(app) == (0, 0, 0)


def test_a_wake_up_message_with_no_limits_or_not_ids_is_refused_naming_the_field() -> None:
    for hostile in ([], [0], [True], ["1"], [1.5], [1] * 1001, "1", None):
        with pytest.raises(InvalidArgument, match="limit_ids"):
            tasks.control.settle_limits(hostile)


@pytest.mark.timeout(120)
def test_a_sigkilled_holder_is_released_by_recovery_and_the_waiter_runs(
    app: ChordbeatCelery, settings: Settings, tmp_path: Path
) -> None:
    limit_service.apply_limit(app, {"name": "warehouse", "slots": 1}, actor="ops")
    service.apply_schedule(app, schedule("finance", 4, ["warehouse"]))
    service.apply_schedule(app, schedule("sales", 0.2, ["warehouse"]))
    with processes.worker(settings, tmp_path, "w1", 1) as w1, processes.worker(settings, tmp_path, "w2", 1) as w2:
        first = service.trigger_schedule(app, "finance")["execution_id"]
        wait_for(lambda: status_of(app, first) == "processing", 30, what="finance's load to run")
        second = service.trigger_schedule(app, "sales")["execution_id"]
        assert status_of(app, second) == "waiting_for_limit"
        node = service.get_execution(app, first)["activities"][0]["worker"]
        (w1 if node.startswith("w1@") else w2).kill()
        # Recovery's pass, as beat runs it: the lost attempt's slot goes back, the waiter runs.
        wait_for(lambda: recover(app) and status_of(app, second) is None, 60, interval=0.5, what="sales to run")
        done = [finished(app, second, 60), finished(app, first, 60)]
    assert [run["status"] for run in done] == ["completed", "completed"]
    (sales,), (lost, again) = (run["activities"] for run in done)
    assert (lost["attempt"], lost["error"]) == (1, f"worker lost: no heartbeat from {node}")
    # Never two at once: the waiter ran after the lost attempt's end, the re-run after the waiter.
    assert ts(lost["completed_at"]) <= ts(sales["started_at"]) <= ts(sales["completed_at"]) <= ts(again["started_at"])
    assert held(app) == (0, 0, 0)


def test_rate_waiters_woken_by_recovery_starved_alerts_and_a_deleted_limits_waiters_fail(app: ChordbeatCelery) -> None:
    url = app.settings.database_url
    limit_service.apply_limit(app, {"name": "erp", "slots": 5, "rate": "1/min"}, actor="ops")
    limit_service.apply_limit(app, {"name": "warehouse", "slots": 1, "max_wait": 1}, actor="ops")
    service.apply_schedule(app, schedule("first", 1, ["erp"]))
    service.apply_schedule(app, schedule("second", 1, ["erp"]))
    service.apply_schedule(app, schedule("holder", 1, ["warehouse"]))
    service.apply_schedule(app, schedule("starving", 1, ["warehouse"]))
    # No worker: admitted steps stay queued, holding their slots.
    first = service.trigger_schedule(app, "first")["execution_id"]
    second = service.trigger_schedule(app, "second")["execution_id"]
    assert (status_of(app, first), status_of(app, second)) == ("queued", "waiting_for_limit")
    service.trigger_schedule(app, "holder")
    starving = service.trigger_schedule(app, "starving")["execution_id"]
    with recorded_statements(app, words=None) as statements:
        assert recover(app).limits_settled == []  # no token yet, and no alert: not waited long enough
    # Neither limit could admit anyone (no token; no slot): the pass locked neither.
    assert not [sql for sql in statements if "limits.id IN" in sql]
    with transaction(url, read_only=True) as session:
        assert session.scalar(select(func.count()).select_from(ALERTS)) == 0
    # A minute later (a token back, max_wait passed): no release happened, recovery's pass admits.
    later = utcnow() + timedelta(seconds=61)
    assert recover(app, now=later).limits_settled == ["erp"]
    assert status_of(app, second) == "queued"
    with transaction(url, read_only=True) as session:
        alerts = session.execute(select(ALERTS.c.kind, ALERTS.c.execution_id, ALERTS.c.detail)).all()
    assert alerts == [("starved", starving, "warehouse")]
    recover(app, now=later)  # once per run
    with transaction(url, read_only=True) as session:
        assert session.scalar(select(func.count()).select_from(ALERTS)) == 1

    # A limit deleted with force: the step that waited for it fails, it does not wait for ever.
    limit_service.delete_limit(app, "warehouse", force=True, actor="ops")
    run = service.get_execution(app, starving)
    assert run["tasks"] == []
    assert [(a["status"], a["error"]) for a in run["activities"]] == [
        ("failed_with_error", "its limit 'warehouse' was deleted while it waited")
    ]
