"""A schedule's own DST rule (``dst``): the cron's fires on transition days, in every zone of the tz
database with a transition between 2020 and 2030, and the field as a definition gives it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import cache
from itertools import pairwise
from zoneinfo import ZoneInfo, available_timezones

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from celeryapp.domain.cadence import Cadence
from celeryapp.domain.cron import CronExpression
from celeryapp.domain.dst_rules import DstRules, Missing, Repeated
from celeryapp.interfaces.dst_notes import dst_notes

LONDON = ZoneInfo("Europe/London")
LORD_HOWE = ZoneInfo("Australia/Lord_Howe")
#: The years the zone-wide properties cover.
SCAN_START = datetime(2020, 1, 1, tzinfo=UTC)
SCAN_END = datetime(2031, 1, 1, tzinfo=UTC)
#: Every rule a schedule can give, the default (no ``dst``) first.
RULES = (
    None,
    *(DstRules(repeated=r) for r in Repeated),
    *(DstRules(missing=m) for m in Missing),
    *(DstRules(r, m) for r in Repeated for m in Missing),
)


def at(text: str, zone: ZoneInfo = UTC) -> datetime:  # type: ignore[assignment]
    return datetime.fromisoformat(text).replace(tzinfo=zone)


def fires(cron: str, zone: ZoneInfo, dst: DstRules | None, start: datetime, end: datetime) -> list[datetime]:
    """Every fire in (start, end], found one after the other as beat does."""
    out, expression = [], CronExpression.parse(cron)
    t = expression.next_after(start, zone, dst)
    while t <= end:
        out.append(t)
        t = expression.next_after(t, zone, dst)
    return out


def local(times: list[datetime], zone: ZoneInfo) -> list[str]:
    return [t.astimezone(zone).isoformat() for t in times]


# Worked cases: London repeats 01:00-01:59 on 25 October 2026 and skips 01:00-01:59 on 29 March.


def test_a_repeated_time_fires_in_the_pass_the_rule_names() -> None:
    window = at("2026-10-24T12:00"), at("2026-10-26T12:00")
    first, last, both = (fires("30 1 * * *", LONDON, DstRules(repeated=r), *window) for r in Repeated)
    assert local(first, LONDON) == ["2026-10-25T01:30:00+01:00", "2026-10-26T01:30:00+00:00"]
    assert local(last, LONDON) == ["2026-10-25T01:30:00+00:00", "2026-10-26T01:30:00+00:00"]
    assert local(both, LONDON) == [
        "2026-10-25T01:30:00+01:00",
        "2026-10-25T01:30:00+00:00",
        "2026-10-26T01:30:00+00:00",
    ]
    # Without dst: the first, as before.
    assert fires("30 1 * * *", LONDON, None, *window) == first


def test_the_rule_applies_to_hourly_patterns_too() -> None:
    window = at("2026-10-24T23:00"), at("2026-10-25T02:20")
    default = fires("15 * * * *", LONDON, None, *window)
    assert local(default, LONDON) == [
        "2026-10-25T00:15:00+01:00",
        "2026-10-25T01:15:00+01:00",
        "2026-10-25T01:15:00+00:00",
        "2026-10-25T02:15:00+00:00",
    ]
    assert fires("15 * * * *", LONDON, DstRules(repeated=Repeated.BOTH), *window) == default
    assert local(fires("15 * * * *", LONDON, DstRules(repeated=Repeated.FIRST), *window), LONDON) == [
        "2026-10-25T00:15:00+01:00",
        "2026-10-25T01:15:00+01:00",
        "2026-10-25T02:15:00+00:00",
    ]
    assert local(fires("15 * * * *", LONDON, DstRules(repeated=Repeated.LAST), *window), LONDON) == [
        "2026-10-25T00:15:00+01:00",
        "2026-10-25T01:15:00+00:00",
        "2026-10-25T02:15:00+00:00",
    ]
    # A key not given keeps the default for its case: hourly patterns still follow both passes.
    assert fires("15 * * * *", LONDON, DstRules(missing=Missing.SKIP), *window) == default


def test_from_inside_the_first_pass_last_finds_the_second_pass() -> None:
    # 01:40 BST, after the first pass's 01:30: the last pass's 01:30 is 50 real minutes later.
    first_pass = at("2026-10-25T00:40")
    assert CronExpression.parse("30 1 * * *").next_after(first_pass, LONDON, DstRules(Repeated.LAST)) == at(
        "2026-10-25T01:30"
    )
    # ... and first has passed it already: the next day's.
    assert CronExpression.parse("30 1 * * *").next_after(first_pass, LONDON, DstRules(Repeated.FIRST)) == at(
        "2026-10-26T01:30"
    )


def test_a_missing_time_shifts_to_the_transition_or_is_skipped() -> None:
    window = at("2026-03-28T12:00"), at("2026-03-30T12:00")
    shifted = fires("30 1 * * *", LONDON, DstRules(missing=Missing.SHIFT), *window)
    assert local(shifted, LONDON) == ["2026-03-29T02:00:00+01:00", "2026-03-30T01:30:00+01:00"]
    assert fires("30 1 * * *", LONDON, None, *window) == shifted
    skipped = fires("30 1 * * *", LONDON, DstRules(missing=Missing.SKIP), *window)
    assert local(skipped, LONDON) == ["2026-03-30T01:30:00+01:00"]
    # Every minute of the missing hour: one fire at the transition, or none.
    minutely = fires("* 1 * * *", LONDON, DstRules(missing=Missing.SHIFT), at("2026-03-29T00:00"), *window[1:])
    assert local(minutely[:2], LONDON) == ["2026-03-29T02:00:00+01:00", "2026-03-30T01:00:00+01:00"]
    assert (
        fires("* 1 * * *", LONDON, DstRules(missing=Missing.SKIP), at("2026-03-29T00:00"), at("2026-03-29T23:00")) == []
    )


def test_thirty_minute_changes() -> None:
    # Lord Howe skips 02:00-02:29 on 4 October 2026 and repeats 01:30-01:59 on 5 April.
    assert (
        fires("15 2 * * *", LORD_HOWE, DstRules(missing=Missing.SKIP), at("2026-10-03T12:00"), at("2026-10-04T12:00"))
        == []
    )
    window = at("2026-04-04T12:00"), at("2026-04-05T12:00")
    assert local(fires("45 1 * * *", LORD_HOWE, DstRules(Repeated.LAST), *window), LORD_HOWE) == [
        "2026-04-05T01:45:00+10:30"
    ]


def test_the_cadence_carries_the_rule() -> None:
    cadence = Cadence(
        cron="30 1 * * *", every_s=None, timezone="Europe/London", anchor=SCAN_START, dst=DstRules(Repeated.LAST)
    )
    assert cadence.slot_after(at("2026-10-24T12:00")) == at("2026-10-25T01:30")
    slots, more = cadence.slots_between(at("2026-10-24T12:00"), at("2026-10-26T12:00"), cap=10)
    assert local(slots, LONDON) == ["2026-10-25T01:30:00+00:00", "2026-10-26T01:30:00+00:00"] and not more
    skip = Cadence(
        cron="30 1 * * *", every_s=None, timezone="Europe/London", anchor=SCAN_START, dst=DstRules(missing=Missing.SKIP)
    )
    assert skip.latest_slot(at("2026-03-29T12:00"), since=at("2026-03-28T12:00")) is None


# Every zone with a transition between 2020 and 2030.


@cache
def transitions() -> list[tuple[str, datetime, timedelta, timedelta]]:
    """(zone, instant, offset before, offset after) of every change of UTC offset in the scanned
    years, found by scanning the offsets day by day (no zone changes twice in a day) and halving."""
    found = []
    for name in sorted(available_timezones()):
        zone = ZoneInfo(name)
        day, offset = SCAN_START, SCAN_START.astimezone(zone).utcoffset()
        while day < SCAN_END:
            later = day + timedelta(days=1)
            changed = later.astimezone(zone).utcoffset()
            if changed != offset:
                low, high = day, later
                while high - low > timedelta(seconds=1):
                    mid = low + (high - low) / 2
                    low, high = (low, mid) if mid.astimezone(zone).utcoffset() == changed else (mid, high)
                assert offset is not None and changed is not None
                found.append((name, high.replace(microsecond=0), offset, changed))
            day, offset = later, changed
    return found


def stretch(before: timedelta, after: timedelta, instant: datetime) -> tuple[datetime, datetime]:
    """The naive wall times the change skips or repeats: [first, end)."""
    old, new = (instant + before).replace(tzinfo=None), (instant + after).replace(tzinfo=None)
    return min(old, new), max(old, new)


def wall_points(before: timedelta, after: timedelta, instant: datetime, *, edges: bool) -> list[datetime]:
    """Naive wall times, whole minutes, inside the stretch the change skips or repeats: its middle
    minute, and with ``edges`` its first and last ones too."""
    low, high = stretch(before, after, instant)
    middle = (low + (high - low) / 2).replace(second=0, microsecond=0)
    return sorted({low, middle, high - timedelta(minutes=1)}) if edges else [middle]


def test_the_scan_finds_the_zones_it_must() -> None:
    zones = {name for name, *_ in transitions()}
    assert {"Europe/London", "America/New_York", "Australia/Lord_Howe", "Antarctica/Troll", "America/Santiago"} <= zones
    assert "UTC" not in zones and "Asia/Tokyo" not in zones
    assert len(zones) > 200  # 2026f: 226 zones, 4,518 changes


def check_transition(name: str, instant: datetime, before: timedelta, after: timedelta, *, edges: bool) -> None:
    zone = ZoneInfo(name)
    gap = after > before
    low, high = stretch(before, after, instant)
    minutes = [low + timedelta(minutes=k) for k in range(int((high - low) / timedelta(minutes=1)))]
    for wall in wall_points(before, after, instant, edges=edges):
        for cron in (f"{wall.minute} {wall.hour} * * *", f"{wall.minute} * * * *"):
            every_hour = cron.split()[1] == "*"
            # The day before and after for a daily cron, a few hours around for an hourly one.
            around = abs(after - before) + (timedelta(hours=2) if every_hour else timedelta(days=1))
            start, end = instant - around, instant + around
            # The cron's wall times inside the stretch (an hourly one has two in a 2-hour change).
            inside = [m for m in minutes if m.minute == wall.minute and (every_hour or m.hour == wall.hour)]
            passes = [((m - before).replace(tzinfo=UTC), (m - after).replace(tzinfo=UTC)) for m in inside]
            on_time = instant.astimezone(zone)  # the wall time the clocks jump to: a fire of its own?
            real = on_time.minute == wall.minute and (every_hour or on_time.hour == wall.hour)
            affected = {instant} if gap else {t for pair in passes for t in pair}
            default = fires(cron, zone, None, start, end)
            for dst in RULES:
                got = fires(cron, zone, dst, start, end)
                where = f"{cron!r} in {name} at {wall} ({'gap' if gap else 'repeat'}) with {dst}"
                assert all(a < b for a, b in pairwise(got)), where
                # Off the transition's stretch every rule agrees with the default.
                assert [t for t in got if t not in affected] == [t for t in default if t not in affected], where
                rules = dst or DstRules()
                if gap:
                    # The missing times fire once at the transition by the shift rule, not at all by
                    # skip (unless the wall time the clocks jump to is the cron's own).
                    expected = [instant] if real or rules.missing is not Missing.SKIP else []
                else:
                    repeated = rules.repeated or (Repeated.BOTH if every_hour else Repeated.FIRST)
                    index = {Repeated.FIRST: (0,), Repeated.LAST: (1,), Repeated.BOTH: (0, 1)}[repeated]
                    expected = sorted(pair[i] for pair in passes for i in index)
                assert [t for t in got if t in affected] == expected, where


@pytest.mark.timeout(120)
def test_every_zone_and_transition_follows_the_rules() -> None:
    """Each change between 2020 and 2030 of each zone: a daily and an hourly cron at the middle
    minute of the skipped or repeated stretch (and at its first and last minutes for each zone's
    first gap and first repeat), by every rule, around it."""
    seen: set[tuple[str, bool]] = set()
    for name, instant, before, after in transitions():
        first_of_kind = (name, after > before) not in seen
        seen.add((name, after > before))
        check_transition(name, instant, before, after, edges=first_of_kind)


@st.composite
def around_a_transition(draw: st.DrawFn) -> tuple[str, datetime, str]:
    name, instant, _, _ = draw(st.sampled_from(transitions()))
    minutes = draw(st.sets(st.integers(0, 59), min_size=1, max_size=4))
    hours = draw(
        st.one_of(
            st.just("*"),
            st.just("*/2"),
            st.sets(st.integers(0, 23), min_size=1, max_size=3).map(lambda hs: ",".join(map(str, sorted(hs)))),
        )
    )
    return name, instant, f"{','.join(map(str, sorted(minutes)))} {hours} * * *"


@settings(derandomize=True, max_examples=300, deadline=None)
@given(around_a_transition())
def test_the_rules_relate_as_sets(case: tuple[str, datetime, str]) -> None:
    """Any cron near any change: ``both`` fires exactly what ``first`` and ``last`` fire together,
    and ``skip`` exactly what ``shift`` fires but for the shifted fires at the transition."""
    name, instant, cron = case
    zone = ZoneInfo(name)
    start, end = instant - timedelta(days=1), instant + timedelta(days=1)

    def of(dst: DstRules) -> list[datetime]:
        got = fires(cron, zone, dst, start, end)
        assert all(a < b for a, b in pairwise(got))
        return got

    first, last, both = (set(of(DstRules(repeated=r))) for r in Repeated)
    assert both == first | last
    shifted, skipped = of(DstRules(missing=Missing.SHIFT)), of(DstRules(missing=Missing.SKIP))
    # The wall time the clocks move to at the change: a fire of the cron's own whatever the rule?
    wall, expression = instant.astimezone(zone), CronExpression.parse(cron)
    own = wall.minute in expression.minutes and wall.hour in expression.hours
    assert set(skipped) == set(shifted) - (set() if own else {instant})


@pytest.mark.parametrize("dst", RULES)
def test_next_after_always_moves_on(dst: DstRules | None) -> None:
    """From every second around a change, the next fire is later (never the same instant again)."""
    expression = CronExpression.parse("*/20 * * * *")
    t = at("2026-10-25T00:00")
    while t < at("2026-10-25T02:30"):
        assert expression.next_after(t, LONDON, dst) > t
        t += timedelta(seconds=37)
    assert expression.next_after(at("2026-03-29T00:59:59"), LONDON, dst) > at("2026-03-29T00:59:59")


# The previews' words for what the rule did on a day the clocks change.


def notes(cron: str, dst: DstRules | None, after: str, count: int) -> list[tuple[str, str | None]]:
    times = CronExpression.parse(cron).upcoming(at(after), LONDON, count, dst)
    return list(zip(local(times, LONDON), dst_notes(cron, LONDON, dst, at(after), times), strict=True))


def test_the_preview_says_which_pass_a_repeated_time_runs_in() -> None:
    assert notes("30 1 * * *", None, "2026-10-24T12:00", 2) == [
        (
            "2026-10-25T01:30:00+01:00",
            "01:30 happens twice on 2026-10-25; runs once, in the first pass (default: first)",
        ),
        ("2026-10-26T01:30:00+00:00", None),
    ]
    assert notes("30 1 * * *", DstRules(Repeated.LAST), "2026-10-24T12:00", 1) == [
        (
            "2026-10-25T01:30:00+00:00",
            "01:30 happens twice on 2026-10-25; runs once, in the second pass (dst.repeated: last)",
        )
    ]
    both = "01:00 happens twice on 2026-10-25; runs in both passes, this is the"
    assert notes("0 * * * *", None, "2026-10-24T23:30", 3) == [
        ("2026-10-25T01:00:00+01:00", f"{both} first (default: both)"),
        ("2026-10-25T01:00:00+00:00", f"{both} second (default: both)"),
        ("2026-10-25T02:00:00+00:00", None),
    ]


def test_the_preview_says_where_a_missing_time_went() -> None:
    assert notes("30 1 * * *", None, "2026-03-28T12:00", 2) == [
        (
            "2026-03-29T02:00:00+01:00",
            "01:30 does not happen on 2026-03-29; runs at 02:00, when the clocks go forward (default: shift)",
        ),
        ("2026-03-30T01:30:00+01:00", None),
    ]
    skipped = "01:30 does not happen on 2026-03-29; not run (dst.missing: skip)"
    assert notes("30 1 * * *", DstRules(missing=Missing.SKIP), "2026-03-28T12:00", 2) == [
        ("2026-03-30T01:30:00+01:00", skipped),
        ("2026-03-31T01:30:00+01:00", None),
    ]
    # Many wall times are said as a range; the wall time the clocks move to may be the cron's own.
    many = "4 times from 01:00 to 01:45 do not happen on 2026-03-29"
    assert notes("*/15 * * * *", DstRules(missing=Missing.SKIP), "2026-03-29T00:40", 2) == [
        ("2026-03-29T00:45:00+00:00", None),
        ("2026-03-29T02:00:00+01:00", f"{many}; not run (dst.missing: skip)"),
    ]
    assert notes("*/15 * * * *", None, "2026-03-29T00:50", 1) == [
        ("2026-03-29T02:00:00+01:00", f"{many}; runs at 02:00, when the clocks go forward (default: shift)")
    ]
    assert notes("0,20 1 * * *", None, "2026-03-28T12:00", 1)[0][1] == (
        "01:00 and 01:20 do not happen on 2026-03-29; runs at 02:00, when the clocks go forward (default: shift)"
    )


def test_no_note_off_transition_days_or_for_intervals() -> None:
    assert all(note is None for _, note in notes("30 1 * * *", DstRules(Repeated.BOTH, Missing.SKIP), "2026-06-01", 60))
    assert dst_notes(None, LONDON, None, at("2026-10-24T12:00"), [at("2026-10-25T01:30")]) == [None]
