"""When a slot's run must have started and finished, and when a run in progress is expected to end.

Pure: every instant is passed in. A schedule's ``deadlines`` (celeryapp/domain/alert_fields.py
validates them) give ``start_within`` and ``finish_within`` (seconds after the nominal slot) and
``finish_by`` (a wall clock ``HH:MM`` in the schedule's zone). The finish deadline is the earliest
of slot + ``finish_within`` and the first ``finish_by`` after the slot.

``finish_by`` on the days clocks change (the rule is "the first moment after the slot at which a
wall clock in the zone shows HH:MM"):

- spring forward, HH:MM in the skipped hour (02:30 in New York on a March Sunday): the clock never
  shows it; the deadline is the moment the clocks jump past it (03:00 EDT, 07:00 UTC);
- fall back, HH:MM in the repeated hour (01:30 in New York on a November Sunday): the first time
  the clock shows it after the slot: its first occurrence (01:30 EDT) for a slot before that,
  the second (01:30 EST, an hour later) for a slot between the two.

Expected finish of a run in progress: the median of the durations of the schedule's last
:data:`RECENT_RUNS` completed runs that are longer than the run has been running so far, added to
its start; at least :data:`MIN_RUNS` completed runs are needed, else nothing is predicted. A run
that has outlasted all of them is expected now: no evidence says how much longer, and its finish
deadline reports it when it passes. Conditioning on the time already run keeps a run that is past
the typical duration from being expected to have finished in the past.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from celeryapp.domain.cadence import Cadence
from celeryapp.domain.calendars import MAX_BUSINESS_DAY_SEARCH_DAYS, Calendar, slot_excluded

#: Completed runs whose durations predict a run's finish (the newest ones).
RECENT_RUNS = 10
#: Fewer completed runs than this predict nothing (one slow or quick run is no pattern).
MIN_RUNS = 3
#: A ``finish_by`` is at most this long after its slot: a day, plus an hour a clock change adds
#: (and Samoa's skipped day of 2011).
FINISH_BY_MAX_S = 49 * 3600.0
_TICK = timedelta(microseconds=1)


def wall_time(text: str) -> time:
    """``HH:MM`` as validated when the definition was applied."""
    hours, _, minutes = text.partition(":")
    return time(int(hours), int(minutes))


def start_deadline(slot: datetime, start_within_s: float | None) -> datetime | None:
    """By when the slot's run must have started."""
    return None if start_within_s is None else slot + timedelta(seconds=start_within_s)


def finish_deadline(
    slot: datetime, *, finish_within_s: float | None, finish_by: str | None, zone: str
) -> datetime | None:
    """By when the slot's run must have finished: the earliest of its finish deadlines."""
    found = []
    if finish_within_s is not None:
        found.append(slot + timedelta(seconds=finish_within_s))
    if finish_by is not None:
        found.append(finish_by_after(slot, wall_time(finish_by), zone))
    return min(found) if found else None


def last_slot_due(now: datetime, *, finish_within_s: float | None, finish_by: str | None, zone: str) -> datetime | None:
    """The latest slot whose finish deadline has passed by ``now``: every slot at or before it
    has its deadline at or before ``now``, every later one after it (``None``: no finish deadline)."""
    found = []
    if finish_within_s is not None:
        found.append(now - timedelta(seconds=finish_within_s))
    if finish_by is not None:
        # A slot strictly before the last HH:MM shown has its first HH:MM after it at or before that.
        found.append(finish_by_before(now, wall_time(finish_by), zone) - _TICK)
    return max(found) if found else None


def longest_s(start_within_s: float | None, finish_within_s: float | None, finish_by: str | None) -> float:
    """The longest a slot's deadlines can lie after it, in seconds."""
    spans = [start_within_s or 0.0, finish_within_s or 0.0]
    if finish_by is not None and finish_within_s is None:
        spans.append(FINISH_BY_MAX_S)
    return max(spans)


def finish_by_after(slot: datetime, wall: time, zone: str) -> datetime:
    """The first moment strictly after ``slot`` at which a clock in ``zone`` shows ``wall`` (the
    moment it jumps past it, when a spring-forward gap skips it); UTC."""
    tz = ZoneInfo(zone)
    local_day = slot.astimezone(tz).date()
    # From the day before (a skipped hour's jump may fall just after the slot on the local date
    # before it) to the day after next (Samoa skipped 2011-12-30 entirely).
    for offset in range(-1, 3):
        for instant in wall_instants(local_day + timedelta(days=offset), wall, tz):
            if instant > slot:
                return instant
    raise AssertionError(f"no {wall} in {zone} within three days of {slot}")  # every day has one


def finish_by_before(now: datetime, wall: time, zone: str) -> datetime:
    """The last moment at or before ``now`` at which a clock in ``zone`` showed ``wall`` (or jumped
    past it); UTC."""
    tz = ZoneInfo(zone)
    local_day = now.astimezone(tz).date()
    for offset in range(1, -3, -1):
        shown = [i for i in wall_instants(local_day + timedelta(days=offset), wall, tz) if i <= now]
        if shown:
            return shown[-1]
    raise AssertionError(f"no {wall} in {zone} within three days before {now}")  # every day has one


def wall_instants(day: date, wall: time, tz: ZoneInfo) -> list[datetime]:
    """The instants (UTC, in order) a clock in ``tz`` shows ``wall`` on ``day``: one, two in a
    repeated hour, or, in a skipped one, the moment the clock jumps past it."""
    naive = datetime.combine(day, wall)
    shown = []
    for fold in (0, 1):
        instant = naive.replace(tzinfo=tz, fold=fold).astimezone(UTC)
        if instant.astimezone(tz).replace(tzinfo=None) == naive:
            shown.append(instant)
    if shown:
        return sorted(set(shown))
    # Skipped: fold=0 reads it with the offset before the jump, fold=1 with the one after; the
    # jump lies between them. The first whole second whose clock shows a time past it.
    ends = sorted(naive.replace(tzinfo=tz, fold=fold).astimezone(UTC) for fold in (0, 1))
    low, high = (int(end.timestamp()) for end in ends)
    while high - low > 1:
        middle = (low + high) // 2
        if _shows(middle, tz) >= naive:
            high = middle
        else:
            low = middle
    return [datetime.fromtimestamp(high, UTC)]


def _shows(epoch_s: int, tz: ZoneInfo) -> datetime:
    """What a clock in ``tz`` shows at ``epoch_s``."""
    return datetime.fromtimestamp(epoch_s, tz).replace(tzinfo=None)


def expected_finish(started_at: datetime, now: datetime, durations_s: Iterable[float]) -> datetime | None:
    """When a run started at ``started_at`` is expected to finish, from the durations of the
    schedule's recent completed runs (newest first; the first :data:`RECENT_RUNS` are used);
    ``None`` with fewer than :data:`MIN_RUNS`. Never before ``now``."""
    recent = [d for d in list(durations_s)[:RECENT_RUNS] if d >= 0]
    if len(recent) < MIN_RUNS:
        return None
    ran_s = (now - started_at).total_seconds()
    longer = [d for d in recent if d > ran_s]
    if not longer:
        return now
    return max(now, started_at + timedelta(seconds=statistics.median(longer)))


def newest_slots(cadence: Cadence, *, since: datetime, until: datetime, cap: int) -> list[datetime]:
    """The newest ``cap`` nominal slots in [since, until], newest first. Found backwards, so a
    schedule left unfired for a month costs ``cap`` look-ups, not one per slot."""
    found: list[datetime] = []
    end = until
    while len(found) < cap:
        slot = cadence.latest_slot(end, since=since - _TICK)
        if slot is None:
            break
        found.append(slot)
        end = slot - _TICK
    return found


def first_running_slot(
    cadence: Cadence, first: datetime, *, until: datetime, calendar: Calendar | None
) -> datetime | None:
    """The first slot in [first, until] whose day ``calendar`` does not exclude (no run is expected
    on an excluded day), or ``None``. An excluded day costs one look-up, not one per slot: the
    search goes on from the next midnight on the schedule's wall clock."""
    if calendar is None:
        return first if first <= until else None
    zone = ZoneInfo(cadence.timezone)
    slot = first
    for _ in range(MAX_BUSINESS_DAY_SEARCH_DAYS + 1):
        if slot > until:
            return None
        if slot_excluded(slot, zone, calendar) is None:
            return slot
        day = slot.astimezone(zone).date() + timedelta(days=1)
        midnight = datetime.combine(day, time(0), tzinfo=zone).astimezone(UTC)
        slot = cadence.slot_after(max(midnight - _TICK, slot))
    return None
