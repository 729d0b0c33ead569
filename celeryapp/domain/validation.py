"""Schedule definitions from the contract's JSON: every field checked before anything is stored.

Every error names the field and the reason. Every number has a range and every size a cap
(celeryapp/domain/limits.py), and the cadence is computed here once, so nothing stored can fail
later. The steps are read by :mod:`celeryapp.domain.step_validation`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from celeryapp.domain import limits
from celeryapp.domain.alert_fields import (
    KnownChannels,
    check_known_channels,
    check_late_has_deadlines,
    parse_alerts,
    parse_deadlines,
    read_once,
)
from celeryapp.domain.cadence import Cadence, retry_delay_s
from celeryapp.domain.calendar_fields import CalendarReader, check_known_calendars, parse_calendar_field
from celeryapp.domain.catchup_fields import parse_catchup_field
from celeryapp.domain.cron import CronExpression
from celeryapp.domain.cron_fields import CronError
from celeryapp.domain.definition import (
    ALL_STEP_FIELDS,
    DEFAULT_RETRY_DELAY_S,
    MAX_ZONE_CHARS,
    NAME_PATTERN,
    SCHEDULE_FIELDS,
    ScheduleDefinition,
)
from celeryapp.domain.dst_fields import parse_dst_field
from celeryapp.domain.fields import (
    bool_field,
    int_field,
    json_field,
    refuse_unknown,
    require_mapping,
    seconds_field,
    string_field,
)
from celeryapp.domain.limits import MAX_JSON_BYTES, short_repr, type_name
from celeryapp.domain.problems import Problems
from celeryapp.domain.shared_limits import check_combined_uses, parse_uses
from celeryapp.domain.step_policy import StepRules
from celeryapp.domain.step_validation import check_step_counts, parse_groups
from celeryapp.domain.zones import canonical_zone_problem
from celeryapp.errors import DefinitionError
from celeryapp.states import Overlap

#: Rules for a definition checked with none given.
_NO_POLICY = StepRules.without_policy()


def _check_size(raw: Mapping[str, Any]) -> None:
    """The whole definition's size, checked before it is walked field by field. When one part is
    over its own cap, the error names that part."""
    try:
        size = limits.json_size(raw)
    except (RecursionError, ValueError):
        return  # the field-by-field checks find and name what is wrong
    if size <= limits.MAX_DEFINITION_BYTES:
        return
    for path, part in _parts(raw):
        try:
            part_size = limits.json_size(part)
        except (RecursionError, ValueError):
            continue
        if part_size > MAX_JSON_BYTES:
            raise DefinitionError(path, f"is {part_size} bytes of JSON, more than {MAX_JSON_BYTES}")
    raise DefinitionError("definition", f"is {size} bytes of JSON, more than {limits.MAX_DEFINITION_BYTES}")


def _parts(raw: Mapping[str, Any]) -> list[tuple[str, Any]]:
    parts: list[tuple[str, Any]] = [(key, raw[key]) for key in sorted(SCHEDULE_FIELDS - {"steps"}) if key in raw]
    steps = raw.get("steps")
    if isinstance(steps, list):
        for index, group in enumerate(steps):
            members = enumerate(group) if isinstance(group, list) else [(None, group)]
            for position, step in members:
                path = f"steps[{index}]" if position is None else f"steps[{index}][{position}]"
                if isinstance(step, Mapping):
                    parts.extend((f"{path}.{key}", step[key]) for key in sorted(ALL_STEP_FIELDS) if key in step)
    return parts


def _schedule_name(raw: Mapping[str, Any]) -> str:
    name = string_field(raw, "name", "name", required=True)
    assert name is not None
    if not NAME_PATTERN.fullmatch(name):
        raise DefinitionError(
            "name",
            "must start with a letter or digit and hold only letters, digits, '.', '_' and '-' "
            f"(at most {limits.MAX_NAME_CHARS} characters), got {short_repr(name)}",
        )
    return name


def _timezone(raw: Mapping[str, Any]) -> tuple[str, ZoneInfo]:
    timezone = string_field(raw, "timezone", "timezone") or "UTC"
    problem = (
        f"must be at most {MAX_ZONE_CHARS} characters"
        if len(timezone) > MAX_ZONE_CHARS
        else canonical_zone_problem(timezone)
    )
    if problem is not None:
        raise DefinitionError("timezone", problem)
    try:
        return timezone, ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise DefinitionError("timezone", f"{timezone!r} is not an IANA time zone name") from None


def _cadence(raw: Mapping[str, Any]) -> tuple[str | None, float | None]:
    cron = raw.get("cron")
    every = raw.get("every")
    if (cron is None) == (every is None):
        raise DefinitionError("cron", "exactly one of 'cron' and 'every' is required")
    if cron is None:
        return None, seconds_field(raw, "every", "every", None, low=limits.MIN_EVERY_S, high=limits.MAX_EVERY_S)
    if not isinstance(cron, str):
        raise DefinitionError("cron", f"must be a string, got {type_name(cron)}")
    if len(cron) > limits.MAX_CRON_CHARS:
        raise DefinitionError("cron", f"must be at most {limits.MAX_CRON_CHARS} characters, got {len(cron)}")
    try:
        return CronExpression.parse(cron).text, None
    except CronError as exc:
        raise DefinitionError("cron", str(exc)) from None


def _check_fire_times(definition: ScheduleDefinition, now: datetime) -> None:
    """Compute, once, every instant the stored schedule will need, the way beat, firing and
    retries compute them: what passes here cannot fail later."""
    field_name = "cron" if definition.cron is not None else "every"
    try:
        cadence = Cadence(definition.cron, definition.every_s, definition.timezone, anchor=now, dst=definition.dst)
        first = cadence.slot_after(now)
        second = cadence.slot_after(first)
        cadence.latest_slot(second, since=now)
        # The farthest instants a retry and the execution's deadline will ask for.
        longest_retry = retry_delay_s(definition.retry_base_s, max(definition.max_retries, 1))
        _ = now + timedelta(seconds=longest_retry), now + timedelta(seconds=definition.timeout_s or 0)
    except (CronError, ArithmeticError, ValueError) as exc:
        raise DefinitionError(field_name, f"its fire times cannot be computed ({exc})") from None


def _overlap(raw: Mapping[str, Any]) -> Overlap:
    overlap_raw = raw.get("overlap", Overlap.SKIP.value)
    try:
        return Overlap(overlap_raw)
    except ValueError:
        choices = ", ".join(o.value for o in Overlap)
        raise DefinitionError("overlap", f"must be one of {choices}, got {short_repr(overlap_raw)}") from None


def _payload(raw: Mapping[str, Any]) -> dict[str, Any]:
    payload = raw.get("payload", {})
    if payload is None:
        return {}
    if not isinstance(payload, Mapping):
        raise DefinitionError("payload", f"must be an object, got {type_name(payload)}")
    json_field(payload, "payload")
    return dict(payload)


def parse_definition(
    raw: Any,
    *,
    rules: StepRules | None = None,
    channels: KnownChannels | None = None,
    calendars: CalendarReader | None = None,
    now: datetime | None = None,
) -> ScheduleDefinition:
    """Validate a definition object; raise one :class:`DefinitionError` naming every bad field.

    ``rules`` are the workers' (which tasks are registered, the operator's policy); ``None``
    checks only what holds whatever the settings (:meth:`StepRules.without_policy`).
    ``channels``: the deployment's alert channels, which ``alerts.channels`` must be among;
    ``None`` leaves them unchecked (the definition alone). ``calendars`` reads the named calendars
    of ``CHORDBEAT_CALENDARS_DIR``, each of which must be readable; ``None`` leaves them unchecked.
    """
    raw = require_mapping(raw, "definition")
    # The caps first, and alone: past them, walking the definition is the cost they prevent.
    check_step_counts(raw.get("steps"))
    _check_size(raw)
    problems = Problems()
    problems.check(refuse_unknown, raw, SCHEDULE_FIELDS, "")
    name = problems.check(_schedule_name, raw)
    zone = problems.check(_timezone, raw)
    cadence = problems.check(_cadence, raw)
    overlap = problems.check(_overlap, raw)
    payload = problems.check(_payload, raw)
    steps = problems.check(parse_groups, raw.get("steps"), rules or _NO_POLICY)
    enabled = problems.check(bool_field, raw, "enabled", "enabled", True)
    max_retries = problems.check(int_field, raw, "max_retries", "max_retries", 0, low=0, high=limits.MAX_RETRIES)
    retry_delay_s = problems.check(
        seconds_field,
        raw,
        "retry_delay",
        "retry_delay",
        DEFAULT_RETRY_DELAY_S,
        low=limits.MIN_RETRY_DELAY_S,
        high=limits.MAX_RETRY_DELAY_S,
    )
    total_repeats = problems.check(
        int_field, raw, "total_repeats", "total_repeats", 0, low=0, high=limits.MAX_TOTAL_REPEATS
    )
    timeout_s = problems.check(
        seconds_field, raw, "timeout", "timeout", None, low=limits.MIN_TIMEOUT_S, high=limits.MAX_TIMEOUT_S
    )
    deadlines = problems.check(parse_deadlines, raw)
    alerts = problems.check(parse_alerts, raw)
    if not problems.failed("deadlines", "alerts"):
        problems.check(check_late_has_deadlines, raw, alerts, deadlines)
        if channels is not None:
            problems.check(check_known_channels, alerts, channels)
    calendar = problems.check(parse_calendar_field, raw)
    if calendars is not None and not problems.failed("calendar"):
        problems.check(check_known_calendars, calendar, calendars)
    catchup = problems.check(parse_catchup_field, raw)
    dst = problems.check(parse_dst_field, raw)
    uses = problems.check(parse_uses, raw.get("uses"), "uses")
    problems.raise_any()
    # Every check passed: none of these is None (timeout_s may be: no timeout).
    assert name and zone and cadence and overlap and payload is not None and steps and enabled is not None
    assert max_retries is not None and total_repeats is not None and uses is not None
    definition = ScheduleDefinition(
        name=name,
        groups=steps[0],
        group_is_list=steps[1],
        cron=cadence[0],
        every_s=cadence[1],
        timezone=zone[0],
        enabled=enabled,
        overlap=overlap,
        max_retries=max_retries,
        retry_delay_s=retry_delay_s or DEFAULT_RETRY_DELAY_S,
        total_repeats=total_repeats,
        timeout_s=timeout_s,
        payload=payload,
        deadlines=deadlines,
        alerts=alerts,
        calendar=calendar,
        catchup=catchup,
        dst=dst,
        uses=uses,
    )
    check_combined_uses(definition)
    size = limits.json_size(definition.to_json())
    if size > limits.MAX_DEFINITION_BYTES:
        raise DefinitionError("definition", f"is {size} bytes of JSON, more than {limits.MAX_DEFINITION_BYTES}")
    # Needs a valid zone and cadence, so only checked once every field passed.
    _check_fire_times(definition, now or datetime.now(UTC))
    return definition


def parse_definitions(
    items: Sequence[Any],
    *,
    rules: StepRules | None = None,
    channels: KnownChannels | None = None,
    calendars: CalendarReader | None = None,
) -> list[ScheduleDefinition]:
    """Validate a list of definitions (a schedule file); errors say which schedule is wrong.

    Every error of every schedule is reported at once (up to ``MAX_REPORTED_ERRORS``), so
    fixing a file takes one try, not one per mistake.
    """
    parsed: list[ScheduleDefinition] = []
    names: set[str] = set()
    problems = Problems()
    channels = read_once(channels) if channels is not None else None
    for index, raw in enumerate(items):
        label = raw.get("name") if isinstance(raw, Mapping) else None
        # Only a valid name labels the place: an invalid one may be huge or hold control characters.
        shown_label = isinstance(label, str) and NAME_PATTERN.fullmatch(label)
        problems.prefix = f"schedules[{index}]" + (f" ({label})" if shown_label else "") + "."
        definition = problems.check(parse_definition, raw, rules=rules, channels=channels, calendars=calendars)
        if definition is None:
            continue
        if definition.name in names:
            problems.add(DefinitionError("name", f"schedule {definition.name!r} appears twice"))
        names.add(definition.name)
        parsed.append(definition)
    problems.raise_any()
    return parsed
