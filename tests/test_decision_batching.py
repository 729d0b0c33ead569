"""Which slots of a beat tick's batch start their run together (domain/batching.py).

The rule, stated on a grid of interval slots (anchor + k·every) rather than through decide_fire:
a slot goes together exactly when it is the batch's first regular (non-retry) slot of a schedule
that exists, is active with no retry pending, whose previous slot is the last one processed (or
none was), that is still the latest due, and, unless the schedule allows overlap, that has no run
in progress. Every other slot is fired alone, for the first of those conditions it fails.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from hypothesis import given, settings
from hypothesis import strategies as st

from celeryapp.domain.batching import Alone, BatchPlan, BatchSchedule, Fire, decide_batchable
from celeryapp.domain.cadence import Cadence
from celeryapp.domain.decisions import ScheduleState, decide_fire
from celeryapp.states import Overlap, ScheduleStatus, Trigger

T0 = datetime(2026, 3, 1, tzinfo=UTC)
EVERY_S = 3600
NAMES = ("a", "b", "c", "d")


class Row(NamedTuple):
    """A schedule as a batch finds it."""

    status: ScheduleStatus
    retry_pending: bool
    #: The last slot processed, by its number on the grid.
    last: int | None
    overlap: Overlap
    #: A run of it is in progress.
    busy: bool


schedule_states = st.builds(
    Row,
    st.sampled_from(ScheduleStatus),
    st.booleans(),
    st.none() | st.integers(min_value=0, max_value=6),
    st.sampled_from(Overlap),
    st.booleans(),
)
fires = st.lists(
    st.tuples(
        st.sampled_from((*NAMES, "gone")),
        st.integers(min_value=0, max_value=8),  # the slot's number
        st.sampled_from([Trigger.CRON, Trigger.INTERVAL, Trigger.RETRY]),
    ),
    min_size=1,
    max_size=12,
)


def _slot(number: int) -> datetime:
    return T0 + timedelta(seconds=EVERY_S * number)


def _plan(
    states: dict[str, Row], batch: list[Fire], now: datetime
) -> tuple[BatchPlan, BatchPlan, dict[str, BatchSchedule]]:
    cadence = Cadence(cron=None, every_s=EVERY_S, timezone="UTC", anchor=T0)
    schedules = {
        name: BatchSchedule(
            ScheduleState(
                state.status,
                current_retry=1 if state.retry_pending else 0,
                retry_at=now + timedelta(minutes=5) if state.retry_pending else None,
                last_slot_at=None if state.last is None else _slot(state.last),
            ),
            cadence,
            state.overlap,
        )
        for name, state in states.items()
    }
    plan = decide_batchable(batch, schedules, now=now)
    busy = {index for index, slot in enumerate(batch) if slot.name in states and states[slot.name].busy}
    return plan, plan.without_busy(busy), schedules


@settings(max_examples=500)
@given(
    st.dictionaries(st.sampled_from(NAMES), schedule_states, max_size=len(NAMES)),
    fires,
    st.integers(min_value=0, max_value=2 * EVERY_S - 1),
)
def test_a_slot_goes_together_exactly_when_firing_it_only_starts_a_run(
    states: dict[str, Row], spec: list[tuple[str, int, Trigger]], late_s: int
) -> None:
    batch = [Fire(name, _slot(number), trigger) for name, number, trigger in spec]
    # The clock: some time after the batch's latest slot (late by up to two slots).
    now = max(slot.nominal_at for slot in batch) + timedelta(seconds=late_s)
    plan, final, _ = _plan(states, batch, now)
    seen: set[str] = set()
    for index, (name, number, trigger) in enumerate(spec):
        state = states.get(name)
        first = trigger is not Trigger.RETRY and name not in seen
        if trigger is not Trigger.RETRY:
            seen.add(name)
        if trigger is Trigger.RETRY:
            expected: Alone | None = Alone.RETRY
        elif not first:
            expected = Alone.REPEATED
        elif state is None:
            expected = Alone.UNKNOWN
        elif (
            state.status is not ScheduleStatus.ACTIVE
            or state.retry_pending
            or (state.last is not None and number <= state.last)
            or now >= _slot(number + 1)  # the next slot is due: superseded
        ):
            expected = Alone.NO_PLAIN_START
        elif state.last is not None and number > state.last + 1:
            expected = Alone.MISSED
        elif state.busy and state.overlap is not Overlap.ALLOW:
            expected = Alone.BUSY
        else:
            expected = None
        assert final.alone.get(index) == expected, (index, spec[index], state)
        assert (index in final.together) == (expected is None)
        # Before the overlap check, a busy slot was together and marked to be checked.
        assert (index in plan.exclusive) == (
            expected in (None, Alone.BUSY) and state is not None and state.overlap is not Overlap.ALLOW
        )
    # Every slot is answered exactly once.
    assert sorted([*final.together, *final.alone]) == list(range(len(batch)))
    assert len({batch[index].name for index in final.together}) == len(final.together)


@settings(max_examples=300)
@given(st.dictionaries(st.sampled_from(NAMES), schedule_states, min_size=1, max_size=len(NAMES)), fires)
def test_slots_together_are_those_a_fire_alone_would_start_and_follow_the_lock_order(
    states: dict[str, Row], spec: list[tuple[str, int, Trigger]]
) -> None:
    batch = [Fire(name, _slot(number), trigger) for name, number, trigger in spec]
    now = max(slot.nominal_at for slot in batch) + timedelta(seconds=1)
    plan, final, schedules = _plan(states, batch, now)
    for index in plan.together:
        slot, schedule = batch[index], schedules[batch[index].name]
        decision = decide_fire(
            schedule.state, trigger=slot.trigger, nominal_at=slot.nominal_at, now=now, cadence=schedule.cadence
        )
        assert decision.start and decision.claims_slot and decision.outcome is None
    order = list(schedules)
    assert [order.index(batch[index].name) for index in plan.together] == sorted(
        order.index(batch[index].name) for index in plan.together
    )
    assert set(final.together) <= set(plan.together) and set(final.exclusive) <= set(plan.exclusive)


def test_the_rule_on_examples() -> None:
    due = _slot(5)
    now = due + timedelta(minutes=1)
    active = ScheduleState(ScheduleStatus.ACTIVE, 0, None, _slot(4))
    cadence = Cadence(cron=None, every_s=EVERY_S, timezone="UTC", anchor=T0)
    schedules = {
        "plain": BatchSchedule(active, cadence, Overlap.ALLOW),
        "skip": BatchSchedule(active, cadence, Overlap.SKIP),
        "paused": BatchSchedule(ScheduleState(ScheduleStatus.PAUSED, 0, None, _slot(4)), cadence, Overlap.ALLOW),
        "behind": BatchSchedule(ScheduleState(ScheduleStatus.ACTIVE, 0, None, _slot(2)), cadence, Overlap.ALLOW),
    }
    batch = [
        Fire("plain", due, Trigger.INTERVAL),
        Fire("skip", due, Trigger.CRON),
        Fire("paused", due, Trigger.INTERVAL),
        Fire("behind", due, Trigger.INTERVAL),
        Fire("plain", due, Trigger.INTERVAL),
        Fire("plain", due, Trigger.RETRY),
        Fire("gone", due, Trigger.INTERVAL),
    ]
    plan = decide_batchable(batch, schedules, now=now)
    assert plan == BatchPlan(
        together=(0, 1),
        alone={2: Alone.NO_PLAIN_START, 3: Alone.MISSED, 4: Alone.REPEATED, 5: Alone.RETRY, 6: Alone.UNKNOWN},
        exclusive=(1,),
    )
    assert plan.without_busy({1}) == BatchPlan((0,), {**plan.alone, 1: Alone.BUSY}, ())
    assert plan.without_busy(set()) == plan
