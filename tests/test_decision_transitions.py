"""Pausing and resuming: the pure transitions (domain/pause_resume.py) and their compare-and-set
write (scheduling/store.change_status) when the status changes between its read and its write."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import update

from celeryapp.application import ChordbeatCelery
from celeryapp.domain.pause_resume import Transition, decide_pause, decide_resume
from celeryapp.errors import InvalidTransition
from celeryapp.interfaces import service
from celeryapp.scheduling.store import change_status
from models import Schedule, ScheduleStatus, transaction, utcnow
from tests.support.helpers import step

pytestmark = pytest.mark.both_databases

ACTIVE, PAUSED, DONE, DEAD = ScheduleStatus.ACTIVE, ScheduleStatus.PAUSED, ScheduleStatus.DONE, ScheduleStatus.DEAD


def test_the_transitions_of_the_contract() -> None:
    assert decide_pause("n", ACTIVE) == Transition(PAUSED)
    assert decide_pause("n", PAUSED) == Transition()
    assert decide_resume("n", PAUSED) == Transition(ACTIVE)
    assert decide_resume("n", ACTIVE) == Transition()
    # The messages callers get (tests/test_errors.py, the contract's example in celeryapp/contract.py).
    assert decide_pause("nightly", DONE).refusal == "schedule 'nightly' is done; only an active schedule can be paused"
    assert decide_resume("x", DEAD).refusal == "schedule 'x' is dead; only a paused schedule can be resumed"


def _apply(transition: Transition, status: ScheduleStatus) -> ScheduleStatus:
    assert transition.refusal is None
    return transition.to or status


@given(
    st.text(min_size=1, max_size=20), st.sampled_from(ScheduleStatus), st.sampled_from([decide_pause, decide_resume])
)
def test_pause_and_resume_only_move_between_active_and_paused_and_are_idempotent(
    name: str, status: ScheduleStatus, decide: Any
) -> None:
    transition = decide(name, status)
    if status in (DONE, DEAD):
        # Only a changed definition brings a finished schedule back; the refusal names it.
        assert transition.to is None and transition.refusal is not None and repr(name) in transition.refusal
        assert f"is {status.value};" in transition.refusal
        return
    after = _apply(transition, status)
    assert after is (PAUSED if decide is decide_pause else ACTIVE)
    assert (transition.to is None) == (after is status), "writes exactly when the status changes"
    assert decide(name, after) == Transition(), "a second call changes nothing"


@given(st.lists(st.sampled_from([decide_pause, decide_resume]), max_size=10))
def test_any_sequence_of_pauses_and_resumes_ends_as_its_last(calls: list[Any]) -> None:
    status = ACTIVE
    for decide in calls:
        status = _apply(decide("n", status), status)
    assert status is (PAUSED if calls and calls[-1] is decide_pause else ACTIVE)


def _racing(app: ChordbeatCelery, name: str, meanwhile: ScheduleStatus, decide: Any) -> Any:
    """``decide``, but its first call commits ``meanwhile`` from another transaction first, as a
    run ending the schedule or another pause would between the read and the write."""
    calls: list[ScheduleStatus] = []

    def racing(name_: str, status: ScheduleStatus) -> Transition:
        if not calls:
            with transaction(app.settings.database_url) as other:
                other.execute(update(Schedule).where(Schedule.name == name).values(status=meanwhile))
        calls.append(status)
        return decide(name_, status)  # type: ignore[no-any-return]

    return racing, calls


@pytest.mark.parametrize(
    ("decide", "start", "meanwhile", "error"),
    [
        (decide_pause, ACTIVE, DONE, "schedule 'raced' is done; only an active schedule can be paused"),
        (decide_pause, ACTIVE, PAUSED, None),
        (decide_resume, PAUSED, DEAD, "schedule 'raced' is dead; only a paused schedule can be resumed"),
        (decide_resume, PAUSED, ACTIVE, None),
    ],
)
def test_a_status_changed_between_read_and_write_is_not_overwritten(
    app: ChordbeatCelery, database_url: str, decide: Any, start: ScheduleStatus, meanwhile: ScheduleStatus, error: Any
) -> None:
    if not database_url.startswith("postgresql"):
        pytest.skip("SQLite runs one writing transaction at a time: nothing to interleave")
    service.apply_schedule(app, {"name": "raced", "every": 60, "enabled": start is ACTIVE, "steps": [step("a")]})
    racing, calls = _racing(app, "raced", meanwhile, decide)
    with transaction(app.settings.database_url) as session:
        if error is None:
            # Someone else did the same meanwhile: decided again, nothing left to write.
            schedule, changed = change_status(session, "raced", racing, now=utcnow())
            assert schedule.status is meanwhile and not changed
        else:
            with pytest.raises(InvalidTransition) as raised:
                change_status(session, "raced", racing, now=utcnow())
            assert str(raised.value) == error
    assert calls == [start, meanwhile]
    assert service.get_schedule(app, "raced")["status"] == meanwhile.value
