"""The service tasks as other services call them: their parameters, what they answer in words (the
README's table), the errors they raise on purpose, and the header that marks the CLI's calls. The
answers' types are in :mod:`celeryapp.answer_shapes`.

Standard library only: :mod:`celeryapp.client` imports it, and a caller needs nothing but ``celery``.
"""

from __future__ import annotations

from typing import NamedTuple

#: The message header by which a call claims to be the CLI's (``chordbeat-source`` spelled as an
#: identifier: Celery hands custom headers to the task as request attributes). Never believed:
#: the row's source is ``service`` and the claim is kept in its detail as ``claimed_source``.
SOURCE_HEADER = "chordbeat_source"


class CallerError(NamedTuple):
    """An error a service task raises to its caller: ``exc_type`` and message are the contract."""

    exc_type: str
    #: The class it derives from besides ``ChordbeatError`` (what a Python caller can catch).
    builtin: str | None
    when: str
    message: str


#: Every error a service task raises on purpose. Anything else is a fault (the database or broker
#: is unreachable, or a bug), not an answer about the caller's input.
CALLER_ERRORS = (
    CallerError(
        "InvalidArgument",
        "ValueError",
        "an argument is missing, unknown, of the wrong type, or out of range (any task)",
        "`<argument>: <reason>`, e.g. `execution_id: must be an integer (an execution id), got boolean`",
    ),
    CallerError(
        "DefinitionError",
        "ValueError",
        "`apply_schedule`'s (or `apply_limit`'s) definition is invalid; nothing is stored",
        "`<field>: <reason>`, the field as a path, e.g. `steps[1].timeout: must be a number of seconds, got string`",
    ),
    CallerError(
        "NotFound",
        "LookupError",
        "the schedule, execution (or limit) named does not exist",
        "`schedule 'nightly' does not exist`, `execution 17 does not exist`",
    ),
    CallerError(
        "InvalidTransition",
        None,
        "the state does not allow the change: pausing a schedule that is not active, resuming one that is not paused, "
        "deleting a held limit without `force`",
        "`schedule 'nightly' is done; only an active schedule can be paused`",
    ),
)


class Param(NamedTuple):
    """A keyword argument of a service task."""

    name: str
    required: bool = True
    #: The default of an optional argument (``None``: left out, the argument does not apply).
    default: int | str | None = None
    #: Its bounds, for the table.
    note: str = ""


class ServiceTask(NamedTuple):
    """A task other services call by name: the one source of the README's table, checked against
    the registered tasks and :class:`celeryapp.client.ChordbeatClient` by the tests."""

    name: str
    params: tuple[Param, ...]
    returns: str
    #: The ``exc_type`` of each refusal it can answer with (besides ``InvalidArgument``).
    errors: tuple[str, ...] = ()


_NAME = Param("name")
_ACTOR = Param("actor", required=False, note="who, at most 100 characters; default: the caller's host")
_REASON = Param("reason", required=False, note="why, at most 500 characters")
_EXECUTION_ID = Param("execution_id")
_VERSION = Param("version")
_LIMIT = Param("limit", required=False, default=50, note="at most 1000")
_AUDIT_LIMIT = Param("limit", required=False, default=50, note="at most 500")
_EXECUTIONS_LIMIT = Param("limit", required=False, default=50, note="at most 500")
_SCHEDULE_OBJECT = "schedule object"
_EXECUTION_OBJECT = "execution object"
_BACKFILL_OBJECT = (
    'backfill object: `{"id", "schedule", "origin", "mode", "status", "start", "end", "first_slot", '
    '"last_slot", "next_slot", "max_concurrent", "total", "started", "running", "completed", "failed", '
    '"cancelled", "skipped", "actor", "reason", "created_at", "finished_at"}`'
)

_EXPECTED_VERSION = Param("expected_version", False, note="the `version` read (0: none); refused if it changed since")
_LIMIT_OBJECT = (
    'limit object: the definition `{"name", "slots", "rate", "key", "per_key_slots", "on_full", "max_wait"}` plus '
    '`"version"` (1, then one more a change), `"in_use"`, `"waiting"`, `"oldest_waiting_since"` (the oldest '
    'waiter\'s arrival, null when none waits), `"holders"` and `"waiters"` (`[{"execution_id", "step", "key", "slots", '
    '"since"}]`, holders longest-held first, at most 1,000; waiters oldest first, at most 100) and `"keys"` '
    "(`{key: in_use}`, at most 1,000)"
)

#: Every service task, in the order the README lists them.
SERVICE_TASKS = (
    ServiceTask(
        "chordbeat.apply_schedule",
        (Param("definition"), _ACTOR, _REASON),
        "schedule object (invalid: error naming the field; nothing stored)",
        ("DefinitionError",),
    ),
    ServiceTask(
        "chordbeat.delete_schedule",
        (_NAME, _ACTOR, _REASON),
        '`{"name": ..., "deleted": true}` (execution history is kept)',
        ("NotFound",),
    ),
    ServiceTask("chordbeat.get_schedule", (_NAME,), _SCHEDULE_OBJECT, ("NotFound",)),
    ServiceTask(
        "chordbeat.list_schedules",
        (
            Param("limit", required=False, default=500, note="at most 5000"),
            Param("after_name", required=False, note="optional cursor: only names after it"),
        ),
        "list of schedule objects, by name; a page shorter than `limit` is the last (next page: `after_name` = its "
        "last name)",
    ),
    ServiceTask(
        "chordbeat.pause_schedule",
        (_NAME, _ACTOR, _REASON),
        "schedule object with `changed`: false when it was already paused (then no audit row is written)",
        ("NotFound", "InvalidTransition"),
    ),
    ServiceTask(
        "chordbeat.resume_schedule",
        (_NAME, _ACTOR, _REASON),
        "schedule object with `changed`: false when it was already active (then no audit row is written)",
        ("NotFound", "InvalidTransition"),
    ),
    ServiceTask(
        "chordbeat.trigger_schedule",
        (_NAME, Param("payload", required=False), _ACTOR, _REASON),
        '`{"execution_id": ..., "status": "in_progress"}` or `{"execution_id": null, "skipped": "<reason>"}`; a '
        "manual run is explicit, so it works whatever the schedule's status, and follows its overlap policy",
        ("NotFound",),
    ),
    ServiceTask(
        "chordbeat.cancel_execution",
        (_EXECUTION_ID, _ACTOR, _REASON),
        "execution object; its `error` says who cancelled it: `cancelled by <actor> (<source>): <reason>`",
        ("NotFound",),
    ),
    ServiceTask(
        "chordbeat.rerun_execution",
        (
            _EXECUTION_ID,
            Param("from_failed", required=False, default=True),
            _ACTOR,
            _REASON,
            Param("payload", required=False, note="a JSON object replacing the source run's payload"),
            Param("latest", required=False, default=False, note="true: the current definition's steps"),
        ),
        "execution object of a new run (trigger `manual`, the source's steps (its `version`'s; `latest`: the current "
        "definition's), payload (or the `payload` given, checked as `trigger_schedule`'s and kept in the audit row) "
        "and slot, `rerun_of` set) starting at the first failed "
        "group (`from_failed`: false, at group 0); only a failed or cancelled run; follows the overlap policy",
        ("NotFound", "InvalidTransition"),
    ),
    ServiceTask("chordbeat.get_execution", (_EXECUTION_ID,), _EXECUTION_OBJECT, ("NotFound",)),
    ServiceTask(
        "chordbeat.list_executions",
        (
            Param("schedule", required=False),
            Param("status", required=False),
            _EXECUTIONS_LIMIT,
            Param("before_id", required=False, note="optional cursor: only smaller ids"),
            Param("version", required=False, note="optional: only the runs of this definition version (with schedule)"),
        ),
        "execution summaries, newest first: the execution object without `activities`, `tasks` and `payload` "
        "(`error` cut to 1,000 characters; `get_execution` has it all), plus `steps` = "
        '`{"total": n, "<activity status>": count, ...}` (steps by their latest attempt); a page shorter than '
        "`limit` is the last (next page: `before_id` = its last id)",
    ),
    ServiceTask(
        "chordbeat.list_audit",
        (
            Param("schedule", required=False),
            _AUDIT_LIMIT,
            Param("execution_id", required=False, note="optional: only that execution's rows"),
            Param("actor", required=False, note="optional: only rows of exactly this actor"),
            Param("action", required=False, note="optional: only rows of this action, spelled exactly"),
            Param("since", required=False, note="optional: rows at or after this ISO 8601 time with its offset"),
            Param("until", required=False, note="optional: rows before this ISO 8601 time with its offset"),
            Param("before_id", required=False, note="optional cursor: only smaller ids"),
        ),
        'who did what, newest first: `[{"at", "actor", "source", "action", "schedule", '
        '"execution_id", "reason", "id", "detail"}]`; a schedule\'s rows outlive it; rows of no schedule '
        "(file applies, logins) are among all rows; a page shorter than `limit` is the last (next page: "
        "`before_id` = its last id)",
    ),
    ServiceTask(
        "chordbeat.list_slots",
        (_NAME, _LIMIT),
        "what became of the schedule's recent due times, newest first (`before_schedule`: true for a due time "
        "before the schedule was created, e.g. a backfill of history)",
        ("NotFound",),
    ),
    ServiceTask(
        "chordbeat.next_fires",
        (_NAME, Param("count", required=False, default=10, note="at most 100")),
        '`[{"at": ISO, "local": ISO with offset, "excluded": null or "<reason>", "dst": null or "<note>", "version": '
        "n}]`: the coming slots (`version`: the definition version its run would run), those the schedule's calendar "
        "excludes with why (and where the run moves with `on_excluded: next_business_day`), and on a day the clocks "
        "change what the schedule's DST rule did",
        ("NotFound",),
    ),
    ServiceTask(
        "chordbeat.list_versions",
        (_NAME, _LIMIT, Param("before", required=False, note="optional cursor: only older versions")),
        'newest first: `[{"version", "at", "actor", "source", "reason", "file", "commit", "hash"}]` (SHA-256)',
        ("NotFound",),
    ),
    ServiceTask("chordbeat.get_version", (_NAME, _VERSION), "its definition (`env` values hidden)", ("NotFound",)),
    ServiceTask(
        "chordbeat.diff_versions",
        (_NAME, Param("a"), Param("b")),
        '`[{"path", "op", "old", "new"}]` from `a` to `b`; steps by name (`steps[HR import].kwargs.full`)',
        ("NotFound",),
    ),
    ServiceTask(
        "chordbeat.rollback_schedule",
        (_NAME, _VERSION, _ACTOR, _REASON),
        "schedule object at a new version equal to `version` (none if it is the current one), checked as an apply",
        ("NotFound", "DefinitionError"),
    ),
    ServiceTask(
        "chordbeat.backfill_schedule",
        (
            _NAME,
            Param("start", note="ISO 8601 with its offset; slots with start ≤ slot < end"),
            Param("end", note="ISO 8601 with its offset, not after now"),
            Param("mode", required=False, default="missing", note="`missing`, `failed` or `all`"),
            Param("max_concurrent", required=False, default=1, note="1 to 100; more than 1 only for `overlap: allow`"),
            Param("dry_run", required=False, default=False, note="true: list the slots, start nothing"),
            _ACTOR,
            _REASON,
            Param("version", required=False, note="optional: the version its runs run (default: the current)"),
        ),
        '`{"backfill_id": id or null, "slots": [ISO, ...], "count": n, "none_because": text or null}`: the slots, '
        "oldest first (at most 10,000; calendar-excluded ones left out); with none, `none_because` says why (no "
        "slot in the range, shown in the schedule's zone; all taken by the mode; the calendar); run with "
        '`trigger: "backfill"`, their `slot` and `version`; the same '
        "request while its backfill runs answers with it and starts nothing; refused naming `end` (a dry run too) "
        "past the pending slots of the schedule's or the deployment's running backfills or their step executions "
        "(`CHORDBEAT_BACKFILL_MAX_PENDING_PER_SCHEDULE`, `CHORDBEAT_BACKFILL_MAX_PENDING`, "
        "`CHORDBEAT_BACKFILL_MAX_STEP_RUNS`)",
        ("NotFound", "InvalidTransition"),
    ),
    ServiceTask(
        "chordbeat.cancel_backfill",
        (Param("backfill_id"), _ACTOR, _REASON),
        "backfill object (`status` `cancelled`): the slots not started never start; runs in progress go on",
        ("NotFound",),
    ),
    ServiceTask("chordbeat.get_backfill", (Param("backfill_id"),), _BACKFILL_OBJECT, ("NotFound",)),
    ServiceTask(
        "chordbeat.list_backfills",
        (_NAME, Param("limit", required=False, default=20, note="at most 500")),
        "the schedule's backfills and catch-ups, newest first (backfill objects: summaries, no slot lists)",
        ("NotFound",),
    ),
    ServiceTask(
        "chordbeat.list_alerts",
        (
            Param("schedule", required=False),
            Param("status", required=False, note="`open`, `acknowledged`, `silenced` or `all` (default)"),
            Param("limit", required=False, default=50, note="at most 500"),
        ),
        'alert objects, newest first: `[{"id", "kind", "detail", "schedule", "slot", "execution_id", "message", '
        '"at", "expected_at", "silenced", "acknowledged_by", "acknowledged_at", "deliveries": [{"channel", '
        '"status", "attempts", "last_error", "delivered_at", "next_try_at"}]}]`; `open`: not acknowledged, not '
        "silenced, not `resolved` or `test`",
    ),
    ServiceTask("chordbeat.get_alert", (Param("id"),), "alert object", ("NotFound",)),
    ServiceTask(
        "chordbeat.acknowledge_alert",
        (Param("id"), _ACTOR, _REASON),
        "alert object with `acknowledged_by` and `acknowledged_at` (the first acknowledgement stays)",
        ("NotFound",),
    ),
    ServiceTask(
        "chordbeat.silence_schedule",
        (_NAME, Param("until"), _REASON, _ACTOR),
        "`until`: ISO 8601 with its offset, in the future, within 366 days; "
        '`{"schedule", "silenced_until", "silenced_by", "reason"}`: its alerts are kept, marked silenced, and not '
        "sent until then; replaces the silence in force",
        ("NotFound",),
    ),
    ServiceTask(
        "chordbeat.unsilence_schedule",
        (_NAME, _ACTOR, _REASON),
        '`{"schedule", "silenced_until": null, ..., "changed": bool}`: alerts are sent again from now',
        ("NotFound",),
    ),
    ServiceTask(
        "chordbeat.test_alert",
        (Param("channel"), _ACTOR, _REASON),
        "`channel`: a channel of the `CHORDBEAT_ALERT_CHANNELS` file, refused once it has had "
        "`CHORDBEAT_ALERT_RATE_LIMIT` tests in the last 60 s; alert object of kind `test` (message `TEST, not an "
        "alert: …`, the actor and reason quoted and cut) with one pending delivery to the channel (`get_alert` "
        "follows it)",
    ),
    ServiceTask(
        "chordbeat.apply_limit",
        (Param("definition"), _ACTOR, _REASON, _EXPECTED_VERSION),
        _LIMIT_OBJECT + " (invalid: error naming every bad field; nothing stored); a resize never pre-empts holders",
        ("DefinitionError", "InvalidTransition"),
    ),
    ServiceTask(
        "chordbeat.list_limits",
        (),
        'every limit by name: its definition plus `{"version", "in_use", "waiting", "oldest_waiting_since"}`',
    ),
    ServiceTask("chordbeat.get_limit", (_NAME,), _LIMIT_OBJECT, ("NotFound",)),
    ServiceTask(
        "chordbeat.delete_limit",
        (_NAME, Param("force", required=False, default=False, note="true: delete it while held"), _ACTOR, _REASON),
        '`{"name": ..., "deleted": true}`; refused while the limit is held unless `force`',
        ("NotFound", "InvalidTransition"),
    ),
)
