"""Sending what a committed transaction decided: chords for step groups, cancels, fences."""

from __future__ import annotations

import contextlib
import logging

import redis
from celery.canvas import Signature
from kombu.utils.uuid import uuid

from celeryapp.domain.effects import Effects, GroupDispatch, LimitWake, StepDispatch
from celeryapp.domain.names import CONTROL_QUEUE, STEPS_QUEUE
from celeryapp.messaging import keys
from celeryapp.messaging.redis_client import get_redis, registered_script
from celeryapp.monitoring.overload import note_skipped
from celeryapp.runtime import Runtime
from celeryapp.scheduling.beat_entries import sync_schedules
from celeryapp.variables import VISIBILITY_TIMEOUT_S
from celeryapp.worker import step_events
from models.base import utcnow

logger = logging.getLogger(__name__)

RUN_STEP = "chordbeat.run_step"
ADVANCE = "chordbeat.advance_execution"
SETTLE_LIMITS = "chordbeat.settle_limits"
#: A pass over limits is sent this long after its moment: one a hair early (clocks round) would
#: find the token not quite back, and ask for the same moment again.
WAKE_MARGIN_S = 0.01
#: How long a cancel or fence flag lives, in heartbeat TTLs (see :func:`flag_ttl_ms`).
FLAG_TTL_HEARTBEATS = 2
#: A dispatch marker lives as long as the broker may keep the message unacked.
MARKER_TTL_S = VISIBILITY_TIMEOUT_S


def _lineage(app: Runtime) -> dict[str, str]:
    """The ``parent_id`` (Flower's "Parent") and ``root_id`` of the steps about to be sent.

    Celery makes the task sending a message its parent. A later group is sent by the step of the
    group before that finished last (each runner advances its run itself when its group is done):
    a sibling chosen by timing, which Flower showed as the step's parent. Such a group's parent
    is instead the group before's advancement (its chord body, ``chordbeat.advance_execution``,
    whose id the runner's message carries), as when that advancement sends the group itself.
    Sent by anything else (a run's starting task, recovery), Celery's own choice stands."""
    current = app.current_worker_task
    if current is None or current.name != RUN_STEP:
        return {}
    request = current.request
    advancement = ((request.chord or {}).get("options") or {}).get("task_id")
    if not advancement:
        return {}  # a runner recovery sent again, linked to an advancement of its own (send_group)
    # A run started outside any task (the dashboard's Run now) has no root but its first steps,
    # each its own: the advancement stands in for it.
    root = request.root_id if request.root_id and request.root_id != request.id else advancement
    return {"parent_id": advancement, "root_id": root}


def _runner(app: Runtime, step: StepDispatch, group: GroupDispatch, lineage: dict[str, str]) -> Signature:
    options: dict[str, object] = {
        **lineage,
        "task_id": step.celery_task_id,
        "queue": step.spec.queue or STEPS_QUEUE,
        "priority": keys.step_priority(group.step_index),
        # What Flower, `celery events` and `celery inspect` show instead of run_step(8, 1).
        "shadow": step_events.shadow_name(group.schedule_name, step.spec.name),
        "argsrepr": step_events.args_repr(step.execution_id, group.step_index, step.attempt),
        "kwargsrepr": step_events.kwargs_repr(step.execution_id, group.step_index, step.attempt, step.worker_task_id),
    }
    if step.spec.timeout_s:
        # The runner catches the soft limit and records a timeout; the hard limit is only a
        # backstop for a step that ignores it, and heartbeat recovery handles what follows.
        options["soft_time_limit"] = step.spec.timeout_s
        options["time_limit"] = step.spec.timeout_s + 30
    return app.signature(RUN_STEP, args=(step.worker_task_id, step.attempt, step.token), immutable=True, **options)


def _advance(app: Runtime, group: GroupDispatch) -> Signature:
    # Nobody reads an advancement's result: skip storing it (a Redis write per group).
    return app.signature(
        ADVANCE,
        args=(group.execution_id, group.step_index),
        immutable=True,
        queue=CONTROL_QUEUE,
        ignore_result=True,
    )


def send_group(app: Runtime, group: GroupDispatch) -> None:
    if not group.steps:
        # A step that ended unstarted (skipped or failed by its limits): the group may be done.
        _advance(app, group).apply_async()
        return
    lineage = _lineage(app)
    if group.requeue:
        # The group's chord already fired or is gone: each attempt advances by itself when done.
        for step in group.steps:
            _runner(app, step, group, lineage).apply_async(link=_advance(app, group))
    else:
        # The chord body is the advancement check; runners never fail, so it always runs.
        _send_chord(app, [_runner(app, step, group, lineage) for step in group.steps], _advance(app, group))
    _mark_sent(app, group)


def send_limit_wakes(app: Runtime, wakes: list[LimitWake]) -> None:
    """A message to each pass over limits, due when its moment comes (a countdown from the reference
    clock's now, so no host's clock matters): a waiter held back by a rate is started when its
    token is back, not at recovery's next pass. One message per limits and moment: many
    transactions see the same next token (it follows from the bucket, not from when it is read)."""
    client = get_redis(app.settings.broker_url)
    now = utcnow()
    for wake in dict.fromkeys(wakes):
        delay_s = max(0.0, (wake.at - now).total_seconds()) + WAKE_MARGIN_S
        key = keys.limit_wake_key(wake.limit_ids, round(wake.at.timestamp() * 1000))
        # The key lasts until the message is due: a pass that asks for the moment again once it
        # has come (the token not back after all) sends another.
        if client.set(key, "1", nx=True, px=max(1, round(delay_s * 1000))):
            app.signature(
                SETTLE_LIMITS, args=(list(wake.limit_ids),), queue=CONTROL_QUEUE, ignore_result=True
            ).apply_async(countdown=delay_s)


def _send_chord(app: Runtime, header: list[Signature], body: Signature) -> None:
    """``chord(header, body).apply_async()`` as Celery's Redis backend counts it (each part's
    message carries the chord's group id, its index and the body; the group's size is noted
    before any part can end), without the group result Celery builds for a caller to wait on:
    building it subscribes to each part's result channel in Redis, a SUBSCRIBE and later an
    UNSUBSCRIBE a step that nobody reads (docs/performance.md: what a step costs)."""
    group_id = uuid()
    body.freeze(uuid(), group_id=group_id)
    app.backend.set_chord_size(group_id, len(header))
    with app.producer_or_acquire() as producer:
        for index, runner in enumerate(header):
            runner.apply_async(producer=producer, add_to_parent=False, group_id=group_id, group_index=index, chord=body)


#: KEYS: marker, pickup lease, marker, pickup lease, ..., the high-water marks; ARGV[1]: the
#: marker's TTL, then mark, id, mark, id. A worker may already have taken the message (its pickup
#: lease exists): then the attempt is past needing one. The ids sent raise their marks (see
#: keys.HIGH_WATER_KEY), in this script rather than a round trip of their own.
_MARK_SENT_LUA = """
for i = 1, #KEYS - 1, 2 do
  if redis.call('EXISTS', KEYS[i + 1]) == 0 then
    redis.call('SET', KEYS[i], '1', 'EX', ARGV[1])
  end
end
for i = 2, #ARGV, 2 do
  local seen = tonumber(redis.call('HGET', KEYS[#KEYS], ARGV[i]) or '0')
  if tonumber(ARGV[i + 1]) > seen then redis.call('HSET', KEYS[#KEYS], ARGV[i], ARGV[i + 1]) end
end
"""


def _mark_sent(app: Runtime, group: GroupDispatch) -> None:
    """Markers after publishing (a queued attempt without one is re-sent by recovery), unless a
    worker was quicker and already took the message."""
    client = get_redis(app.settings.broker_url)
    names = [
        key
        for step in group.steps
        for key in (
            keys.dispatch_marker_key(step.worker_task_id, step.attempt, step.token),
            keys.pickup_key(step.worker_task_id, step.attempt, step.token),
        )
    ]
    last_task = max(step.worker_task_id for step in group.steps)
    seen = [keys.EXECUTIONS_MARK, group.execution_id, keys.WORKER_TASKS_MARK, last_task]
    # EVALSHA: the script's text travels once per Redis server, not with every group.
    registered_script(client, _MARK_SENT_LUA)(keys=[*names, keys.HIGH_WATER_KEY], args=[MARKER_TTL_S, *seen])


def send_groups(app: Runtime, groups: list[GroupDispatch]) -> None:
    """Send several groups, as :func:`send_group` would each: a fire batch's first groups cost
    three Redis round trips together (the chords' sizes, the messages, the markers) instead of
    four each; each step in a Redis pipeline is what it was alone. A crash or a failed publish
    part way leaves the unsent attempts without a marker, as one group's does: recovery sends them."""
    chords = [group for group in groups if group.steps and not group.requeue]
    if len(chords) < 2:
        for group in groups:
            send_group(app, group)
        return
    for group in groups:
        if not group.steps or group.requeue:
            send_group(app, group)
    lineage = _lineage(app)
    parts: list[tuple[str, list[Signature], Signature]] = []
    for group in chords:
        group_id, body = uuid(), _advance(app, group)
        body.freeze(uuid(), group_id=group_id)
        parts.append((group_id, [_runner(app, step, group, lineage) for step in group.steps], body))
    _set_chord_sizes(app, [(group_id, len(header)) for group_id, header, _ in parts])
    with app.producer_or_acquire() as producer, producer.batch():
        for group_id, header, body in parts:
            for index, runner in enumerate(header):
                runner.apply_async(
                    producer=producer, add_to_parent=False, group_id=group_id, group_index=index, chord=body
                )
    _mark_all_sent(app, chords)


def _set_chord_sizes(app: Runtime, sizes: list[tuple[str, int]]) -> None:
    """What the Redis backend's ``set_chord_size`` writes for each group (the size a part's end is
    counted against, kept ``result_chord_expires``), in one pipeline, retried as the backend retries
    its own writes. Its ``DEL`` of the group's join counter is left out: a fresh group id has none."""
    backend = app.backend
    expires = backend.chord_expires or None

    def write() -> None:
        with backend.client.pipeline(transaction=False) as pipe:
            for group_id, size in sizes:
                pipe.set(backend.get_key_for_group(group_id, ".s"), size, ex=expires)
            pipe.execute()

    backend.ensure(write, ())


#: At most this many attempts' markers in one script call: a long call holds Redis meanwhile.
MARKS_PER_CALL = 1000


def _mark_all_sent(app: Runtime, groups: list[GroupDispatch]) -> None:
    """:func:`_mark_sent` of many groups in one script call per :data:`MARKS_PER_CALL` attempts."""
    steps = [step for group in groups for step in group.steps]
    client = get_redis(app.settings.broker_url)
    script = registered_script(client, _MARK_SENT_LUA)
    for start in range(0, len(steps), MARKS_PER_CALL):
        chunk = steps[start : start + MARKS_PER_CALL]
        names = [
            key
            for step in chunk
            for key in (
                keys.dispatch_marker_key(step.worker_task_id, step.attempt, step.token),
                keys.pickup_key(step.worker_task_id, step.attempt, step.token),
            )
        ]
        last_run = max(step.execution_id for step in chunk)
        last_task = max(step.worker_task_id for step in chunk)
        seen = [keys.EXECUTIONS_MARK, last_run, keys.WORKER_TASKS_MARK, last_task]
        script(keys=[*names, keys.HIGH_WATER_KEY], args=[MARKER_TTL_S, *seen])


#: KEYS: pickup lease, dispatch marker; ARGV[1]: the lease's TTL (ms). One command, cheaper for the
#: worker's main process than a pipeline of two.
_TAKEN_LUA = "redis.call('SET', KEYS[1], '1', 'PX', ARGV[1]) redis.call('DEL', KEYS[2])"


def take_message(app: Runtime, worker_task_id: int, attempt: int, token: int) -> None:
    """An attempt's message reached a worker: its dispatch marker gives way to a pickup lease that
    lives only as long as a heartbeat (see :func:`keys.pickup_key`)."""
    client = get_redis(app.settings.broker_url)
    names = [keys.pickup_key(worker_task_id, attempt, token), keys.dispatch_marker_key(worker_task_id, attempt, token)]
    try:
        registered_script(client, _TAKEN_LUA)(keys=names, args=[int(app.settings.heartbeat_ttl_s * 1000)])
    except redis.RedisError as exc:
        logger.warning("pickup of worker task %s attempt %s not recorded: %s", worker_task_id, attempt, exc)


def drop_pickup(app: Runtime, worker_task_id: int, attempt: int, token: int) -> None:
    """Nothing was claimed: without the lease, recovery sends the attempt again."""
    with contextlib.suppress(redis.RedisError):
        get_redis(app.settings.broker_url).delete(keys.pickup_key(worker_task_id, attempt, token))


def flag_ttl_ms(heartbeat_ttl_s: float) -> int:
    """How long a cancel or fence flag lives: as long as the attempts it stops may still be at work
    without having read it. A step's watch reads the flags with every heartbeat refresh; a step
    whose refreshes do not reach Redis (its process frozen, Redis out of its reach) stops itself
    once its lease (less than a heartbeat TTL) runs out, and a process that stood still stops its
    steps before its first refresh on waking (heartbeat.py). A flag a heartbeat TTL old has reached
    every attempt at work, or there is none; the second TTL is margin. A message not yet claimed
    needs no flag (its claim finds the run over), and a flag lost early (a failover to a replica
    whose clock runs ahead) is made up for by the step's question to the database (attempt_check.py).
    So Redis holds the flags of the last two TTLs' cancels (30 s by default), not of a week's."""
    return int(FLAG_TTL_HEARTBEATS * heartbeat_ttl_s * 1000)


def apply_effects(app: Runtime, effects: Effects) -> None:
    """Carry out, after commit, what a lifecycle function decided."""
    if effects.cancelled or effects.fenced:
        client = get_redis(app.settings.broker_url)
        flag_ttl = flag_ttl_ms(app.settings.heartbeat_ttl_s)
        with client.pipeline(transaction=False) as pipe:
            for execution_id, token in effects.cancelled:
                pipe.set(keys.cancel_key(execution_id, token), "1", px=flag_ttl)
            for worker_task_id, attempt, token in effects.fenced:
                pipe.set(keys.fenced_key(worker_task_id, attempt, token), "1", px=flag_ttl)
            pipe.execute()
    send_groups(app, effects.dispatch)
    if effects.limit_wakes:
        try:
            send_limit_wakes(app, effects.limit_wakes)
        except redis.RedisError:
            logger.warning("passes over limits %s not sent; recovery's pass settles them", effects.limit_wakes)
    if effects.skipped_overlap:
        note_skipped(app.settings.broker_url, effects.skipped_overlap)
    if effects.resync:
        try:
            sync_schedules(app, effects.resync)
        except redis.RedisError:
            logger.exception("beat entries of %s not synced; the periodic reconcile will", effects.resync)
