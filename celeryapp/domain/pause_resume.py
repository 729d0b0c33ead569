"""What pausing and resuming do to a schedule's status: the new status, nothing, or a refusal.

Pure: the caller reads the status, asks, and writes the new one with a compare-and-set on the
status it read (see :func:`celeryapp.scheduling.store.change_status`).
"""

from __future__ import annotations

from dataclasses import dataclass

from celeryapp.states import ScheduleStatus


@dataclass(frozen=True)
class Transition:
    """What a pause or a resume of a schedule in some status does."""

    #: The status to write in place of the one read; ``None``: nothing to write.
    to: ScheduleStatus | None = None
    #: Why it is not allowed (the caller's ``InvalidTransition`` message); ``None``: allowed.
    refusal: str | None = None


def decide_pause(name: str, status: ScheduleStatus) -> Transition:
    """Only an active schedule is paused; pausing a paused one changes nothing (idempotent)."""
    if status is ScheduleStatus.PAUSED:
        return Transition()
    if status is ScheduleStatus.ACTIVE:
        return Transition(ScheduleStatus.PAUSED)
    return Transition(refusal=f"schedule {name!r} is {status.value}; only an active schedule can be paused")


def decide_resume(name: str, status: ScheduleStatus) -> Transition:
    """Only a paused schedule is resumed; resuming an active one changes nothing (idempotent).
    A ``done`` or ``dead`` schedule comes back only with a changed definition."""
    if status is ScheduleStatus.ACTIVE:
        return Transition()
    if status is ScheduleStatus.PAUSED:
        return Transition(ScheduleStatus.ACTIVE)
    return Transition(refusal=f"schedule {name!r} is {status.value}; only a paused schedule can be resumed")
