"""The backfill driver in the database (no worker: runs are ended by hand): a backfill's first
runs start with it, each run's end starts the next, an exclusive schedule's regular slot meeting
a backfill run is buffered and runs first, and every run stores its slot."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update

from celeryapp.application import ChordbeatCelery
from celeryapp.domain.batching import Fire
from celeryapp.domain.times import iso
from celeryapp.execution.backfills import create_backfill
from celeryapp.execution.runs import cancel_execution
from celeryapp.interfaces import service
from celeryapp.interfaces.backfill_service import backfill_schedule
from celeryapp.recovery import housekeeping
from celeryapp.recovery.recovery import recover
from celeryapp.worker import firing
from models import (
    Backfill,
    BackfillOrigin,
    BackfillStatus,
    ExecutionStatus,
    Schedule,
    ScheduleExecution,
    ScheduleStatus,
    SlotRecord,
    Trigger,
    transaction,
    utcnow,
)
from tests.support.helpers import recorded_statements, step

HOUR = timedelta(hours=1)


def _apply(app: ChordbeatCelery, name: str, overlap: str, anchor: datetime) -> int:
    service.apply_schedule(app, {"name": name, "every": 3600, "overlap": overlap, "steps": [step("a")]})
    with transaction(app.settings.database_url) as session:
        session.execute(update(Schedule).where(Schedule.name == name).values(updated_at=anchor))
        schedule_id = session.scalar(select(Schedule.id).where(Schedule.name == name))
    assert schedule_id is not None
    return schedule_id


def _backfill(app: ChordbeatCelery, schedule_id: int, slots: list[datetime], **kwargs: Any) -> int:
    with transaction(app.settings.database_url) as session:
        made = create_backfill(session, schedule_id, slots, now=utcnow(), actor="test", reason="why", **kwargs)
    return made.backfill_id


def _runs(app: ChordbeatCelery, name: str) -> list[ScheduleExecution]:
    with transaction(app.settings.database_url) as session:
        query = select(ScheduleExecution).where(ScheduleExecution.schedule_name == name)
        return list(session.scalars(query.order_by(ScheduleExecution.id)))


def _end(app: ChordbeatCelery, execution_id: int) -> None:
    with transaction(app.settings.database_url) as session:
        cancel_execution(session, execution_id, now=utcnow(), reason="ended by the test")


def _row(app: ChordbeatCelery, backfill_id: int) -> Backfill:
    with transaction(app.settings.database_url) as session:
        return session.get_one(Backfill, backfill_id)


def test_a_backfill_starts_its_first_runs_and_each_end_starts_the_next(app: ChordbeatCelery) -> None:
    anchor = utcnow().replace(microsecond=0) - 10 * HOUR
    schedule_id = _apply(app, "wide", "allow", anchor)
    slots = [anchor + HOUR * k for k in (1, 2, 3)]
    backfill_id = _backfill(
        app, schedule_id, slots, origin=BackfillOrigin.REQUEST, max_concurrent=2, mode="all", request_key="k"
    )
    runs = _runs(app, "wide")
    assert [(r.trigger, r.slot, r.backfill_id, r.status) for r in runs] == [
        (Trigger.BACKFILL, slots[0], backfill_id, ExecutionStatus.IN_PROGRESS),
        (Trigger.BACKFILL, slots[1], backfill_id, ExecutionStatus.IN_PROGRESS),
    ]
    assert runs[0].run_key == f"wide:backfill:{slots[0].isoformat(timespec='milliseconds').replace('+00:00', 'Z')}"
    assert _row(app, backfill_id).started == 2
    _end(app, runs[0].id)
    runs = _runs(app, "wide")
    assert [r.slot for r in runs] == slots
    assert _row(app, backfill_id).started == 3
    for run in runs[1:]:
        _end(app, run.id)
    done = _row(app, backfill_id)
    assert (done.status, done.request_key, done.finished_at is not None) == (BackfillStatus.COMPLETED, None, True)
    with transaction(app.settings.database_url) as session:
        records = session.scalars(select(SlotRecord).where(SlotRecord.schedule_name == "wide").order_by(SlotRecord.id))
        assert [(r.nominal_at, r.trigger, r.detail) for r in records] == [
            (slot, Trigger.BACKFILL, f"backfill #{backfill_id}") for slot in slots
        ]
        schedule = session.get_one(Schedule, schedule_id)
        # Backfill runs are no regular runs: no counters move.
        assert (schedule.run_count, schedule.error_count) == (0, 0)


def test_a_catch_up_runs_with_the_regular_trigger_and_run_key(app: ChordbeatCelery) -> None:
    anchor = utcnow().replace(microsecond=0) - 10 * HOUR
    schedule_id = _apply(app, "late", "skip", anchor)
    slots = [anchor + HOUR, anchor + 2 * HOUR]
    _backfill(app, schedule_id, slots, origin=BackfillOrigin.CATCHUP, max_concurrent=1)
    (run,) = _runs(app, "late")
    assert (run.trigger, run.slot) == (Trigger.INTERVAL, slots[0])
    assert run.run_key == f"late:interval:{slots[0].isoformat(timespec='milliseconds').replace('+00:00', 'Z')}"
    # A late fire of the slot the catch-up started is a duplicate, not a second run.
    _end(app, run.id)
    (run, second) = _runs(app, "late")
    assert second.slot == slots[1]


def test_a_regular_slot_meeting_a_backfill_run_is_buffered_and_runs_first(app: ChordbeatCelery) -> None:
    anchor = utcnow().replace(microsecond=0) - 10 * HOUR
    schedule_id = _apply(app, "only", "skip", anchor)
    backfill_id = _backfill(
        app, schedule_id, [anchor + HOUR, anchor + 2 * HOUR], origin=BackfillOrigin.REQUEST, max_concurrent=1
    )
    (first,) = _runs(app, "only")
    # The schedule's own slot fires while the backfill's run is active: skip would drop it.
    due = anchor + 10 * HOUR
    answer = firing.fire(app, "only", nominal_at=due, trigger=Trigger.INTERVAL)
    assert answer == {"execution_id": None, "skipped": f"buffered: backfill run {first.id} is in progress"}
    with transaction(app.settings.database_url) as session:
        record = session.scalars(select(SlotRecord).where(SlotRecord.nominal_at == due)).one()
        assert (record.outcome.value, record.detail) == ("buffered", f"waiting for backfill run #{first.id}")
    _end(app, first.id)
    # The buffered regular run starts first; the backfill's next waits for it.
    runs = _runs(app, "only")
    assert [(r.trigger, r.backfill_id) for r in runs] == [(Trigger.BACKFILL, backfill_id), (Trigger.INTERVAL, None)]
    assert runs[1].slot == due  # the buffered run is the regular slot's, and says so
    assert _row(app, backfill_id).started == 1
    _end(app, runs[1].id)
    runs = _runs(app, "only")
    assert [(r.trigger, r.slot) for r in runs[2:]] == [(Trigger.BACKFILL, anchor + 2 * HOUR)]


def test_regular_runs_store_their_slot(app: ChordbeatCelery) -> None:
    anchor = utcnow().replace(microsecond=0) - 10 * HOUR
    for name in ("alone", "batched", "manual"):
        _apply(app, name, "skip", anchor)
    due = anchor + 10 * HOUR
    assert firing.fire(app, "alone", nominal_at=due, trigger=Trigger.INTERVAL)["status"] == "in_progress"
    assert firing.fire_batch(app, [Fire("batched", due, Trigger.INTERVAL)])[0]["status"] == "in_progress"
    assert service.trigger_schedule(app, "manual")["status"] == "in_progress"
    assert [run.slot for name in ("alone", "batched", "manual") for run in _runs(app, name)] == [due, due, None]


def _set_status(app: ChordbeatCelery, name: str, status: ScheduleStatus) -> None:
    with transaction(app.settings.database_url) as session:
        session.execute(update(Schedule).where(Schedule.name == name).values(status=status))


def test_a_paused_schedule_starts_no_backfill_run_until_resumed(app: ChordbeatCelery) -> None:
    anchor = utcnow().replace(microsecond=0) - 10 * HOUR
    schedule_id = _apply(app, "resting", "skip", anchor)
    backfill_id = _backfill(
        app, schedule_id, [anchor + HOUR, anchor + 2 * HOUR], origin=BackfillOrigin.REQUEST, max_concurrent=1
    )
    service.pause_schedule(app, "resting")
    (first,) = _runs(app, "resting")
    _end(app, first.id)
    assert len(_runs(app, "resting")) == 1 and _row(app, backfill_id).started == 1
    service.resume_schedule(app, "resting")
    assert [r.slot for r in _runs(app, "resting")] == [anchor + HOUR, anchor + 2 * HOUR]


def test_recovery_starts_what_a_backfill_could_not(app: ChordbeatCelery) -> None:
    """A schedule made active again without the service (its run's end found it paused): the
    recovery pass starts the backfill's next slot."""
    anchor = utcnow().replace(microsecond=0) - 10 * HOUR
    schedule_id = _apply(app, "stalled", "skip", anchor)
    backfill_id = _backfill(
        app, schedule_id, [anchor + HOUR, anchor + 2 * HOUR], origin=BackfillOrigin.REQUEST, max_concurrent=1
    )
    _set_status(app, "stalled", ScheduleStatus.PAUSED)
    _end(app, _runs(app, "stalled")[0].id)
    _set_status(app, "stalled", ScheduleStatus.ACTIVE)
    assert len(_runs(app, "stalled")) == 1
    report = recover(app)
    assert report.backfills == [schedule_id]
    assert [r.slot for r in _runs(app, "stalled")] == [anchor + HOUR, anchor + 2 * HOUR]
    assert _row(app, backfill_id).started == 2
    assert recover(app).backfills == []  # nothing more to start while its run is in progress


def test_deleting_the_schedule_cancels_its_backfills(app: ChordbeatCelery) -> None:
    anchor = utcnow().replace(microsecond=0) - 10 * HOUR
    schedule_id = _apply(app, "gone", "allow", anchor)
    backfill_id = _backfill(
        app, schedule_id, [anchor + HOUR, anchor + 2 * HOUR], origin=BackfillOrigin.REQUEST, max_concurrent=1
    )
    service.delete_schedule(app, "gone")
    row = _row(app, backfill_id)
    assert (row.status, row.started, row.schedule_name) == (BackfillStatus.CANCELLED, 1, "gone")


def test_housekeeping_removes_ended_backfills_past_the_retention(app: ChordbeatCelery) -> None:
    anchor = utcnow().replace(microsecond=0) - 10 * HOUR
    schedule_id = _apply(app, "kept", "allow", anchor)
    ended = _backfill(app, schedule_id, [anchor + HOUR], origin=BackfillOrigin.REQUEST, max_concurrent=1)
    _end(app, _runs(app, "kept")[0].id)
    running = _backfill(app, schedule_id, [anchor + 2 * HOUR], origin=BackfillOrigin.REQUEST, max_concurrent=1)
    report = housekeeping.purge(app, now=utcnow() + timedelta(days=app.settings.retention_days + 1))
    assert report.backfills == 1 and report.as_json()["backfills"] == 1
    with transaction(app.settings.database_url) as session:
        assert list(session.scalars(select(Backfill.id))) == [running] != [ended]


def test_a_run_end_does_not_read_the_backfills_slots_again(app: ChordbeatCelery) -> None:
    """Up to 10,000 slots: read at each run's end, a backfill's reads would grow with its square."""
    anchor = utcnow().replace(microsecond=0) - 10 * HOUR
    schedule_id = _apply(app, "long", "skip", anchor)
    slots = [anchor + HOUR * k for k in range(1, 5)]
    _backfill(app, schedule_id, slots, origin=BackfillOrigin.REQUEST, max_concurrent=1)
    with recorded_statements(app, words=None) as statements:
        for _ in range(3):
            _end(app, _runs(app, "long")[-1].id)
    assert len(_runs(app, "long")) == 4
    reads = [s for s in statements if s.startswith("SELECT") and "backfills.slots" in s]
    assert reads == [], reads


def test_a_moved_slot_waits_for_its_time_then_runs_with_the_regular_trigger(app: ChordbeatCelery) -> None:
    """on_excluded: next_business_day's run: a one-slot backfill of origin moved, not before its time."""
    anchor = utcnow().replace(microsecond=0) - 10 * HOUR
    schedule_id = _apply(app, "payroll", "skip", anchor)
    slot, moved_to = anchor + HOUR, utcnow() + HOUR
    with transaction(app.settings.database_url) as session:
        made = create_backfill(
            session,
            schedule_id,
            [slot],
            origin=BackfillOrigin.MOVED,
            max_concurrent=1,
            now=utcnow(),
            mode="moved",
            reason="excluded by the schedule's calendar.exclude",
            not_before=moved_to,
        )
    assert made.effects.dispatch == [] and _runs(app, "payroll") == []
    # Nothing before its time, whoever drives (a regular run's end, recovery's pass)...
    assert recover(app, now=moved_to - timedelta(seconds=1)).backfills == []
    assert _runs(app, "payroll") == []
    # ...and from then on, recovery's pass starts it.
    assert recover(app, now=moved_to).backfills == [schedule_id]
    (run,) = _runs(app, "payroll")
    stamp = slot.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    assert (run.trigger, run.slot, run.run_key) == (Trigger.INTERVAL, slot, f"payroll:moved:{stamp}")
    with transaction(app.settings.database_url) as session:
        record = session.scalars(select(SlotRecord).where(SlotRecord.execution_id == run.id)).one()
        assert record.detail == f"moved from {stamp}: excluded by the schedule's calendar.exclude"
    assert _row(app, made.backfill_id).started == 1


def test_cancel_previous_regular_slot_is_not_lost_to_a_waiting_backfill(app: ChordbeatCelery) -> None:
    anchor = utcnow().replace(microsecond=0) - 10 * HOUR
    schedule_id = _apply(app, "prev", "cancel_previous", anchor)
    manual = service.trigger_schedule(app, "prev")["execution_id"]
    backfill_id = _backfill(app, schedule_id, [anchor + HOUR], origin=BackfillOrigin.REQUEST, max_concurrent=1)
    assert len(_runs(app, "prev")) == 1  # the backfill waits for the manual run
    # The regular slot cancels the manual run: the room it makes is the regular run's, not the backfill's.
    due = anchor + 10 * HOUR
    answer = firing.fire(app, "prev", nominal_at=due, trigger=Trigger.INTERVAL)
    assert answer.get("status") == "in_progress", answer
    runs = _runs(app, "prev")
    assert [(r.id == manual, r.trigger, r.status) for r in runs] == [
        (True, Trigger.MANUAL, ExecutionStatus.CANCELLED),
        (False, Trigger.INTERVAL, ExecutionStatus.IN_PROGRESS),
    ]
    assert _row(app, backfill_id).started == 0
    _end(app, runs[1].id)
    assert [(r.trigger, r.slot) for r in _runs(app, "prev")[2:]] == [(Trigger.BACKFILL, anchor + HOUR)]


def test_a_slot_a_request_ran_is_not_made_up_again_by_a_catch_up(app: ChordbeatCelery) -> None:
    """A request (mode missing) and a catch-up made apart queue the same missed slot, each with its
    own run key: the slot runs once."""
    anchor = utcnow().replace(microsecond=0) - 10 * HOUR
    schedule_id = _apply(app, "twice", "skip", anchor)
    slots = [anchor + HOUR, anchor + 2 * HOUR]
    _backfill(app, schedule_id, slots, origin=BackfillOrigin.REQUEST, max_concurrent=1, mode="missing")
    catch_up = _backfill(app, schedule_id, [slots[1]], origin=BackfillOrigin.CATCHUP, max_concurrent=1)
    _end(app, _runs(app, "twice")[0].id)
    _end(app, _runs(app, "twice")[1].id)
    assert [(r.trigger, r.slot) for r in _runs(app, "twice")] == [
        (Trigger.BACKFILL, slots[0]),
        (Trigger.BACKFILL, slots[1]),
    ]
    assert _row(app, catch_up).status is BackfillStatus.COMPLETED


def test_a_slot_a_missing_backfill_ran_runs_once_when_its_late_fire_comes(app: ChordbeatCelery) -> None:
    """A backfill of the missing slots may take the latest one while beat's fire for it is still on
    its way (beat was down, the operator backfilled the outage, beat came back): the fire that comes
    after the backfill's run must start nothing. Mode missing runs a slot that never ran under its
    regular run key, so the database's unique key makes it one run whichever comes first."""
    anchor = utcnow().replace(microsecond=0) - 10 * HOUR
    schedule_id = _apply(app, "late-fire", "allow", anchor)
    latest = anchor + 10 * HOUR  # due now
    _backfill(app, schedule_id, [latest], origin=BackfillOrigin.REQUEST, max_concurrent=1, mode="missing")
    answer = firing.fire(app, "late-fire", nominal_at=latest, trigger=Trigger.INTERVAL)
    assert answer == {"execution_id": None, "skipped": "duplicate"}, answer
    assert [(r.trigger, r.slot) for r in _runs(app, "late-fire")] == [(Trigger.BACKFILL, latest)]


def test_a_buffered_slot_is_busy_for_a_backfill_and_runs_once(app: ChordbeatCelery) -> None:
    """A slot buffered behind a run in progress (buffer_one) is not chosen by a backfill of mode
    missing asked for meanwhile, and when a backfill queued it before it fired, the buffered run
    and the backfill's are one run: the buffered run has the slot's own run key."""
    anchor = utcnow().replace(microsecond=0) - 10 * HOUR
    schedule_id = _apply(app, "held", "buffer_one", anchor)
    manual = service.trigger_schedule(app, "held")["execution_id"]
    slot = anchor + 10 * HOUR  # due now
    answer = firing.fire(app, "held", nominal_at=slot, trigger=Trigger.INTERVAL)
    assert answer["execution_id"] is None and answer["skipped"].startswith("buffered: "), answer
    # Asked for now, a backfill of the missing slots leaves the buffered one out.
    listed = backfill_schedule(app, "held", iso(slot - HOUR), iso(utcnow()), mode="missing", dry_run=True)
    assert listed["slots"] == [iso(slot - HOUR)]
    # One that has it (made from an earlier look, or queued before the slot fired) runs it once.
    backfill_id = _backfill(app, schedule_id, [slot], origin=BackfillOrigin.REQUEST, max_concurrent=1, mode="missing")
    _end(app, manual)
    buffered = _runs(app, "held")[1]
    assert (buffered.slot, buffered.status) == (slot, ExecutionStatus.IN_PROGRESS)
    assert buffered.run_key == f"held:interval:{iso(slot)}"
    _end(app, buffered.id)
    assert [r.id for r in _runs(app, "held") if r.slot == slot] == [buffered.id]
    assert _row(app, backfill_id).status is BackfillStatus.COMPLETED


def test_a_catch_up_of_a_slot_that_was_buffered_meanwhile_runs_it_once(app: ChordbeatCelery) -> None:
    """A catch-up that queued a slot behind the run in progress (beat back after an outage), then
    the slot's own fire buffered behind that run too: one run of the slot, the buffered one."""
    anchor = utcnow().replace(microsecond=0) - 10 * HOUR
    schedule_id = _apply(app, "made-up", "buffer_one", anchor)
    manual = service.trigger_schedule(app, "made-up")["execution_id"]
    slot = anchor + 10 * HOUR  # due now
    catch_up = _backfill(app, schedule_id, [slot], origin=BackfillOrigin.CATCHUP, max_concurrent=1)
    answer = firing.fire(app, "made-up", nominal_at=slot, trigger=Trigger.INTERVAL)
    assert answer["execution_id"] is None and answer["skipped"].startswith("buffered: "), answer
    _end(app, manual)
    (buffered,) = [r for r in _runs(app, "made-up") if r.slot == slot]
    _end(app, buffered.id)
    assert [r.id for r in _runs(app, "made-up") if r.slot == slot] == [buffered.id]
    assert _row(app, catch_up).status is BackfillStatus.COMPLETED
