"""What a schedule's DST rule did to its coming fires, in words, for the previews (``next_fires``,
``chordbeat next`` and ``show``, the dashboard): on a day the clocks change, a fire at a wall time
that happens twice says which pass it is and why, a fire moved to the transition says from where,
and the first fire after a skipped wall time says it was skipped.

Pure: the caller passes the fires and the instant they follow.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from celeryapp.domain.cron import CronExpression
from celeryapp.domain.dst_rules import DEFAULT, DstRules, Missing, Repeated

#: Wall times a note names one by one; more are said as a range and a count.
NAMED_TIMES = 3
_PASS = {0: "first", 1: "second"}


def dst_notes(
    cron: str | None, zone: ZoneInfo, dst: DstRules | None, after: datetime, times: list[datetime]
) -> list[str | None]:
    """For each of ``times`` (a cron's consecutive fires after ``after``), what the DST rule did,
    or ``None`` where it did nothing (every fire of an interval schedule)."""
    if cron is None:
        return [None] * len(times)
    expression, rules = CronExpression.parse(cron), dst or DEFAULT
    notes: list[str | None] = []
    previous = after
    for at in times:
        said = [_repeated(expression, zone, rules, at), _shifted(expression, zone, rules, at)]
        if rules.skips_missing:
            said.append(_skipped(expression, zone, rules, previous, at))
        notes.append("; ".join(note for note in said if note) or None)
        previous = at
    return notes


def _repeated(expression: CronExpression, zone: ZoneInfo, rules: DstRules, at: datetime) -> str | None:
    wall = at.astimezone(zone)
    if wall.replace(fold=1 - wall.fold).utcoffset() == wall.utcoffset():
        return None
    chosen = rules.repeated or (Repeated.BOTH if expression.every_hour else Repeated.FIRST)
    which = {
        Repeated.FIRST: "runs once, in the first pass",
        Repeated.LAST: "runs once, in the second pass",
        Repeated.BOTH: f"runs in both passes, this is the {_PASS[wall.fold]}",
    }[chosen]
    source = f"dst.repeated: {chosen}" if rules.repeated else f"default: {chosen}"
    return f"{wall:%H:%M} happens twice on {wall:%Y-%m-%d}; {which} ({source})"


def _missing_times(expression: CronExpression, zone: ZoneInfo, at: datetime) -> list[datetime]:
    """The cron's wall times the clocks skip at ``at``, if it is a change forward."""
    before, after = (at - timedelta(seconds=1)).astimezone(zone).utcoffset(), at.astimezone(zone).utcoffset()
    if before is None or after is None or after <= before:
        return []
    start = (at + before).replace(tzinfo=None)
    return expression.wall_times(start, (at + after).replace(tzinfo=None))


def _shifted(expression: CronExpression, zone: ZoneInfo, rules: DstRules, at: datetime) -> str | None:
    missing = _missing_times(expression, zone, at)
    if not missing or rules.skips_missing:
        return None
    source = "dst.missing: shift" if rules.missing else "default: shift"
    wall = at.astimezone(zone)
    return (
        f"{_named(missing)} {_do(missing)} not happen on {missing[0]:%Y-%m-%d}; runs at {wall:%H:%M},"
        f" when the clocks go forward ({source})"
    )


def _skipped(
    expression: CronExpression, zone: ZoneInfo, rules: DstRules, previous: datetime, at: datetime
) -> str | None:
    # The shift rule's first fire after ``previous``: the transition, if the clocks skipped any of
    # the cron's wall times before ``at`` (or at it, when the wall time they move to is the cron's).
    shifted = expression.next_after(previous, zone, replace(rules, missing=Missing.SHIFT))
    if shifted > at:
        return None
    missing = _missing_times(expression, zone, shifted)
    if not missing:
        return None
    return f"{_named(missing)} {_do(missing)} not happen on {missing[0]:%Y-%m-%d}; not run (dst.missing: skip)"


def _do(times: list[datetime]) -> str:
    return "does" if len(times) == 1 else "do"


def _named(times: list[datetime]) -> str:
    shown = [f"{t:%H:%M}" for t in times]
    if len(shown) > NAMED_TIMES:
        return f"{len(shown)} times from {shown[0]} to {shown[-1]}"
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} and {shown[-1]}"
