"""The chaos suite's slot check, on hand-made records: what it must flag, and what it must let be."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from models import Schedule, SlotOutcome, SlotRecord, Trigger
from tests.chaos_invariants import Context, Snapshot, Violation, _decided_slots

SLOT = datetime(2026, 11, 25, 1, 0, tzinfo=UTC)


def _slot_check(*outcomes: tuple[SlotOutcome, int | None]) -> list[Violation]:
    schedule = Schedule(name="chaos-buffer", cron="* * * * *")
    records = [
        SlotRecord(
            schedule_name=schedule.name,
            nominal_at=SLOT,
            trigger=Trigger.CRON,
            outcome=outcome,
            execution_id=execution_id,
            recorded_at=SLOT + timedelta(seconds=index),
        )
        for index, (outcome, execution_id) in enumerate(outcomes)
    ]
    start = SLOT.timestamp() - 60
    snap = Snapshot(schedules=[schedule], executions=[], activities=[], tasks=[], slots=records)
    ends = {"firing_end": start + 120, "settled": start + 130}
    ctx = Context(snap, [], [], {}, [], started=start, execution_bound_s=60, **ends)
    out: list[Violation] = []
    _decided_slots(ctx, schedule, out)
    return out


def test_a_buffered_slot_that_fired_once_is_one_decision() -> None:
    assert _slot_check((SlotOutcome.BUFFERED, None), (SlotOutcome.FIRED, 7)) == []


def test_a_slot_fired_twice_or_decided_twice_is_flagged() -> None:
    for twice in (
        ((SlotOutcome.BUFFERED, None), (SlotOutcome.FIRED, 7), (SlotOutcome.FIRED, 8)),
        ((SlotOutcome.FIRED, 7), (SlotOutcome.SKIPPED_OVERLAP, None)),
        ((SlotOutcome.BUFFERED, None), (SlotOutcome.MISSED, None)),
    ):
        (violation,) = _slot_check(*twice)
        assert violation.invariant == "no slot fires twice" and "decided twice" in violation.detail
